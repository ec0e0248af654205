"""Orbax checkpoints of a TrainState plus the data loader's position.

Each step directory holds three items: `params`, `opt_state` (array trees) and `meta` (JSON:
step, rng, loader position). Orbax writes into a temporary directory and renames it when
complete, so a run killed mid-save leaves the previous checkpoints intact; `max_to_keep` prunes
old ones. Arrays are copied to host memory before an (asynchronous) save, because the train
step donates, and so overwrites, the device buffers of the state.

Failures are one exception each, with a message, never a wall of Orbax tracebacks: a save that
cannot be written is a `CheckpointWriteError` (the directory is probed before Orbax starts), a
checkpoint that cannot be read a `CheckpointReadError` naming the step and what is damaged
(checkpoint_files.py); `restore_newest` falls back to older checkpoints and deletes nothing.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from flax_transformer.files.atomic_io import remove_tree
from flax_transformer.files.space import is_out_of_space
from flax_transformer.interop.safetensors_stream import LazyArray
from flax_transformer.training.checkpoint_files import damage, record_files, short_error
from flax_transformer.training.distributed import is_primary
from flax_transformer.training.state import TrainState

ITEMS = ("params", "opt_state", "meta")


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written; `step` is the one lost."""

    def __init__(self, message: str, step: int | None, disk_full: bool = False, filename=None):
        super().__init__(message)
        self.step, self.disk_full = step, disk_full
        _ORBAX_FILTER.write_failed = True
        self.filename = filename  # the step directory (named by out-of-space messages)


# Orbax writes a step into "<step>.orbax-checkpoint-tmp-<time>" and renames it when complete.
TMP_SUFFIX = ".orbax-checkpoint-tmp"


def is_disk_full(err: BaseException) -> bool:
    """A full disk, quota or file-size limit, also inside an Orbax / tensorstore error."""
    return is_out_of_space(err)


class CheckpointReadError(ValueError):
    """A checkpoint could not be restored; the message names the step and the damage."""


def _probe_writable(directory: Path) -> None:
    """Raise OSError unless a file can be created (and removed) in `directory`."""
    probe = directory / f".write_probe_{uuid.uuid4().hex}"
    fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_EXCL)
    os.close(fd)
    os.unlink(probe)


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


class _OrbaxErrorsWeReport(logging.Filter):
    """Drops Orbax's own ERROR log records (a traceback from its background thread for a
    failed write), and asyncio's "exception was never retrieved" records once a write has
    failed (the rest of that save's writes, failing the same way): every such failure reaches
    the caller as a CheckpointWriteError, said in one line. Other records pass."""

    write_failed = False  # set when a CheckpointWriteError is raised

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        if record.name == "asyncio":
            return not (self.write_failed and "never retrieved" in str(record.msg))
        return f"{os.sep}orbax{os.sep}" not in (record.pathname or "")


_ORBAX_FILTER = _OrbaxErrorsWeReport()


def _quiet_orbax_write_errors() -> None:
    """Install the filter on absl's logger, through which Orbax logs, and the unraisable hook
    below (once per process)."""
    for name in ("absl", "asyncio"):
        logger = logging.getLogger(name)
        if _ORBAX_FILTER not in logger.filters:
            logger.addFilter(_ORBAX_FILTER)
    if sys.unraisablehook is not _drop_closed_loop_callbacks:
        _drop_closed_loop_callbacks.previous = sys.unraisablehook
        sys.unraisablehook = _drop_closed_loop_callbacks


def _drop_closed_loop_callbacks(unraisable) -> None:
    """After a failed write, tensorstore's remaining write callbacks find Orbax's event loop
    closed and raise where nothing can catch them (dozens of tracebacks after the one line that
    says what failed). Those are dropped; any other unraisable error is printed as usual."""
    err = unraisable.exc_value
    if isinstance(err, RuntimeError) and str(err) == "Event loop is closed":
        return
    _drop_closed_loop_callbacks.previous(unraisable)


_drop_closed_loop_callbacks.previous = sys.__unraisablehook__


def _array_handler(compress: bool) -> ocp.StandardCheckpointHandler:
    """Orbax's StandardCheckpointHandler, its arrays zstd-compressed or not. (The switch is
    its inner PyTreeCheckpointHandler's: the handler, and so what restores it, stays the same.)"""
    handler = ocp.StandardCheckpointHandler()
    if not compress:
        handler._impl = ocp.PyTreeCheckpointHandler(
            save_concurrent_gb=96, restore_concurrent_gb=96, use_compression=False
        )
    return handler


