"""Train a Transformer with JAX/Flax: `python train.py` learns the built-in `reverse` task.

  python train.py                                  # reverse random strings, ~2 min on a CPU
  python train.py --task sort --steps 3000
  python train.py --train-tsv train.tsv --valid-tsv valid.tsv --workdir runs/mt
  python train.py --lm-text book.txt               # decoder-only language model
  python train.py --resume                         # continue the run in --workdir

Everything is written into --workdir (default runs/<task or file name>); its files are
listed in training/run_dir.py (and docs/training.md, "Run directory"). The flags are built in
cli/train_flags.py; `main(argv, hooks=[...])` is the Python entry (`train.main` of the root
train.py, `ftx train`, `python -m flax_transformer.train`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from pathlib import Path

from flax_transformer.cli.process import exit_process
from flax_transformer.cli.train_flags import (  # noqa: F401  (train.X names of the old train.py)
    DEFAULT_PRESET,
    DISTRIBUTED_FLAGS,
    DTYPES,
    MODEL_DEFAULTS,
    MODEL_FLAGS,
    UsageError,
    add_option_flags,
    bleu_tokenizer,
    build_parser,
    check_args,
    check_model_flags,
    default_workdir,
    model_values,
    options_from_args,
    parse_args,
    wants_float64,
)
from flax_transformer.cli.train_resume import changed_settings
from flax_transformer.data import pipeline as data_checks
from flax_transformer.files.space import is_out_of_space, out_of_space_message
from flax_transformer.training import run_dir
from flax_transformer.training.interrupts import exit_status, sigterm_raises
from flax_transformer.training.run_dir import read_run_json


def prepare_workdir(workdir: Path, resume: bool) -> bool:
    """Writable, and never a second run on top of an existing one. Creates nothing: the
    workdir is made once all input has been read (make_workdir). True when a --resume finds
    no checkpoint (the run stopped before its first save): it starts over from step 0 with
    its saved settings, which is what resuming it means."""
    existing = workdir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        problem = "Not a directory" if existing.exists() and not existing.is_dir() else "no access"
        raise UsageError(f"--workdir {workdir}: not writable ({problem}: {existing})")
    checkpoints = workdir / run_dir.CHECKPOINTS
    run_json = workdir / run_dir.RUN_JSON
    holds_run = workdir.is_dir() and has_run(workdir)
    if run_json.exists() and not holds_run and not resume:
        print(
            f"warning: {run_json} is not readable JSON and there is no checkpoint: a run that "
            "never started; this run replaces it",
            file=sys.stderr,
        )
    if holds_run and not resume:
        raise UsageError(
            f"--workdir {workdir} already holds a run; pass --resume to continue it, or choose "
            "another --workdir (nothing was overwritten)"
        )
    has_checkpoint = checkpoints.exists() and any(p.name.isdigit() for p in checkpoints.iterdir())
    if resume and not has_checkpoint:
        print(
            f"--resume: no checkpoint in {checkpoints} (the run stopped before its first "
            "save): starting it over from step 0 with its settings"
        )
        return True
    return False


def has_run(workdir: Path) -> bool:
    """The workdir holds a run: a checkpoint or a readable run.json."""
    checkpoints = workdir / run_dir.CHECKPOINTS
    has_checkpoints = checkpoints.is_dir() and any(checkpoints.iterdir())
    return has_checkpoints or read_run_json(workdir) is not None


class WorkdirLock:
    """The run directory's lock (run_dir.lock_run_dir), taken by process 0 at its first write
    (make_workdir) and held until the command ends; the other processes of a multi-process run
    (`wanted` False) take none."""

    def __init__(self, workdir: Path, wanted: bool):
        self.workdir, self.wanted, self._held = workdir, wanted, None

    def take(self) -> bool:
        """Lock the workdir if it exists and is not locked yet; True if this call locked it.
        run_dir.RunDirInUse (exit status 2) when another run holds it."""
        if not self.wanted or self._held is not None or not self.workdir.is_dir():
            return False
        self._held = run_dir.lock_run_dir(self.workdir)
        return True

    def release(self) -> None:
        """Unlock (the end of the command); nothing if this process holds no lock."""
        if self._held is not None:
            self._held.release()
            self._held = None


# ----------------------------------------------------------------------------- data
def make_workdir(workdir: Path, lock: WorkdirLock | None = None) -> bool:
    """Create the workdir (all input is read and checked by now), lock it (`lock`) and probe
    that it takes files; True if the lock was taken now (the directory was new)."""
    locked_now = False
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        locked_now = lock.take() if lock is not None else False
        probe = workdir / f".write_test_{os.getpid()}"  # one per process of a run
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise UsageError(
            f"--workdir {workdir}: not writable ({err.strerror or err}: {err.filename or workdir})"
        ) from None
    return locked_now


def load_pairs(args, data):
    """(model kind, train pairs, valid pairs) of a built-in task (`data`: DataOptions); the
    corpus files go through cli/train_data.py's CorpusInput and the token cache."""
    from flax_transformer.data.pipeline import generate_task, held_out
    from flax_transformer.spec.kinds import SEQ2SEQ

    lengths = (data.task_min_len, data.task_max_len)
    train = generate_task(data.task, data.task_train_size, args.seed, *lengths)
    # A different seed, and nothing seen in training: a true held-out set.
    valid = held_out(
        generate_task(data.task, data.task_valid_size, args.seed + 1_000_003, *lengths), train
    )
    return SEQ2SEQ, train, valid


