"""`python -m flax_transformer.generate --workdir RUN`: the decoding CLI (lives in decoding.cli)."""

import sys

from flax_transformer.decoding.cli import main

if __name__ == "__main__":
    sys.exit(main())