class Checkpointer:
    """The Orbax checkpoints of one run in `directory` (the last `keep` steps): asynchronous
    saves, restores that name what is damaged."""

    def __init__(
        self, directory: str | Path, keep: int = 3, create: bool = True, compress: bool = True
    ):
        """`compress=False` writes the arrays without zstd: as fast as the disk, and without
        the encoded copy tensorstore holds while it compresses (about the arrays' size again;
        hf import of a multi-GB checkpoint). Any Checkpointer restores either."""
        _quiet_orbax_write_errors()
        self.directory = Path(directory).absolute()
        self._pending: int | None = None  # the step of a save that may still be in flight
        self._failed = False
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=create, cleanup_tmp_directories=True
        )
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=options,
            item_handlers={
                "params": _array_handler(compress),
                "opt_state": ocp.StandardCheckpointHandler(),
                "meta": ocp.JsonCheckpointHandler(),
            },
        )

    def latest_step(self) -> int | None:
        """The newest saved step, or None when there is no checkpoint."""
        return self.manager.latest_step()

    def save(
        self,
        state: TrainState,
        loader_state: dict[str, int] | None = None,
        extra: dict[str, Any] | None = None,
        host_copy: bool = True,
    ) -> int:
        """Saves `state` at its step; `extra` (JSON) is kept in the meta item, see `meta`.
        `host_copy=False` saves the arrays as they are, without the host copy a donated train
        state needs: for a caller whose arrays nothing changes until `wait` (hf import of a
        multi-GB checkpoint, which a copy would double)."""
        copy = _host_copy if host_copy else (lambda tree: tree)
        step = int(state.step)
        self.wait()  # the previous save is complete (or its failure reported) first
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            _probe_writable(self.directory)
        except OSError as err:
            self._failed = True
            raise CheckpointWriteError(
                f"cannot write checkpoint step {step} into {self.directory} "
                f"({err.strerror or err})",
                step,
                is_disk_full(err),
                self.directory / str(step),
            ) from None
        meta = {
            "step": step,
            "rng": np.asarray(state.rng).tolist(),
            "loader": loader_state or {},
            "extra": extra or {},
        }
        try:
            self.manager.save(
                step,
                args=ocp.args.Composite(
                    params=ocp.args.StandardSave(copy(state.params)),
                    opt_state=ocp.args.StandardSave(copy(state.opt_state)),
                    meta=ocp.args.JsonSave(meta),
                ),
            )
        except Exception as err:  # Orbax raises many types; the message is what matters
            self._failed = True
            raise CheckpointWriteError(
                f"cannot write checkpoint step {step} into {self.directory} ({short_error(err)})",
                step,
                is_disk_full(err),
                self.directory / str(step),
            ) from None
        self._pending = step
        return step

    def _restore(self, step: int, **items):
        """Orbax's restore of `items`; a failure is a CheckpointReadError saying what is wrong."""
        try:
            return self.manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as err:  # Orbax / tensorstore raise many types
            why = damage(self.directory / str(step)) or short_error(err)
            raise CheckpointReadError(
                f"checkpoint step {step} in {self.directory} cannot be restored: {why}"
            ) from None

    def restore(self, abstract_state: TrainState, step: int | None = None):
        """(TrainState, loader position) of `step` (default: the latest)."""
        step = self.latest_step() if step is None else step
        restored = self._restore(
            step,
            params=ocp.args.StandardRestore(_on_this_process(abstract_state.params)),
            opt_state=ocp.args.StandardRestore(_on_this_process(abstract_state.opt_state)),
            meta=ocp.args.JsonRestore(),
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

    def restore_newest(self, abstract_state: TrainState, set_aside: Path):
        """(TrainState, loader position, skipped) from the newest checkpoint that restores.

        `skipped` lists (step, why) for the newer ones that did not; each is moved, not
        deleted, into `set_aside`/<step> (so the resumed run can save that step again)."""
        skipped = []
        for step in sorted(self.steps(), reverse=True):
            try:
                state, loader = self.restore(abstract_state, step)
            except CheckpointReadError as err:
                skipped.append((step, str(err)))
                continue
            for bad_step, _ in skipped:
                set_aside.mkdir(parents=True, exist_ok=True)
                os.replace(self.directory / str(bad_step), set_aside / str(bad_step))
            if skipped:
                self.manager.reload()
            return state, loader, skipped
        reasons = "; ".join(why for _, why in skipped) or "there is none"
        raise CheckpointReadError(f"no checkpoint in {self.directory} can be restored: {reasons}")

    def meta(self, step: int | None = None) -> dict[str, Any]:
        """The meta item of `step` (default: the latest): step, rng, loader, extra."""
        step = self.latest_step() if step is None else step
        return self._restore(step, meta=ocp.args.JsonRestore())["meta"]

    def finished_steps(self) -> list[int]:
        """The step directories on disk (Orbax renames a save into place when it is complete)."""
        if not self.directory.is_dir():
            return []
        return sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit())

    def steps(self) -> list[int]:
        """Every step that has a checkpoint."""
        return list(self.manager.all_steps())

    def delete(self, step: int) -> None:
        """Remove the checkpoint of `step`."""
        self.manager.delete(step)

    def restore_params(self, abstract_params: Any, step: int | None = None):
        """Only the params of `step` (default: the latest), shaped like `abstract_params`;
        CheckpointReadError naming the step if it cannot be read."""
        step = self.latest_step() if step is None else step
        return self._restore(
            step, params=ocp.args.StandardRestore(_on_this_process(abstract_params))
        )["params"]

    def lazy_params(self, abstract_params: Any, step: int | None = None):
        """The params of `step` (default: the latest) shaped like `abstract_params`, each leaf a
        LazyArray restored (as a numpy array) when it is read: a writer that reads them in turn
        (hf export) holds at most one layer at a time, never the whole model. The unread leaves
        of one module group (the first two levels of the path: `decoder/layers_3`) are
        restored together on the first read of any of them (one Orbax call per layer, not per
        tensor), each let go once read, the group's rest when another group is read.
        CheckpointReadError naming the step and the group if one cannot be read."""
        step = self.latest_step() if step is None else step
        directory = self.directory / str(step) / "params"
        groups: dict[tuple[str, ...], dict[tuple[str, ...], Any]] = {}
        for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_params)[0]:
            keys = tuple(str(k.key) for k in path)
            groups.setdefault(keys[:2], {})[keys] = leaf
        held: dict[tuple[str, ...], dict[tuple[str, ...], np.ndarray]] = {}
        unread = {group: set(leaves) for group, leaves in groups.items()}

        def restore(group: tuple[str, ...], wanted: set) -> dict[tuple[str, ...], np.ndarray]:
            item: dict = {}
            args: dict = {}
            for keys, leaf in groups[group].items():
                if keys not in wanted:
                    continue
                node_item, node_args = item, args
                for key in keys[:-1]:
                    node_item = node_item.setdefault(key, {})
                    node_args = node_args.setdefault(key, {})
                node_item[keys[-1]] = leaf
                node_args[keys[-1]] = ocp.RestoreArgs(restore_type=np.ndarray, dtype=leaf.dtype)
            # A reader per restore, closed at once: one left open (or closed by the garbage
            # collector) has its background thread write a traceback at exit.
            try:
                with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as reader:
                    tree = reader.restore(
                        directory,
                        args=ocp.args.PyTreeRestore(item, restore_args=args, partial_restore=True),
                    )
            except Exception as err:  # Orbax / tensorstore raise many types
                why = damage(self.directory / str(step)) or short_error(err)
                raise CheckpointReadError(
                    f"checkpoint step {step} in {self.directory}: parameters "
                    f"{'/'.join(group)} cannot be restored: {why}"
                ) from None
            out = {}
            for keys in wanted:
                node = tree
                for key in keys:
                    node = node[key]
                out[keys] = node
            return out

        def lazy(keys: tuple[str, ...], leaf) -> LazyArray:
            group = keys[:2]

            def read() -> np.ndarray:
                arrays = held.get(group)
                if arrays is None or keys not in arrays:  # its group's first read (or again)
                    # One group in memory at a time: a group's leaves that another group's
                    # reads come between (GPT-2's fused c_attn, written after the rest) are
                    # restored again when asked for, not held meanwhile.
                    held.clear()
                    arrays = held[group] = restore(group, unread[group] | {keys})
                array = arrays.pop(keys)
                unread[group].discard(keys)
                if not arrays:
                    del held[group]
                return array

            return LazyArray(leaf.shape, leaf.dtype, read, owned=True)

        return jax.tree_util.tree_map_with_path(
            lambda path, leaf: lazy(tuple(str(k.key) for k in path), leaf), abstract_params
        )

    def param_shapes(self, step: int) -> dict[tuple[str, ...], tuple[int, ...]]:
        """{Flax path: shape} of the params saved at `step`, read from Orbax's metadata (no
        array is loaded)."""
        try:
            tree = self.manager.item_metadata(step)["params"]
            leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
        except Exception as err:
            why = damage(self.directory / str(step)) or short_error(err)
            raise CheckpointReadError(
                f"checkpoint step {step} in {self.directory} cannot be read: {why}"
            ) from None
        return {tuple(str(k.key) for k in path): tuple(leaf.shape) for path, leaf in leaves}

    def wait(self) -> None:
        """Until the save in flight is on disk; its file list is then recorded."""
        if self._pending is None:
            return
        step, self._pending = self._pending, None
        try:
            self.manager.wait_until_finished()
            if is_primary():
                # One writer: two processes listing the directory while the other's list is
                # being renamed into place was a failed run (an intermittent exit 1).
                record_files(self.directory / str(step))
        except Exception as err:
            self._failed = True
            raise CheckpointWriteError(
                f"cannot write checkpoint step {step} into {self.directory} ({short_error(err)})",
                step,
                is_disk_full(err),
                self.directory / str(step),
            ) from None

    def remove_unfinished(self) -> list[Path]:
        """Delete the temporary directories of saves that never completed (a run stopped by
        Ctrl-C, SIGTERM or a full disk mid-save; call after `close`); what was removed."""
        if not self.directory.is_dir():
            return []
        unfinished = [p for p in self.directory.iterdir() if TMP_SUFFIX in p.name]
        for path in unfinished:
            remove_tree(path)  # (outlasting tensorstore threads still writing into it)
        return unfinished

    def close(self) -> None:
        """Waits for the save in flight; after a failure already reported, closes quietly."""
        try:
            self.wait()
        finally:
            try:
                self.manager.close()
            except Exception:
                if not self._failed:
                    raise
