"""`python -m flax_transformer.cli ...`: the `ftx` command without installing it."""

import sys

from flax_transformer.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
