"""flax_transformer.interop (torch.nn.Transformer in Flax) against PyTorch's own
torch.nn.Transformer (not the torch twin).

float64 (x64 from conftest.py), relative error <= 1e-12, random settings and masks, PyTorch's
fast path on and off; weights round-trip bit-exact; the loaders are strict.
"""

from __future__ import annotations

import contextlib
import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flax_transformer import interop
from flax_transformer.cli.nn_transformer_check import main as interop_cli
from flax_transformer.interop import (
    ConversionError,
    NNTransformer,
    NNTransformerEncoder,
    from_torch,
    load_nn_transformer_state,
    to_nn_transformer_state,
    torch_attention_mask,
)
from flax_transformer.spec.numerics import assert_close
from torch_reference import load_numpy_state, state_dict_to_numpy

F64 = dict(rtol=1e-12)
EXAMPLES = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def _quiet_torch_warnings():
    # nn.Transformer warns about nested tensors / mixed mask types; neither changes results.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


@contextlib.contextmanager
def torch_fastpath(enabled: bool):
    previous = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(enabled)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(previous)


def run_torch(module: torch.nn.Module, fast: bool, *args, **kwargs) -> np.ndarray:
    """Inference as PyTorch users run it: eval mode, no_grad (the fast path's conditions)."""
    module.eval()
    tensors = lambda x: None if x is None else torch.from_numpy(np.asarray(x))  # noqa: E731
    with torch_fastpath(fast), torch.no_grad():
        out = module(*map(tensors, args), **{k: tensors(v) for k, v in kwargs.items()})
    return out.numpy()


# ----------------------------------------------------------------------------- strategies
# Shapes come from a small set (d_model 8, dim_feedforward 12, a few lengths): JAX compiles each
# new shape once, so reusing them keeps the hypothesis runs fast. d_model != dim_feedforward.
D_MODEL, D_FF, BATCH = 8, 12, 2


@st.composite
def layer_settings(draw) -> dict:
    return dict(
        d_model=D_MODEL,
        nhead=draw(st.sampled_from([1, 2, 4])),  # odd nhead: torch's fast path is off for it
        dim_feedforward=D_FF,
        activation=draw(st.sampled_from(["relu", "gelu"])),
        layer_norm_eps=draw(st.sampled_from([1e-5, 1e-3, 0.5])),
        norm_first=draw(st.booleans()),
        bias=draw(st.booleans()),
    )


def random_mask(rng, kind: str | None, shape, *, fast: bool):
    """torch-convention mask: bool True = blocked (about 30%), or float added to the scores.

    For torch's fast path (fast=True) key 0 stays open and float masks hold only 0 / -inf: that
    path gives NaN for a fully blocked query row and treats any non-zero float as blocked
    (test_torch_fast_path_quirks); the regular path gets arbitrary masks.
    """
    if kind is None:
        return None
    if kind == "causal_float":
        return np.asarray(interop.generate_square_subsequent_mask(shape[-1], jnp.float64))
    if kind == "causal_bool":
        return np.triu(np.ones(shape, bool), k=1)
    blocked = rng.random(shape) < 0.3
    if fast:
        blocked[..., 0] = False
    if kind == "bool":
        return blocked
    values = np.zeros(shape) if fast else rng.standard_normal(shape)
    return np.where(blocked, -np.inf, values)


def padding_mask(rng, batch: int, length: int, kind: str | None, *, fast: bool):
    """(batch, length) key padding, True = padding, on the right (one real token at least)."""
    if kind is None:
        return None
    lengths = rng.integers(1, length + 1, size=batch)
    padded = np.arange(length)[None, :] >= lengths[:, None]
    if kind == "bool":
        return padded
    # torch's fast path turns a float padding mask into nested tensors by `mask != 0`, so any
    # non-zero entry counts as padding there: exact 0/-inf values for fast-path runs.
    values = np.zeros(padded.shape) if fast else 0.5 * rng.standard_normal(padded.shape)
    return np.where(padded, -np.inf, values)


