"""Parity report API: all green for converted weights, and a deliberate fault in layer k (a
perturbed weight, another LayerNorm eps, the tanh GELU) is named as the first divergence."""

import numpy as np
import pytest
import torch
from torch import nn

import torch_reference
from flax_transformer import Transformer, TransformerConfig, TransformerLM
from flax_transformer.interop.convert import torch_state_to_flax
from flax_transformer.parity import ParityInputError, compare_models, compare_weights, make_batch
from flax_transformer.parity.compare import run_config
from flax_transformer.parity.report import compare_captures, valid_entries

# d_model != d_ff != vocab, two layers so "layer k" can be the second one.
CONFIG = TransformerConfig(
    src_vocab_size=37,
    tgt_vocab_size=41,
    d_model=16,
    num_heads=2,
    num_encoder_layers=2,
    num_decoder_layers=2,
    d_ff=40,
    dropout_rate=0.0,
    max_len=32,
)
TORCH_MODELS = {
    "seq2seq": torch_reference.Transformer,
    "lm": torch_reference.TransformerLM,
    "encoder": torch_reference.TransformerEncoder,
}
FLAX_MODELS = {"seq2seq": Transformer, "lm": TransformerLM}


def torch_weights(kind, config=CONFIG, seed=0):
    torch.manual_seed(seed)
    return torch_reference.state_dict_to_numpy(TORCH_MODELS[kind](config))


def batch_for(kind, config=CONFIG):
    return make_batch(config, kind, batch_size=3, src_len=7, tgt_len=6)


def perturbed(state, key, index=(1, 2), delta=0.05):
    state = dict(state)
    array = np.array(state[key], copy=True)
    array[index[: array.ndim]] += delta
    state[key] = array
    return state


def models(kind, state, dtype="float32", flax_config=CONFIG, torch_config=CONFIG):
    """Flax model + params from `state`, and a torch twin holding the same `state`."""
    state = {k: v.astype(dtype) for k, v in state.items()}
    params = torch_state_to_flax(state, flax_config, kind)  # keeps the arrays' dtype
    flax_config, torch_config = run_config(flax_config, dtype), run_config(torch_config, dtype)
    torch_model = TORCH_MODELS[kind](torch_config)
    torch_reference.load_numpy_state(torch_model, state)
    return FLAX_MODELS[kind](flax_config), params, torch_model


def names_before(report, name):
    names = [t.name for t in report.tensors]
    return names[: names.index(name)]


def assert_first_divergence(report, expected):
    assert report.first_divergence == expected, report.format_table()
    for name in names_before(report, expected):
        assert report[name].status == "ok", report.format_table()


