"""The loss and the pure train / eval steps.

Everything here is a pure function of its inputs, so the steps can be jitted, donated,
benchmarked and sharded by other code:

    model = model_for(config, "seq2seq")
    optimizer = make_optimizer(make_schedule("inverse_sqrt", 1e-3, 400, steps), ...)
    state = create_train_state(model, optimizer, seed=0)
    step = jax.jit(make_train_step(model, optimizer, label_smoothing=0.1), donate_argnums=0)
    state, metrics = step(state, batch)     # metrics: sums and counts, no Python logging

Losses are (sum over real tokens, token count) so that averages stay exact across batches and
devices; label smoothing has its normalising constant subtracted, so a model that predicts the
smoothed target distribution exactly has loss 0.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from flax_transformer.data.packing import batch_model_kwargs
from flax_transformer.nn.kinds import kind_of
from flax_transformer.spec.kinds import model_inputs
from flax_transformer.training.state import TrainState


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
    """Teacher-forced logits (batch, tgt_len, vocab): the model takes its kind's batch arrays
    (and, for a packed batch, the masks and positions that keep its examples apart)."""
    kind = kind_of(model)
    inputs = model_inputs(batch, kind)
    packed = batch_model_kwargs(batch, kind, model.config)
    return model.apply(
        {"params": params}, *inputs, deterministic=deterministic, rngs=rngs, **packed
    )


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
    if "labels" in batch:  # a sequence classifier (--task classify): logits (B, num_labels)
        return classifier_loss(logits, batch["labels"], label_smoothing)
    return batch_loss(logits, batch, model.config.pad_id, label_smoothing)


def batch_loss(logits, batch, pad_id: int, label_smoothing: float = 0.0):
    """loss_from_logits of a batch's targets, weighed by its tgt_weights when it has them (LM
    documents: 1 on every target inside its example, the EOS too when pad_id == eos_id; chat:
    the replies only), else every non-pad target counts (seq2seq)."""
    weights = batch.get("tgt_weights")
    return loss_from_logits(logits, batch["tgt_out"], pad_id, label_smoothing, weights)


def classifier_loss(logits, labels, label_smoothing: float = 0.0):
    """logits (B, num_labels), labels (B,) with -1 on padding rows -> (mean loss over the
    examples, aux sums as loss_from_logits's: "token_count" counts examples, "correct" the
    right predictions); also "predictions" (B,), which add_sums leaves out."""
    weights = labels >= 0
    targets = jnp.maximum(labels, 0)[:, None]  # (B, 1): one "token" per example
    loss_sum, count = smoothed_cross_entropy(
        logits[:, None, :], targets, weights[:, None], label_smoothing
    )
    predictions = jnp.argmax(logits, axis=-1)
    correct = jnp.sum((predictions == labels) & weights)
    aux = {"loss_sum": loss_sum, "token_count": count, "correct": correct}
    return loss_sum / jnp.maximum(count, 1.0), aux | {"predictions": predictions}


def loss_from_logits(logits, targets, pad_id: int, label_smoothing: float = 0.0, weights=None):
    """logits (B, T, V), targets (B, T) -> (mean loss over the non-pad targets, aux sums).

    `weights` (B, T), when given, replaces "not pad" as each target's weight (an LM's 1 on
    every real target, a chat data set's 0 / 1 loss mask; 0 on padding): the loss is
    sum(weight * loss) / sum(weight), "correct" the weighted count of right predictions and
    "token_count" the weights' sum."""
    hits = jnp.argmax(logits, axis=-1) == targets
    if weights is None:
        weights = targets != pad_id
        correct = jnp.sum(hits & weights)
    else:
        correct = jnp.sum(jnp.where(hits, weights, 0.0))
    loss_sum, count = smoothed_cross_entropy(logits, targets, weights, label_smoothing)
    aux = {"loss_sum": loss_sum, "token_count": count, "correct": correct}
    return loss_sum / jnp.maximum(count, 1.0), aux


def summed_loss(params, batch, dropout_rng=None, **kwargs):
    """(sum of the loss over real target tokens, aux): micro-batch gradients add up."""
    _, aux = loss_fn(params, batch, dropout_rng, **kwargs)
    return aux["loss_sum"], aux


def split_micro_batches(x, count: int):
    """(batch, ...) -> (count, batch / count, ...): micro-batch m holds rows m, m + count, ...

    Strided rows keep each device's rows on it when the batch is sharded over `data`.
    """
    if x.shape[0] % count:
        raise ValueError(f"a batch of {x.shape[0]} rows does not split into {count} micro-batches")
    return jnp.swapaxes(x.reshape(x.shape[0] // count, count, *x.shape[1:]), 0, 1)


# ----------------------------------------------------------------------------- steps
def make_train_step(
    model, optimizer, label_smoothing: float = 0.0, grad_accum: int = 1
) -> Callable:
    """step(state, batch) -> (state, metrics); pure, for jax.jit(step, donate_argnums=0).

    metrics: loss_sum, token_count, correct (sums over the batch), grad_norm (before clipping).
    With `grad_accum` N > 1 the batch is cut into N micro-batches (rows m, m+N, m+2N, ...),
    their gradients of the *summed* loss are added up in a `lax.scan` (one micro-batch's
    activations alive at a time) and divided by the batch's token count: one optimizer update
    with the token-weighted mean gradient of the whole batch, as if it had run in one piece.
    """
    if grad_accum < 1:
        raise ValueError(f"grad_accum must be >= 1, got {grad_accum}")
    settings = dict(model=model, label_smoothing=label_smoothing, deterministic=False)
    # (params, batch, dropout_rng) -> (gradient, sums): of the mean loss for a whole batch, of
    # the summed loss for a micro-batch (micro-batch gradients add up).
    whole_batch = functools.partial(jax.grad(loss_fn, has_aux=True), **settings)
    micro_grads = functools.partial(jax.grad(summed_loss, has_aux=True), **settings)

    def accumulated(params, batch, dropout_rng):
        micro = jax.tree.map(lambda x: split_micro_batches(x, grad_accum), dict(batch))

        def add(total, xs):
            index, micro_batch = xs
            rng = jax.random.fold_in(dropout_rng, index)  # each micro-batch its own dropout
            return jax.tree.map(jnp.add, total, micro_grads(params, micro_batch, rng)), None

        first = jax.tree.map(lambda x: x[0], micro)
        shapes = jax.eval_shape(micro_grads, params, first, dropout_rng)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        (grads, aux), _ = jax.lax.scan(add, zeros, (jnp.arange(grad_accum), micro))
        count = jnp.maximum(aux["token_count"], 1.0)
        return jax.tree.map(lambda g: (g / count).astype(g.dtype), grads), aux

    compute_grads = whole_batch if grad_accum == 1 else accumulated

    def train_step(state: TrainState, batch):
        dropout_rng = jax.random.fold_in(state.rng, state.step)
        grads, aux = compute_grads(state.params, batch, dropout_rng)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        aux = {k: v for k, v in aux.items() if k != "predictions"}  # (a classifier's; eval's)
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
    """Add one batch's "loss_sum", "token_count" and "correct" to the running totals (None: start
    from this batch); floats on the host."""
    keys = ("loss_sum", "token_count", "correct")
    metrics = {k: float(metrics[k]) for k in keys}
    if total is None:
        return metrics
    return {k: total[k] + metrics[k] for k in total}
