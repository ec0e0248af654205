"""compare_hf_decoder: transformers' Llama / Qwen2 against the Flax model `hf.load` makes of the
same checkpoint (the tiny briefly trained models of tests/hf_llms.py, the session's `llms`), per
module on the left-padded ragged batch: every paired module within 1e-12 in float64 (transformers'
RMS norms and rotary tables patched to float64, as the family battery does), and one deliberate
bug in the Flax variables named at exactly its module, with the weight verdict."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from flax_transformer import hf
from flax_transformer.parity.diagnosis import WEIGHTS_DIFFER
from flax_transformer.parity.hf_decoder import compare_hf_decoder
from flax_transformer.parity.inputs import ParityInputError
from flax_transformer.parity.report import STATUS_MISSING
from tests import hf_llms

# Torch modules the Flax side has no value for (see parity/hf_decoder.py).
UNPAIRED = ("rotary_emb", "act_fn")


def report_for(llms, name, perturb=None, **kwargs):
    torch_model, path = llms[name]
    ids, mask, positions = hf_llms.left_padded(np.random.default_rng(0))
    with jax.enable_x64(True):
        model = hf.load(path, dtype="float64")
        if perturb is not None:
            variables = jax.tree.map(np.array, model.variables)
            perturb(variables["params"])
            model = dataclasses.replace(model, variables=variables)
        return compare_hf_decoder(torch_model, model, ids, mask, positions, rtol=1e-12, **kwargs)


@pytest.mark.parametrize("name", ["llama_gqa", "qwen2_biases_yarn_window_tied"])
def test_every_module_within_1e_12_in_float64(llms, name):
    report = report_for(llms, name)
    assert report.ok, report.format_table()
    compared = [t for t in report.tensors if t.status != STATUS_MISSING]
    missing = [t.name for t in report.tensors if t.status == STATUS_MISSING]
    tied = name != "llama_gqa"  # a tied head's output is the logits: compared at the root
    unpaired = UNPAIRED + (("lm_head",) if tied else ())
    assert all(any(part in m for part in unpaired) for m in missing), missing
    modules = {t.module for t in compared}
    layers = hf_llms.SIZES["num_hidden_layers"]
    for i in range(layers):
        for part in ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.o_proj"):
            assert f"model.layers.{i}.{part}" in modules, part
        for part in ("post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            assert f"model.layers.{i}.{part}" in modules, part
    assert {"model.embed_tokens", "model.norm"} <= modules
    assert ("lm_head" in modules) != tied
    assert all(t.rel <= 1e-12 for t in compared)
    assert report.info["transformers"] == "RMSNorm and rotary tables in float64"


def test_unpatched_transformers_parts_at_float32_rounding(llms):
    """Without the patch the first divergence is transformers' float32 RMSNorm (~1e-7)."""
    report = report_for(llms, "llama_gqa", patch_float32_parts=False)
    assert report.first_divergence == "model.layers.0.input_layernorm"
    worst = max(t.rel for t in report.tensors if t.rel is not None)
    assert 1e-9 < worst < 1e-5


def test_a_perturbed_o_proj_is_the_first_divergence(llms):
    def perturb(params):
        params["decoder"]["layers_1"]["self_attn"]["out"]["kernel"][3, 5] += 1e-6

    report = report_for(llms, "llama_gqa", perturb)
    assert report.first_divergence == "model.layers.1.self_attn.o_proj", report.format_table()
    assert report.diagnosis.verdict == WEIGHTS_DIFFER
    assert report["model.layers.1.self_attn.v_proj"].ok  # everything before it agrees


@pytest.mark.slow
def test_a_perturbed_qwen2_key_bias_is_the_first_divergence(llms):
    def perturb(params):
        params["decoder"]["layers_0"]["self_attn"]["key"]["bias"][2] += 1e-6

    report = report_for(llms, "qwen2_biases_yarn_window_tied", perturb)
    assert report.first_divergence == "model.layers.0.self_attn.k_proj", report.format_table()
    assert report.diagnosis.verdict == WEIGHTS_DIFFER


def test_another_family_is_refused_in_one_line(llms):
    torch_model, path = llms["llama_gqa"]
    model = hf.load(path)
    other = dataclasses.replace(model, hf_config={**model.hf_config, "model_type": "qwen2"})
    with pytest.raises(ParityInputError, match="the torch model is a 'llama' model"):
        compare_hf_decoder(torch_model, other, np.zeros((1, 3), np.int32))


def test_ftx_parity_hf_on_a_directory(llms, capsys, tmp_path):
    """`ftx parity --hf DIR`: the report of transformers' model against hf.load's on a random
    left-padded batch, exit 0 when every module agrees; a directory that is no checkpoint is
    exit 2 in one line."""
    from flax_transformer.cli.parity import main

    _, path = llms["llama_gqa"]
    assert main(["--hf", str(path), "--json", "-", "--batch-size", "3", "--src-len", "7"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["first_divergence"] is None
    assert report["transformers"] == "RMSNorm and rotary tables in float64"
    rows = {row["module"]: row for row in report["tensors"]}
    assert rows["model.layers.1.self_attn.o_proj"]["compared"] > 0
    assert rows["model.layers.1.self_attn.o_proj"]["shape"][:2] == [3, 7]
    assert main(["--hf", str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """(transformers' tiny random GPT-2, its save_pretrained directory)."""
    from . import hf_models

    torch_model = hf_models.build("gpt2").eval()
    return torch_model, hf_models.save(torch_model, tmp_path_factory.mktemp("gpt2"))


def test_gpt2_is_the_same_machinery(gpt2):
    """GPT-2 through the same report: within 1e-12 (its fused c_attn, which the Flax side holds
    as three values, and the tied lm_head left out), a perturbed c_fc kernel named there."""
    torch_model, path = gpt2
    ids, mask, positions = hf_llms.left_padded(np.random.default_rng(1))
    with jax.enable_x64(True):
        model = hf.load(path, dtype="float64")
        report = compare_hf_decoder(torch_model, model, ids, mask, positions, rtol=1e-12)
        assert report.ok, report.format_table()
        missing = {t.module.split(".")[-1] for t in report.tensors if t.status == STATUS_MISSING}
        assert missing == {"c_attn", "lm_head"}
        assert report["transformer.wpe"].compared > 0  # the rows each token reads
        variables = jax.tree.map(np.array, model.variables)
        variables["params"]["decoder"]["layers_1"]["ffn"]["linear1"]["kernel"][2, 7] += 1e-6
        broken = dataclasses.replace(model, variables=variables)
        report = compare_hf_decoder(torch_model, broken, ids, mask, positions, rtol=1e-12)
    assert report.first_divergence == "transformer.h.1.mlp.c_fc", report.format_table()
    assert report.diagnosis.verdict == WEIGHTS_DIFFER
