"""Moved to flax_transformer.runs.load (loading a run is the application layer's; the loop's
checkpoint helpers are in training/run_files.py): this path works one more release, with a
warning."""

from flax_transformer.lazy import moved_module

__getattr__ = moved_module(__name__, "flax_transformer.runs.load")
