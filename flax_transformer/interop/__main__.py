"""`python -m flax_transformer.interop`: check the torch.nn.Transformer port (in cli/)."""

from flax_transformer.cli.nn_transformer_check import main
from flax_transformer.cli.process import exit_process
from flax_transformer.lazy import moved_module

# Its other names (the command lived here before 0.3) resolve from there, with a warning.
__getattr__ = moved_module(__name__, "flax_transformer.cli.nn_transformer_check")

if __name__ == "__main__":
    exit_process(main())
