"""The Transformer of "Attention Is All You Need" in JAX/Flax, with a PyTorch twin.

The public names below load lazily (PEP 562 module `__getattr__`): `import flax_transformer`
loads no JAX; touching `flax_transformer.Transformer` does. The subpackages are the rooms of
the architecture (docs/architecture.md): spec (numpy only) <- nn <- decoding / training /
interop <- parity.
"""

from flax_transformer.lazy import lazy_exports


def _version() -> str:
    """The installed distribution's version; from pyproject.toml in a tree that is not installed
    (e.g. a checkout on PYTHONPATH), "0+unknown" when neither is there."""
    from importlib import metadata

    try:
        return metadata.version("flax-transformer")
    except metadata.PackageNotFoundError:
        pass
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        return tomllib.loads(pyproject.read_text())["project"]["version"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "0+unknown"


_EXPORTS = {
    "TransformerConfig": "flax_transformer.spec.config",
    "config_diff": "flax_transformer.spec.config",
    "PRESETS": "flax_transformer.spec.presets",
    "preset": "flax_transformer.spec.presets",
    "MultiHeadAttention": "flax_transformer.nn.attention",
    "combine_masks": "flax_transformer.nn.attention",
    "make_causal_mask": "flax_transformer.nn.attention",
    "make_padding_mask": "flax_transformer.nn.attention",
    "scaled_dot_product_attention": "flax_transformer.nn.attention",
    "Decoder": "flax_transformer.nn.model",
    "Encoder": "flax_transformer.nn.model",
    "Transformer": "flax_transformer.nn.model",
    "TransformerEncoder": "flax_transformer.nn.model",
    "TransformerLM": "flax_transformer.nn.model",
    "model_for": "flax_transformer.nn.kinds",
}
__all__ = sorted(_EXPORTS)
_export, __dir__ = lazy_exports(__name__, _EXPORTS)


def __getattr__(name: str):
    """The public names, and `__version__`: computed when asked, since importlib.metadata takes
    0.1 s or more, and a command's process is unprotected from Ctrl-C until its package loads
    (cli/process.py)."""
    if name == "__version__":
        globals()["__version__"] = version = _version()
        return version
    return _export(name)
