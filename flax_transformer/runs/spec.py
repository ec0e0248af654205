"""The training run's spec: every setting of one run as a typed, frozen dataclass, and its
record in run.json (a versioned schema, with the translation of the 0.2 form).

`TrainSpec` is what `runs.train.train` takes; the command line (cli/train.py) builds it from
its flags, a program builds it directly (`TrainSpec(train_tsv="train.tsv", steps=200)`). The
field names are the training command's flag names (`batch_size` is `--batch-size`), and the
defaults are the options classes' (training/options.py), so no default is written twice.

run.json holds the spec as `"schema": 2` and `"spec": {group: {field: value}}` (the groups
below). 0.2.0 wrote the flags themselves (`"args": vars(args)`, no schema key):
`spec_values` reads either form back as field values, so runs of 0.2 resume, and
--run-config takes either file.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flax_transformer.runs.run_dir import RUN_JSON_SCHEMA
from flax_transformer.spec.presets import PRESETS
from flax_transformer.spec.validate import Int
from flax_transformer.training.options import DataOptions, DistributedOptions, TrainOptions


class UsageError(ValueError):
    """Bad settings or workdir; the message names the flag."""


# The default model is the `small` preset (it learns the default task in minutes on 2 CPU
# cores); its vocabulary sizes and pad id are replaced by the tokenizer's. `preset` picks
# another; a partial `config` file is filled from it.
DEFAULT_PRESET = "small"
MODEL_DEFAULTS = PRESETS[DEFAULT_PRESET]
# Model overrides: field -> (the config fields it sets, help). None: not overridden.
MODEL_FLAGS = {
    "d_model": (("d_model",), "width"),
    "num_heads": (("num_heads",), "attention heads"),
    "num_layers": (("num_encoder_layers", "num_decoder_layers"), "encoder and decoder layers"),
    "d_ff": (("d_ff",), "feed-forward width"),
    "max_len": (
        ("max_len",),
        "longest sequence in tokens (with --init-from: the longest training sequence; the "
        "model keeps its own)",
    ),
    "dropout": (("dropout_rate",), "dropout rate"),
}
# Model overrides whose rule is stricter than their config field's: a config allows 0 layers
# (an encoder-only torch.nn port), a model trained here needs at least one in each stack.
FLAG_RULES = {"num_layers": Int(min=1)}

# dtype: (computation dtype, parameter dtype). bfloat16 is mixed precision: bf16 matmuls on
# float32 parameters (docs/speed.md); float64 turns on jax_enable_x64 for the run.
DTYPES = {
    "float32": ("float32", "float32"),
    "bfloat16": ("bfloat16", "float32"),
    "float64": ("float64", "float64"),
}

# How this process joins the others, not a setting of the run: not in run.json.
DISTRIBUTED_FLAGS = ("coordinator", "num_processes", "process_id")


def _default(options_class, name: str) -> Any:
    return options_class.__dataclass_fields__[name].default


_T, _D = TrainOptions, DataOptions


@dataclasses.dataclass(frozen=True)
class TrainSpec:
    """One training run: where its data comes from, the model, how it trains, where it lives.
    None in a data source or a model override means "not given"."""

    # data sources (one of them; none: the built-in task DataOptions.task)
    task: str | None = None
    train_tsv: str | None = None
    valid_tsv: str | None = None
    lm_text: str | None = None
    lm_valid: str | None = None
    train_jsonl: str | None = None
    valid_jsonl: str | None = None
    # how the data is made (DataOptions)
    task_min_len: int = _default(_D, "task_min_len")
    task_max_len: int = _default(_D, "task_max_len")
    task_train_size: int = _default(_D, "task_train_size")
    task_valid_size: int = _default(_D, "task_valid_size")
    tokenizer: str = _default(_D, "tokenizer")
    bpe_vocab_size: int = _default(_D, "bpe_vocab_size")
    on_long: str = _default(_D, "on_long")
    # the model: a preset, a config file over it, overrides over both, the dtype
    recipe: str | None = None
    preset: str | None = None
    config: str | None = None
    dtype: str | None = None
    d_model: int | None = None
    num_heads: int | None = None
    num_layers: int | None = None
    d_ff: int | None = None
    max_len: int | None = None
    dropout: float | None = None
    # training (TrainOptions; bleu_tokenize "auto": by the data, see runs.checks)
    steps: int = _default(_T, "steps")
    batch_size: int = _default(_T, "batch_size")
    batch_tokens: int | None = _default(_T, "batch_tokens")
    pack: bool = _default(_T, "pack")
    grad_accum: int = _default(_T, "grad_accum")
    lr: float = _default(_T, "lr")
    warmup: int = _default(_T, "warmup")
    schedule: str = _default(_T, "schedule")
    label_smoothing: float = _default(_T, "label_smoothing")
    clip_norm: float = _default(_T, "clip_norm")
    weight_decay: float = _default(_T, "weight_decay")
    seed: int = _default(_T, "seed")
    eval_every: int = _default(_T, "eval_every")
    valid_max: int | None = _default(_T, "valid_max")
    save_every: int = _default(_T, "save_every")
    keep_checkpoints: int = _default(_T, "keep_checkpoints")
    log_every: int = _default(_T, "log_every")
    bleu_tokenize: str = "auto"
    keep_best: str | None = _default(_T, "keep_best")
    early_stop: int | None = _default(_T, "early_stop")
    profile_steps: str | None = _default(_T, "profile_steps")
    mesh: str | None = _default(_T, "mesh")
    # the run: its directory (None: runs/<task or file>), a run to start from, resume
    workdir: str | None = None
    init_from: str | None = _default(_T, "init_from")
    resume: bool = False
    run_config: str | None = None  # the file the settings were read from (not recorded)
    # how this process joins a multi-process run (DistributedOptions; not recorded)
    coordinator: str | None = _default(DistributedOptions, "coordinator")
    num_processes: int | None = _default(DistributedOptions, "num_processes")
    process_id: int | None = _default(DistributedOptions, "process_id")

    def replace(self, **changes) -> TrainSpec:
        """A copy with `changes` (field=value) applied."""
        return dataclasses.replace(self, **changes)


# run.json's groups of the spec (schema 2). A field in no group is not recorded.
SOURCES = ("task", "train_tsv", "valid_tsv", "lm_text", "lm_valid", "train_jsonl", "valid_jsonl")
MODEL = ("recipe", "preset", "config", "dtype", *MODEL_FLAGS)
RUN = ("workdir", "init_from")
NOT_RECORDED = ("resume", "run_config", *DISTRIBUTED_FLAGS)


def record_groups() -> dict[str, tuple[str, ...]]:
    """{group: its fields} of run.json's "spec": sources, data, model, training, run."""
    fields = [f.name for f in dataclasses.fields(TrainSpec)]
    data_fields = {f.name for f in dataclasses.fields(DataOptions)} - {"task"}
    placed = {*SOURCES, *MODEL, *RUN, *NOT_RECORDED}
    return {
        "sources": SOURCES,
        "data": tuple(f for f in fields if f in data_fields),
        "model": MODEL,
        "training": tuple(f for f in fields if f not in placed and f not in data_fields),
        "run": RUN,
    }


