"""bench.profile_decode: decode-step thunks attributed to parts, the HLO read-back it uses, and
a run on the tiny model of --quick."""

from __future__ import annotations

import json
import tempfile

import pytest

from bench import profile_decode as pd
from bench import profile_step as ps

BODY = "jit(_run)/while/body"
LAYER = f"{BODY}/Transformer.decode/decoder/layers_3"


@pytest.mark.parametrize(
    ("op_name", "result", "part"),
    [
        (f"{BODY}/Transformer.decode/shared_embed.attend/dot_general", ("f32", 2), "output_proj"),
        (f"{BODY}/Transformer.decode/logits_bias/add", ("f32", 2), "output_proj"),
        (f"{LAYER}/self_attn/query/dot_general", ("f32", 2), "self_attn_proj"),
        (f"{LAYER}/self_attn/out/add", ("f32", 3), "self_attn_proj"),
        (
            f"{LAYER}/self_attn/self_attn._update_self_cache/dynamic_update_slice",
            ("f32", 4),
            "self_cache_write",
        ),
        (f"{LAYER}/self_attn/bhqk,bhkd->bqhd/dot_general", ("f32", 4), "self_attn_core"),
        (f"{LAYER}/self_attn/exp", ("f32", 4), "self_attn_core"),
        (f"{LAYER}/cross_attn/query/dot_general", ("f32", 2), "cross_attn_proj"),
        (f"{LAYER}/cross_attn/reduce_max", ("f32", 4), "cross_attn_core"),
        (f"{LAYER}/ffn/jit(silu)/mul", ("f32", 3), "ffn"),
        (f"{LAYER}/norm2/rsqrt", ("f32", 2), "layernorm"),
        (f"{BODY}/Transformer.decode/shared_embed/jit(_take)/gather", ("f32", 3), "embed"),
        (f"{BODY}/Transformer.decode/_positions_src/add", ("f32", 3), "embed"),
        (f"{BODY}/Transformer.decode/mul", ("f32", 3), "decoder_other"),
        (f"{BODY}/jit(take_along_axis)/gather", ("f32", 5), "cache_reorder"),
        (f"{BODY}/jit(take_along_axis)/gather", ("s32", 3), "beam_other"),  # sequences
        (f"{BODY}/beam_reorder/ffi_call", ("f32", 4), "cache_reorder"),  # in place (CPU)
        (f"{BODY}/jit(log_softmax)/reduce_max", ("f32", 1), "beam_log_softmax"),
        (f"{BODY}/top_k", ("", 0), "beam_top_k"),
        (f"{BODY}/jit(_where)/select_n", ("f32", 2), "beam_other"),
        ("jit(_run)/while/cond/not", ("pred", 0), "other"),
        ("", ("f32", 4), "other"),
    ],
)
def test_loop_op_names_map_to_step_parts(op_name, result, part):
    assert pd.step_part(op_name, *result) == part


@pytest.mark.parametrize(
    ("op_name", "part"),
    [
        ("jit(_run)/Transformer.encode/encoder/layers_0/ffn/linear1/dot_general", "encoder"),
        (
            "jit(_run)/Transformer.decode/decoder/layers_0/cross_attn/"
            "cross_attn._cross_keys_values/key/dot_general",
            "cross_kv",
        ),
        ("jit(_run)/Transformer.decode/decoder/layers_0/self_attn/query/add", "first_step"),
        ("jit(_run)/top_k", "first_step"),
        ("", "other"),
    ],
)
def test_work_outside_the_loop_maps_to_once_parts(op_name, part):
    assert pd.once_part(op_name) == part


