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
import json
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


def missing_hf_dir(hf_dir: str) -> str | None:
    """The message for an HF_DIR that is not there (None: it is)."""
    if Path(hf_dir).exists():
        return None
    return (
        f"HF_DIR {hf_dir} does not exist; give a local directory written by save_pretrained "
        "(Hub ids are not downloaded: save one first, e.g. AutoModelForSeq2SeqLM.from_pretrained"
        f"({hf_dir!r}).save_pretrained('./{Path(hf_dir).name}') and the same for its tokenizer)"
    )


def output_problem(args: argparse.Namespace) -> str | None:
    """The message for an output that is, contains or lies inside the input, or (export) a
    non-empty --out without --force; None: the output may be written. Checked before JAX or
    transformers are imported."""
    from flax_transformer.files.atomic_io import OutputPathError, check_not_input, check_output_dir

    try:
        if args.command == "import":
            inputs = [("Hugging Face directory", args.hf_dir)]
            check_not_input(args.run_dir, inputs, what="--workdir")
        else:
            inputs = [("run directory", args.run_dir)]
            check_output_dir(args.hf_dir, inputs=inputs, force=args.force, what="--out")
    except OutputPathError as err:
        return str(err)
    return None


@one_line_failures
def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m flax_transformer.hf` / `ftx hf`: import a save_pretrained
    directory as a run, or export a run as one; say what was imported or exported (--json: as
    JSON, with {"command", "output"}). Exit status
    2 for a missing directory or a checkpoint that cannot be converted, else 0."""
    args = parse_args(argv)
    if problem := output_problem(args):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.command == "import" and (problem := missing_hf_dir(args.hf_dir)):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    from flax_transformer.files.space import is_out_of_space
    from flax_transformer.spec.tree_check import ConversionError
    from flax_transformer.training.hf_runs import export_run, import_run

    try:
        if args.command == "import":
            out = import_run(args.hf_dir, args.run_dir, dtype=args.dtype)
        else:
            out = export_run(
                args.run_dir, args.hf_dir, args.checkpoint, force=args.force,
                max_shard_size=args.max_shard_size,
            )  # fmt: skip
    except (ValueError, ConversionError, OSError) as err:
        if is_out_of_space(err):
            raise  # a failed write, not bad input: one_line_failures says it (exit 1)
        print(f"error: {err}", file=sys.stderr)
        return 2
    result, line = summary(args.command, args.hf_dir, args.run_dir, out)
    emit(result, [line], args.json)
    return 0


def summary(command: str, hf_dir, run_dir, out) -> tuple[dict, str]:
    """(the result for --json, the line for a person): what was imported or exported, and
    where. {"command", "output"} as before, and the model: its family, kind and sizes."""
    from flax_transformer.training import run_dir as layout

    run = Path(run_dir if command == "export" else out)
    config = layout.read_config(run)
    hf_config = json.loads((run / layout.HF_CONFIG).read_text()) if command == "import" else None
    if hf_config is None:
        hf_config = json.loads((Path(out) / "config.json").read_text())
    kind = (layout.read_run_json(run) or {}).get("model", "?")
    layers = (
        config.num_encoder_layers if kind == "encoder" else config.num_decoder_layers
        if kind == "lm" else f"{config.num_encoder_layers}+{config.num_decoder_layers}"
    )  # fmt: skip
    model = {
        "family": hf_config.get("model_type"), "kind": kind, "layers": layers,
        "d_model": config.d_model, "heads": config.num_heads,
        "vocab": config.tgt_vocab_size, "dtype": config.param_dtype,
    }  # fmt: skip
    what = (
        f"a {model['family']} model ({kind}: {layers} layers, d_model {config.d_model}, "
        f"{config.num_heads} heads, vocab {config.tgt_vocab_size}, {config.param_dtype})"
    )
    if command == "import":
        line = f"imported {what} from {hf_dir} into the run {out}"
    else:
        files = sorted(p.name for p in Path(out).iterdir())
        line = f"exported {what} from the run {run} to {out} ({', '.join(files)})"
    return {"command": command, "output": str(out), "model": model}, line


if __name__ == "__main__":
    exit_process(main())
