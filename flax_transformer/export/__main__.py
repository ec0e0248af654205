"""`python -m flax_transformer.export --workdir RUN --format F --out DIR` = `ftx export`."""

from flax_transformer.cli.export import main
from flax_transformer.cli.process import exit_process

if __name__ == "__main__":
    exit_process(main())
