"""The native kernels in one room: C++ sources, their build, their cache and their switch.

- `libraries`: the libraries (a source, compiler flags, the CPU flags needed, the FFI targets);
  `cpu`: what this machine offers (platform, CPU flags, vector extensions);
  `cache`: where built libraries live and whether an entry is intact (size + SHA-256 in a
  manifest; the key holds the source's hash, the flags and jax's version);
  `build`: compiling them, run only by `ftx kernels build`; `load`: loading a built, intact
  library into a process and registering its jax.ffi handlers (never compiling);
  `switches`: `KERNELS`, the one switch object (FLAX_TRANSFORMER_{INT8,F32,REORDER}_KERNEL).
- The kernels' jax.ffi bindings: `int8_amx` (int8 products on Intel AMX), `f32_packed`
  (float32 products of a few rows on packed weights), `beam_reorder` (beam search's cache
  reorder in place). nn/ (int8_products, f32_products) and decoding/ (the cache) use them.

Below nn/ and decoding/ in the import arrows: this room imports only `files` of the package.
"""

from flax_transformer.lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "KERNELS": "flax_transformer.kernels.switches",
        "SwitchError": "flax_transformer.kernels.switches",
    },
)
