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
import dataclasses
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flax_transformer.cli.flags import flag_type
from flax_transformer.cli.output import add_json_flag
from flax_transformer.cli.process import exit_process
from flax_transformer.files.atomic_io import OutputPathError, atomic_write_text, check_output_path
from flax_transformer.files.interruptions import one_line_failures
from flax_transformer.interop.convert import expected_param_shapes, load_flax_params
from flax_transformer.parity.compare import RUN_DTYPES, RUNTIME_FIELDS, compare_weights
from flax_transformer.parity.inputs import (
    ParityInputError,
    batch_from_texts,
    check_batch,
    make_batch,
)
from flax_transformer.parity.report import DEFAULT_TOLERANCES, ParityReport
from flax_transformer.runs import run_dir
from flax_transformer.spec.config import TransformerConfig, config_diff
from flax_transformer.spec.kinds import MODEL_KINDS, current_name
from flax_transformer.spec.tree_check import ConversionError
from flax_transformer.spec.validate import SEED, Float, Int

WORKDIR_WEIGHTS = (run_dir.FLAX_WEIGHTS, run_dir.TORCH_WEIGHTS)


@dataclasses.dataclass(frozen=True)
class WeightSource:
    """One side of the CLI: Flax params, their config and model kind, where they came from."""

    label: str
    params: Mapping[str, Any]
    config: TransformerConfig
    model_kind: str
    tokenizer_path: Path | None = None


def load_source(
    path: str | Path, config: TransformerConfig | None = None, model: str | None = None
) -> WeightSource:
    """A weight file of either framework, or a train.py workdir, as Flax params."""
    path = Path(path)
    if path.is_dir():
        tokenizer = path / run_dir.TOKENIZER
        tokenizer = tokenizer if tokenizer.exists() else None
        for name in WORKDIR_WEIGHTS:
            if (path / name).exists():
                params, config, model = load_flax_params(path / name, config, model)
                return WeightSource(str(path / name), params, config, model, tokenizer)
        if (path / run_dir.CHECKPOINTS).is_dir() and (path / run_dir.CONFIG).exists():
            # A run still going (or stopped early): its latest Orbax checkpoint.
            from flax_transformer.runs.load import open_run

            run = open_run(path)
            label = f"{path} (checkpoint step {run.step})"
            return WeightSource(label, run.params, run.config, run.model_kind, tokenizer)
        raise ParityInputError(
            f"{path}: a directory without {' or '.join(WORKDIR_WEIGHTS)} or checkpoints/; "
            "expected a weight file or a train.py workdir"
        )
    if not path.exists():
        raise ParityInputError(f"{path}: no such file or directory")
    params, config, model = load_flax_params(path, config, model)
    return WeightSource(str(path), params, config, model)


def check_compatible(a: WeightSource, b: WeightSource, allow_config_diff: bool) -> dict:
    """Raise ParityInputError unless A and B can be compared; return their config differences."""
    if a.model_kind != b.model_kind:
        raise ParityInputError(
            f"A is a {a.model_kind!r} model and B a {b.model_kind!r} model: not comparable"
        )
    diffs = config_diff(a.config, b.config, ignore=RUNTIME_FIELDS)
    described = ", ".join(f"{k}: A {va!r}, B {vb!r}" for k, (va, vb) in diffs.items())
    if diffs and not allow_config_diff:
        raise ParityInputError(
            f"A and B have different configs ({described}). To run each side with its own "
            "config (same weight shapes needed), pass --allow-config-diff"
        )
    if diffs:
        shapes_a = {p: s for p, (s, _) in expected_param_shapes(a.config, a.model_kind).items()}
        shapes_b = {p: s for p, (s, _) in expected_param_shapes(b.config, b.model_kind).items()}
        if shapes_a != shapes_b:
            raise ParityInputError(
                f"A and B have different configs ({described}) with different weight shapes: "
                "their layers cannot be matched"
            )
    return diffs


