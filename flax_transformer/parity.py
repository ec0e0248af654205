"""Parity report: run the Flax model and the torch twin side by side, find the first divergence.

API:
- `compare_models(flax_model, flax_params, torch_model, batch)`: any Flax Transformer /
  TransformerLM with its params against any torch_reference model (so one side can carry a
  modification, e.g. another LayerNorm eps or a swapped activation) -> ParityReport.
- `compare_weights(config, flax_params, torch_state, batch)`: the same from weights alone,
  at a chosen dtype.

CLI (exit 0: all within tolerance, 1: something out of tolerance, 2: bad input):
    python -m flax_transformer.parity A B [--dtype float64|float32] [--tol T] [--json OUT]
        [--input TEXT ...] [--target TEXT ...] [--tokenizer tokenizer.json]
A's weights run in Flax, B's weights run in the torch twin (pass the same file twice to check
the two implementations against each other). A and B are torch_reference or Flax safetensors
files (or `.pt` state_dicts with --config) or train.py workdirs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .config import TransformerConfig
from .convert import MODEL_KINDS, ConversionError, expected_param_shapes, load_flax_params
from .parity_capture import capture_flax, capture_torch
from .parity_report import DEFAULT_TOLERANCES, ParityReport, compare_captures

RUN_DTYPES = ("float32", "float64")
# Fields that do not change the function computed in a deterministic forward pass (dtype is set
# by the run), so two configs differing only in them describe the same model.
RUNTIME_FIELDS = ("dtype", "param_dtype", "dropout_rate", "attention_dropout_rate", "remat")
WORKDIR_WEIGHTS = ("flax_params.safetensors", "torch_model.safetensors")


class ParityInputError(ValueError):
    """Inputs the report cannot run on: incompatible models, bad batch, unknown files."""


# ----------------------------------------------------------------------------- API
def compare_models(
    flax_model,
    flax_params: Mapping[str, Any],
    torch_model,
    batch: Mapping[str, Any],
    *,
    tol: float | None = None,
    exclude_masked: bool = True,
    labels: tuple[str, str] = ("flax", "torch"),
    info: Mapping[str, Any] | None = None,
) -> ParityReport:
    """Run both models deterministically on `batch` and compare every intermediate.

    batch: {"src": (B, S), "tgt_in": (B, T)} for a seq2seq Transformer, {"tgt_in": (B, T)} for
    a TransformerLM; int token ids padded with config.pad_id. The torch model is put in eval
    mode. The dtype is the Flax model's config.dtype; tol (relative) defaults per dtype
    (DEFAULT_TOLERANCES). The torch side is the reference of the relative error.
    """
    from .model import Transformer

    config = flax_model.config
    kind = "transformer" if isinstance(flax_model, Transformer) else "lm"
    check_batch(batch, config, kind)
    dtype = config.dtype
    torch_dtypes = {str(p.dtype).removeprefix("torch.") for p in torch_model.parameters()}
    if torch_dtypes != {dtype}:
        raise ParityInputError(
            f"the Flax model computes in {dtype} but the torch model's parameters are "
            f"{sorted(torch_dtypes)}: compare like with like"
        )
    tol = DEFAULT_TOLERANCES[dtype] if tol is None else float(tol)
    if not tol > 0:
        raise ParityInputError(f"tolerance must be > 0, got {tol}")
    with _highest_precision(x64=dtype == "float64"):
        flax_values = capture_flax(flax_model, flax_params, batch, kind)
        torch_values, order = capture_torch(torch_model, batch, kind)
    return compare_captures(
        flax_values,
        torch_values,
        order,
        tol=tol,
        dtype=dtype,
        batch=batch,
        model_kind=kind,
        pad_id=config.pad_id,
        exclude_masked=exclude_masked,
        labels=labels,
        info={"model": kind, "inputs": {k: list(np.shape(v)) for k, v in batch.items()}}
        | dict(info or {}),
    )


def compare_weights(
    config: TransformerConfig,
    flax_params: Mapping[str, Any],
    torch_state: Mapping[str, np.ndarray],
    batch: Mapping[str, Any] | None = None,
    *,
    model_kind: str = "transformer",
    dtype: str = "float64",
    torch_config: TransformerConfig | None = None,
    tol: float | None = None,
    exclude_masked: bool = True,
    labels: tuple[str, str] = ("flax", "torch"),
    info: Mapping[str, Any] | None = None,
) -> ParityReport:
    """`flax_params` in the Flax model vs `torch_state` ({torch key: array}) in the torch twin.

    Both run at `dtype` (weights are cast). `torch_config` (default: `config`) lets the torch
    side run a different but weight-compatible config. batch defaults to `make_batch`.
    """
    import torch_reference

    from .model import Transformer, TransformerLM

    if model_kind not in MODEL_KINDS:
        raise ParityInputError(f"model_kind must be one of {MODEL_KINDS}, got {model_kind!r}")
    if dtype not in RUN_DTYPES:
        raise ParityInputError(f"dtype must be one of {RUN_DTYPES}, got {dtype!r}")
    flax_config = run_config(config, dtype)
    torch_config = run_config(torch_config or config, dtype)
    if batch is None:
        batch = make_batch(flax_config, model_kind)
    params = _cast_tree(flax_params, dtype)
    flax_model = (Transformer if model_kind == "transformer" else TransformerLM)(flax_config)
    torch_cls = {"transformer": torch_reference.Transformer, "lm": torch_reference.TransformerLM}
    torch_model = torch_cls[model_kind](torch_config)
    state = {k: np.asarray(v, dtype=dtype) for k, v in torch_state.items()}
    try:
        torch_reference.load_numpy_state(torch_model, state)
    except RuntimeError as err:  # torch's strict load: missing / unexpected / mis-shaped keys
        raise ParityInputError(f"torch state does not fit the {model_kind} config: {err}") from None
    return compare_models(
        flax_model,
        params,
        torch_model,
        batch,
        tol=tol,
        exclude_masked=exclude_masked,
        labels=labels,
        info=info,
    )


def run_config(config: TransformerConfig, dtype: str) -> TransformerConfig:
    """The config as the report runs it: `dtype` everywhere, no rematerialisation."""
    return config.replace(dtype=dtype, param_dtype=dtype, remat=False)


def _cast_tree(tree, dtype: str):
    if isinstance(tree, Mapping):
        return {k: _cast_tree(v, dtype) for k, v in tree.items()}
    return np.asarray(tree, dtype=dtype)


@contextlib.contextmanager
def _highest_precision(x64: bool):
    """float32 matmuls at full precision on both sides (no TF32); x64 for float64 runs."""
    import jax
    import torch

    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        with contextlib.ExitStack() as stack:
            if x64:
                stack.enter_context(jax.enable_x64(True))
            stack.enter_context(jax.default_matmul_precision("highest"))
            yield
    finally:
        torch.set_float32_matmul_precision(previous)


# ----------------------------------------------------------------------------- batches
def check_batch(batch: Mapping[str, Any], config: TransformerConfig, model_kind: str) -> None:
    needed = {"transformer": ("src", "tgt_in"), "lm": ("tgt_in",)}[model_kind]
    vocab = {"src": config.src_vocab_size, "tgt_in": config.tgt_vocab_size}
    for key in needed:
        if key not in batch:
            raise ParityInputError(f"the {model_kind} batch needs {needed}, missing {key!r}")
        tokens = np.asarray(batch[key])
        if tokens.ndim != 2 or tokens.shape[1] == 0 or not np.issubdtype(tokens.dtype, np.integer):
            raise ParityInputError(
                f"batch[{key!r}] must be (batch, length>0) int token ids, got {tokens.dtype} "
                f"{tokens.shape}"
            )
        if tokens.min() < 0 or tokens.max() >= vocab[key]:
            raise ParityInputError(
                f"batch[{key!r}] has token ids in [{tokens.min()}, {tokens.max()}], outside the "
                f"vocabulary of size {vocab[key]}"
            )
        if tokens.shape[1] > config.max_len:
            raise ParityInputError(
                f"batch[{key!r}] has length {tokens.shape[1]} > max_len {config.max_len}"
            )


def make_batch(
    config: TransformerConfig,
    model_kind: str,
    *,
    batch_size: int = 4,
    src_len: int = 16,
    tgt_len: int = 12,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Random non-pad tokens with ragged padding (row i loses i/batch_size of its length).

    Row 0 is full, so every position appears at least once. Lengths are capped at max_len.
    """
    rng = np.random.default_rng(seed)

    def tokens(vocab: int, length: int) -> np.ndarray:
        length = min(length, config.max_len)
        ids = rng.integers(0, vocab - 1, (batch_size, length))
        ids = ids + (ids >= config.pad_id)  # skip pad_id
        for row in range(1, batch_size):
            ids[row, max(1, length - (row * length) // batch_size) :] = config.pad_id
        return ids.astype(np.int32)

    batch = {"tgt_in": tokens(config.tgt_vocab_size, tgt_len)}
    if model_kind == "transformer":
        batch = {"src": tokens(config.src_vocab_size, src_len)} | batch
    return batch


def batch_from_texts(
    tokenizer,
    texts: Sequence[str],
    model_kind: str,
    targets: Sequence[str] | None = None,
) -> dict[str, np.ndarray]:
    """Token batch as training builds it (the helpers' contract), padded with pad_id.

    seq2seq: src = encode(text) + [eos], tgt_in = [bos] + encode(target) (target defaults to
    the text itself); LM: tgt_in = [bos] + encode(text).
    """
    if targets is not None and len(targets) != len(texts):
        raise ParityInputError(f"got {len(texts)} --input but {len(targets)} --target texts")
    pad = tokenizer.pad_id

    def padded(rows):
        length = max(len(r) for r in rows)
        return np.array([r + [pad] * (length - len(r)) for r in rows], dtype=np.int32)

    targets = list(targets) if targets is not None else list(texts)
    tgt_in = padded([[tokenizer.bos_id] + tokenizer.encode(t) for t in targets])
    if model_kind == "lm":
        return {"tgt_in": tgt_in}
    src = padded([tokenizer.encode(t) + [tokenizer.eos_id] for t in texts])
    return {"src": src, "tgt_in": tgt_in}


# ----------------------------------------------------------------------------- sources
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
        tokenizer = path / "tokenizer.json"
        tokenizer = tokenizer if tokenizer.exists() else None
        for name in WORKDIR_WEIGHTS:
            if (path / name).exists():
                params, config, model = load_flax_params(path / name, config, model)
                return WeightSource(str(path / name), params, config, model, tokenizer)
        if (path / "checkpoints").is_dir() and (path / "config.json").exists():
            # A run still going (or stopped early): its latest Orbax checkpoint.
            from .training import load_run

            run = load_run(path)
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


def config_differences(a: TransformerConfig, b: TransformerConfig) -> dict[str, tuple]:
    """{field: (a's value, b's value)} for fields that change the computed function."""
    return {
        field: (value, getattr(b, field))
        for field, value in a.to_dict().items()
        if field not in RUNTIME_FIELDS and getattr(b, field) != value
    }


def check_compatible(a: WeightSource, b: WeightSource, allow_config_diff: bool) -> dict:
    """Raise ParityInputError unless A and B can be compared; return their config differences."""
    if a.model_kind != b.model_kind:
        raise ParityInputError(
            f"A is a {a.model_kind!r} model and B a {b.model_kind!r} model: not comparable"
        )
    diffs = config_differences(a.config, b.config)
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
        from .tokenizer import load_tokenizer
    except ImportError as err:
        raise ParityInputError(f"cannot load tokenizers in this install ({err})") from None
    try:
        return load_tokenizer(path)
    except (OSError, ValueError) as err:
        raise ParityInputError(f"{path}: cannot load the tokenizer ({err})") from None


# ----------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flax_transformer.parity",
        description="Run A's weights in the Flax model and B's weights in the torch twin on the "
        "same inputs, compare every intermediate (embeddings, each sub-layer, attention weights, "
        "stack outputs, logits) and report where they start to diverge. Exit status: 0 all "
        "within tolerance, 1 something out of tolerance, 2 bad input.",
    )
    parser.add_argument(
        "a",
        help="weights run in Flax: .safetensors (either framework), "
        ".pt (with --config) or a train.py workdir",
    )
    parser.add_argument("b", help="weights run in the torch twin (same kinds as A)")
    parser.add_argument(
        "--dtype",
        choices=RUN_DTYPES,
        default="float64",
        help="computation dtype of both sides (default float64: the sharpest test of the math; "
        "float32 noise hides differences below ~1e-5, e.g. LayerNorm eps 1e-5 vs 1e-6)",
    )
    parser.add_argument(
        "--tol",
        type=float,
        help="relative tolerance (max abs error / max |torch value|); default "
        + ", ".join(f"{k} {DEFAULT_TOLERANCES[k]:.0e}" for k in RUN_DTYPES),
    )
    parser.add_argument(
        "--json",
        metavar="OUT",
        help="also write the report as JSON ('-': print JSON instead of the table)",
    )
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
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--src-len", type=int, default=16)
    parser.add_argument("--tgt-len", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
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
    parser.add_argument("--model", choices=MODEL_KINDS, help="default: from the files")
    return parser


def run_cli(args: argparse.Namespace) -> ParityReport:
    config = TransformerConfig.load(args.config) if args.config else None
    a = load_source(args.a, config, args.model)
    b = load_source(args.b, config, args.model)
    diffs = check_compatible(a, b, args.allow_config_diff)
    if args.batch_size < 1 or args.src_len < 1 or args.tgt_len < 1:
        raise ParityInputError("--batch-size, --src-len and --tgt-len must be >= 1")
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
    from .convert import flax_to_torch_state

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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
            Path(args.json).write_text(report.to_json() + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
