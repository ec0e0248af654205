"""`python -m flax_transformer.generate --workdir RUN` = `ftx generate` (cli/generate.py)."""

if __name__ == "__main__":  # the command's import inside its Ctrl-C handling (cli/process.py)
    from flax_transformer.cli.process import run_command_and_exit

    run_command_and_exit("flax_transformer.cli.generate")

from flax_transformer.cli.generate import main  # noqa: E402, F401  (the import path of 0.2)