HLO = """\
%body (p: f32[4,2,8,8]) -> (f32[4,2,1,8]) {
  %q = f32[4,2,1,8]{3,2,1,0} fusion(%p), kind=kLoop, metadata={op_name="b/self_attn/query/add"}
  %c = f32[4,2,8,8]{3,2,1,0} fusion(%p), kind=kLoop, metadata={op_name="b/self_attn/cache/dus"}
  %dot.1 = f32[4,2,1,8]{3,2,1,0} dot(%q, %c), lhs_batch_dims={0,1}
  %copy.2 = f32[4,2,1,8]{3,2,1,0} copy(%dot.1)
  %s = f32[4,2,1,8]{3,2,1,0} fusion(%copy.2), kind=kLoop, metadata={op_name="b/self_attn/exp"}
  ROOT %t = (f32[4,2,1,8]{3,2,1,0}) tuple(%s)
}

%fused (x: f32[8,16], w: f32[32,16]) -> f32[8] {
  %x = f32[8,16]{1,0} parameter(0)
  %w = f32[32,16]{1,0} parameter(1)
  %dot.3 = f32[8,32]{1,0} dot(%x, %w), metadata={op_name="b/shared_embed.attend/dot_general"}
  ROOT %m = f32[8]{0} reduce(%dot.3), metadata={op_name="b/jit(log_softmax)/reduce_max"}
}

ENTRY %main (a: f32[8,16]) -> f32[8] {
  %a = f32[8,16]{1,0} parameter(0)
  %ynn_fusion.4 = f32[8]{0} fusion(%a, %a), kind=kCustom, calls=%fused, metadata={op_name="b/m"}
  %while.5 = (f32[4,2,1,8]{3,2,1,0}) while(%a), condition=%cond, body=%body
}
"""


def test_hlo_names_inferred_for_instructions_without_metadata():
    names = ps.hlo_op_names(HLO, infer=True)
    assert names["copy.2"] == "b/self_attn/exp"  # its user's
    assert names["dot.1"] == "b/self_attn/exp"  # its user's, once copy.2 has one
    assert names["ynn_fusion.4"] == "b/shared_embed.attend/dot_general"  # its product's
    plain = ps.hlo_op_names(HLO)  # infer=False: the metadata as it is
    assert "dot.1" not in plain and plain["ynn_fusion.4"] == "b/m"
    # No user with a name: the operands' common prefix.
    unused = "\n".join(line for line in HLO.splitlines() if "copy" not in line)
    assert ps.hlo_op_names(unused, infer=True)["dot.1"] == "b/self_attn"


def test_hlo_instructions_know_types_and_loops():
    instructions = pd.hlo_instructions(HLO)
    assert instructions["c"] == ("f32", 4, "body") and instructions["dot.1"] == ("f32", 4, "body")
    assert instructions["t"] == ("tuple", 0, "body")
    assert instructions["ynn_fusion.4"] == ("f32", 1, "")
    assert instructions["while.5"] == ("tuple", 0, "")


def test_attribute_divides_the_loop_by_its_steps():
    names = {"a": f"{LAYER}/ffn/x", "e": "jit(_run)/Transformer.encode/y"}
    instructions = {"while.1": ("tuple", 0, ""), "a": ("f32", 2, "body"), "e": ("f32", 3, "")}
    ms = 1_000_000
    # Two steps of thunk a (3 ms each) in a loop of 10 ms (its while thunk returns after 2 ms:
    # the body runs asynchronously), the encoder (2 ms) before it; `python` is no thunk.
    events = [
        ("e", 0, 2 * ms), ("while.1", 3 * ms, 2 * ms), ("a", 4 * ms, 3 * ms),
        ("a", 10 * ms, 3 * ms), ("python", 0, 20 * ms),
    ]  # fmt: skip
    result = pd.attribute(events, [(0, 14 * ms), (4 * ms, 3 * ms)], names, instructions, calls=1)
    assert result["steps"] == 2 and result["step_ms"] == pytest.approx(5.0)
    assert result["per_step_ms"]["ffn"] == pytest.approx(3.0)
    assert result["gaps_ms"] == pytest.approx(2.0) and result["overlap_ms"] == pytest.approx(0.0)
    once = result["once_per_call_ms"]
    assert once["encoder"] == pytest.approx(2.0) and once["gaps"] == pytest.approx(2.0)
    assert result["execution_ms"] == pytest.approx(14.0)


