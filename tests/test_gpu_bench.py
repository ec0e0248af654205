"""bench.gpu (bench/gpu.sh): refuses without a CUDA GPU; the GPU peak table; the one JSON
assembled from its parts (faked here, and for real on the CPU with --allow-cpu --tiny, slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu, gpu_parts

ROOT = Path(__file__).resolve().parents[1]
CPU_ONLY = {"jax_backend": "cpu", "jax_devices": ["TFRT_CPU_0"], "torch_cuda": False}
CPU_ONLY["device_name"] = None


def test_refuses_on_a_cpu_machine_with_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gpu, "find_gpu", lambda: (CPU_ONLY, "JAX's backend is 'cpu'"))
    out = tmp_path / "gpu.json"
    assert gpu.main(["--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bench.gpu: no CUDA GPU here (JAX's")
    assert not out.exists()


def test_find_gpu_says_why_here():
    seen, why = gpu.find_gpu()
    if seen["jax_backend"] == "gpu" and seen["torch_cuda"]:
        pytest.skip("a CUDA GPU is here")
    assert why and ("JAX's backend" in why or "torch.cuda" in why)


@pytest.mark.slow  # a fresh Python importing JAX and torch (~5 s)
def test_gpu_sh_refuses_on_this_cpu(tmp_path):
    if gpu.find_gpu()[1] is None:
        pytest.skip("a CUDA GPU is here")
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu.sh"), "--json", str(tmp_path / "g.json")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("bench.gpu: no CUDA GPU here")


@pytest.mark.parametrize(
    "name, tflops",
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA L4", 121.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA A10G", None),  # not the A10: no datasheet figure, no MFU rather than a wrong one
        ("Tesla T4", None),
    ],
)
def test_peak_table(name, tflops):
    assert gpu.peak_bf16_tflops(name) == tflops


def test_json_from_faked_parts(tmp_path, monkeypatch, capsys):
    """The JSON's layout and MFU arithmetic, with the measuring parts replaced by fakes."""
    h100 = {**CPU_ONLY, "jax_backend": "gpu", "torch_cuda": True}
    h100["device_name"] = "NVIDIA H100 80GB HBM3"
    monkeypatch.setattr(gpu, "find_gpu", lambda: (h100, None))
    monkeypatch.setattr(gpu_parts, "gemm_peak_tflops", lambda device, n: {"jax": 700.0})
    row = {"size": "reference", "model_flops_per_step": 989e9, "variants": {}}
    row["variants"] = {"flax_bf16": {"median_ms": 10.0}, "torch_sdpa_compile": {"error": "x"}}
    monkeypatch.setattr(gpu_parts, "train_rows", lambda args, device: [row])
    cell = {"batch": 1, "num_beams": 1, "flax_bf16_tok_s": 5.0, "torch_sdpa_eager_tok_s": 4.0}
    monkeypatch.setattr(gpu_parts, "decode_cells", lambda args, device: [cell])
    out = tmp_path / "gpu.json"
    assert gpu.main(["--json", str(out), "--skip-tests"]) == 0
    result = json.loads(out.read_text())
    assert result["command"] == f"bash bench/gpu.sh --json {out} --skip-tests"
    assert result["machine"]["device_name"] == "NVIDIA H100 80GB HBM3"
    assert result["peak_bf16_tflops"] == {"datasheet": 989.0, "measured_gemm": {"jax": 700.0}}
    assert result["tests"] == {"skipped": "--skip-tests"}
    flax = result["train"][0]["variants"]["flax_bf16"]
    assert flax["tflops"] == pytest.approx(98.9) and flax["mfu"] == pytest.approx(0.1)
    assert flax["mfu_vs_measured_gemm"] == pytest.approx(98.9 / 700, abs=1e-4)
    assert result["train"][0]["variants"]["torch_sdpa_compile"] == {"error": "x"}
    assert result["decode"] == [cell] and result["complete"] is True
    printed = capsys.readouterr().out
    assert "train reference: flax_bf16 10.0 ms (MFU 0.1), torch_sdpa_compile" in printed


