"""bench.train_throughput: the FLOP count agrees with XLA's, size flags reach the config, and a
--quick run works end to end; bench.ab_step times two trees in turn."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import pytest

from bench import ab_step, setup
from bench import train_throughput as tt
from flax_transformer.nn.model import Transformer
from flax_transformer.spec.presets import preset


@pytest.mark.slow  # 9 s: compiles the reference model for its cost analysis
def test_model_flops_match_xla_cost_analysis():
    """Our analytic matmul count of one forward is within 2% of XLA's own FLOP count (which
    adds the elementwise work: softmax, LayerNorm, activations)."""
    cfg = setup.bench_config(dropout=0.0, num_encoder_layers=2, num_decoder_layers=1)
    batch = setup.make_batch(cfg, 2, 16, 12)
    model = Transformer(cfg)
    variables = model.init(jax.random.key(0), batch["src"], batch["tgt_in"])
    forward = jax.jit(lambda v: model.apply(v, batch["src"], batch["tgt_in"]))
    cost = forward.lower(variables).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    ours = setup.model_flops_per_step(cfg, 2, 16, 12) / 3
    assert ours <= cost["flops"] <= 1.02 * ours, (ours, cost["flops"])


# Every size flag set, none to its tiny-preset value, so a flag that does not reach the
# config shows up as a mismatch.
SIZE_ARGS = ["--d-model", "48", "--heads", "2", "--layers", "2", "--d-ff", "40"]
SIZE_ARGS += ["--vocab", "30", "--max-len", "12", "--batch", "3", "--src-len", "10"]
SIZE_ARGS += ["--tgt-len", "12"]
SIZE_FIELDS = {
    "d_model": 48,
    "num_heads": 2,
    "num_encoder_layers": 2,
    "num_decoder_layers": 2,
    "d_ff": 40,
    "src_vocab_size": 30,
    "tgt_vocab_size": 30,
    "max_len": 12,
    "dropout_rate": 0.1,
}


@pytest.mark.slow  # ~30 s on 2 cores
def test_quick_benchmark_with_explicit_sizes_writes_the_report(tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["--quick", "--json", str(out), "--steps", "2", "--rounds", "1", *SIZE_ARGS]
    assert tt.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["preset"] == "tiny"
    assert {k: result["config"][k] for k in SIZE_FIELDS} == SIZE_FIELDS
    assert result["batch"] == {"batch": 3, "src_len": 10, "tgt_len": 12}
    assert result["tokens_per_step"] == 3 * (10 + 12)
    cfg = preset("tiny", **SIZE_FIELDS)
    assert result["model_flops_per_step"] == setup.model_flops_per_step(cfg, 3, 10, 12)
    variants = ("flax", "flax_remat", "torch_eager", "nn_transformer_eager")
    for key in (f"{name}_tok_s" for name in variants):
        assert result[key] > 0, key
    assert result["torch_compile_tok_s"] is None and "skipped" in result["torch_compile_error"]
    assert result["peak_matmul_gflops"] > 0 and 0 < result["flax_mfu"] < 1
    for name in ("flax", "torch_eager"):
        assert result["memory"][name]["step_peak_rss_mib"] > 0
        assert result["step_ms"][name]["n"] == 2
    # Every variant trains the same task: first losses near log(vocab) = 3.4.
    for losses in result["losses"].values():
        assert 2.0 < losses["first"] < 6.0
    printed = capsys.readouterr().out
    assert "| flax |" in printed
    # The CPU is named beside the numbers (model name and vector extensions).
    cpu = result["machine"]["cpu"]
    assert cpu["model_name"] and f"CPU: {cpu['model_name']}" in printed
    assert set(cpu["extensions"]) | set(cpu["lacks"]) >= {"avx2", "avx512f"}


def test_defaults_are_the_reference_run_and_the_quick_run():
    args = tt.parse_args([])
    assert args.config == preset("reference", dropout_rate=0.1)
    assert (args.batch, args.src_len, args.tgt_len) == (32, 64, 64)
    args = tt.parse_args(["--quick"])
    assert args.config == preset("tiny", dropout_rate=0.1)
    assert (args.batch, args.src_len, args.tgt_len) == (2, 8, 8)


def test_a_preset_with_overrides():
    args = tt.parse_args(["--preset", "small", "--num-layers", "3", "--max-len", "256"])
    assert args.config == preset(
        "small", dropout_rate=0.1, num_encoder_layers=3, num_decoder_layers=3, max_len=256
    )
    args = tt.parse_args(["--max-len", "256", "--src-len", "256", "--tgt-len", "200"])
    assert (args.config.max_len, args.src_len, args.tgt_len) == (256, 256, 200)


def test_variants_pick_what_is_timed(tmp_path):
    assert tt.parse_args([]).variants == list(tt.VARIANTS)
    assert tt.parse_args(["--variants", "flax,torch_eager"]).variants == ["flax", "torch_eager"]
    out = tmp_path / "bench.json"
    argv = ["--quick", "--variants", "torch_eager", "--steps", "1", "--rounds", "1"]
    assert tt.main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["variants"] == list(result["step_ms"]) == ["torch_eager"]
    assert result["torch_compile_error"] == "skipped (not in --variants)"
    assert "flax_tok_s" not in result and "flax_mfu" not in result


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--variants", "flax,jax"], "--variants: unknown jax"),
        (["--src-len", "129"], "--src-len 129 exceeds max_len 128"),
        (["--quick", "--tgt-len", "17"], "--tgt-len 17 exceeds max_len 16"),
        (["--max-len", "32"], "--src-len 64 exceeds max_len 32"),
        (["--heads", "3"], "must be divisible by num_heads"),
        (["--steps=0"], "--steps must be positive"),
        (["--d-model=0"], "--d-model must be positive"),
        (["--dropout=1.5"], "--dropout must be in [0, 1)"),
        (["--warmup=0"], "--warmup must be at least 1"),
        (["--preset", "huge"], "invalid choice: 'huge'"),
    ],
)
def test_bad_flags_exit_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        tt.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_make_batch_refuses_sequences_longer_than_max_len():
    with pytest.raises(ValueError, match="exceeds the config's max_len 16"):
        setup.make_batch(setup.bench_config("tiny"), 2, 17, 8)


def copy_tree(root: Path, dest: Path, label_smoothing: str | None = None) -> Path:
    """The packages bench.ab_step's worker imports, copied; optionally another label smoothing
    (a different compiled program)."""
    for package in ("bench", "flax_transformer"):
        shutil.copytree(root / package, dest / package, ignore=shutil.ignore_patterns("__py*"))
    if label_smoothing is not None:
        setup_py = dest / "bench" / "setup.py"
        old, new = "LABEL_SMOOTHING = 0.1\n", f"LABEL_SMOOTHING = {label_smoothing}\n"
        assert old in setup_py.read_text()
        setup_py.write_text(setup_py.read_text().replace(old, new))
    return dest


@pytest.mark.slow
@pytest.mark.parametrize("changed", [False, True])
def test_ab_step_times_two_trees_in_turn(changed, tmp_path):
    """bench.ab_step on this tree and a copy (changed: with label smoothing 0.2): each worker
    imports the tree it was given, both train the same config, every round times both, and
    the compiled programs are found equal exactly when the code is the same."""
    root = Path(__file__).resolve().parents[1]
    other = copy_tree(root, tmp_path / "copy", "0.2" if changed else None)
    out = tmp_path / "ab.json"
    argv = ["--tree", f"a={root}", "--tree", f"b={other}", "--preset", "tiny", "--batch", "2"]
    argv += ["--src-len", "8", "--tgt-len", "8", "--rounds", "2", "--steps", "1"]
    assert ab_step.main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    for name, tree in (("a", root), ("b", other)):
        assert result["flax_transformer"][name] == str(tree / "flax_transformer" / "__init__.py")
        assert result["config"][name] == preset("tiny", dropout_rate=0.1).to_dict()
        assert result["step_ms"][name]["n"] == 2 and len(result["round_median_ms"][name]) == 2
    assert result["same_compiled_program"] is not changed
    assert len(result["loadavg_start"]) == len(result["loadavg_end"]) == 3
    assert result["b_over_a_median_ratio"] > 0
    low, high = result["b_over_a_round_ratio_range"]
    assert 0 < low <= result["b_over_a_round_ratio_median"] <= high


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tree", "a=."], "give exactly two --tree NAME=DIR"),
        (["--tree", "a=.", "--tree", "a=."], "the two trees need different names"),
        (["--tree", "a=.", "--tree", "b=/nonexistent"], "no bench/flax_step.py there"),
        (["--tree", "a=.", "--tree", "b=.", "--src-len", "129"], "exceeds the config's max_len"),
        (
            ["--tree", "a=.", "--tree", "b=.", "--max-len", "256", "--src-len", "257"],
            "exceeds the config's max_len",
        ),
        (
            ["--tree", "a=.", "--tree", "b=.", "--system-malloc", "c"],
            "--system-malloc c: not a --tree name",
        ),
    ],
)
def test_ab_step_bad_flags_exit_with_a_message(argv, message, capsys, monkeypatch):
    monkeypatch.setenv("FLAX_TRANSFORMER_MALLOC_REEXECUTED", "1")
    with pytest.raises(SystemExit) as exit_info:
        ab_step.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_ab_step_system_malloc_needs_a_tuned_driver(monkeypatch, capsys):
    """Without the tunables in the driver both workers would run glibc's defaults."""
    monkeypatch.delenv("FLAX_TRANSFORMER_MALLOC_REEXECUTED", raising=False)
    with pytest.raises(SystemExit):
        ab_step.main(["--tree", "a=.", "--tree", "b=.", "--system-malloc", "a"])
    assert "runs with glibc's defaults itself" in capsys.readouterr().err


