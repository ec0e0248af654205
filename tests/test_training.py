"""Loss, schedules, clipping, the jitted train step, the options and the step hooks."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from flax_transformer.nn.kinds import abstract_variables, model_for
from flax_transformer.spec.presets import preset
from flax_transformer.training.hooks import STOP, StepInfo, call_hooks
from flax_transformer.training.optim import (
    clip_by_global_norm,
    make_optimizer,
    make_schedule,
    schedule_value,
)
from flax_transformer.training.options import DataOptions, OptionError, TrainOptions
from flax_transformer.training.state import create_train_state
from flax_transformer.training.steps import make_eval_step, make_train_step, smoothed_cross_entropy

CONFIG = preset("tiny")


@pytest.fixture(scope="module")
def learner():
    """A tiny dropout model, an AdamW with warmup, its jitted train / eval steps and a state at
    step 0 (seed 1), shared by the tests: each compilation, init's included, costs seconds."""
    model = model_for(CONFIG.replace(dropout_rate=0.1), "seq2seq")
    opt = make_optimizer(make_schedule("inverse_sqrt", 1e-2, 5, 40), weight_decay=0.01)
    step = jax.jit(make_train_step(model, opt, label_smoothing=0.1))  # not donated: shared state
    state = create_train_state(model, opt, seed=1)
    return model, opt, step, jax.jit(make_eval_step(model, 0.1)), state


def make_batch(seed=0, batch=4, length=8):
    rng = np.random.default_rng(seed)
    src = rng.integers(3, 40, (batch, length)).astype(np.int32)
    tgt = rng.integers(3, 44, (batch, length + 1)).astype(np.int32)
    src[1, 5:] = 0
    tgt[2, 4:] = 0
    return {"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}


def test_inverse_sqrt_schedule_peaks_at_warmup():
    sched = make_schedule("inverse_sqrt", 1e-3, warmup=10, total_steps=100)
    assert float(sched(0)) == pytest.approx(1e-4)
    assert float(sched(9)) == pytest.approx(1e-3)  # the 10th update uses the peak
    assert float(sched(39)) == pytest.approx(1e-3 * np.sqrt(10 / 40))
    values = [float(sched(i)) for i in range(100)]
    assert max(values) == pytest.approx(1e-3)


def test_cosine_schedule_warms_up_then_decays_to_zero():
    sched = make_schedule("cosine", 2e-3, warmup=5, total_steps=25)
    assert float(sched(4)) == pytest.approx(2e-3)
    assert float(sched(14)) == pytest.approx(1e-3)  # halfway down
    assert float(sched(24)) == pytest.approx(0.0, abs=1e-12)
    # The numpy form (used for torch's LambdaLR) is the same function.
    for i in range(25):
        assert schedule_value("cosine", i, 2e-3, 5, 25, xp=np) == pytest.approx(
            float(sched(i)), rel=1e-6, abs=1e-9
        )
    with pytest.raises(ValueError, match="warmup"):
        make_schedule("cosine", 1e-3, 0, 10)
    with pytest.raises(ValueError, match="schedule must be one of"):
        make_schedule("linear", 1e-3, 1, 10)


def test_label_smoothing_subtracts_its_constant():
    vocab, eps = 7, 0.1
    targets = jnp.array([[3, 5, 0]])
    weights = jnp.array([[1, 1, 0]])
    # A model that predicts the smoothed distribution exactly has loss 0.
    smoothed = jnp.full((1, 3, vocab), eps / vocab).at[0, jnp.arange(3), targets[0]].add(1 - eps)
    loss, count = smoothed_cross_entropy(jnp.log(smoothed), targets, weights, eps)
    assert float(count) == 2.0
    assert abs(float(loss)) < 1e-6
    # Without smoothing it is the usual cross-entropy, padding excluded.
    logits = jax.random.normal(jax.random.key(0), (1, 3, vocab))
    loss, _ = smoothed_cross_entropy(logits, targets, weights, 0.0)
    expected = optax.softmax_cross_entropy_with_integer_labels(logits, targets)[0, :2].sum()
    np.testing.assert_allclose(float(loss), float(expected), rtol=1e-6)
    # Any other prediction scores above 0 (it is a KL divergence).
    loss, _ = smoothed_cross_entropy(logits, targets, weights, eps)
    assert float(loss) > 0


def test_clip_matches_optax_without_eps_and_torch_formula_with_it():
    grads = {"a": jnp.array([3.0, 4.0]), "b": jnp.array([[12.0]])}  # global norm 13
    ours, _ = clip_by_global_norm(1.3, eps=0.0).update(grads, optax.EmptyState())
    optax_clip = optax.clip_by_global_norm(1.3)
    theirs, _ = optax_clip.update(grads, optax_clip.init(grads))
    for key in grads:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-7)
    torchy, _ = clip_by_global_norm(1.3).update(grads, optax.EmptyState())
    np.testing.assert_allclose(torchy["b"], 12.0 * 1.3 / (13.0 + 1e-6), rtol=1e-7)
    small = {"a": jnp.array([0.3, 0.4])}  # below the threshold: unchanged
    unchanged, _ = clip_by_global_norm(1.0).update(small, optax.EmptyState())
    np.testing.assert_array_equal(unchanged["a"], small["a"])


