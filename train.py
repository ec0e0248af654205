"""Train a Transformer with JAX/Flax: `python train.py` learns the built-in `reverse` task.

  python train.py                                  # reverse random strings, ~2 min on a CPU
  python train.py --task sort --steps 3000
  python train.py --train-tsv train.tsv --valid-tsv valid.tsv --workdir runs/mt
  python train.py --lm-text book.txt               # decoder-only language model
  python train.py --resume                         # continue the run in --workdir

Everything is written into --workdir (default runs/<task or file name>): config.json,
run.json, tokenizer.json, checkpoints/, metrics.jsonl, curves.png, attention.png,
results.json, flax_params.safetensors and torch_model.safetensors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

from flax_transformer.spec.presets import PRESETS

# The default model is the `small` preset (it learns the default task in minutes on 2 CPU
# cores); its vocabulary sizes and pad id are replaced by the tokenizer's.
MODEL_DEFAULTS = PRESETS["small"]
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
    from flax_transformer.training.options import (
        BLEU_TOKENIZERS,
        DataOptions,
        DistributedOptions,
        TrainOptions,
    )

    p = argparse.ArgumentParser(
        prog="python train.py",
        description="Train the Transformer of 'Attention Is All You Need' (JAX/Flax) on a "
        "built-in task, a parallel corpus or a text file, with exact resume.",
    )
    default_task = DataOptions.task
    data = p.add_argument_group(f"data (choose one source; default: --task {default_task})")
    # --task defaults to None so that a second source is an error, not an override.
    task = {"default": None, "help": f"built-in generated task (default: {default_task})"}
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
    add_option_flags(data, DataOptions, ("tokenizer", "bpe_vocab_size", "on_long"))

    model = p.add_argument_group("model (flags override --config)")
    model.add_argument(
        "--config", help="TransformerConfig JSON file (vocab sizes come from the tokenizer)"
    )
    from flax_transformer.cli.flags import flag_type
    from flax_transformer.spec.config import FIELD_RULES

    for dest, (fields, text) in MODEL_FLAGS.items():
        default, flag = MODEL_DEFAULTS[fields[0]], "--" + dest.replace("_", "-")
        model.add_argument(
            flag, type=flag_type(FIELD_RULES[fields[0]], flag), help=f"{text} (default: {default})"
        )

    train = p.add_argument_group("training")
    add_option_flags(
        train,
        TrainOptions,
        ("steps", "batch_size", "grad_accum", "lr", "warmup", "schedule", "label_smoothing")
        + ("clip_norm", "weight_decay", "seed"),
    )

    run = p.add_argument_group("run")
    run.add_argument("--workdir", help="where everything goes (default: runs/<task or file>)")
    corpus_bleu = TrainOptions.bleu_tokenize
    add_option_flags(
        run,
        TrainOptions,
        ("eval_every", "save_every", "keep_checkpoints", "log_every", "bleu_tokenize")
        + ("keep_best", "early_stop", "profile_steps", "mesh", "init_from"),
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
    many = p.add_argument_group("multi-process (python -m flax_transformer.launch starts them)")
    add_option_flags(many, DistributedOptions, DISTRIBUTED_FLAGS)
    return p


# ----------------------------------------------------------------------------- flags
def parse_args(argv):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.run_config:
        parser.set_defaults(**_flag_values(parser, args.run_config, "--run-config"))
        args = parser.parse_args(argv)
    if args.resume:
        saved = default_workdir(args) / "run.json"
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


def read_run_json(path: Path) -> dict | None:
    """A workdir's run.json, or None when it is missing or not a JSON object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


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
    from flax_transformer.training.options import DataOptions

    sources = [s for s in ("task", "train_tsv", "lm_text") if getattr(args, s)]
    if len(sources) > 1:
        names = ", ".join("--" + s.replace("_", "-") for s in sources)
        raise UsageError(f"choose one data source, got {names}")
    if args.valid_tsv and not args.train_tsv:
        raise UsageError("--valid-tsv needs --train-tsv")
    if args.lm_valid and not args.lm_text:
        raise UsageError("--lm-valid needs --lm-text")
    if args.tokenizer == "bpe" and not (args.train_tsv or args.lm_text):
        raise UsageError("--tokenizer bpe needs a corpus (--train-tsv or --lm-text)")
    if args.keep_best == "exact_match" and args.lm_text:
        raise UsageError("--keep-best exact_match needs a translation model, not --lm-text")
    if args.init_from:
        model_flags = [f"--{d.replace('_', '-')}" for d in MODEL_FLAGS if getattr(args, d)]
        if args.config or model_flags:
            given = ", ".join((["--config"] if args.config else []) + model_flags)
            raise UsageError(f"--init-from takes the run's config; do not also give {given}")
        if args.tokenizer != DataOptions.tokenizer:
            raise UsageError("--init-from takes the run's tokenizer; do not also give --tokenizer")
        if not args.resume and not (Path(args.init_from) / "run.json").exists():
            raise UsageError(f"--init-from {args.init_from}: not a run directory (no run.json)")
    else:  # the init run's config is checked when it is loaded
        check_model_flags(args)
    if args.mesh:
        from flax_transformer.training.distributed import check_mesh_spans_processes
        from flax_transformer.training.sharding import MeshError, make_mesh

        try:
            check_mesh_spans_processes(make_mesh(args.mesh))
        except MeshError as err:
            raise UsageError(f"--mesh: {err}") from None


