"""decoding.top_k: the chunked top-k gives jax.lax.top_k's values and indices exactly (of the
row with -0.0 made +0.0 and every NaN +NaN)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer.decoding.top_k import canonical, chunk_for, top_k


def _same_as_lax(x, k, chunk):
    """x (R, N) or (R, G, V), compared with lax.top_k over the flat (R, G * V) row."""
    want_values, want_index = jax.lax.top_k(canonical(x.reshape(x.shape[0], -1)), k)
    values, index = jax.jit(top_k, static_argnums=(1, 2))(x, k, chunk)
    np.testing.assert_array_equal(np.asarray(index), np.asarray(want_index))
    # bit-equal values (signed zeros, NaN included)
    np.testing.assert_array_equal(
        np.asarray(values).view(np.int32), np.asarray(want_values).view(np.int32)
    )


@pytest.mark.parametrize("n", [4 * 1000, 4 * 997 + 3])  # a multiple of the chunk, and not
def test_random_rows(n):
    x = jnp.asarray(np.random.default_rng(0).standard_normal((5, n)), jnp.float32)
    _same_as_lax(x, 8, 16)


@pytest.mark.parametrize("vocab", [16 * 60, 16 * 60 + 5])  # groups of whole chunks, and not
def test_grouped_rows_as_beam_search_passes_them(vocab):
    # (rows, beams, vocab): chunks run along each beam's scores; indices flat over beams x vocab
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((3, 4, vocab)), jnp.float32)
    _same_as_lax(x, 8, 16)
    ties = jnp.asarray(rng.integers(0, 2, (3, 4, vocab)), jnp.float32)
    _same_as_lax(ties, 8, 16)


def test_grouped_rows_after_a_forced_token():
    # every beam's scores -inf but one token: 4 finite, the other 4 of the 8 are the first -inf
    # by flat index, never the fill past a beam's short chunk
    x = np.full((2, 4, 16 * 60 + 5), -np.inf, np.float32)
    x[:, :, 7] = [-1.0, -3.0, -2.0, -0.5]
    _same_as_lax(jnp.asarray(x), 8, 16)
    values, index = top_k(jnp.asarray(x), 8, 16)
    assert index[0].tolist()[:4] == [3 * 965 + 7, 7, 2 * 965 + 7, 965 + 7]


def test_the_fill_past_a_short_chunk_is_never_chosen():
    # many short groups, all -inf: the 6 best are the first 6 by index, across group 0's short
    # chunk (index 4, then past the group's end) into group 1 (index 5)
    x = jnp.full((1, 40, 5), -jnp.inf, jnp.float32)
    _same_as_lax(x, 6, 4)


def test_ties_go_to_the_lower_index_across_and_inside_chunks():
    # few distinct values: the k best are all ties, spread over many chunks
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.integers(0, 3, (6, 3000)), jnp.float32)
    _same_as_lax(x, 8, 16)
    _same_as_lax(jnp.zeros((2, 3000), jnp.float32), 8, 16)


def test_ties_in_chunks_picked_out_of_index_order():
    # chunk 20 has the best value, chunk 3 the second; both hold ties of the third best, which
    # must come lower index first (chunk 3's before chunk 20's)
    x = np.full((1, 2000), -5.0, np.float32)
    x[0, 20 * 16 + 1], x[0, 3 * 16 + 1] = 9.0, 8.0
    x[0, [20 * 16 + 5, 3 * 16 + 7, 20 * 16 + 2, 3 * 16 + 2]] = 1.0
    _same_as_lax(jnp.asarray(x), 6, 16)


def test_signed_zeros_rank_equal_and_nan_first():
    x = np.full((1, 2000), -np.inf, np.float32)
    x[0, np.arange(10) * 16] = -0.0
    x[0, [50 * 16 + 3, 50 * 16 + 4]] = [-0.0, 0.0]
    values, index = top_k(jnp.asarray(x), 8, 16)
    assert index.tolist() == [list(range(0, 8 * 16, 16))]  # equal zeros: lower index first
    assert np.signbit(np.asarray(values)).sum() == 0  # every zero returned as +0.0
    x[0, 1999], x[0, 700] = np.float32(-np.nan), np.nan  # a NaN ranks first, either sign
    values, index = top_k(jnp.asarray(x), 8, 16)
    assert index[0, :2].tolist() == [700, 1999] and np.isnan(values[0, :2]).all()


def test_rows_of_minus_inf_with_few_finite_values():
    rng = np.random.default_rng(2)
    x = np.full((4, 2000), -np.inf, np.float32)
    # rows of beam search after a forced token: a few finite or zero scores among -inf
    x[0, [1500, 17, 900]] = [-0.0, 0.0, -0.0]
    x[1, rng.integers(0, 2000, 5)] = -rng.random(5).astype(np.float32)
    x[2, [3, 1999]] = [np.nan, np.inf]
    x[3] = -0.0
    _same_as_lax(jnp.asarray(x), 8, 16)


def test_short_rows_and_other_dtypes_use_lax_top_k():
    x = jnp.arange(40, dtype=jnp.float32)[None, ::-1]
    _same_as_lax(x, 8, 16)  # 3 chunks: fewer than 4 k
    values, index = top_k(jnp.arange(5000, dtype=jnp.int32)[None], 3)
    assert index.tolist() == [[4999, 4998, 4997]]


def test_canonical_changes_only_signed_zeros_and_nan():
    x = np.array([-np.nan, np.nan, np.inf, 1.0, 0.0, -0.0, -1e-45, -np.inf], np.float32)
    got = np.asarray(canonical(jnp.asarray(x)))
    want = np.array([np.nan, np.nan, np.inf, 1.0, 0.0, 0.0, -1e-45, -np.inf], np.float32)
    np.testing.assert_array_equal(got.view(np.int32)[2:], want.view(np.int32)[2:])
    assert np.isnan(got[:2]).all() and not np.signbit(got[:2]).any()


def test_the_chunk_divides_the_vocabulary_where_it_can():
    assert chunk_for(58101) == 321  # opus-mt: 3 x 107 x 181
    assert chunk_for(32000) == 256 and chunk_for(59514) == 273
    assert chunk_for(50265) == 256  # no divisor in range: each group ends in a short chunk
    x = jnp.asarray(np.random.default_rng(4).standard_normal((2, 4, 58101)), jnp.float32)
    _same_as_lax(x, 8, None)


@pytest.mark.slow  # two compilations of the search (9 s); the fast suite has the HF twin
def test_gnmt_beam_search_chooses_as_with_lax_top_k(monkeypatch):
    """The project's beam search on a 4096-token model (its 4 x 4096 candidates go through
    chunks) gives the tokens and scores it gives with lax.top_k over the flat row."""
    from flax_transformer.decoding import Beam, beam_gnmt, generate
    from flax_transformer.nn.kinds import model_for
    from flax_transformer.spec.presets import preset

    config = preset("tiny", src_vocab_size=31, tgt_vocab_size=4096, max_len=16)
    model = model_for(config, "seq2seq")
    src = np.random.default_rng(5).integers(3, 31, (3, 7))
    params = model.init(jax.random.key(0), src, src)

    def search():
        jax.clear_caches()
        out = generate(model, params, src, Beam(4, alpha=0.6), max_new_tokens=8, bos_id=1, eos_id=2)
        return [np.asarray(x) for x in out]

    tokens, scores = search()
    flat = lambda x, k: jax.lax.top_k(x.reshape(x.shape[0], -1), k)  # noqa: E731
    monkeypatch.setattr(beam_gnmt, "top_k", flat)
    want_tokens, want_scores = search()
    np.testing.assert_array_equal(tokens, want_tokens)
    np.testing.assert_array_equal(scores, want_scores)
    assert len(np.unique(tokens)) > 4  # the random model does not repeat one token