def test_ab_step_system_malloc_worker_runs_without_the_tunables(monkeypatch, tmp_path):
    """--system-malloc NAME: that worker gets no GLIBC_TUNABLES; the other inherits them."""
    tunables = []
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=1")
    fake_popen = lambda cmd, env, **kwargs: tunables.append(env.get("GLIBC_TUNABLES"))  # noqa: E731
    monkeypatch.setattr(ab_step.subprocess, "Popen", fake_popen)
    ab_step.start_worker(tmp_path, tmp_path / "config.json", tmp_path / "batch.npz", True)
    ab_step.start_worker(tmp_path, tmp_path / "config.json", tmp_path / "batch.npz")
    assert tunables == [None, "glibc.malloc.arena_max=1"]


def test_ab_step_xla_flags_reach_only_that_worker(monkeypatch, tmp_path):
    """--xla-flags NAME=FLAGS: that worker's XLA_FLAGS are the driver's plus FLAGS."""
    flags = []
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_base=1")
    fake_popen = lambda cmd, env, **kwargs: flags.append(env.get("XLA_FLAGS"))  # noqa: E731
    monkeypatch.setattr(ab_step.subprocess, "Popen", fake_popen)
    paths = (tmp_path, tmp_path / "config.json", tmp_path / "batch.npz")
    ab_step.start_worker(*paths, xla_flags="--xla_cpu_use_onednn=true")
    ab_step.start_worker(*paths)
    assert flags == ["--xla_cpu_base=1 --xla_cpu_use_onednn=true", "--xla_cpu_base=1"]


@pytest.mark.parametrize(
    ("flag", "message"),
    [("c=--xla_cpu_x=1", "--xla-flags c: not a --tree name"), ("a", "takes NAME=FLAGS")],
)
def test_ab_step_xla_flags_refuse_a_bad_name(flag, message, capsys, monkeypatch):
    monkeypatch.setenv("FLAX_TRANSFORMER_MALLOC_REEXECUTED", "1")
    with pytest.raises(SystemExit):
        ab_step.main(["--tree", "a=.", "--tree", "b=.", "--xla-flags", flag])
    assert message in capsys.readouterr().err
