"""The training loop behind train.py: steps, evaluation, checkpoints, metrics and results.

`run_training(job, hooks=...)` trains (or resumes) one run in `job.workdir` and returns
results.json's content; step hooks (hooks.py) see every step and evaluation and may stop the
run. The workdir already holds config.json, run.json and tokenizer.json (the training CLI
writes them, and results.json from what this returns); this module adds checkpoints/ (and
checkpoints_best/ with --keep-best), metrics.jsonl and the same metrics as TensorBoard events in
tensorboard/, the PNGs, the exported weights and, with --profile-steps, profile/. Every name is
training/run_files.py's.

Progress: a tqdm bar on a terminal; where stderr is a file or a pipe (a log), a plain line per
logged step instead (no carriage returns or escape codes in the log).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from flax_transformer.data.labelled import LabelChoice
from flax_transformer.data.pipeline import BatchLoader, Dataset, bucket_boundaries, eval_batches
from flax_transformer.data.token_batches import batch_shapes
from flax_transformer.nn.kinds import model_for
from flax_transformer.spec.config import TransformerConfig
from flax_transformer.spec.kinds import SEQ2SEQ
from flax_transformer.training import run_files
from flax_transformer.training.best import BestTracker
from flax_transformer.training.checkpoint import (
    Checkpointer,
    CheckpointWriteError,
    is_disk_full,
)
from flax_transformer.training.classification import evaluate_classifier, scores_of
from flax_transformer.training.distributed import host_copy, is_primary, local_batch_rows
from flax_transformer.training.evaluation import (
    cross_attention_maps,
    evaluate_decoding,
    evaluate_loss,
    scores_text,
)
from flax_transformer.training.hooks import StepHook, StepInfo, call_hooks
from flax_transformer.training.interrupts import (  # noqa: F401  (TrainingError: its old home)
    TrainingError,
    check_event_file,
    interrupted,
    write_failed,
)
from flax_transformer.training.optim import make_optimizer, make_schedule
from flax_transformer.training.options import TrainOptions
from flax_transformer.training.plots import plot_attention, plot_confusion, plot_curves
from flax_transformer.training.profiling import StepProfiler, parse_step_range
from flax_transformer.training.run_files import read_metrics, truncate_metrics  # noqa: F401
from flax_transformer.training.sharding import check_config_fits, make_mesh, shard_training
from flax_transformer.training.state import TrainState, create_train_state
from flax_transformer.training.steps import make_eval_step, make_train_step
from flax_transformer.training.tensorboard_log import TensorBoardLog


@dataclasses.dataclass
class Job:
    """Everything one training run needs: its workdir, model config and kind, tokenizer, encoded
    datasets, options and whether it resumes."""

    workdir: Path
    config: TransformerConfig
    model_kind: str  # one of spec.kinds.MODEL_KINDS
    tokenizer: Any
    train_set: Dataset
    valid_set: Dataset
    options: TrainOptions
    resume: bool = False
    restarted: bool = False  # a --resume of a run that saved no checkpoint: from step 0 again
    labels: LabelChoice | None = None  # a sequence classifier's classes (--task classify)
    # --init-from: the parameters (inner tree) a new run starts from, loaded by the caller
    # (runs/load.py's init_params_from); None: a fresh initialisation. Unused on a resume.
    init_params: Any = None
    # The longest training sequence in tokens (None: config.max_len): an --init-from run's
    # --max-len trains on shorter rows while the model keeps its own positions.
    seq_len: int | None = None

    @property
    def train_len(self) -> int:
        """The longest training sequence: seq_len, else the model's max_len."""
        return self.seq_len or self.config.max_len


# ----------------------------------------------------------------------------- metrics file
class MetricsLog:
    """metrics.jsonl, and the same records as TensorBoard scalars when `tensorboard` is given."""

    def __init__(self, path: Path | None, tensorboard: TensorBoardLog | None = None):
        self.path, self.tensorboard = path, tensorboard  # path None: write nothing

    def write(self, record: dict) -> None:
        """Append one record to metrics.jsonl (and to TensorBoard when on); nothing when path is
        None (processes other than 0)."""
        if self.path is None:
            return
        run_files.append_metrics(self.path, record)
        if self.tensorboard is not None:
            self.tensorboard.write(record)

    def has_eval(self, step: int) -> bool:
        """An evaluation record of `step` is in metrics.jsonl already (False when path is
        None)."""
        if self.path is None:
            return False
        return any(r.get("kind") == "eval" and r.get("step") == step
                   for r in read_metrics(self.path))  # fmt: skip


