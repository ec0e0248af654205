"""Sharded training (flax_transformer.training.sharding) matches single-device training.

The parity run needs 8 devices, so it runs in a subprocess with 8 fake CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=8 must be set before JAX starts):
`python -m tests.test_sharding` prints the max differences as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flax_transformer.spec.config import TransformerConfig
from flax_transformer.training.sharding import (
    LOGICAL_RULES,
    MeshError,
    check_config_fits,
    logical_param_specs,
    make_mesh,
    param_partition_specs,
    parse_mesh,
    tree_shardings,
)

ROOT = Path(__file__).resolve().parents[1]
MESHES = ("data=8", "model=8", "data=2,model=4")
STEPS = 4
TOLERANCE = 1e-5


# ----------------------------------------------------------------------------- the worker
def tiny_config() -> TransformerConfig:
    # 8 heads and d_ff 64 so that model=8 splits whole heads and hidden units.
    return TransformerConfig(
        src_vocab_size=40,
        tgt_vocab_size=48,
        d_model=32,
        num_heads=8,
        num_encoder_layers=1,
        num_decoder_layers=1,
        d_ff=64,
        dropout_rate=0.1,
        max_len=16,
    )


def tiny_batches(steps: int, batch: int = 8, length: int = 10):
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(steps):
        src = rng.integers(3, 40, (batch, length), dtype=np.int32)
        tgt = rng.integers(3, 48, (batch, length + 1), dtype=np.int32)
        src[::3, -3:] = 0  # some padding
        tgt[::2, -4:] = 0
        batches.append({"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]})
    return batches


def make_state_and_step(cfg: TransformerConfig):
    """The model, the project's train state and step, dropout and label smoothing on."""
    from flax_transformer.nn.model import Transformer
    from flax_transformer.training.optim import make_optimizer
    from flax_transformer.training.state import create_train_state
    from flax_transformer.training.steps import make_train_step

    model = Transformer(cfg)
    # eps 1e-4, not 1e-9: a key bias has a gradient that is zero in exact arithmetic (softmax
    # is shift-invariant over keys), and Adam with a tiny eps turns its rounding noise, which
    # differs with the reduction order of each mesh, into full lr-sized steps (measured: 9e-6
    # apart after 4 steps with eps 1e-6, every other param < 1e-6).
    optimizer = make_optimizer(1e-3, weight_decay=0.01, clip_norm=1.0, eps=1e-4)
    state = create_train_state(model, optimizer, seed=0)
    return model, state, make_train_step(model, optimizer, label_smoothing=0.1)


def run_parity(meshes=MESHES, steps: int = STEPS) -> dict:
    """Train `steps` steps on a 1x1 mesh and on each mesh; return the max differences."""
    import jax

    from flax_transformer.training.sharding import shard_training

    cfg = tiny_config()
    batches = tiny_batches(steps)

    def train(spec):
        mesh = make_mesh(spec)
        check_config_fits(cfg, mesh, batches[0]["src"].shape[0])
        model, state, train_step = make_state_and_step(cfg)
        state, step = shard_training(mesh, state, train_step, model=model)
        losses = []
        for batch in batches:
            state, metrics = step(state, batch)
            losses.append(float(metrics["loss_sum"] / metrics["token_count"]))
        kernel = state.params["encoder"]["layers_0"]["self_attn"]["query"]["kernel"]
        # Adam's moments of that kernel are split like the kernel itself.
        moments = [
            leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(state.opt_state)[0]
            if jax.tree_util.keystr(path).endswith("['self_attn']['query']['kernel']")
        ]
        specs = {str(kernel.sharding.spec)} | {str(m.sharding.spec) for m in moments}
        assert len(moments) >= 2 and len(specs) == 1, specs
        return losses, jax.tree.map(np.asarray, state.params), specs.pop()

    ref_losses, ref_params, _ = train("data=1,model=1")
    report = {"devices": len(jax.devices()), "ref_losses": ref_losses}
    for spec in meshes:
        losses, params, query_spec = train(spec)
        diffs = jax.tree.leaves(
            jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), params, ref_params)
        )
        report[spec] = {
            "loss_diff": float(np.max(np.abs(np.array(losses) - np.array(ref_losses)))),
            "param_diff": max(diffs),
            "query_kernel_spec": query_spec,
        }
    return report


