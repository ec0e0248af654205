"""`ftx kernels build`: compile the native kernels once, into the kernel cache.

    ftx kernels build            the kernels this machine can run (scripts/setup.sh runs it)
    ftx kernels build --all      every kernel, also those this CPU lacks (a shared cache)
    ftx kernels build --force    rebuild even intact entries
    ftx kernels build --json     one JSON object

The library calls never compile: without a built kernel they run XLA's own operations and say
so once (`ftx info` shows each kernel). Where: $FLAX_TRANSFORMER_CACHE/kernels, else
$XDG_CACHE_HOME (or ~/.cache)/flax_transformer/kernels. Each library is checked against the
size and checksum written beside it; a damaged one is rebuilt here and skipped elsewhere.

Exit status 0 when every kernel this machine can run is built (those it cannot are skipped
with the reason), 1 when a build failed (no compiler, a compile error, an unwritable cache:
one line each; the XLA path keeps working), 2 for usage errors.
"""

from __future__ import annotations

import argparse
import sys

from flax_transformer.cli.output import add_json_flag, emit
from flax_transformer.cli.process import exit_process
from flax_transformer.files.interruptions import one_line_failures


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """`build` and its flags; argparse errors (exit 2) for anything else."""
    parser = argparse.ArgumentParser(
        prog="ftx kernels",
        description="Build the native kernels (C++, jax.ffi) into the kernel cache, once.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{build}")
    build = commands.add_parser("build", help="compile the kernels this machine can run")
    build.add_argument(
        "--all", action="store_true", help="every kernel, also those this CPU cannot run"
    )
    build.add_argument("--force", action="store_true", help="rebuild intact entries too")
    add_json_flag(build)
    return parser.parse_args(argv)


def describe(result) -> str:
    """One line per library."""
    if result.state == "built":
        return f"{result.name}: built in {result.seconds:.1f} s: {result.path}"
    if result.state == "present":
        return f"{result.name}: already built: {result.path}"
    return f"{result.name}: {result.state}: {result.why}"


@one_line_failures
def main(argv: list[str] | None = None) -> int:
    """Entry point of `ftx kernels`; exit status 0, 1 when a build failed."""
    args = parse_args(argv)
    from flax_transformer.kernels.build import build_all
    from flax_transformer.kernels.cache import kernel_dir

    results = build_all(every=args.all, force=args.force)
    failed = [r for r in results if r.state == "failed"]
    rows = [
        {"library": r.name, "state": r.state, "path": r.path and str(r.path), "why": r.why}
        for r in results
    ]
    emit({"cache": str(kernel_dir()), "libraries": rows},
         [describe(r) for r in results if r.state != "failed"], args.json)  # fmt: skip
    if args.json != "-":
        reasons: dict[str, list[str]] = {}  # one line per reason (no compiler: one line)
        for result in failed:
            reasons.setdefault(result.why, []).append(result.name)
        for why, names in reasons.items():
            print(
                f"error: not built ({', '.join(names)}): {why}; XLA's own operations run in "
                "their place",
                file=sys.stderr,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    exit_process(main())
