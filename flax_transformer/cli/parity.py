"""`ftx parity A B`: the parity report on two weight files or run directories.

Exit 0: all within tolerance, 1: something out of tolerance, 2: bad input.
    ftx parity A B [--dtype float64|float32] [--tol T] [--json OUT]
    ftx parity --workdir RUN [B]    (A = RUN; B = RUN when not given)
        [--input TEXT ...] [--target TEXT ...] [--tokenizer tokenizer.json]
A's weights run in Flax, B's weights run in the torch twin (pass the same file twice to check
the two implementations against each other). A and B are torch_reference or Flax safetensors
files (or `.pt` state_dicts with --config) or run directories.
    ftx parity --hf HF_DIR [--input TEXT ...]
A save_pretrained directory of a decoder LM (llama, mistral, qwen2, qwen3, gpt2): transformers'
PyTorch model against `hf.load`'s Flax one, module by module (parity/hf_decoder.py), on a
random left-padded batch (--batch-size rows of at most --src-len tokens) or --input texts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flax_transformer.cli.flags import flag_type
from flax_transformer.cli.output import add_json_flag
from flax_transformer.cli.process import exit_process
from flax_transformer.files.atomic_io import OutputPathError, atomic_write_text, check_output_path
from flax_transformer.files.interruptions import one_line_failures
from flax_transformer.parity.compare import RUN_DTYPES
from flax_transformer.parity.inputs import (
    ParityInputError,
)
from flax_transformer.parity.report import DEFAULT_TOLERANCES
from flax_transformer.spec.kinds import MODEL_KINDS, current_name
from flax_transformer.spec.tree_check import ConversionError
from flax_transformer.spec.validate import SEED, Float, Int


# ----------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of `python -m flax_transformer.parity` / `ftx parity`: the two weight
    sources A and B (or --workdir), dtype, tolerance and input flags."""
    parser = argparse.ArgumentParser(
        prog="ftx parity",
        description="Run A's weights in the Flax model and B's weights in the torch twin on the "
        "same inputs, compare every intermediate (embeddings, each sub-layer, attention weights, "
        "stack outputs, logits) and report where they start to diverge. Exit status: 0 all "
        "within tolerance, 1 something out of tolerance, 2 bad input.",
    )
    parser.add_argument(
        "sources",
        nargs="*",
        metavar="A B",
        help="A: weights run in Flax: .safetensors (either framework), .pt (with --config) or a "
        "run directory; B: weights run in the torch twin (same kinds as A)",
    )
    parser.add_argument(
        "--workdir",
        metavar="RUN",
        help="a run directory as A; B is the one positional given, or RUN again (the run's "
        "weights in Flax against the same weights in the torch twin)",
    )
    parser.add_argument(
        "--hf",
        metavar="HF_DIR",
        help="instead of A B: a save_pretrained directory of a decoder LM (llama, mistral, "
        "qwen2, qwen3, gpt2), transformers' model against hf.load's Flax model, module by module "
        "(in float64 transformers' RMS norms and rotary tables run in float64 too)",
    )
    parser.add_argument(
        "--dtype",
        choices=RUN_DTYPES,
        default="float64",
        help="computation dtype of both sides (default float64: the sharpest test of the math; "
        "float32 noise hides differences below ~1e-5, e.g. LayerNorm eps 1e-5 vs 1e-6)",
    )
    parser.add_argument(
        "--tol",
        type=flag_type(Float(gt=0), "--tol"),
        help="relative tolerance (max abs error / max |torch value|); default "
        + ", ".join(f"{k} {DEFAULT_TOLERANCES[k]:.0e}" for k in RUN_DTYPES),
    )
    add_json_flag(parser)
    parser.add_argument(
        "--input",
        action="append",
        metavar="TEXT",
        help="text to run (repeatable); default: a generated random batch",
    )
    parser.add_argument(
        "--target",
        action="append",
        metavar="TEXT",
        help="seq2seq target text per --input (default: the input text)",
    )
    parser.add_argument("--tokenizer", help="tokenizer.json for --input (default: a workdir's)")
    for flag, default in (("--batch-size", 4), ("--src-len", 16), ("--tgt-len", 12)):
        parser.add_argument(flag, type=flag_type(Int(min=1), flag), default=default)
    parser.add_argument("--seed", type=flag_type(SEED, "--seed"), default=0)
    parser.add_argument(
        "--include-masked",
        action="store_true",
        help="compare padding rows and masked attention entries too",
    )
    parser.add_argument(
        "--allow-config-diff",
        action="store_true",
        help="run A and B with their own configs when only non-shape fields "
        "differ (e.g. layer_norm_eps, activation, norm_first)",
    )
    parser.add_argument("--config", help="TransformerConfig JSON for files without one (.pt)")
    parser.add_argument(
        "--model", choices=MODEL_KINDS, type=current_name, help="default: from the files"
    )
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, with A and B (`args.a`, `args.b`) resolved from `--workdir` and positionals."""
    parser = build_parser()
    args = parser.parse_args(argv)
    sources = list(args.sources)
    if args.hf is not None:
        if sources or args.workdir is not None:
            parser.error("--hf HF_DIR compares one directory: give no A B and no --workdir")
        sources = [args.hf, args.hf]
    elif args.workdir is not None:
        if len(sources) > 1:
            parser.error(f"--workdir {args.workdir} is A: give at most one positional (B)")
        sources = [args.workdir, sources[0] if sources else args.workdir]
    if len(sources) != 2:
        parser.error(
            f"give A and B (two weight files or workdirs) or --workdir RUN; got {len(sources)} "
            "positional argument(s)"
        )
    args.a, args.b = sources
    if args.json not in (None, "-"):  # before A and B are read: the report never overwrites one
        inputs = [("input A", args.a), ("input B", args.b)]
        inputs += [("--config file", args.config), ("--tokenizer file", args.tokenizer)]
        try:
            check_output_path(args.json, inputs=inputs, what="--json")
        except OutputPathError as err:
            parser.error(str(err))
    return args


def spec_from_args(args: argparse.Namespace):
    """The ParitySpec of the parsed flags."""
    from flax_transformer.runs.parity import ParitySpec

    def path(value):
        return None if value is None else Path(value)

    if args.hf is not None:
        sources = {"hf": Path(args.hf)}
    else:
        sources = {"a": Path(args.a), "b": Path(args.b)}
    return ParitySpec(
        **sources, dtype=args.dtype, tol=args.tol, input=tuple(args.input or ()),
        target=tuple(args.target or ()), tokenizer=path(args.tokenizer),
        batch_size=args.batch_size, src_len=args.src_len, tgt_len=args.tgt_len, seed=args.seed,
        include_masked=args.include_masked, allow_config_diff=args.allow_config_diff,
        config=path(args.config), model=args.model,
    )  # fmt: skip


def run_cli(args: argparse.Namespace):
    """The ParityReport of the parsed flags (runs/parity.py's parity on their spec)."""
    from flax_transformer.runs.parity import parity

    return parity(spec_from_args(args))


@one_line_failures
def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m flax_transformer.parity` / `ftx parity`: print the report as a
    table (or JSON with --json -). Exit status 0 all within tolerance, 1 something out of
    tolerance, 2 bad input."""
    args = parse_args(argv)
    try:
        report = run_cli(args)
    except (ParityInputError, ConversionError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json == "-":
        print(report.to_json())
    else:
        print(report.format_table())
        if args.json:
            atomic_write_text(args.json, report.to_json() + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    exit_process(main())
