"""The decoding engine: one while_loop in the package, the shared token rules, the old names as
deprecation shims."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer import TransformerLM, preset
from flax_transformer.decoding import Beam, Greedy, Sample, generate
from flax_transformer.decoding.cache import make_stepper
from flax_transformer.decoding.inputs import lm_inputs
from flax_transformer.decoding.rules import ChooseGreedy, ChooseSample, first_argmax

PACKAGE = Path(__file__).resolve().parents[1] / "flax_transformer"
ENGINE = PACKAGE / "decoding" / "engine.py"


def while_loop_calls(path: Path) -> list[int]:
    """Lines of the calls to `while_loop` (jax.lax.while_loop, lax.while_loop, a bare import)
    in the file's code; docstrings and comments are not code."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == "while_loop":
                lines.append(node.lineno)
        if isinstance(node, ast.ImportFrom) and any(a.name == "while_loop" for a in node.names):
            lines.append(node.lineno)  # `from jax.lax import while_loop` then an alias
    return lines


def test_one_while_loop_in_the_package():
    """Every search runs on decoding/engine.py's loop: a second lax.while_loop fails this."""
    found = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := while_loop_calls(path))
    }
    assert list(found) == ["decoding/engine.py"], found
    assert len(found["decoding/engine.py"]) == 1, found


def test_the_loop_finder_sees_a_loop(tmp_path):
    code = tmp_path / "x.py"
    code.write_text('"""lax.while_loop in a docstring"""\n# jax.lax.while_loop\nimport jax\n'
                    "y = jax.lax.while_loop(c, b, 0)\n")  # fmt: skip
    assert while_loop_calls(code) == [4]


# ------------------------------------------------------------------------ the token rules


def test_greedy_takes_the_first_of_equal_maxima():
    logits = jnp.array([[0.0, 2.0, 2.0, 1.0], [3.0, 3.0, 3.0, 3.0], [-jnp.inf] * 4])
    np.testing.assert_array_equal(first_argmax(logits), [1, 0, 0])
    np.testing.assert_array_equal(ChooseGreedy()(logits), jnp.argmax(logits, axis=-1))


def _transformers_filter(scores, temperature, top_k, top_p):
    torch = pytest.importorskip("torch")
    generation = pytest.importorskip("transformers.generation.logits_process")
    warpers = []
    if temperature != 1.0:
        warpers.append(generation.TemperatureLogitsWarper(temperature))
    if top_k:
        warpers.append(generation.TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(generation.TopPLogitsWarper(top_p))
    x = torch.from_numpy(np.asarray(scores, np.float32))
    for warp in warpers:
        x = warp(None, x)
    return np.isfinite(x.numpy())


@pytest.mark.parametrize("ties", ["keep", "transformers"])
@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(1.0, 5, 1.0), (0.7, 0, 0.9), (1.5, 20, 0.5)]
)
def test_the_sampling_rule_keeps_the_tokens_transformers_keeps(temperature, top_k, top_p, ties):
    """Without ties at the top-p cut, both tie policies keep exactly the tokens transformers'
    warpers keep."""
    scores = np.random.default_rng(0).normal(size=(6, 50)).astype(np.float32) * 3
    rule = ChooseSample(temperature, top_k, top_p, top_p_ties=ties)
    ours = np.isfinite(rule.filtered(jnp.asarray(scores) / temperature))
    np.testing.assert_array_equal(ours, _transformers_filter(scores, temperature, top_k, top_p))


def _hf_rule(top_k, top_p, vocab=50):
    """The sampling rule hf.generate builds (its plan and knobs from transformers' options)."""
    from flax_transformer.hf.generation_options import resolve
    from flax_transformer.hf.generation_processors import plan_and_knobs, sampling_rule

    opts = resolve(kwargs=dict(do_sample=True, top_k=top_k, top_p=top_p, max_new_tokens=4),
                   generation_config={}, hf_config={}, is_seq2seq=False, prompt_len=1,
                   vocab_size=vocab)  # fmt: skip
    return sampling_rule(*plan_and_knobs(opts, vocab))


