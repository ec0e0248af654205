"""The Llama-lineage family battery: the same checks for every cell of tests/hf_llms.py (Llama
with GQA; Llama with MQA, llama3 rope scaling and a tied head; Mistral with a sliding window
shorter than the batch; Qwen2 with its q/k/v biases, yarn scaling, windowed upper layers and a
tied head; Qwen3 with its q/k norms and an explicit head_dim), each model built and briefly
trained by transformers once per session, on a left-padded ragged batch:
- float64 logits within 1e-12 of transformers' with its RMS norms and rotary tables patched to
  float64 (it computes them in float32 even in a float64 model: tests/hf_llms.py), float32
  within 1e-5 of transformers' as it is;
- hf.save bit-exact per tensor, read back by from_pretrained strictly;
- the window and the rope scaling matter (ignoring either moves the logits off transformers');
- generation token-identical to transformers' generate (greedy; beam 4 with length penalty
  1.0 and 0.6), several EOS ids.
"""

from __future__ import annotations

import contextlib
import json

import jax
import numpy as np
import pytest
import torch

from flax_transformer import hf
from flax_transformer.spec.numerics import assert_close
from tests import hf_llms
from tests.hf_llms import CELLS, EOS

NEW = 8


# Cells whose float64 / float32 / save checks run in the slow pass only (the fast suite's
# budget): Gemma 2's cell covers what the Gemmas share (offset norms, the scaled embedding,
# GeGLU, a tied head) and its own switches in the fast suite.
SLOW_CELLS = ("gemma_mqa_tied", "gemma3_local_rope", "phi3_fused_longrope_partial")


def battery_cells(*fast: str):
    """Every cell, those of SLOW_CELLS not in `fast` under the slow mark."""
    slow = [n for n in SLOW_CELLS if n not in fast]
    return [pytest.param(n, marks=pytest.mark.slow) if n in slow else n for n in CELLS]


def logits_pair(torch_model, path, dtype: str, patched: bool):
    """(ours, transformers') logits at the real positions of the left-padded batch."""
    ids, mask, positions = hf_llms.left_padded(np.random.default_rng(0))
    model = hf.load(path, dtype=dtype)
    reference = torch_model.double() if dtype == "float64" else torch_model.float()
    ours = model.forward(ids, mask, position_ids=positions)
    args = dict(input_ids=ids, attention_mask=mask, position_ids=positions)
    with torch.no_grad():
        if patched:
            with hf_llms.float64_norms_and_rotary(model.config):
                theirs = reference(**{k: torch.from_numpy(v) for k, v in args.items()})
        else:
            theirs = reference(**{k: torch.from_numpy(v) for k, v in args.items()})
    torch_model.float()
    real = mask.astype(bool)
    return ours[real], theirs.logits.numpy()[real], model


@pytest.mark.parametrize("name", battery_cells())
def test_float64_logits_within_1e_12(llms, name):
    torch_model, path = llms[name]
    with jax.enable_x64(True):
        ours, theirs, _ = logits_pair(torch_model, path, "float64", patched=True)
    assert_close(ours, theirs, rtol=1e-12, what=f"{name} float64 logits (patched norms/rotary)")


# What each cell's float32 check also drops: the window, the rope scaling. The same weights
# without either must land far from transformers' logits (a model ignoring them could not pass).
IGNORED = {
    "mistral_window": [dict(sliding_window=None)],
    "qwen2_biases_yarn_window_tied": [dict(sliding_window=None), dict(rope_scaling="default")],
    "llama_mqa_llama3_tied": [dict(rope_scaling="default")],
    "gemma2_softcap_local_global": [
        dict(attention_logit_softcap=None),
        dict(final_logit_softcap=None),
        dict(sliding_window_pattern="s"),  # every layer local: the pattern ignored
    ],
    "gemma3_local_rope": [dict(rope_local_theta=None), dict(sliding_window_pattern="f")],
    "phi3_fused_longrope_partial": [dict(rope_scaling="default")],  # longrope ignored
}