# ----------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def parity_report():
    env = dict(os.environ)
    # The session's fast-compile flags (conftest.py) come with the environment.
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"
    env["JAX_PLATFORMS"] = "cpu"
    done = subprocess.run(
        [sys.executable, "-m", "tests.test_sharding"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_worker_saw_eight_devices(parity_report):
    assert parity_report["devices"] == 8
    # The reference run trains: loss moves and stays finite.
    losses = parity_report["ref_losses"]
    assert all(np.isfinite(losses)) and losses[-1] != losses[0]


@pytest.mark.slow
@pytest.mark.parametrize("spec", MESHES)
def test_sharded_training_matches_single_device(parity_report, spec):
    result = parity_report[spec]
    assert result["loss_diff"] <= TOLERANCE, result
    assert result["param_diff"] <= TOLERANCE, result
    from jax.sharding import PartitionSpec as P

    expected = P(None, "model") if "model" in spec else P()
    assert result["query_kernel_spec"] == str(expected)


def test_parse_mesh():
    assert parse_mesh("data=2,model=4") == {"data": 2, "model": 4}
    assert parse_mesh("model=8") == {"data": 1, "model": 8}
    assert parse_mesh(" data = 3 ") == {"data": 3, "model": 1}


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "look like"),
        ("data", "AXIS=SIZE"),
        ("pipe=2", "AXIS=SIZE"),
        ("data=two", "integer"),
        ("data=0", ">= 1"),
        ("data=2,data=2", "twice"),
    ],
)
def test_parse_mesh_rejects_bad_specs(spec, message):
    with pytest.raises(MeshError, match=message):
        parse_mesh(spec)


def test_make_mesh_needs_enough_devices():
    with pytest.raises(MeshError, match="needs 1024 devices"):
        make_mesh("data=32,model=32")
    mesh = make_mesh("data=1")
    assert dict(mesh.shape) == {"data": 1, "model": 1}


