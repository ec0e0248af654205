"""`python -m flax_transformer.convert IN OUT`: the converter's CLI (lives in interop.convert)."""

import sys

from flax_transformer.interop.convert import main

if __name__ == "__main__":
    sys.exit(main())
