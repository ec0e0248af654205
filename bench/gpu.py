"""One command for a CUDA GPU: the GPU-relevant tests, then training and decoding in bfloat16,
Flax against PyTorch (SDPA attention, eager and torch.compile), into one JSON.

    bash bench/gpu.sh --json OUT.json [--skip-tests] [--rounds 3] [--steps 5]
    python -m bench.gpu --json OUT.json ...          (the same)

On a machine without a CUDA GPU (JAX's backend not "gpu", or torch.cuda not available) it
refuses with one line on stderr and exit status 2. `--allow-cpu --tiny` runs the same code on
the CPU with a tiny model; it exists for the test of this plumbing and measures nothing useful.

Parts (bench/gpu_parts.py has the measuring code):
- tests: `pytest -m "not slow" -n WORKERS` on GPU_TESTS (attention paths, mixed precision,
  decoding, Hugging Face generation; the workers share the GPU, JAX allocating on demand),
  its exit status, summary line and failures recorded, time-boxed by --tests-timeout;
- peak: a bf16 GEMM timed in JAX and in torch on the device, and the datasheet's dense bf16
  tensor peak of the GPU (PEAK_BF16_TFLOPS, matched on torch's device name);
- train: per size, the project's jitted train step with dtype=bfloat16 (float32 params) against
  torch_reference.Transformer with attention_impl="fused" (F.scaled_dot_product_attention)
  under torch.autocast(bfloat16), eager and torch.compile (time-boxed; a failure is recorded);
  same AdamW, clipping, label smoothing and batch as bench.train_throughput; rounds
  interleaved; median step; MFU = model FLOPs per step / step time / datasheet peak (and / the
  measured GEMM peak);
- decode: bench.hf_generate's random opus-mt-size Marian and four cells (batch 1 and 8 x
  greedy and beam 4, 32 source tokens, 64 new tokens, EOS suppressed), `hf.load(dir,
  dtype="bfloat16")` against transformers' `generate` in bfloat16 with attn_implementation
  "sdpa", eager and with a static cache (which transformers compiles with torch.compile),
  interleaved; tokens compared with transformers' (bf16 on both sides: agreement, not identity).

The JSON is written again after each part and each training size, so a run cut short by a
time limit still leaves what it measured (`"complete": false` until the end).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's datasheets, TFLOP/s. Matched in
# order against torch.cuda.get_device_name() (e.g. "NVIDIA H100 80GB HBM3" is the SXM part).
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    (r"\bH100 PCIe\b", 756.0),
    (r"\bH100 NVL\b", 835.0),
    (r"\bH200 NVL\b", 835.0),
    (r"\bGH200\b", 989.0),
    (r"\bH200\b", 989.0),
    (r"\bH100\b", 989.0),
    (r"\bA100\b", 312.0),
    (r"\bL40S\b", 362.0),
    (r"\bL40\b", 181.0),
    (r"\bL4\b", 121.0),
    (r"\bA10\b", 125.0),
    (r"\bRTX 4090\b", 165.0),
)

GPU_TESTS = (
    "tests/test_bench_attention_paths.py",
    "tests/test_mixed_precision.py",
    "tests/test_layers.py",
    "tests/test_decode_cache.py",
    "tests/test_decode_engine.py",
    "tests/test_hf_generate.py",
    "tests/test_training.py",
)

NO_GPU = "bench.gpu: no CUDA GPU here ({why}); this benchmark runs on a CUDA machine only"


def peak_bf16_tflops(device_name: str) -> float | None:
    """The datasheet's dense bf16 peak of a GPU named like torch's device name, or None."""
    for pattern, tflops in PEAK_BF16_TFLOPS:
        if re.search(pattern, device_name):
            return tflops
    return None


def find_gpu() -> tuple[dict, str | None]:
    """(what JAX and torch see, None) on a CUDA machine, else (that, why not)."""
    import jax
    import torch

    seen = {
        "jax_backend": jax.default_backend(),
        "jax_devices": [str(d) for d in jax.devices()],
        "torch_cuda": torch.cuda.is_available(),
        "device_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    problems = []
    if seen["jax_backend"] != "gpu":
        problems.append(f"JAX's backend is {seen['jax_backend']!r}")
    if not seen["torch_cuda"]:
        problems.append("torch.cuda.is_available() is False")
    return seen, "; ".join(problems) or None


def tests_log_path(json_path: Path) -> Path:
    """The tests' whole pytest output, beside the JSON (gpu.json -> gpu_tests.log)."""
    return json_path.with_name(json_path.stem + "_tests.log")


