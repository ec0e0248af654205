"""The switches of BERT-style encoder-only models (token types, positions that skip padding,
the pooler, the heads of config.head) in both twins, float64, on padded batches."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_reference as tr
from flax_transformer import TransformerEncoder
from flax_transformer.interop.convert import torch_state_to_flax
from flax_transformer.nn.encoder_heads import skip_padding_positions
from flax_transformer.spec.numerics import assert_close

from .helpers import small_config, to_numpy

F64 = dict(rtol=1e-12)
BERT = dict(
    positional="learned",
    embed_norm=True,
    activation="gelu",
    layer_norm_eps=1e-12,
    type_vocab_size=3,
    tgt_vocab_size=37,
)


def _pair(cfg, seed=0):
    torch.manual_seed(seed)
    torch_model = tr.TransformerEncoder(cfg).eval()
    with torch.no_grad():
        for name, param in torch_model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.5)
    params = torch_state_to_flax(tr.state_dict_to_numpy(torch_model), cfg, "encoder")
    return torch_model, params


def _inputs(cfg, pad_id=0):
    """Right-padded rows of lengths 11, 4, 8 (real tokens never pad_id) and token types."""
    rng = np.random.default_rng(1)
    src = rng.integers(2, cfg.src_vocab_size, size=(3, 11))
    src[np.arange(11)[None] >= np.array([[11], [4], [8]])] = pad_id
    types = rng.integers(0, max(cfg.type_vocab_size, 1), size=src.shape)
    return src, types


def _run(cfg, pad_id=0):
    torch_model, params = _pair(cfg)
    src, types = _inputs(cfg, pad_id)
    token_types = types if cfg.type_vocab_size else None
    model = TransformerEncoder(cfg)
    out = np.asarray(model.apply(params, src, token_types=token_types))
    hidden, pooled = model.apply(params, src, token_types=token_types, method="features")
    with torch.no_grad():
        t_types = None if token_types is None else torch.from_numpy(token_types)
        expected = to_numpy(torch_model(torch.from_numpy(src), token_types=t_types))
        t_hidden, t_pooled = torch_model.features(torch.from_numpy(src), token_types=t_types)
    return out, expected, (hidden, pooled), (t_hidden, t_pooled), src


@pytest.mark.parametrize(
    "head", ["none", "sequence_pooled", "sequence_tanh", "sequence_relu", "token", "masked_lm"]
)
def test_heads_in_both_twins(head):
    cfg = small_config(**BERT, pooler=head in ("none", "sequence_pooled"), head=head, num_labels=5)
    out, expected, (hidden, pooled), (t_hidden, t_pooled), src = _run(cfg)
    shapes = {
        "none": (3, 11, cfg.d_model),
        "token": (3, 11, 5),
        "masked_lm": (3, 11, cfg.src_vocab_size),
    }
    assert out.shape == shapes.get(head, (3, 5))
    assert_close(out, expected, **F64, what=f"encoder head {head}")
    assert_close(np.asarray(hidden), to_numpy(t_hidden), **F64, what="hidden states")
    if cfg.pooler:
        assert pooled.shape == (3, cfg.d_model)
        assert_close(np.asarray(pooled), to_numpy(t_pooled), **F64, what="pooler")
    else:
        assert pooled is None and t_pooled is None


def test_token_types_change_the_output():
    cfg = small_config(**BERT)
    torch_model, params = _pair(cfg)
    src, types = _inputs(cfg)
    model = TransformerEncoder(cfg)
    with_types = np.asarray(model.apply(params, src, token_types=types))
    zeros = np.asarray(model.apply(params, src))
    explicit_zeros = np.asarray(model.apply(params, src, token_types=np.zeros_like(types)))
    assert np.abs(with_types - zeros).max() > 1e-3
    np.testing.assert_array_equal(zeros, explicit_zeros)
    assert "type_embed" in params["params"]


def test_skip_padding_positions_are_robertas():
    """transformers' create_position_ids_from_input_ids, less the offset padding_idx + 1."""
    roberta = pytest.importorskip("transformers.models.roberta.modeling_roberta")
    tokens = np.array([[5, 6, 7, 1, 1], [1, 1, 5, 6, 7], [5, 1, 6, 1, 7]])
    expected = roberta.RobertaEmbeddings.create_position_ids_from_input_ids(
        torch.from_numpy(tokens), padding_idx=1
    ).numpy()
    got = np.asarray(skip_padding_positions(jnp.asarray(tokens), 1)) + 2
    np.testing.assert_array_equal(got, expected)
    torch_got = tr.encoder_heads.skip_padding_positions(torch.from_numpy(tokens), 1) + 2
    np.testing.assert_array_equal(torch_got.numpy(), expected)


def test_skip_padding_positions_in_both_twins():
    cfg = small_config(**BERT, pad_id=1, position_offset=2, positions_skip_padding=True)
    out, expected, *_ = _run(cfg, pad_id=1)
    assert_close(out, expected, **F64, what="skip-padding positions")
    plain = small_config(**BERT, pad_id=1, position_offset=2)
    torch_model, params = _pair(plain)
    src, types = _inputs(plain, pad_id=1)
    left = np.concatenate([np.ones((3, 2), src.dtype), src[:, :-2]], axis=1)  # left padding
    shifted = np.asarray(TransformerEncoder(cfg).apply(params, left, token_types=types))
    unshifted = np.asarray(TransformerEncoder(plain).apply(params, left, token_types=types))
    assert np.abs(shifted - unshifted)[:, 2:].max() > 1e-3


def test_bad_encoder_switches_are_named():
    with pytest.raises(ValueError, match="sequence_pooled' needs pooler"):
        small_config(head="sequence_pooled")
    with pytest.raises(ValueError, match="positions_skip_padding needs"):
        small_config(positions_skip_padding=True)
    with pytest.raises(ValueError, match="head must be one of"):
        small_config(head="pooled")