@pytest.mark.parametrize("name", battery_cells())
def test_float32_logits_within_1e_5_and_the_window_and_scaling_matter(llms, name):
    torch_model, path = llms[name]
    ours, theirs, model = logits_pair(torch_model, path, "float32", patched=False)
    assert_close(ours, theirs, rtol=1e-5, what=f"{name} float32 logits")
    assert model.kind == "lm"
    ids, mask, positions = hf_llms.left_padded(np.random.default_rng(0))
    for ignored in IGNORED.get(name, []):
        model.module = type(model.module)(model.config.replace(**ignored))
        model.__dict__.pop("_apply", None)  # the jitted apply of the old module
        wrong = model.forward(ids, mask, position_ids=positions)[mask.astype(bool)]
        assert np.max(np.abs(wrong - theirs)) > 1e-2, (name, ignored)


@pytest.mark.parametrize("name", battery_cells("phi3_fused_longrope_partial"))
def test_save_is_bit_exact_and_transformers_reads_it_strictly(llms, name, tmp_path):
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    _, path = llms[name]
    hf.save(hf.load(path), tmp_path)
    before = load_file(str(path / "model.safetensors"))
    after = load_file(str(tmp_path / "model.safetensors"))
    assert sorted(after) == sorted(before)
    for key, value in before.items():
        assert after[key].dtype == value.dtype, key
        np.testing.assert_array_equal(after[key], value, err_msg=key)
    reloaded, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info
    assert (
        type(reloaded).__name__
        == json.loads((path / "config.json").read_text())["architectures"][0]
    )


def test_transformers_4_config_layout_reads_as_the_5_layout(llms, tmp_path):
    """rope_theta + rope_scaling ({"type": ...}) + torch_dtype, as transformers 4 wrote them,
    give the same model as rope_parameters + dtype."""
    from flax_transformer.hf.config import hf_to_config

    _, path = llms["llama_mqa_llama3_tied"]
    new = json.loads((path / "config.json").read_text())
    old = {k: v for k, v in new.items() if k not in ("rope_parameters", "dtype")}
    params = dict(new["rope_parameters"])
    old.update(rope_theta=params.pop("rope_theta"), torch_dtype="float32")
    params["type"] = params.pop("rope_type")
    old["rope_scaling"] = params
    assert hf_to_config(old)[0] == hf_to_config(new)[0]
    assert hf_to_config(new)[0].rope_scaling == "llama3"


def hf_generate(torch_model, ids, mask, **kwargs) -> np.ndarray:
    """transformers' generate; a float64 model with its float32 parts in float64
    (hf_llms.float64_norms_and_rotary: Gemma 2's float32 softmax gives NaN on left-padded
    rows of a float64 model)."""
    from flax_transformer.hf.config import hf_to_config

    config = hf_to_config(torch_model.config.to_dict())[0]
    patch = hf_llms.float64_norms_and_rotary(config)
    with torch.no_grad(), patch if torch_model.dtype == torch.float64 else contextlib.nullcontext():
        out = torch_model.generate(
            torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), **kwargs
        )
    return out.numpy()


def prompts():
    ids, mask, _ = hf_llms.left_padded(np.random.default_rng(3), lengths=(6, 2, 5, 3))
    return ids, mask


def generation_cells(*fast: str):
    """Every cell, those not in `fast` under the slow mark (a search compiles for ~10 s)."""
    return [n if n in fast else pytest.param(n, marks=pytest.mark.slow) for n in CELLS]


# Fast: grouped-query attention and a window shorter than prompt + new tokens (the fast suite's
# budget); every family's cell runs in the slow pass.
FAST = ("llama_gqa", "mistral_window")


def two_eos(new: np.ndarray) -> list[int]:
    """Two tokens of a free continuation `new` (B, NEW) that, as EOS ids together, end the
    rows at several different steps, none before step 2 (so rows run on past the prompt)."""

    def ends(tokens):  # each row's first step emitting one of `tokens` (NEW: never)
        hit = np.isin(new, tokens)
        return [int(np.argmax(row)) if row.any() else NEW for row in hit]

    candidates = [int(t) for t in np.unique(new[:, 2:]) if min(ends([t])) >= 2]
    pairs = [(a, b) for a in candidates for b in candidates if a < b]
    best = max(pairs, key=lambda p: (len(set(ends(p))), sum(ends(p))))
    assert len(set(ends(best))) > 2 and min(ends(best)) >= 2, new.tolist()
    return list(best)


