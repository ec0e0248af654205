"""The files the training loop writes in a run directory, and reads back: its checkpoints,
metrics.jsonl, TensorBoard events, profiles, pictures and exported weights. Their names live
here, beside the loop that writes them; the application layer's record of a run (config.json,
tokenizer.json, run.json, labels.json, results.json, the lock) and the whole layout table are
runs/run_dir.py's, which imports these names (the loop knows nothing of that layer).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from flax_transformer.files.atomic_io import atomic_write_text
from flax_transformer.spec.naming import flatten_params
from flax_transformer.spec.tree_check import ConversionError, check_tree

CONFIG = "config.json"  # (runs/run_dir.py writes it; named here for the loop's error lines)
CHECKPOINTS = "checkpoints"
CHECKPOINTS_BEST = "checkpoints_best"
CHECKPOINTS_UNRESTORABLE = "checkpoints_unrestorable"
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"
PROFILE = "profile"
CURVES = "curves.png"
ATTENTION = "attention.png"
CONFUSION = "confusion.png"
FLAX_WEIGHTS = "flax_params.safetensors"
TORCH_WEIGHTS = "torch_model.safetensors"
BEST_PREFIX = "best_"  # best_flax_params.safetensors, best_torch_model.safetensors


# ----------------------------------------------------------------------------- metrics.jsonl
def metrics_path(workdir: Path) -> Path:
    """Where the run's metrics.jsonl lives (one JSON record per logged step and evaluation)."""
    return Path(workdir) / METRICS


def read_metrics(path: Path) -> list[dict]:
    """The records of metrics.jsonl (`path`: the file or the run directory)."""
    path = Path(path)
    path = path / METRICS if path.is_dir() else path
    if not path.exists():
        return []
    text = path.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    records = [json.loads(line) for line in lines[:-1]]
    if lines:
        try:
            records.append(json.loads(lines[-1]))
        except ValueError:
            # A last line cut short (the disk filled up, or the process was killed, mid-write):
            # the record was never complete; anything else broken is an error.
            if text.endswith("\n"):
                raise
    return records


def truncate_metrics(path: Path, last_step: int) -> None:
    """Keep the records up to `last_step` (on resume, forget what the interrupted run wrote
    after its checkpoint); an empty file when there are none (a new run)."""
    kept = [r for r in read_metrics(path) if r["step"] <= last_step]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))


def append_metrics(path: Path, record: dict) -> None:
    """One record at the end of metrics.jsonl (cut back atomically on resume)."""
    with Path(path).open("a") as handle:
        handle.write(json.dumps(record) + "\n")


# ----------------------------------------------------------------------------- weights
def weight_paths(workdir: Path, prefix: str = "") -> dict[str, Path]:
    """Where the exported weights go: {"flax": ..., "torch": ...}; prefix "best_" for the
    best checkpoint's."""
    if prefix not in ("", BEST_PREFIX):
        raise ValueError(f"weight file prefix must be '' or {BEST_PREFIX!r}, got {prefix!r}")
    workdir = Path(workdir)
    return {"flax": workdir / (prefix + FLAX_WEIGHTS), "torch": workdir / (prefix + TORCH_WEIGHTS)}


def write_weights(workdir: Path, prefix: str, params, config, kind: str) -> dict[str, str]:
    """<prefix>flax_params.safetensors and <prefix>torch_model.safetensors (the config and kind
    inside, for both frameworks) from `params` (the inner tree, on any device); their paths."""
    import numpy as np

    from flax_transformer.interop.convert import (
        flax_to_torch_state,
        save_flax_params,
        save_torch_state,
    )
    from flax_transformer.spec.naming import unflatten_params

    host_params = unflatten_params({k: np.asarray(v) for k, v in flatten_params(params).items()})
    paths = weight_paths(workdir, prefix)
    save_flax_params(paths["flax"], host_params, config, kind)
    save_torch_state(paths["torch"], flax_to_torch_state(host_params), config, kind)
    return {name: str(path) for name, path in paths.items()}


# ----------------------------------------------------------------------------- checkpoints
def check_matches_checkpoint(config, abstract, saved_shapes, workdir: Path, step: int) -> None:
    """A ValueError naming the config fields and parameter shapes where config.json and the
    checkpoint disagree (instead of Flax's error from deep inside the restore)."""
    expected = {path: tuple(leaf.shape) for path, leaf in flatten_params(abstract).items()}
    try:
        check_tree(saved_shapes, expected, "parameters", what="param", name="/".join)
    except ConversionError as err:
        saved = _shape_fields(saved_shapes)
        fields = [
            f"{name}: {getattr(config, name)} in config.json, {value} in the checkpoint"
            for name, value in saved.items()
            if getattr(config, name) != value
        ]
        hint = f" ({'; '.join(fields)})" if fields else ""
        lines = str(err).split("\n")
        if len(lines) > 7:  # the first few mismatches say enough
            lines = lines[:6] + [f"  ... and {len(lines) - 6} more"]
        raise ValueError(
            f"{workdir / CONFIG} does not match checkpoint step {step}{hint}: " + "\n".join(lines)
        ) from None


