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
import sys
import time
import warnings
from pathlib import Path

# Defaults of the model; chosen so the default run learns `reverse` in minutes on 2 CPU cores.
MODEL_DEFAULTS = {
    "d_model": 64,
    "num_heads": 4,
    "num_encoder_layers": 2,
    "num_decoder_layers": 2,
    "d_ff": 256,
    "max_len": 64,
    "dropout_rate": 0.0,
}
BLEU_TOKENIZERS = ("auto", "13a", "char", "zh", "intl", "none")


class UsageError(ValueError):
    """Bad flags or workdir; the message names the flag."""


def build_parser() -> argparse.ArgumentParser:
    from flax_transformer.training.data import LONG_POLICIES, TASKS
    from flax_transformer.training.optim import SCHEDULES

    p = argparse.ArgumentParser(
        prog="python train.py",
        description="Train the Transformer of 'Attention Is All You Need' (JAX/Flax) on a "
        "built-in task, a parallel corpus or a text file, with exact resume.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    data = p.add_argument_group("data (choose one source; default: --task reverse)")
    data.add_argument("--task", choices=TASKS, help="built-in generated task (default: reverse)")
    data.add_argument("--task-min-len", type=int, default=1, help="shortest task string")
    data.add_argument("--task-max-len", type=int, default=16, help="longest task string")
    data.add_argument("--task-train-size", type=int, default=100000, help="training strings")
    data.add_argument("--task-valid-size", type=int, default=500, help="held-out strings")
    data.add_argument("--train-tsv", help="training corpus: one 'source<TAB>target' per line")
    data.add_argument(
        "--valid-tsv", help="validation corpus (default: hold out a slice of --train-tsv)"
    )
    data.add_argument("--lm-text", help="text file for a decoder-only LM, one document a line")
    data.add_argument("--lm-valid", help="validation text (default: hold out some lines)")
    data.add_argument(
        "--tokenizer",
        choices=("byte", "bpe"),
        default="byte",
        help="byte: UTF-8 bytes, any language; bpe: subword BPE trained on the training text",
    )
    data.add_argument("--bpe-vocab-size", type=int, default=4000, help="BPE vocabulary size")
    data.add_argument(
        "--on-long",
        choices=LONG_POLICIES,
        default="skip",
        help="a pair longer than --max-len is skipped (with a warning), truncated, or an error",
    )

    model = p.add_argument_group("model (flags override --config)")
    model.add_argument(
        "--config", help="TransformerConfig JSON file (vocab sizes come from the tokenizer)"
    )
    model.add_argument("--d-model", type=int, help=f"width (default {MODEL_DEFAULTS['d_model']})")
    model.add_argument("--num-heads", type=int, help="attention heads (default 4)")
    model.add_argument("--num-layers", type=int, help="encoder and decoder layers (default 2)")
    model.add_argument("--d-ff", type=int, help="feed-forward width (default 256)")
    model.add_argument("--max-len", type=int, help="longest sequence in tokens (default 64)")
    model.add_argument("--dropout", type=float, help="dropout rate (default 0.0)")

    train = p.add_argument_group("training")
    train.add_argument("--steps", type=int, default=1500, help="optimizer steps in total")
    train.add_argument("--batch-size", type=int, default=64, help="sequences per batch")
    train.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    train.add_argument("--warmup", type=int, default=150, help="linear warmup steps")
    train.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default="cosine",
        help="after warmup: the paper's 1/sqrt(step) or cosine to 0",
    )
    train.add_argument("--label-smoothing", type=float, default=0.1, help="label smoothing eps")
    train.add_argument(
        "--clip-norm", type=float, default=1.0, help="global gradient norm clip (0 = off)"
    )
    train.add_argument("--weight-decay", type=float, default=0.01, help="AdamW decay on matrices")
    train.add_argument("--seed", type=int, default=0, help="seeds init, dropout and shuffling")

    run = p.add_argument_group("run")
    run.add_argument("--workdir", help="where everything goes (default runs/<task or file>)")
    run.add_argument("--eval-every", type=int, default=500, help="validation loss every N steps")
    run.add_argument("--save-every", type=int, default=500, help="checkpoint every N steps")
    run.add_argument("--keep-checkpoints", type=int, default=3, help="checkpoints kept")
    run.add_argument("--log-every", type=int, default=25, help="metrics.jsonl line every N steps")
    run.add_argument(
        "--bleu-tokenize",
        choices=BLEU_TOKENIZERS,
        default="auto",
        help="sacrebleu tokenizer; auto: char for tasks, 13a for corpora",
    )
    run.add_argument(
        "--mesh",
        help="shard training over devices, e.g. data=2,model=4 (batch over data, heads and FFN "
        "units over model); on CPU set JAX_NUM_CPU_DEVICES=N first to get N devices",
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
    known = {a.dest for a in parser._actions}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UsageError(f"{flag}: {path} has unknown flag(s): {', '.join(unknown)}")
    return data


def check_args(args) -> None:
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
    positive = (
        "steps",
        "batch_size",
        "eval_every",
        "save_every",
        "keep_checkpoints",
        "log_every",
        "warmup",
        "task_train_size",
        "task_valid_size",
        "bpe_vocab_size",
    )
    for name in positive:
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if not args.lr > 0:
        raise UsageError(f"--lr must be > 0, got {args.lr}")
    if args.mesh:
        from flax_transformer.training.sharding import MeshError, make_mesh

        try:
            make_mesh(args.mesh)
        except MeshError as err:
            raise UsageError(f"--mesh: {err}") from None
    if not 0 <= args.label_smoothing < 1:
        raise UsageError(f"--label-smoothing must be in [0, 1), got {args.label_smoothing}")
    for name in ("clip_norm", "weight_decay"):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")


def default_workdir(args) -> Path:
    if args.workdir:
        return Path(args.workdir)
    if args.train_tsv:
        return Path("runs") / Path(args.train_tsv).stem
    if args.lm_text:
        return Path("runs") / Path(args.lm_text).stem
    return Path("runs") / (args.task or "reverse")


def prepare_workdir(workdir: Path, resume: bool) -> None:
    """Writable, and never a second run on top of an existing one."""
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        probe = workdir / ".write_test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise UsageError(
            f"--workdir {workdir}: not writable ({err.strerror or err}: {err.filename or workdir})"
        ) from None
    checkpoints = workdir / "checkpoints"
    has_run = (workdir / "run.json").exists() or (
        checkpoints.exists() and any(checkpoints.iterdir())
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
def load_pairs(args):
    """(kind, train pairs, valid pairs) from the chosen source."""
    from flax_transformer.training.data import generate_task, held_out, read_text_lines, read_tsv

    if args.train_tsv:
        train = read_tsv(args.train_tsv)
        valid = read_tsv(args.valid_tsv) if args.valid_tsv else None
        kind = "transformer"
    elif args.lm_text:
        train = read_text_lines(args.lm_text)
        valid = read_text_lines(args.lm_valid) if args.lm_valid else None
        kind = "lm"
    else:
        task = args.task or "reverse"
        lengths = (args.task_min_len, args.task_max_len)
        train = generate_task(task, args.task_train_size, args.seed, *lengths)
        # A different seed, and nothing seen in training: a true held-out set.
        valid = held_out(
            generate_task(task, args.task_valid_size, args.seed + 1_000_003, *lengths), train
        )
        return "transformer", train, valid
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


def make_tokenizer(args, workdir: Path, train_pairs):
    from flax_transformer.training.tokenizer import BPETokenizer, ByteTokenizer, load_tokenizer

    if args.resume:
        return load_tokenizer(workdir / "tokenizer.json")
    if args.tokenizer == "bpe":
        texts = (t for p in train_pairs for t in (p.source, p.target) if t)
        return BPETokenizer.train(texts, vocab_size=args.bpe_vocab_size)
    return ByteTokenizer()


def make_config(args, tokenizer, workdir: Path):
    from flax_transformer.spec.config import TransformerConfig

    values = dict(MODEL_DEFAULTS)
    if args.config:
        values = TransformerConfig.load(args.config).to_dict()
    flags = {
        "d_model": args.d_model,
        "num_heads": args.num_heads,
        "num_encoder_layers": args.num_layers,
        "num_decoder_layers": args.num_layers,
        "d_ff": args.d_ff,
        "max_len": args.max_len,
        "dropout_rate": args.dropout,
    }
    values.update({k: v for k, v in flags.items() if v is not None})
    values.update(
        src_vocab_size=tokenizer.vocab_size,
        tgt_vocab_size=tokenizer.vocab_size,
        pad_id=tokenizer.pad_id,
    )
    config = TransformerConfig.from_dict(values)
    if args.resume:
        saved = TransformerConfig.load(workdir / "config.json")
        if saved != config:
            diff = ", ".join(
                f"{k}: {getattr(saved, k)!r} in the checkpoint, {v!r} requested"
                for k, v in config.to_dict().items()
                if getattr(saved, k) != v
            )
            raise UsageError(
                f"--resume: the model config differs from {workdir / 'config.json'} ({diff}); "
                "resume with the run's own settings or start a new --workdir"
            )
    return config


# ----------------------------------------------------------------------------- main
def main(argv=None) -> int:
    started = time.perf_counter()
    try:
        args = parse_args(argv)
        check_args(args)
        return run(args, started)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (ValueError, OSError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def run(args, started: float) -> int:
    from flax_transformer.training.data import encode_documents, encode_pairs
    from flax_transformer.training.loop import Job, TrainOptions, run_training

    workdir = default_workdir(args)
    prepare_workdir(workdir, args.resume)
    # Read and check all input before writing anything into the workdir.
    kind, train_pairs, valid_pairs = load_pairs(args)
    tokenizer = make_tokenizer(args, workdir, train_pairs)
    config = make_config(args, tokenizer, workdir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if kind == "lm":
            train_set = encode_documents(train_pairs, tokenizer, config.max_len)
            valid_set = encode_documents(valid_pairs, tokenizer, config.max_len)
        else:
            train_set = encode_pairs(train_pairs, tokenizer, config.max_len, args.on_long)
            valid_set = encode_pairs(valid_pairs, tokenizer, config.max_len, args.on_long)
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    bleu = args.bleu_tokenize
    if bleu == "auto":
        bleu = "13a" if args.train_tsv else "char"
    options = TrainOptions(
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup=args.warmup,
        schedule=args.schedule,
        label_smoothing=args.label_smoothing,
        clip_norm=args.clip_norm,
        weight_decay=args.weight_decay,
        seed=args.seed,
        eval_every=args.eval_every,
        save_every=args.save_every,
        keep_checkpoints=args.keep_checkpoints,
        log_every=args.log_every,
        bleu_tokenize=bleu,
        mesh=args.mesh,
    )
    if not args.resume:
        config.save(workdir / "config.json")
        tokenizer.save(workdir / "tokenizer.json")
        run_info = {
            "model": kind,
            "tokenizer": tokenizer.kind,
            "args": {k: v for k, v in vars(args).items() if k not in ("resume", "run_config")},
            "train_examples": len(train_set),
            "valid_examples": len(valid_set),
        }
        (workdir / "run.json").write_text(json.dumps(run_info, indent=2) + "\n")
    print(
        f"{kind} model: d_model {config.d_model}, {config.num_encoder_layers}+"
        f"{config.num_decoder_layers} layers, {len(train_set)} training / {len(valid_set)} "
        f"validation examples, {tokenizer.kind} tokenizer (vocab {tokenizer.vocab_size}), "
        f"workdir {workdir}"
    )
    job = Job(workdir, config, kind, tokenizer, train_set, valid_set, options, args.resume)
    results = run_training(job)
    results["wall_time_s"] = time.perf_counter() - started
    (workdir / "results.json").write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    print_summary(results, workdir)
    return 0


def print_summary(results: dict, workdir: Path) -> None:
    print(
        f"\ntrained {results['steps']} steps in {results['wall_time_s']:.0f} s "
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