# ----------------------------------------------------------------------------- parity
# A property search over every mask kind (~20 s a path on 2 cores): a long run (`pytest -m
# slow`, CI); the encoder and decoder stack parities below stay in the fast suite.
@pytest.mark.slow
@pytest.mark.parametrize("fast", [False, True], ids=["regular-path", "fast-path"])
@EXAMPLES
@given(
    layers=layer_settings(),
    num_encoder_layers=st.integers(1, 2),
    num_decoder_layers=st.integers(1, 2),
    sizes=st.tuples(st.sampled_from([1, 4]), st.sampled_from([1, 3])),
    src_mask=st.sampled_from([None, "bool", "float", "bool3d", "float3d"]),
    tgt_mask=st.sampled_from([None, "causal_float", "causal_bool", "float", "bool"]),
    memory_mask=st.sampled_from([None, "bool", "float"]),
    src_padding=st.sampled_from([None, "bool", "float"]),
    tgt_padding=st.sampled_from([None, "bool"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_nn_transformer_parity(
    fast,
    layers,
    num_encoder_layers,
    num_decoder_layers,
    sizes,
    src_mask,
    tgt_mask,
    memory_mask,
    src_padding,
    tgt_padding,
    seed,
):
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    (src_len, tgt_len), batch, nhead = sizes, BATCH, layers["nhead"]
    torch_model = torch.nn.Transformer(
        num_encoder_layers=num_encoder_layers,
        num_decoder_layers=num_decoder_layers,
        dropout=0.0,
        batch_first=True,
        dtype=torch.float64,
        **layers,
    )
    module = NNTransformer(
        num_encoder_layers=num_encoder_layers,
        num_decoder_layers=num_decoder_layers,
        dropout=0.0,
        dtype="float64",
        param_dtype="float64",
        **layers,
    )
    params = load_nn_transformer_state(state_dict_to_numpy(torch_model), module)

    def attn_mask(kind, q_len, k_len):
        if kind is not None and kind.endswith("3d"):
            return random_mask(rng, kind[:-2], (batch * nhead, q_len, k_len), fast=fast)
        return random_mask(rng, kind, (q_len, k_len), fast=fast)

    src = rng.standard_normal((batch, src_len, layers["d_model"]))
    tgt = rng.standard_normal((batch, tgt_len, layers["d_model"]))
    src_key_padding = padding_mask(rng, batch, src_len, src_padding, fast=fast)
    masks = dict(
        src_mask=attn_mask(src_mask, src_len, src_len),
        tgt_mask=attn_mask(tgt_mask, tgt_len, tgt_len),
        memory_mask=attn_mask(memory_mask, tgt_len, src_len),
        src_key_padding_mask=src_key_padding,
        tgt_key_padding_mask=padding_mask(rng, batch, tgt_len, tgt_padding, fast=fast),
        # torch's fast path zeroes padded encoder positions: the decoder must not look at them
        # (as every real use does); the regular path also gets an independent memory mask.
        memory_key_padding_mask=(
            src_key_padding if fast else padding_mask(rng, batch, src_len, "bool", fast=False)
        ),
    )
    expected = run_torch(torch_model, fast, src, tgt, **masks)
    actual = module.apply(params, src, tgt, **masks)
    assert actual.dtype == jnp.float64
    assert_close(actual, expected, **F64, what=f"nn.Transformer output (fast={fast})")


# torch's fast path (~15 s on 2 cores) is a long run (`pytest -m slow`, CI); the regular path
# with arbitrary masks stays in the fast suite.
@pytest.mark.parametrize(
    "fast",
    [False, pytest.param(True, marks=pytest.mark.slow)],
    ids=["regular-path", "fast-path"],
)
@EXAMPLES
@given(
    layers=layer_settings(),
    num_layers=st.integers(1, 3),
    final_norm=st.booleans(),
    length=st.sampled_from([1, 4]),
    mask=st.sampled_from([None, "bool", "float", "causal_float"]),
    padding=st.sampled_from([None, "bool", "float"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_transformer_encoder_stack_parity(
    fast, layers, num_layers, final_norm, length, mask, padding, seed
):
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    batch = BATCH
    torch_layer = torch.nn.TransformerEncoderLayer(
        dropout=0.0, batch_first=True, dtype=torch.float64, **layers
    )
    norm = (
        torch.nn.LayerNorm(
            layers["d_model"],
            eps=layers["layer_norm_eps"],
            bias=layers["bias"],
            dtype=torch.float64,
        )
        if final_norm
        else None
    )
    torch_stack = torch.nn.TransformerEncoder(torch_layer, num_layers, norm=norm)
    module, params = from_torch(torch_stack)
    assert module == NNTransformerEncoder(
        num_layers=num_layers,
        final_norm=final_norm,
        dropout=0.0,
        dtype="float64",
        param_dtype="float64",
        **layers,
    )
    src = rng.standard_normal((batch, length, layers["d_model"]))
    key_padding = padding_mask(rng, batch, length, padding, fast=fast)
    attn_mask = random_mask(rng, mask, (length, length), fast=fast)
    expected = run_torch(torch_stack, fast, src, attn_mask, key_padding)
    actual = np.asarray(module.apply(params, src, attn_mask, key_padding))
    if fast and key_padding is not None:
        # The fast path computes padded positions as zeros (then the final norm); they are not
        # real tokens, so compare the real ones.
        real = np.asarray(key_padding) == 0
        actual, expected = actual[real], expected[real]
    assert_close(actual, expected, **F64, what=f"nn.TransformerEncoder (fast={fast})")


# torch's fast path in the slow pass, as for the encoder stack above.
@pytest.mark.parametrize(
    "fast",
    [False, pytest.param(True, marks=pytest.mark.slow)],
    ids=["regular-path", "fast-path"],
)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layers=layer_settings(),
    num_layers=st.integers(1, 3),
    final_norm=st.booleans(),
    sizes=st.tuples(st.sampled_from([1, 3]), st.sampled_from([1, 4])),
    tgt_mask=st.sampled_from([None, "causal_bool", "causal_float", "float"]),
    memory_mask=st.sampled_from([None, "bool", "float"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_transformer_decoder_stack_parity(
    fast, layers, num_layers, final_norm, sizes, tgt_mask, memory_mask, seed
):
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    (tgt_len, src_len), batch = sizes, BATCH
    torch_layer = torch.nn.TransformerDecoderLayer(
        dropout=0.0, batch_first=True, dtype=torch.float64, **layers
    )
    norm = (
        torch.nn.LayerNorm(
            layers["d_model"],
            eps=layers["layer_norm_eps"],
            bias=layers["bias"],
            dtype=torch.float64,
        )
        if final_norm
        else None
    )
    torch_stack = torch.nn.TransformerDecoder(torch_layer, num_layers, norm=norm)
    module, params = from_torch(torch_stack)
    tgt = rng.standard_normal((batch, tgt_len, layers["d_model"]))
    memory = rng.standard_normal((batch, src_len, layers["d_model"]))
    masks = dict(
        tgt_mask=random_mask(rng, tgt_mask, (tgt_len, tgt_len), fast=fast),
        memory_mask=random_mask(rng, memory_mask, (tgt_len, src_len), fast=fast),
        tgt_key_padding_mask=padding_mask(rng, batch, tgt_len, "bool", fast=fast),
        memory_key_padding_mask=padding_mask(rng, batch, src_len, "bool", fast=fast),
    )
    expected = run_torch(torch_stack, fast, tgt, memory, **masks)
    actual = module.apply(params, tgt, memory, **masks)
    assert_close(actual, expected, **F64, what=f"nn.TransformerDecoder (fast={fast})")


def small_transformer(**changes) -> torch.nn.Transformer:
    torch.manual_seed(0)
    kwargs = dict(
        d_model=8,
        nhead=2,
        num_encoder_layers=2,
        num_decoder_layers=1,
        dim_feedforward=12,
        dropout=0.0,
        batch_first=True,
        dtype=torch.float64,
    )
    return torch.nn.Transformer(**{**kwargs, **changes}).eval()


def test_fast_path_runs_are_really_fast_path():
    """The fast-path parametrisation above does reach PyTorch's fused kernels (and the other
    one does not), so both of PyTorch's code paths are compared."""
    torch_model = small_transformer()
    src, tgt = torch.randn(2, 5, 8, dtype=torch.float64), torch.randn(2, 3, 8, dtype=torch.float64)
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    for fast in (True, False):
        with torch_fastpath(fast), torch.no_grad(), torch.autograd.profiler.profile() as prof:
            torch_model(src, tgt, src_key_padding_mask=padding, memory_key_padding_mask=padding)
        names = {event.name for event in prof.function_events}
        fused = {"aten::_transformer_encoder_layer_fwd", "aten::_nested_tensor_from_mask"}
        assert fused <= names if fast else not fused & names


# ----------------------------------------------------------------------------- padding
def test_fully_padded_sequence_is_defined():
    """A sequence whose every key is padding: attention weights are 0 (not NaN), the
    attention sublayer adds only its output bias. This is PyTorch's regular path too (its
    safe softmax); its fast path writes zeros at padded encoder positions instead, which no
    later layer sees once memory_key_padding_mask hides them."""
    torch_model = small_transformer(norm_first=False)
    module, params = from_torch(torch_model)
    rng = np.random.default_rng(1)
    src, tgt = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 3, 8))
    padding = np.zeros((2, 4), bool)
    padding[1] = True  # batch row 1 is all padding
    masks = dict(src_key_padding_mask=padding, memory_key_padding_mask=padding)

    out, state = module.apply(params, src, tgt, **masks, mutable=["intermediates"])
    assert np.all(np.isfinite(np.asarray(out)))
    weights = state["intermediates"]["encoder"]["layers_0"]["self_attn"]["attention_weights"][0]
    assert np.all(np.asarray(weights)[1] == 0.0)  # (batch, heads, q, k): row 1 attends nowhere
    cross = state["intermediates"]["decoder"]["layers_0"]["cross_attn"]["attention_weights"][0]
    assert np.all(np.asarray(cross)[1] == 0.0)

    # Equal to PyTorch's regular path everywhere, padded positions included.
    memory = module.apply(params, src, None, padding, method=lambda m, *a: m.encoder(*a))
    assert_close(memory, run_torch(torch_model.encoder, False, src, None, padding), **F64)
    assert_close(out, run_torch(torch_model, False, src, tgt, **masks), **F64)
    # The fast path: padded encoder positions become encoder.norm(0) = its bias; the
    # transformer output (which never looks at them) is the same as ours.
    fast_memory = run_torch(torch_model.encoder, True, src, None, padding)
    norm_bias = torch_model.encoder.norm.bias.detach().numpy()
    np.testing.assert_array_equal(fast_memory[1], np.broadcast_to(norm_bias, (4, 8)))
    assert_close(out, run_torch(torch_model, True, src, tgt, **masks), **F64)


def test_torch_fast_path_quirks_are_not_copied():
    """Where PyTorch's fast path departs from its own regular path, this module follows the
    regular path (torch's documented semantics): a query row with every key blocked gives NaN
    on the fast path (here: zero attention), and the fast path treats any non-zero float mask
    entry as blocked (here, as there on the regular path: added to the scores)."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        8, 2, 12, dropout=0.0, batch_first=True, dtype=torch.float64
    )
    stack = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
    module, params = from_torch(stack)
    rng = np.random.default_rng(6)
    src = rng.standard_normal((2, 4, 8))
    row_blocked = np.zeros((4, 4), bool)
    row_blocked[0] = True  # query 0 may see no key
    for mask in (row_blocked, rng.standard_normal((4, 4))):
        ours = module.apply(params, src, mask)
        assert_close(ours, run_torch(stack, False, src, mask), **F64, what="regular path")
        assert np.isnan(run_torch(stack, True, src, mask)).any()


# ----------------------------------------------------------------------------- layouts
def test_batch_first_false_and_unbatched_inputs():
    torch_model = small_transformer(batch_first=False, activation="gelu")
    module, params = from_torch(torch_model)
    assert not module.batch_first
    rng = np.random.default_rng(2)
    src, tgt = rng.standard_normal((4, 2, 8)), rng.standard_normal((3, 2, 8))  # (len, N, E)
    padding = np.array([[False] * 4, [False] * 2 + [True] * 2])
    tgt_mask = np.asarray(interop.generate_square_subsequent_mask(3, jnp.float64))
    kwargs = dict(tgt_mask=tgt_mask, src_key_padding_mask=padding)
    expected = run_torch(torch_model, False, src, tgt, **kwargs)
    assert_close(module.apply(params, src, tgt, **kwargs), expected, **F64, what="seq-first")
    # Unbatched (L, E) inputs with an (S,) key padding mask.
    one = dict(tgt_mask=tgt_mask, src_key_padding_mask=padding[1])
    expected = run_torch(torch_model, False, src[:, 1], tgt[:, 1], **one)
    assert_close(module.apply(params, src[:, 1], tgt[:, 1], **one), expected, **F64)


def test_jit_and_float32():
    """Under jax.jit, and in float32 (PyTorch's default dtype) with float32 tolerances."""
    torch_model = small_transformer(dtype=torch.float32)
    module, params = from_torch(torch_model)
    assert module.dtype == "float32"
    rng = np.random.default_rng(3)
    src = rng.standard_normal((2, 4, 8)).astype(np.float32)
    tgt = rng.standard_normal((2, 3, 8)).astype(np.float32)
    tgt_mask = np.asarray(interop.generate_square_subsequent_mask(3))
    padding = np.array([[False] * 4, [False] * 3 + [True]])

    @jax.jit
    def forward(params, src, tgt, tgt_mask, padding):
        return module.apply(
            params,
            src,
            tgt,
            tgt_mask=tgt_mask,
            src_key_padding_mask=padding,
            memory_key_padding_mask=padding,
        )

    actual = forward(params, src, tgt, tgt_mask, padding)
    assert actual.dtype == jnp.float32
    for fast in (False, True):
        expected = run_torch(
            torch_model,
            fast,
            src,
            tgt,
            tgt_mask=tgt_mask,
            src_key_padding_mask=padding,
            memory_key_padding_mask=padding,
        )
        assert_close(actual, expected, rtol=1e-5, what=f"float32 (fast={fast})")


# A long cell (the fast suite is at its 8-minute budget): the slow pass (`pytest -m slow`, CI).
@pytest.mark.slow
def test_dropout_only_when_not_deterministic():
    torch_model = small_transformer(dropout=0.3)
    module, params = from_torch(torch_model)
    assert module.dropout == 0.3
    rng = np.random.default_rng(4)
    src, tgt = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 3, 8))
    assert_close(module.apply(params, src, tgt), run_torch(torch_model, False, src, tgt), **F64)
    # an RngBitGenerator key: its kernels compile in a fraction of threefry's time
    rng = jax.random.key(0, impl="unsafe_rbg")
    dropped = module.apply(params, src, tgt, deterministic=False, rngs={"dropout": rng})
    assert np.all(np.isfinite(np.asarray(dropped)))
    assert not np.allclose(dropped, module.apply(params, src, tgt))


# ----------------------------------------------------------------------------- weights
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
def test_state_dict_round_trip_is_bit_exact(dtype, bias):
    torch_model = small_transformer(dtype=dtype, bias=bias, norm_first=True)
    state = state_dict_to_numpy(torch_model)
    module, params = from_torch(torch_model)
    back = to_nn_transformer_state(params, module)
    assert set(back) == set(state)
    for key, value in state.items():
        assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
        assert back[key].tobytes() == value.tobytes(), key
    assert ("encoder.norm.bias" in state) == bias


def test_prefix_for_a_transformer_inside_a_bigger_model():
    torch_model = small_transformer()
    module, params = from_torch(torch_model)
    outer = {"transformer." + k: v for k, v in state_dict_to_numpy(torch_model).items()}
    outer["embed.weight"] = np.ones((5, 8))  # the rest of the model: not ours, ignored
    loaded = load_nn_transformer_state(outer, module, prefix="transformer.")
    back = to_nn_transformer_state(loaded, module, prefix="transformer.")
    assert set(back) == set(outer) - {"embed.weight"}
    assert all(np.array_equal(back[k], outer[k]) for k in back)


def test_packed_projection_split():
    """in_proj_weight rows [0:d], [d:2d], [2d:3d] are the query, key, value maps."""
    torch_model = small_transformer()
    module, params = from_torch(torch_model)
    attn = torch_model.decoder.layers[0].multihead_attn
    flax_attn = params["params"]["decoder"]["layers_0"]["cross_attn"]
    weight, bias = attn.in_proj_weight.detach().numpy(), attn.in_proj_bias.detach().numpy()
    for i, name in enumerate(["query", "key", "value"]):
        np.testing.assert_array_equal(flax_attn[name]["kernel"], weight[8 * i : 8 * (i + 1)].T)
        np.testing.assert_array_equal(flax_attn[name]["bias"], bias[8 * i : 8 * (i + 1)])
    np.testing.assert_array_equal(flax_attn["out"]["kernel"], attn.out_proj.weight.detach().T)


def test_flax_params_run_in_torch():
    """The way back: Flax-initialised (or Flax-trained) params -> nn.Transformer, same output."""
    module = NNTransformer(
        d_model=8,
        nhead=2,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dim_feedforward=12,
        activation="gelu",
        norm_first=True,
        dtype="float64",
        param_dtype="float64",
    )
    rng = np.random.default_rng(5)
    src, tgt = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 3, 8))
    params = module.init(jax.random.key(0), src, tgt)
    torch_model = small_transformer(num_decoder_layers=2, activation="gelu", norm_first=True)
    load_numpy_state(torch_model, to_nn_transformer_state(params, module))
    tgt_mask = np.asarray(interop.generate_square_subsequent_mask(3, jnp.float64))
    expected = run_torch(torch_model, False, src, tgt, tgt_mask=tgt_mask)
    assert_close(module.apply(params, src, tgt, tgt_mask=tgt_mask), expected, **F64)


def test_loader_is_strict_and_reports_every_problem():
    torch_model = small_transformer()
    module, _ = from_torch(torch_model)
    state = state_dict_to_numpy(torch_model)
    del state["encoder.norm.weight"]
    state["decoder.layers.0.self_attn.in_proj_weight"] = np.zeros((9, 8))
    state["encoder.layers.0.self_attn.bias_k"] = np.zeros((1, 1, 8))
    with pytest.raises(ConversionError) as err:
        load_nn_transformer_state(state, module)
    message = str(err.value)
    assert "3 problem(s)" in message
    assert "missing key 'encoder.norm.weight'" in message
    assert "shape mismatch for 'decoder.layers.0.self_attn.in_proj_weight'" in message
    assert "expected (24, 8), found (9, 8)" in message
    assert "unexpected key 'encoder.layers.0.self_attn.bias_k'" in message


def test_bias_setting_must_match_the_checkpoint():
    state = state_dict_to_numpy(small_transformer(bias=True))
    module, _ = from_torch(small_transformer(bias=False))
    with pytest.raises(ConversionError, match="unexpected key 'encoder.norm.bias'"):
        load_nn_transformer_state(state, module)
    module_with_bias, _ = from_torch(small_transformer(bias=True))
    no_bias = state_dict_to_numpy(small_transformer(bias=False))
    with pytest.raises(ConversionError, match="missing key 'decoder.layers.0.linear1.bias'"):
        load_nn_transformer_state(no_bias, module_with_bias)


def test_to_state_is_strict():
    module, params = from_torch(small_transformer())
    tree = jax.tree_util.tree_map(np.asarray, params["params"])
    tree["encoder"]["layers_0"]["norm1"]["scale"] = np.ones(7)
    del tree["decoder"]["norm"]
    tree["extra"] = {"kernel": np.ones((2, 2))}
    with pytest.raises(ConversionError) as err:
        to_nn_transformer_state({"params": tree}, module)
    message = str(err.value)
    assert "4 problem(s)" in message and "'encoder/layers_0/norm1/scale'" in message
    assert "missing param 'decoder/norm/scale'" in message
    assert "unexpected param 'extra/kernel'" in message


# ----------------------------------------------------------------------------- masks & errors
def test_mask_conversion():
    common = dict(batch=2, num_heads=1, q_len=2, k_len=3, dtype=jnp.float64)
    attn = np.array([[False, True, False], [False, False, False]])
    padding = np.array([[False, False, True], [False, False, False]])
    allowed = torch_attention_mask(attn, padding, **common)
    assert allowed.dtype == jnp.bool_ and allowed.shape == (2, 1, 2, 3)
    np.testing.assert_array_equal(allowed, ~(attn[None, None] | padding[:, None, None, :]))
    bias = np.array([[0.5, -1.0, 0.0], [2.0, 0.0, -np.inf]])
    added = torch_attention_mask(bias, padding, **common)
    expected = bias[None, None] + np.where(padding, -np.inf, 0.0)[:, None, None, :]
    np.testing.assert_array_equal(added, expected)
    assert torch_attention_mask(None, None, **common) is None
    ours = NNTransformer.generate_square_subsequent_mask(4, jnp.float64)
    theirs = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=torch.float64)
    np.testing.assert_array_equal(ours, theirs.numpy())


@pytest.mark.parametrize(
    "attn_mask, padding, message",
    [
        (np.zeros((3, 3), bool), None, r"attn_mask of shape \(3, 3\) must be \(L, S\)"),
        (np.zeros((2, 3), np.int32), None, "must be boolean or floating point"),
        (None, np.zeros((2, 2), bool), r"key_padding_mask of shape \(2, 2\) must be \(N, S\)"),
    ],
)
def test_bad_masks_are_rejected(attn_mask, padding, message):
    with pytest.raises(ValueError, match=message):
        torch_attention_mask(attn_mask, padding, batch=2, num_heads=1, q_len=2, k_len=3)


def test_bad_calls_are_rejected():
    module, params = from_torch(small_transformer())
    src, tgt = np.zeros((2, 4, 8)), np.zeros((2, 3, 8))
    with pytest.raises(ValueError, match="tgt_is_causal=True needs tgt_mask"):
        module.apply(params, src, tgt, tgt_is_causal=True)
    with pytest.raises(ValueError, match="batch number of src and tgt must be equal"):
        module.apply(params, src, tgt[:1])
    with pytest.raises(ValueError, match="feature size of src"):
        module.apply(params, src[..., :4], tgt)
    with pytest.raises(ValueError, match="src_key_padding_mask of shape"):
        module.apply(params, src, tgt, src_key_padding_mask=np.zeros((2, 5), bool))


def test_from_torch_rejects_what_it_cannot_express():
    tanh_gelu = torch.nn.TransformerEncoderLayer(8, 2, 12, activation=torch.nn.GELU("tanh"))
    with pytest.raises(ValueError, match="relu or exact gelu"):
        from_torch(torch.nn.TransformerEncoder(tanh_gelu, 1, enable_nested_tensor=False))
    with pytest.raises(TypeError, match="from_torch takes"):
        from_torch(torch.nn.Linear(2, 2))


def test_cli_check(capsys):
    small = "--d-model 8 --nhead 2 --num-encoder-layers 2 --num-decoder-layers 1 "
    small += "--dim-feedforward 12 --batch 2 --src-len 4 --tgt-len 3 --dtype float64"
    assert interop_cli(small.split()) == 0
    report = json.loads(capsys.readouterr().out)
    for path in ("regular_path", "fast_path"):
        assert report[path]["relative_error"] <= 1e-12, report
    assert interop_cli(["--d-model", "10", "--nhead", "4"]) == 2
    assert "invalid nn.Transformer settings" in capsys.readouterr().err