def check_model_flags(args) -> None:
    """The model --config and flags give a valid TransformerConfig (checked before any data is
    read; the vocabulary, which comes from the tokenizer, is a placeholder here)."""
    from flax_transformer.spec.config import TransformerConfig
    from flax_transformer.training.tokenizer import ByteTokenizer

    try:
        values = model_values(args)
    except ValueError as err:
        raise UsageError(f"--config: {err}") from None
    try:
        TransformerConfig.from_dict(
            values | dict.fromkeys(("src_vocab_size", "tgt_vocab_size"), ByteTokenizer.vocab_size)
        )
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
    return TrainOptions.bleu_tokenize if args.train_tsv else "char"


def default_workdir(args) -> Path:
    from flax_transformer.training.options import DataOptions

    if args.workdir:
        return Path(args.workdir)
    if args.train_tsv:
        return Path("runs") / Path(args.train_tsv).stem
    if args.lm_text:
        return Path("runs") / Path(args.lm_text).stem
    return Path("runs") / (args.task or DataOptions.task)


def prepare_workdir(workdir: Path, resume: bool) -> None:
    """Writable, and never a second run on top of an existing one. Creates nothing: the
    workdir is made once all input has been read (make_workdir)."""
    existing = workdir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        problem = "Not a directory" if existing.exists() and not existing.is_dir() else "no access"
        raise UsageError(f"--workdir {workdir}: not writable ({problem}: {existing})")
    checkpoints = workdir / "checkpoints"
    has_checkpoints = checkpoints.is_dir() and any(checkpoints.iterdir())
    run_json = workdir / "run.json"
    has_run = has_checkpoints or (run_json.exists() and read_run_json(run_json) is not None)
    if run_json.exists() and not has_run and not resume:
        print(
            f"warning: {run_json} is not readable JSON and there is no checkpoint: a run that "
            "never started; this run replaces it",
            file=sys.stderr,
        )
    if has_run and not resume:
        raise UsageError(
            f"--workdir {workdir} already holds a run; pass --resume to continue it, or choose "
            "another --workdir (nothing was overwritten)"
        )
    has_checkpoint = checkpoints.exists() and any(p.name.isdigit() for p in checkpoints.iterdir())
    if resume and not has_checkpoint:
        raise UsageError(
            f"--resume: no checkpoint in {checkpoints} (if the run stopped before its first "
            f"save, delete {workdir} to start over)"
        )


# ----------------------------------------------------------------------------- data
def make_workdir(workdir: Path) -> None:
    """Create the workdir (all input is read and checked by now) and probe that it takes files."""
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        probe = workdir / f".write_test_{os.getpid()}"  # one per process of a run
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise UsageError(
            f"--workdir {workdir}: not writable ({err.strerror or err}: {err.filename or workdir})"
        ) from None


def load_pairs(args, data):
    """(model kind, train pairs, valid pairs) from the chosen source; `data`: DataOptions."""
    from flax_transformer.spec.kinds import LM, SEQ2SEQ
    from flax_transformer.training.data import generate_task, held_out, read_text_lines, read_tsv

    if args.train_tsv:
        train = read_tsv(args.train_tsv)
        valid = read_tsv(args.valid_tsv) if args.valid_tsv else None
        kind = SEQ2SEQ
    elif args.lm_text:
        train = read_text_lines(args.lm_text)
        valid = read_text_lines(args.lm_valid) if args.lm_valid else None
        kind = LM
    else:
        lengths = (data.task_min_len, data.task_max_len)
        train = generate_task(data.task, data.task_train_size, args.seed, *lengths)
        # A different seed, and nothing seen in training: a true held-out set.
        valid = held_out(
            generate_task(data.task, data.task_valid_size, args.seed + 1_000_003, *lengths), train
        )
        return SEQ2SEQ, train, valid
    if valid is None:
        train, valid = split_off_validation(train, args.seed)
    return kind, train, valid


