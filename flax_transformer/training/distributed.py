"""Multi-process training with JAX's distributed runtime (`jax.distributed`).

Every process runs the same train.py. `start(options)` joins the processes before any other
JAX call: with `--coordinator HOST:PORT --num-processes N --process-id I`, or, without those
flags, inside a SLURM job step or an Open MPI `mpirun` of several tasks (JAX reads the rest from
the environment). A plain single-process run joins nothing. Then `jax.devices()` lists every
process's devices and a `--mesh` spans them all; on CPU the processes' collectives run over
TCP with gloo.

Who does what, once joined:
- data: each process builds only its own rows of every global batch (`local_batch_rows`), and
  `sharding.shard_batch` stitches them into one global array;
- checkpoints: every process takes part in each Orbax save and restore and writes the shards
  it owns (checkpoint.py);
- evaluation and decoding: every process runs them on a host copy of the whole state
  (`host_copy`), so all compute the numbers a single process would;
- files: only process 0 (`is_primary`) writes run.json, metrics, TensorBoard events,
  pictures, results and exported weights.

Failure: when a process dies, the others' next collective fails at once (its TCP connections
close); train.py then prints which process it is and why, and exits at once (`exit_now`),
without JAX's shutdown barrier, which would wait for the dead process. A process that hangs
instead is declared dead after HEARTBEAT_TIMEOUT_S, and JAX terminates every other process.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from flax_transformer.training.options import DistributedOptions
from flax_transformer.training.sharding import MeshError, batch_sharding

# A process silent for this long is declared dead and the run is stopped (JAX's default, 100
# s, is long for a test or a one-box run; a busy process still sends heartbeats).
HEARTBEAT_TIMEOUT_S = 30
# How long the processes wait for each other to start (JAX's default).
INITIALIZATION_TIMEOUT_S = 300

# Cluster environments JAX detects by itself, by the variables their launchers set, and the
# variable holding the number of processes (a one-task job is not a multi-process run).
CLUSTERS = {
    "SLURM": (
        ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID"),
        "SLURM_NTASKS",
    ),
    "Open MPI": (("OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE"), "OMPI_COMM_WORLD_SIZE"),
}


class DistributedError(RuntimeError):
    """The processes cannot be joined, or lost one another."""


def detected_cluster(environ=None) -> str | None:
    """The name of the multi-task cluster job this process runs in (see CLUSTERS), or None."""
    environ = os.environ if environ is None else environ
    for name, (variables, count) in CLUSTERS.items():
        if all(v in environ for v in variables) and environ[count].isdigit():
            if int(environ[count]) > 1:
                return name
    return None


def start(options: DistributedOptions) -> bool:
    """Joins the processes of a multi-process run; True if this is one (False: nothing done).

    Must run before any other JAX call of the process (JAX refuses to join once its backend
    is up); raises DistributedError with the reason when joining fails.
    """
    cluster = None if options.coordinator else detected_cluster()
    if not (options.coordinator or cluster):
        return False
    if jax.distributed.is_initialized():  # e.g. train.main called twice in one process
        return True
    if os.environ.get("JAX_CPU_COLLECTIVES_IMPLEMENTATION") is None:
        # CPU devices of different processes talk over TCP with gloo (JAX 0.10's default;
        # older versions had none, and a cross-process computation failed).
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    where = f"--coordinator {options.coordinator}" if options.coordinator else f"{cluster} job"
    try:
        jax.distributed.initialize(
            coordinator_address=options.coordinator,
            num_processes=options.num_processes,
            process_id=options.process_id,
            initialization_timeout=INITIALIZATION_TIMEOUT_S,
            heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S,
        )
    except (RuntimeError, ValueError) as err:
        raise DistributedError(f"cannot join the processes ({where}): {err}") from None
    return True


def joined() -> bool:
    """Whether this process has joined a multi-process run (jax.distributed is initialized)."""
    return jax.distributed.is_initialized()


def is_primary() -> bool:
    """True in process 0 (and in a single-process run): the one that writes the run's files."""
    return jax.process_index() == 0


