"""The training workflow: `train(spec, hooks)` reads and checks the data a TrainSpec names,
writes the run files into its workdir, trains and returns the results (results.json). The
command line (cli/train.py) builds the spec from its flags, calls `train`, prints the summary
and maps what went wrong to an exit status."""

from __future__ import annotations

import contextlib
import sys
import time
import warnings
from pathlib import Path
from typing import NamedTuple

from flax_transformer.data.corpus import CHAT
from flax_transformer.runs import run_dir
from flax_transformer.runs.checks import (
    bleu_tokenizer,
    check_spec,
    default_workdir,
    model_values,
    options_from_spec,
    train_len,
    wants_float64,
)
from flax_transformer.runs.resume import changed_settings
from flax_transformer.runs.run_dir import read_run_json
from flax_transformer.runs.spec import TrainSpec, UsageError, spec_record, spec_values
from flax_transformer.runs.train_classify import classifier_run_files
from flax_transformer.runs.train_data import corpus_input, corpus_source
from flax_transformer.runs.workdir import WorkdirLock, has_run, make_workdir, prepare_workdir
from flax_transformer.training.interrupts import TrainingInterrupted, exit_status


def train(spec: TrainSpec, hooks=(), *, warmup_warning: bool = True, started=None):
    """Train the run `spec` describes; `hooks` are step hooks (training/hooks.py: called after
    every step and evaluation, they may stop the run early). Returns the results (also in
    results.json), or None on a process other than 0 of a multi-process run. UsageError (a
    ValueError) for bad settings or input; `warmup_warning` False keeps quiet about a warmup
    longer than the run (a default the user did not choose). TrainingInterrupted (a
    KeyboardInterrupt) on Ctrl-C or SIGTERM, saying what the run left."""
    started = time.perf_counter() if started is None else started
    workdir = default_workdir(spec)
    try:
        return _train_spec(spec, workdir, tuple(hooks), warmup_warning, started)
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM (interrupts.Terminated)
        if isinstance(err, TrainingInterrupted):
            raise  # the loop's: the step reached and the last checkpoint
        message = "interrupted before training started"
        if (workdir / run_dir.RUN_JSON).exists():  # its files were written: --resume starts over
            message += (
                f"; --resume --workdir {workdir} continues it (from step 0 if it saved no "
                "checkpoint)"
            )
        raise TrainingInterrupted(message, exit_status(err)) from None


def _train_spec(spec: TrainSpec, workdir: Path, hooks: tuple, warmup_warning: bool, started):
    """`train` until the first step (a KeyboardInterrupt here stops a run that has not
    trained): the settings and every check of them first, then the run directories (this
    one's state, the --init-from run's kind and files), and only then the processes join (a
    multi-process run waits for all of them) and the data is read."""
    from flax_transformer.training.options import (
        DataOptions,
        DistributedOptions,
        TrainOptions,
        WarmupWarning,
    )

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = options_from_spec(DataOptions, spec, task=spec.task or DataOptions.task)
        options = options_from_spec(TrainOptions, spec, bleu_tokenize=bleu_tokenizer(spec))
    distributed = options_from_spec(DistributedOptions, spec)
    # x64 on before the first array (and before the processes join), back as it was after.
    with float64_if(wants_float64(spec)):
        kind = check_spec(spec, workdir)  # what the data is (CHAT, LM or SEQ2SEQ), read once
        for warning in caught:
            if issubclass(warning.category, WarmupWarning) and not warmup_warning:
                continue
            print(f"warning: {warning.message}", file=sys.stderr)
        run = read_run_dirs(spec, workdir, kind)
        lock = WorkdirLock(workdir)  # (taken by process 0 at its first write: make_workdir)
        corpus = training_input(spec, kind, run.classifier)  # None: a built-in task, in memory
        try:
            return _train_on(spec, distributed, data, options, hooks, started, workdir, lock,
                             run, corpus)  # fmt: skip
        finally:
            if corpus is not None:
                corpus.discard()  # a cache built but never installed (the run stopped before)
            lock.release()


class RunDirs(NamedTuple):
    """What read_run_dirs read."""

    restart: bool  # a --resume without a checkpoint: the run starts over
    saved: dict | None  # this run's run.json on --resume
    changed: dict  # the settings that differ from the saved run's (compatible ones)
    init_run: dict  # the --init-from run's run.json ({} without one)
    classifier: dict | None  # --task classify: the values of the run files its labels use