def split_off_validation(pairs, seed, fraction=0.05):
    import numpy as np

    if len(pairs) < 2:
        raise UsageError(
            "need at least 2 training examples to hold some out for validation; "
            "pass a validation file"
        )
    order = np.random.default_rng(seed).permutation(len(pairs))
    count = max(1, int(len(pairs) * fraction))
    chosen = set(order[:count].tolist())
    train = [p for i, p in enumerate(pairs) if i not in chosen]
    valid = [p for i, p in enumerate(pairs) if i in chosen]
    print(f"held out {len(valid)} of {len(pairs)} examples for validation")
    return train, valid


def make_tokenizer(args, data, workdir: Path, train_pairs):
    from flax_transformer.training.distributed import is_primary
    from flax_transformer.training.tokenizer import BPETokenizer, ByteTokenizer, load_tokenizer

    if args.resume or not is_primary():
        return load_tokenizer(workdir / "tokenizer.json")
    if args.init_from:  # the init run's tokenizer, whatever its kind
        return load_tokenizer(Path(args.init_from) / "tokenizer.json")
    if data.tokenizer == "bpe":
        texts = (t for p in train_pairs for t in (p.source, p.target) if t)
        return BPETokenizer.train(texts, vocab_size=data.bpe_vocab_size)
    return ByteTokenizer()


def model_values(args) -> dict:
    """TransformerConfig fields from --config (or the defaults) and the model flags."""
    from flax_transformer.spec.config import TransformerConfig

    values = dict(MODEL_DEFAULTS)
    if args.config:
        values = TransformerConfig.load(args.config).to_dict()
    if args.init_from:  # the init run's config as it is (check_args refused model flags)
        values = TransformerConfig.load(Path(args.init_from) / "config.json").to_dict()
    for dest, (fields, _) in MODEL_FLAGS.items():
        if getattr(args, dest) is not None:
            values.update(dict.fromkeys(fields, getattr(args, dest)))
    return values


def make_config(args, tokenizer, workdir: Path):
    from flax_transformer.spec.config import TransformerConfig, config_diff

    values = model_values(args)
    if not args.init_from:
        values.update(
            src_vocab_size=tokenizer.vocab_size,
            tgt_vocab_size=tokenizer.vocab_size,
            pad_id=tokenizer.pad_id,
        )
    config = TransformerConfig.from_dict(values)
    if args.resume:
        diff = config_diff(TransformerConfig.load(workdir / "config.json"), config)
        if diff:
            described = ", ".join(
                f"{field}: {saved!r} in the checkpoint, {requested!r} requested"
                for field, (saved, requested) in diff.items()
            )
            raise UsageError(
                f"--resume: the model config differs from {workdir / 'config.json'} "
                f"({described}); resume with the run's own settings or start a new --workdir"
            )
    return config


# ----------------------------------------------------------------------------- main
def main(argv=None, hooks=()) -> int:
    """The command line; `hooks` are step hooks for the run (flax_transformer.training.hooks:
    called after every step and evaluation, they may stop the run early)."""
    from flax_transformer.training import distributed
    from flax_transformer.training.options import DataOptions, DistributedOptions, TrainOptions

    started = time.perf_counter()
    try:
        try:
            args = parse_args(argv)
        except SystemExit as exit:  # argparse printed its error (or --help)
            if exit.code == 0:
                raise
            return 2
        join_processes(options_from_args(DistributedOptions, args), args)
        check_args(args)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            data = options_from_args(DataOptions, args, task=args.task or DataOptions.task)
            options = options_from_args(TrainOptions, args, bleu_tokenize=bleu_tokenizer(args))
        for warning in caught:  # e.g. --warmup longer than --steps
            print(f"warning: {warning.message}", file=sys.stderr)
        return run(args, data, options, hooks, started)
    except UsageError as err:
        print(f"error: {distributed.describe_failure(err)}", file=sys.stderr)
        distributed.exit_now(2)  # a multi-process run: no waiting for the others
        return 2
    except (ValueError, OSError, RuntimeError) as err:
        print(f"error: {distributed.describe_failure(err)}", file=sys.stderr)
        distributed.exit_now(1)
        return 1


def join_processes(options, args) -> None:
    """Joins a multi-process run (flags or a detected cluster job) before any other JAX call;
    such a run needs --mesh, over which the batch is split."""
    from flax_transformer.training.distributed import DistributedError, start, whoami

    try:
        if start(options) and not args.mesh:
            raise UsageError(
                f"this is {whoami()}: multi-process training needs --mesh spanning every "
                "process's devices (e.g. --mesh data=N for N devices in all)"
            )
    except DistributedError as err:
        raise UsageError(str(err)) from None


