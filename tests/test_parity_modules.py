"""compare_modules / assert_parity on a user's own model: a small PyTorch block (LayerNorm,
attention, MLP) and a hand-written Flax port of it whose modules have other names (`fc1` vs
`Dense_0`), paired by a mapping and by the automatic fallback; then deliberate bugs in the
port, each named at the right module with the right weight verdict."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import linen as nn
from torch import nn as tnn

from flax_transformer.parity import ParityInputError, assert_parity, compare_modules
from flax_transformer.parity.diagnosis import (
    HYPERPARAMETER_DIFFERS,
    MATH_DIFFERS,
    WEIGHT_TRANSPOSED,
    WEIGHTS_DIFFER,
    WEIGHTS_SWAPPED,
)
from flax_transformer.parity.module_capture import flatten_output
from flax_transformer.parity.transforms import (
    chain,
    heads_first,
    merge_heads,
    minus_input,
    split_heads,
    take,
    transpose,
)

D, HIDDEN, HEADS, BATCH, LENGTH = 8, 12, 2, 2, 5


class TorchBlock(tnn.Module):
    """What a user writes in PyTorch: pre-LN attention + MLP, a final LayerNorm."""

    def __init__(self):
        super().__init__()
        self.norm = tnn.LayerNorm(D)
        self.q_proj, self.k_proj, self.v_proj = (tnn.Linear(D, D) for _ in range(3))
        self.o_proj = tnn.Linear(D, D)
        self.fc1 = tnn.Linear(D, HIDDEN)
        self.act = tnn.GELU()
        self.fc2 = tnn.Linear(HIDDEN, D)
        self.final_norm = tnn.LayerNorm(D)

    def forward(self, x, valid):  # x (B, L, D), valid (B, L) True = real token
        h = self.norm(x)
        split = lambda t: t.view(t.shape[0], t.shape[1], HEADS, -1).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q_proj(h)), split(self.k_proj(h)), split(self.v_proj(h))
        scores = q @ k.transpose(-1, -2) / (D // HEADS) ** 0.5  # (B, H, L, L)
        scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(x.shape)
        x = x + self.o_proj(out)
        x = x + self.fc2(self.act(self.fc1(x)))
        return self.final_norm(x)


class FlaxBlock(nn.Module):
    """The hand-written port: linen's automatic names, q/k/v kernels laid out (D, H, D/H)."""

    epsilon: float = 1e-5
    approximate_gelu: bool = False

    @nn.compact
    def __call__(self, x, valid):
        h = nn.LayerNorm(epsilon=self.epsilon, use_fast_variance=False)(x)
        q, k, v = (nn.DenseGeneral((HEADS, D // HEADS))(h) for _ in range(3))  # (B, L, H, Dh)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / (D // HEADS) ** 0.5
        scores = jnp.where(valid[:, None, None, :], scores, -jnp.inf)
        out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v)
        x = x + nn.DenseGeneral(D, axis=(-2, -1))(out)
        y = nn.gelu(nn.Dense(HIDDEN)(x), approximate=self.approximate_gelu)
        x = x + nn.Dense(D)(y)
        return nn.LayerNorm(epsilon=1e-5, use_fast_variance=False)(x)


MAPPING = {
    "norm": "LayerNorm_0",
    "q_proj": "DenseGeneral_0",
    "k_proj": "DenseGeneral_1",
    "v_proj": "DenseGeneral_2",
    "o_proj": "DenseGeneral_3",
    "fc1": "Dense_0",
    "fc2": "Dense_1",
    "final_norm": "LayerNorm_1",
}
# torch's projections are (B, L, D); the port's are (B, L, H, D/H): declared, not guessed.
TRANSFORMS = {"[qkv]_proj": split_heads(HEADS)}


def port_variables(torch_model):
    """The torch weights in the port's layout (what a user's converter does)."""
    w = {k: v.detach().numpy().astype(np.float64) for k, v in torch_model.state_dict().items()}
    dense = lambda name: {"kernel": w[f"{name}.weight"].T, "bias": w[f"{name}.bias"]}  # noqa: E731
    heads = lambda name: {  # noqa: E731
        "kernel": w[f"{name}.weight"].T.reshape(D, HEADS, D // HEADS),
        "bias": w[f"{name}.bias"].reshape(HEADS, D // HEADS),
    }
    norm = lambda name: {"scale": w[f"{name}.weight"], "bias": w[f"{name}.bias"]}  # noqa: E731
    return {
        "params": {
            "LayerNorm_0": norm("norm"),
            "DenseGeneral_0": heads("q_proj"),
            "DenseGeneral_1": heads("k_proj"),
            "DenseGeneral_2": heads("v_proj"),
            "DenseGeneral_3": {
                "kernel": w["o_proj.weight"].T.reshape(HEADS, D // HEADS, D),
                "bias": w["o_proj.bias"],
            },
            "Dense_0": dense("fc1"),
            "Dense_1": dense("fc2"),
            "LayerNorm_1": norm("final_norm"),
        }
    }


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    torch_model = TorchBlock()
    with torch.no_grad():  # non-trivial LayerNorm params, so a swapped scale/bias would show
        for p in torch_model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, LENGTH, D))
    valid = np.array([[True] * LENGTH, [True] * 3 + [False] * 2])
    return torch_model, port_variables(torch_model), (x, valid)


def run(setup, flax_module=None, variables=None, **kwargs):
    torch_model, good_variables, inputs = setup
    kwargs = {"mapping": MAPPING, "transforms": TRANSFORMS} | kwargs
    return compare_modules(
        torch_model,
        inputs,
        flax_module or FlaxBlock(),
        good_variables if variables is None else variables,
        inputs,
        **kwargs,
    )


def with_param(variables, path, fn):
    """A copy of `variables` with params[path] replaced by fn(params)."""
    params = jax.tree.map(np.array, variables["params"])
    node = params
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = fn(params)
    return {"params": params}


def test_port_paired_by_a_mapping_is_green(setup):
    report = assert_parity(*_args(setup), mapping=MAPPING, transforms=TRANSFORMS)
    paired = {t.name: (t.flax_name, t.paired_by) for t in report.tensors}
    assert paired["fc1"] == ("Dense_0", "mapping")
    assert paired["q_proj"] == ("DenseGeneral_0", "mapping")
    assert paired["(root)"] == ("(root)", "canonical")
    compared = [t for t in report.tensors if t.status == "ok"]
    assert len(compared) == 9  # 8 mapped modules + the output; nn.GELU has no Flax module
    assert max(t.rel for t in compared) < 1e-12
    assert report["q_proj"].note == "torch side: split_heads(2)"


def test_port_paired_by_the_automatic_fallback_is_green(setup):
    report = assert_parity(*_args(setup), transforms=TRANSFORMS)
    paired = {t.name: (t.flax_name, t.paired_by) for t in report.tensors}
    assert paired["fc1"] == ("Dense_0", "auto")  # fc1 and act have the same shape: fc1 agrees
    assert paired["k_proj"] == ("DenseGeneral_1", "auto")
    assert paired["final_norm"] == ("LayerNorm_1", "auto")
    assert report.info["paired"]["auto"] == 8
    table = report.format_table()
    assert "auto" in table and "OK: all" in table


def test_float32_run_is_green_at_float32_tolerance(setup):
    report = run(setup, dtype="float32")
    assert report.ok and report.tol == 1e-5 and report.dtype == "float32"
    assert max(t.rel for t in report.tensors if t.rel is not None) > 1e-9  # really float32


def test_user_objects_are_left_unchanged(setup):
    torch_model, variables, _ = setup
    before = {k: v.clone() for k, v in torch_model.state_dict().items()}
    run(setup)
    assert all(v.dtype == torch.float32 for v in torch_model.state_dict().values())
    assert all(torch.equal(before[k], v) for k, v in torch_model.state_dict().items())
    assert variables["params"]["Dense_0"]["kernel"].dtype == np.float64


@pytest.mark.parametrize("mapping", [MAPPING, None], ids=["mapping", "auto"])
def test_swapped_query_and_key_named_at_q_proj(setup, mapping):
    def swap(params):
        return params["DenseGeneral_1"]["kernel"]

    variables = with_param(setup[1], ("DenseGeneral_0", "kernel"), swap)
    variables = with_param(
        variables,
        ("DenseGeneral_1", "kernel"),
        lambda _: setup[1]["params"]["DenseGeneral_0"]["kernel"],
    )
    report = run(setup, variables=variables, mapping=mapping)
    assert report.first_divergence == "q_proj"
    assert report.diagnosis.verdict == WEIGHTS_SWAPPED
    assert "equals torch k_proj.weight" in report.diagnosis.detail
    with pytest.raises(AssertionError, match="divergence starts at q_proj"):
        assert_parity(*_args(setup, variables=variables), mapping=mapping, transforms=TRANSFORMS)


def test_untransposed_kernel_is_reported_as_transposed(setup):
    # A converter that forgot the transpose: (D, H, Dh) filled from weight, not weight.T.
    weight = setup[0].v_proj.weight.detach().numpy().astype(np.float64)
    variables = with_param(
        setup[1], ("DenseGeneral_2", "kernel"), lambda _: weight.reshape(D, HEADS, D // HEADS)
    )
    report = run(setup, variables=variables)
    assert report.first_divergence == "v_proj"
    assert report.diagnosis.verdict == WEIGHT_TRANSPOSED


def test_perturbed_bias_is_weights_differ(setup):
    variables = with_param(setup[1], ("Dense_1", "bias"), lambda p: p["Dense_1"]["bias"] + 1e-3)
    report = run(setup, variables=variables)
    assert report.first_divergence == "fc2"
    assert report.diagnosis.verdict == WEIGHTS_DIFFER
    assert "bias <-> bias" in report.diagnosis.detail


def test_linen_default_epsilon_is_a_hyperparameter_difference(setup):
    # nn.LayerNorm's default epsilon is 1e-6, torch's 1e-5: the classic porting slip.
    report = run(setup, flax_module=FlaxBlock(epsilon=1e-6))
    assert report.first_divergence == "norm"
    assert report.diagnosis.verdict == HYPERPARAMETER_DIFFERS
    assert "norm.eps = 1e-05 vs LayerNorm_0/epsilon = 1e-06" in report.diagnosis.detail


def test_tanh_gelu_is_math_with_equal_weights(setup):
    report = run(setup, flax_module=FlaxBlock(approximate_gelu=True))
    # torch's nn.GELU module has no Flax module to pair with; fc2 is the first that differs.
    assert report.first_divergence == "fc2"
    assert report.diagnosis.verdict == MATH_DIFFERS
    assert report["act"].status == "missing"
    assert report.diagnosis.unverified == ("act",)


def test_masked_positions_are_left_out(setup):
    class ZeroPadding(nn.Module):  # differs from torch only at padding positions
        @nn.compact
        def __call__(self, x, valid):
            return FlaxBlock(name="block")(x, valid) * valid[..., None]

    torch_model, variables, inputs = setup
    wrapped = {"params": {"block": variables["params"]}}
    mapping = {k: f"block/{v}" for k, v in MAPPING.items()}
    common = dict(mapping=mapping, transforms=TRANSFORMS)
    report = compare_modules(torch_model, inputs, ZeroPadding(), wrapped, inputs, **common)
    assert report.first_divergence == "(root)"
    masked = compare_modules(
        torch_model, inputs, ZeroPadding(), wrapped, inputs, mask=inputs[1], **common
    )
    assert masked.ok and masked.masked_excluded
    assert masked["(root)"].compared == 8 * D  # 5 + 3 real tokens


def test_transforms_and_bad_input():
    x = np.arange(24.0).reshape(2, 3, 4)
    assert split_heads(2)(x).shape == (2, 3, 2, 2)
    assert np.array_equal(merge_heads()(split_heads(2)(x)), x)
    assert heads_first(2)(x).shape == (2, 2, 3, 2)
    assert transpose(1, 0, 2)(x).shape == (3, 2, 4)
    with pytest.raises(ValueError, match="not divisible by 3 heads"):
        split_heads(3)(x)


def test_bad_arguments_are_named(setup):
    with pytest.raises(ParityInputError, match="dtype must be one of"):
        run(setup, dtype="float16")
    with pytest.raises(ParityInputError, match="torch_args must be a tuple"):
        compare_modules(setup[0], setup[2][0], FlaxBlock(), setup[1], setup[2])
    with pytest.raises(ParityInputError, match=r"transform split_heads\(3\) failed on torch"):
        run(setup, transforms={"q_proj": split_heads(3)})
    with pytest.raises(ParityInputError, match="the torch module failed on torch_args"):
        compare_modules(setup[0], (setup[2][0],), FlaxBlock(), setup[1], setup[2])
    with pytest.raises(ParityInputError, match="the Flax module failed on variables"):
        compare_modules(setup[0], setup[2], FlaxBlock(), {"params": {}}, setup[2])
    with pytest.raises(ParityInputError, match="no torch value was paired"):
        run(setup, mapping={".*": None})  # everything excluded: nothing would be compared
    report = run(setup, mapping=MAPPING | {"fc1": "Dense_9"})
    assert report.info["mapping_problems"] == [
        "mapping sends 'fc1' to 'Dense_9', which produced no Flax value"
    ]


def test_report_json_names_pairs_and_verdict(setup):
    report = run(setup, flax_module=FlaxBlock(epsilon=1e-6))
    data = report.to_dict()
    assert data["first_divergence"] == "norm"
    assert data["diagnosis"]["verdict"] == HYPERPARAMETER_DIFFERS
    row = next(t for t in data["tensors"] if t["name"] == "fc1")
    assert (row["module"], row["flax"], row["paired_by"]) == ("fc1", "Dense_0", "mapping")
    assert dataclasses.asdict(report.tensors[0])["module"] == "norm"


def _args(setup, variables=None):
    torch_model, good, inputs = setup
    return torch_model, inputs, FlaxBlock(), good if variables is None else variables, inputs


def test_flax_side_transforms_and_one_flax_module_called_twice():
    """torch returns a position table per stream (two modules); the port has one module that
    adds it to its input, called twice: `minus_input` recovers the table, `path#1` pairs the
    second torch module with the second call."""

    class TorchPositions(tnn.Module):
        def __init__(self, table):
            super().__init__()
            self.table = table

        def forward(self, length):
            return self.table[:length]  # (length, D)

    class TorchTwoStreams(tnn.Module):
        def __init__(self):
            super().__init__()
            table = tnn.Parameter(torch.randn(16, D))
            self.src_pos, self.tgt_pos = TorchPositions(table), TorchPositions(table)

        def forward(self, src, tgt):
            return src + self.src_pos(src.shape[1]), tgt + self.tgt_pos(tgt.shape[1])

    class AddPositions(nn.Module):
        @nn.compact
        def __call__(self, x):
            table = self.param("table", nn.initializers.zeros, (16, D))
            return x + table[: x.shape[1]]

    class FlaxTwoStreams(nn.Module):
        @nn.compact
        def __call__(self, src, tgt):
            positions = AddPositions()
            return positions(src), positions(tgt)

    torch.manual_seed(0)
    torch_model = TorchTwoStreams()
    table = torch_model.src_pos.table.detach().numpy().astype(np.float64)
    variables = {"params": {"AddPositions_0": {"table": table}}}
    rng = np.random.default_rng(0)
    inputs = (rng.normal(size=(2, 5, D)), rng.normal(size=(2, 3, D)))
    common = dict(
        mapping={"src_pos": "AddPositions_0", "tgt_pos": "AddPositions_0#1"},
        flax_transforms={"AddPositions_0": chain(minus_input(), take(0))},
        auto_pair=False,
    )
    report = assert_parity(torch_model, inputs, FlaxTwoStreams(), variables, inputs, **common)
    assert report["tgt_pos"].flax_name == "AddPositions_0#1"
    assert report["tgt_pos"].note == "flax side: minus_input then take(0, axis=0)"
    assert [t.status for t in report.tensors] == ["ok"] * 4  # both tables, both root outputs

    rolled = {"params": {"AddPositions_0": {"table": np.roll(table, D // 2, axis=1)}}}
    report = compare_modules(torch_model, inputs, FlaxTwoStreams(), rolled, inputs, **common)
    assert report.first_divergence == "src_pos"
    assert report.diagnosis.verdict == WEIGHTS_DIFFER


def test_outputs_are_flattened_to_named_arrays():
    @dataclasses.dataclass
    class Output:
        hidden: np.ndarray
        extras: dict
        cache: object = None

    output = Output(np.zeros(2), {"a": (np.ones(1), None, "text"), "b": [np.ones(3)]}, object())
    flat = flatten_output(output, lambda x: x if isinstance(x, np.ndarray) else None)
    assert [(k, v.shape) for k, v in flat] == [
        ("hidden", (2,)),
        ("extras.a.0", (1,)),
        ("extras.b.0", (3,)),
    ]
