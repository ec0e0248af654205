"""bench.llm_generate: the shape flags, the prompts (ragged, left-padded), the table, and a smoke
run at a tiny shape in which the project's float32 tokens equal transformers'."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import ct2_peer, llm_generate


def test_default_shape_is_qwen2_5_0_5b():
    sizes = llm_generate.model_sizes(llm_generate.parse_args(["--json", "x"]))
    assert (sizes["num_hidden_layers"], sizes["hidden_size"], sizes["intermediate_size"]) == (
        24, 896, 4864,
    )  # fmt: skip
    assert (sizes["num_attention_heads"], sizes["num_key_value_heads"]) == (14, 2)
    assert sizes["vocab_size"] == 151936 and sizes["tie_word_embeddings"] is True
    assert sizes["rope_theta"] == 1e6


def test_size_flags_shrink_the_shape_and_move_eos_to_the_last_id():
    argv = ["--json", "x", "--layers", "2", "--d-model", "64", "--heads", "4", "--kv-heads", "1"]
    args = llm_generate.parse_args([*argv, "--d-ff", "96", "--vocab", "300"])
    sizes = llm_generate.model_sizes(args)
    assert (sizes["num_hidden_layers"], sizes["hidden_size"], sizes["intermediate_size"]) == (
        2, 64, 96,
    )  # fmt: skip
    assert sizes["num_key_value_heads"] == 1 and sizes["max_window_layers"] == 2
    assert sizes["eos_token_id"] == sizes["bos_token_id"] == 299


def test_bad_shape_is_one_line(tmp_path, capsys):
    argv = ["--json", str(tmp_path / "x.json"), "--quick", "--heads", "3"]
    assert llm_generate.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench.llm_generate: --d-model 32 must divide by --heads 3")
    assert err.count("\n") == 1 and not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("flag", ["--rounds", "--layers", "--new-tokens"])
def test_non_positive_counts_are_argparse_errors(flag):
    with pytest.raises(SystemExit) as error:
        llm_generate.parse_args(["--json", "x", flag, "0"])
    assert error.value.code == 2


def test_prompts_are_ragged_below_the_special_ids_and_left_padded():
    prompts = llm_generate.make_prompts(8, 1000)
    lengths = [len(p) for p in prompts]
    low, high = llm_generate.PROMPT_LENGTHS
    assert min(lengths) >= low and max(lengths) <= high and len(set(lengths)) > 1
    assert max(max(p) for p in prompts) < 1000 - 4
    ids, mask = llm_generate.left_padded(prompts, pad=999)
    assert ids.shape == mask.shape == (8, max(lengths))
    for row, prompt in enumerate(prompts):
        pads = ids.shape[1] - len(prompt)
        assert ids[row, pads:].tolist() == prompt and (ids[row, :pads] == 999).all()
        assert mask[row].tolist() == [0] * pads + [1] * len(prompt)


def test_ct2_names_put_eos_unk_and_pad_at_the_top():
    names = llm_generate.ct2_names(10, eos=9)
    assert names[9] == "</s>" and names[8] == "<pad>" and names[7] == "<unk>"
    assert names[:7] == [f"t{i}" for i in range(7)]


def test_table_gives_both_ratios_to_ctranslate2():
    cell = {"batch": 8, "same_tokens": True, "distinct_tokens": 40, "ct2_int8_agreement": 0.5}
    for side, rate in (("flax", 30), ("hf", 10), ("ct2_float32", 20), ("flax_int8", 90)):
        cell |= {f"{side}_tok_s": rate, f"{side}_tok_s_best": rate + 1}
    cell |= {"ct2_int8_tok_s": 60, "ct2_int8_tok_s_best": 61}
    machine = {
        "cpu": ct2_peer.cpu_info("model name\t: AMD EPYC\nflags\t: avx2\n"),
        "f32_kernel": "avx2 (packed weights)", "int8_kernel": "avx2 (packed weights)",
        "loadavg_start": [3.0, 2.0, 1.0], "loadavg_after_rounds": [4.5],
        "ctranslate2_skipped": None,
    }  # fmt: skip
    table = llm_generate.format_table({"cells": [cell], "machine": machine})
    row = "| 8 | 30.0 (31.0) | 10.0 (11.0) | 20.0 (21.0) | 90.0 (91.0) | 60.0 (61.0) |"
    assert row + " 1.50x | 1.50x | yes | 40 |" in table
    assert "ct2_int8 50.0% (batch 8)" in table and "4.50 after each round" in table


@pytest.mark.slow
def test_quick_run_writes_the_report(tmp_path, capsys):
    out = tmp_path / "llm.json"
    argv = ["--quick", "--rounds", "1", "--batches", "1", "3", "--new-tokens", "4"]
    assert llm_generate.main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [c["batch"] for c in result["cells"]] == [1, 3]
    for cell in result["cells"]:
        assert cell["same_tokens"] is True and cell["flax_tok_s"] > 0 and cell["hf_tok_s"] > 0
        assert cell["flax_int8_agreement"] >= 0
        if ct2_peer.missing() is None:
            assert cell["ct2_float32_agreement"] == 1.0  # CTranslate2's float32: the same tokens
    assert result["machine"]["new_tokens"] == 4
    assert np.isfinite(result["machine"]["loadavg_after_rounds"]).all()
    assert "| 3 |" in capsys.readouterr().out
