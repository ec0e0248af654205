"""Moved to flax_transformer.training.hf_runs: this path works one more release, with a warning."""

from flax_transformer.lazy import moved_module

__getattr__ = moved_module(__name__, "flax_transformer.training.hf_runs")
