"""compare_modules on torch.nn.Transformer against the project's NNTransformer (from_torch):
green with torch.nn's masks, by a mapping and by the automatic fallback; a bug in the Flax
weights or settings is named at the right torch module with the right weight verdict."""

import jax
import numpy as np
import pytest
import torch

from flax_transformer.interop import from_torch
from flax_transformer.parity import ParityInputError, compare_modules
from flax_transformer.parity.diagnosis import (
    HYPERPARAMETER_DIFFERS,
    MATH_DIFFERS,
    WEIGHT_TRANSPOSED,
    WEIGHTS_SWAPPED,
)
from flax_transformer.parity.transforms import seq_first_to_batch_first

# torch.nn names its feed-forward linear1/linear2 on the layer and the cross-attention
# multihead_attn; the project's stacks call them ffn/linear1 and cross_attn.
NN_MAPPING = {
    r"(encoder|decoder)\.layers\.(\d+)\.linear([12])": r"\1/layers_\2/ffn/linear\3",
    r"decoder\.layers\.(\d+)\.multihead_attn": r"decoder/layers_\1/cross_attn",
}
SRC_LEN, TGT_LEN = 5, 4
# torch.nn's encoder fast path (padding masks, eval, no grad) runs on nested tensors.
pytestmark = [
    pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors"),
    pytest.mark.filterwarnings("ignore:enable_nested_tensor is True"),
]


def small_nn_transformer(batch_first: bool) -> torch.nn.Transformer:
    """torch.nn.Transformer, d_model 8, 2 heads, 2+2 layers, no dropout, in eval mode."""
    return torch.nn.Transformer(
        d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=16,
        dropout=0.0, batch_first=batch_first,
    ).eval()  # fmt: skip


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    torch_model = small_nn_transformer(batch_first=True)
    module, params = from_torch(torch_model)
    rng = np.random.default_rng(0)
    src, tgt = rng.normal(size=(2, SRC_LEN, 8)), rng.normal(size=(2, TGT_LEN, 8))
    src_padding = np.array([[False] * SRC_LEN, [False] * 3 + [True] * 2])  # True = padding
    causal = np.triu(np.ones((TGT_LEN, TGT_LEN), bool), k=1)  # True = blocked
    masks = dict(
        tgt_mask=causal, src_key_padding_mask=src_padding, memory_key_padding_mask=src_padding
    )
    torch_masks = {k: torch.from_numpy(v) for k, v in masks.items()}
    # Compared: real source rows (batch, src_len); every target row (batch, tgt_len).
    valid = (~src_padding, np.ones((2, TGT_LEN), bool))
    return torch_model, module, params, (src, tgt), masks, torch_masks, valid


def run(setup, module=None, params=None, **kwargs):
    torch_model, good_module, good_params, inputs, masks, torch_masks, valid = setup
    kwargs = dict(mapping=NN_MAPPING, mask=valid) | kwargs
    return compare_modules(
        torch_model,
        inputs,
        module or good_module,
        good_params if params is None else params,
        inputs,
        torch_kwargs=torch_masks,
        flax_kwargs=masks,
        **kwargs,
    )


def edited(params, layer_path, fn):
    params = jax.tree.map(np.array, params)
    node = params["params"]
    for part in layer_path:
        node = node[part]
    fn(node)
    return params


@pytest.mark.parametrize("mapping", [NN_MAPPING, None], ids=["mapping", "auto"])
def test_nn_transformer_is_green(setup, mapping):
    report = run(setup, mapping=mapping)
    assert report.ok, report.format_table()
    compared = [t for t in report.tensors if t.status == "ok"]
    assert len(compared) == 47  # every captured torch output, paired
    assert max(t.rel for t in compared) < 1e-12
    if mapping is not None:
        assert report["encoder.layers.0.linear1"].flax_name == "encoder/layers_0/ffn/linear1"
        assert report["encoder.layers.0.linear1"].paired_by == "mapping"
    assert report["encoder.layers.0.self_attn:0"].flax_name == "encoder/layers_0/self_attn"


def test_layer_norm_eps_is_a_hyperparameter_difference(setup):
    report = run(setup, module=setup[1].clone(layer_norm_eps=1e-6))
    assert report.first_divergence == "encoder.layers.0.norm1"
    assert report.diagnosis.verdict == HYPERPARAMETER_DIFFERS


def test_query_key_swap_in_one_layer_is_named_there(setup):
    def swap(attn):
        attn["query"]["kernel"], attn["key"]["kernel"] = (
            attn["key"]["kernel"],
            attn["query"]["kernel"],
        )

    report = run(setup, params=edited(setup[2], ("encoder", "layers_1", "self_attn"), swap))
    assert report.first_divergence == "encoder.layers.1.self_attn"
    assert report.diagnosis.verdict == WEIGHTS_SWAPPED
    # torch packs q, k, v in in_proj_weight: the chunks are what the Flax weights are matched to
    assert "query/kernel: the Flax weight equals torch" in report.diagnosis.detail
    assert "in_proj_weight[8:16]" in report.diagnosis.detail


def test_untransposed_kernel_is_named_there(setup):
    def untranspose(attn):
        attn["value"]["kernel"] = attn["value"]["kernel"].T.copy()

    report = run(setup, params=edited(setup[2], ("decoder", "layers_1", "cross_attn"), untranspose))
    assert report.first_divergence == "decoder.layers.1.multihead_attn"
    assert report.diagnosis.verdict == WEIGHT_TRANSPOSED
    assert "in_proj_weight[16:24] <-> value/kernel" in report.diagnosis.detail


def test_other_activation_is_math_with_equal_weights(setup):
    report = run(setup, module=setup[1].clone(activation="gelu"))
    # torch.nn applies the activation as a function; its `dropout` module is the first output
    # after it.
    assert report.first_divergence == "encoder.layers.0.dropout"
    assert report.diagnosis.verdict == MATH_DIFFERS


def test_sequence_first_torch_against_batch_first_flax(setup):
    """torch.nn's default layout (L, N, E) against a batch-first port: declared with one
    transform for every torch tensor."""
    torch_model, module, params, (src, tgt), masks, torch_masks, valid = setup
    sequence_first = small_nn_transformer(batch_first=False)
    sequence_first.load_state_dict(torch_model.state_dict())
    torch_args = tuple(np.swapaxes(x, 0, 1) for x in (src, tgt))  # (L, N, E)
    common = dict(torch_kwargs=torch_masks, flax_kwargs=masks, mapping=NN_MAPPING, mask=valid)
    report = compare_modules(
        sequence_first,
        torch_args,
        module,  # batch_first=True
        params,
        (src, tgt),
        transforms={".*": seq_first_to_batch_first()},
        **common,
    )
    assert report.ok, report.format_table()
    assert report["encoder.layers.1.norm2"].note == "torch side: seq_first_to_batch_first"
    assert (
        report["encoder"].note == "torch side: seq_first_to_batch_first"
    )  # Flax's is "encoder" too
    assert sum(t.status == "ok" for t in report.tensors) == 47
    # Undeclared, the layouts differ: (5, 2, 8) is not (2, 5, 8), no shape pairs.
    with pytest.raises(ParityInputError, match="no torch value was paired"):
        compare_modules(sequence_first, torch_args, module, params, (src, tgt), **common)
