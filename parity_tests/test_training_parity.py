"""Training parity: the same loss, gradients and AdamW steps in Flax/Optax and torch.

The torch side is what a PyTorch user would write: F.cross_entropy(label_smoothing=...,
ignore_index=pad), clip_grad_norm_, torch.optim.AdamW with a LambdaLR of the same schedule.
Dropout is off (its random streams cannot match). x64 and "highest" matmul precision come from
parity_tests/conftest.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_reference
from flax_transformer import TransformerConfig
from flax_transformer.interop.convert import flax_to_torch_state, torch_state_to_flax
from flax_transformer.nn.kinds import model_for
from flax_transformer.spec.numerics import assert_close, error_stats
from flax_transformer.training.optim import (
    ADAM_B1,
    ADAM_B2,
    ADAM_EPS,
    make_optimizer,
    make_schedule,
    schedule_value,
)
from flax_transformer.training.state import create_train_state
from flax_transformer.training.steps import loss_fn, make_train_step

LABEL_SMOOTHING = 0.1
PAD = 0


def config_for(dtype: str) -> TransformerConfig:
    # d_model != d_ff != vocab, so a wrong transpose is a shape error.
    return TransformerConfig(
        src_vocab_size=37,
        tgt_vocab_size=41,
        d_model=24,
        num_heads=4,
        num_encoder_layers=1,
        num_decoder_layers=1,
        d_ff=40,
        max_len=32,
        dropout_rate=0.0,
        dtype=dtype,
        param_dtype=dtype,
    )


def make_batches(count: int, seed: int = 0):
    """Ragged, padded seq2seq batches (numpy int64 for torch, cast for jax)."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        src = rng.integers(3, 37, (4, 9))
        tgt = rng.integers(3, 41, (4, 8))
        src[1, 6:] = PAD
        src[3, 2:] = PAD
        tgt[0, 5:] = PAD
        tgt[2, 3:] = PAD
        batches.append({"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]})
    return batches


def torch_loss(model, batch):
    """Mean over real tokens of torch's label-smoothed cross-entropy (constant not removed)."""
    logits = model(torch.from_numpy(batch["src"]), torch.from_numpy(batch["tgt_in"]))
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        torch.from_numpy(batch["tgt_out"]).reshape(-1),
        ignore_index=PAD,
        label_smoothing=LABEL_SMOOTHING,
    )


def smoothing_constant(vocab: int, eps: float) -> float:
    """Entropy of torch's smoothed target distribution, which our loss subtracts."""
    off = eps / vocab
    on = 1 - eps + off
    return -(on * np.log(on) + (vocab - 1) * off * np.log(off))


def twin_models(dtype: str, seed: int = 0):
    config = config_for(dtype)
    torch.manual_seed(seed)
    torch_model = torch_reference.Transformer(config)
    params = torch_state_to_flax(torch_reference.state_dict_to_numpy(torch_model), config)
    return config, torch_model, params["params"]


def jax_batch(batch):
    return {k: jnp.asarray(v, jnp.int32) for k, v in batch.items()}


def test_loss_and_gradients_match_torch_float64():
    config, torch_model, params = twin_models("float64")
    model = model_for(config, "seq2seq")
    batch = make_batches(1)[0]
    # Jitted: one compilation instead of hundreds of eager float64 ops.
    grad_fn = jax.jit(
        jax.value_and_grad(loss_fn, has_aux=True), static_argnames=("model", "label_smoothing")
    )
    (loss, aux), grads = grad_fn(
        params, jax_batch(batch), model=model, label_smoothing=LABEL_SMOOTHING
    )
    reference = torch_loss(torch_model, batch)
    reference.backward()
    # torch keeps the entropy of the smoothed targets in the loss; we subtract it.
    expected_loss = reference.item() - smoothing_constant(config.tgt_vocab_size, LABEL_SMOOTHING)
    assert_close(float(loss), expected_loss, rtol=1e-12, what="loss")
    assert float(aux["token_count"]) == float((batch["tgt_out"] != PAD).sum())

    flax_grads = flax_to_torch_state(jax.tree.map(np.asarray, grads))
    torch_grads = {name: p.grad.numpy() for name, p in torch_model.named_parameters()}
    assert flax_grads.keys() == torch_grads.keys()
    scale = max(float(np.abs(g).max()) for g in torch_grads.values())
    for name, grad in torch_grads.items():
        if name.endswith("key.bias"):
            # softmax ignores a shift shared by a whole row of scores, so the exact gradient of
            # a key bias is 0: both frameworks return rounding noise, which must stay tiny.
            assert np.abs(flax_grads[name]).max() <= 1e-12 * scale
            assert np.abs(grad).max() <= 1e-12 * scale
            continue
        assert_close(flax_grads[name], grad, rtol=1e-10, what=f"gradient of {name}")


def run_flax(config, params, batches, steps, schedule_kind, clip_norm, lr, weight_decay, eps):
    model = model_for(config, "seq2seq")
    schedule = make_schedule(schedule_kind, lr, warmup=5, total_steps=steps)
    optimizer = make_optimizer(schedule, weight_decay=weight_decay, clip_norm=clip_norm, eps=eps)
    state = create_train_state(model, optimizer, seed=0, params=params)  # no dropout: rng unused
    step_fn = jax.jit(make_train_step(model, optimizer, LABEL_SMOOTHING))
    grad_norms = []
    for i in range(steps):
        state, metrics = step_fn(state, jax_batch(batches[i % len(batches)]))
        grad_norms.append(float(metrics["grad_norm"]))
    return flax_to_torch_state(jax.tree.map(np.asarray, state.params)), grad_norms


def run_torch(model, batches, steps, schedule_kind, clip_norm, lr, weight_decay, eps):
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0}],
        lr=lr,
        betas=(ADAM_B1, ADAM_B2),
        eps=eps,
    )
    factor = lambda k: float(schedule_value(schedule_kind, k, 1.0, 5, steps, xp=np))  # noqa: E731
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    for i in range(steps):
        optimizer.zero_grad()
        torch_loss(model, batches[i % len(batches)]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()
        scheduler.step()
    return torch_reference.state_dict_to_numpy(model)


@pytest.mark.parametrize(
    "dtype, schedule_kind, rtol",
    [
        ("float64", "inverse_sqrt", 1e-10),
        # The cosine schedule's case (~14 s on 2 cores) is a long run (`pytest -m slow`, CI).
        pytest.param("float64", "cosine", 1e-10, marks=pytest.mark.slow),
        ("float32", "inverse_sqrt", 1e-5),
    ],
)
def test_twenty_adamw_steps_match_torch(dtype, schedule_kind, rtol):
    steps, clip_norm, lr = 20, 0.5, 3e-3
    hyper = dict(schedule_kind=schedule_kind, clip_norm=clip_norm, lr=lr, weight_decay=0.01)
    config, torch_model, params = twin_models(dtype, seed=1)
    batches = make_batches(3, seed=1)
    with jax.enable_x64(dtype == "float64"):
        flax_params, grad_norms = run_flax(config, params, batches, steps, eps=ADAM_EPS, **hyper)
    torch_params = run_torch(torch_model, batches, steps, eps=ADAM_EPS, **hyper)
    # The run must exercise clipping, and the parameters must have moved well beyond rtol.
    assert max(grad_norms) > clip_norm
    initial = torch_reference.state_dict_to_numpy(twin_models(dtype, seed=1)[1])
    moved = max(error_stats(torch_params[k], initial[k])[1] for k in initial)
    assert moved > 1e-3
    assert flax_params.keys() == torch_params.keys()
    for name, expected in torch_params.items():
        assert flax_params[name].dtype == np.dtype(dtype)
        if dtype == "float32" and name.endswith("key.bias"):
            # The exact gradient of a key bias is 0 (see the gradient test); in float32 its
            # rounding noise (~1e-10) is not small next to Adam's eps, so Adam turns it into
            # steps of up to lr in either framework. Bound them instead of comparing noise.
            assert np.abs(flax_params[name] - expected).max() <= 2 * lr * steps
            continue
        assert_close(flax_params[name], expected, rtol=rtol, what=f"{dtype} {name} after {steps}")