@pytest.mark.parametrize("name", generation_cells(*FAST))
def test_greedy_token_identical_with_several_eos(llms, name, tmp_path):
    """Greedy search in float64 (near-ties of a random model could flip in float32), with two
    EOS ids ending the rows at different steps; the window (4) is shorter than prompt + new
    tokens, so the cache's window is exercised."""
    torch_model, path = llms[name]
    ids, mask = prompts()
    free = hf_generate(torch_model.double(), ids, mask, max_new_tokens=NEW, min_new_tokens=NEW)
    eos = two_eos(free[:, ids.shape[1] :])
    kwargs = dict(max_new_tokens=NEW, eos_token_id=eos, pad_token_id=0)
    with jax.enable_x64(True):
        ours = hf.load(path, dtype="float64").generate(ids, mask, **kwargs)
    theirs = hf_generate(torch_model, ids, mask, **kwargs)
    np.testing.assert_array_equal(ours, theirs)
    # The same EOS list in generation_config.json (Llama 3's layout), no argument naming it.
    torch_model.generation_config.eos_token_id = eos
    torch_model.save_pretrained(tmp_path)
    torch_model.generation_config.eos_token_id = EOS
    with jax.enable_x64(True):
        from_file = hf.load(tmp_path, dtype="float64")
        assert from_file.generation_config["eos_token_id"] == eos
        ours = from_file.generate(ids, mask, max_new_tokens=NEW, pad_token_id=0)
    torch_model.float()
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("name", generation_cells())
def test_beam_search_token_identical(llms, name):
    torch_model, path = llms[name]
    ids, mask = prompts()
    with jax.enable_x64(True):
        model = hf.load(path, dtype="float64")
        for length_penalty in (1.0, 0.6):
            kwargs = dict(
                num_beams=4, max_new_tokens=NEW, length_penalty=length_penalty,
                early_stopping=True, eos_token_id=EOS, pad_token_id=0, num_return_sequences=2,
            )  # fmt: skip
            ours = model.generate(ids, mask, **kwargs)
            theirs = hf_generate(torch_model.double(), ids, mask, **kwargs)
            np.testing.assert_array_equal(ours, theirs)
    torch_model.float()


@pytest.mark.slow
def test_sampling_follows_the_rules(llms):
    """Sampling (JAX's random numbers, so not torch's draws): top_k=1 is greedy, a seed fixes
    the draws, another seed gives others."""
    _, path = llms["llama_gqa"]
    ids, mask = prompts()
    model = hf.load(path)
    greedy = model.generate(ids, mask, max_new_tokens=NEW, pad_token_id=0)
    top1 = model.generate(ids, mask, max_new_tokens=NEW, do_sample=True, top_k=1, pad_token_id=0)
    hot = dict(max_new_tokens=NEW, do_sample=True, temperature=3.0, top_p=0.95, pad_token_id=0)
    draws = [model.generate(ids, mask, seed=s, **hot) for s in (0, 0, 1)]
    np.testing.assert_array_equal(top1, greedy)
    np.testing.assert_array_equal(draws[0], draws[1])
    assert not np.array_equal(draws[0], draws[2])


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "qwen2_biases_yarn_window_tied", "qwen3_norms", "gemma_mqa_tied",
        "gemma2_softcap_local_global", "gemma3_local_rope", "phi3_fused_longrope_partial",
    ],
)  # fmt: skip
def test_int8_and_bfloat16_close_to_float32(llms, name):
    """quantize="int8" and bfloat16 parameters for these families: logits within a few
    hundredths of float32's (measured 0.011-0.032 on logits up to 1.9-3.3), generation runs and
    mostly agrees (measured 88-100% of the tokens, prompts included; Gemma's 88%: one row
    parts at a float32 near-tie, its top two 0.0008 apart)."""
    _, path = llms[name]
    ids, mask = prompts()
    real = mask.astype(bool)
    plain = hf.load(path)
    reference = plain.forward(ids, mask)[real]
    tokens = plain.generate(ids, mask, max_new_tokens=NEW, pad_token_id=0)
    for model in (hf.load(path, quantize="int8"), hf.load(path, dtype="bfloat16")):
        logits = np.asarray(model.forward(ids, mask), np.float32)[real]
        assert np.all(np.isfinite(logits))  # soft-capped (Gemma 2) included
        assert np.max(np.abs(logits - reference)) < 0.05 * np.max(np.abs(reference))
        out = model.generate(ids, mask, max_new_tokens=NEW, pad_token_id=0)
        assert out.shape == tokens.shape and (out == tokens).mean() > 0.8


