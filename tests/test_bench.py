"""bench.train_throughput: the FLOP count agrees with XLA's, and a --quick run works end to end."""

from __future__ import annotations

import json

import jax
import pytest

from bench import train_throughput as tt
from flax_transformer.nn.model import Transformer


def test_model_flops_match_xla_cost_analysis():
    """Our analytic matmul count of one forward is within 2% of XLA's own FLOP count (which
    adds the elementwise work: softmax, LayerNorm, activations)."""
    cfg = tt.reference_config(dropout=0.0).replace(num_encoder_layers=2, num_decoder_layers=1)
    batch = tt.make_batch(cfg, 2, 16, 12)
    model = Transformer(cfg)
    variables = model.init(jax.random.key(0), batch["src"], batch["tgt_in"])
    forward = jax.jit(lambda v: model.apply(v, batch["src"], batch["tgt_in"]))
    cost = forward.lower(variables).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    ours = tt.model_flops_per_step(cfg, 2, 16, 12) / 3
    assert ours <= cost["flops"] <= 1.02 * ours, (ours, cost["flops"])


def test_quick_benchmark_writes_the_report(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert tt.main(["--quick", "--json", str(out), "--steps", "2", "--rounds", "1"]) == 0
    result = json.loads(out.read_text())
    variants = ("flax", "flax_remat", "torch_eager", "nn_transformer_eager")
    for key in (f"{name}_tok_s" for name in variants):
        assert result[key] > 0, key
    assert result["torch_compile_tok_s"] is None and "skipped" in result["torch_compile_error"]
    assert result["peak_matmul_gflops"] > 0 and 0 < result["flax_mfu"] < 1
    assert result["model_flops_per_step"] == tt.model_flops_per_step(tt.quick_config(), 2, 8, 8)
    for name in ("flax", "torch_eager"):
        assert result["memory"][name]["step_peak_rss_mib"] > 0
        assert result["step_ms"][name]["n"] == 2
    # Every variant trains the same task: first losses near log(vocab).
    for losses in result["losses"].values():
        assert 2.0 < losses["first"] < 6.0
    assert "| flax |" in capsys.readouterr().out


@pytest.mark.parametrize("flag", ["--steps=0", "--dropout=1.5", "--warmup=0"])
def test_bad_flags_exit_with_a_message(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        tt.parse_args([flag])
    assert exit_info.value.code == 2
    assert "must" in capsys.readouterr().err