def test_top_p_ties_at_the_cut_hf_as_transformers_project_keeps_both():
    """Probabilities (0.25, 0.5, 0.25), top_p 0.6: the two 0.25 tokens are equal. transformers'
    warper (stable ascending sort) drops the first of them and keeps the other; Hugging Face's
    generate keeps exactly that set, the project's Sample keeps both (decoding/rules.py)."""
    scores = np.log(np.array([[0.25, 0.5, 0.25]], np.float32))
    theirs = _transformers_filter(scores, 1.0, 0, 0.6)
    np.testing.assert_array_equal(theirs, [[False, True, True]])
    hf = ChooseSample(1.0, 0, 0.6, use_top_k=False, top_p_ties="transformers")
    np.testing.assert_array_equal(np.isfinite(hf.filtered(jnp.asarray(scores))), theirs)
    project = ChooseSample(1.0, 0, 0.6)
    np.testing.assert_array_equal(np.isfinite(project.filtered(jnp.asarray(scores))), [[1, 1, 1]])


def _stable_torch_sort(monkeypatch):
    """torch.sort made stable (what torch's default sort does for rows of <= 16 entries)."""
    torch = pytest.importorskip("torch")
    sort = torch.sort
    monkeypatch.setattr(torch, "sort", lambda x, **kw: sort(x, **kw, stable=True))


@pytest.mark.parametrize("vocab", [16, 50])
@pytest.mark.parametrize(("top_k", "top_p"), [(0, 0.6), (0, 0.9), (7, 0.8), (12, 0.3), (5, 1.0)])
def test_hf_sampling_rule_keeps_transformers_set_with_many_ties(top_k, top_p, vocab, monkeypatch):
    """Logits on a coarse grid (many equal values at every cut): the rule hf.generate uses
    keeps exactly transformers' set, ties included, the top-p cut compared as transformers
    compares it (float32 of the Python 1 - top_p). Rows of 16 tokens: transformers' warpers
    as they run (torch's default sort is stable up to 16 entries). Rows of 50: torch's default
    sort is not stable there (the order of equal logits is torch's implementation detail), so
    the warpers run with torch.sort(stable=True), the order this rule reproduces."""
    rng = np.random.default_rng(3)
    scores = rng.integers(-4, 3, size=(64, vocab)).astype(np.float32) / 2
    rule = _hf_rule(top_k, top_p, vocab)
    assert rule.top_p_ties == "transformers"
    ours = np.isfinite(rule.filtered(jnp.asarray(scores)))
    if vocab > 16:
        _stable_torch_sort(monkeypatch)
    theirs = _transformers_filter(scores, 1.0, top_k, top_p)
    np.testing.assert_array_equal(ours, theirs)
    if top_p < 1.0:  # the case exercises the tie rule: the project's rule keeps more somewhere
        project = np.isfinite(ChooseSample(1.0, top_k, top_p).filtered(jnp.asarray(scores)))
        assert (project & ~theirs).any() and not (theirs & ~project).any()


def test_top_p_ties_must_be_a_known_policy():
    with pytest.raises(ValueError, match="top_p_ties must be 'keep' or 'transformers'"):
        ChooseSample(top_p_ties="drop")


def test_temperature_zero_is_greedy_and_one_divides_exactly():
    logits = jnp.asarray(np.random.default_rng(1).normal(size=(4, 30)), jnp.float32)
    key = jax.random.key(0)
    np.testing.assert_array_equal(ChooseSample(0.0)(logits, key), first_argmax(logits))
    np.testing.assert_array_equal(
        ChooseSample(1.0, use_top_k=False, use_top_p=False)(logits, key),
        jax.random.categorical(key, logits, axis=-1),
    )


# ------------------------------------------------------------------- the deprecated modules

