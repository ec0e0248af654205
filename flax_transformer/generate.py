"""`python -m flax_transformer.generate --workdir RUN` = `ftx generate` (cli/generate.py)."""

import sys

from flax_transformer.cli.generate import main

if __name__ == "__main__":
    sys.exit(main())
