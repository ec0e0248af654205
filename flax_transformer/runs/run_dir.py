"""The run directory (`--workdir`), the application layer's record of a run: one name per file,
and the one function that writes each.

Every workflow that reads or writes a run goes through this module: training (runs/train.py;
the loop's own files, checkpoints to weights, are named in training/run_files.py and
re-exported here), `hf import`/`hf export` (runs/hf_import.py), `generate`, `score`, `export`
and `parity` (through runs/load.py's `open_run`).

name (constant)                 written by -> read by; format
config.json (CONFIG)            write_config (train, hf import) -> load_run, --resume,
                                --init-from; TransformerConfig JSON
tokenizer.json (TOKENIZER)      write_tokenizer (train, hf import) -> load_run, --resume,
                                parity --input; tokenizer description JSON
hf_tokenizer/                   write_tokenizer of an HF tokenizer (hf import) -> the HF
                                tokenizer, hf export; transformers' tokenizer files
run.json (RUN_JSON)             write_run_json (train, hf import) -> read_run_json: --resume,
                                --run-config, --init-from, load_run; JSON (model kind,
                                tokenizer kind, the run's spec, example counts, carry,
                                imported_from; "schema": RUN_JSON_SCHEMA)
hf_config.json,                 write_carry_json (hf import), write_run (--init-from) ->
hf_generation_config.json       hf export; Hugging Face JSON
checkpoints/                    the loop's Checkpointer, hf import -> load_run, --resume; Orbax
checkpoints_best/               the loop (--keep-best) -> load_run(checkpoint="best"); Orbax
checkpoints_unrestorable/       the loop (a step --resume could not read) -> people; Orbax
metrics.jsonl (METRICS)         append_metrics, truncate_metrics (loop) -> read_metrics
                                (curves.png, people); JSON lines
tensorboard/                    the loop (TensorBoardLog) -> TensorBoard; event files
profile/                        the loop (--profile-steps) -> TensorBoard / Perfetto
curves.png, attention.png       the loop (plots) -> people; PNG
confusion.png                   the loop (plots; --task classify) -> people; PNG
labels.json (LABELS)            write_labels (train --task classify) -> read_labels: the loop,
                                --resume, `ftx classify`; JSON list of label names by class
flax_params.safetensors,        write_weights (loop; with --keep-best also best_*) -> parity,
torch_model.safetensors         torch_reference, people; safetensors
results.json (RESULTS)          write_results (train) -> read_results, people; JSON
token_cache/ (TOKEN_CACHE)      token_cache.build_cache, install_cache (train on a corpus
                                file) -> the training set of the run and of --resume;
                                int32/int64 numpy files read with os.pread, meta.json
.lock (LOCK)                    lock_run_dir (train, for the whole run) -> a second train on
                                the same workdir (refused); empty but for the holder's pid

`LAYOUT` holds the same table as data (tests check a trained run against it and the docs'
table in docs/training.md against it). Reading never fails on a file cut short by a crash:
`read_run_json` / `read_results` return None.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
from pathlib import Path
from typing import Any

from flax_transformer.data.token_cache import TOKEN_CACHE  # its own module names its folder
from flax_transformer.files.atomic_io import (
    atomic_write_bytes,
    atomic_write_files,
    atomic_write_text,
)

# The files the training loop writes (and config.json, which its error lines name) are named
# beside the loop, in training/run_files.py; they are part of this layout and of this module.
from flax_transformer.training.run_files import (  # noqa: F401
    ATTENTION,
    BEST_PREFIX,
    CHECKPOINTS,
    CHECKPOINTS_BEST,
    CHECKPOINTS_UNRESTORABLE,
    CONFIG,
    CONFUSION,
    CURVES,
    FLAX_WEIGHTS,
    METRICS,
    PROFILE,
    TENSORBOARD,
    TORCH_WEIGHTS,
    append_metrics,
    checkpoint_steps,
    metrics_path,
    read_metrics,
    truncate_metrics,
    weight_paths,
    write_weights,
)

TOKENIZER = "tokenizer.json"
HF_TOKENIZER_DIR = "hf_tokenizer"  # (hf/tokenizer.py writes it beside tokenizer.json)
RUN_JSON = "run.json"
HF_CONFIG = "hf_config.json"
HF_GENERATION_CONFIG = "hf_generation_config.json"
LABELS = "labels.json"
RESULTS = "results.json"
LOCK = ".lock"
# run.json's layout: 2 records the run's spec ("spec", runs/spec.py); 0.2.x wrote the flags
# ("args") and no schema key (runs/spec.py's spec_values reads both).
RUN_JSON_SCHEMA = 2


@dataclasses.dataclass(frozen=True)
class Entry:
    """One row of the layout: a file or directory of a run directory."""

    name: str
    written_by: str
    read_by: str
    format: str
    when: str = "always"  # "always", "seq2seq" (translation models only) or the flag it needs


LAYOUT = (
    Entry(CONFIG, "write_config (train, hf import)", "load_run, --resume, --init-from",
          "TransformerConfig JSON"),
    Entry(TOKENIZER, "write_tokenizer (train, hf import)", "load_run, --resume, parity --input",
          "tokenizer description JSON"),
    Entry(HF_TOKENIZER_DIR + "/", "write_tokenizer (hf import)", "hf tokenizer, hf export",
          "transformers' tokenizer files", "hf import"),
    Entry(RUN_JSON, "write_run_json (train, hf import)",
          "read_run_json: --resume, --run-config, --init-from, load_run",
          "JSON: schema, model kind, tokenizer kind, spec, carry"),
    Entry(HF_CONFIG, "write_carry_json (hf import), write_run (--init-from)", "hf export",
          "Hugging Face config JSON", "hf import"),
    Entry(HF_GENERATION_CONFIG, "as hf_config.json", "hf export",
          "Hugging Face generation config JSON", "hf import"),
    Entry(CHECKPOINTS + "/", "the loop's Checkpointer, hf import", "load_run, --resume",
          "Orbax, one directory per step"),
    Entry(CHECKPOINTS_BEST + "/", "the loop", "load_run(checkpoint='best')", "Orbax",
          "--keep-best"),
    Entry(CHECKPOINTS_UNRESTORABLE + "/", "the loop (a step --resume could not read)", "people",
          "Orbax", "--resume"),
    Entry(METRICS, "append_metrics, truncate_metrics (loop)", "read_metrics: curves.png",
          "JSON lines"),
    Entry(TENSORBOARD + "/", "the loop (TensorBoardLog)", "TensorBoard", "event files"),
    Entry(PROFILE + "/", "the loop", "TensorBoard / Perfetto", "xplane, trace.json.gz",
          "--profile-steps"),
    Entry(CURVES, "the loop (plots)", "people", "PNG"),
    Entry(ATTENTION, "the loop (plots)", "people", "PNG", "seq2seq"),
    Entry(CONFUSION, "the loop (plots)", "people", "PNG", "--task classify"),
    Entry(LABELS, "write_labels (train --task classify)",
          "read_labels: the loop, --resume, classify", "JSON list of label names",
          "--task classify"),
    Entry(FLAX_WEIGHTS, "write_weights (loop)", "parity, people", "safetensors"),
    Entry(TORCH_WEIGHTS, "write_weights (loop)", "parity, torch_reference", "safetensors"),
    Entry(BEST_PREFIX + FLAX_WEIGHTS, "write_weights (loop)", "people", "safetensors",
          "--keep-best"),
    Entry(BEST_PREFIX + TORCH_WEIGHTS, "write_weights (loop)", "people", "safetensors",
          "--keep-best"),
    Entry(RESULTS, "write_results (train)", "read_results, people",
          "JSON: scores, examples, paths"),
    Entry(TOKEN_CACHE + "/", "token_cache.build_cache (train)", "the run, --resume",
          "numpy token files read with os.pread, meta.json", "--train-tsv"),
    Entry(LOCK, "lock_run_dir (train)", "lock_run_dir: a second run on the workdir",
          "flock for the whole run; the holder's pid"),
)  # fmt: skip


# ----------------------------------------------------------------------------- the lock
class RunDirInUse(ValueError):
    """Another process holds the run directory's lock (bad input: exit status 2)."""


