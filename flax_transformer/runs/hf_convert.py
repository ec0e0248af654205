"""A Hugging Face directory as a run directory and back: the conversions under `ftx hf`
(runs/hf.py: the workflows, their specs and checks).

import: config.json (the TransformerConfig), tokenizer.json + hf_tokenizer/ (transformers'
tokenizer, hf/tokenizer.py), run.json, checkpoints/0 (the weights; no optimizer state:
fine-tune with `train.py --init-from`, there is nothing to --resume), and the Hugging Face
config and generation config (hf_config.json, hf_generation_config.json), which run.json lists
under "carry" so that a run started with --init-from keeps them for the export.
export: the chosen checkpoint of such a run (or of one fine-tuned from it) through hf.save,
into a staged directory renamed at the end (a non-empty HF_DIR is replaced only with force).
Neither writes into, over or around its input (files/atomic_io.check_not_input).
Every file of the run directory is named and written by runs/run_dir.py.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.files.atomic_io import check_not_input, check_output_dir, staged_directory
from flax_transformer.hf.checkpoint import read_json
from flax_transformer.hf.config import hf_to_config
from flax_transformer.hf.model import HFModel, load, save
from flax_transformer.hf.shards import DEFAULT_MAX_SHARD_SIZE
from flax_transformer.hf.tokenizer import HF_TOKENIZER_DIR, HFTokenizer
from flax_transformer.runs import run_dir as layout
from flax_transformer.runs.load import open_run
from flax_transformer.runs.run_dir import HF_CONFIG, HF_GENERATION_CONFIG
from flax_transformer.spec.config import config_diff
from flax_transformer.spec.kinds import ENCODER, LM, SEQ2SEQ, check_kind
from flax_transformer.training.checkpoint import Checkpointer
from flax_transformer.training.state import TrainState

# Fields a run may change without changing the model it exports (dtype: a run fine-tuned with
# --dtype bfloat16 computes in bf16 on the same float32 parameters).
EXPORT_IGNORES = ("attention_impl", "remat", "dtype")


def import_run(hf_dir: str | Path, run_dir: str | Path, dtype: str = "float32") -> Path:
    """Write `run_dir` (new or empty) from the save_pretrained directory `hf_dir`, its
    parameters (and computation) in `dtype`. The weights are read one tensor at a time and
    checkpointed without a host copy: about the checkpoint's bytes in memory (in bfloat16)."""
    hf_dir, run_dir = Path(hf_dir), Path(run_dir)
    check_not_input(run_dir, [("Hugging Face directory", hf_dir)], what="run directory")
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise ValueError(f"{run_dir} exists and is not an empty directory; nothing was written")
    model = load(hf_dir, dtype=dtype)
    if model.tokenizer is None:
        raise ValueError(
            f"{hf_dir}: no tokenizer files (or transformers is not installed); a run directory "
            "needs its tokenizer"
        )
    cfg = model.config
    kind = check_kind(model.kind)
    # The decoder's first token: an LM's bos, a seq2seq model's decoder start; a bare encoder
    # decodes nothing (its tokenizer's bos is the pad id, never used).
    first = {LM: cfg.bos_id, SEQ2SEQ: cfg.decoder_start_id}.get(kind, cfg.pad_id)
    # (BERT's config.json names no eos_token_id: a bare encoder ends nothing, so pad stands in.)
    eos = cfg.pad_id if kind == ENCODER and cfg.eos_id is None else cfg.eos_id
    if first is None or eos is None:
        what = "bos_token_id" if kind == LM else "decoder_start_token_id"
        raise ValueError(f"{hf_dir}/config.json: a run needs {what} and eos_token_id")
    # Written whole into a staging directory that becomes run_dir at the end: an interrupted
    # or failed import leaves nothing behind that would block a retry.
    with staged_directory(run_dir, what="run directory") as staging:
        layout.write_config(staging, cfg)
        tokenizer = HFTokenizer(
            model.tokenizer,
            pad_id=cfg.pad_id,
            bos_id=first,
            eos_id=eos,
            vocab_size=cfg.tgt_vocab_size,
        )
        layout.write_tokenizer(staging, tokenizer)
        carry = [HF_CONFIG]
        layout.write_carry_json(staging, HF_CONFIG, model.hf_config)
        if model.generation_config:
            carry.append(HF_GENERATION_CONFIG)
            layout.write_carry_json(staging, HF_GENERATION_CONFIG, model.generation_config)
        layout.write_run_json(
            staging, model=kind, tokenizer=tokenizer.kind, spec={}, carry=carry,
            imported_from=str(hf_dir),
        )  # fmt: skip
        # Uncompressed: compressing holds a second, encoded copy of the weights while it runs.
        checkpointer = Checkpointer(staging / layout.CHECKPOINTS, compress=False)
        try:
            state = TrainState(
                step=jnp.array(0, jnp.int32),
                params=model.variables["params"],
                opt_state={"none": np.zeros((), np.int32)},  # Orbax stores no empty item
                rng=jax.random.PRNGKey(0),
            )
            del model  # the state holds the params; nothing else does
            checkpointer.save(state, host_copy=False)  # nothing overwrites them mid-save
        finally:
            checkpointer.close()
    return run_dir


def export_run(
    run_dir: str | Path,
    hf_dir: str | Path,
    checkpoint: str | None = None,
    force: bool = False,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Write the run's checkpoint (load_run's choice, or `checkpoint`) as a save_pretrained
    directory, whole or not at all: a non-empty `hf_dir` is replaced only with `force`, and
    never when it is, contains or lies inside the run. The run must come from an import (it
    carries hf_config.json)."""
    run_dir, hf_dir = Path(run_dir), Path(hf_dir)
    check_output_dir(hf_dir, inputs=[("run directory", run_dir)], force=force, what="HF_DIR")
    if not (run_dir / HF_CONFIG).exists():
        raise ValueError(
            f"{run_dir}: no {HF_CONFIG}; only runs imported from (or started with --init-from "
            "an import of) a Hugging Face directory can be exported"
        )
    hf_config = read_json(run_dir / HF_CONFIG, "Hugging Face config")
    generation = run_dir / HF_GENERATION_CONFIG
    generation_config = read_json(generation, "generation config") if generation.exists() else {}
    # Each parameter is restored when hf.save writes it: one tensor in memory at a time.
    run = open_run(run_dir, checkpoint, lazy=True)
    expected, _ = hf_to_config(hf_config, run.config.param_dtype, where=str(run_dir / HF_CONFIG))
    diff = config_diff(expected, run.config, ignore=EXPORT_IGNORES)
    if diff:
        raise ValueError(
            f"{run_dir}/config.json no longer matches {HF_CONFIG}: "
            + ", ".join(f"{k}: {b!r} (Hugging Face: {a!r})" for k, (a, b) in diff.items())
        )
    model = HFModel(
        module=run.model,
        variables=run.params,
        config=run.config,
        hf_config=hf_config,
        generation_config=generation_config,
        source=run_dir / HF_TOKENIZER_DIR,
    )
    with staged_directory(hf_dir, force=force, what="HF_DIR") as staging:
        # No old file of a replaced HF_DIR stays beside the new ones.
        save(model, staging, max_shard_size)
    return hf_dir
