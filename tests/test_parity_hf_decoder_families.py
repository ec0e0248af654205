"""compare_hf_decoder on Gemma, Gemma 2, Gemma 3 (text) and Phi-3 (the tiny briefly trained
models of tests/hf_llms.py, the session's `llms`): every paired module within 1e-12 in float64,
and one deliberate bug in a Flax weight named at exactly its module (a Gemma offset norm, a
Gemma 2 norm after a sublayer, a Gemma 3 key norm, one part of each of Phi-3's fused
projections), the module before it still agreeing, with the weight verdict."""

import pytest

from flax_transformer.parity.diagnosis import WEIGHTS_DIFFER
from flax_transformer.parity.report import STATUS_MISSING
from tests.test_parity_hf_decoder import report_for

# cell: (Flax parameter, index, the module it must be named at, the module just before it)
PERTURBED = {
    "gemma2_softcap_local_global": (
        "layers_0/ffn_out_norm/scale", (4,),
        "model.layers.0.post_feedforward_layernorm", "model.layers.0.mlp.down_proj",
    ),
    "phi3_qkv_key": (
        "layers_0/self_attn/key/kernel", (3, 5),
        "model.layers.0.self_attn.qkv_proj.key", "model.layers.0.self_attn.qkv_proj.query",
    ),
    "phi3_gate_up_up": (
        "layers_1/ffn/linear3/kernel", (7, 2),
        "model.layers.1.mlp.gate_up_proj.up", "model.layers.1.mlp.gate_up_proj.gate",
    ),
    "gemma_mqa_tied": (
        "layers_1/norm2/scale", (6,),
        "model.layers.1.post_attention_layernorm", "model.layers.1.self_attn.o_proj",
    ),
    "gemma3_local_rope": (
        "layers_1/self_attn/key_norm/scale", (2,),
        "model.layers.1.self_attn.k_norm", "model.layers.1.self_attn.q_norm",
    ),
}  # fmt: skip
CELL = {
    "phi3_qkv_key": "phi3_fused_longrope_partial",
    "phi3_gate_up_up": "phi3_fused_longrope_partial",
}
FAST = ("gemma2_softcap_local_global", "phi3_qkv_key")


@pytest.mark.parametrize(
    "case", [c if c in FAST else pytest.param(c, marks=pytest.mark.slow) for c in PERTURBED]
)
def test_a_perturbed_weight_is_named_at_its_module(llms, case):
    path, index, named, before = PERTURBED[case]

    def perturb(params):
        node = params["decoder"]
        for part in path.split("/"):
            node = node[part]
        node[index] += 1e-6

    report = report_for(llms, CELL.get(case, case), perturb)
    assert report.first_divergence == named, report.format_table()
    assert report[before].ok and report[before].compared > 0
    assert report.diagnosis.verdict == WEIGHTS_DIFFER


# Torch values the Flax side has none of, by cell (besides the rotary tables and the gate's
# activation alone): the attention weights Gemma's eager attention returns, a tied head
# (compared as the logits), Phi-3's fused outputs (compared part by part).
MISSING = {
    "gemma_mqa_tied": ("self_attn", "lm_head"),
    "gemma2_softcap_local_global": ("self_attn", "lm_head"),
    "gemma3_local_rope": ("self_attn", "lm_head"),
    "phi3_fused_longrope_partial": (
        "qkv_proj", "qkv_proj.fused", "gate_up_proj", "gate_up_proj.fused",
    ),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MISSING))
def test_every_module_within_1e_12_in_float64(llms, name):
    report = report_for(llms, name)
    assert report.ok, report.format_table()
    missing = {t.module for t in report.tensors if t.status == STATUS_MISSING}
    unpaired = ("rotary_emb", "mlp.act_fn", "mlp.activation_fn") + MISSING[name]
    assert all(m.endswith(unpaired) for m in missing), missing
    compared = [t for t in report.tensors if t.status != STATUS_MISSING]
    assert all(t.rel <= 1e-12 for t in compared)
    modules = {t.module for t in compared}
    assert {"model.embed_tokens", "model.norm", "model.layers.1.mlp.down_proj"} <= modules