def run_tests(args) -> dict:
    """GPU_TESTS in a pytest subprocess: outcome, one line per failure, the log's path."""
    if args.skip_tests:
        return {"skipped": "--skip-tests"}
    command = [sys.executable, "-m", "pytest", "-m", "not slow", "-q", "-rfE"]
    command += ["-n", str(args.test_workers), "-p", "no:cacheprovider", *GPU_TESTS]
    log = tests_log_path(args.json)
    log.parent.mkdir(parents=True, exist_ok=True)
    outcome = {"command": " ".join(command[1:]), "log": str(log)}
    env = {**os.environ, "COLUMNS": "300"}  # -rfE's lines keep the reason (cut to the width)
    start = time.perf_counter()
    with log.open("w") as out:  # written as it runs: a time limit still leaves the log
        try:
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, text=True,
                                  env=env, timeout=args.tests_timeout)  # fmt: skip
            outcome["returncode"] = done.returncode
        except subprocess.TimeoutExpired:
            outcome["returncode"] = None
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    if outcome["returncode"] is None:
        summary = f"timed out after {args.tests_timeout} s"
    else:
        summary = lines[-1] if lines else "(pytest printed nothing)"
    return outcome | {
        "summary": summary,
        # -rfE: one "FAILED tests/...::name - reason" line per failure or error
        "failures": [line[:300] for line in lines if line.startswith(("FAILED", "ERROR"))],
        "seconds": round(time.perf_counter() - start, 1),
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", required=True, type=Path, help="where to write the results")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    parser.add_argument("--steps", type=int, default=5, help="train steps per variant per round")
    parser.add_argument("--skip-tests", action="store_true", help="leave the tests out")
    parser.add_argument("--test-workers", type=int, default=4, help="pytest-xdist workers")
    parser.add_argument("--tests-timeout", type=int, default=1800, help="seconds for the tests")
    parser.add_argument("--sizes", default=None, help="comma-separated training sizes (all)")
    parser.add_argument("--skip-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument(
        "--compile-timeout", type=int, default=600, help="seconds allowed per torch.compile"
    )
    parser.add_argument("--parts", default="train,decode", help="comma-separated: train,decode")
    parser.add_argument("--allow-cpu", action="store_true", help="for the plumbing test only")
    parser.add_argument("--tiny", action="store_true", help="tiny models (plumbing test)")
    args = parser.parse_args(argv)
    for name in ("rounds", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    args.parts = [part for part in args.parts.split(",") if part]
    from bench.gpu_parts import TINY_SIZES, TRAIN_SIZES

    known = TINY_SIZES if args.tiny else TRAIN_SIZES
    args.sizes = list(known) if args.sizes is None else args.sizes.split(",")
    if not args.sizes or set(args.sizes) - set(known):
        parser.error(f"--sizes: from {','.join(known)}, got {','.join(args.sizes)}")
    if set(args.parts) - {"train", "decode"}:
        parser.error(f"--parts: train and/or decode, got {','.join(args.parts)}")
    return args


def assemble(args, argv, seen, parts: dict, tests: dict, peak: dict, complete: bool) -> dict:
    """The one JSON: machine, peaks, tests and each part's rows, MFU filled in."""
    import jax
    import torch

    datasheet = peak_bf16_tflops(seen["device_name"] or "")
    measured = max(peak.values()) if peak else None
    for row in parts.get("train", []):
        for variant in row["variants"].values():
            if "median_ms" not in variant:  # it failed: its error is recorded
                continue
            tflops = row["model_flops_per_step"] / (variant["median_ms"] / 1e3) / 1e12
            variant["tflops"] = round(tflops, 3)
            variant["mfu"] = round(tflops / datasheet, 4) if datasheet else None
            variant["mfu_vs_measured_gemm"] = round(tflops / measured, 4) if measured else None
    return {
        "command": " ".join(["bash", "bench/gpu.sh", *argv]),
        "complete": complete,
        "machine": {
            **seen,
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "jax": jax.__version__,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "allow_cpu": args.allow_cpu,
            "tiny": args.tiny,
        },
        "peak_bf16_tflops": {"datasheet": datasheet, "measured_gemm": peak},
        "tests": tests,
        **parts,
    }


def format_summary(result: dict) -> str:
    lines = [f"device: {result['machine']['device_name'] or result['machine']['jax_devices']}"]
    lines.append(f"tests: {result['tests'].get('summary', result['tests'].get('skipped'))}")
    for row in result.get("train", []):
        cells = ", ".join(
            f"{name} {v['median_ms']:.1f} ms (MFU {v['mfu']})" if "median_ms" in v else name
            for name, v in row["variants"].items()
        )
        lines.append(f"train {row['size']}: {cells}")
    for cell in result.get("decode", []):
        rates = ", ".join(f"{k[:-6]} {v:.0f}" for k, v in cell.items() if k.endswith("_tok_s"))
        lines.append(f"decode batch {cell['batch']} beams {cell['num_beams']}: {rates} tok/s")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    # JAX and torch share the GPU in one process: JAX must not take 75% of its memory up front
    # (read when JAX's backend starts, so before find_gpu; the tests' subprocess inherits it).
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    seen, why_not = find_gpu()
    if why_not and not args.allow_cpu:
        print(NO_GPU.format(why=why_not), file=sys.stderr)
        return 2
    from bench import gpu_parts

    device = "cpu" if why_not else "cuda"
    tests, peak, parts = {}, {}, {}

    def save(note: str, complete: bool = False) -> dict:
        """Write the JSON as it stands (a cut-short run keeps what it measured)."""
        result = assemble(args, argv, seen, parts, tests, peak, complete)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"bench.gpu: {note}", flush=True)
        return result

    tests.update(run_tests(args))
    save(f"tests: {tests.get('summary', tests.get('skipped'))}")
    peak.update(gpu_parts.gemm_peak_tflops(device, 256 if args.tiny else 8192))
    save(f"bf16 GEMM peak (TFLOP/s): {peak}")
    if "train" in args.parts:
        parts["train"] = []
        for row in gpu_parts.train_rows(args, device):
            parts["train"].append(row)
            save(f"train {row['size']} done")
    if "decode" in args.parts:
        parts["decode"] = gpu_parts.decode_cells(args, device)
    print(format_summary(save("done", complete=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
