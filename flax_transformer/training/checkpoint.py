"""Orbax checkpoints of a TrainState plus the data loader's position.

Each step directory holds three items: `params`, `opt_state` (array trees) and `meta` (JSON:
step, rng, loader position). Orbax writes into a temporary directory and renames it when
complete, so a run killed mid-save leaves the previous checkpoints intact; `max_to_keep` prunes
old ones. Arrays are copied to host memory before an (asynchronous) save, because the train
step donates, and so overwrites, the device buffers of the state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from flax_transformer.training.state import TrainState

ITEMS = ("params", "opt_state", "meta")


def _host_copy(tree):
    # An array spread over several processes (multi-process training) is saved as it is:
    # each process writes the shards it owns, and Orbax copies them to host memory before
    # save() returns (its default, synchronous device-to-host transfer).
    def copy(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return x
        return np.array(x, copy=True)

    return jax.tree.map(copy, tree)


def _on_this_process(abstract_tree):
    """Restore targets without a sharding get this process's first device: a checkpoint
    written by several processes (or on another mesh) then loads whole into any process."""
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def target(leaf):
        if isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is None:
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=device)
        return leaf

    return jax.tree.map(target, abstract_tree)


class Checkpointer:
    def __init__(self, directory: str | Path, keep: int = 3, create: bool = True):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=create, cleanup_tmp_directories=True
        )
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=options,
            item_handlers={
                "params": ocp.StandardCheckpointHandler(),
                "opt_state": ocp.StandardCheckpointHandler(),
                "meta": ocp.JsonCheckpointHandler(),
            },
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(
        self,
        state: TrainState,
        loader_state: dict[str, int] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> int:
        """Saves `state` at its step; `extra` (JSON) is kept in the meta item, see `meta`."""
        step = int(state.step)
        meta = {
            "step": step,
            "rng": np.asarray(state.rng).tolist(),
            "loader": loader_state or {},
            "extra": extra or {},
        }
        self.manager.save(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(_host_copy(state.params)),
                opt_state=ocp.args.StandardSave(_host_copy(state.opt_state)),
                meta=ocp.args.JsonSave(meta),
            ),
        )
        return step

    def restore(self, abstract_state: TrainState, step: int | None = None):
        """(TrainState, loader position) of `step` (default: the latest)."""
        step = self.latest_step() if step is None else step
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardRestore(_on_this_process(abstract_state.params)),
                opt_state=ocp.args.StandardRestore(_on_this_process(abstract_state.opt_state)),
                meta=ocp.args.JsonRestore(),
            ),
        )
        meta = restored["meta"]
        rng_dtype = abstract_state.rng.dtype
        state = TrainState(
            step=jax.numpy.asarray(meta["step"], jax.numpy.int32),
            params=restored["params"],
            opt_state=restored["opt_state"],
            rng=jax.numpy.asarray(np.array(meta["rng"], dtype=rng_dtype)),
        )
        return state, meta["loader"]

    def meta(self, step: int | None = None) -> dict[str, Any]:
        """The meta item of `step` (default: the latest): step, rng, loader, extra."""
        step = self.latest_step() if step is None else step
        restored = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return restored["meta"]

    def steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def delete(self, step: int) -> None:
        self.manager.delete(step)

    def restore_params(self, abstract_params: Any, step: int | None = None):
        step = self.latest_step() if step is None else step
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardRestore(_on_this_process(abstract_params))
            ),
        )
        return restored["params"]

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
