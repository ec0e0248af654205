"""`flax_transformer.sharding` (before 0.2) moved to `flax_transformer.training.sharding`.

This path still works for one release: each name resolves from the new home with a
DeprecationWarning.
"""

from flax_transformer.lazy import moved_module  # noqa: E402

__getattr__ = moved_module(__name__, "flax_transformer.training.sharding")
