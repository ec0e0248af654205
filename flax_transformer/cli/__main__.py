"""`python -m flax_transformer.cli ...`: the `ftx` command without installing it."""

from flax_transformer.cli.main import main
from flax_transformer.cli.process import exit_process

if __name__ == "__main__":
    exit_process(main())
