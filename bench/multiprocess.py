"""One process or several: the same train.py run, timed side by side on this machine.

    python -m bench.multiprocess --json OUT.json [--rounds 2] [--steps 200] [-- TRAIN FLAGS]

Each round runs, one after the other (the order alternating between rounds), the same
train.py command as
- `one`: one process, one device (no mesh);
- `one_x2`: one process with two CPU devices, `--mesh data=2`;
- `two`: `python -m flax_transformer.launch --processes 2`, one device each, `--mesh data=2`;
and records each command's wall time, the training loop's time and target tokens/s (from
results.json), the load average before and after, and whether the three ended with the same
parameters (max abs difference). The default run is train.py's own with fewer steps and one
evaluation at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from flax_transformer.interop.convert import load_safetensors

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = [sys.executable, "-m", "flax_transformer.launch", "--processes", "2", "--"]
VARIANTS = {  # name -> (command prefix, extra train.py flags, JAX_NUM_CPU_DEVICES)
    "one": ([sys.executable], [], 1),
    "one_x2": ([sys.executable], ["--mesh", "data=2"], 2),
    "two": (LAUNCH, ["--mesh", "data=2"], 1),
}


def run_variant(name: str, workdir: Path, flags: list[str]) -> dict:
    prefix, extra, devices = VARIANTS[name]
    env = dict(os.environ, JAX_NUM_CPU_DEVICES=str(devices))
    cmd = [*prefix, "train.py", *flags, *extra, "--workdir", str(workdir)]
    load = os.getloadavg()
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    results = json.loads((workdir / "results.json").read_text())
    return {
        "variant": name,
        "wall_s": wall,
        "train_loop_s": results["train_time_s"],
        "tokens_per_sec": results["tokens_per_sec"],
        "valid_loss": results["valid_loss"],
        "loadavg_start": load,
        "loadavg_end": os.getloadavg(),
    }


def max_param_difference(a: Path, b: Path) -> float:
    first, _ = load_safetensors(a / "flax_params.safetensors")
    second, _ = load_safetensors(b / "flax_params.safetensors")
    return max(float(np.abs(first[k] - second[k]).max()) for k in first)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    train_flags = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m bench.multiprocess")
    parser.add_argument("--json", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args(argv)
    steps = str(args.steps)
    flags = ["--steps", steps, "--eval-every", steps, "--save-every", steps, *train_flags]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            order = list(VARIANTS) if round_index % 2 == 0 else list(VARIANTS)[::-1]
            for name in order:
                workdir = Path(tmp) / f"{name}_{round_index}"
                runs.append(run_variant(name, workdir, flags) | {"round": round_index})
                print(json.dumps(runs[-1]), flush=True)
        first = Path(tmp) / "one_0"
        agreement = {
            name: max_param_difference(first, Path(tmp) / f"{name}_0") for name in VARIANTS
        }
    summary = {
        name: {
            "median_wall_s": float(np.median([r["wall_s"] for r in runs if r["variant"] == name])),
            "median_train_loop_s": float(
                np.median([r["train_loop_s"] for r in runs if r["variant"] == name])
            ),
        }
        for name in VARIANTS
    }
    result = {
        "command": "python -m bench.multiprocess " + " ".join(sys.argv[1:]),
        "train_flags": flags,
        "cpu_count": os.cpu_count(),
        "runs": runs,
        "summary": summary,
        "max_abs_param_difference_vs_one": agreement,
    }
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
