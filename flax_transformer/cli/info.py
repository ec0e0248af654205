"""`ftx info`: what this installation runs on: the package's version, JAX (version, backend,
devices), the CPU (model, vector extensions) and each native kernel: active (which build, from
which library) or why not, and what runs instead.

    ftx info            readable lines
    ftx info --json     one JSON object (for machines and bug reports)

Exit status 0 (a kernel that does not run is information, not an error); 2 for a bad kernel
switch value (as every command).
"""

from __future__ import annotations

import argparse
import sys

from flax_transformer.cli.output import add_json_flag, emit
from flax_transformer.cli.process import exit_process
from flax_transformer.files.interruptions import one_line_failures


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The info flags (--json)."""
    parser = argparse.ArgumentParser(
        prog="ftx info",
        description="Print the version, the JAX backend and devices, the CPU's vector "
        "extensions and whether each native kernel runs (and why not).",
    )
    add_json_flag(parser)
    return parser.parse_args(argv)


def collect() -> dict:
    """Everything `ftx info` prints, as a dict (the --json output)."""
    import jax

    from flax_transformer import __version__
    from flax_transformer.kernels import cache, cpu, load
    from flax_transformer.kernels.cache import toolchain_versions
    from flax_transformer.kernels.switches import KERNELS

    load.quiet_notices()  # each kernel's state is printed below
    devices = jax.devices()
    return {
        "version": __version__,
        "python": sys.version.split()[0],
        "jax": {
            **toolchain_versions(),
            "backend": jax.default_backend(),
            "devices": [f"{d.platform}:{d.id} {d.device_kind}" for d in devices],
        },
        "cpu": {"model": cpu.cpu_model(), "vector_extensions": cpu.vector_extensions()},
        "kernel_cache": str(cache.kernel_dir()),
        "kernels": [switch.status() for switch in KERNELS],
    }


def lines(info: dict) -> list[str]:
    """The readable form of `collect()`."""
    jax_info = info["jax"]
    out = [
        f"flax-transformer {info['version']} (Python {info['python']})",
        f"JAX {jax_info['jax']} (jaxlib {jax_info['jaxlib']}), backend {jax_info['backend']}, "
        f"{len(jax_info['devices'])} device(s): {', '.join(jax_info['devices'])}",
        f"CPU: {info['cpu']['model']}",
        f"vector extensions: {' '.join(info['cpu']['vector_extensions']) or 'none found'}",
        f"kernel cache: {info['kernel_cache']}",
        "kernels:",
    ]
    for k in info["kernels"]:
        head = f"  {k['kernel']:<8} {k['variable']}={k.get('value', '?')}: "
        if k["active"]:
            out.append(f"{head}active ({k['build']}: {k['library']})")
        else:
            out.append(f"{head}{k['fallback']}, because {k['why']}")
    return out


@one_line_failures
def main(argv: list[str] | None = None) -> int:
    """Entry point of `ftx info`: print what this installation runs on; exit status 0."""
    args = parse_args(argv)
    info = collect()
    emit(info, lines(info), args.json)
    return 0


if __name__ == "__main__":
    exit_process(main())