def _config(model_type: str, **changes) -> dict:
    base = dict(
        model_type=model_type, vocab_size=61, hidden_size=24, intermediate_size=40,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64,
    )  # fmt: skip
    return {**base, **changes}


@pytest.mark.parametrize(
    "config, message",
    [
        (_config("llama", rope_parameters=dict(rope_type="longrope")), "rope_type 'longrope'"),
        (_config("llama", attention_bias=True), "attention_bias=True"),
        (_config("qwen3", attention_bias=True), "attention_bias=True"),
        (_config("llama", rope_scaling=dict(type="llama3", factor=8.0)), "needs low_freq_factor"),
        (_config("llama", partial_rotary_factor=0.5), "partial_rotary_factor=0.5"),
        (_config("llama", num_key_value_heads=3), "not a multiple of num_key_value_heads=3"),
        (
            _config(
                "qwen2",
                use_sliding_window=True,
                sliding_window=4,
                layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            ),
            "sliding layers after full ones only",
        ),
        (_config("mistral", layer_types=["full_attention"] * 3), "layer_types"),
        (_config("gemma2", layer_types=["sliding_attention"] * 2), "must list 3"),
        (_config("gemma", use_bidirectional_attention=True), "use_bidirectional_attention"),
        (
            _config(
                "gemma3_text",
                rope_parameters=dict(
                    full_attention=dict(rope_type="default", rope_theta=1e6),
                    sliding_attention=dict(rope_type="linear", factor=2.0, rope_theta=1e4),
                ),
            ),
            "only rope_type 'default' is supported for the local layers",
        ),
    ],
)
def test_configs_these_families_cannot_express_are_named(config, message):
    from flax_transformer.hf.config import UnsupportedConfigError, hf_to_config

    with pytest.raises(UnsupportedConfigError, match=message):
        hf_to_config(config)


