"""`ftx`: the installed command. `ftx SUBCOMMAND ...` hands the rest of the command line to that
command's own `main(argv) -> int`, the same function `python -m flax_transformer.X` runs.

    ftx --help | --version
    ftx train --workdir runs/x          (= python train.py ...)
    ftx generate --workdir runs/x       (= python -m flax_transformer.generate ...)

Each subcommand's module is imported only when it is chosen, so `ftx --help` loads no JAX.
Exit status, for every subcommand: 0 ok, 1 a failed check (e.g. a parity mismatch), 2 bad input
or usage (an unknown subcommand included). A bad kernel switch (FLAX_TRANSFORMER_*_KERNEL, see
kernels.switches) is bad input for every subcommand: one line, exit 2, before it starts.
"""

from __future__ import annotations

import importlib
import sys

from flax_transformer.cli.process import exit_process, import_command, run_main
from flax_transformer.files.interruptions import interrupt_exits_at_once

USES_JAX = False  # each subcommand's import loads it (cli/process.import_command)

# subcommand -> (module whose main(argv) runs it, one line for `ftx --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("flax_transformer.cli.train", "train a model (the built-in task or your data)"),
    "generate": ("flax_transformer.cli.generate", "translate / continue text with a run"),
    "classify": ("flax_transformer.cli.classify", "label texts with a sequence classifier run"),
    "score": ("flax_transformer.cli.score", "score a test set: loss, BLEU, exact match"),
    "convert": ("flax_transformer.cli.convert", "weight files: torch <-> Flax safetensors"),
    "parity": ("flax_transformer.cli.parity", "where two sets of weights start to differ"),
    "export": ("flax_transformer.cli.export", "a run as StableHLO, ONNX or int8 TorchScript"),
    "hf": ("flax_transformer.cli.hf", "Hugging Face directories <-> run directories"),
    "launch": ("flax_transformer.cli.launch", "start a multi-process training run on this machine"),
    "demo": ("flax_transformer.cli.demo", "convert the torch twin's weights and print the parity"),
    "info": ("flax_transformer.cli.info", "version, JAX backend and devices, CPU, native kernels"),
    "kernels": ("flax_transformer.cli.kernels", "build the native kernels once (kernels build)"),
}
USAGE = "usage: ftx [--help] [--version] {" + ",".join(COMMANDS) + "} ..."


def help_text() -> str:
    """What `ftx --help` prints: usage, one line per subcommand, the exit-status rule."""
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {line}" for name, (_, line) in COMMANDS.items())
    return (
        f"{USAGE}\n\nThe flax-transformer commands (`ftx COMMAND --help` for each one's flags).\n"
        f"\ncommands:\n{rows}\n\nexit status: 0 ok, 1 a failed check (e.g. a parity mismatch), "
        "2 bad input or usage\n"
    )


def _version() -> str:
    from flax_transformer import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    """Run `ftx COMMAND ...` (`argv` without the program name; default sys.argv[1:]) through that
    command's `main`; return its exit status (2 for no or an unknown command, or a SystemExit that
    carries a message)."""
    process_entry = argv is None  # the `ftx` program itself, not a call from Python
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print(f"{USAGE}\nftx: error: give a command: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    first, rest = argv[0], argv[1:]
    if first in ("-h", "--help"):
        print(help_text(), end="")
        return 0
    if first == "--version":
        print(f"ftx (flax-transformer) {_version()}")
        return 0
    if first not in COMMANDS:
        print(
            f"{USAGE}\nftx: error: unknown command {first!r}; the commands are "
            f"{', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    from flax_transformer.kernels.switches import KERNELS

    problem = None if {"-h", "--help"} & set(rest) else KERNELS.preflight()  # no JAX loaded
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if process_entry:  # the `ftx` program: Ctrl-C ends it at once until the command starts
        if first == "train":  # before JAX loads (training/host_memory.py)
            with interrupt_exits_at_once():
                from flax_transformer.training.host_memory import reexec_with_tuned_malloc

                reexec_with_tuned_malloc()
        module = import_command(COMMANDS[first][0], rest)
    else:
        module = importlib.import_module(COMMANDS[first][0])
    # A SettingError (a kernel forced where JAX computes on a GPU, ...) is one line and 2;
    # argparse's SystemExit gives its code.
    code = run_main(module, rest)
    if code is None:
        return 0
    if isinstance(code, int):
        if process_entry:  # the `ftx` program: how its process ends (cli/process.py)
            exit_process(code)
        return code
    print(code, file=sys.stderr)  # SystemExit("message")
    return 2


if __name__ == "__main__":
    exit_process(main())