def read_run_dirs(spec: TrainSpec, workdir: Path, kind: str) -> RunDirs:
    """This run's directory checked (writable, not a second run; a --resume without a
    checkpoint restarts) and its run.json read on --resume; the --init-from run's run.json
    read once, its model kind checked against the data's (`kind`: check_spec's); for --task
    classify, the run files its label set comes from (runs/train_classify.py)."""
    from flax_transformer.spec.kinds import ENCODER, LM, OLD_NAMES

    restart = prepare_workdir(workdir, spec.resume)
    saved = read_run_json(workdir) if spec.resume else None
    # Settings that differ from the run's: refused by name, or (the compatible ones) recorded.
    changed = changed_settings(spec, spec_values(saved)) if saved else {}
    model_kind = ENCODER if spec.task == "classify" else LM if kind == CHAT else kind
    init_run = (read_run_json(Path(spec.init_from)) or {}) if spec.init_from else {}
    if spec.init_from and not spec.resume:
        init_kind = init_run.get("model")
        init_kind = OLD_NAMES.get(init_kind, init_kind)  # the kind's old name
        if init_kind not in (None, model_kind):
            held = f"{'an' if init_kind[0] in 'aeiou' else 'a'} {init_kind} model"
            wanted = (
                "a decoder-only language model" if model_kind == LM else f"a {model_kind} model"
            )
            raise UsageError(
                f"--init-from {spec.init_from} holds {held}, not {wanted}: the data given "
                "trains one"
            )
    classifier = classifier_run_files(spec, workdir) if spec.task == "classify" else None
    return RunDirs(restart, saved, changed, init_run, classifier)


def training_input(spec: TrainSpec, kind: str, classifier: dict | None):
    """The corpus input of the spec's files (nothing read yet; runs/train_data.py): a
    ClassifyInput for --task classify (`classifier`: read_run_dirs'), a ChatInput for a JSONL
    of conversations, else a CorpusInput; None for a built-in task (in memory)."""
    source = corpus_source(spec)
    return None if source is None else corpus_input(spec, source, kind, classifier)


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


def make_config(spec, tokenizer, workdir: Path, changes=None):
    """The model config from the preset, --config and flags, with the tokenizer's vocabulary sizes
    unless --init-from, and `changes` (a classifier's head fields) over it; UsageError on
    --resume if it differs from the run's saved config.json."""
    from flax_transformer.spec.config import config_diff

    # The line about a partial --config is said when the run starts, not again on --resume.
    values = model_values(spec, say=None if spec.resume else print) | dict(changes or {})
    if not spec.init_from:
        values.update(
            src_vocab_size=tokenizer.vocab_size,
            tgt_vocab_size=tokenizer.vocab_size,
            pad_id=tokenizer.pad_id,
        )
    from flax_transformer.spec.config import TransformerConfig

    config = TransformerConfig.from_dict(values)
    if spec.resume:
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


@contextlib.contextmanager
def float64_if(wanted: bool):
    """jax_enable_x64 on for a float64 run (before its first array), back as it was after, so
    that `train` called in a process that goes on (tests, notebooks) leaves JAX as it found it."""
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


def join_processes(options, spec: TrainSpec):
    """Joins a multi-process run (flags or a detected cluster job) before any other JAX call;
    such a run needs --mesh, over which the batch is split. --mesh must fit the devices of all
    the processes (checked here, once they are known). Returns the mesh (None without
    --mesh)."""
    from flax_transformer.training.distributed import (
        DistributedError,
        check_mesh_spans_processes,
        start,
        whoami,
    )
    from flax_transformer.training.sharding import MeshError, make_mesh

    try:
        if start(options) and not spec.mesh:
            raise UsageError(
                f"this is {whoami()}: multi-process training needs --mesh spanning every "
                "process's devices (e.g. --mesh data=N for N devices in all)"
            )
        mesh = make_mesh(spec.mesh) if spec.mesh else None
        if mesh is not None:
            check_mesh_spans_processes(mesh)
        return mesh
    except DistributedError as err:
        raise UsageError(str(err)) from None
    except MeshError as err:
        raise UsageError(f"--mesh: {err}") from None