@pytest.mark.parametrize("kind", ["seq2seq", "lm"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_converted_weights_are_all_green(kind, dtype):
    state = torch_weights(kind)
    params = torch_state_to_flax(state, CONFIG, kind)
    report = compare_weights(CONFIG, params, state, batch_for(kind), model_kind=kind, dtype=dtype)
    assert report.ok and report.first_divergence is None, report.format_table()
    worst = max(t.rel for t in report.tensors)
    assert worst < (1e-12 if dtype == "float64" else 2e-6), report.format_table()
    assert all(t.compared > 0 for t in report.tensors)


def test_config_variants_are_all_green():
    """Shared + tied embeddings, learned positions, scaling, pre-LN with final norms."""
    config = CONFIG.replace(
        src_vocab_size=41,
        share_embeddings=True,
        tie_output=True,
        positional="learned",
        scale_embeddings=True,
        norm_first=True,
        final_norm=True,
        activation="gelu",
    )
    state = torch_weights("seq2seq", config)
    params = torch_state_to_flax(state, config)
    report = compare_weights(config, params, state, batch_for("seq2seq"), dtype="float64")
    assert report.ok, report.format_table()
    names = [t.name for t in report.tensors]
    assert {"encoder.norm", "decoder.norm", "logits"} <= set(names)
    assert max(t.rel for t in report.tensors) < 1e-12


def test_names_follow_execution_order():
    state = torch_weights("seq2seq")
    report = compare_weights(
        CONFIG, torch_state_to_flax(state, CONFIG), state, batch_for("seq2seq")
    )
    names = [t.name for t in report.tensors]
    layer = [n.removeprefix("encoder.layers.0.") for n in names if "encoder.layers.0." in n]
    assert layer == ["self_attn.attention_weights", "self_attn", "norm1", "ffn", "norm2"]
    dec = [n.removeprefix("decoder.layers.1.") for n in names if "decoder.layers.1." in n]
    assert dec == [
        "self_attn.attention_weights",
        "self_attn",
        "norm1",
        "cross_attn.attention_weights",
        "cross_attn",
        "norm2",
        "ffn",
        "norm3",
    ]
    assert names[0] == "src_embedded" and names[-1] == "logits"
    assert names.index("encoder") < names.index("tgt_embedded") < names.index("decoder")
    assert report["logits"].shape == (3, 6, CONFIG.tgt_vocab_size)


def test_pre_ln_order_puts_the_norm_first():
    config = CONFIG.replace(norm_first=True, final_norm=True)
    state = torch_weights("lm", config)
    report = compare_weights(
        config, torch_state_to_flax(state, config, "lm"), state, batch_for("lm"), model_kind="lm"
    )
    names = [t.name for t in report.tensors]
    assert names[:4] == [
        "tgt_embedded",
        "decoder.layers.0.norm1",
        "decoder.layers.0.self_attn.attention_weights",
        "decoder.layers.0.self_attn",
    ]
    assert names[-3:] == ["decoder.norm", "decoder", "logits"]
    assert report.ok, report.format_table()


SEQ2SEQ_FAULTS = [
    ("src_embed.weight", "src_embedded"),
    ("encoder.layers.1.self_attn.query.weight", "encoder.layers.1.self_attn.attention_weights"),
    ("encoder.layers.1.self_attn.value.weight", "encoder.layers.1.self_attn"),
    ("encoder.layers.0.norm2.bias", "encoder.layers.0.norm2"),
    ("decoder.layers.1.cross_attn.key.weight", "decoder.layers.1.cross_attn.attention_weights"),
    ("decoder.layers.1.cross_attn.out.bias", "decoder.layers.1.cross_attn"),
    ("decoder.layers.1.ffn.linear1.weight", "decoder.layers.1.ffn"),
    ("decoder.layers.0.norm3.weight", "decoder.layers.0.norm3"),
    ("lm_head.bias", "logits"),
]


@pytest.mark.parametrize("key,expected", SEQ2SEQ_FAULTS)
def test_perturbed_torch_weight_is_named(key, expected):
    state = torch_weights("seq2seq")
    params = torch_state_to_flax(state, CONFIG)
    broken = perturbed(state, key, index=(4, 2))  # token 4 appears in the batch
    report = compare_weights(CONFIG, params, broken, batch_for("seq2seq"), dtype="float32")
    assert report.tol == 1e-5
    assert_first_divergence(report, expected)
    assert report["logits"].status == "FAIL"


@pytest.mark.parametrize(
    "key,expected",
    [
        ("decoder.layers.1.ffn.linear2.bias", "decoder.layers.1.ffn"),
        ("decoder.layers.1.norm1.bias", "decoder.layers.1.norm1"),
        ("decoder.layers.0.self_attn.query.bias", "decoder.layers.0.self_attn.attention_weights"),
    ],
)
def test_perturbed_flax_weight_is_named_in_the_lm(key, expected):
    """A fault on the Flax side (A) is found the same way, here in float64."""
    state = torch_weights("lm")
    params = torch_state_to_flax(perturbed(state, key), CONFIG, "lm")
    report = compare_weights(
        CONFIG, params, state, batch_for("lm"), model_kind="lm", dtype="float64"
    )
    assert_first_divergence(report, expected)


def test_a_bare_encoder_is_green_and_a_perturbed_layer_is_named():
    """The third kind (a bare encoder, e.g. T5EncoderModel): source tokens only, its output
    (the last hidden state) named `output`; a fault in layer 1 is found there, float64."""
    state = torch_weights("encoder")
    params = torch_state_to_flax(state, CONFIG, "encoder")
    batch = batch_for("encoder")
    assert set(batch) == {"src"}
    report = compare_weights(CONFIG, params, state, batch, model_kind="encoder", dtype="float64")
    assert report.ok, report.format_table()
    assert max(t.rel for t in report.tensors) < 1e-12, report.format_table()
    names = [t.name for t in report.tensors]
    assert names[0] == "src_embedded" and names[-1] == "output", names
    broken = perturbed(state, "encoder.layers.1.ffn.linear1.weight", index=(4, 2))
    report = compare_weights(CONFIG, params, broken, batch, model_kind="encoder", dtype="float64")
    assert_first_divergence(report, "encoder.layers.1.ffn")
    assert report["output"].status == "FAIL"


@pytest.mark.parametrize("kind", ["seq2seq", "lm"])
def test_layer_norm_eps_on_one_side_names_the_first_norm(kind):
    state = torch_weights(kind)
    flax_model, params, torch_model = models(
        kind, state, torch_config=CONFIG.replace(layer_norm_eps=1e-3)
    )
    report = compare_models(flax_model, params, torch_model, batch_for(kind))
    stack = "encoder" if kind == "seq2seq" else "decoder"
    assert_first_divergence(report, f"{stack}.layers.0.norm1")


def test_tanh_gelu_in_one_ffn_names_that_ffn():
    config = CONFIG.replace(activation="gelu")
    state = torch_weights("seq2seq", config)
    flax_model, params, torch_model = models(
        "seq2seq", state, flax_config=config, torch_config=config
    )
    torch_model.decoder.layers[1].ffn.activation = nn.GELU(approximate="tanh")
    report = compare_models(flax_model, params, torch_model, batch_for("seq2seq"))
    assert_first_divergence(report, "decoder.layers.1.ffn")


def test_tanh_gelu_model_wide_names_the_first_ffn_in_float64():
    config = CONFIG.replace(activation="gelu")
    state = torch_weights("lm", config)
    flax_model, params, torch_model = models(
        "lm", state, "float64", flax_config=config, torch_config=config
    )
    for module in torch_model.modules():
        if isinstance(module, torch_reference.FeedForward):
            module.activation = nn.GELU(approximate="tanh")
    report = compare_models(flax_model, params, torch_model, batch_for("lm"))
    assert report.tol == 1e-10 and report.dtype == "float64"
    assert_first_divergence(report, "decoder.layers.0.ffn")


def test_padding_rows_are_not_errors_unless_asked():
    """A different embedding for the pad token changes only padding rows."""
    state = torch_weights("seq2seq")
    params = torch_state_to_flax(state, CONFIG)
    broken = perturbed(state, "tgt_embed.weight", index=(CONFIG.pad_id, 3), delta=1.0)
    batch = batch_for("seq2seq")
    assert (batch["tgt_in"] == CONFIG.pad_id).any()
    report = compare_weights(CONFIG, params, broken, batch)
    assert report.ok, report.format_table()
    full = compare_weights(CONFIG, params, broken, batch, exclude_masked=False)
    assert full.first_divergence == "tgt_embedded"
    assert not full.masked_excluded
    assert report["tgt_embedded"].compared < full["tgt_embedded"].compared


def test_valid_entries_for_attention_weights():
    batch = {"src": np.array([[5, 6, 0]]), "tgt_in": np.array([[1, 7, 0]])}
    self_mask = valid_entries(
        "decoder.layers.0.self_attn.attention_weights", (1, 2, 3, 3), batch, "seq2seq", 0
    )
    expected = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 0]], bool)  # causal, pad key and row out
    np.testing.assert_array_equal(self_mask[0, 0], expected)
    cross = valid_entries(
        "decoder.layers.0.cross_attn.attention_weights", (1, 2, 3, 3), batch, "seq2seq", 0
    )
    np.testing.assert_array_equal(cross[0, 0], [[1, 1, 0], [1, 1, 0], [0, 0, 0]])
    rows = valid_entries("encoder.layers.0.ffn", (1, 3, 16), batch, "seq2seq", 0)
    np.testing.assert_array_equal(rows[0, :, 0], [True, True, False])


