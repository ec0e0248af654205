"""`flax_transformer.nn.int8_amx` moved to `flax_transformer.kernels.int8_amx` (the kernels' room).

This path still works for one release: each name resolves from the new home with a
DeprecationWarning. Whether the kernel runs is now asked of the one switch object,
`flax_transformer.kernels.KERNELS`.
"""

from flax_transformer.lazy import moved_module

__getattr__ = moved_module(__name__, "flax_transformer.kernels.int8_amx")
