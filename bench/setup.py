"""What every training benchmark shares: the model (a preset with overrides), the batch, the
optimiser hyper-parameters and the FLOP count. Imports no JAX or torch, so bench.flax_step,
bench.profile_step and bench.train_throughput all build on it without importing each other."""

from __future__ import annotations

import numpy as np

from flax_transformer.spec.config import TransformerConfig
from flax_transformer.spec.presets import preset

# One set of optimiser hyper-parameters for every variant (torch and optax defaults differ).
LEARNING_RATE = 1e-3
BETAS = (0.9, 0.98)
ADAM_EPS = 1e-9
WEIGHT_DECAY = 0.01
CLIP_NORM = 1.0
LABEL_SMOOTHING = 0.1

# The benchmark always trains with dropout on (as the paper), whatever the preset's own rate.
DROPOUT = 0.1
# (batch, src_len, tgt_len) of the reference run (4096 tokens a step) and of a smoke run.
REFERENCE_BATCH = (32, 64, 64)
QUICK_BATCH = (2, 8, 8)


def torch_adamw(model):
    """The benchmark's AdamW for a torch model, as the Flax optimiser (training.optim.decay_mask):
    weight decay on matrices only. Imports torch when called (this module imports neither)."""
    import torch

    params = list(model.parameters())
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": WEIGHT_DECAY},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=LEARNING_RATE, betas=BETAS, eps=ADAM_EPS)


def bench_config(
    name: str = "reference", dtype: str = "float32", dropout: float = DROPOUT, **overrides
) -> TransformerConfig:
    """A preset (flax_transformer.spec.presets) with the benchmark's dropout and dtype;
    `overrides` replace any other field."""
    return preset(name, dtype=dtype, dropout_rate=dropout, **overrides)


def make_batch(cfg: TransformerConfig, batch: int, src_len: int, tgt_len: int, seed: int = 0):
    """Random tokens; the last quarter of each other row is padding, so masks do real work."""
    if max(src_len, tgt_len) > cfg.max_len:
        raise ValueError(
            f"sequence length {max(src_len, tgt_len)} exceeds the config's max_len {cfg.max_len}"
        )
    rng = np.random.default_rng(seed)
    src = rng.integers(3, cfg.src_vocab_size, (batch, src_len), dtype=np.int32)
    tgt = rng.integers(3, cfg.tgt_vocab_size, (batch, tgt_len + 1), dtype=np.int32)
    src[1::2, -src_len // 4 :] = cfg.pad_id
    tgt[1::2, -tgt_len // 4 :] = cfg.pad_id
    return {"src": src, "tgt_in": tgt[:, :-1].copy(), "tgt_out": tgt[:, 1:].copy()}


def model_flops_per_step(cfg: TransformerConfig, batch: int, src_len: int, tgt_len: int) -> int:
    """Matmul FLOPs of one training step: 3 x forward (backward = 2 x forward).

    Counted per matmul (2 * m * n * k), attention scores and weighted sums included, masks
    ignored (the full score matrices are computed). Embedding gathers, softmax, LayerNorm and
    the optimiser are not matmuls and are left out, as is usual for MFU.
    """
    d, f, v = cfg.d_model, cfg.d_ff, cfg.tgt_vocab_size
    s_tok, t_tok = batch * src_len, batch * tgt_len
    attention_core = lambda q_len, k_len: 2 * 2 * batch * q_len * k_len * d  # QK^T and AV
    encoder_layer = s_tok * (4 * 2 * d * d + 2 * 2 * d * f) + attention_core(src_len, src_len)
    decoder_layer = (
        t_tok * 4 * 2 * d * d  # self-attention q, k, v, out
        + attention_core(tgt_len, tgt_len)
        + t_tok * 2 * 2 * d * d  # cross-attention q, out
        + s_tok * 2 * 2 * d * d  # cross-attention k, v (from the encoder output)
        + attention_core(tgt_len, src_len)
        + t_tok * 2 * 2 * d * f  # feed-forward
    )
    head = 2 * t_tok * d * v
    forward = cfg.num_encoder_layers * encoder_layer + cfg.num_decoder_layers * decoder_layer + head
    return 3 * forward