def whoami() -> str:
    """This process as "process I of N", for log lines and messages."""
    return f"process {jax.process_index()} of {jax.process_count()}"


def barrier(name: str) -> None:
    """Every process waits here until all have arrived (a no-op in a single-process run)."""
    if joined():
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


# ----------------------------------------------------------------------------- data
def check_mesh_spans_processes(mesh: Mesh) -> None:
    """Every process must own devices in the mesh, or it has no part in the train step."""
    owners = {device.process_index for device in mesh.devices.flat}
    missing = sorted(set(range(jax.process_count())) - owners)
    if missing:
        raise MeshError(
            f"the mesh {dict(mesh.shape)} uses {mesh.devices.size} of {jax.device_count()} "
            f"devices and none of process(es) {missing}: make it use every device "
            f"({jax.device_count()} = {jax.process_count()} processes x "
            f"{jax.local_device_count()})"
        )


def local_batch_rows(mesh: Mesh, batch_size: int) -> slice:
    """The rows of each (batch_size, ...) global batch that this process's devices hold.

    The batch is split over the mesh's `data` axis; a process holds one contiguous block of
    rows (or all of them, when its devices span the whole `data` axis).
    """
    index_map = batch_sharding(mesh).addressable_devices_indices_map((batch_size,))
    return contiguous_rows([index[0] for index in index_map.values()], batch_size)


def contiguous_rows(blocks, batch_size: int) -> slice:
    """The one block of rows that `blocks` (slices of the batch axis, one per device of this
    process; replicas repeat) cover together; MeshError unless that is one contiguous block."""
    spans = sorted({block.indices(batch_size)[:2] for block in blocks})
    covered = np.zeros(batch_size, bool)
    for first, end in spans:
        covered[first:end] = True
    start, stop = spans[0][0], max(end for _, end in spans)
    if not covered[start:stop].all():
        raise MeshError(
            f"this process holds rows {spans} of each batch of {batch_size}, not one "
            "contiguous block; order the mesh's devices by process"
        )
    return slice(start, stop)


# ----------------------------------------------------------------------------- state
def host_copy(tree: Any) -> Any:
    """The whole of every array of `tree` as numpy, in every process.

    Arrays spread over several processes are first made whole (replicated) by one jitted
    program, the same in every process, which must therefore all call this together.
    """
    leaves = jax.tree.leaves(tree)
    if all(not isinstance(x, jax.Array) or x.is_fully_addressable for x in leaves):
        return jax.device_get(tree)

    def replicated(x):
        if isinstance(x.sharding, NamedSharding):
            return NamedSharding(x.sharding.mesh, P())
        raise DistributedError(f"cannot gather an array with sharding {x.sharding}")

    whole = jax.jit(lambda t: t, out_shardings=jax.tree.map(replicated, tree))(tree)
    return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), whole)


# ----------------------------------------------------------------------------- failure
# Words of the errors a collective raises when another process has gone.
_PEER_LOST = ("gloo", "connection closed", "connection reset", "heartbeat", "unavailable")


def describe_failure(err: BaseException) -> str:
    """The error as train.py prints it: in a multi-process run, which process it is, and
    whether another process has gone."""
    text = str(err).strip()
    if not joined():
        return text
    first_line = text.splitlines()[0] if text else type(err).__name__
    if isinstance(err, jax.errors.JaxRuntimeError) and any(
        word in text.lower() for word in _PEER_LOST
    ):
        return (
            f"{whoami()}: lost contact with another process ({first_line}); it has died or "
            "been stopped, see its output. Stopping. `--resume` continues the run from its "
            "last complete checkpoint."
        )
    return f"{whoami()}: {text}"


def exit_now(code: int) -> None:
    """Ends a multi-process run's process at once with `code` (returns in a single-process
    run). A normal exit would first wait for every other process at JAX's shutdown barrier;
    after a failure one of them is gone or stuck, so that would hang until it is declared dead.
    Exiting closes this process's connections, and the others' next collective fails."""
    if joined():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
