"""Tiny Llama-lineage models (Llama, Mistral, Qwen2, Qwen3) that transformers builds and trains
briefly, saved with save_pretrained: one per variant the family battery (test_hf_llms.py)
checks. Nothing is downloaded.

Sizes keep d_model (24), d_ff (40), the heads' width and the vocabulary (61) apart, so a wrong
transpose is a shape error.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

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
TRAIN_STEPS = 8


def build(name: str, seed: int = 0):
    """The transformers model of cell `name`, trained TRAIN_STEPS Adam steps to count (each
    token the previous + 1: its continuations vary, so EOS ids end rows at different steps;
    no weight sits at its init: norms away from 1, biases away from 0), returned in eval mode,
    float32."""
    import transformers

    prefix, changes = CELLS[name]
    config = getattr(transformers, f"{prefix}Config")(**{**SIZES, **changes})
    torch.manual_seed(seed)
    model = getattr(transformers, f"{prefix}ForCausalLM")(config)
    rng = np.random.default_rng(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-2)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only contend
    try:
        for _ in range(TRAIN_STEPS):  # counting: each token the previous one + 1
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
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    return ids, mask, positions


@contextlib.contextmanager
def float64_norms_and_rotary(model_config):
    """transformers' RMS norms and rotary tables computed in float64 in a float64 model (they
    cast to float32: ~1e-7 relative noise in the logits), the rest untouched. The rotary
    frequencies are this project's float64 ones (spec/rotary.py, checked against
    transformers' to float32 rounding in parity_tests/test_llm_switches.py), installed into
    each model's rotary module when it runs."""
    from transformers.models.llama import modeling_llama
    from transformers.models.mistral import modeling_mistral
    from transformers.models.qwen2 import modeling_qwen2
    from transformers.models.qwen3 import modeling_qwen3

    from flax_transformer.spec import rotary

    inv_freq = torch.from_numpy(rotary.inverse_frequencies(model_config))
    scale = rotary.attention_factor(model_config)

    def norm(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    def rope(self, x, position_ids):
        freqs = position_ids[..., None].double() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)

    modules = (modeling_llama, modeling_mistral, modeling_qwen2, modeling_qwen3)
    prefixes = ("Llama", "Mistral", "Qwen2", "Qwen3")
    patched = [(getattr(m, f"{p}RMSNorm"), norm) for m, p in zip(modules, prefixes, strict=True)]
    patched += [
        (getattr(m, f"{p}RotaryEmbedding"), rope) for m, p in zip(modules, prefixes, strict=True)
    ]
    saved = [(cls, cls.forward) for cls, _ in patched]
    for cls, forward in patched:
        cls.forward = forward
    try:
        yield
    finally:
        for cls, forward in saved:
            cls.forward = forward
