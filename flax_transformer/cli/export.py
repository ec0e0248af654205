"""`ftx export --workdir RUN --format FORMAT --out DIR`: deploy a trained run
(`export RUN --format ...`, the run directory as a positional argument, is the old spelling).

Formats: `stablehlo` (jax.export: forward.stablehlo, greedy.stablehlo; `--int8` bakes in int8
weights), `onnx` (model.onnx, encoder.onnx, decoder.onnx through the PyTorch twin) and
`torch-int8` (the twin with dynamic int8 Linear layers, as TorchScript). Every export writes
manifest.json and tokenizer.json beside its files.

Flag errors exit 2 (argparse); so does a run that cannot be loaded or exported (the message says
why). The output is written to a temporary directory beside --out and renamed at the end: a
failed export leaves nothing behind, and an existing non-empty --out is replaced only with
--force. An --out that is, contains or lies inside the run directory is refused (exit 2), with
--force too: --force never deletes an input.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from flax_transformer.cli.flags import one_run_dir
from flax_transformer.cli.output import add_json_flag, emit
from flax_transformer.export.output import ExportError, check_output_dir
from flax_transformer.files.interruptions import one_line_failures
from flax_transformer.runs.export import FORMATS, PLATFORMS, ExportSpec, export


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse and check the export flags (--workdir or the old positional run directory,
    format-specific flags, --out); an argparse error (exit 2) names a bad flag."""
    parser = argparse.ArgumentParser(
        prog="ftx export",
        description="Export a run (ftx train, ftx hf import) as StableHLO, ONNX or int8 "
        "TorchScript.",
    )
    parser.add_argument(
        "run_dir", type=Path, nargs="?", help="a run directory (old spelling of --workdir)"
    )
    parser.add_argument("--workdir", type=Path, help="the run directory to export")
    parser.add_argument("--format", required=True, choices=FORMATS, help="what to write")
    parser.add_argument("--out", "--output", type=Path, required=True, help="the output directory")
    parser.add_argument("--force", action="store_true", help="replace a non-empty --out")
    add_json_flag(parser)
    parser.add_argument(
        "--int8", action="store_true", help="stablehlo: int8 weights (per-channel scales)"
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        help="stablehlo: tokens greedy.stablehlo generates (default: max_len; an LM: max_len/2)",
    )
    parser.add_argument(
        "--checkpoint",
        metavar="last|best|STEP",
        help="which checkpoint (default: best when the run kept one, else last)",
    )
    parser.add_argument("--opset", type=int, default=18, help="onnx: the ONNX opset (18)")
    parser.add_argument(
        "--platforms",
        default="cpu",
        help="stablehlo: comma-separated jax platforms to lower for (cpu, cuda, rocm, tpu)",
    )
    args = parser.parse_args(argv)
    args.run_dir = one_run_dir(parser, args.workdir, args.run_dir)
    if args.int8 and args.format != "stablehlo":
        parser.error(
            f"--int8 applies to --format stablehlo (--format {args.format} "
            + ("is int8 already)" if args.format == "torch-int8" else "is float32)")
        )
    if args.format != "stablehlo" and args.max_new_tokens is not None:
        parser.error("--max-new-tokens applies to --format stablehlo (greedy.stablehlo)")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        parser.error("--max-new-tokens must be >= 1")
    if args.checkpoint not in (None, "last", "best") and not args.checkpoint.isdigit():
        parser.error(f"--checkpoint must be last, best or a step number, got {args.checkpoint!r}")
    args.platforms = tuple(p.strip() for p in args.platforms.split(",") if p.strip())
    unknown = sorted(set(args.platforms) - set(PLATFORMS))
    if unknown or not args.platforms:
        parser.error(f"--platforms must name some of {', '.join(PLATFORMS)}, got {unknown}")
    if not args.run_dir.is_dir():
        parser.error(f"--workdir {args.run_dir} is not a directory")
    try:
        check_output_dir(args.out, args.force, run_dir=args.run_dir)
    except ExportError as err:
        parser.error(str(err))
    return args


@one_line_failures
def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m flax_transformer.export` / `ftx export`: write the chosen format
    into --out (staged, so a failure leaves no half directory); exit status 2 for a run that
    cannot be loaded or exported, else 0."""
    args = parse_args(argv)
    from flax_transformer.runs.load import RunLoadError

    fields = {f.name for f in dataclasses.fields(ExportSpec)}
    spec = ExportSpec(**{k: v for k, v in vars(args).items() if k in fields})
    try:
        result = export(spec)
    except (RunLoadError, ExportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    emit(result, [f"{args.format}: {args.out} ({', '.join(result['files'])})"], args.json)
    return 0