def test_weight_decay_skips_biases_and_norms():
    # The model's param tree filled with ones: unlike a real init (zero biases), any decay of
    # a 1-D param would show.
    abstract = abstract_variables(model_for(CONFIG, "seq2seq"))["params"]
    params = jax.tree.map(lambda leaf: jnp.ones(leaf.shape, leaf.dtype), abstract)
    zeros = jax.tree.map(jnp.zeros_like, params)
    opt = make_optimizer(0.0, weight_decay=0.5, clip_norm=0.0)  # lr 0: nothing should move...
    updates, _ = jax.jit(opt.update)(zeros, opt.init(params), params)
    assert all(float(jnp.abs(u).max()) == 0.0 for u in jax.tree.leaves(updates))
    opt = make_optimizer(1.0, weight_decay=0.5, clip_norm=0.0)  # ...lr 1: decay shows
    updates, _ = jax.jit(opt.update)(zeros, opt.init(params), params)
    flat = jax.tree_util.tree_flatten_with_path(updates)[0]
    for path, update in flat:
        name = jax.tree_util.keystr(path)
        decayed = float(jnp.abs(update).max()) > 0
        assert decayed == (update.ndim >= 2), name


@pytest.mark.slow  # ~17 s on 2 cores (CI runs it); the CLI tests train in the fast suite
def test_train_step_learns_and_is_deterministic(learner):
    model, opt, step, eval_step, initial = learner
    batch = make_batch()

    def run(n, state):
        first = eval_step(state.params, batch)
        for _ in range(n):
            state, metrics = step(state, batch)
        return state, first, metrics

    state, first, metrics = run(30, initial)
    last = eval_step(state.params, batch)
    assert int(state.step) == 30
    assert float(metrics["token_count"]) == float((batch["tgt_out"] != 0).sum())
    assert float(last["loss_sum"]) < 0.3 * float(first["loss_sum"])  # it overfits one batch
    # A new state from the same seed, the same dropout keys (fold_in(rng, step)): same params.
    again, _, _ = run(30, create_train_state(model, opt, seed=1))
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(again.params), strict=True):
        np.testing.assert_array_equal(a, b)


# A long cell (the fast suite is at its 8-minute budget): the slow pass (`pytest -m slow`, CI).
@pytest.mark.slow
def test_dropout_key_changes_with_step(learner):
    _, _, step, _, state = learner
    batch = make_batch()
    # A step's metrics come from the params before its update: with the same params, only the
    # dropout key fold_in(rng, step) can change them.
    _, m0 = step(state, batch)
    _, m0_again = step(state, batch)
    _, m1 = step(state.replace(step=state.step + 1), batch)
    assert float(m0["loss_sum"]) == float(m0_again["loss_sum"])
    assert float(m0["loss_sum"]) != float(m1["loss_sum"])


def test_lm_train_step():
    model = model_for(CONFIG.replace(src_vocab_size=44), "lm")
    opt = make_optimizer(1e-2)
    state = create_train_state(model, opt, seed=0)
    batch = make_batch()
    del batch["src"]
    step = jax.jit(make_train_step(model, opt), donate_argnums=0)
    losses = []
    for _ in range(15):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss_sum"]))
    assert losses[-1] < 0.7 * losses[0]


def test_options_reject_values_out_of_range_naming_the_field():
    assert TrainOptions().steps > 0  # the defaults are valid
    for bad, field, problem in (
        ({"steps": 0}, "steps", "must be a positive int, got 0"),
        ({"lr": -1.0}, "lr", "must be a finite number > 0, got -1.0"),
        ({"clip_norm": -0.5}, "clip_norm", "must be a finite number >= 0, got -0.5"),
        ({"label_smoothing": 1.0}, "label_smoothing", "must be a finite number in [0, 1), got 1.0"),
        ({"schedule": "linear"}, "schedule", "must be one of ('inverse_sqrt', 'cosine')"),
    ):
        with pytest.raises(OptionError) as error:
            TrainOptions(**bad)
        assert error.value.field == field and problem in error.value.problem
    with pytest.raises(OptionError, match="on_long must be one of"):
        DataOptions(on_long="wrap")


def test_hooks_all_see_each_call_and_any_can_stop():
    info = StepInfo("step", 3, {}, None, Path("."), lambda: None)
    calls = []

    def watch(seen):
        calls.append(("watch", seen.step))

    def stop(seen):
        calls.append(("stop", seen.step))
        return STOP

    assert call_hooks([watch], info) is False
    assert call_hooks([stop, watch], info) is True  # watch still sees the step
    assert calls == [("watch", 3), ("stop", 3), ("watch", 3)]
    with pytest.raises(TypeError, match="returns None or STOP"):
        call_hooks([lambda seen: True], info)