# ----------------------------------------------------------------------------- best checkpoint
def best_tracking(opt: TrainOptions, workdir: Path, checkpointer: Checkpointer, resumed_at: int):
    """(BestTracker or None, Checkpointer of checkpoints_best/ or None) for --keep-best /
    --early-stop; on resume the tracker saved with the checkpoint, and best checkpoints the
    interrupted run wrote after it are deleted (that timeline is replayed)."""
    if not (opt.keep_best or opt.early_stop):
        return None, None
    tracker = BestTracker(opt.keep_best or "valid_loss", opt.early_stop)
    if resumed_at:
        saved = checkpointer.meta().get("extra", {}).get("best")
        if saved and saved["metric"] == tracker.metric:
            tracker = BestTracker.from_json(saved, opt.early_stop)
            print(
                f"best {tracker.metric} so far {tracker.best:.4f} at step {tracker.best_step}, "
                f"{tracker.evals_since_best} evaluation(s) since"
            )
    if not opt.keep_best:
        return tracker, None
    # Orbax keeps everything here; prune_best deletes what the tracker no longer needs.
    best = Checkpointer(workdir / run_files.CHECKPOINTS_BEST, keep=None)
    for step in best.steps():
        if step > resumed_at:
            best.delete(step)
    return tracker, best


def prune_best(best: Checkpointer | None, tracker: BestTracker) -> None:
    """After a regular save (which holds the tracker): older best checkpoints are not needed."""
    if best is not None:
        best.wait()  # no deleting under a save in flight
        for step in best.steps():
            if step < tracker.best_step:
                best.delete(step)