def _train_on(spec, distributed, data, options, hooks, started, workdir, lock, run, corpus):
    """_train_spec once every check has passed (the processes join first), with the run
    directories read (`run`: read_run_dirs) and the corpus input (training_input): read and
    check the data, write the run files into the workdir, train, write results.json; the
    results (None on a process other than 0). UsageError for data that does not fit the flags
    or the --init-from run, or a workdir in use by another run (process 0 holds the workdir's
    lock from its first write to the end)."""
    from flax_transformer.data.pipeline import (
        bucket_boundaries,
        check_dataset_ids,
        encode_documents,
        encode_pairs,
        task_pairs,
    )
    from flax_transformer.data.token_batches import check_batch_tokens
    from flax_transformer.data.tokenizer import run_tokenizer
    from flax_transformer.runs.load import init_params_from
    from flax_transformer.spec.kinds import LM, SEQ2SEQ
    from flax_transformer.training.distributed import barrier, is_primary
    from flax_transformer.training.loop import Job, run_training

    restart, saved, changed, init_run, _ = run
    mesh = join_processes(distributed, spec)  # every check has passed: the processes meet
    barrier("workdir checked")  # by every process, before process 0 writes into it
    # Read and check all input before writing anything into the workdir: the data (data/),
    # then the tokenizer, the model config from its vocabulary, and the data encoded with it.
    if corpus is None:  # a built-in task, in memory
        kind = SEQ2SEQ
        lengths = (data.task_min_len, data.task_max_len)
        sizes = (data.task_train_size, data.task_valid_size)
        train_pairs, valid_pairs = task_pairs(data.task, *sizes, spec.seed, *lengths)
    else:  # a corpus file: a streaming pass (none on --resume or on processes other than 0)
        kind = corpus.kind
        corpus.read(scan=not spec.resume and is_primary())
    if not (spec.resume or is_primary()):
        barrier("run files written")  # the other processes use process 0's tokenizer
    # The run's own tokenizer (--resume; process 0's, for the others), else the init run's
    # (whatever its kind), else a new one.
    saved_in = workdir if spec.resume or not is_primary() else spec.init_from
    tokenizer_file = Path(saved_in) / run_dir.TOKENIZER if saved_in else None
    texts = corpus.bpe_texts if corpus else None
    tokenizer = run_tokenizer(tokenizer_file, data.tokenizer, texts, data.bpe_vocab_size)
    classify = spec.task == "classify"
    config = make_config(spec, tokenizer, workdir, corpus.head_fields if classify else None)
    seq_len = train_len(spec, config)
    max_len = seq_len or config.max_len  # the longest training sequence
    if options.batch_tokens is not None:  # rows that split over the micro-batches and devices
        multiple = options.grad_accum * (mesh.shape.get("data", 1) if mesh is not None else 1)
        bounds = bucket_boundaries(max_len)
        check_batch_tokens(
            options.batch_tokens, bounds, multiple, options.grad_accum, config.tgt_vocab_size
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if corpus is not None:
            train_set, valid_set = corpus.datasets(
                tokenizer, max_len, data.on_long, workdir, is_primary()
            )
        elif kind == LM:
            train_set = encode_documents(train_pairs, tokenizer, max_len)
            valid_set = encode_documents(valid_pairs, tokenizer, max_len)
        else:
            train_set = encode_pairs(train_pairs, tokenizer, max_len, data.on_long)
            valid_set = encode_pairs(valid_pairs, tokenizer, max_len, data.on_long)
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    for dataset in (train_set, valid_set):
        vocab = min(config.src_vocab_size, config.tgt_vocab_size)
        if hasattr(dataset, "check_ids"):  # a token cache
            dataset.check_ids(vocab)
        else:
            check_dataset_ids(dataset, vocab)
    # The --init-from run's parameters are input too: a checkpoint that does not fit (or cannot
    # be read) is refused before the new run writes anything that a second try would trip on.
    resume = spec.resume and not restart
    labels = corpus.labels if classify else None
    init_params = None
    if spec.init_from and not resume:  # (a classifier's new layers start afresh)
        fresh = labels.fresh_params if labels else None
        init_params = init_params_from(spec.init_from, config, kind, fresh, options.seed)
    # The first write: every input has been read and checked. The lock is taken here (a second
    # run on the workdir stops here, having written nothing; a refused command never touches
    # it), and a new run checks again that no run finished in the workdir meanwhile.
    make_workdir(workdir, lock if is_primary() else None)
    # (Only process 0 writes the run files; the others find them there by design.)
    if not spec.resume and is_primary() and has_run(workdir):
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
    if is_primary() and (not spec.resume or saved is None or changed):
        record = spec_record(spec)
        new = None
        if not spec.resume:  # (a classifier: labels.json, and its hf_config.json with them)
            new = run_dir.NewRun(
                config, tokenizer, Path(spec.init_from) if spec.init_from else None,
                tuple(init_run.get("carry", [])), corpus.labels.names if classify else None,
                corpus.hf_config if classify else None,
            )  # fmt: skip
        run_dir.write_run(
            workdir, new, model=kind, tokenizer=tokenizer.kind, spec=record,
            train_examples=len(train_set), valid_examples=len(valid_set), carry=carried,
            imported_from=saved.get("imported_from") if saved else None, resumed=resumed,
        )  # fmt: skip
    if not spec.resume and is_primary():
        barrier("run files written")  # the others wait for it before reading the tokenizer
    print(
        f"{kind} model: d_model {config.d_model}, {config.num_encoder_layers}+"
        f"{config.num_decoder_layers} layers, {config.dtype} compute / {config.param_dtype} "
        f"parameters, {len(train_set)} training / {len(valid_set)} "
        f"validation examples, {tokenizer.kind} tokenizer (vocab {tokenizer.vocab_size}), "
        f"workdir {workdir}"
    )
    job = Job(workdir, config, kind, tokenizer, train_set, valid_set, options,
              resume=resume, restarted=restart, labels=labels,
              init_params=init_params, seq_len=seq_len)  # fmt: skip
    results = run_training(job, hooks)
    if not is_primary():
        return None  # process 0 writes the results
    results["wall_time_s"] = time.perf_counter() - started
    results["workdir"] = str(workdir)  # (where results.json and the rest of the run are)
    run_dir.write_results(workdir, results)
    return results