def test_the_steps_of_every_loop_run_are_counted():
    """The search runs one loop per cache length: two steps in the first loop (thunk a) and
    three in the second (its own instruction b) are five steps, not the longer loop's three."""
    names = {"a": f"{LAYER}/ffn/x", "b": f"{LAYER}/ffn/x"}
    instructions = {"while.1": ("tuple", 0, ""), "while.2": ("tuple", 0, "")}
    instructions |= {"a": ("f32", 2, "body"), "b": ("f32", 2, "body")}
    ms = 1_000_000
    events = [("while.1", 0, ms), ("a", ms, ms), ("a", 2 * ms, ms), ("while.2", 4 * ms, ms)]
    events += [("b", 5 * ms, ms), ("b", 6 * ms, ms), ("b", 7 * ms, ms)]
    result = pd.attribute(events, [(0, 9 * ms)], names, instructions, calls=1)
    assert result["steps"] == 5 and result["per_step_ms"]["ffn"] == pytest.approx(1.0)


def test_a_thunk_reported_twice_a_step_does_not_double_the_steps():
    """XLA:CPU's sort thunk leaves two trace events per execution: two steps of thunks a, b
    and a sort (four events) are two steps."""
    names = {n: f"{LAYER}/ffn/x" for n in ("a", "b", "sort.1")}
    instructions = {"while.1": ("tuple", 0, "")}
    instructions |= {n: ("f32", 2, "body") for n in ("a", "b", "sort.1")}
    ms = 1_000_000
    events = [("while.1", 0, ms)]
    for step in range(2):
        at = (1 + 4 * step) * ms
        events += [("a", at, ms), ("b", at + ms, ms), ("sort.1", at + 2 * ms, ms // 2)]
        events += [("sort.1", at + 2 * ms + ms // 2, ms // 2)]
    result = pd.attribute(events, [(0, 10 * ms)], names, instructions, calls=1)
    assert result["steps"] == 2


def test_a_traced_loop_is_read_back_and_attributed():
    """The whole path on a real trace, without the Marian model: a jitted while loop whose
    body is named like the decoder's feed-forward layer."""
    import jax
    import jax.numpy as jnp

    weight = jnp.full((128, 128), 1 / 128)

    @jax.jit
    def run(x, n):
        def body(carry):
            with jax.named_scope("Transformer.decode"), jax.named_scope("ffn"):
                return carry[0] + 1, jnp.tanh(carry[1] @ weight)

        with jax.named_scope("Transformer.encode"):
            x = jnp.sin(x @ weight)
        return jax.lax.while_loop(lambda carry: carry[0] < n, body, (0, x))[1]

    x = jnp.ones((8, 128))
    hlo = run.lower(x, 5).compile().as_text()
    run(x, 5).block_until_ready()
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            run(x, 5).block_until_ready()
        events, executions = ps.read_trace(trace_dir, span_prefix="ThunkExecutor::Execute")
    result = pd.attribute(
        events, executions, ps.hlo_op_names(hlo, infer=True), pd.hlo_instructions(hlo), calls=1
    )
    assert result["steps"] == 5
    assert result["per_step_ms"]["ffn"] > 0 and result["once_per_call_ms"]["encoder"] > 0
    assert result["step_ms"] > 0 and result["gaps_ms"] >= 0


@pytest.mark.slow  # transformers builds the tiny Marian, the search compiles: 10-40 s here
def test_quick_run_covers_the_step(tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert (
        pd.main(["--quick", "--batch", "2", "--beams", "2", "--calls", "1", "--json", str(out)])
        == 0
    )
    result = json.loads(out.read_text())
    assert result["steps"] == 3  # 4 new tokens: the first is chosen before the loop
    parts = result["per_step_ms"]
    for part in ("output_proj", "self_attn_proj", "self_attn_core", "cross_attn_core", "ffn",
                 "layernorm", "cache_reorder", "beam_log_softmax", "beam_top_k"):  # fmt: skip
        assert parts[part] > 0, part
    assert result["once_per_call_ms"]["encoder"] > 0
    assert "| cache_reorder |" in capsys.readouterr().out