def _shape_fields(shapes: dict[tuple[str, ...], tuple[int, ...]]) -> dict[str, int]:
    """The config fields that parameter shapes show: widths, vocabularies, layer counts."""
    fields = {}
    for path, shape in shapes.items():
        name = "/".join(path)
        if path[-1] == "embedding" and path[0] in ("tgt_embed", "shared_embed", "src_embed"):
            fields["d_model"] = shape[1]
            vocab = "src_vocab_size" if path[0] == "src_embed" else "tgt_vocab_size"
            fields[vocab] = shape[0]
        elif name.endswith("ffn/linear1/kernel"):
            fields["d_ff"] = shape[1]
    for stack, field in (("encoder", "num_encoder_layers"), ("decoder", "num_decoder_layers")):
        layers = {p[1] for p in shapes if p[0] == stack and p[1].startswith("layers_")}
        if layers:
            fields[field] = len(layers)
    return fields


def checkpoint_steps(directory: Path) -> list[int]:
    """The finished checkpoints of an Orbax directory (Orbax's temporary ones excluded)."""
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def restore_checkpoint(
    workdir: Path, checkpoint: str | int | None, config, kind: str
) -> tuple[dict, int, str]:
    """(params as numpy arrays, step, which) of one checkpoint of the run in `workdir`
    (open_checkpoint's choice and checks)."""
    import jax
    import numpy as np

    with open_checkpoint(workdir, checkpoint, config, kind) as (reader, abstract, step, chosen):
        params = reader.restore_params(abstract, step)
    return jax.tree.map(np.asarray, params), step, chosen


def lazy_checkpoint(
    workdir: Path, checkpoint: str | int | None, config, kind: str
) -> tuple[dict, int, str]:
    """restore_checkpoint's params as LazyArrays, each restored when read
    (Checkpointer.lazy_params: a writer that reads them in turn holds one group at a time)."""
    with open_checkpoint(workdir, checkpoint, config, kind) as (reader, abstract, step, chosen):
        params = reader.lazy_params(abstract, step)
    return params, step, chosen


@contextlib.contextmanager
def open_checkpoint(workdir: Path, checkpoint: str | int | None, config, kind: str):
    """(Checkpointer, the abstract params of `config`, step, which) of the run's checkpoint
    that choose_checkpoint picks, checked against `config` first (check_matches_checkpoint),
    closed on leaving. A damaged checkpoint's CheckpointReadError, here or in the block, names
    the other steps there are."""
    from flax_transformer.nn.kinds import abstract_variables, model_for
    from flax_transformer.training.checkpoint import Checkpointer, CheckpointReadError

    workdir = Path(workdir)
    abstract = abstract_variables(model_for(config, kind))["params"]
    directory, step, chosen = choose_checkpoint(workdir, checkpoint)
    checkpointer = Checkpointer(directory, create=False)
    try:
        check_matches_checkpoint(config, abstract, checkpointer.param_shapes(step), workdir, step)
        yield checkpointer, abstract, step, chosen
    except CheckpointReadError as err:
        others = sorted(set(checkpoint_steps(workdir / CHECKPOINTS)) - {step})
        hint = (
            f" (others: steps {', '.join(map(str, others))}; --checkpoint STEP)" if others else ""
        )
        raise CheckpointReadError(f"{err}{hint}") from None
    finally:
        checkpointer.close()


def choose_checkpoint(workdir: Path, checkpoint: str | int | None) -> tuple[Path, int, str]:
    """(directory, step, which) of a run's checkpoint: `checkpoint` "last", "best", a step, or
    None (the best when the run kept one, else the last); a ValueError naming what is there."""
    last_dir, best_dir = workdir / CHECKPOINTS, workdir / CHECKPOINTS_BEST
    last, best = checkpoint_steps(last_dir), checkpoint_steps(best_dir)
    if checkpoint is None:
        checkpoint = "best" if best else "last"
    if checkpoint == "best":
        if not best:
            raise ValueError(f"{best_dir}: no best checkpoint (train with --keep-best)")
        return best_dir, best[-1], "best"
    if checkpoint == "last":
        if not last:
            raise ValueError(f"{last_dir}: no checkpoint found")
        return last_dir, last[-1], "last"
    try:
        step = int(checkpoint)
    except ValueError:
        raise ValueError(f"checkpoint must be last, best or a step, got {checkpoint!r}") from None
    if step in last:
        return last_dir, step, "step"
    if step in best:
        return best_dir, step, "step"
    raise ValueError(
        f"no checkpoint of step {step} in {workdir} (steps: {sorted(set(last + best))})"
    )
