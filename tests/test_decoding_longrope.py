"""Phi-3's longrope switch-over in the package's own generate (decoding/longrope.py) and in `ftx
generate` on an imported run: each row generated as transformers' generate makes it alone (the
long table from position original_max_position_embeddings = 13 on, the whole sequence run again
there; a prompt past 13 tokens on the long table from the prefill), whatever else is in its
batch. Prompts of 4 to 16 tokens with 16 new ones in one batch give transformers' tokens row by
row; the model as it is (its table picked per call, never re-run: what generate did before)
gives other tokens. The tiny Phi-3 is tests/hf_llms.py's cell at transformers' random init: its
small logit margins make the table matter (the trained cell counts whatever the table)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

from flax_transformer import hf
from flax_transformer.decoding import api
from flax_transformer.decoding.longrope import plan_rows_alone
from flax_transformer.decoding.strategies import Beam, Greedy, Sample
from flax_transformer.hf.config import hf_to_config
from tests import hf_llms

CELL = "phi3_fused_longrope_partial"
ORIGINAL = 13  # the cell's original_max_position_embeddings
NEW = 16
LENGTHS = (10, 4, 16, 13, 14, 7)  # below, at and past 13 tokens (BOS included)


def word_tokenizer():
    """A word-level tokenizer over the cell's 61 ids: "w3" is id 3; <pad> 0, <s> 1, </s> 2."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": hf_llms.BOS, "</s>": hf_llms.EOS}
    vocab.update({f"w{i}": i for i in range(3, hf_llms.VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    """(transformers model, its save_pretrained directory with the word-level tokenizer)."""
    torch_model = hf_llms.build(CELL, steps=0)
    path = tmp_path_factory.mktemp("phi3_longrope")
    torch_model.save_pretrained(path)
    word_tokenizer().save_pretrained(path)
    return torch_model, path


def prompts(seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[hf_llms.BOS, *rng.integers(3, hf_llms.VOCAB, n - 1).tolist()] for n in LENGTHS]


def right_padded(rows):
    tokens = np.zeros((len(rows), max(map(len, rows))), np.int32)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
    return tokens, np.array([len(row) for row in rows], np.int32)


def transformers_alone(torch_model, rows) -> list[list[int]]:
    """transformers' new tokens for each row generated alone (batch of one, no padding),
    greedy, up to its first EOS included."""
    config = hf_to_config(torch_model.config.to_dict())[0]
    double = torch_model.dtype == torch.float64
    outs = []
    with torch.no_grad(), hf_llms.float64_norms_and_rotary(config) if double else _nothing():
        for row in rows:
            ids = torch.tensor([row])
            out = torch_model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False,
                pad_token_id=0,
            )  # fmt: skip
            outs.append(out[0, len(row) :].tolist())
    return outs


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def assert_rows_match(ours: np.ndarray, theirs: list[list[int]], what: str):
    """Each of our rows (NEW tokens, pad after the first EOS) is transformers' row."""
    for i, row in enumerate(theirs):
        expected = row + [0] * (NEW - len(row))
        assert ours[i].tolist() == expected, f"{what}: row {i} ({LENGTHS[i]} prompt tokens)"


def test_plan_rows_alone_names_where_the_long_table_is_needed():
    config = hf_to_config({"model_type": "phi3", **hf_llms.SIZES, **hf_llms.CELLS[CELL][1]})[0]
    lengths = np.array([4, 10])
    assert plan_rows_alone(config, lengths, ORIGINAL) == ("plain", False)  # positions < 13
    assert plan_rows_alone(config, lengths, ORIGINAL + 1) == ("switch", False)
    assert plan_rows_alone(config, lengths + 6, 40) == ("switch", True)  # 16 > 13, 10 <= 13
    assert plan_rows_alone(config, lengths + 20, 40) == ("long", False)  # every prompt past 13
    assert plan_rows_alone(config, jax.numpy.asarray(lengths), 40) == ("switch", True)  # traced
    plain = config.replace(rope_scaling="default", rope_short_factors=None, rope_long_factors=None)
    assert plan_rows_alone(plain, lengths, 40) == ("plain", False)


def search(model, tokens, lengths, strategy=Greedy(), **kwargs):  # noqa: B008
    out = api.generate(
        model.module, model.variables, tokens, strategy, lengths=lengths, max_new_tokens=NEW,
        eos_id=hf_llms.EOS, **kwargs,
    )  # fmt: skip
    return jax.tree.map(np.asarray, out)


@pytest.mark.slow
def test_greedy_rows_are_transformers_rows_alone_and_the_switch_matters(phi3, monkeypatch):
    """Float64: cached and recomputing (use_cache=False) search give each row's tokens
    alone; the model's own table per call without the re-run gives other tokens."""
    torch_model, path = phi3
    rows = prompts()
    theirs = transformers_alone(torch_model.double(), rows)
    torch_model.float()
    tokens, lengths = right_padded(rows)
    with jax.enable_x64(True):
        model = hf.load(path, dtype="float64")
        assert_rows_match(search(model, tokens, lengths), theirs, "cached")
        uncached = search(model, tokens, lengths, use_cache=False)
        assert_rows_match(uncached, theirs, "recomputing")
        monkeypatch.setattr(api, "plan_rows_alone", lambda *args: ("plain", False))
        before = search(model, tokens, lengths)
    differs = [i for i, row in enumerate(theirs) if before[i, : len(row)].tolist() != row]
    assert differs, "the model's table per call gave transformers' tokens: nothing was tested"


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [Beam(3, 0.6), Sample(1.0, top_k=8)], ids=["beam", "sample"])
def test_beam_and_sampling_cached_equal_the_recomputing_reference(phi3, strategy):
    """The KV-cached switching stepper against the recomputing one, whose every call is on
    the table of the position it gives logits for (float64, token-identical, same key)."""
    _, path = phi3
    tokens, lengths = right_padded(prompts(seed=2))
    rng = jax.random.key(3) if isinstance(strategy, Sample) else None
    with jax.enable_x64(True):
        model = hf.load(path, dtype="float64")
        cached = search(model, tokens, lengths, strategy, rng=rng)
        uncached = search(model, tokens, lengths, strategy, rng=rng, use_cache=False)
    tokens_of = lambda out: out[0] if isinstance(strategy, Beam) else out  # noqa: E731
    np.testing.assert_array_equal(tokens_of(cached), tokens_of(uncached))


@pytest.mark.slow
def test_ftx_generate_on_the_imported_run_gives_each_lines_tokens_alone(phi3, tmp_path, capsys):
    """`ftx hf import`, then `ftx generate` on a file of six prompts in one batch (float32, as
    the run computes): each output line is transformers' continuation of that line alone."""
    from flax_transformer.cli.generate import main as generate_main
    from flax_transformer.cli.hf import main as hf_main

    torch_model, path = phi3
    rows = prompts()
    run_dir = tmp_path / "run"
    assert hf_main(["import", str(path), "--workdir", str(run_dir)]) == 0
    lines = tmp_path / "prompts.txt"
    lines.write_text("".join(" ".join(f"w{i}" for i in row[1:]) + "\n" for row in rows))
    capsys.readouterr()
    argv = ["--workdir", str(run_dir), "--input", str(lines), "--max-new-tokens", str(NEW)]
    assert generate_main([*argv, "--batch-size", str(len(rows))]) == 0
    outputs = capsys.readouterr().out.split("\n")[:-1]
    tokenizer = word_tokenizer()
    theirs = transformers_alone(torch_model.float(), rows)
    expected = [tokenizer.decode(row, skip_special_tokens=True) for row in theirs]
    assert outputs == expected
