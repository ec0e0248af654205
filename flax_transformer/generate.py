"""`python -m flax_transformer.generate --workdir RUN` = `ftx generate` (cli/generate.py)."""

from flax_transformer.cli.generate import main
from flax_transformer.cli.process import exit_process

if __name__ == "__main__":
    exit_process(main())
