"""`python -m flax_transformer.parity A B` = `ftx parity` (cli/parity.py)."""

from flax_transformer.cli.parity import main
from flax_transformer.cli.process import exit_process

exit_process(main())