def test_nan_and_missing_tensors_in_the_report():
    batch = {"tgt_in": np.array([[1, 4, 5]])}
    ones = np.ones((1, 3, 4))
    left = {"tgt_embedded": ones, "decoder": ones * np.nan, "only_left": ones}
    right = {"tgt_embedded": ones, "decoder": ones, "logits": ones}
    report = compare_captures(
        left,
        right,
        ["tgt_embedded", "decoder", "logits"],
        tol=1e-5,
        dtype="float32",
        batch=batch,
        model_kind="lm",
        pad_id=0,
    )
    assert report.first_divergence == "decoder"
    assert report["decoder"].note == "non-finite values"
    assert report["logits"].status == "missing" and report["only_left"].status == "missing"
    data = report.to_dict()
    assert data["ok"] is False and data["first_divergence"] == "decoder"
    assert data["tensors"][1]["max_abs"] == "nan"
    table = report.format_table()
    assert "decoder" in table and "<-- divergence starts here" in table
    assert "FAIL: 1 of 4 tensors" in table


def test_fused_torch_attention_leaves_weights_missing_not_failed():
    state = torch_weights("lm")
    fused = CONFIG.replace(attention_impl="fused")  # the torch twin then returns no weights
    flax_model, params, torch_model = models("lm", state, torch_config=fused)
    report = compare_models(flax_model, params, torch_model, batch_for("lm"))
    assert report.ok, report.format_table()
    assert report["decoder.layers.0.self_attn.attention_weights"].status == "missing"
    assert report["decoder.layers.0.self_attn"].status == "ok"


def test_bad_batches_are_clear_errors():
    state = torch_weights("seq2seq")
    params = torch_state_to_flax(state, CONFIG)
    with pytest.raises(ParityInputError, match="missing 'src'"):
        compare_weights(CONFIG, params, state, {"tgt_in": np.ones((1, 3), np.int32)})
    batch = batch_for("seq2seq")
    batch["src"][0, 0] = CONFIG.src_vocab_size
    with pytest.raises(ParityInputError, match="outside the vocabulary of size 37"):
        compare_weights(CONFIG, params, state, batch)
    with pytest.raises(ParityInputError, match="dtype"):
        compare_weights(CONFIG, params, state, dtype="bfloat16")
    missing = {k: v for k, v in state.items() if k != "lm_head.bias"}
    with pytest.raises(ParityInputError, match="lm_head.bias"):
        compare_weights(CONFIG, params, missing)
    flax_model, flax_params, torch_model = models("seq2seq", state, "float32")
    with pytest.raises(ParityInputError, match="computes in float32 but the torch model's"):
        compare_models(flax_model, flax_params, torch_model.double(), batch_for("seq2seq"))
