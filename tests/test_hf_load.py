"""hf.load against transformers' own PyTorch models (tiny random ones, saved to tmp dirs):
the same logits in float64 (1e-12) and float32 (1e-5), weights read as transformers reads them."""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from flax_transformer import hf
from flax_transformer.spec.numerics import assert_close

from . import hf_models

FAMILIES = ("marian", "bart", "mbart", "gpt2")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{model_type: (transformers model, its save_pretrained dir)}; Marian with a tokenizer."""
    out = {}
    for model_type in FAMILIES:
        model = hf_models.build(model_type)
        path = tmp_path_factory.mktemp(model_type)
        out[model_type] = (model, hf_models.save(model, path, tokenizer=model_type == "marian"))
    return out


@pytest.mark.parametrize(
    "model_type", ["marian", "bart", pytest.param("mbart", marks=pytest.mark.slow), "gpt2"]
)
def test_logits_equal_transformers_float64(saved, model_type):
    with jax.enable_x64(True):
        flax_logits, hf_logits = hf_models.logits_pair(model_type, *saved[model_type], "float64")
    assert flax_logits.dtype == np.float64
    assert_close(flax_logits, hf_logits, rtol=1e-12, what=f"{model_type} float64 logits")


@pytest.mark.parametrize("model_type", ["marian", "bart", "gpt2"])
def test_logits_equal_transformers_float32(saved, model_type):
    flax_logits, hf_logits = hf_models.logits_pair(model_type, *saved[model_type], "float32")
    assert flax_logits.dtype == np.float32
    assert_close(flax_logits, hf_logits, rtol=1e-5, what=f"{model_type} float32 logits")


def test_marian_uses_every_switch(saved):
    """The Marian test model really has what the issue lists: swish, scaled embeddings, one
    shared table, a nonzero final_logits_bias, and a pad-id decoder start."""
    model = hf.load(saved["marian"][1])
    cfg = model.config
    assert (cfg.activation, cfg.scale_embeddings, cfg.share_embeddings, cfg.tie_output) == (
        "silu",
        True,
        True,
        True,
    )
    assert cfg.sinusoid_layout == "halves" and cfg.decoder_start_id == cfg.pad_id
    assert np.abs(model.variables["params"]["logits_bias"]["bias"]).max() > 0.1
    assert model.kind == "seq2seq" and model.hf_config["model_type"] == "marian"
    assert model.generation_config["decoder_start_token_id"] == cfg.pad_id
    bart = hf.load(saved["bart"][1]).config
    assert (bart.positional, bart.position_offset, bart.embed_norm) == ("learned", 2, True)
    gpt2 = hf.load(saved["gpt2"][1])
    assert gpt2.kind == "lm" and gpt2.config.activation == "gelu_tanh" and gpt2.config.tie_output


def test_tokenizer_is_transformers_own_and_lazy(saved):
    model = hf.load(saved["marian"][1])
    assert "tokenizer" not in model.__dict__  # not loaded yet
    ids = model.tokenizer("a b w3")["input_ids"]
    assert ids == [2, 3, 2 + 26 + 3, hf_models.MARIAN_EOS]
    assert hf.load(saved["bart"][1]).tokenizer is None  # no tokenizer files


def test_tied_copies_and_a_target_standing_in_for_its_source(saved, tmp_path):
    """As transformers' from_pretrained: extra copies of tied weights are ignored, and a tied
    target (here lm_head.weight) stands in for a missing source (model.shared.weight)."""
    torch_model, path = saved["marian"]
    state = load_file(str(path / "model.safetensors"))
    shared = state.pop("model.shared.weight")
    state["lm_head.weight"] = shared
    state["model.encoder.embed_tokens.weight"] = shared
    for name in ("config.json", "generation_config.json"):
        (tmp_path / name).write_bytes((path / name).read_bytes())
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    moved = hf.load(tmp_path)
    original = hf.load(path)
    np.testing.assert_array_equal(
        moved.variables["params"]["shared_embed"]["embedding"],
        original.variables["params"]["shared_embed"]["embedding"],
    )


def test_pytorch_model_bin_loads_like_safetensors(saved, tmp_path):
    torch_model, path = saved["gpt2"]
    (tmp_path / "config.json").write_bytes((path / "config.json").read_bytes())
    torch.save(torch_model.float().state_dict(), tmp_path / "pytorch_model.bin")
    from_bin = jax.tree.leaves(hf.load(tmp_path).variables)
    from_safetensors = jax.tree.leaves(hf.load(path).variables)
    for a, b in zip(from_bin, from_safetensors, strict=True):
        np.testing.assert_array_equal(a, b)


def test_sharded_safetensors_load_like_one_file(saved, tmp_path):
    _, path = saved["gpt2"]
    state = load_file(str(path / "model.safetensors"))
    keys = sorted(state)
    shards = {
        "model-00001-of-00002.safetensors": keys[:7],
        "model-00002-of-00002.safetensors": keys[7:],
    }
    for name, names in shards.items():
        save_file({k: state[k] for k in names}, str(tmp_path / name), metadata={"format": "pt"})
    weight_map = {k: name for name, names in shards.items() for k in names}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_bytes((path / "config.json").read_bytes())
    sharded = jax.tree.leaves(hf.load(tmp_path).variables)
    for a, b in zip(sharded, jax.tree.leaves(hf.load(path).variables), strict=True):
        np.testing.assert_array_equal(a, b)


def test_loading_safetensors_needs_neither_torch_nor_transformers(saved):
    code = (
        "import sys; from flax_transformer import hf; "
        f"model = hf.load({str(saved['bart'][1])!r}); "
        "assert model.tokenizer is None; "
        "loaded = [m for m in ('torch', 'transformers') if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr


def test_forward_input_checks(saved):
    marian = hf.load(saved["marian"][1])
    ids = np.array([[5, 6, 0]])
    with pytest.raises(ValueError, match="marian needs decoder_input_ids"):
        marian.forward(ids)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        marian.forward(ids, np.ones((1, 2)), ids)
    with pytest.raises(ValueError, match="input_ids must be"):
        marian.forward(np.array([5, 6]), None, ids)
    with pytest.raises(ValueError, match="float64 needs JAX's 64-bit mode"):
        hf.load(saved["marian"][1], dtype="float64")
