"""Round trips are bit-exact, dtypes are kept, files describe themselves, bad input is listed."""

import subprocess
import sys

import jax
import ml_dtypes
import numpy as np
import pytest
import torch

import torch_reference as tr
from flax_transformer import Transformer
from flax_transformer.interop.convert import (
    ConversionError,
    flatten_params,
    flax_to_torch_state,
    load_flax_params,
    load_torch_state,
    save_flax_params,
    save_torch_state,
    torch_state_to_flax,
)

from .helpers import small_config

CFG = small_config("float32", final_norm=True, positional="learned")


def torch_state(cfg=CFG, model="seq2seq"):
    torch.manual_seed(0)
    module = tr.Transformer(cfg) if model == "seq2seq" else tr.TransformerLM(cfg)
    return tr.state_dict_to_numpy(module)


def assert_same_state(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize("model", ["seq2seq", "lm"])
def test_torch_flax_torch_is_bit_exact(model):
    state = torch_state(model=model)
    assert_same_state(flax_to_torch_state(torch_state_to_flax(state, CFG, model)), state)


def test_flax_torch_flax_is_bit_exact():
    src = np.ones((1, 4), np.int32)
    params = Transformer(CFG).init(jax.random.key(1), src, src)
    back = torch_state_to_flax(flax_to_torch_state(params), CFG)
    a, b = flatten_params(params), flatten_params(back)
    assert a.keys() == b.keys()
    for path in a:
        np.testing.assert_array_equal(np.asarray(a[path]), b[path], err_msg="/".join(path))


def test_bfloat16_is_kept_through_conversion_and_files(tmp_path):
    cfg = CFG.replace(dtype="bfloat16", param_dtype="bfloat16")
    state = torch_state(cfg)
    assert state["lm_head.weight"].dtype == ml_dtypes.bfloat16
    params = torch_state_to_flax(state, cfg)
    assert flatten_params(params)[("lm_head", "kernel")].dtype == ml_dtypes.bfloat16
    save_flax_params(tmp_path / "p.safetensors", params, cfg)
    loaded, loaded_cfg, _ = load_flax_params(tmp_path / "p.safetensors")
    assert loaded_cfg == cfg
    assert_same_state(flax_to_torch_state(loaded), state)


def test_files_carry_their_config_and_round_trip(tmp_path):
    state = torch_state()
    save_torch_state(tmp_path / "t.safetensors", state, CFG)
    params, cfg, model = load_flax_params(tmp_path / "t.safetensors")
    assert (cfg, model) == (CFG, "seq2seq")
    back, _, _ = load_torch_state(tmp_path / "t.safetensors")
    assert_same_state(back, state)


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "flax_transformer.convert", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_converts_pt_and_safetensors_both_ways(tmp_path):
    state = torch_state()
    torch.save({k: tr.numpy_to_tensor(v) for k, v in state.items()}, tmp_path / "m.pt")
    CFG.save(tmp_path / "config.json")
    result = run_cli(
        tmp_path / "m.pt", tmp_path / "flax.safetensors", "--config", tmp_path / "config.json"
    )
    assert result.returncode == 0, result.stderr
    assert "converted torch -> flax: " in result.stdout
    result = run_cli(tmp_path / "flax.safetensors", tmp_path / "torch.safetensors")
    assert result.returncode == 0, result.stderr
    back, cfg, _ = load_torch_state(tmp_path / "torch.safetensors")
    assert cfg == CFG
    assert_same_state(back, state)


def test_cli_reports_bad_input_without_traceback(tmp_path):
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    result = run_cli(tmp_path / "junk.safetensors", tmp_path / "out.safetensors")
    assert result.returncode == 2
    assert "junk.safetensors" in result.stderr and "Traceback" not in result.stderr
    torch.save({k: tr.numpy_to_tensor(v) for k, v in torch_state().items()}, tmp_path / "m.pt")
    result = run_cli(tmp_path / "m.pt", tmp_path / "out.safetensors")
    assert result.returncode == 2 and "carries no config" in result.stderr


def test_wrong_config_lists_every_mismatch():
    state = torch_state()
    wrong = CFG.replace(d_ff=CFG.d_ff + 8, num_decoder_layers=1)
    with pytest.raises(ConversionError) as err:
        torch_state_to_flax(state, wrong)
    message = str(err.value)
    assert "shape mismatch for 'encoder.layers.0.ffn.linear1.weight'" in message
    assert f"expected ({CFG.d_ff + 8}, {CFG.d_model}), found ({CFG.d_ff}, {CFG.d_model})" in message
    assert "unexpected key 'decoder.layers.1.norm3.weight'" in message


def test_missing_key_and_transposed_matrix_are_listed_together():
    state = torch_state()
    del state["decoder.layers.0.cross_attn.value.bias"]
    state["encoder.layers.1.ffn.linear2.weight"] = state["encoder.layers.1.ffn.linear2.weight"].T
    with pytest.raises(ConversionError) as err:
        torch_state_to_flax(state, CFG)
    message = str(err.value)
    assert "2 problem(s)" in message
    assert "missing key 'decoder.layers.0.cross_attn.value.bias'" in message
    assert "shape mismatch for 'encoder.layers.1.ffn.linear2.weight'" in message


def test_file_config_conflict_is_an_error(tmp_path):
    save_torch_state(tmp_path / "t.safetensors", torch_state(), CFG)
    with pytest.raises(ConversionError, match="differs from the file's own: d_ff"):
        load_flax_params(tmp_path / "t.safetensors", CFG.replace(d_ff=8))
