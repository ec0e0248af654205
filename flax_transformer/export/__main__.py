"""`python -m flax_transformer.export --workdir RUN --format F --out DIR` = `ftx export`."""

import sys

from flax_transformer.cli.export import main

if __name__ == "__main__":
    sys.exit(main())