def run(args, data, options, hooks, started: float) -> int:
    from flax_transformer.files.atomic_io import atomic_write_text
    from flax_transformer.spec.kinds import LM
    from flax_transformer.training.data import check_dataset_ids, encode_documents, encode_pairs
    from flax_transformer.training.distributed import barrier, is_primary
    from flax_transformer.training.loop import Job, run_training

    workdir = default_workdir(args)
    prepare_workdir(workdir, args.resume)
    barrier("workdir checked")  # by every process, before process 0 writes into it
    # Read and check all input before writing anything into the workdir.
    kind, train_pairs, valid_pairs = load_pairs(args, data)
    # The init run's run.json, read once: its model kind and the files it carries.
    init_run = (read_run_json(Path(args.init_from) / "run.json") or {}) if args.init_from else {}
    if args.init_from and not args.resume:
        init_kind = init_run.get("model")
        init_kind = {"transformer": "seq2seq"}.get(init_kind, init_kind)  # the kind's old name
        if init_kind not in (None, kind):
            raise UsageError(
                f"--init-from {args.init_from} holds a {init_kind} model; the data "
                f"given trains a {kind} model"
            )
    if not (args.resume or is_primary()):
        barrier("run files written")  # the other processes use process 0's tokenizer
    tokenizer = make_tokenizer(args, data, workdir, train_pairs)
    config = make_config(args, tokenizer, workdir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if kind == LM:
            train_set = encode_documents(train_pairs, tokenizer, config.max_len)
            valid_set = encode_documents(valid_pairs, tokenizer, config.max_len)
        else:
            train_set = encode_pairs(train_pairs, tokenizer, config.max_len, data.on_long)
            valid_set = encode_pairs(valid_pairs, tokenizer, config.max_len, data.on_long)
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    for dataset in (train_set, valid_set):
        check_dataset_ids(dataset, min(config.src_vocab_size, config.tgt_vocab_size))
    make_workdir(workdir)  # the first write: every input has been read and checked
    carried = []
    if is_primary() and (not args.resume or read_run_json(workdir / "run.json") is None):
        if not args.resume:
            config.save(workdir / "config.json")
            tokenizer.save(workdir / "tokenizer.json")
            if args.init_from:
                from flax_transformer.training.run import carry_files

                carried = carry_files(args.init_from, init_run.get("carry", []), workdir)
        run_info = {
            "model": kind,
            "tokenizer": tokenizer.kind,
            "args": {
                k: v
                for k, v in vars(args).items()
                if k not in ("resume", "run_config", *DISTRIBUTED_FLAGS)
            },
            "train_examples": len(train_set),
            "valid_examples": len(valid_set),
            **({"carry": carried} if carried else {}),
        }
        atomic_write_text(workdir / "run.json", json.dumps(run_info, indent=2) + "\n")
    if not args.resume and is_primary():
        barrier("run files written")  # the others wait for it before reading the tokenizer
    print(
        f"{kind} model: d_model {config.d_model}, {config.num_encoder_layers}+"
        f"{config.num_decoder_layers} layers, {len(train_set)} training / {len(valid_set)} "
        f"validation examples, {tokenizer.kind} tokenizer (vocab {tokenizer.vocab_size}), "
        f"workdir {workdir}"
    )
    job = Job(workdir, config, kind, tokenizer, train_set, valid_set, options, args.resume)
    results = run_training(job, hooks)
    if not is_primary():
        return 0  # process 0 writes the results
    results["wall_time_s"] = time.perf_counter() - started
    atomic_write_text(
        workdir / "results.json", json.dumps(results, indent=2, ensure_ascii=False) + "\n"
    )
    print_summary(results, workdir)
    return 0


def print_summary(results: dict, workdir: Path) -> None:
    early = ""
    if results.get("stop_reason") == "early_stop":
        best = results["best"]
        early = (
            f" (stopped early: {best['metric']} has not improved for "
            f"{best['evals_since_best']} evaluations; best {best['best']:.4f} at step "
            f"{best['best_step']}, in checkpoints_best/)"
        )
    elif results.get("stopped_early"):
        early = " (stopped early by a step hook)"
    print(
        f"\ntrained {results['steps']} steps{early} in {results['wall_time_s']:.0f} s "
        f"({results['tokens_per_sec']:.0f} target tokens/s)"
    )
    line = f"valid loss {results['valid_loss']:.4f}, token accuracy {results['token_accuracy']:.4f}"
    if "exact_match" in results:
        line += f", exact match {results['exact_match']:.4f}, BLEU {results['bleu']:.2f}"
    if "perplexity" in results:
        line += f", perplexity {results['perplexity']:.2f}"
    print(line)
    for example in results.get("examples", []):
        mark = "ok " if example["hypothesis"] == example["reference"] else "BAD"
        print(
            f"  [{mark}] {example['source']!r} -> {example['hypothesis']!r} "
            f"(reference {example['reference']!r})"
        )
    for name, path in results.get("pictures", {}).items():
        print(f"{name}: {path}")
    print(
        f"results: {workdir / 'results.json'}; weights: {results['weights']['torch']} (torch), "
        f"{results['weights']['flax']} (flax)"
    )


if __name__ == "__main__":
    sys.exit(main())