def split_off_validation(pairs, seed, fraction=0.05):
    """Hold out a seeded random `fraction` of `pairs` (at least one) for validation; return (train,
    valid). UsageError if there are fewer than 2 pairs."""
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


def make_tokenizer(args, data, workdir: Path, texts):
    """The run's tokenizer: the workdir's on --resume (and on processes other than 0), the
    --init-from run's, a BPE trained on `texts()` (a bounded sample of the corpus), or bytes."""
    from flax_transformer.data.tokenizer import BPETokenizer, ByteTokenizer
    from flax_transformer.training.distributed import is_primary

    if args.resume or not is_primary():
        return run_dir.read_tokenizer(workdir)
    if args.init_from:  # the init run's tokenizer, whatever its kind
        return run_dir.read_tokenizer(Path(args.init_from))
    if data.tokenizer == "bpe":
        return BPETokenizer.train(texts(), vocab_size=data.bpe_vocab_size)
    return ByteTokenizer()


def make_config(args, tokenizer, workdir: Path, changes=None):
    """The model config from the preset, --config and flags, with the tokenizer's vocabulary sizes
    unless --init-from, and `changes` (a classifier's head fields) over it; UsageError on
    --resume if it differs from the run's saved config.json."""
    from flax_transformer.spec.config import config_diff

    # The line about a partial --config is said when the run starts, not again on --resume.
    values = model_values(args, say=None if args.resume else print) | dict(changes or {})
    if not args.init_from:
        values.update(
            src_vocab_size=tokenizer.vocab_size,
            tgt_vocab_size=tokenizer.vocab_size,
            pad_id=tokenizer.pad_id,
        )
    from flax_transformer.spec.config import TransformerConfig

    config = TransformerConfig.from_dict(values)
    if args.resume:
        diff = config_diff(run_dir.read_config(workdir), config)
        if diff:
            described = ", ".join(
                f"{field}: {saved!r} in the checkpoint, {requested!r} requested"
                for field, (saved, requested) in diff.items()
            )
            raise UsageError(
                f"--resume: the model config differs from {workdir / run_dir.CONFIG} "
                f"({described}); resume with the run's own settings or start a new --workdir"
            )
    return config


# ----------------------------------------------------------------------------- main
# An input path that is not there (or not a file): bad input like any other, exit status 2.
MISSING_INPUT = (FileNotFoundError, NotADirectoryError, IsADirectoryError)


def main(argv=None, hooks=None) -> int:
    """The command line; `hooks` are step hooks for the run (flax_transformer.training.hooks:
    called after every step and evaluation, they may stop the run early). Returns the exit
    status: 0 done, 1 the run failed, 2 bad flags or input, 130 Ctrl-C, 143 SIGTERM (the run
    stops at a step; --resume continues from its last checkpoint)."""
    hooks = tuple(hooks or ())
    started = time.perf_counter()
    with sigterm_raises():  # SIGTERM, like Ctrl-C, ends the run through its cleanup
        return _main(argv, hooks, started)


