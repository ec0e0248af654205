"""The checks of a training spec that no options class can see (settings that go together, the
workdir against the inputs), and what the spec implies: the run directory, the model kind of
the data, the model config's values, the options classes, whether the run needs float64."""

from __future__ import annotations

import json
from pathlib import Path

from flax_transformer.data.corpus import CHAT
from flax_transformer.runs.run_dir import CHECKPOINTS, CHECKPOINTS_BEST, RUN_JSON, read_config
from flax_transformer.runs.spec import (
    DEFAULT_PRESET,
    DTYPES,
    MODEL_FLAGS,
    TrainSpec,
    UsageError,
)
from flax_transformer.spec.kinds import LM, SEQ2SEQ
from flax_transformer.spec.presets import PRESETS


def check_spec(spec: TrainSpec, workdir: Path | None = None) -> str:
    """What no options class can see: flags that go together, and the run directory (`workdir`,
    default_workdir's when None) against the inputs. Values are checked by the options classes
    (options_from_spec). Returns the data's kind (data_kind: CHAT, LM or SEQ2SEQ), read once
    here for the whole run. The flags alone first; then the two looks at the paths (the data's
    kind, the workdir against every input: nothing is written yet); then what depends on the
    kind."""
    from flax_transformer.data.pipeline import CLASSIFY
    from flax_transformer.files.atomic_io import OutputPathError, check_not_input
    from flax_transformer.training.options import DataOptions

    workdir = default_workdir(spec) if workdir is None else workdir
    check_classify_spec(spec)
    sources = [s for s in ("task", "train_tsv", "lm_text", "train_jsonl") if getattr(spec, s)]
    if spec.task == CLASSIFY:
        sources.remove("task")  # it says how to read --train-tsv
    if len(sources) > 1:
        names = ", ".join("--" + s.replace("_", "-") for s in sources)
        raise UsageError(f"choose one data source, got {names}")
    if spec.lm_valid and not spec.lm_text:
        raise UsageError("--lm-valid needs --lm-text")
    if spec.tokenizer == "bpe" and not (spec.train_tsv or spec.lm_text or spec.train_jsonl):
        raise UsageError("--tokenizer bpe needs a corpus (--train-tsv, --train-jsonl or --lm-text)")
    if spec.init_from:
        # --max-len stays: the longest training sequence (check_train_len), not the model's.
        model_flags = [
            f"--{d.replace('_', '-')}" for d in MODEL_FLAGS if getattr(spec, d) and d != "max_len"
        ]
        model_flags += ["--preset"] if spec.preset else []
        if spec.config or model_flags:
            given = ", ".join((["--config"] if spec.config else []) + model_flags)
            raise UsageError(f"--init-from takes the run's config; do not also give {given}")
        if spec.tokenizer != DataOptions.tokenizer:
            raise UsageError("--init-from takes the run's tokenizer; do not also give --tokenizer")
    kind = data_kind(spec)  # (a bad first line of a --train-jsonl is named as it is)
    # A run that would write config.json, checkpoints, ... over or beside what it reads: the
    # workdir may not be, contain or lie inside an input file or the --init-from run.
    inputs = [(f"--{flag.replace('_', '-')}", getattr(spec, flag, None)) for flag in INPUT_FLAGS]
    try:
        check_not_input(workdir, inputs, what="--workdir")
    except OutputPathError as err:
        raise UsageError(str(err)) from None
    model_kind = LM if kind == CHAT else kind
    check_chat_spec(spec, kind == CHAT)
    check_validation_file(spec, model_kind)
    if spec.keep_best == "exact_match" and model_kind == LM:
        raise UsageError("--keep-best exact_match needs a translation model, not --lm-text")
    if not spec.init_from:  # (the init run's config is checked when it is loaded)
        check_model_flags(spec, model_kind)
    elif not spec.resume:
        check_init_run(Path(spec.init_from))
    # (--mesh is checked against the devices when the processes join: runs/train.py)
    return kind


def check_init_run(init_from: Path) -> None:
    """--init-from names a run directory that holds a checkpoint to start from."""
    if not (init_from / RUN_JSON).exists():
        raise UsageError(f"--init-from {init_from}: not a run directory (no run.json)")
    if not has_checkpoint(init_from):
        raise UsageError(
            f"--init-from {init_from}: the run has no checkpoint in "
            f"{init_from / CHECKPOINTS} (it stopped before its first save?); nothing to start from"
        )


