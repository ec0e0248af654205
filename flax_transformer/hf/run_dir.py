"""Moved to flax_transformer.runs.hf_convert: this path works one more release, with a warning."""

from flax_transformer.lazy import moved_module

__getattr__ = moved_module(__name__, "flax_transformer.runs.hf_convert")
