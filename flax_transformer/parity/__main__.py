"""`python -m flax_transformer.parity A B` = `ftx parity` (cli/parity.py)."""

import sys

from flax_transformer.cli.parity import main

sys.exit(main())
