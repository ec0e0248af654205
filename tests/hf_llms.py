"""Tiny Llama-lineage models (Llama, Mistral, Qwen2, Qwen3) that transformers builds and trains
briefly, saved with save_pretrained: one per variant the family battery (test_hf_llms.py)
checks. Nothing is downloaded.

Sizes keep d_model (24), d_ff (40), the heads' width and the vocabulary (61) apart, so a wrong
transpose is a shape error.
"""

from __future__ import annotations

import numpy as np
import torch

from flax_transformer.parity.hf_decoder import (
    left_padded_positions,
    transformers_float64_norms_and_rotary,
)

VOCAB, BOS, EOS = 61, 1, 2
SIZES = dict(
    vocab_size=VOCAB,
    hidden_size=24,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    bos_token_id=BOS,
    eos_token_id=EOS,
    rms_norm_eps=1e-6,
)
LLAMA3 = dict(
    rope_type="llama3",
    rope_theta=500.0,
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=16,
)
YARN = dict(rope_type="yarn", rope_theta=1000.0, factor=4.0, original_max_position_embeddings=16)
WINDOW = 4  # shorter than the test batch's rows (up to 11 tokens)
# name: (transformers class prefix, config changes); the variants issue 39 lists.
CELLS = {
    "llama_gqa": ("Llama", dict(num_key_value_heads=2)),
    "llama_mqa_llama3_tied": (
        "Llama",
        dict(num_key_value_heads=1, rope_parameters=LLAMA3, tie_word_embeddings=True),
    ),
    "mistral_window": ("Mistral", dict(num_key_value_heads=2, sliding_window=WINDOW)),
    "qwen2_biases_yarn_window_tied": (
        "Qwen2",
        dict(
            num_key_value_heads=2,
            rope_parameters=YARN,
            use_sliding_window=True,
            sliding_window=WINDOW,
            max_window_layers=1,
            tie_word_embeddings=True,
        ),
    ),
    "qwen3_norms": (
        "Qwen3",
        dict(num_key_value_heads=2, head_dim=10, rope_parameters=dict(rope_theta=1e6)),
    ),
}
# Gemma 2 / 3: head_dim and query_pre_attn_scalar apart from d_model / heads; caps small
# enough that the tiny models' logits reach them (the defaults 50 / 30 would not matter here);
# a local (sliding, first) and a global layer.
GEMMA2 = dict(
    num_key_value_heads=2,
    head_dim=10,
    query_pre_attn_scalar=8,
    sliding_window=WINDOW,
    attn_logit_softcapping=1.0,
    final_logit_softcapping=3.0,
)
GEMMA3_ROPE = {
    "full_attention": dict(rope_type="linear", factor=2.0, rope_theta=1000.0),
    "sliding_attention": dict(rope_type="default", rope_theta=10.0),
}
CELLS.update(
    gemma_mqa_tied=("Gemma", dict(num_key_value_heads=1, head_dim=10)),
    gemma2_softcap_local_global=("Gemma2", GEMMA2),
    gemma3_local_rope=(
        "Gemma3",
        dict(
            GEMMA2,
            attn_logit_softcapping=None,
            final_logit_softcapping=None,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters=GEMMA3_ROPE,
        ),
    ),
)
# Phi-3: GQA through the fused qkv_proj (q 24 wide, k and v 12), half of each 12-wide head
# turned, longrope's long table past 13 tokens (the battery's batch and generation stay within
# it; test_hf_llms.py checks the long table on a wider batch, test_hf_longrope_generation.py
# generation across it).
PHI3_ROPE = dict(
    rope_type="longrope",
    rope_theta=100.0,
    partial_rotary_factor=0.5,
    short_factor=[1.0, 1.3, 2.0],
    long_factor=[1.5, 4.0, 9.0],
)
CELLS["phi3_fused_longrope_partial"] = (
    "Phi3",
    dict(
        num_attention_heads=2,
        num_key_value_heads=1,
        original_max_position_embeddings=13,
        rope_parameters=PHI3_ROPE,
        pad_token_id=0,
    ),
)
# The transformers classes of a prefix whose config class is not f"{prefix}Config".
CLASSES = {"Gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM")}
TRAIN_STEPS = 8


def build(name: str, seed: int = 0, steps: int = TRAIN_STEPS):
    """The transformers model of cell `name`, trained `steps` Adam steps to count (each
    token the previous + 1: its continuations vary, so EOS ids end rows at different steps;
    no weight sits at its init: norms away from 1, biases away from 0), returned in eval mode,
    float32. steps=0: transformers' random init (small logit margins: tokens that a change of
    rotary table moves)."""
    import transformers

    prefix, changes = CELLS[name]
    config_class, model_class = CLASSES.get(prefix, (f"{prefix}Config", f"{prefix}ForCausalLM"))
    config = getattr(transformers, config_class)(**{**SIZES, **changes})
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config)
    rng = np.random.default_rng(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-2)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only contend
    try:
        for _ in range(steps):  # counting: each token the previous one + 1
            start = rng.integers(0, VOCAB - 3, (8, 1))
            ids = torch.from_numpy((start + np.arange(12)) % (VOCAB - 3) + 3)
            loss = model(input_ids=ids, labels=ids).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def left_padded(rng: np.random.Generator, lengths=(11, 6, 9, 3)):
    """(input_ids, attention_mask, position_ids) of a left-padded ragged batch (pads 0, real
    tokens in [3, VOCAB)), position_ids as transformers' generate makes them."""
    width = max(lengths)
    mask = (np.arange(width)[None] >= width - np.asarray(lengths)[:, None]).astype(np.int64)
    ids = np.where(mask == 1, rng.integers(3, VOCAB, (len(lengths), width)), 0)
    positions = left_padded_positions(mask)
    return ids, mask, positions


# transformers' parts that compute in float32 even in a float64 model, in float64 (the parity
# report's patch, parity/hf_decoder.py, where its docstring lists them).
float64_norms_and_rotary = transformers_float64_norms_and_rotary


class Models(dict):
    """{cell: (transformers model, saved directory)}, built and trained on first use (the
    session fixture `llms` of conftest.py holds one)."""

    def __init__(self, tmp_path_factory):
        super().__init__()
        self.tmp_path_factory = tmp_path_factory

    def __missing__(self, name):
        torch_model = build(name)
        path = self.tmp_path_factory.mktemp(name)
        torch_model.save_pretrained(path)
        self[name] = (torch_model, path)
        return self[name]
