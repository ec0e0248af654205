"""kernels.beam_reorder: beam search's KV-cache reorder in place on the CPU. It must give the
gather's cache in every slot a search reads, alias the loop's buffer (no copy), and fall back
to the gather (or say why not) where it cannot run."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer.decoding import Beam, generate
from flax_transformer.decoding.cache import CachedState, _gather_beams, init_cache
from flax_transformer.kernels import beam_reorder, cpu
from flax_transformer.kernels.switches import KERNELS, SwitchError
from flax_transformer.nn.kinds import model_for
from flax_transformer.spec.presets import preset

SWITCH = KERNELS.reorder.variable
WHY_NOT = KERNELS.reorder.reason_unavailable() if KERNELS.reorder.value() != "xla" else "xla"
needs_kernel = pytest.mark.skipif(
    WHY_NOT is not None, reason=f"the reorder kernel does not run here: {WHY_NOT}"
)

# Each row's parents: kept, a swap (both sources overwritten), one parent for all, a cycle.
PARENTS = np.array([[0, 1, 2, 3], [1, 0, 2, 3], [2, 2, 2, 2], [1, 2, 3, 0], [0, 0, 3, 3]])


def random_cache(dtype, batch=5, beams=4, heads=3, length=8, head_dim=5, seed=0):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((batch * beams, heads, length, head_dim))
    return jnp.asarray(values, dtype)


@needs_kernel
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("filled", [0, 1, 5, 8, 12])
def test_filled_slots_follow_the_parents_the_rest_stay(dtype, filled):
    with jax.enable_x64(dtype == jnp.float64):  # float64 models decode with an int64 index
        cache = random_cache(dtype)
        assert cache.dtype == dtype
        parents = jnp.asarray(PARENTS, jnp.int32)
        index = jnp.asarray(filled, jnp.int64 if dtype == jnp.float64 else jnp.int32)
        moved = np.asarray(jax.jit(beam_reorder.reorder)(cache, parents, index))
        gathered = np.asarray(_gather_beams(cache, parents))
    n = min(filled, cache.shape[2])  # a count past the length means all of it
    np.testing.assert_array_equal(moved[:, :, :n], gathered[:, :, :n])
    np.testing.assert_array_equal(moved[:, :, n:], np.asarray(cache)[:, :, n:])


@needs_kernel
def test_a_parent_out_of_range_is_an_error_naming_it():
    parents = jnp.asarray(PARENTS, jnp.int32).at[2, 1].set(4)
    with pytest.raises(Exception, match="beam_reorder: parent out of range"):
        jax.block_until_ready(beam_reorder.reorder(random_cache(jnp.float32), parents, 3))


def test_a_cache_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match=r"cache \(20, 3, 8\) is not \(B\*K, heads"):
        beam_reorder.reorder(jnp.zeros((20, 3, 8)), jnp.zeros((5, 4), jnp.int32), 1)
    with pytest.raises(ValueError, match="for parents"):
        beam_reorder.reorder(random_cache(jnp.float32), jnp.zeros((4, 4), jnp.int32), 1)


@needs_kernel
def test_in_a_loop_the_cache_is_moved_in_place_without_a_copy():
    """The engine's order: reorder first, then write the step's slot. XLA then aliases the
    loop's buffer; a copy of the (B*K, heads, T, head_dim) cache per step would cost more than
    the gather it replaces."""
    parents = jnp.asarray(PARENTS, jnp.int32)

    def body(i, cache):
        cache = beam_reorder.reorder(cache, parents, i)
        return jax.lax.dynamic_update_slice(cache, jnp.ones((20, 3, 1, 5)), (0, 0, i, 0))

    loop = jax.jit(lambda cache: jax.lax.fori_loop(0, 8, body, cache), donate_argnums=0)
    hlo = loop.lower(jnp.zeros((20, 3, 8, 5))).compile().as_text()
    copies = [line for line in hlo.splitlines() if " copy(" in line and "f32[20,3,8,5]" in line]
    assert copies == []


def test_switch_values(monkeypatch):
    monkeypatch.setenv(SWITCH, "fast")
    with pytest.raises(SwitchError, match="FLAX_TRANSFORMER_REORDER_KERNEL='fast'"):
        KERNELS.reorder.active()
    monkeypatch.setenv(SWITCH, "xla")
    assert KERNELS.reorder.reason_unavailable() == "FLAX_TRANSFORMER_REORDER_KERNEL=xla"
    assert not KERNELS.reorder.active()


def test_where_it_cannot_run_it_falls_back_or_says_why(monkeypatch):
    monkeypatch.setattr(cpu, "platform_problem", lambda: "no kernels here")
    monkeypatch.setenv(SWITCH, "auto")
    assert KERNELS.reorder.reason_unavailable() == "no kernels here"
    assert not KERNELS.reorder.active()
    monkeypatch.setenv(SWITCH, "native")
    with pytest.raises(SwitchError, match="cannot run here: no kernels here"):
        KERNELS.reorder.active()


@needs_kernel
def test_the_state_reordered_in_place_equals_the_gathered_one(monkeypatch):
    """A decoder's cache as the engine holds it: the self-attention caches move, the
    cross-attention's and the indices stay; in the engine the slots past cache_index are
    empty in every beam, so the two caches are equal in every slot."""
    config = preset("tiny", src_vocab_size=31, tgt_vocab_size=29, max_len=24)
    model = model_for(config, "seq2seq")
    tokens = jnp.ones((2, 5), jnp.int32)

    @jax.jit  # (op by op, the tiny model's init and two calls take seconds)
    def filled_cache(cache):  # 3 target tokens written into an 8-slot cache
        params = model.init(jax.random.key(0), tokens, tokens)
        encoded = model.apply(params, tokens, method="encode")
        _, new = model.apply(
            {**params, "cache": cache}, encoded, tokens[:, :3],
            decode=True, method="decode", mutable=["cache"],
        )  # fmt: skip
        return new["cache"]

    state = CachedState(filled_cache(init_cache(model, 2, 8, src_len=5)), None).for_beams(3)

    def noisy(x):  # beams of a row differ in the 3 filled slots; the rest stay empty
        if x.ndim != 4 or x.shape[0] != 6:
            return x
        return x.at[:, :, :3].add(jax.random.normal(jax.random.key(1), x[:, :, :3].shape))

    state = state.replace(cache=jax.tree.map(noisy, state.cache))
    parents = jnp.asarray([[2, 0, 0], [1, 2, 0]], jnp.int32)
    in_place = state.reordered(parents)
    monkeypatch.setenv(SWITCH, "xla")
    gathered = state.reordered(parents)
    jax.tree.map(np.testing.assert_array_equal, in_place.cache, gathered.cache)


@needs_kernel
@pytest.mark.slow  # two beam-search compilations, 10 s; the fast suite's decoding and Hugging
# Face token tests run through the kernel too, and the state test above compares the caches
def test_beam_search_tokens_and_scores_equal_the_gathers(monkeypatch):
    config = preset("tiny", src_vocab_size=31, tgt_vocab_size=29, max_len=40)
    model = model_for(config, "seq2seq")
    params = model.init(jax.random.key(3), jnp.ones((1, 7), jnp.int32), jnp.ones((1, 7), jnp.int32))
    src = np.random.default_rng(2).integers(3, 31, (3, 7))

    def search(switch):
        monkeypatch.setenv(SWITCH, switch)
        jax.clear_caches()  # the path is chosen when the search is traced
        return generate(
            model, params, src, Beam(4, alpha=0.6), max_new_tokens=36, eos_id=5, bos_id=1
        )

    tokens, scores = search("native")
    gathered_tokens, gathered_scores = search("xla")
    np.testing.assert_array_equal(tokens, gathered_tokens)
    np.testing.assert_array_equal(scores, gathered_scores)
