"""The parity workflow (`ftx parity`): two weight files or run directories, A run in Flax and B
in the torch twin on the same inputs, compared module by module; or (`hf`) a save_pretrained
decoder LM, transformers' model against hf.load's. `parity(ParitySpec(...)) -> ParityReport`;
cli/parity.py builds the spec from its flags, prints the report and maps it to the exit
status."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flax_transformer.interop.convert import expected_param_shapes, load_flax_params
from flax_transformer.parity.compare import RUNTIME_FIELDS, compare_weights
from flax_transformer.parity.inputs import (
    ParityInputError,
    batch_from_texts,
    check_batch,
    make_batch,
)
from flax_transformer.parity.report import ParityReport
from flax_transformer.runs import run_dir
from flax_transformer.spec.config import TransformerConfig, config_diff


@dataclasses.dataclass(frozen=True)
class ParitySpec:
    """What to compare: A (run in Flax) and B (run in the torch twin), each a weight file or a
    run directory; or `hf`, a save_pretrained directory (then A and B are unused). How: the
    computation dtype, the tolerance (None: the dtype's default), and the batch: `input` texts
    (with `target` texts for seq2seq, by `tokenizer` or a run's own), else a random one of the
    given sizes and seed. `config` and `model` stand in for what a .pt file lacks."""

    a: Path | None = None
    b: Path | None = None
    hf: Path | None = None
    dtype: str = "float64"
    tol: float | None = None
    input: tuple[str, ...] = ()
    target: tuple[str, ...] = ()
    tokenizer: Path | None = None
    batch_size: int = 4
    src_len: int = 16
    tgt_len: int = 12
    seed: int = 0
    include_masked: bool = False
    allow_config_diff: bool = False
    config: Path | None = None
    model: str | None = None


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


def _tokenizer_for(spec: ParitySpec, sources: Sequence[WeightSource]):
    path = spec.tokenizer or next(
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


def parity(spec: ParitySpec) -> ParityReport:
    """Load A and B, build (or encode from the inputs) a batch both accept, and compare A in
    Flax with B in the torch twin (or, with spec.hf, transformers' model with hf.load's); the
    ParityReport. ParityInputError / ValueError for sources or inputs that do not fit
    together."""
    if spec.hf is not None:
        return parity_hf(spec)
    config = TransformerConfig.load(spec.config) if spec.config else None
    a = load_source(spec.a, config, spec.model)
    b = load_source(spec.b, config, spec.model)
    diffs = check_compatible(a, b, spec.allow_config_diff)
    if spec.target and not spec.input:
        raise ParityInputError("--target needs --input")
    if spec.input:
        batch = batch_from_texts(
            _tokenizer_for(spec, (a, b)), spec.input, a.model_kind, spec.target or None
        )
    else:
        short = a.config if a.config.max_len <= b.config.max_len else b.config
        batch = make_batch(
            short,
            a.model_kind,
            batch_size=spec.batch_size,
            src_len=spec.src_len,
            tgt_len=spec.tgt_len,
            seed=spec.seed,
        )
    check_batch(batch, b.config, b.model_kind)
    from flax_transformer.interop.convert import flax_to_torch_state

    return compare_weights(
        a.config,
        a.params,
        flax_to_torch_state(b.params),
        batch,
        model_kind=a.model_kind,
        dtype=spec.dtype,
        torch_config=b.config,
        tol=spec.tol,
        exclude_masked=not spec.include_masked,
        labels=(f"A={a.label} (Flax)", f"B={b.label} (torch)"),
        info={
            "a": a.label,
            "b": b.label,
            "config_differences": {k: list(v) for k, v in diffs.items()},
        },
    )


def parity_hf(spec: ParitySpec) -> ParityReport:
    """--hf HF_DIR: transformers' model of the directory against hf.load's, module by module
    (parity.hf_decoder.compare_hf_decoder), on a random left-padded batch or --input texts."""
    import jax

    from flax_transformer import hf
    from flax_transformer.parity.hf_decoder import (
        LAYOUTS,
        compare_hf_decoder,
        random_left_padded,
    )

    path = Path(spec.hf)
    if not (path / "config.json").is_file():
        raise ParityInputError(f"--hf {path}: no config.json (not a save_pretrained directory)")
    with jax.enable_x64(spec.dtype == "float64"):
        model = hf.load(path, dtype=spec.dtype)
        if model.model_type not in LAYOUTS:
            raise ParityInputError(
                f"--hf {path}: a {model.model_type!r} model; --hf compares decoder LMs "
                f"({', '.join(LAYOUTS)}); for the BERT family use parity.compare_hf_encoder"
            )
        if spec.target:
            raise ParityInputError("--target is for seq2seq runs; --hf compares decoder LMs")
        if spec.input:
            ids, mask = _encode_left_padded(model, spec.input, path)
        else:
            ids, mask = random_left_padded(
                model.config.tgt_vocab_size, spec.batch_size, spec.src_len, spec.seed
            )
        import transformers

        architecture = getattr(transformers, model.family.architecture(model.hf_config))
        torch_model = architecture.from_pretrained(path).eval()
        report = compare_hf_decoder(torch_model, model, ids, mask, dtype=spec.dtype, rtol=spec.tol)
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
