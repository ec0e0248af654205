"""`python -m flax_transformer.export RUN_DIR --format onnx|stablehlo|torch-int8 --out DIR`."""

import sys

from flax_transformer.export.cli import main

if __name__ == "__main__":
    sys.exit(main())
