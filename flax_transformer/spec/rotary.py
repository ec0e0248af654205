"""Rotary position embeddings: the inverse frequencies of a config's scaling rule (numpy, or
jax.numpy for the dynamic rule's traced length), as transformers' modeling_rope_utils.py
computes them, and the rotation of the rotate-half layout.

A head of width d is read as d / 2 pairs (x[i], x[i + d / 2]) (transformers' rotate_half, not
the interleaved pairs of the RoFormer paper); pair i at position p turns by the angle
p * inv_freq[i]. cos and sin are multiplied by the rule's attention factor (yarn; 1 elsewhere).

Rules (config.rope_scaling):
- default: inv_freq[i] = theta ** (-2i / d).
- linear: default / factor (positions interpolated).
- dynamic (NTK): at a sequence of n tokens (the largest position + 1) longer than
  rope_original_max_len L, theta becomes theta * (factor * n / L - (factor - 1)) ** (d / (d - 2)).
- llama3: wavelengths 2 pi / inv_freq above L / low_freq_factor divided by factor, below
  L / high_freq_factor kept, smoothly mixed in between.
- longrope (Phi-3): each frequency divided by its own factor, the short table's while a call's
  sequence fits rope_original_max_len, the long table's past it; attention factor
  sqrt(1 + ln(factor) / ln(rope_original_max_len)) (or rope_attention_factor).
- yarn: each frequency interpolated (/ factor) or kept by a linear ramp over the dimensions
  between the beta_fast and beta_slow correction dims; attention factor 0.1 ln(factor) + 1
  (or mscale / mscale_all_dim's quotient, or rope_attention_factor).

transformers computes these in float32 even in a float64 model; here they are float64 (numpy)
and rounded to the compute dtype by the caller. Imports numpy only (jax.numpy comes as `xp`).
"""

from __future__ import annotations

import math

import numpy as np


def layer_rope(config, sliding: bool):
    """The config whose rotary fields a layer turns by: a sliding layer's own unscaled base
    (config.rope_local_theta, Gemma 3's rope_local_base_freq) where one is set, else `config`."""
    if not sliding or config.rope_local_theta is None:
        return config
    return config.replace(rope_theta=config.rope_local_theta, rope_scaling="default")


def rotary_dim(config) -> int:
    """How many of a head's dims turn: the first int(head_dim x rotary_fraction)."""
    return int(config.head_dim * config.rotary_fraction)


def _default(theta, dim: int) -> np.ndarray:
    return 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))


def attention_factor(config) -> float:
    """The scale of cos and sin: 1, or yarn's (rope_attention_factor, else from the factor)."""
    if config.rope_scaling not in ("yarn", "longrope"):
        return 1.0
    if config.rope_attention_factor is not None:
        return float(config.rope_attention_factor)
    if config.rope_scaling == "longrope":  # transformers' _compute_longrope_parameters
        factor, original = config.rope_factor, config.rope_original_max_len
        return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    factor, top, bottom = config.rope_factor, config.rope_mscale, config.rope_mscale_all_dim
    if top and bottom:
        return float(mscale(factor, top) / mscale(factor, bottom))
    return mscale(factor)


def inverse_frequencies(config) -> np.ndarray:
    """float64 (head_dim / 2,): the frequencies of every rule but dynamic's growth (for dynamic:
    those of a sequence no longer than rope_original_max_len, the default ones)."""
    dim, theta, factor = rotary_dim(config), config.rope_theta, config.rope_factor
    inv_freq = _default(theta, dim)
    rule = config.rope_scaling
    if rule == "longrope":  # the short factors: longrope_frequencies picks per call
        return inv_freq / np.asarray(config.rope_short_factors, np.float64)
    if rule == "linear":
        return inv_freq / factor
    if rule == "llama3":
        old = config.rope_original_max_len
        low, high = config.rope_low_freq_factor, config.rope_high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        return np.where(medium, smoothed, scaled)
    if rule == "yarn":
        return _yarn(config, inv_freq)
    return inv_freq


def _yarn(config, inv_freq: np.ndarray) -> np.ndarray:
    dim, theta, factor = rotary_dim(config), config.rope_theta, config.rope_factor
    original = config.rope_original_max_len

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(config.rope_beta_fast), correction_dim(config.rope_beta_slow)
    if config.rope_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    return (inv_freq / factor) * (1 - extrapolation) + inv_freq * extrapolation


def dynamic_frequencies(config, seq_len, xp):
    """The dynamic rule's frequencies for a sequence of `seq_len` tokens (a traced scalar under
    jit): the default ones up to rope_original_max_len, then a larger theta."""
    dim, factor, original = rotary_dim(config), config.rope_factor, config.rope_original_max_len
    seq_len = xp.maximum(seq_len, original)
    theta = config.rope_theta * ((factor * seq_len / original) - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / (theta ** (xp.arange(0, dim, 2) / dim))


def longrope_frequencies(config, seq_len, xp):
    """longrope's frequencies for a call whose sequence is `seq_len` tokens (its largest
    position + 1; a traced scalar under jit): the short factors' up to rope_original_max_len,
    the long factors' past it (transformers' longrope_frequency_update)."""
    base = _default(config.rope_theta, rotary_dim(config))
    short = base / np.asarray(config.rope_short_factors, np.float64)
    long = base / np.asarray(config.rope_long_factors, np.float64)
    return xp.where(seq_len > config.rope_original_max_len, long, short)
