"""Moved to flax_transformer.data.pipeline; this path still works for one release and warns."""

from flax_transformer.lazy import moved_module

__getattr__ = moved_module(__name__, "flax_transformer.data.pipeline")