def _flat(tree) -> dict[str, object]:
    import jax

    return {
        "/".join(str(k.key) for k in path): leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


@pytest.mark.parametrize(
    "kind, changes",
    [
        ("seq2seq", {}),
        ("seq2seq", dict(positional="learned", final_norm=True, remat=True)),
        ("seq2seq", dict(share_embeddings=True, tie_output=True, src_vocab_size=48)),
        ("lm", dict(use_bias=False)),
        ("lm", dict(positional="learned", final_norm=True)),
        # The encoder kind with BERT's pooler and heads (a square d_model matrix once named
        # its two axes alike, which a mesh cannot lay out), T5's relative bias and gated FFN.
        ("encoder", dict(positional="learned", type_vocab_size=2, embed_norm=True, pooler=True,
                         head="sequence_pooled", num_labels=3)),
        ("encoder", dict(positional="learned", head="sequence_tanh", num_labels=3)),
        ("encoder", dict(positional="learned", head="masked_lm")),
        ("encoder", dict(positional="none", relative_attention_buckets=8, gated_ffn=True)),
    ],
)  # fmt: skip
def test_every_param_declares_logical_axes_with_a_rule(kind, changes):
    from flax_transformer.nn.kinds import abstract_variables, model_for

    model = model_for(tiny_config().replace(**changes), kind)
    logical = _flat(logical_param_specs(model))  # raises for a param without declared axes
    shapes = _flat(abstract_variables(model)["params"])
    assert logical.keys() == shapes.keys()
    rules = dict(LOGICAL_RULES)
    for path, names in logical.items():
        assert len(names) == len(shapes[path].shape), path
        assert all(name in rules for name in names), (path, names)
        assert len(set(names)) == len(names), (path, names)  # a mesh needs distinct names
        if len(names) >= 2:  # every axis of every matrix is named, none left to a default
            assert None not in names, (path, names)


def test_params_without_declared_axes_or_rules_are_errors():
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from flax_transformer.nn.layers import Dense

    x = jnp.ones((2, 8))
    with pytest.raises(MeshError, match="without logical axis names .*: bias, kernel"):
        logical_param_specs(Dense(4), x)
    model = Dense(4, axes=("embed", "experts"))
    assert logical_param_specs(model, x)["kernel"] == P("embed", "experts")
    with pytest.raises(MeshError, match="bias: no sharding rule for the logical axis 'experts'"):
        param_partition_specs(model, {"data": 1, "model": 2}, x)
    with pytest.raises(ValueError, match="declares 1 axes"):
        Dense(4, axes=("embed",)).init(jax.random.key(0), x)


def test_partition_rules():
    from jax.sharding import PartitionSpec as P

    from flax_transformer.nn.kinds import model_for

    model = model_for(tiny_config().replace(positional="learned"), "seq2seq")
    specs = _flat(param_partition_specs(model, {"data": 2, "model": 4}))
    attn = "decoder/layers_0/cross_attn/"
    assert specs[attn + "query/kernel"] == P(None, "model")
    assert specs[attn + "value/bias"] == P("model")
    assert specs[attn + "out/kernel"] == P("model", None)
    assert specs[attn + "out/bias"] == P()
    ffn = "encoder/layers_0/ffn/"
    assert specs[ffn + "linear1/kernel"] == P(None, "model")
    assert specs[ffn + "linear1/bias"] == P("model")
    assert specs[ffn + "linear2/kernel"] == P("model", None)
    assert specs[ffn + "linear2/bias"] == P()
    for replicated in ("src_embed/embedding", "lm_head/kernel", "pos_embed/weight"):
        assert specs[replicated] == P(), replicated
    assert specs["encoder/layers_0/norm1/scale"] == P()
    split = {path for path, spec in specs.items() if spec != P()}
    # 3 attentions x (q, k, v kernels and biases, out kernel) + 2 ffns x (linear1 kernel and
    # bias, linear2 kernel); nothing else.
    assert len(split) == 3 * 7 + 2 * 3
    # A model axis of 1 replicates everything.
    ones = param_partition_specs(model, {"data": 2, "model": 1})
    assert set(_flat(ones).values()) == {P()}
    with pytest.raises(MeshError, match="ffn/linear1/bias of shape \\(30,\\) cannot be split"):
        param_partition_specs(model_for(tiny_config().replace(d_ff=30), "lm"), {"model": 4})


def test_renamed_layers_keep_their_sharding():
    """Sharding follows the axes declared where params are made, not the module names."""
    import jax.numpy as jnp
    from flax import linen as nn
    from jax.sharding import PartitionSpec as P

    from flax_transformer.nn.attention import MultiHeadAttention
    from flax_transformer.nn.layers import FeedForward

    class Renamed(nn.Module):
        config: TransformerConfig

        @nn.compact
        def __call__(self, x):
            x = MultiHeadAttention(self.config, name="mixer")(x)
            return FeedForward(self.config, name="channel_mlp")(x)

    x = jnp.ones((1, 3, tiny_config().d_model))
    specs = _flat(param_partition_specs(Renamed(tiny_config()), {"model": 2}, x))
    assert specs["mixer/key/kernel"] == P(None, "model")
    assert specs["mixer/out/kernel"] == P("model", None)
    assert specs["channel_mlp/linear2/kernel"] == P("model", None)


def test_optimizer_moments_are_laid_out_like_the_params():
    import jax
    from jax.sharding import PartitionSpec as P

    from flax_transformer.nn.model import Transformer

    model = Transformer(tiny_config())
    state = jax.eval_shape(lambda: make_state_and_step(tiny_config())[1])  # shapes suffice
    mesh = make_mesh("data=1")  # one device: the specs still name `model` when sizes say so
    shardings = tree_shardings(mesh, state, param_partition_specs(model, {"model": 8}))
    flat = {
        jax.tree_util.keystr(path): sharding.spec
        for path, sharding in jax.tree_util.tree_flatten_with_path(shardings)[0]
    }
    query = "['encoder']['layers_0']['self_attn']['query']['kernel']"
    mirrored = [spec for path, spec in flat.items() if path.endswith(query)]
    assert len(mirrored) == 3 and set(mirrored) == {P(None, "model")}  # params, mu, nu
    assert flat[".step"] == P() and flat[".rng"] == P()
    with pytest.raises(MeshError, match="structure of the model's params"):
        tree_shardings(mesh, {"other": state.step}, param_partition_specs(model, {"model": 8}))


def test_config_must_fit_the_mesh():
    from types import SimpleNamespace

    mesh = SimpleNamespace(shape={"data": 2, "model": 8})  # check_config_fits reads .shape
    cfg = tiny_config().replace(num_heads=4)
    with pytest.raises(MeshError, match="num_heads \\(4\\)"):
        check_config_fits(cfg, mesh)
    with pytest.raises(MeshError, match="batch size \\(3\\)"):
        check_config_fits(tiny_config(), mesh, batch_size=3)
    check_config_fits(tiny_config(), mesh, batch_size=4)


if __name__ == "__main__":
    print(json.dumps(run_parity()))
