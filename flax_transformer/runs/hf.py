"""The Hugging Face workflows (`ftx hf import | export`): a save_pretrained directory as a run
directory, and such a run (or one fine-tuned from it) back; `hf_import(HFImportSpec(...))` and
`hf_export(HFExportSpec(...))` -> HFOutcome. Each checks its paths first (before JAX or
transformers are imported: a refused command is quick), then converts (runs/hf_convert.py), then
reads back what it wrote for the outcome. cli/hf.py builds the spec from its flags and says the
outcome."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from flax_transformer.runs.spec import UsageError


@dataclasses.dataclass(frozen=True)
class HFImportSpec:
    """Import the save_pretrained directory `hf_dir` as the run directory `workdir` (new or
    empty), its parameters in `dtype`."""

    hf_dir: Path
    workdir: Path
    dtype: str = "float32"  # or "bfloat16"


@dataclasses.dataclass(frozen=True)
class HFExportSpec:
    """Export a checkpoint of the run `workdir` (None: the best when it kept one, else the last)
    as a save_pretrained directory `out`, replaced only with `force`; weight files of at most
    `max_shard_size` (bytes, or save_pretrained's "5GB" / "500MB")."""

    workdir: Path
    out: Path
    checkpoint: str | None = None
    force: bool = False
    max_shard_size: int | str = "50GB"


@dataclasses.dataclass(frozen=True)
class HFOutcome:
    """What a workflow wrote: the command ("import" or "export"), its output directory, the
    run directory and the Hugging Face directory involved, the model (family, kind, layers,
    d_model, heads, vocab, dtype) and, for an export, the files written."""

    command: str
    output: Path
    run_dir: Path
    hf_dir: Path
    model: dict
    files: tuple[str, ...] = ()


def hf_import(spec: HFImportSpec) -> HFOutcome:
    """Write the run directory; UsageError for an output that is, holds or lies inside the
    input, or a missing HF_DIR; ValueError / ConversionError for a directory that cannot be
    converted."""
    from flax_transformer.files.atomic_io import OutputPathError, check_not_input

    try:
        check_not_input(spec.workdir, [("Hugging Face directory", spec.hf_dir)], what="--workdir")
    except OutputPathError as err:
        raise UsageError(str(err)) from None
    if not Path(spec.hf_dir).exists():
        raise UsageError(
            f"HF_DIR {spec.hf_dir} does not exist; give a local directory written by "
            "save_pretrained (Hub ids are not downloaded: save one first, e.g. "
            f"AutoModelForSeq2SeqLM.from_pretrained({str(spec.hf_dir)!r}).save_pretrained("
            f"'./{Path(spec.hf_dir).name}') and the same for its tokenizer)"
        )
    from flax_transformer.runs.hf_convert import import_run

    out = Path(import_run(spec.hf_dir, spec.workdir, dtype=spec.dtype))
    from flax_transformer.runs import run_dir as layout

    hf_config = json.loads((out / layout.HF_CONFIG).read_text())
    return HFOutcome("import", out, out, Path(spec.hf_dir), model_summary(out, hf_config))


def hf_export(spec: HFExportSpec) -> HFOutcome:
    """Write the save_pretrained directory; UsageError for an --out that is, holds or lies inside
    the run (or is not empty, without force), or a bad shard size; ValueError (RunLoadError
    among them) for a run that cannot be exported."""
    from flax_transformer.files.atomic_io import OutputPathError, check_output_dir
    from flax_transformer.hf.shards import parse_shard_size

    inputs = [("run directory", spec.workdir)]
    try:
        check_output_dir(spec.out, inputs=inputs, force=spec.force, what="--out")
        parse_shard_size(spec.max_shard_size)
    except (OutputPathError, ValueError) as err:
        raise UsageError(str(err)) from None
    from flax_transformer.runs.hf_convert import export_run

    out = Path(
        export_run(
            spec.workdir, spec.out, spec.checkpoint, force=spec.force,
            max_shard_size=spec.max_shard_size,
        )
    )  # fmt: skip
    hf_config = json.loads((out / "config.json").read_text())
    files = tuple(sorted(p.name for p in out.iterdir()))
    return HFOutcome(
        "export", out, Path(spec.workdir), out, model_summary(Path(spec.workdir), hf_config), files
    )


def model_summary(run: Path, hf_config: dict) -> dict:
    """The model of a run directory, as a person asks for it: its Hugging Face family, kind,
    layers, width, heads, vocabulary and parameter dtype."""
    from flax_transformer.runs import run_dir as layout

    config = layout.read_config(run)
    kind = (layout.read_run_json(run) or {}).get("model", "?")
    layers = (
        config.num_encoder_layers if kind == "encoder" else config.num_decoder_layers
        if kind == "lm" else f"{config.num_encoder_layers}+{config.num_decoder_layers}"
    )  # fmt: skip
    return {
        "family": hf_config.get("model_type"), "kind": kind, "layers": layers,
        "d_model": config.d_model, "heads": config.num_heads,
        "vocab": config.tgt_vocab_size, "dtype": config.param_dtype,
    }  # fmt: skip