MOVED = [
    ("decoding.sampling", "NEG_INF", "decoding.rules"),
    ("decoding.sampling", "TokenLoop", "decoding.token_search"),
    ("decoding.beam", "length_penalty", "decoding.beam_gnmt"),
    ("decoding.beam", "Hypotheses", "decoding.beam_gnmt"),
    ("decoding.beam", "BeamLoop", "decoding.engine"),
    ("hf.generation_greedy", "Rows", "hf.generation_rows"),
    ("hf.generation_greedy", "write_column", "hf.generation_rows"),
    ("hf.generation_greedy", "first_argmax", "decoding.rules"),
    ("hf.generation_greedy", "GreedyLoop", "decoding.token_search"),
    ("hf.generation_beam", "BIG", "hf.beam_selector"),
    ("hf.generation_beam", "BeamLoop", "hf.beam_selector"),
]  # fmt: skip


@pytest.mark.parametrize(("old", "name", "home"), MOVED)
def test_old_names_warn_and_name_their_new_home(old, name, home):
    """MOVED: (old module, name, its new home), all under flax_transformer."""
    module = importlib.import_module(f"flax_transformer.{old}")
    with pytest.warns(DeprecationWarning, match=rf"use flax_transformer\.{home}\."):
        value = getattr(module, name)
    assert value is not None
    with pytest.raises(AttributeError):
        module.nope  # noqa: B018


def test_old_hf_search_functions_warn():
    """They warn before anything else (here they then fail on arguments that are no rows)."""
    from flax_transformer.hf import generation_beam, generation_greedy

    kw = dict(n_new=1, prefix_len=1)
    with pytest.warns(DeprecationWarning, match="hf.generation.token_selector"):
        with pytest.raises(AttributeError):
            generation_greedy.greedy_search(None, None, None, None, None, sample=False,
                                            has_eos=True, **kw)  # fmt: skip
    with pytest.warns(DeprecationWarning, match="hf.beam_selector.HFBeam"):
        with pytest.raises(AttributeError):
            generation_beam.beam_search(None, None, None, None, beams=2, n_eos=1, **kw)


@pytest.fixture(scope="module")
def tiny_lm():
    config = preset("tiny", tgt_vocab_size=24, src_vocab_size=24, max_len=16, dropout_rate=0.0)
    model = TransformerLM(config)
    prompts = np.array([[1, 5, 6, 0], [1, 7, 8, 9]], np.int32)
    variables = model.init(jax.random.key(0), prompts)
    return model, variables, prompts


@pytest.mark.slow  # 11 s of compiling; the shims' warnings alone are tested fast above
def test_old_decoding_search_functions_warn_and_decode_the_same(tiny_lm):
    """decoding.sampling.greedy_or_sample / choose and decoding.beam.beam_search still decode
    (one engine run each), the same tokens and scores as generate."""
    from flax_transformer.decoding import beam, sampling

    model, variables, prompt_ids = tiny_lm
    prompts = lm_inputs(model, prompt_ids, None, 6)
    prompts = jax.tree.map(jnp.asarray, prompts)
    stepper = make_stepper(model, variables, None, prompt_ids.shape[1] + 5, True)
    eos, kw = jnp.int32(2), dict(prefix_len=3, max_new_tokens=6, pad_id=0)
    greedy = jax.jit(lambda p: sampling.greedy_or_sample(stepper, p, Greedy(), eos, None, **kw))
    with pytest.warns(DeprecationWarning, match="token_search.token_selector"):
        tokens = greedy(prompts)
    expected = generate(model, variables, prompt_ids, Greedy(), max_new_tokens=6, eos_id=2)
    np.testing.assert_array_equal(tokens, expected)
    search = jax.jit(lambda p: beam.beam_search(stepper, p, Beam(3, 0.6), eos, **kw))
    with pytest.warns(DeprecationWarning, match="beam_gnmt.GNMTBeam"):
        seqs, scores = search(prompts)
    want_seqs, want_scores = generate(
        model, variables, prompt_ids, Beam(3, 0.6), max_new_tokens=6, eos_id=2
    )
    np.testing.assert_array_equal(seqs, want_seqs)
    np.testing.assert_array_equal(scores, want_scores)
    logits = jnp.asarray(np.random.default_rng(2).normal(size=(2, 24)), jnp.float32)
    with pytest.warns(DeprecationWarning, match="token_search.chooser"):
        chosen = sampling.choose(Sample(0.0), logits, jax.random.key(0))
    np.testing.assert_array_equal(chosen, first_argmax(logits))
