"""Train state, learning-rate schedules, optimizer, loss and the pure train / eval steps.

Everything here is a pure function of its inputs, so the steps can be jitted, donated,
benchmarked and sharded by other code:

    model = model_for(config, "transformer")
    optimizer = make_optimizer(make_schedule("inverse_sqrt", 1e-3, 400, steps), ...)
    state = create_train_state(model, optimizer, seed=0)
    step = jax.jit(make_train_step(model, optimizer, label_smoothing=0.1), donate_argnums=0)
    state, metrics = step(state, batch)     # metrics: sums and counts, no Python logging

Losses are (sum over real tokens, token count) so that averages stay exact across batches and
devices; label smoothing has its normalising constant subtracted, so a model that predicts the
smoothed target distribution exactly has loss 0.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from .config import TransformerConfig
from .model import Transformer, TransformerLM

SCHEDULES = ("inverse_sqrt", "cosine")
MODEL_KINDS = ("transformer", "lm")
ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.98, 1e-9  # the paper's Adam
TORCH_CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_ divides by (norm + 1e-6)


@flax.struct.dataclass
class TrainState:
    """Everything a step changes. `rng` is a raw uint32 key; dropout uses fold_in(rng, step)."""

    step: jax.Array  # int32 scalar: optimizer updates done so far
    params: Any  # the Flax tree without the {"params": ...} level
    opt_state: Any
    rng: jax.Array


def model_for(config: TransformerConfig, kind: str):
    if kind == "transformer":
        return Transformer(config)
    if kind == "lm":
        return TransformerLM(config)
    raise ValueError(f"model kind must be one of {MODEL_KINDS}, got {kind!r}")


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


# ----------------------------------------------------------------------------- state
def init_params(model, seed_or_key, kind: str | None = None):
    """Fresh params (inner tree) from a small dummy batch; shapes do not depend on lengths."""
    key = jax.random.PRNGKey(seed_or_key) if isinstance(seed_or_key, int) else seed_or_key
    tokens = jnp.ones((1, 1), jnp.int32)
    args = (tokens,) if isinstance(model, TransformerLM) else (tokens, tokens)
    return model.init(key, *args)["params"]


def create_train_state(model, optimizer, seed: int, params=None) -> TrainState:
    """State at step 0: params from `seed` (unless given), dropout base key from `seed` too."""
    init_key, dropout_key = jax.random.split(jax.random.PRNGKey(seed))
    if params is None:
        params = init_params(model, init_key)
    return TrainState(
        step=jnp.array(0, jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        rng=dropout_key,
    )


# ----------------------------------------------------------------------------- loss
def smoothed_cross_entropy(logits, targets, weights, label_smoothing: float = 0.0):
    """(sum of per-token losses * weights, sum of weights).

    The target distribution is torch's: (1 - eps) * one_hot + eps / vocab on every class. Its
    entropy is subtracted, so the loss is KL(target || model) and a perfect model scores 0;
    gradients equal torch's cross_entropy(label_smoothing=eps).
    """
    vocab = logits.shape[-1]
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    log_probs = jax.nn.log_softmax(logits, axis=-1)  # (batch, len, vocab)
    nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    if label_smoothing > 0.0:
        off = label_smoothing / vocab
        on = 1.0 - label_smoothing + off
        entropy = -(on * math.log(on) + (vocab - 1) * off * math.log(off))
        smooth = -jnp.mean(log_probs, axis=-1)
        per_token = (1.0 - label_smoothing) * nll + label_smoothing * smooth - entropy
    else:
        per_token = nll
    weights = weights.astype(per_token.dtype)
    return jnp.sum(per_token * weights), jnp.sum(weights)


def compute_logits(model, params, batch, *, deterministic: bool = True, rngs=None):
    """Teacher-forced logits (batch, tgt_len, vocab) for a seq2seq or LM batch."""
    variables = {"params": params}
    if "src" in batch:
        return model.apply(
            variables, batch["src"], batch["tgt_in"], deterministic=deterministic, rngs=rngs
        )
    return model.apply(variables, batch["tgt_in"], deterministic=deterministic, rngs=rngs)


def loss_fn(
    params,
    batch,
    dropout_rng=None,
    *,
    model,
    label_smoothing: float = 0.0,
    deterministic: bool = True,
):
    """(mean loss over real target tokens, aux {"loss_sum", "token_count", "correct"})."""
    rngs = None if dropout_rng is None else {"dropout": dropout_rng}
    logits = compute_logits(model, params, batch, deterministic=deterministic, rngs=rngs)
    targets = batch["tgt_out"]
    weights = targets != model.config.pad_id
    loss_sum, count = smoothed_cross_entropy(logits, targets, weights, label_smoothing)
    correct = jnp.sum((jnp.argmax(logits, axis=-1) == targets) & weights)
    aux = {"loss_sum": loss_sum, "token_count": count, "correct": correct}
    return loss_sum / jnp.maximum(count, 1.0), aux


# ----------------------------------------------------------------------------- steps
def make_train_step(model, optimizer, label_smoothing: float = 0.0) -> Callable:
    """step(state, batch) -> (state, metrics); pure, for jax.jit(step, donate_argnums=0).

    metrics: loss_sum, token_count, correct (sums over the batch), grad_norm (before clipping).
    """

    def train_step(state: TrainState, batch):
        dropout_rng = jax.random.fold_in(state.rng, state.step)
        grad_fn = jax.grad(loss_fn, has_aux=True)
        grads, aux = grad_fn(
            state.params,
            batch,
            dropout_rng,
            model=model,
            label_smoothing=label_smoothing,
            deterministic=False,
        )
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = dict(aux, grad_norm=optax.tree.norm(grads))
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
        return new_state, metrics

    return train_step


def make_eval_step(model, label_smoothing: float = 0.0) -> Callable:
    """eval_step(params, batch) -> {"loss_sum", "token_count", "correct"}; no dropout."""

    def eval_step(params, batch):
        _, aux = loss_fn(params, batch, model=model, label_smoothing=label_smoothing)
        return aux

    return eval_step


def summarize(sums: dict[str, float]) -> dict[str, float]:
    """Sums over batches -> {"loss", "token_accuracy"} per real token."""
    count = max(float(sums["token_count"]), 1.0)
    loss = float(sums["loss_sum"]) / count
    return {"loss": loss, "token_accuracy": float(sums["correct"]) / count}


def add_sums(total: dict[str, float] | None, metrics) -> dict[str, float]:
    keys = ("loss_sum", "token_count", "correct")
    metrics = {k: float(metrics[k]) for k in keys}
    if total is None:
        return metrics
    return {k: total[k] + metrics[k] for k in total}


# ----------------------------------------------------------------------------- load a run
@dataclasses.dataclass
class RunArtifacts:
    config: TransformerConfig
    model_kind: str  # "transformer" | "lm"
    params: dict  # {"params": ...} from the latest checkpoint
    tokenizer: Any
    step: int = 0

    @property
    def model(self):
        return model_for(self.config, self.model_kind)


def load_run(workdir: str | Path) -> RunArtifacts:
    """Config, tokenizer and the latest checkpoint's params of a train.py workdir."""
    import json

    from .checkpoint import Checkpointer
    from .tokenizer import load_tokenizer

    workdir = Path(workdir)
    for name in ("config.json", "run.json", "tokenizer.json"):
        if not (workdir / name).exists():
            raise ValueError(f"{workdir} is not a train.py workdir: {name} is missing")
    config = TransformerConfig.load(workdir / "config.json")
    run = json.loads((workdir / "run.json").read_text())
    kind = run.get("model", "transformer")
    tokenizer = load_tokenizer(workdir / "tokenizer.json")
    model = model_for(config, kind)
    abstract = jax.eval_shape(lambda: init_params(model, 0))
    checkpointer = Checkpointer(workdir / "checkpoints", create=False)
    try:
        step = checkpointer.latest_step()
        if step is None:
            raise ValueError(f"{workdir / 'checkpoints'}: no checkpoint found")
        params = checkpointer.restore_params(abstract, step)
    finally:
        checkpointer.close()
    params = jax.tree.map(np.asarray, params)
    return RunArtifacts(config, kind, {"params": params}, tokenizer, step)
