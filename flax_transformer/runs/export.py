"""The export workflow (`ftx export`): a run written as StableHLO, ONNX or int8 TorchScript
into an output directory, staged so that a failure leaves nothing behind;
`export(ExportSpec(...)) -> result`. cli/export.py checks the flags and builds the spec."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from flax_transformer.export.output import check_float32

FORMATS = ("stablehlo", "onnx", "torch-int8")
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")  # what jax.export lowers for


@dataclasses.dataclass(frozen=True)
class ExportSpec:
    """What to export (the run, which checkpoint), as what (a FORMATS name and its options)
    and where (out: replaced only with force)."""

    run_dir: Path
    format: str
    out: Path
    force: bool = False
    checkpoint: str | None = None
    int8: bool = False  # stablehlo: int8 weights
    max_new_tokens: int | None = None  # stablehlo: greedy.stablehlo's length (None: default)
    opset: int = 18  # onnx
    platforms: tuple[str, ...] = ("cpu",)  # stablehlo


def export(spec: ExportSpec) -> dict:
    """Load the run and write the export; {"format", "output", "files"}. RunLoadError or
    ExportError (ValueErrors) naming the problem."""
    from flax_transformer.export.output import staged_output
    from flax_transformer.runs.load import open_run

    run = open_run(spec.run_dir, spec.checkpoint)
    with staged_output(spec.out, spec.force) as directory:
        manifest = export_run(run, spec, directory)
    files = [entry["file"] for entry in manifest["files"].values()]
    return {"format": spec.format, "output": str(spec.out),
            "files": [*files, "manifest.json", "tokenizer.json"]}  # fmt: skip


def export_run(run, spec: ExportSpec, directory: Path) -> dict:
    """Writes the chosen format's files into `directory`; returns the manifest."""
    if spec.format != "stablehlo":
        check_float32(run.config, spec.format)  # before torch is imported
    if spec.format == "stablehlo":
        from flax_transformer.export.stablehlo import default_max_new_tokens, export_stablehlo

        n = spec.max_new_tokens or default_max_new_tokens(run.config, run.model_kind)
        return export_stablehlo(
            run, directory, max_new_tokens=n, int8=spec.int8, platforms=spec.platforms
        )
    if spec.format == "onnx":
        from flax_transformer.export.onnx_graphs import export_onnx

        return export_onnx(run, directory, opset=spec.opset)
    from flax_transformer.export.torch_int8 import export_torch_int8

    return export_torch_int8(run, directory)