def _tokenizer_for(args, sources: Sequence[WeightSource]):
    path = args.tokenizer or next(
        (s.tokenizer_path for s in sources if s.tokenizer_path is not None), None
    )
    if path is None:
        raise ParityInputError(
            "--input needs a tokenizer: pass --tokenizer tokenizer.json, or give a train.py "
            "workdir (its tokenizer.json is used)"
        )
    try:
        from flax_transformer.data.tokenizer import load_tokenizer
    except ImportError as err:
        raise ParityInputError(f"cannot load tokenizers in this install ({err})") from None
    try:
        return load_tokenizer(path)
    except (OSError, ValueError) as err:
        raise ParityInputError(f"{path}: cannot load the tokenizer ({err})") from None


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


def run_cli(args: argparse.Namespace) -> ParityReport:
    """Load A and B, build (or encode from --input) a batch both accept, and compare A in Flax
    with B in the torch twin; the ParityReport. ParityInputError / ValueError for sources or
    inputs that do not fit together."""
    if args.hf is not None:
        return run_hf(args)
    config = TransformerConfig.load(args.config) if args.config else None
    a = load_source(args.a, config, args.model)
    b = load_source(args.b, config, args.model)
    diffs = check_compatible(a, b, args.allow_config_diff)
    if args.target and not args.input:
        raise ParityInputError("--target needs --input")
    if args.input:
        batch = batch_from_texts(
            _tokenizer_for(args, (a, b)), args.input, a.model_kind, args.target
        )
    else:
        short = a.config if a.config.max_len <= b.config.max_len else b.config
        batch = make_batch(
            short,
            a.model_kind,
            batch_size=args.batch_size,
            src_len=args.src_len,
            tgt_len=args.tgt_len,
            seed=args.seed,
        )
    check_batch(batch, b.config, b.model_kind)
    from flax_transformer.interop.convert import flax_to_torch_state

    return compare_weights(
        a.config,
        a.params,
        flax_to_torch_state(b.params),
        batch,
        model_kind=a.model_kind,
        dtype=args.dtype,
        torch_config=b.config,
        tol=args.tol,
        exclude_masked=not args.include_masked,
        labels=(f"A={a.label} (Flax)", f"B={b.label} (torch)"),
        info={
            "a": a.label,
            "b": b.label,
            "config_differences": {k: list(v) for k, v in diffs.items()},
        },
    )


def run_hf(args: argparse.Namespace) -> ParityReport:
    """--hf HF_DIR: transformers' model of the directory against hf.load's, module by module
    (parity.hf_decoder.compare_hf_decoder), on a random left-padded batch or --input texts."""
    import jax

    from flax_transformer import hf
    from flax_transformer.parity.hf_decoder import (
        LAYOUTS,
        compare_hf_decoder,
        random_left_padded,
    )

    path = Path(args.hf)
    if not (path / "config.json").is_file():
        raise ParityInputError(f"--hf {path}: no config.json (not a save_pretrained directory)")
    with jax.enable_x64(args.dtype == "float64"):
        model = hf.load(path, dtype=args.dtype)
        if model.model_type not in LAYOUTS:
            raise ParityInputError(
                f"--hf {path}: a {model.model_type!r} model; --hf compares decoder LMs "
                f"({', '.join(LAYOUTS)}); for the BERT family use parity.compare_hf_encoder"
            )
        if args.target:
            raise ParityInputError("--target is for seq2seq runs; --hf compares decoder LMs")
        if args.input:
            ids, mask = _encode_left_padded(model, args.input, path)
        else:
            ids, mask = random_left_padded(
                model.config.tgt_vocab_size, args.batch_size, args.src_len, args.seed
            )
        import transformers

        architecture = getattr(transformers, model.family.architecture(model.hf_config))
        torch_model = architecture.from_pretrained(path).eval()
        report = compare_hf_decoder(torch_model, model, ids, mask, dtype=args.dtype, rtol=args.tol)
    label = (f"{path} (Flax, hf.load)", f"{path} (transformers)")
    return dataclasses.replace(report, labels=label, info={**report.info, "hf_dir": str(path)})


def _encode_left_padded(model, texts: list[str], path: Path):
    """(input_ids, attention_mask) of `texts` by the directory's tokenizer, left-padded."""
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise ParityInputError(f"--input needs a tokenizer: {path} has no tokenizer files")
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token_id = model.config.pad_id  # masked out: any id will do
    encoded = tokenizer(list(texts), padding=True, return_tensors="np")
    return encoded["input_ids"], encoded["attention_mask"]


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