def test_config_switches_of_each_family():
    from flax_transformer.hf.config import hf_to_config

    def read(model_type, **changes):
        return hf_to_config(_config(model_type, **changes))[0]

    qwen2 = read("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=2)
    assert (qwen2.sliding_window, qwen2.sliding_window_from_layer, qwen2.qkv_bias) == (4, 2, True)
    assert read("qwen2", sliding_window=4).sliding_window is None  # use_sliding_window false
    qwen3 = read("qwen3")
    assert qwen3.qk_norm and qwen3.head_dim == 128  # Qwen3Config's default head_dim
    assert read("mistral").sliding_window == 4096  # MistralConfig's default
    assert read("mistral", sliding_window=None).sliding_window is None
    dynamic = read("llama", rope_parameters=dict(rope_type="dynamic", factor=2.0))
    assert (dynamic.rope_original_max_len, dynamic.max_len) == (64, 128)
    yarn = read(
        "qwen2", rope_parameters=dict(rope_type="yarn", original_max_position_embeddings=16)
    )
    assert (yarn.rope_factor, yarn.rope_original_max_len) == (4.0, 16)  # 64 / 16
    big = read("llama", max_position_embeddings=131072)
    assert big.max_len == 65536  # Llama 3.1's length, capped at MAX_LEN_LIMIT
    gemma = read("gemma", hidden_act="gelu")  # GemmaConfig's legacy "gelu" is the tanh one
    assert (gemma.activation, gemma.head_dim, gemma.tie_output) == ("gelu_tanh", 256, True)
    assert gemma.norm_weight_offset and gemma.scale_embeddings and not gemma.sublayer_output_norm
    gemma2 = read("gemma2")  # Gemma2Config's defaults: sliding first, caps 50 / 30
    assert (gemma2.sliding_window_pattern, gemma2.sliding_window) == ("sfs", 4096)
    assert (gemma2.attention_logit_softcap, gemma2.final_logit_softcap) == (50.0, 30.0)
    assert gemma2.attention_scale_dim == 256 and gemma2.sublayer_output_norm
    gemma3 = read("gemma3_text", num_hidden_layers=7, rope_theta=1e5, rope_local_base_freq=20.0)
    assert gemma3.sliding_window_pattern == "sssssfs"  # every 6th global (transformers 4 file)
    assert (gemma3.rope_theta, gemma3.rope_local_theta, gemma3.qk_norm) == (1e5, 20.0, True)
    assert gemma3.attention_logit_softcap is None and gemma3.final_logit_softcap is None
    nested = read(
        "gemma3_text",
        num_hidden_layers=7,
        rope_parameters=dict(
            full_attention=dict(rope_type="default", rope_theta=1e5),
            sliding_attention=dict(rope_type="default", rope_theta=20.0),
        ),
    )
    assert nested == gemma3  # transformers 5's per-layer-type rope_parameters
    llama = read("llama", eos_token_id=[5, 7], tie_word_embeddings=True)
    assert (llama.eos_id, llama.pad_id, llama.tie_output, llama.kv_heads) == (5, 5, True, 2)


@pytest.mark.parametrize(
    "rope", [dict(rope_type="linear", factor=2.5), dict(rope_type="dynamic", factor=2.0)]
)
def test_linear_and_dynamic_rope_against_transformers(rope, tmp_path):
    """The two rules the battery's cells leave out, float32; dynamic on a batch longer than
    max_position_embeddings (8: its frequencies grow with the longest position; the model's
    max_len is 8 x factor)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        **{**hf_llms.SIZES, "max_position_embeddings": 8 if rope["rope_type"] == "dynamic" else 16},
        num_key_value_heads=2,
        rope_parameters=dict(rope, rope_theta=100.0),
    )
    torch.manual_seed(0)
    torch_model = LlamaForCausalLM(config).eval()
    torch_model.save_pretrained(tmp_path)
    ids, mask, positions = hf_llms.left_padded(np.random.default_rng(0))  # up to 11 tokens
    ours = hf.load(tmp_path).forward(ids, mask, position_ids=positions)
    with torch.no_grad():
        args = dict(input_ids=ids, attention_mask=mask, position_ids=positions)
        theirs = torch_model(**{k: torch.from_numpy(v) for k, v in args.items()}).logits.numpy()
    real = mask.astype(bool)
    assert_close(ours[real], theirs[real], rtol=1e-5, what=f"{rope['rope_type']} rope logits")


@pytest.mark.slow
@pytest.mark.parametrize("beams", [1, 4])
def test_long_windowed_generation_through_the_growing_cache(llms, beams):
    """45 new tokens: the cache grows past its first 32 slots while the window (4) slides;
    greedy and beam search stay token-identical."""
    torch_model, path = llms["qwen2_biases_yarn_window_tied"]
    ids, mask = prompts()
    kwargs = dict(max_new_tokens=45, min_new_tokens=45, num_beams=beams, pad_token_id=0)
    with jax.enable_x64(True):
        ours = hf.load(path, dtype="float64").generate(ids, mask, **kwargs)
    theirs = hf_generate(torch_model.double(), ids, mask, **kwargs)
    torch_model.float()
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.slow
def test_longrope_takes_its_long_table_past_the_original_length(llms):
    """A batch of 16 tokens, past Phi-3's original_max_position_embeddings (13): float32
    logits within 1e-5 of transformers' on the long factors, and the short table there
    (the switch-over ignored) lands far from them (generation across the switch:
    test_hf_longrope_generation.py)."""
    torch_model, path = llms["phi3_fused_longrope_partial"]
    ids, mask, positions = hf_llms.left_padded(np.random.default_rng(0), (16, 9, 14, 3))
    model = hf.load(path)
    ours = model.forward(ids, mask, position_ids=positions)
    args = dict(input_ids=ids, attention_mask=mask, position_ids=positions)
    with torch.no_grad():
        theirs = torch_model(**{k: torch.from_numpy(v) for k, v in args.items()}).logits.numpy()
    real = mask.astype(bool)
    assert_close(ours[real], theirs[real], rtol=1e-5, what="phi3 longrope long-table logits")
    short = tuple(hf_llms.PHI3_ROPE["short_factor"])
    model.module = type(model.module)(model.config.replace(rope_long_factors=short))
    model.__dict__.pop("_apply", None)
    wrong = model.forward(ids, mask, position_ids=positions)[real]
    assert np.max(np.abs(wrong - theirs[real])) > 1e-2
