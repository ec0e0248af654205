"""`python -m flax_transformer.interop`: check the torch.nn.Transformer port (in cli/)."""

if __name__ == "__main__":  # the command's import inside its Ctrl-C handling (cli/process.py)
    from flax_transformer.cli.process import run_command_and_exit

    run_command_and_exit("flax_transformer.cli.nn_transformer_check")

from flax_transformer.lazy import moved_module  # noqa: E402

# Its other names (the command lived here before 0.3) resolve from there, with a warning.
__getattr__ = moved_module(__name__, "flax_transformer.cli.nn_transformer_check")