class RunLock:
    """An exclusive `flock` on WORKDIR/.lock, held by one training run from its first write to
    its exit. The OS drops it when the holder dies (even by SIGKILL), so a lock is never
    stale; the file itself stays (removing it would let two processes lock two different
    files)."""

    def __init__(self, workdir: Path, fd: int):
        self.workdir, self._fd = Path(workdir), fd

    def release(self) -> None:
        """Unlock (closing the file drops the flock); a second call does nothing."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def lock_run_dir(workdir: Path) -> RunLock:
    """Lock the existing directory `workdir` for this process; RunDirInUse naming the holder's
    pid when another process has it (nothing is written then: the file exists already)."""
    path = Path(workdir) / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        raise RunDirInUse(f"--workdir {workdir} is in use by another run (pid {holder})") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return RunLock(workdir, fd)


# ----------------------------------------------------------------------------- model files
def write_config(workdir: Path, config) -> None:
    """config.json: the run's TransformerConfig."""
    config.save(Path(workdir) / CONFIG)


def read_config(workdir: Path):
    """The TransformerConfig of config.json (a ValueError naming the file when unreadable)."""
    from flax_transformer.spec.config import TransformerConfig

    return TransformerConfig.load(Path(workdir) / CONFIG)


def write_tokenizer(workdir: Path, tokenizer) -> None:
    """tokenizer.json (and, for a Hugging Face tokenizer, hf_tokenizer/ beside it)."""
    tokenizer.save(Path(workdir) / TOKENIZER)