def check_classify_spec(spec: TrainSpec) -> None:
    """--task classify reads --train-tsv (and --valid-tsv) as `text<TAB>label` lines and
    fine-tunes the encoder of --init-from; flags that do not go with it are refused by name."""
    from flax_transformer.data.pipeline import CLASSIFY

    if spec.task != CLASSIFY:
        return
    if not spec.train_tsv:
        raise UsageError("--task classify needs --train-tsv (one 'text<TAB>label' per line)")
    if not spec.init_from:  # (on --resume too: the model's config is the init run's)
        raise UsageError(
            "--task classify fine-tunes an encoder: give --init-from RUN (e.g. an `ftx hf "
            "import` of a BERT, RoBERTa or DistilBERT model)"
        )
    refused = [f for f in ("lm_text", "train_jsonl", "valid_jsonl", "pack") if getattr(spec, f)]
    if spec.keep_best == "exact_match":
        refused.append("keep_best exact_match")
    if refused:
        names = ", ".join("--" + f.replace("_", "-") for f in refused)
        raise UsageError(f"--task classify does not take {names}")


def check_chat_spec(spec: TrainSpec, chat: bool) -> None:
    """A --train-jsonl of conversations (`chat`) fine-tunes an --init-from LLM (its tokenizer's
    chat template renders them; data/corpus_input.ChatInput), validated on conversations."""
    if not chat:
        return
    if not spec.init_from:
        raise UsageError(
            f'--train-jsonl {spec.train_jsonl} holds conversations ({{"messages"}}): a chat '
            "fine-tune starts from --init-from RUN (an `ftx hf import` of a decoder LLM whose "
            "tokenizer has a chat template)"
        )
    if spec.valid_tsv:
        raise UsageError(
            f"--valid-tsv holds translation pairs; --train-jsonl {spec.train_jsonl} holds "
            'conversations: give --valid-jsonl of {"messages"} records'
        )


# The inputs a run reads, by flag: the workdir may not be, contain or lie inside any of them.
INPUT_FLAGS = ("train_tsv", "valid_tsv", "lm_text", "lm_valid", "train_jsonl", "valid_jsonl")
INPUT_FLAGS += ("init_from",)


def has_checkpoint(workdir: Path) -> bool:
    """Whether `workdir` holds a checkpoint (a step directory under checkpoints/, or a best
    one): checked before the new run writes anything, not when its first step loads it."""
    for name in (CHECKPOINTS, CHECKPOINTS_BEST):
        folder = workdir / name
        if folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir()):
            return True
    return False


def check_model_flags(spec: TrainSpec, kind: str) -> None:
    """The model --config and flags give a valid TransformerConfig for a `kind` model (checked
    before any data is read; the vocabulary, which comes from the tokenizer, is a placeholder
    here)."""
    from flax_transformer.data.tokenizer import ByteTokenizer
    from flax_transformer.spec.config import TransformerConfig, check_config_for_kind

    try:
        values = model_values(spec)
    except ValueError as err:
        raise UsageError(f"--config: {err}") from None
    try:
        config = TransformerConfig.from_dict(
            values | dict.fromkeys(("src_vocab_size", "tgt_vocab_size"), ByteTokenizer.vocab_size)
        )
        check_config_for_kind(config, kind)
    except ValueError as err:
        given = [
            "--" + dest.replace("_", "-") for dest in MODEL_FLAGS if getattr(spec, dest) is not None
        ]
        source = ", ".join(given + (["--config"] if spec.config else [])) or "the defaults"
        raise UsageError(f"model flags ({source}): {err}") from None


def options_from_spec(options_class, spec: TrainSpec, **values):
    """An options class (training/options.py) from the spec's fields named like its own
    (`values` win); a value out of range is a UsageError naming its flag."""
    from flax_transformer.training.options import OptionError, option_fields

    flags = {
        name: getattr(spec, name) for name in option_fields(options_class) if hasattr(spec, name)
    }
    try:
        return options_class(**(flags | values))
    except OptionError as err:
        raise UsageError(f"--{err.field.replace('_', '-')} {err.problem}") from None


def bleu_tokenizer(spec: TrainSpec) -> str:
    """--bleu-tokenize auto: letter by letter for the built-in tasks, sacrebleu's usual for
    corpora (TrainOptions' default)."""
    from flax_transformer.training.options import TrainOptions

    if spec.bleu_tokenize != "auto":
        return spec.bleu_tokenize
    return TrainOptions.bleu_tokenize if spec.train_tsv or spec.train_jsonl else "char"


def default_workdir(spec: TrainSpec) -> Path:
    """The run directory: --workdir, else runs/ plus the stem of --train-tsv or --lm-text, else
    runs/ plus the task name."""
    from flax_transformer.training.options import DataOptions

    if spec.workdir:
        return Path(spec.workdir)
    if spec.train_tsv or spec.train_jsonl:
        return Path("runs") / Path(spec.train_tsv or spec.train_jsonl).stem
    if spec.lm_text:
        return Path("runs") / Path(spec.lm_text).stem
    return Path("runs") / (spec.task or DataOptions.task)


