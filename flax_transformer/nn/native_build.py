"""`flax_transformer.nn.native_build` moved to the kernels' room: the build is
`flax_transformer.kernels.build` (run by `ftx kernels build`, never inside a library call), the
cache `kernels.cache`, the CPU's flags and the platform `kernels.cpu`.

This path still works for one release: each name resolves from its new home with a
DeprecationWarning.
"""

from flax_transformer.lazy import moved_names

__getattr__, __dir__ = moved_names(
    __name__,
    {
        "cpu_flags": "flax_transformer.kernels.cpu:cpu_flags",
        "cache_dir": "flax_transformer.kernels.cache:cache_dir",
        "HERE": "flax_transformer.kernels.libraries:HERE",
        "HEADERS": "flax_transformer.kernels.libraries:HEADERS",
    },
)
