"""The flags of the training command (`ftx train`, `python train.py`): building the parser,
reading flag values back from JSON (--run-config, --resume), the checks no options class can
see, and the model config the flags describe. The run itself is cli/train.py."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from flax_transformer.spec.kinds import LM, SEQ2SEQ
from flax_transformer.spec.presets import PRESETS
from flax_transformer.spec.validate import Int
from flax_transformer.training.run_dir import (
    CHECKPOINTS,
    CHECKPOINTS_BEST,
    RUN_JSON,
    read_config,
    read_run_json,
)

# The default model is the `small` preset (it learns the default task in minutes on 2 CPU
# cores); its vocabulary sizes and pad id are replaced by the tokenizer's. --preset picks
# another; a partial --config is filled from it.
DEFAULT_PRESET = "small"
MODEL_DEFAULTS = PRESETS[DEFAULT_PRESET]
# Model flags: dest -> (the config fields it sets, help). They default to None, so that only
# the flags given override --config.
MODEL_FLAGS = {
    "d_model": (("d_model",), "width"),
    "num_heads": (("num_heads",), "attention heads"),
    "num_layers": (("num_encoder_layers", "num_decoder_layers"), "encoder and decoder layers"),
    "d_ff": (("d_ff",), "feed-forward width"),
    "max_len": (("max_len",), "longest sequence in tokens"),
    "dropout": (("dropout_rate",), "dropout rate"),
}
# Model flags whose rule is stricter than their config field's: a config allows 0 layers (an
# encoder-only torch.nn port), a model trained here needs at least one in each stack it has.
FLAG_RULES = {"num_layers": Int(min=1)}

# --dtype: (computation dtype, parameter dtype). bfloat16 is mixed precision: bf16 matmuls on
# float32 parameters (docs/speed.md); float64 turns on jax_enable_x64 for the run.
DTYPES = {
    "float32": ("float32", "float32"),
    "bfloat16": ("bfloat16", "float32"),
    "float64": ("float64", "float64"),
}

# Flags of one launch (how this process joins the others), not of the run: not in run.json.
DISTRIBUTED_FLAGS = ("coordinator", "num_processes", "process_id")


class UsageError(ValueError):
    """Bad flags or workdir; the message names the flag."""


def add_option_flags(group, options_class, names, **overrides) -> None:
    """One flag per named field of an options class (training/options.py): its default, help
    and choices come from the field; `overrides` maps a name to argparse keywords to change."""
    from flax_transformer.cli.flags import flag_type
    from flax_transformer.spec.validate import Float, Int
    from flax_transformer.training.options import argparse_keywords, option_fields, rule_of

    fields = option_fields(options_class)
    for name in names:
        field = fields[name]
        kwargs = {"default": field.default, **argparse_keywords(field)}
        if field.default is not None:  # None: the help says what happens without the flag
            kwargs["help"] += " (default: %(default)s)"
        rule = rule_of(field)
        if isinstance(rule, Int | Float):  # checked as it is parsed: an argparse error, exit 2
            kwargs["type"] = flag_type(rule, "--" + name.replace("_", "-"))
        kwargs.update(overrides.get(name, {}))
        group.add_argument("--" + name.replace("_", "-"), **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of `python train.py` / `ftx train`: data, model, training and distributed
    flag groups, defaults taken from the options classes."""
    from flax_transformer.training.options import (
        BLEU_TOKENIZERS,
        DataOptions,
        DistributedOptions,
        TrainOptions,
    )

    p = argparse.ArgumentParser(
        prog="ftx train",
        description="Train the Transformer of 'Attention Is All You Need' (JAX/Flax) on a "
        "built-in task, a parallel corpus or a text file, with exact resume.",
    )
    default_task = DataOptions.task
    data = p.add_argument_group(f"data (choose one source; default: --task {default_task})")
    # --task defaults to None so that a second source is an error, not an override.
    task = {
        "default": None,
        "help": f"built-in generated task (default: {default_task}); classify: fine-tune the "
        "--init-from encoder on --train-tsv's 'text<TAB>label' lines (docs/training.md)",
    }
    add_option_flags(
        data,
        DataOptions,
        ("task", "task_min_len", "task_max_len", "task_train_size", "task_valid_size"),
        task=task,
    )
    data.add_argument("--train-tsv", help="training corpus: one 'source<TAB>target' per line")
    data.add_argument(
        "--valid-tsv", help="validation corpus (default: hold out a slice of --train-tsv)"
    )
    data.add_argument("--lm-text", help="text file for a decoder-only LM, one document a line")
    data.add_argument("--lm-valid", help="validation text (default: hold out some lines)")
    data.add_argument(
        "--train-jsonl",
        help='training corpus, one JSON object a line: {"source": ..., "target": ...} '
        '(seq2seq) or {"text": ...} (LM)',
    )
    data.add_argument("--valid-jsonl", help="validation JSONL (default: hold out some lines)")
    add_option_flags(data, DataOptions, ("tokenizer", "bpe_vocab_size", "on_long"))

    from flax_transformer.training.recipes import RECIPES

    p.add_argument(
        "--recipe",
        choices=tuple(RECIPES),
        help="start from a named set of flag values (paper-base: the paper's base model and "
        "training, docs/training.md); flags given here override it",
    )
    model = p.add_argument_group("model (flags override --config)")
    model.add_argument(
        "--preset",
        choices=tuple(PRESETS),
        help=f"the model's starting point (default: {DEFAULT_PRESET}); --config and the model "
        "flags change fields of it",
    )
    model.add_argument(
        "--config",
        help="TransformerConfig JSON file; fields it leaves out come from --preset (vocab "
        "sizes come from the tokenizer)",
    )
    model.add_argument(
        "--dtype",
        choices=tuple(DTYPES),
        help="float32; bfloat16 (mixed precision: bf16 compute, float32 parameters); float64 "
        "(default: the config's, float32). Also for fine-tuning with --init-from",
    )
    from flax_transformer.cli.flags import flag_type
    from flax_transformer.spec.config import FIELD_RULES

    for dest, (fields, text) in MODEL_FLAGS.items():
        default, flag = MODEL_DEFAULTS[fields[0]], "--" + dest.replace("_", "-")
        rule = FLAG_RULES.get(dest, FIELD_RULES[fields[0]])
        model.add_argument(flag, type=flag_type(rule, flag), help=f"{text} (default: {default})")

    train = p.add_argument_group("training")
    add_option_flags(
        train,
        TrainOptions,
        ("steps", "batch_size", "batch_tokens", "pack", "grad_accum", "lr", "warmup")
        + ("schedule",)
        + ("label_smoothing", "clip_norm", "weight_decay", "seed"),
    )

    run = p.add_argument_group("run")
    run.add_argument("--workdir", help="where everything goes (default: runs/<task or file>)")
    corpus_bleu = TrainOptions.bleu_tokenize
    add_option_flags(
        run,
        TrainOptions,
        ("eval_every", "valid_max", "save_every", "keep_checkpoints", "log_every")
        + ("bleu_tokenize", "keep_best", "early_stop", "profile_steps", "mesh", "init_from"),
        bleu_tokenize={
            "default": "auto",
            "choices": ("auto", *BLEU_TOKENIZERS),
            "help": f"sacrebleu tokenizer; auto: char for tasks, {corpus_bleu} for corpora "
            "(default: %(default)s)",
        },
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --workdir from its latest checkpoint",
    )
    run.add_argument(
        "--run-config",
        help="JSON file of flag values, or a previous run's run.json; command-line flags win",
    )
    many = p.add_argument_group("multi-process (ftx launch starts them)")
    add_option_flags(many, DistributedOptions, DISTRIBUTED_FLAGS)
    return p