def read_tokenizer(workdir: Path):
    """The run's tokenizer from workdir/tokenizer.json (byte, BPE or transformers); ValueError if
    it is missing or not a tokenizer file."""
    from flax_transformer.data.tokenizer import load_tokenizer

    return load_tokenizer(Path(workdir) / TOKENIZER)


def write_labels(workdir: Path, names) -> None:
    """labels.json: a classifier's label names, class 0 first (--task classify)."""
    atomic_write_bytes(Path(workdir) / LABELS, json_bytes(list(names)))


def json_bytes(data) -> bytes:
    """A run file's JSON (labels.json, run.json, a carried config): indented, one last newline."""
    return (json.dumps(data, indent=2) + "\n").encode("utf-8")


def read_labels(workdir: Path) -> tuple[str, ...] | None:
    """A classifier run's label names (class 0 first), or None when the run has no labels.json;
    a ValueError naming the file when it is not a list of distinct strings."""
    path = Path(workdir) / LABELS
    if not path.exists():
        return None
    try:
        names = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not readable JSON ({err})") from None
    if (
        not isinstance(names, list)
        or not all(isinstance(n, str) for n in names)
        or len(set(names)) != len(names)
    ):
        raise ValueError(f"{path}: expected a JSON list of distinct label names")
    return tuple(names)


# ----------------------------------------------------------------------------- run.json
def write_run_json(workdir: Path, **run_json) -> dict[str, Any]:
    """run.json (schema RUN_JSON_SCHEMA): the model kind, the tokenizer kind, the run's spec
    (runs/spec.py's record of it: what --resume and --run-config read back; {} for an
    import), the example counts, the carried files (`carry`: copied into a run
    started from this one with --init-from), for an import, where it came from, and `resumed`:
    one record per --resume that changed a setting ({"changed": {field: [before, after]}};
    `spec` holds the values now in force). The same keys whoever writes it; returns what was
    written."""
    info = run_json_record(**run_json)
    atomic_write_bytes(Path(workdir) / RUN_JSON, json_bytes(info))
    return info


