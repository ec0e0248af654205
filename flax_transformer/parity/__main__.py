"""`python -m flax_transformer.parity A B`: see parity/cli.py."""

import sys

from flax_transformer.parity.cli import main

sys.exit(main())
