"""ftx hf import HF_DIR --workdir RUN | ftx hf export --workdir RUN --out HF_DIR

import: a directory written by transformers' save_pretrained (marian, bart, mbart, gpt2, with
its tokenizer; a local path: Hub ids are not downloaded) -> a run directory that `ftx generate
--workdir RUN` decodes with and `ftx train --init-from RUN` fine-tunes from.
export: such a run (or one fine-tuned from it) -> a save_pretrained directory.
The old positional spellings (`import HF_DIR RUN_DIR`, `export RUN_DIR HF_DIR`) still work.
An output that is, contains or lies inside the input is refused; `export` into a non-empty
--out needs --force (which replaces it whole, and never deletes the run).
Exit status: 0 done, 2 bad input (flags, or a directory that cannot be converted; the message
says why).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flax_transformer.cli.output import add_json_flag, emit
from flax_transformer.cli.process import exit_process
from flax_transformer.files.interruptions import one_line_failures


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of `python -m flax_transformer.hf` / `ftx hf`: the `import` and
    `export` subcommands and their flags."""
    parser = argparse.ArgumentParser(
        prog="ftx hf",
        description="Hugging Face checkpoints (local save_pretrained directories) as ftx train "
        "run directories, and back.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    imp = commands.add_parser("import", help="save_pretrained directory -> run directory")
    add_json_flag(imp)
    imp.add_argument(
        "hf_dir",
        help="a local directory written by save_pretrained (with its tokenizer), e.g. "
        "./opus-mt-en-de; Hub ids are not downloaded",
    )
    imp.add_argument("run_dir", nargs="?", help="old spelling of --workdir")
    imp.add_argument("--workdir", metavar="RUN", help="the run directory to create (new or empty)")
    imp.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the run's parameter dtype (default float32; bfloat16 keeps a bfloat16 "
        "checkpoint's bits and half the memory)",
    )
    exp = commands.add_parser("export", help="run directory -> save_pretrained directory")
    add_json_flag(exp)
    exp.add_argument(
        "paths", nargs="*", metavar="RUN_DIR HF_DIR", help="old spelling of --workdir and --out"
    )
    exp.add_argument(
        "--workdir", metavar="RUN", help="a run made by `import`, or fine-tuned from one"
    )
    exp.add_argument(
        "--out",
        "--output",
        metavar="HF_DIR",
        help="where to write config.json, model.safetensors, ...",
    )
    exp.add_argument(
        "--force",
        action="store_true",
        help="replace a non-empty --out (never one that is, holds or lies inside the run)",
    )
    exp.add_argument(
        "--max-shard-size",
        default="50GB",
        metavar="SIZE",
        help="largest weight file, as save_pretrained's max_shard_size: '5GB', '500MB' or "
        "bytes (default 50GB: one model.safetensors up to that size, else shards + index)",
    )
    exp.add_argument(
        "--checkpoint",
        metavar="last|best|STEP",
        help="which checkpoint (default: best when the run kept one, else last)",
    )
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, with `args.run_dir` and `args.hf_dir` resolved from the flags or positionals."""
    from flax_transformer.cli.flags import one_run_dir

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "import":
        args.run_dir = one_run_dir(parser, args.workdir, args.run_dir)
        return args
    paths = list(args.paths)
    run_dir = args.workdir if args.workdir is not None else (paths.pop(0) if paths else None)
    hf_dir = args.out if args.out is not None else (paths.pop(0) if paths else None)
    if run_dir is None or hf_dir is None:
        parser.error("export needs --workdir RUN and --out HF_DIR (or the old RUN_DIR HF_DIR)")
    if paths:
        parser.error(f"unexpected argument(s) {' '.join(paths)}: --workdir and --out are given")
    from flax_transformer.hf.shards import parse_shard_size

    if args.max_shard_size.strip().isdigit():  # bytes
        args.max_shard_size = int(args.max_shard_size)
    try:
        parse_shard_size(args.max_shard_size)
    except ValueError as err:
        parser.error(str(err))
    args.run_dir, args.hf_dir = run_dir, hf_dir
    return args


@one_line_failures
def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m flax_transformer.hf` / `ftx hf`: import a save_pretrained
    directory as a run, or export a run as one; say what was imported or exported (--json: as
    JSON, with {"command", "output"}). Exit status
    2 for a missing directory or a checkpoint that cannot be converted, else 0."""
    args = parse_args(argv)
    from flax_transformer.files.space import is_out_of_space
    from flax_transformer.runs.hf import HFExportSpec, HFImportSpec, hf_export, hf_import
    from flax_transformer.spec.tree_check import ConversionError

    try:
        if args.command == "import":
            outcome = hf_import(HFImportSpec(Path(args.hf_dir), Path(args.run_dir), args.dtype))
        else:
            outcome = hf_export(
                HFExportSpec(
                    Path(args.run_dir), Path(args.hf_dir), args.checkpoint, args.force,
                    args.max_shard_size,
                )
            )  # fmt: skip
    except (ValueError, ConversionError, OSError) as err:
        if is_out_of_space(err):
            raise  # a failed write, not bad input: one_line_failures says it (exit 1)
        print(f"error: {err}", file=sys.stderr)
        return 2
    result = {"command": outcome.command, "output": str(outcome.output), "model": outcome.model}
    emit(result, [summary_line(outcome)], args.json)
    return 0


def summary_line(outcome) -> str:
    """What was imported or exported, and where, in one line for a person."""
    model = outcome.model
    what = (
        f"a {model['family']} model ({model['kind']}: {model['layers']} layers, d_model "
        f"{model['d_model']}, {model['heads']} heads, vocab {model['vocab']}, {model['dtype']})"
    )
    if outcome.command == "import":
        return f"imported {what} from {outcome.hf_dir} into the run {outcome.output}"
    return (
        f"exported {what} from the run {outcome.run_dir} to {outcome.output} "
        f"({', '.join(outcome.files)})"
    )


if __name__ == "__main__":
    exit_process(main())