def check_validation_file(spec: TrainSpec, kind: str) -> None:
    """--valid-tsv / --valid-jsonl: one of them, beside --train-tsv or --train-jsonl (either
    format with either: a TSV corpus may be validated on a JSONL file and the other way round);
    a TSV holds pairs, so not for a --train-jsonl of {"text"} records (an LM `kind`)."""
    given = [f for f in ("valid_tsv", "valid_jsonl") if getattr(spec, f, None)]
    if not given:
        return
    names = ", ".join("--" + f.replace("_", "-") for f in given)
    if len(given) > 1:
        raise UsageError(f"choose one validation file, got {names}")
    if not (spec.train_tsv or spec.train_jsonl):
        raise UsageError(f"{names} needs --train-tsv or --train-jsonl")
    if spec.valid_tsv and kind == LM:
        raise UsageError(
            f"--valid-tsv holds translation pairs; --train-jsonl {spec.train_jsonl} holds "
            '{"text"} records (a language model): give --valid-jsonl of {"text"} records'
        )


def data_kind(spec: TrainSpec) -> str:
    """What the training data is: LM for --lm-text, for a --train-jsonl what its first line
    says (CHAT for {"messages"}, LM for {"text"}, else SEQ2SEQ: data/corpus.jsonl_source, the
    one read of the file before the run; a DataError when it cannot be read), else SEQ2SEQ."""
    if spec.lm_text:
        return LM
    if getattr(spec, "train_jsonl", None):
        from flax_transformer.data.corpus import jsonl_source

        return jsonl_source(spec.train_jsonl)
    return SEQ2SEQ


def preset_name(spec: TrainSpec) -> str:
    """The model preset the run starts from: --preset, or the default preset when none is given."""
    return spec.preset or DEFAULT_PRESET


def config_file_fields(path: str | Path) -> dict:
    """The fields a --config file sets (checked by TransformerConfig once merged with the
    preset); a ValueError naming the file when it is not a JSON object."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise ValueError(f"cannot read config file {path}: {err}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: config is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: config JSON must be an object")
    return data


def model_values(spec: TrainSpec, say=None) -> dict:
    """TransformerConfig fields: the preset, what --config sets (a partial file is filled from
    the preset, not from TransformerConfig's paper-sized defaults), the model flags, --dtype.
    `say(line)`, when given, hears which fields came from where."""
    from flax_transformer.spec.config import TransformerConfig

    values = dict(PRESETS[preset_name(spec)])
    if spec.config:
        given = config_file_fields(spec.config)
        # The tokenizer sets the vocabulary and pad id whatever the file says.
        from_preset = sorted(set(values) - set(given) - {"src_vocab_size", "tgt_vocab_size"})
        if say is not None and from_preset:
            say(
                f"--config {spec.config} sets {', '.join(sorted(given)) or 'no field'}; "
                f"{', '.join(from_preset)} come from the {preset_name(spec)} preset"
            )
        try:  # the file's own problems named with its path, before the flags change anything
            TransformerConfig.from_dict(values | given)
        except ValueError as err:
            raise ValueError(f"{spec.config}: {err}") from None
        values |= given
    if spec.init_from:  # the init run's config as it is (check_spec refused model flags)
        values = read_config(Path(spec.init_from)).to_dict()
    for dest, (fields, _) in MODEL_FLAGS.items():
        if dest == "max_len" and spec.init_from:
            continue  # the training length (train_len), not the init model's max_len
        if getattr(spec, dest) is not None:
            values.update(dict.fromkeys(fields, getattr(spec, dest)))
    if getattr(spec, "dtype", None):
        values["dtype"], values["param_dtype"] = DTYPES[spec.dtype]
    return values


def wants_float64(spec: TrainSpec) -> bool:
    """The run computes in float64 (--dtype, or a --config / init run that says so): JAX must
    allow 64-bit arrays before the first one is made."""
    if getattr(spec, "dtype", None):
        return spec.dtype == "float64"
    try:
        return model_values(spec).get("dtype") == "float64"
    except (ValueError, OSError):
        return False  # the checks that follow name the problem


def train_len(spec: TrainSpec, config) -> int | None:
    """The longest training sequence when it is not the model's max_len: an --init-from run's
    --max-len (an imported LLM's max_len is its max_position_embeddings, 32768 for Qwen2.5:
    packed rows that long are out of reach). The model keeps its own positions and config;
    a UsageError when it asks for more than the model has."""
    if not (spec.init_from and spec.max_len):
        return None
    if spec.max_len > config.max_len:
        raise UsageError(
            f"--max-len {spec.max_len}: the --init-from model {spec.init_from} holds sequences "
            f"of at most {config.max_len} tokens"
        )
    return spec.max_len
