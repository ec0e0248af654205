"""Checkpoint averaging (the paper's "averaging the last 5 checkpoints"): the element-wise mean
of the parameters of a run's last N checkpoints, used when scoring (`ftx score --average-last
N`).

The mean is accumulated in float64 whatever the parameter dtype and cast back once, so the
result does not depend on the order of the checkpoints beyond float64 rounding.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from flax_transformer.nn.kinds import abstract_variables, model_for
from flax_transformer.training import run_files
from flax_transformer.training.checkpoint import Checkpointer
from flax_transformer.training.run_files import check_matches_checkpoint, checkpoint_steps


def last_steps(workdir: str | Path, count: int) -> list[int]:
    """The last `count` checkpoint steps of the run (checkpoints/); ValueError when it holds
    fewer (saying how many, and that --keep-checkpoints bounds what a run keeps)."""
    directory = Path(workdir) / run_files.CHECKPOINTS
    steps = checkpoint_steps(directory)
    if count < 1:
        raise ValueError(f"--average-last must be >= 1, got {count}")
    if len(steps) < count:
        raise ValueError(
            f"--average-last {count}: {directory} holds {len(steps)} checkpoint(s) "
            f"({', '.join(map(str, steps)) or 'none'}); a run keeps its last --keep-checkpoints"
        )
    return steps[-count:]


def average_params(workdir: str | Path, config, kind: str, steps: list[int]) -> dict:
    """{"params": mean of the params of checkpoints `steps`} of the run in `workdir`, in the
    config's parameter dtype (accumulated in float64)."""
    workdir = Path(workdir)
    abstract = abstract_variables(model_for(config, kind))["params"]
    checkpointer = Checkpointer(workdir / run_files.CHECKPOINTS, create=False)
    total = None
    try:
        for step in steps:
            check_matches_checkpoint(
                config, abstract, checkpointer.param_shapes(step), workdir, step
            )
            params = jax.tree.map(
                lambda x: np.asarray(x, np.float64), checkpointer.restore_params(abstract, step)
            )
            total = params if total is None else jax.tree.map(np.add, total, params)
    finally:
        checkpointer.close()
    dtype = jax.numpy.dtype(config.param_dtype)
    return {"params": jax.tree.map(lambda x: (x / len(steps)).astype(dtype), total)}