def _main(argv, hooks, started: float) -> int:
    from flax_transformer.training import distributed
    from flax_transformer.training.options import (
        DataOptions,
        DistributedOptions,
        TrainOptions,
        WarmupWarning,
    )

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
        for warning in caught:
            # --warmup longer than --steps: said when the user chose the warmup, once (not on
            # every short run with the default warmup, nor again on --resume).
            if issubclass(warning.category, WarmupWarning) and not warmup_chosen(argv, args):
                continue
            print(f"warning: {warning.message}", file=sys.stderr)
        with float64_if(wants_float64(args)):
            return run(args, data, options, hooks, started)
    except (ValueError, *MISSING_INPUT) as err:
        # Bad input: flags, data files, configs, a run directory (the project raises a
        # ValueError subclass for each, naming the file and line).
        print(f"error: {distributed.describe_failure(err)}", file=sys.stderr)
        distributed.exit_now(2)  # a multi-process run: no waiting for the others
        return 2
    except (OSError, RuntimeError) as err:
        # The run failed: it diverged, a checkpoint could not be written, the disk filled up.
        if isinstance(err, OSError) and is_out_of_space(err):  # outside the loop (the loop's
            # own TrainingError already says which checkpoint is kept)
            err = OSError(out_of_space_message(err))
        print(f"error: {distributed.describe_failure(err)}", file=sys.stderr)
        distributed.exit_now(1)
        return 1
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (interrupts.Terminated)
        # The loop's TrainingInterrupted says the step and the last checkpoint; earlier, there
        # is no training to speak of.
        message = str(err) or before_training(locals().get("args"))
        print(message, file=sys.stderr)
        distributed.exit_now(exit_status(err))
        return exit_status(err)


def before_training(args) -> str:
    """What Ctrl-C / SIGTERM before the first step leaves: nothing, or a run directory (its
    files were written) that --resume starts over."""
    workdir = default_workdir(args) if args is not None else None
    if workdir is not None and (workdir / run_dir.RUN_JSON).exists():
        return (
            f"interrupted before training started; --resume --workdir {workdir} continues it "
            "(from step 0 if it saved no checkpoint)"
        )
    return "interrupted before training started"