def run_json_record(
    *,
    model: str,
    tokenizer: str,
    spec: dict[str, Any],
    train_examples: int | None = None,
    valid_examples: int | None = None,
    carry: list[str] | tuple[str, ...] = (),
    imported_from: str | None = None,
    resumed: list[dict] | tuple[dict, ...] = (),
) -> dict[str, Any]:
    """What run.json holds (write_run_json)."""
    return {
        "schema": RUN_JSON_SCHEMA,
        "model": model,
        "tokenizer": tokenizer,
        "spec": dict(spec),
        "train_examples": train_examples,
        "valid_examples": valid_examples,
        "carry": list(carry),
        "imported_from": imported_from,
        "resumed": list(resumed),
    }


def read_run_json(path: Path) -> dict | None:
    """A run directory's run.json (`path`: the directory or the file itself), or None when it
    is missing, cut short or not a JSON object."""
    path = Path(path)
    return _read_json_object(path / RUN_JSON if path.is_dir() else path)


def carry_files(init_dir: str | Path, names: list[str], workdir: Path) -> list[str]:
    """Copy the files an init run lists under "carry" in its run.json (`names`, e.g. an
    imported model's Hugging Face config) into a run started from it; their names."""
    for name in names:
        atomic_write_bytes(Path(workdir) / name, (Path(init_dir) / name).read_bytes())
    return list(names)


def write_carry_json(workdir: Path, name: str, data: dict) -> None:
    """A carried JSON file (hf_config.json, hf_generation_config.json) of an import."""
    if name not in (HF_CONFIG, HF_GENERATION_CONFIG):
        raise ValueError(f"{name!r} is not a carried file of a run directory")
    atomic_write_bytes(Path(workdir) / name, json_bytes(data))


CARRIED_WHAT = {HF_CONFIG: "Hugging Face config", HF_GENERATION_CONFIG: "generation config"}


def read_carried_json(workdir: Path, name: str) -> dict | None:
    """A carried JSON file of a run (hf_config.json, hf_generation_config.json), or None when
    the run has none; a ValueError naming the file when it is unreadable or not an object."""
    path = Path(workdir) / name
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # (a UnicodeDecodeError is a ValueError)
        raise ValueError(f"{path}: cannot read the {CARRIED_WHAT[name]} ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the {CARRIED_WHAT[name]} must be a JSON object")
    return data


@dataclasses.dataclass(frozen=True)
class NewRun:
    """The files a run starts with, written once (never again on --resume): its config and
    tokenizer, the files the --init-from run carries (`carry`: their names there), and a
    classifier's label names and Hugging Face config (which replaces the carried one)."""

    config: Any
    tokenizer: Any
    init_from: Path | None = None
    carry: tuple[str, ...] = ()
    labels: tuple[str, ...] | None = None
    hf_config: dict | None = None


def write_run(workdir: Path, new: NewRun | None, **run_json) -> dict[str, Any]:
    """A run's record in one go: `new`'s files (a run that starts now; None on --resume), then
    run.json (write_run_json's keywords; a new run's `carry` is what it copied). The files are
    made here and written by one call, in order, run.json last. Returns what run.json holds."""
    files: dict[str, bytes] = {}
    if new is not None:
        write_config(workdir, new.config)
        write_tokenizer(workdir, new.tokenizer)
        if new.init_from is not None:  # the init run's carried files, copied as they are
            files |= {name: (Path(new.init_from) / name).read_bytes() for name in new.carry}
            run_json["carry"] = list(new.carry)
        if new.labels is not None:
            files[LABELS] = json_bytes(list(new.labels))
        if new.hf_config is not None:  # (a classifier's, over the carried one)
            files[HF_CONFIG] = json_bytes(new.hf_config)
    info = run_json_record(**run_json)
    atomic_write_files(workdir, files | {RUN_JSON: json_bytes(info)})
    return info


# ----------------------------------------------------------------------------- results.json
def write_results(workdir: Path, results: dict[str, Any]) -> None:
    """results.json: the final scores, examples, pictures and weight paths of a run."""
    text = json.dumps(results, indent=2, ensure_ascii=False) + "\n"
    atomic_write_text(Path(workdir) / RESULTS, text)


def read_results(workdir: Path) -> dict | None:
    """results.json of a finished run, or None (unfinished, or a file cut short)."""
    return _read_json_object(Path(workdir) / RESULTS)


def _read_json_object(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
