"""The flags of the training command (`ftx train`, `python train.py`): building the parser,
reading flag values back from JSON (--run-config, --resume: run.json's spec, either schema), and
the TrainSpec the flags make (runs/spec.py). The checks and the run itself are in runs/."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from flax_transformer.cli.output import add_json_flag
from flax_transformer.runs.checks import default_workdir
from flax_transformer.runs.run_dir import RUN_JSON, read_run_json
from flax_transformer.runs.spec import (
    DEFAULT_PRESET,
    DISTRIBUTED_FLAGS,
    DTYPES,
    FLAG_RULES,
    MODEL_DEFAULTS,
    MODEL_FLAGS,
    TrainSpec,
    UsageError,
    spec_values,
)
from flax_transformer.spec.presets import PRESETS


def add_option_flags(group, options_class, names, **overrides) -> None:
    """One flag per named field of an options class (training/options.py): its default, help
    and choices come from the field; `overrides` maps a name to argparse keywords to change."""
    from flax_transformer.cli.flags import flag_type
    from flax_transformer.spec.validate import Float, Int
    from flax_transformer.training.options import option_fields, rule_of

    fields = option_fields(options_class)
    for name in names:
        field = fields[name]
        # The field's metadata but its rule: help, choices, type, metavar.
        kwargs = {
            "default": field.default,
            **{k: v for k, v in field.metadata.items() if k != "rule"},
        }
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
    add_json_flag(
        run,
        "the results (results.json) as JSON: alone (or `--json -`) on stdout, the progress "
        "lines on stderr; `--json OUT` also writes them to the file OUT",
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
        saved = default_workdir(spec_from_args(args)) / RUN_JSON
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
    if isinstance(data, dict) and ("schema" in data or isinstance(data.get("args"), dict)):
        try:  # a run.json (schema 2, or 0.2's flags): its recorded settings
            data = spec_values(data)
        except ValueError as err:
            raise UsageError(f"{flag}: {path}: {err}") from None
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


def spec_from_args(args) -> TrainSpec:
    """The run's TrainSpec from the parsed flags (every flag but --json is a field of it)."""
    return TrainSpec(**{k: v for k, v in vars(args).items() if k != "json"})
