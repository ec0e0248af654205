"""Phi-3's longrope switch-over in generation (hf/longrope_generation.py): transformers' generate
takes the long factor table once the sequence passes original_max_position_embeddings (13 in
tests/hf_llms.py's Phi-3 cell), dropping its cache and running the whole sequence again; ours
gives its tokens on left-padded ragged prompts of up to 10 tokens with 20 new ones, and the
same search without the switch-over, or without the re-run, gives other tokens."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from flax_transformer import hf
from flax_transformer.hf import longrope_generation
from flax_transformer.hf.config import hf_to_config
from tests import hf_llms
from tests.test_hf_llms import hf_generate

CELL = "phi3_fused_longrope_partial"
ORIGINAL = 13  # the cell's original_max_position_embeddings
NEW = 20


def ragged(lengths=(10, 7, 9, 4), extra_pad: int = 0):
    """Left-padded prompts (pads 0), every row with `extra_pad` more padding in front."""
    ids, mask, _ = hf_llms.left_padded(np.random.default_rng(5), lengths=lengths)
    pad = ((0, 0), (extra_pad, 0))
    return np.pad(ids, pad), np.pad(mask, pad)


def test_plan_names_each_rows_switch_position():
    config = hf_to_config(
        {
            "model_type": "phi3",
            **hf_llms.SIZES,
            **hf_llms.CELLS[CELL][1],
        }  # fmt: skip
    )[0]
    pads = np.array([0, 3, 1, 6])
    mode, long_from, recompute = longrope_generation.plan(config, pads, 10, 10 + NEW)
    assert mode == "switch" and recompute  # a row without padding: transformers' re-run
    np.testing.assert_array_equal(long_from, ORIGINAL - pads)  # the row's column 13
    mode, long_from, recompute = longrope_generation.plan(config, pads + 1, 11, 11 + NEW)
    assert mode == "switch" and not recompute  # every row padded: its re-run is short-table
    np.testing.assert_array_equal(long_from, ORIGINAL + 1 - (pads + 1))
    assert longrope_generation.plan(config, pads, 10, ORIGINAL + 1)[0] == "plain"
    assert longrope_generation.plan(config, pads, ORIGINAL + 1, 20)[0] == "long"
    # 14 columns, every row padded: seq_len 13 at most, the short table throughout
    assert longrope_generation.plan(config, pads + 1, ORIGINAL + 1, ORIGINAL + 2)[0] == "plain"


def generate(path, ids, mask, **kwargs):
    with jax.enable_x64(True):
        return hf.load(path, dtype="float64").generate(ids, mask, **kwargs)


@pytest.mark.slow
def test_greedy_across_the_switch_is_token_identical_and_the_switch_matters(llms, monkeypatch):
    """Float64 greedy search (near-ties of a random model could flip in float32); the same
    search on the short table throughout, or switching without the re-run, differs."""
    torch_model, path = llms[CELL]
    ids, mask = ragged()
    kwargs = dict(max_new_tokens=NEW, min_new_tokens=NEW, pad_token_id=0)
    theirs = hf_generate(torch_model.double(), ids, mask, **kwargs)
    torch_model.float()
    np.testing.assert_array_equal(generate(path, ids, mask, **kwargs), theirs)
    plan = longrope_generation.plan
    wrong = {
        "switch ignored": lambda *args: ("plain", None, False),
        "no re-run": lambda *args: plan(*args)[:2] + (False,),
    }
    for name, variant in wrong.items():
        monkeypatch.setattr(longrope_generation, "plan", variant)
        assert np.any(generate(path, ids, mask, **kwargs) != theirs), name


@pytest.mark.slow
@pytest.mark.parametrize(
    "lengths, extra_pad, beams",
    [
        ((10, 7, 9, 4), 0, 4),  # beam search across the switch
        ((10, 7, 9, 4), 1, 1),  # every row padded: the long table comes one column later
        ((16, 9, 14, 3), 0, 1),  # a prompt past 13 tokens: the long table from the prefill
    ],
)
def test_other_searches_across_the_switch_are_token_identical(llms, lengths, extra_pad, beams):
    torch_model, path = llms[CELL]
    ids, mask = ragged(lengths, extra_pad)
    kwargs = dict(max_new_tokens=NEW, min_new_tokens=NEW, pad_token_id=0, num_beams=beams)
    theirs = hf_generate(torch_model.double(), ids, mask, **kwargs)
    torch_model.float()
    np.testing.assert_array_equal(generate(path, ids, mask, **kwargs), theirs)
