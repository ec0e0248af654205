"""A run directory, loaded: config, kind, tokenizer, and the params of one checkpoint (the best
one when --keep-best kept one, else the latest; or the one asked for). `open_run` is THE way a
workflow loads a run for a command; `init_params_from` is what --init-from starts from. The
files and their names are runs/run_dir.py's; this module adds what needs JAX."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax

from flax_transformer.nn.kinds import model_for
from flax_transformer.runs import run_dir
from flax_transformer.runs.run_dir import carry_files  # noqa: F401  (an older home of it)
from flax_transformer.spec.config import HEAD_FIELDS, TransformerConfig, config_diff
from flax_transformer.spec.kinds import OLD_NAMES, SEQ2SEQ
from flax_transformer.training.run_files import (  # noqa: F401  (training/run.py's names too)
    check_matches_checkpoint,
    checkpoint_steps,
    lazy_checkpoint,
    restore_checkpoint,
)
from flax_transformer.training.state import start_params


@dataclasses.dataclass
class RunArtifacts:
    """A loaded run: its config, model kind, the params of one checkpoint (which one and its
    step), and its tokenizer."""

    config: TransformerConfig
    model_kind: str  # one of spec.kinds.MODEL_KINDS
    params: dict  # {"params": ...} from the chosen checkpoint
    tokenizer: Any
    step: int = 0
    checkpoint: str = "last"  # which one was loaded: "last", "best" or "step"

    @property
    def model(self):
        """The linen module (Transformer or TransformerLM) the params belong to."""
        return model_for(self.config, self.model_kind)


def load_run(
    workdir: str | Path, checkpoint: str | int | None = None, *, lazy: bool = False
) -> RunArtifacts:
    """Config, tokenizer and one checkpoint's params of a train.py workdir.

    checkpoint: "last" (the latest in checkpoints/), "best" (checkpoints_best/, written by
    --keep-best), a step number (either directory), or None: the best if there is one, else
    the last. lazy: the params are LazyArrays, each restored from the checkpoint when it is
    read (Checkpointer.lazy_params: a writer holds one at a time; hf export).
    """
    workdir = Path(workdir)
    config, kind = run_model(workdir)
    tokenizer = run_dir.read_tokenizer(workdir)
    if lazy:
        params, step, chosen = lazy_checkpoint(workdir, checkpoint, config, kind)
    else:
        params, step, chosen = restore_checkpoint(workdir, checkpoint, config, kind)
    return RunArtifacts(config, kind, {"params": params}, tokenizer, step, chosen)


def run_model(workdir: Path) -> tuple[TransformerConfig, str]:
    """(config, model kind) of the run in `workdir`, before any checkpoint is read: a
    ValueError when a run file is missing or unreadable, or for a float64 run while JAX's
    64-bit mode is off."""
    for name in (run_dir.CONFIG, run_dir.RUN_JSON, run_dir.TOKENIZER):
        if not (workdir / name).exists():
            raise ValueError(f"{workdir} is not a train.py workdir: {name} is missing")
    config = run_dir.read_config(workdir)
    if is_float64(config) and not jax.config.jax_enable_x64:
        # Without x64 JAX would build the float64 model in float32: silently another model.
        raise ValueError(
            f"{workdir} is a float64 run (--dtype float64): enable JAX's 64-bit mode before "
            "loading it (jax.config.update('jax_enable_x64', True)); the ftx commands do"
        )
    run = run_dir.read_run_json(workdir)
    if run is None:
        raise ValueError(f"{workdir / run_dir.RUN_JSON}: not readable JSON (cut short?)")
    kind = run.get("model", SEQ2SEQ)
    return config, OLD_NAMES.get(kind, kind)  # (a run written before the kind was renamed)


class RunLoadError(ValueError):
    """A workdir that a command cannot use: one line naming the workdir and why (exit status 2
    in the commands)."""


def open_run(
    workdir: str | Path,
    checkpoint: str | int | None = None,
    *,
    kinds: tuple[str, ...] | None = None,
    purpose: str = "this command",
    lazy: bool = False,
) -> RunArtifacts:
    """THE way a command loads a run (generate, classify, score, export, parity, hf export): the
    workdir must be a directory; JAX's 64-bit mode goes on for a float64 run (before any array
    exists); then load_run's checkpoint choice, and the model kinds `purpose` can use (None:
    any); `lazy`: see load_run. Every failure is one RunLoadError."""
    workdir = Path(workdir)
    if not workdir.is_dir():
        raise RunLoadError(f"--workdir {workdir} is not a directory")
    enable_x64_for(workdir)  # a float64 run stays float64
    try:
        run = load_run(workdir, checkpoint, lazy=lazy)
    except (ValueError, FileNotFoundError) as err:  # CheckpointReadError is a ValueError
        raise RunLoadError(f"cannot load run {workdir}: {err}") from None
    if kinds is not None and run.model_kind not in kinds:
        raise RunLoadError(
            f"{workdir} holds a {run.model_kind} model; {purpose} needs a model of kind "
            + " or ".join(kinds)
        )
    return run


def is_float64(config: TransformerConfig) -> bool:
    """Does the model compute or store its parameters in float64 (which needs JAX's x64)?"""
    return "float64" in (config.dtype, config.param_dtype)


def enable_x64_for(workdir: str | Path) -> None:
    """Turn on JAX's 64-bit mode if the run in `workdir` is float64: the commands that load a
    run (generate, export, parity, hf export) call it first, before any array exists. A
    workdir without a readable config is left to load_run to report."""
    try:
        config = run_dir.read_config(Path(workdir))
    except (OSError, ValueError):
        return
    if is_float64(config):
        jax.config.update("jax_enable_x64", True)


def init_params_from(
    init_dir: str | Path, config: TransformerConfig, kind: str, fresh=None, seed: int = 0
):
    """train.py --init-from: the params (inner tree) of a run directory's checkpoint, which
    must be of the same model kind and config as the new run; in the new run's parameter
    dtype (--dtype: e.g. a float32 import fine-tuned in float64).

    `fresh` (a classifier fine-tuned from an encoder, --task classify): parameter paths to
    start afresh, e.g. ("head/classifier",); the config may then differ from the run's in
    its head (HEAD_FIELDS). Parameters the run lacks or holds in another shape, and those
    under `fresh`, come from a new initialisation with `seed`; the run's parameters the new
    model has no place for (a masked-LM head) are left out. Both are said in one line. The
    run's config and kind are checked before its checkpoint is read; its tokenizer is not
    loaded (the new run reads it itself)."""
    init_dir = Path(init_dir)
    saved, saved_kind = run_model(init_dir)
    if saved_kind != kind:
        raise ValueError(f"--init-from {init_dir}: a {saved_kind} model, not a {kind} one")
    runtime = ("dropout_rate", "attention_impl", "remat", "dtype", "param_dtype")
    diff = config_diff(saved, config, ignore=runtime + (HEAD_FIELDS if fresh else ()))
    if diff:
        raise ValueError(f"--init-from {init_dir}: config differs from the run's: {diff}")
    params, _, _ = restore_checkpoint(init_dir, None, saved, saved_kind)
    return start_params(params, config, kind, fresh, seed)
