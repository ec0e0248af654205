"""Moved to flax_transformer.runs.run_dir (the run directory is the application layer's record;
the loop's own files are named in training/run_files.py): this path works one more release,
with a warning."""

from flax_transformer.lazy import moved_module

__getattr__ = moved_module(__name__, "flax_transformer.runs.run_dir")
