"""Learning-rate schedules and the optimizer: AdamW with the paper's betas, torch-style clipping."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ("inverse_sqrt", "cosine")
ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.98, 1e-9  # the paper's Adam
TORCH_CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_ divides by (norm + 1e-6)


# ----------------------------------------------------------------------------- schedule
def schedule_value(kind: str, count, peak_lr: float, warmup: int, total_steps: int, xp=jnp):
    """Learning rate of update number `count` (0-based), written once for jnp and for math-like
    modules (`xp=np`), so torch's LambdaLR can use the very same formula.

    inverse_sqrt (the paper, peak-normalised): peak * min(s / warmup, sqrt(warmup / s)), s=count+1
    cosine: linear warmup to peak, then half a cosine down to 0 at total_steps.
    """
    # dtype=float: float64 under x64 (an int32 count would otherwise give a float32 rate).
    s = xp.asarray(count, dtype=float) + 1
    warm = s / warmup
    if kind == "inverse_sqrt":
        return peak_lr * xp.minimum(warm, xp.sqrt(warmup / xp.maximum(s, 1)))
    if kind == "cosine":
        progress = xp.clip((s - warmup) / max(total_steps - warmup, 1), 0.0, 1.0)
        decay = 0.5 * (1.0 + xp.cos(math.pi * progress))
        return peak_lr * xp.where(s <= warmup, warm, decay)
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {kind!r}")


def make_schedule(kind: str, peak_lr: float, warmup: int, total_steps: int) -> optax.Schedule:
    """The optax learning-rate schedule of `kind` (inverse_sqrt or cosine) peaking at `peak_lr`
    after `warmup` steps; ValueError for an unknown kind or warmup < 1."""
    if kind not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {kind!r}")
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1 step, got {warmup}")
    return lambda count: schedule_value(kind, count, peak_lr, warmup, total_steps)


# ----------------------------------------------------------------------------- optimizer
def clip_by_global_norm(max_norm: float, eps: float = TORCH_CLIP_EPS):
    """Scale gradients by min(1, max_norm / (global_norm + eps)).

    eps=1e-6 is torch.nn.utils.clip_grad_norm_'s formula, so a step here equals a torch step to
    float64 rounding; eps=0 is exactly optax.clip_by_global_norm."""

    def update_fn(updates, state, params=None):
        del params
        norm = optax.tree.norm(updates)
        scale = jnp.minimum(1.0, max_norm / (norm + eps))
        return jax.tree.map(lambda g: (g * scale).astype(g.dtype), updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def decay_mask(params):
    """Weight decay on matrices (kernels, embeddings) only, not on biases and LayerNorm scales."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(
    schedule: optax.Schedule | float,
    *,
    weight_decay: float = 0.0,
    clip_norm: float = 1.0,
    b1: float = ADAM_B1,
    b2: float = ADAM_B2,
    eps: float = ADAM_EPS,
) -> optax.GradientTransformation:
    """clip (torch's formula; clip_norm <= 0 turns it off) then AdamW with decoupled decay."""
    adamw = optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=decay_mask)
    if clip_norm and clip_norm > 0:
        return optax.chain(clip_by_global_norm(clip_norm), adamw)
    return adamw
