"""compare_modules on transformers' PyTorch Marian against this project's imported Flax Marian
(`flax_transformer.hf.load`): all green, then one deliberate bug on the Flax side at a time —
swapped sin/cos halves, a wrong LayerNorm eps, the tanh GELU for the exact one, query and key
exchanged in one layer — each named at the right torch module with the right weight verdict.

The bugs change the Flax config, variables or module call (a method interceptor), never the
library code. The model is a tiny random Marian built from a config and saved with
save_pretrained (nothing is downloaded)."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import linen as nn

from flax_transformer.parity import EXCLUDE, compare_modules
from flax_transformer.parity.diagnosis import (
    HYPERPARAMETER_DIFFERS,
    MATH_DIFFERS,
    WEIGHTS_SWAPPED,
)
from flax_transformer.parity.transforms import chain, minus_input, take

from . import hf_models

pytest.importorskip("transformers")

# Marian's modules -> the project's: fixed names, then per layer.
FIXED = {
    "model.encoder.embed_tokens": "shared_embed",
    "model.decoder.embed_tokens": "shared_embed#1",  # one Flax table, called for each stack
    "model.encoder.embed_positions": "_positions_src",
    "model.decoder.embed_positions": "_positions_src#1",
    "model.encoder": "encoder",
    "model.decoder": "decoder",
    "lm_head": EXCLUDE,  # logits without final_logits_bias: the Flax side has no such value
}
LAYER_PARTS = {
    "encoder_attn": "cross_attn",
    "q_proj": "query",
    "k_proj": "key",
    "v_proj": "value",
    "out_proj": "out",
    "fc1": "ffn/linear1",
    "fc2": "ffn/linear2",
}


def marian_to_flax(name: str):
    """A callable mapping: transformers' Marian module name -> the Flax path (None: let the
    rule / fallback decide, e.g. activation_fn, which the Flax FeedForward calls as a
    function: the fallback pairs it with the dropout after it, which holds the same values)."""
    if name in FIXED:
        return FIXED[name]
    match = re.fullmatch(r"model\.(encoder|decoder)\.layers\.(\d+)(?:\.(.+))?", name)
    if match is None:
        return None
    stack, layer, rest = match.groups()
    path = f"{stack}/layers_{layer}"
    norms = {
        "self_attn_layer_norm": "norm1",
        "encoder_attn_layer_norm": "norm2",
        "final_layer_norm": "norm2" if stack == "encoder" else "norm3",
    }
    if rest is None:
        return path
    if rest in norms:
        return f"{path}/{norms[rest]}"
    if rest == "activation_fn":
        return None
    return path + "/" + "/".join(LAYER_PARTS.get(p, p) for p in rest.split("."))


# transformers' position module returns the table rows (len, d_model); the project's adds them
# to the embeddings: its output minus its input, one batch row, is the table.
FLAX_TRANSFORMS = {"_positions_src": chain(minus_input(), take(0))}


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    from transformers import MarianMTModel

    from flax_transformer import hf

    config = hf_models.marian_config()
    config.activation_function = "gelu"  # the exact erf GELU, so the tanh one is a bug
    torch.manual_seed(0)
    torch_model = MarianMTModel(config).eval()
    torch_model.final_logits_bias.normal_(0.0, 0.5)  # a zero bias could hide a missing one
    path = hf_models.save(torch_model, tmp_path_factory.mktemp("marian") / "marian")
    model = hf.load(path)
    rng = np.random.default_rng(0)
    ids, mask = hf_models.ragged_batch(rng, 60, (7, 4, 5), pad=model.config.pad_id)
    decoder = rng.integers(3, 60, size=(3, 5))
    decoder[:, 0] = model.config.decoder_start_id
    return torch_model, model, ids, mask, decoder


def run(marian, config=None, variables=None):
    torch_model, model, ids, mask, decoder = marian
    module = model.module if config is None else type(model.module)(config)
    torch_kwargs = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder)
    return compare_modules(
        torch_model,
        (),
        module,
        model.variables if variables is None else variables,
        (ids, decoder),
        torch_kwargs={k: torch.from_numpy(v) for k, v in torch_kwargs.items()},
        flax_kwargs={"src_mask": mask.astype(bool)[:, None, None, :]},
        mapping=marian_to_flax,
        flax_transforms=FLAX_TRANSFORMS,
        mask=(mask.astype(bool), np.ones(decoder.shape, bool)),  # source padding rows left out
    )


def test_marian_is_green(marian):
    report = run(marian)
    assert report.ok, report.format_table()
    compared = [t for t in report.tensors if t.status == "ok"]
    assert len(compared) == 63
    assert [t.name for t in report.tensors if t.status == "missing"] == [
        "model:last_hidden_state",  # the decoder's output again (paired as model.decoder)
        "model:encoder_last_hidden_state",
        "lm_head",  # excluded: before final_logits_bias
        "(root):encoder_last_hidden_state",
    ]
    assert max(t.rel for t in compared) < 1e-12
    by_name = {t.name: t for t in report.tensors}
    assert by_name["model.decoder.layers.1.encoder_attn.k_proj"].flax_name == (
        "decoder/layers_1/cross_attn/key"
    )
    assert by_name["model.decoder.embed_positions"].flax_name == "_positions_src#1"
    assert by_name["model.encoder.layers.0.activation_fn"].paired_by == "auto"
    assert by_name["(root):logits"].status == "ok"  # with final_logits_bias
    assert report.info["mapping_problems"] == []
    # every module output of every Marian layer is compared: 11 per encoder layer (q, k, v,
    # out, attention, its norm, fc1, activation, fc2, final norm, the layer), 17 per decoder one
    layer_rows = [t for t in compared if ".layers." in t.name]
    assert len(layer_rows) == 2 * 11 + 2 * 17
    assert not [t.name for t in report.tensors if ".layers." in t.name and t.status != "ok"]


@pytest.mark.slow
def test_swapped_sin_cos_halves_are_named_at_the_positions(marian):
    def cos_then_sin(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        if context.method_name != "__call__" or type(context.module).__name__ != (
            "PositionalEncoding"
        ):
            return out
        table = out - args[0]
        half = table.shape[-1] // 2
        return args[0] + jnp.concatenate([table[..., half:], table[..., :half]], axis=-1)

    with nn.intercept_methods(cos_then_sin):
        report = run(marian)
    assert report.first_divergence == "model.encoder.embed_positions"
    # The torch table is a (frozen) weight; the Flax module computes its table.
    assert report.diagnosis.verdict == MATH_DIFFERS
    assert "weight (torch only)" in report.diagnosis.detail


@pytest.mark.slow
def test_wrong_layer_norm_eps_is_a_hyperparameter_difference(marian):
    config = dataclasses.replace(marian[1].config, layer_norm_eps=1e-6)
    report = run(marian, config=config)
    assert report.first_divergence == "model.encoder.layers.0.self_attn_layer_norm"
    assert report.diagnosis.verdict == HYPERPARAMETER_DIFFERS
    assert "eps = 1e-05 vs encoder/layers_0/norm1/epsilon = 1e-06" in report.diagnosis.detail


@pytest.mark.slow
def test_tanh_gelu_is_named_at_the_activation(marian):
    config = dataclasses.replace(marian[1].config, activation="gelu_tanh")
    report = run(marian, config=config)
    assert report.first_divergence == "model.encoder.layers.0.activation_fn"
    assert report.diagnosis.verdict == MATH_DIFFERS
    assert report.diagnosis.detail == "the module has no weights on either side"


@pytest.mark.slow
def test_query_key_swap_in_one_layer(marian):
    params = jax.tree.map(np.array, marian[1].variables)
    attn = params["params"]["decoder"]["layers_1"]["self_attn"]
    attn["query"]["kernel"], attn["key"]["kernel"] = attn["key"]["kernel"], attn["query"]["kernel"]
    report = run(marian, variables=params)
    assert report.first_divergence == "model.decoder.layers.1.self_attn.q_proj"
    assert report.diagnosis.verdict == WEIGHTS_SWAPPED
    assert "equals torch model.decoder.layers.1.self_attn.k_proj.weight" in report.diagnosis.detail
    # everything before it (the encoder, decoder layer 0) agrees
    before = report.tensors[: [t.name for t in report.tensors].index(report.first_divergence)]
    assert all(t.ok for t in before) and sum(t.status == "ok" for t in before) > 40