def check_token_budget(options, config) -> None:
    """--batch-tokens must hold a batch of the longest bucket (--max-len), in rows that split
    into the micro-batches and data-parallel devices: a BatchTokensError (exit 2) before
    anything is written."""
    if options.batch_tokens is None:
        return
    from flax_transformer.data.pipeline import bucket_boundaries
    from flax_transformer.data.token_batches import (
        available_memory,
        batch_shapes,
        check_budget_fits,
    )
    from flax_transformer.training.sharding import parse_mesh

    data = parse_mesh(options.mesh).get("data", 1) if options.mesh else 1
    shapes = batch_shapes(
        options.batch_tokens, bucket_boundaries(config.max_len), options.grad_accum * data
    )
    # A micro-batch (--grad-accum) is what one step holds at a time.
    micro = [(rows // options.grad_accum, length) for rows, length in shapes]
    check_budget_fits(options.batch_tokens, micro, config.tgt_vocab_size, available_memory())
    print(
        f"--batch-tokens {options.batch_tokens}: {len(shapes)} batch shapes (rows x length) "
        + ", ".join(f"{rows}x{length}" for rows, length in shapes)
    )


def warmup_chosen(argv, args) -> bool:
    """--warmup given on this command line (or in --run-config) of a run that starts now."""
    from flax_transformer.training.options import TrainOptions

    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    on_line = any(a == "--warmup" or a.startswith("--warmup=") for a in argv)
    from_file = bool(args.run_config) and args.warmup != TrainOptions.warmup
    return not args.resume and (on_line or from_file)


@contextlib.contextmanager
def float64_if(wanted: bool):
    """jax_enable_x64 on for a float64 run (before its first array), back as it was after, so
    that `main` called in a process that goes on (tests, notebooks) leaves JAX as it found it."""
    if not wanted:
        yield
        return
    import jax

    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", before)


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
    """Train one run from parsed flags: read and check the data, write the run files into the
    workdir, train, write results.json and print the summary; return the exit status (0). UsageError
    for data that does not fit the flags or the --init-from run, or a workdir in use by another
    run (process 0 holds the workdir's lock from its first write to the end)."""
    from flax_transformer.training.distributed import is_primary

    workdir = default_workdir(args)
    lock = WorkdirLock(workdir, wanted=is_primary())
    try:
        return _train(args, data, options, hooks, started, workdir, lock)
    finally:
        lock.release()


def _train(args, data, options, hooks, started: float, workdir: Path, lock: WorkdirLock) -> int:
    from flax_transformer.cli.train_data import corpus_source

    source = corpus_source(args)
    corpus = None
    if args.task == "classify":  # --train-tsv of labelled texts (cli/train_classify.py)
        from flax_transformer.cli.train_classify import ClassifyInput

        corpus = ClassifyInput(args, workdir)
    elif source is not None:
        from flax_transformer.cli.train_data import CorpusInput, kind_of

        corpus = CorpusInput(args, source, kind_of(args, source[0]))
    try:
        return _train_on(args, data, options, hooks, started, workdir, lock, corpus)
    finally:
        if corpus is not None:
            corpus.discard()  # a cache built but never installed (the run stopped before)


def _train_on(args, data, options, hooks, started, workdir, lock, corpus) -> int:
    """_train with the corpus input (None: a built-in task, in memory)."""
    from flax_transformer.data.pipeline import check_dataset_ids, encode_documents, encode_pairs
    from flax_transformer.spec.kinds import LM, OLD_NAMES
    from flax_transformer.training.distributed import barrier, is_primary
    from flax_transformer.training.loop import Job, run_training

    restart = prepare_workdir(workdir, args.resume)
    saved = read_run_json(workdir) if args.resume else None
    # Flags that differ from the run's: refused by name, or (the compatible ones) recorded.
    changed = changed_settings(args, saved.get("args", {})) if saved else {}
    barrier("workdir checked")  # by every process, before process 0 writes into it
    # Read and check all input before writing anything into the workdir.
    if corpus is None:
        kind, train_pairs, valid_pairs = load_pairs(args, data)
        data_checks.warn_if_validation_is_training(train_pairs, valid_pairs)
    else:  # a corpus file: a streaming pass (none on --resume or on processes other than 0)
        kind = corpus.kind
        corpus.read(scan=not args.resume and is_primary())
    # The init run's run.json, read once: its model kind and the files it carries.
    init_run = (read_run_json(Path(args.init_from)) or {}) if args.init_from else {}
    if args.init_from and not args.resume:
        init_kind = init_run.get("model")
        init_kind = OLD_NAMES.get(init_kind, init_kind)  # the kind's old name
        if init_kind not in (None, kind):
            raise UsageError(
                f"--init-from {args.init_from} holds a {init_kind} model; the data "
                f"given trains a {kind} model"
            )
    if not (args.resume or is_primary()):
        barrier("run files written")  # the other processes use process 0's tokenizer
    tokenizer = make_tokenizer(args, data, workdir, corpus.bpe_texts if corpus else None)
    classify = args.task == "classify"
    config = make_config(args, tokenizer, workdir, corpus.config_changes() if classify else None)
    check_token_budget(options, config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if corpus is not None:
            train_set, valid_set = corpus.datasets(
                tokenizer, config.max_len, data.on_long, workdir, is_primary()
            )
        elif kind == LM:
            train_set = encode_documents(train_pairs, tokenizer, config.max_len)
            valid_set = encode_documents(valid_pairs, tokenizer, config.max_len)
        else:
            train_set = encode_pairs(train_pairs, tokenizer, config.max_len, data.on_long)
            valid_set = encode_pairs(valid_pairs, tokenizer, config.max_len, data.on_long)
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    for dataset in (train_set, valid_set):
        vocab = min(config.src_vocab_size, config.tgt_vocab_size)
        if hasattr(dataset, "check_ids"):  # a token cache
            dataset.check_ids(vocab)
        else:
            check_dataset_ids(dataset, vocab)
    # The first write: every input has been read and checked. The lock is taken here (a second
    # run on the workdir stops here, having written nothing; a refused command never touches
    # it), and a new run checks again that no run finished in the workdir meanwhile.
    make_workdir(workdir, lock)
    # (Only process 0 writes the run files; the others find them there by design.)
    if not args.resume and is_primary() and has_run(workdir):
        raise UsageError(
            f"--workdir {workdir} already holds a run (written while this command read its "
            "input); pass --resume to continue it, or choose another --workdir"
        )
    if corpus is not None and is_primary():
        corpus.install(workdir, train_set)
    carried = list(saved.get("carry", [])) if saved else []
    resumed = list(saved.get("resumed", [])) if saved else []
    if changed:
        resumed.append({"changed": changed})
        print(
            "--resume with "
            + ", ".join(
                f"--{k.replace('_', '-')} {new} (was {old})" for k, (old, new) in changed.items()
            )
            + f": recorded in {workdir / run_dir.RUN_JSON}"
        )
    if is_primary() and (not args.resume or saved is None or changed):
        if not args.resume:
            run_dir.write_config(workdir, config)
            run_dir.write_tokenizer(workdir, tokenizer)
            if args.init_from:
                carried = run_dir.carry_files(args.init_from, init_run.get("carry", []), workdir)
            if classify:  # labels.json, and hf_config.json with them
                corpus.write_run_files(workdir)
        run_dir.write_run_json(
            workdir,
            model=kind,
            tokenizer=tokenizer.kind,
            args={
                k: v
                for k, v in vars(args).items()
                if k not in ("resume", "run_config", *DISTRIBUTED_FLAGS)
            },
            train_examples=len(train_set),
            valid_examples=len(valid_set),
            carry=carried,
            imported_from=saved.get("imported_from") if saved else None,
            resumed=resumed,
        )
    if not args.resume and is_primary():
        barrier("run files written")  # the others wait for it before reading the tokenizer
    print(
        f"{kind} model: d_model {config.d_model}, {config.num_encoder_layers}+"
        f"{config.num_decoder_layers} layers, {config.dtype} compute / {config.param_dtype} "
        f"parameters, {len(train_set)} training / {len(valid_set)} "
        f"validation examples, {tokenizer.kind} tokenizer (vocab {tokenizer.vocab_size}), "
        f"workdir {workdir}"
    )
    job = Job(workdir, config, kind, tokenizer, train_set, valid_set, options,
              resume=args.resume and not restart, restarted=restart,
              labels=corpus.labels if classify else None)  # fmt: skip
    results = run_training(job, hooks)
    if not is_primary():
        return 0  # process 0 writes the results
    results["wall_time_s"] = time.perf_counter() - started
    run_dir.write_results(workdir, results)
    print_summary(results, workdir)
    return 0


def print_summary(results: dict, workdir: Path) -> None:
    """Print the end of a run for a person: steps and speed (or why it stopped early or trained
    nothing), the validation metrics, example decodes and where the results and weights are."""
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
    if results.get("steps_trained") == 0:  # a --resume of a run that had reached --steps
        print(
            f"\nnothing to train: the run was already at step {results['steps']} (--steps "
            f"{results['steps']}; pass a larger --steps to train on); evaluated again"
        )
    else:
        unit = "examples/s" if "macro_f1" in results else "target tokens/s"  # (a classifier's)
        # Speed counts the training steps only; the wall time adds reading and tokenizing
        # the data, evaluations, checkpoints and the final decode.
        print(
            f"\ntrained {results['steps']} steps{early} in {results['train_time_s']:.0f} s of "
            f"training ({results['tokens_per_sec']:.0f} {unit}; "
            f"{results['wall_time_s']:.0f} s in all)"
        )
    line = f"valid loss {results['valid_loss']:.4f}, token accuracy {results['token_accuracy']:.4f}"
    if "exact_match" in results:
        line += f", exact match {results['exact_match']:.4f}, BLEU {results['bleu']:.2f}"
    if "perplexity" in results:
        line += f", perplexity {results['perplexity']:.2f}"
    if "macro_f1" in results:  # a classifier
        line += f", accuracy {results['accuracy']:.4f}, macro-F1 {results['macro_f1']:.4f}"
    print(line)
    for name, label in results.get("per_label", {}).items():
        print(
            f"  {name}: precision {label['precision']:.3f}, recall {label['recall']:.3f}, "
            f"F1 {label['f1']:.3f} ({label['support']} examples)"
        )
    for example in results.get("examples", []):
        mark = "ok " if example["hypothesis"] == example["reference"] else "BAD"
        print(
            f"  [{mark}] {example['source']!r} -> {example['hypothesis']!r} "
            f"(reference {example['reference']!r})"
        )
    for name, path in results.get("pictures", {}).items():
        print(f"{name}: {path}")
    print(
        f"results: {workdir / run_dir.RESULTS}; weights: {results['weights']['torch']} (torch), "
        f"{results['weights']['flax']} (flax)"
    )


if __name__ == "__main__":
    from flax_transformer.training.host_memory import reexec_with_tuned_malloc

    reexec_with_tuned_malloc()  # (JAX is loaded by now: this entry pays a second start-up)
    exit_process(main())
