"""`python -m flax_transformer.launch ... -- COMMAND` = `ftx launch` (cli/launch.py)."""

if __name__ == "__main__":  # the command's import inside its Ctrl-C handling (cli/process.py)
    from flax_transformer.cli.process import run_command_and_exit

    run_command_and_exit("flax_transformer.cli.launch")

from flax_transformer.lazy import moved_module  # noqa: E402

# Its other names (the command lived here before 0.3) resolve from there, with a warning.
__getattr__ = moved_module(__name__, "flax_transformer.cli.launch")

from flax_transformer.cli.launch import main  # noqa: E402, F401  (the import path of 0.2)
