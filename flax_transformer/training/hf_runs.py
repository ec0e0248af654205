"""Moved to flax_transformer.runs.hf_convert (a Hugging Face directory as a run directory and
back is the application layer's; `ftx hf`'s workflows are runs/hf.py's): this path works one
more release, with a warning."""

from flax_transformer.lazy import moved_module

__getattr__ = moved_module(__name__, "flax_transformer.runs.hf_convert")