# ----------------------------------------------------------------------------- flags
def parse_args(argv):
    """Parse the training command line; --run-config and --resume (the workdir's run.json) supply
    defaults that flags given on this line override. UsageError if --resume finds no run.json."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.recipe:  # the recipe's values, under --run-config's and the command line's
        from flax_transformer.training.recipes import RECIPES

        parser.set_defaults(**RECIPES[args.recipe])
        args = parser.parse_args(argv)
    if args.run_config:
        parser.set_defaults(**_flag_values(parser, args.run_config, "--run-config"))
        args = parser.parse_args(argv)
    if args.resume:
        saved = default_workdir(args) / RUN_JSON
        if not saved.exists():
            raise UsageError(f"--resume: {saved} not found; nothing to resume in that --workdir")
        if read_run_json(saved) is None:  # a run.json cut short by a crash (older versions)
            print(
                f"warning: --resume: {saved} is not readable JSON; resuming with the flags of "
                "this command line (the model is still checked against config.json), and "
                "run.json is written anew",
                file=sys.stderr,
            )
            return args
        values = _flag_values(parser, saved, "--resume")
        values.pop("resume", None)
        parser.set_defaults(**values)
        args = parser.parse_args(argv)
    return args


def _flag_values(parser, path, flag) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UsageError(f"{flag}: cannot read {path}: {err}") from None
    if isinstance(data, dict) and isinstance(data.get("args"), dict):
        data = data["args"]  # a run.json: its flags
    if not isinstance(data, dict):
        raise UsageError(f"{flag}: {path} must hold a JSON object of flag values")
    from flax_transformer.cli.flags import run_config_problems

    known = {a.dest for a in parser._actions}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UsageError(f"{flag}: {path} has unknown flag(s): {', '.join(unknown)}")
    problems = run_config_problems(parser, data)
    if problems:  # the command line's checks, for values that bypass argparse's `type`
        raise UsageError(f"{flag}: {path}: " + "; ".join(problems))
    return data


def check_args(args) -> None:
    """What no options class can see: flags that go together. Values are checked by the options
    classes (options_from_args)."""
    from flax_transformer.data.pipeline import CLASSIFY
    from flax_transformer.training.options import DataOptions

    check_workdir_not_input(args)  # first: a run that would write over its input is the worst
    check_classify_args(args)
    sources = [s for s in ("task", "train_tsv", "lm_text", "train_jsonl") if getattr(args, s)]
    if args.task == CLASSIFY:
        sources.remove("task")  # it says how to read --train-tsv
    if len(sources) > 1:
        names = ", ".join("--" + s.replace("_", "-") for s in sources)
        raise UsageError(f"choose one data source, got {names}")
    check_validation_file(args)
    if args.lm_valid and not args.lm_text:
        raise UsageError("--lm-valid needs --lm-text")
    if args.tokenizer == "bpe" and not (args.train_tsv or args.lm_text or args.train_jsonl):
        raise UsageError("--tokenizer bpe needs a corpus (--train-tsv, --train-jsonl or --lm-text)")
    if args.keep_best == "exact_match" and corpus_kind(args) == LM:
        raise UsageError("--keep-best exact_match needs a translation model, not --lm-text")
    if args.init_from:
        model_flags = [f"--{d.replace('_', '-')}" for d in MODEL_FLAGS if getattr(args, d)]
        model_flags += ["--preset"] if args.preset else []
        if args.config or model_flags:
            given = ", ".join((["--config"] if args.config else []) + model_flags)
            raise UsageError(f"--init-from takes the run's config; do not also give {given}")
        if args.tokenizer != DataOptions.tokenizer:
            raise UsageError("--init-from takes the run's tokenizer; do not also give --tokenizer")
        if not args.resume and not (Path(args.init_from) / RUN_JSON).exists():
            raise UsageError(f"--init-from {args.init_from}: not a run directory (no run.json)")
        if not args.resume and not has_checkpoint(Path(args.init_from)):
            raise UsageError(
                f"--init-from {args.init_from}: the run has no checkpoint in "
                f"{Path(args.init_from) / CHECKPOINTS} (it stopped before its first save?); "
                "nothing to start from"
            )
    else:  # the init run's config is checked when it is loaded
        check_model_flags(args)
    if args.mesh:
        from flax_transformer.training.distributed import check_mesh_spans_processes
        from flax_transformer.training.sharding import MeshError, make_mesh

        try:
            check_mesh_spans_processes(make_mesh(args.mesh))
        except MeshError as err:
            raise UsageError(f"--mesh: {err}") from None


def check_classify_args(args) -> None:
    """--task classify reads --train-tsv (and --valid-tsv) as `text<TAB>label` lines and
    fine-tunes the encoder of --init-from; flags that do not go with it are refused by name."""
    from flax_transformer.data.pipeline import CLASSIFY

    if args.task != CLASSIFY:
        return
    if not args.train_tsv:
        raise UsageError("--task classify needs --train-tsv (one 'text<TAB>label' per line)")
    if not args.init_from:  # (on --resume too: the model's config is the init run's)
        raise UsageError(
            "--task classify fine-tunes an encoder: give --init-from RUN (e.g. an `ftx hf "
            "import` of a BERT, RoBERTa or DistilBERT model)"
        )
    refused = [f for f in ("lm_text", "train_jsonl", "valid_jsonl", "pack") if getattr(args, f)]
    if args.keep_best == "exact_match":
        refused.append("keep_best exact_match")
    if refused:
        names = ", ".join("--" + f.replace("_", "-") for f in refused)
        raise UsageError(f"--task classify does not take {names}")


# The inputs a run reads, by flag: the workdir may not be, contain or lie inside any of them.
INPUT_FLAGS = ("train_tsv", "valid_tsv", "lm_text", "lm_valid", "train_jsonl", "valid_jsonl")
INPUT_FLAGS += ("init_from",)


def check_workdir_not_input(args) -> None:
    """UsageError (exit 2) naming both paths when the workdir is, contains or lies inside an
    input file or the --init-from run: the run would write config.json, checkpoints, ... over
    or beside what it reads (files/atomic_io.check_not_input)."""
    from flax_transformer.files.atomic_io import OutputPathError, check_not_input

    inputs = [(f"--{flag.replace('_', '-')}", getattr(args, flag, None)) for flag in INPUT_FLAGS]
    try:
        check_not_input(default_workdir(args), inputs, what="--workdir")
    except OutputPathError as err:
        raise UsageError(str(err)) from None


def has_checkpoint(workdir: Path) -> bool:
    """Whether `workdir` holds a checkpoint (a step directory under checkpoints/, or a best
    one): checked before the new run writes anything, not when its first step loads it."""
    for name in (CHECKPOINTS, CHECKPOINTS_BEST):
        folder = workdir / name
        if folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir()):
            return True
    return False


def check_model_flags(args) -> None:
    """The model --config and flags give a valid TransformerConfig (checked before any data is
    read; the vocabulary, which comes from the tokenizer, is a placeholder here)."""
    from flax_transformer.data.tokenizer import ByteTokenizer
    from flax_transformer.spec.config import TransformerConfig, check_config_for_kind

    try:
        values = model_values(args)
    except ValueError as err:
        raise UsageError(f"--config: {err}") from None
    kind = corpus_kind(args)  # (a bad first line of a --train-jsonl is named as it is)
    try:
        config = TransformerConfig.from_dict(
            values | dict.fromkeys(("src_vocab_size", "tgt_vocab_size"), ByteTokenizer.vocab_size)
        )
        check_config_for_kind(config, kind)
    except ValueError as err:
        given = [
            "--" + dest.replace("_", "-") for dest in MODEL_FLAGS if getattr(args, dest) is not None
        ]
        source = ", ".join(given + (["--config"] if args.config else [])) or "the defaults"
        raise UsageError(f"model flags ({source}): {err}") from None


def options_from_args(options_class, args, **values):
    """An options class (training/options.py) from the flags named like its fields (`values`
    win); a value out of range is a UsageError naming its flag."""
    from flax_transformer.training.options import OptionError, option_fields

    flags = {name: getattr(args, name) for name in option_fields(options_class) if name in args}
    try:
        return options_class(**(flags | values))
    except OptionError as err:
        raise UsageError(f"--{err.field.replace('_', '-')} {err.problem}") from None


def bleu_tokenizer(args) -> str:
    """--bleu-tokenize auto: letter by letter for the built-in tasks, sacrebleu's usual for
    corpora (TrainOptions' default)."""
    from flax_transformer.training.options import TrainOptions

    if args.bleu_tokenize != "auto":
        return args.bleu_tokenize
    return TrainOptions.bleu_tokenize if args.train_tsv or args.train_jsonl else "char"


def default_workdir(args) -> Path:
    """The run directory: --workdir, else runs/ plus the stem of --train-tsv or --lm-text, else
    runs/ plus the task name."""
    from flax_transformer.training.options import DataOptions

    if args.workdir:
        return Path(args.workdir)
    if args.train_tsv or args.train_jsonl:
        return Path("runs") / Path(args.train_tsv or args.train_jsonl).stem
    if args.lm_text:
        return Path("runs") / Path(args.lm_text).stem
    return Path("runs") / (args.task or DataOptions.task)


def check_validation_file(args) -> None:
    """--valid-tsv / --valid-jsonl: one of them, beside --train-tsv or --train-jsonl (either
    format with either: a TSV corpus may be validated on a JSONL file and the other way round);
    a TSV holds pairs, so not for a --train-jsonl of {"text"} records (an LM)."""
    given = [f for f in ("valid_tsv", "valid_jsonl") if getattr(args, f, None)]
    if not given:
        return
    names = ", ".join("--" + f.replace("_", "-") for f in given)
    if len(given) > 1:
        raise UsageError(f"choose one validation file, got {names}")
    if not (args.train_tsv or args.train_jsonl):
        raise UsageError(f"{names} needs --train-tsv or --train-jsonl")
    if args.valid_tsv and corpus_kind(args) == LM:
        raise UsageError(
            f"--valid-tsv holds translation pairs; --train-jsonl {args.train_jsonl} holds "
            '{"text"} records (a language model): give --valid-jsonl of {"text"} records'
        )


def corpus_kind(args) -> str:
    """The model kind the data trains: LM for --lm-text or a --train-jsonl of {"text"}
    records (its first line decides; a DataError when it cannot be read), else seq2seq."""
    if args.lm_text:
        return LM
    if getattr(args, "train_jsonl", None):
        from flax_transformer.data.corpus import jsonl_kind

        return jsonl_kind(args.train_jsonl)
    return SEQ2SEQ


def preset_name(args) -> str:
    """The model preset the run starts from: --preset, or the default preset when none is given."""
    return args.preset or DEFAULT_PRESET


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


def model_values(args, say=None) -> dict:
    """TransformerConfig fields: the preset, what --config sets (a partial file is filled from
    the preset, not from TransformerConfig's paper-sized defaults), the model flags, --dtype.
    `say(line)`, when given, hears which fields came from where."""
    from flax_transformer.spec.config import TransformerConfig

    values = dict(PRESETS[preset_name(args)])
    if args.config:
        given = config_file_fields(args.config)
        # The tokenizer sets the vocabulary and pad id whatever the file says.
        from_preset = sorted(set(values) - set(given) - {"src_vocab_size", "tgt_vocab_size"})
        if say is not None and from_preset:
            say(
                f"--config {args.config} sets {', '.join(sorted(given)) or 'no field'}; "
                f"{', '.join(from_preset)} come from the {preset_name(args)} preset"
            )
        try:  # the file's own problems named with its path, before the flags change anything
            TransformerConfig.from_dict(values | given)
        except ValueError as err:
            raise ValueError(f"{args.config}: {err}") from None
        values |= given
    if args.init_from:  # the init run's config as it is (check_args refused model flags)
        values = read_config(Path(args.init_from)).to_dict()
    for dest, (fields, _) in MODEL_FLAGS.items():
        if getattr(args, dest) is not None:
            values.update(dict.fromkeys(fields, getattr(args, dest)))
    if getattr(args, "dtype", None):
        values["dtype"], values["param_dtype"] = DTYPES[args.dtype]
    return values


def wants_float64(args) -> bool:
    """The run computes in float64 (--dtype, or a --config / init run that says so): JAX must
    allow 64-bit arrays before the first one is made."""
    if getattr(args, "dtype", None):
        return args.dtype == "float64"
    try:
        return model_values(args).get("dtype") == "float64"
    except (ValueError, OSError):
        return False  # the checks that follow name the problem
