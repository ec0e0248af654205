"""Tiny fabricated train.py workdirs for the export tests: config, run.json, tokenizer and an
Orbax checkpoint of random weights (nothing trained, nothing compiled to make them)."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import optax

from flax_transformer import TransformerConfig
from flax_transformer.data.tokenizer import ByteTokenizer
from flax_transformer.nn.kinds import abstract_variables, model_for
from flax_transformer.training.checkpoint import Checkpointer
from flax_transformer.training.state import create_train_state

CONFIG = TransformerConfig(
    src_vocab_size=259, tgt_vocab_size=259, d_model=32, num_heads=4, d_ff=48,
    num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.0, max_len=24,
)  # fmt: skip


def random_params(config: TransformerConfig, kind: str, seed: int = 0) -> dict:
    """Random weights whose greedy choices never hit pad: the output bias of pad is -100.
    (A trained model does not emit pad either; the recomputing runtimes mask pad keys in the
    target as training did, while the KV-cached decoder attends to every token it chose.)"""
    rng = np.random.default_rng(seed)
    params = jax.tree.map(
        lambda s: rng.normal(0.0, 0.3, s.shape).astype(s.dtype),
        abstract_variables(model_for(config, kind))["params"],
    )
    params["lm_head"]["bias"][config.pad_id] = -100.0
    return params


def fabricate_run(
    workdir: Path, kind: str, config: TransformerConfig = CONFIG, checkpoint: bool = True
) -> Path:
    workdir.mkdir(parents=True)
    config.save(workdir / "config.json")
    (workdir / "run.json").write_text(json.dumps({"model": kind, "tokenizer": "byte"}))
    ByteTokenizer().save(workdir / "tokenizer.json")
    if checkpoint:
        model = model_for(config, kind)
        params = random_params(config, kind)
        state = create_train_state(model, optax.sgd(0.1), seed=0, params=params)
        checkpointer = Checkpointer(workdir / "checkpoints")
        checkpointer.save(state)
        checkpointer.close()
    return workdir


def source_batch(batch: int, length: int, seed: int, pad_id: int = 0) -> np.ndarray:
    """(batch, length) byte-token ids ending in EOS (2), the first row shorter (padded)."""
    rng = np.random.default_rng(seed)
    src = rng.integers(3, 259, (batch, length)).astype(np.int32)
    src[:, -1] = 2
    if batch > 1:
        src[0, length // 2] = 2
        src[0, length // 2 + 1 :] = pad_id
    return src


def lm_prompts(batch: int, length: int, seed: int, pad_id: int = 0) -> np.ndarray:
    """Right-padded prompts starting with BOS (1), ragged lengths 2..length."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(3, 259, (batch, length)).astype(np.int32)
    prompts[:, 0] = 1
    for row in range(batch):
        prompts[row, max(2, length - row) :] = pad_id
    return prompts