@pytest.mark.slow  # compiles a tiny train step and a tiny generate (~1 min on 2 cores)
def test_allow_cpu_tiny_run_writes_the_json(tmp_path):
    out = tmp_path / "gpu.json"
    argv = ["--json", str(out), "--allow-cpu", "--tiny", "--skip-tests", "--skip-compile"]
    assert gpu.main([*argv, "--rounds", "1", "--steps", "1"]) == 0
    result = json.loads(out.read_text())
    assert result["machine"]["allow_cpu"] and result["peak_bf16_tflops"]["datasheet"] is None
    (row,) = result["train"]
    assert row["size"] == "tiny" and set(row["variants"]) == {"flax_bf16", "torch_sdpa_eager"}
    for variant in row["variants"].values():
        assert variant["median_ms"] > 0 and variant["mfu"] is None and variant["n"] == 1
        assert 2.0 < variant["first_loss"] < 6.0
    assert [(c["batch"], c["num_beams"]) for c in result["decode"]] == [(1, 1), (2, 2)]
    for cell in result["decode"]:
        assert cell["flax_bf16_tok_s"] > 0 and cell["torch_sdpa_eager_agreement"] == 1.0


@pytest.mark.slow  # a pytest subprocess (~10 s)
def test_tests_part_records_the_outcome_and_each_failure(tmp_path, monkeypatch):
    failing = tmp_path / "test_fails_here.py"
    failing.write_text("def test_one_is_two():\n    assert 1 == 2\n")
    monkeypatch.setattr(gpu, "GPU_TESTS", ("tests/test_release.py", str(failing)))
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    args = gpu.parse_args(["--json", str(tmp_path / "g.json"), "--test-workers", "0"])
    outcome = gpu.run_tests(args)
    assert outcome["returncode"] == 1 and "1 failed" in outcome["summary"], outcome
    assert " passed" in outcome["summary"] and outcome["seconds"] > 0
    (failure,) = outcome["failures"]
    assert failure.startswith("FAILED") and "test_one_is_two" in failure
    assert outcome["command"].endswith(str(failing)) and "-n 0" in outcome["command"]
    assert "assert 1 == 2" in failure  # the reason, not only the name
    log = Path(outcome["log"])
    assert log == tmp_path / "g_tests.log" and "def test_one_is_two" in log.read_text()


def test_sizes_option_picks_training_sizes(tmp_path):
    base = ["--json", str(tmp_path / "g.json")]
    assert gpu.parse_args(base).sizes == list(gpu_parts.TRAIN_SIZES)
    assert gpu.parse_args([*base, "--sizes", "small,paper_base"]).sizes == ["small", "paper_base"]
    assert gpu.parse_args([*base, "--tiny"]).sizes == ["tiny"]
    with pytest.raises(SystemExit):
        gpu.parse_args([*base, "--sizes", "small,huge"])


def test_a_run_cut_short_keeps_what_it_measured(tmp_path, monkeypatch):
    """The JSON is rewritten after each training size: a run stopped by a time limit (or a
    crash) in the next size still leaves the sizes measured, marked incomplete."""
    h100 = {**CPU_ONLY, "jax_backend": "gpu", "torch_cuda": True, "device_name": "NVIDIA H100"}
    monkeypatch.setattr(gpu, "find_gpu", lambda: (h100, None))
    monkeypatch.setattr(gpu_parts, "gemm_peak_tflops", lambda device, n: {"jax": 700.0})
    first = {"size": "small", "model_flops_per_step": 1e9, "variants": {}}

    def rows_then_crash(args, device):
        yield first
        raise RuntimeError("the machine went away")

    monkeypatch.setattr(gpu_parts, "train_rows", rows_then_crash)
    out = tmp_path / "gpu.json"
    with pytest.raises(RuntimeError):
        gpu.main(["--json", str(out), "--skip-tests"])
    result = json.loads(out.read_text())
    assert result["complete"] is False and result["train"] == [first]
    assert result["peak_bf16_tflops"]["measured_gemm"] == {"jax": 700.0}
