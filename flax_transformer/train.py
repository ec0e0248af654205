"""`python -m flax_transformer.train ...`: the training command (lives in cli/train.py)."""

import sys

from flax_transformer.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
