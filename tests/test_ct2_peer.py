"""bench.ct2_peer: CTranslate2's plumbing in bench.hf_generate (a tiny Marian converted with its
own converter and run in float32 and int8), the one line when it is missing, the CPU line."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from bench import ct2_peer, hf_generate

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse avx avx2 fma avx512f avx512bw avx512_vnni

processor\t: 1
model name\t: something else
"""


def test_cpu_line_names_the_model_and_its_vector_extensions():
    info = ct2_peer.cpu_info(CPUINFO)
    assert info["model_name"] == "AMD EPYC 9R14"
    assert (info["family"], info["model"]) == ("25", "17")
    assert info["extensions"] == ["avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni"]
    assert "amx_int8" in info["lacks"] and "avx2" not in info["lacks"]
    line = ct2_peer.describe_cpu(info)
    assert line.startswith("CPU: AMD EPYC 9R14 (family 25 model 17),")
    assert "has avx avx2 fma avx512f avx512bw avx512_vnni;" in line


def test_missing_ctranslate2_is_one_line_and_no_peers(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import fails
    line = ct2_peer.missing()
    assert line is not None and "\n" not in line and "not installed" in line
    assert ct2_peer.load_peers(tmp_path, hf_generate.TINY, 1) == ({}, line)
    assert ct2_peer.load_peers(tmp_path, hf_generate.TINY, 1, wanted=False)[0] == {}


def test_table_without_ctranslate2_says_so():
    cell = {"batch": 1, "num_beams": 1, "flax_tok_s": 2.0, "hf_tok_s": 1.0}
    cell |= {"floor_tok_s": 4.0, "same_tokens": True}
    machine = {"cpu": ct2_peer.cpu_info(CPUINFO), "ctranslate2_skipped": "CTranslate2 is not"}
    table = hf_generate.format_table({"cells": [cell], "machine": machine})
    assert "CT2" not in table.splitlines()[1]
    assert "| 1 | 1 | 2.0 | 1.0 | 4.0 | 2.00x | yes | - |" in table
    assert table.splitlines()[-1] == "CTranslate2 is not"


def test_agreement_skips_the_start_token_and_the_forced_eos():
    reference = np.array([[9, 5, 6, 7, 0], [9, 5, 6, 7, 0]])  # start, 3 tokens, forced EOS
    assert ct2_peer.agreement(reference, np.array([[5, 6, 7, 8], [5, 1, 7, 8]])) == 5 / 6


def test_tiny_marian_through_ctranslate2(tmp_path):
    """The CT2 path of the bench on a tiny random Marian: converted by CTranslate2's own
    converter, float32 and int8 Translators, ids in and out, every row `new_tokens` long, and
    float32 greedy agreeing with transformers' greedy."""
    if ct2_peer.missing():
        pytest.skip(ct2_peer.missing())
    import torch
    from transformers import MarianMTModel

    sizes = hf_generate.TINY
    hf_generate.make_checkpoint(tmp_path, sizes)
    peers, why = ct2_peer.load_peers(tmp_path, sizes, threads=1)
    assert why is None and set(peers) == {"ct2_float32", "ct2_int8"}
    sources = np.random.default_rng(0).integers(2, sizes["vocab_size"] - 1, (2, 6))
    new_tokens = 5
    for peer in peers.values():
        for beams in (1, 2):
            out = peer.generate(sources, beams, new_tokens)
            assert out.shape == (2, new_tokens)
            assert ((out >= 0) & (out < sizes["vocab_size"] - 1)).all()  # never <pad>
    model = MarianMTModel.from_pretrained(tmp_path).eval()
    ids = torch.as_tensor(sources)
    with torch.inference_mode():
        reference = model.generate(
            ids, attention_mask=torch.ones_like(ids), num_beams=1,
            max_new_tokens=new_tokens, min_new_tokens=new_tokens,
        ).numpy()  # fmt: skip
    ours = peers["ct2_float32"].generate(sources, 1, new_tokens)
    assert ct2_peer.agreement(reference, ours) == 1.0