def spec_record(spec: TrainSpec) -> dict[str, dict[str, Any]]:
    """The spec as run.json's "spec" holds it: {group: {field: value}} (plain JSON values)."""
    values = dataclasses.asdict(spec)
    return {group: {f: values[f] for f in names} for group, names in record_groups().items()}


def spec_values(run_json: dict) -> dict[str, Any]:
    """The recorded settings of a run.json (or of a --run-config file of the same form) as
    {field: value}: schema 2's groups flattened, or 0.2's "args" (the flags, which were the
    fields then). A ValueError for a schema newer than this version reads."""
    schema = run_json.get("schema")
    if schema is None:  # 0.2.x: {"args": vars(args)}
        args = run_json.get("args", {})
        return dict(args) if isinstance(args, dict) else {}
    if not isinstance(schema, int) or schema > RUN_JSON_SCHEMA:
        raise ValueError(
            f"run.json schema {schema!r} is newer than this version reads ({RUN_JSON_SCHEMA}); "
            "upgrade flax-transformer"
        )
    values = {}
    for group in (run_json.get("spec") or {}).values():
        if isinstance(group, dict):
            values.update(group)
    return values


def spec_fields() -> tuple[str, ...]:
    """The names of TrainSpec's fields (the training command's flag dests)."""
    return tuple(f.name for f in dataclasses.fields(TrainSpec))
