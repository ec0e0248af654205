"""`python -m flax_transformer.convert IN --out OUT` = `ftx convert` (cli/convert.py).

Before 0.2 this module also held the conversion functions (`torch_state_to_flax`,
`save_torch_state`, ...): they resolve from `flax_transformer.interop.convert` for one more
release, with a DeprecationWarning.
"""

if __name__ == "__main__":  # the command's import inside its Ctrl-C handling (cli/process.py)
    from flax_transformer.cli.process import run_command_and_exit

    run_command_and_exit("flax_transformer.cli.convert")

from flax_transformer.lazy import moved_module  # noqa: E402

__getattr__ = moved_module(__name__, "flax_transformer.interop.convert")

from flax_transformer.cli.convert import main  # noqa: E402, F401  (the import path of 0.2)
