"""What every export writes besides its model files, and how: all into a temporary directory
next to the output, renamed into place at the end, so a failed export leaves nothing behind.

manifest.json (one per export directory) names the format, the model kind and config, the token
ids, the tokenizer file (copied in as tokenizer.json) and, per file, its inputs and outputs.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flax_transformer.files.atomic_io import OutputPathError, atomic_write_text, staged_directory
from flax_transformer.files.atomic_io import check_output_dir as check_dir

MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"


class ExportError(ValueError):
    """An export that cannot be made (the message names the problem and the flag or file)."""


def check_output_dir(out: Path, force: bool, run_dir: Path | None = None) -> None:
    """Refuse an --out that is a file, a non-empty directory unless force, or (force or not) one
    that is, contains or lies inside the run directory (files/atomic_io.check_output_dir)."""
    try:
        check_dir(out, inputs=[("run directory", run_dir)], force=force, what="--out")
    except OutputPathError as err:
        raise ExportError(str(err)) from None


@contextlib.contextmanager
def staged_output(out: Path, force: bool) -> Iterator[Path]:
    """Yields a fresh temporary directory beside `out`; on success it becomes `out` (an old
    `out` is replaced only then, with force), on any error it is deleted."""
    check_output_dir(out, force)  # ExportError, not OutputPathError, for the export's callers
    with staged_directory(out, force=force, what="--out") as directory:
        yield directory


def check_float32(config, fmt: str) -> None:
    """The torch-based formats are float32 graphs; the twin also keeps one dtype for params and
    computation, so a mixed-precision run (dtype != param_dtype) cannot be expressed."""
    if config.dtype != "float32" or config.param_dtype != "float32":
        raise ExportError(
            f"--format {fmt} writes float32 graphs, but this run has dtype {config.dtype!r} and "
            f"param_dtype {config.param_dtype!r} (config.json); --format stablehlo exports it "
            "as it is"
        )


def tensor_spec(name: str, dtype: str, shape: list[str | int]) -> dict[str, Any]:
    """One input or output of an exported file: its name, dtype and shape (str = dynamic)."""
    return {"name": name, "dtype": dtype, "shape": list(shape)}


def write_manifest(directory: Path, run, fmt: str, files: dict[str, Any], **extra) -> dict:
    """manifest.json and the copied tokenizer; returns the manifest."""
    run.tokenizer.save(directory / TOKENIZER)
    tok = run.tokenizer
    manifest = {
        "format": fmt,
        "model_kind": run.model_kind,
        "config": run.config.to_dict(),
        "tokens": {"pad_id": run.config.pad_id, "bos_id": tok.bos_id, "eos_id": tok.eos_id},
        "tokenizer": TOKENIZER,
        "checkpoint": {"which": run.checkpoint, "step": run.step},
        **extra,
        "files": files,
    }
    atomic_write_text(directory / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return manifest
