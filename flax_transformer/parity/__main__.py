"""`python -m flax_transformer.parity A B` = `ftx parity` (cli/parity.py)."""

if __name__ == "__main__":  # the command's import inside its Ctrl-C handling (cli/process.py)
    from flax_transformer.cli.process import run_command_and_exit

    run_command_and_exit("flax_transformer.cli.parity")
