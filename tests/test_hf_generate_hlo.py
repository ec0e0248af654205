"""The compiled decoding loop of `HFModel.generate` copies no large array on every step.

Two such copies made decoding slow without changing a token, so only the compiled program
shows them (docs/hf-generation.md, Speed):
- the KV cache kept as (batch, len, heads, head_dim) made XLA transpose every layer's self- and
  cross-attention cache on every step (the cache is now heads first);
- one row's tied output projection written as x @ embedding.T made XLA transpose the whole
  embedding table on every step (it is now embedding @ x).
These tests compile generate's search for a tiny Marian model and look inside the loop body of
the optimised HLO for transposes of arrays as large as a cache or the table.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.hf_models import build, save

pytest.importorskip("transformers")

NEW = 6  # new tokens: the self-attention cache holds 6 positions
SRC = 7  # source tokens


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    from flax_transformer import hf

    return hf.load(save(build("marian", seed=2), tmp_path_factory.mktemp("marian")))


def compiled_search(monkeypatch, hf_model, batch: int, num_beams: int) -> str:
    """The optimised HLO text of the jitted search that generate() runs."""
    from flax_transformer.hf import generation

    real, texts = generation._run, []

    def spy(*args, **kwargs):
        texts.append(real.lower(*args, **kwargs).compile().as_text())
        return real(*args, **kwargs)

    monkeypatch.setattr(generation, "_run", spy)
    ids = np.random.default_rng(0).integers(2, 60, (batch, SRC))
    hf_model.generate(ids, np.ones_like(ids), num_beams=num_beams, max_new_tokens=NEW)
    (text,) = texts
    return text


def loop_bodies(hlo: str) -> list[str]:
    """The text of every while loop's body computation."""
    bodies = []
    for name in set(re.findall(r"\bwhile\(.*?body=%?([\w.\-]+)", hlo)):
        match = re.search(rf"^%?{re.escape(name)} \(.*?^\}}", hlo, re.S | re.M)
        assert match, f"loop body {name} not found in the HLO"
        bodies.append(match.group(0))
    return bodies


def large_transposes(body: str, min_elements: int) -> list[str]:
    """Instructions named for a transpose whose result has at least min_elements elements."""
    found = []
    for name, dims in re.findall(r"^\s*(?:ROOT )?%([\w.\-]*transpose[\w.\-]*) = \w+\[([\d,]*)\]",
                                 body, re.M):  # fmt: skip
        size = int(np.prod([int(d) for d in dims.split(",") if d]))
        if size >= min_elements:
            found.append(f"{name} [{dims}]")
    return found


@pytest.mark.parametrize("batch,num_beams", [(1, 1), (2, 3)])
def test_the_loop_transposes_no_cache_and_no_table(monkeypatch, marian, batch, num_beams):
    cfg = marian.config
    rows = batch * num_beams
    smallest = min(
        rows * cfg.d_model * NEW,  # one layer's self-attention cache (keys or values)
        batch * cfg.d_model * SRC,  # one layer's cross-attention keys or values
        cfg.tgt_vocab_size * cfg.d_model,  # the embedding table
    )
    bodies = loop_bodies(compiled_search(monkeypatch, marian, batch, num_beams))
    assert bodies, "no while loop in the compiled search"
    for body in bodies:
        assert large_transposes(body, smallest) == [], "a large transpose runs on every step"
