"""`python -m flax_transformer.convert IN --out OUT` = `ftx convert` (cli/convert.py).

Before 0.2 this module also held the conversion functions (`torch_state_to_flax`,
`save_torch_state`, ...): they resolve from `flax_transformer.interop.convert` for one more
release, with a DeprecationWarning.
"""

from flax_transformer.cli.convert import main
from flax_transformer.cli.process import exit_process
from flax_transformer.lazy import moved_module

__getattr__ = moved_module(__name__, "flax_transformer.interop.convert")

if __name__ == "__main__":
    exit_process(main())