# ----------------------------------------------------------------------------- loop
def run_training(job: Job, hooks: Sequence[StepHook] = ()) -> dict[str, Any]:
    """Trains (or resumes) `job`; `hooks` see every step and evaluation and may stop the run."""
    if job.options.init_from and job.init_params is None and not job.resume:
        # The loop reads no run directory: an --init-from run's parameters come loaded.
        raise ValueError(
            f"init_from {job.options.init_from} without Job.init_params: load them with "
            "flax_transformer.runs.load.init_params_from (runs.train.train does)"
        )
    job = cap_validation(job)
    opt, cfg, workdir = job.options, job.config, job.workdir
    pad = job.tokenizer.pad_id
    model = model_for(cfg, job.model_kind)
    schedule = make_schedule(opt.schedule, opt.lr, opt.warmup, opt.steps)
    optimizer = make_optimizer(schedule, weight_decay=opt.weight_decay, clip_norm=opt.clip_norm)
    checkpointer = Checkpointer(workdir / run_files.CHECKPOINTS, keep=opt.keep_checkpoints)
    # Several processes: one mesh over all their devices, and each builds only its rows of
    # every batch; process 0 alone writes the run's files (metrics, events, pictures, ...).
    mesh = make_mesh(opt.mesh) if opt.mesh else None
    multi_process, primary = jax.process_count() > 1, is_primary()
    rows = local_batch_rows(mesh, opt.batch_size) if multi_process else None
    multiple = token_batch_multiple(opt, mesh)
    local_rows = None
    if multi_process and opt.batch_tokens is not None:
        local_rows = functools.partial(local_batch_rows, mesh)
    loader = BatchLoader(job.train_set, opt.batch_size, job.train_len, opt.seed, pad, rows,
                         batch_tokens=opt.batch_tokens, multiple=multiple, pack=opt.pack,
                         local_rows=local_rows)  # fmt: skip
    metrics_path = run_files.metrics_path(workdir)
    resumed_at = 0
    if job.resume:
        abstract = jax.eval_shape(lambda: create_train_state(model, optimizer, opt.seed))
        set_aside = workdir / run_files.CHECKPOINTS_UNRESTORABLE
        state, loader_state, skipped = checkpointer.restore_newest(abstract, set_aside)
        for step, why in skipped:
            print(
                f"warning: {why}; skipped it (moved, not deleted, to {set_aside / str(step)})",
                file=sys.stderr,
            )
        loader.restore(loader_state)
        resumed_at = int(state.step)
        if primary:
            truncate_metrics(metrics_path, resumed_at)
        print(f"resumed from step {resumed_at} ({checkpointer.directory})")
    else:
        state = create_train_state(model, optimizer, opt.seed, job.init_params)
        if primary:
            truncate_metrics(metrics_path, 0)  # a new run: an empty metrics.jsonl
    # A resumed run's events purge what the interrupted run logged after the checkpoint.
    tensorboard = None
    if primary:
        # (A restarted run purges the events its first attempt logged.)
        purge_step = resumed_at + 1 if job.resume or job.restarted else None
        tensorboard = TensorBoardLog(workdir / run_files.TENSORBOARD, purge_step=purge_step)
    log = MetricsLog(metrics_path if primary else None, tensorboard)
    tracker, best_checkpointer = best_tracking(opt, workdir, checkpointer, resumed_at)
    profiled = parse_step_range(opt.profile_steps) if opt.profile_steps and primary else None
    profiler = StepProfiler(workdir / run_files.PROFILE, profiled)
    step_fn = make_train_step(model, optimizer, opt.label_smoothing, opt.grad_accum)
    # With a mesh, evaluation, checkpoints and the final decoding work on a host copy of the
    # state: running other sharded programs between train steps can deadlock XLA:CPU's
    # collectives on fake devices, and a host copy is what they need anyway.
    # With several processes the state is spread over them: host_copy gathers it (every
    # process calls it, in the same order), and checkpoints are written by all of them.
    on_host = host_copy if opt.mesh else (lambda tree: tree)
    to_checkpoint = (lambda tree: tree) if multi_process else on_host
    if opt.mesh:
        # One code path: the mesh decides how the state and the batch are laid out.
        # Each micro-batch is split over `data` (steps.split_micro_batches keeps rows in place).
        check_config_fits(cfg, mesh, smallest_batch(opt, job.train_len, multiple) // opt.grad_accum)
        if multi_process:  # the same host values in every process, placed on the global mesh
            state = jax.device_get(state)  # (a process cannot send its device arrays to others)
        state, train_step = shard_training(mesh, state, step_fn, model=model)
        print(f"sharded over mesh {dict(mesh.shape)} of {mesh.devices.size} devices")
    else:
        train_step = jax.jit(step_fn, donate_argnums=0)
    eval_step = jax.jit(make_eval_step(model, opt.label_smoothing))
    valid_batches = eval_batches(job.valid_set, opt.batch_size, job.train_len, pad)

    def ask(event: str, step: int, metrics, state) -> bool:
        """True if a hook asked to stop."""
        if not hooks:
            return False
        info = StepInfo(event, step, MappingProxyType(metrics), state, workdir, checkpointer.wait)
        return call_hooks(hooks, info)

    start_step = at = int(state.step)  # at: the optimizer steps done so far
    train_time, tokens, window, stop_reason = 0.0, 0, [], None
    interrupt = None  # a KeyboardInterrupt (Ctrl-C) or Terminated (SIGTERM) met in the loop
    wall_start = time.perf_counter()
    tick = time.perf_counter()
    # A progress bar redraws itself with carriage returns and escape codes: on a terminal only.
    # Elsewhere (a log file) each logged step is one plain line.
    plain = not sys.stderr.isatty()
    unit = "examples" if job.labels else "tok"  # what a step's "token_count" counts
    bar = tqdm(
        total=opt.steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True,
        disable=plain or not primary,
    )  # fmt: skip
    try:
        for done in range(start_step + 1, opt.steps + 1):
            batch = next(loader)
            profiler.before(done)
            state, metrics = train_step(state, batch)
            at = done
            profiler.after(done, state)
            if opt.mesh:  # one sharded program at a time (see on_host above)
                jax.block_until_ready(state)
            window.append(metrics)  # its token counts are added to `tokens` when logged
            bar.update(1)
            stop = ask("step", done, metrics, state)
            reason = "hook" if stop else None
            last = stop or done == opt.steps  # a stopped run ends like one at its last step
            log_now = done % opt.log_every == 0 or last
            eval_now = done % opt.eval_every == 0 and not last  # the end has its own
            save_now = done % opt.save_every == 0 or last
            if not (log_now or eval_now or save_now):
                continue
            jax.block_until_ready(state)
            train_time += time.perf_counter() - tick
            # The global batches' target tokens (a process holds only its own rows).
            seen = tokens + sum(int(m["token_count"]) for m in window)
            record = {
                "kind": "train",
                "step": done,
                "train_loss": _checked_loss(window, state, done, checkpointer),
                "lr": float(schedule(done - 1)),
                "grad_norm": float(metrics["grad_norm"]),
                "tokens_per_sec": seen / max(train_time, 1e-9),
            }
            if log_now or save_now:
                log.write(record)
                tokens = seen
                window.clear()
                bar.set_postfix(
                    loss=f"{record['train_loss']:.4f}", tok_s=f"{tokens / train_time:.0f}"
                )
                if plain and primary:
                    print(
                        f"step {done}/{opt.steps}: train loss {record['train_loss']:.4f}, "
                        f"{tokens / train_time:.0f} {unit}/s",
                        flush=True,
                    )
            if eval_now:
                scores = evaluate(job, model, eval_step, on_host(state.params), valid_batches)
                log.write({"kind": "eval", "step": done} | scores | eval_counts(job, scores))
                # (a plain print when the bar is off)
                bar.write(f"step {done}: {scores_text(scores, opt.label_smoothing)}")
                hook_stop = ask("eval", done, scores, state)
                if tracker is not None and tracker.update(done, scores) and best_checkpointer:
                    best_checkpointer.save(on_host(state))
                if hook_stop or (tracker is not None and tracker.should_stop):
                    reason = reason or ("hook" if hook_stop else "early_stop")
                    stop = save_now = True
                    if window:  # the stop step is logged and saved like any last step
                        log.write(record)
                        tokens = seen
                        window.clear()
            if save_now:
                extra = {"best": tracker.to_json()} if tracker else None
                checkpointer.save(to_checkpoint(state), loader.state(), extra)
                if tracker is not None:
                    prune_best(best_checkpointer, tracker)
            if stop:
                stop_reason = reason if done < opt.steps else None
                break
            tick = time.perf_counter()
    except KeyboardInterrupt as err:
        interrupt = err  # said once the save in flight is finished (finally, below)
    except CheckpointWriteError as err:
        raise write_failed(err, checkpointer, metrics_path) from None
    except OSError as err:
        if not is_disk_full(err):
            raise
        raise write_failed(err, checkpointer, metrics_path) from None
    finally:
        profiler.stop()
        if tensorboard is not None:  # a crashed run's events are on disk; a resume purges them
            tensorboard.flush(quietly=True)  # (on an error path, that error is the one said)
        bar.close()
        close_checkpoints(checkpointer, quietly=interrupt is not None)
        if interrupt is not None and best_checkpointer is not None:
            close_checkpoints(best_checkpointer, quietly=True)
    if interrupt is not None:
        raise interrupted(interrupt, at, _last(checkpointer), workdir) from None
    check_event_file(tensorboard, checkpointer, metrics_path)
    stats = {
        "steps_trained": int(state.step) - start_step,  # 0: a --resume of a finished run
        "tokens_per_sec": tokens / max(train_time, 1e-9),
        "train_time_s": train_time,
        "stopped_early": stop_reason is not None,
        "stop_reason": stop_reason,
    }
    best = (tracker, best_checkpointer)
    try:
        results = finish(
            job, model, on_host(state), eval_step, valid_batches, hooks, stats, wall_start,
            log, best,
        )  # fmt: skip
    except KeyboardInterrupt as err:  # every checkpoint is on disk: the last step's included
        raise interrupted(err, at, _last(checkpointer), workdir) from None
    except OSError as err:
        if not is_disk_full(err):
            raise
        raise write_failed(err, checkpointer, metrics_path) from None
    finally:
        if tensorboard is not None:
            tensorboard.close()  # quietly: a failed last flush is said below
        if best_checkpointer is not None:
            best_checkpointer.close()
    check_event_file(tensorboard, checkpointer, metrics_path)
    return results


def close_checkpoints(checkpointer: Checkpointer, quietly: bool) -> None:
    """Let the save in flight finish, then delete what a save cut short left (Orbax's temporary
    directories); `quietly`: a run already stopping (Ctrl-C) says that, not a failed save."""
    try:
        checkpointer.close()
    except CheckpointWriteError:
        if not quietly:
            raise
    finally:
        checkpointer.remove_unfinished()


def _last(checkpointer: Checkpointer) -> int | None:
    steps = checkpointer.finished_steps()
    return steps[-1] if steps else None


def cap_validation(job: Job) -> Job:
    """The job with its validation set cut to the first --valid-max examples (said once)."""
    cap, total = job.options.valid_max, len(job.valid_set)
    if total <= cap:
        return job
    print(f"validation: the first {cap} of {total} examples (--valid-max {cap})")
    return dataclasses.replace(job, valid_set=job.valid_set.head(cap))


def eval_counts(job: Job, scores) -> dict[str, int]:
    """How many validation examples an evaluation scored and decoded (an evaluation decodes
    only for --keep-best exact_match)."""
    decoded = len(job.valid_set) if "exact_match" in scores else 0
    return {"valid_examples": len(job.valid_set), "decoded_examples": decoded}


def token_batch_multiple(opt: TrainOptions, mesh) -> int:
    """Rows of a --batch-tokens batch come in multiples of this: the micro-batches times the
    mesh's data-parallel devices, over all processes (so that every batch splits evenly)."""
    if opt.batch_tokens is None:
        return 1
    data = dict(mesh.shape).get("data", 1) if mesh is not None else 1
    return opt.grad_accum * data


def smallest_batch(opt: TrainOptions, max_len: int, multiple: int) -> int:
    """The fewest rows a training batch has: --batch-size, or with --batch-tokens the rows of
    the longest bucket (rows up to max_len tokens)."""
    if opt.batch_tokens is None:
        return opt.batch_size
    shapes = batch_shapes(opt.batch_tokens, bucket_boundaries(max_len), multiple)
    return min(rows for rows, _ in shapes)


def evaluate(job: Job, model, eval_step, params, valid_batches) -> dict[str, float]:
    """Validation loss and token accuracy; exact match too when --keep-best asks for it (it
    decodes the validation set, the final evaluation's cost at every evaluation); a
    classifier's accuracy and macro-F1."""
    if job.labels is not None:
        return evaluate_classifier(eval_step, params, valid_batches, job.labels.names)[0]
    result = evaluate_loss(eval_step, params, valid_batches)
    scores = {"valid_loss": result["loss"], "token_accuracy": result["token_accuracy"]}
    if job.options.keep_best == "exact_match":
        opt = job.options
        decoded = evaluate_decoding(
            model, params, job.valid_set, job.tokenizer, batch_size=opt.batch_size,
            max_len=job.config.max_len, bleu_tokenize=opt.bleu_tokenize,
        )  # fmt: skip
        scores["exact_match"] = decoded.exact_match
    return scores


_norm = jax.jit(optax.tree.norm)  # one program, not dozens of eager ops in each new process


def _checked_loss(window: list, state: TrainState, step: int, checkpointer) -> float:
    """Mean train loss over the steps in `window`; a non-finite loss or params end the run."""
    loss_sum = sum(float(m["loss_sum"]) for m in window)
    count = sum(float(m["token_count"]) for m in window)
    train_loss = loss_sum / max(count, 1.0)
    if not (math.isfinite(train_loss) and math.isfinite(float(_norm(state.params)))):
        raise TrainingError(
            f"the loss became {train_loss} by step {step}; stopping without saving "
            f"(last checkpoint: step {checkpointer.latest_step()}). Try a lower --lr "
            "or a smaller --clip-norm."
        )
    return train_loss


# ----------------------------------------------------------------------------- the end
def finish(job, model, state, eval_step, valid_batches, hooks, stats, wall_start, log, best):
    """Final evaluation (shown to the hooks and the best tracker), pictures (also on
    TensorBoard), exported weights and results.json's content."""
    opt, cfg, workdir, tok = job.options, job.config, job.workdir, job.tokenizer
    params = state.params
    final = evaluate_loss(eval_step, params, valid_batches)
    scores = {"valid_loss": final["loss"], "token_accuracy": final["token_accuracy"]}
    confusion = None
    if job.labels is not None:  # + accuracy and macro-F1
        scores, confusion = evaluate_classifier(eval_step, params, valid_batches, job.labels.names)
    # The run is over: a STOP changes nothing, and every checkpoint is on disk.
    call_hooks(hooks, StepInfo("eval", int(state.step), MappingProxyType(scores), state,
                               workdir, lambda: None))  # fmt: skip
    results: dict[str, Any] = {
        "steps": int(state.step),
        "valid_loss": final["loss"],
        "label_smoothing": opt.label_smoothing,  # in valid_loss (evaluation.loss_words)
        "token_accuracy": final["token_accuracy"],
        "valid_examples": len(job.valid_set),
    }
    decoded_count = 0
    pictures = {}
    # Decoding is for results.json, which process 0 writes, and for --keep-best exact_match.
    if confusion is not None:
        results |= scores_of(confusion, job.labels.names) | {"confusion": confusion.tolist()}
    elif job.model_kind == SEQ2SEQ and (is_primary() or opt.keep_best == "exact_match"):
        decoded = evaluate_decoding(
            model,
            params,
            job.valid_set,
            tok,
            batch_size=opt.batch_size,
            max_len=cfg.max_len,
            bleu_tokenize=opt.bleu_tokenize,
        )
        decoded_count = len(decoded.hypotheses)
        results["exact_match"] = decoded.exact_match
        results["bleu"], results["chrf"] = decoded.bleu, decoded.chrf
        if decoded.bleu_note:
            results["bleu_note"] = decoded.bleu_note
        results["examples"] = [
            {"source": s, "reference": r, "hypothesis": h}
            for s, r, h in list(
                zip(decoded.sources, decoded.references, decoded.hypotheses, strict=True)
            )[: opt.num_examples]
        ]
    else:
        # Perplexity from the plain cross-entropy (the training loss is label-smoothed).
        nll = evaluate_loss(jax.jit(make_eval_step(model, 0.0)), params, valid_batches)["loss"]
        results["valid_nll"] = nll
        results["perplexity"] = float(math.exp(min(nll, 50.0)))
    results["decoded_examples"] = decoded_count
    step = int(state.step)
    final_scores = {"valid_loss": final["loss"], "token_accuracy": final["token_accuracy"]}
    final_scores |= {"exact_match": results["exact_match"]} if "exact_match" in results else {}
    final_scores |= {k: scores[k] for k in ("accuracy", "macro_f1") if k in scores}
    # A --resume of a finished run trained nothing: its final record is there already. (A run
    # stopped at an evaluation logs it, and then its final one, at the same step.)
    counts = {"valid_examples": len(job.valid_set), "decoded_examples": decoded_count}
    if not (stats["steps_trained"] == 0 and log.has_eval(step)):
        log.write({"kind": "eval", "step": step} | final_scores | counts)
    tracker, best_checkpointer = best
    if tracker is not None:
        if tracker.update(step, final_scores) and best_checkpointer is not None:
            best_checkpointer.save(state)
            prune_best(best_checkpointer, tracker)  # the run is over: one best checkpoint
        results["best"] = tracker.to_json()
    best_params = None
    if best_checkpointer is not None and tracker.best_step is not None:
        best_checkpointer.wait()  # (every process takes part in a restore)
        best_params = best_checkpointer.restore_params(params, tracker.best_step)
    if not is_primary():  # process 0 alone writes the pictures, weights and results
        return results | stats
    if job.model_kind == SEQ2SEQ:
        pictures["attention"] = str(_attention_picture(model, params, job, workdir))
    if confusion is not None:
        names = job.labels.names
        pictures["confusion"] = str(plot_confusion(confusion, names, workdir / run_files.CONFUSION))
    tensorboard = log.tensorboard
    if "examples" in results:
        tensorboard.examples(results["examples"], step)
    for name in ("attention", "confusion"):
        if name in pictures:
            tensorboard.image(f"valid/{name}", Path(pictures[name]), step)
    curves = workdir / run_files.CURVES
    pictures["curves"] = str(plot_curves(read_metrics(run_files.metrics_path(workdir)), curves))
    weights = run_files.write_weights(workdir, "", params, cfg, job.model_kind)
    if best_params is not None:
        # The best checkpoint's weights too (best_*.safetensors), for the same uses.
        prefix = run_files.BEST_PREFIX
        best_weights = run_files.write_weights(workdir, prefix, best_params, cfg, job.model_kind)
        weights |= {f"best_{name}": path for name, path in best_weights.items()}
    results.update(
        stats,
        wall_time_s=time.perf_counter() - wall_start,
        pictures=pictures,
        weights=weights,
    )
    return results  # runs/train.py writes it as results.json (runs/run_dir.py)


def _attention_picture(model, params, job: Job, workdir: Path) -> Path:
    """Cross-attention heatmap of one validation example (length near 12), teacher-forced."""
    lengths = np.array([len(s) for s in job.valid_set.src])
    index = int(np.argmin(np.abs(lengths - 12)))
    src, tgt_in = job.valid_set.src[index], job.valid_set.tgt_in[index]
    maps = cross_attention_maps(model, params, jnp.asarray(src), jnp.asarray(tgt_in))
    return plot_attention(
        maps,
        job.tokenizer.token_strings(src),
        job.tokenizer.token_strings(tgt_in),
        workdir / run_files.ATTENTION,
    )
