"""PyTorch's side of the malloc tunables (training/host_memory.py): the torch_reference eager
step of bench.train_throughput timed in two worker processes, one with glibc's default malloc
and one with the tunables, interleaved round by round (bench/NOTES.md, "Page faults").

    python bench/results/host_memory/ab_torch_malloc.py reference|len256|d512 ROUNDS STEPS

with the project's venv python, from the repository root. Prints the median step of each and
tuned / system (ratio of medians, then the median of the per-round ratios)."""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[3])
sys.path.insert(0, ROOT)

from flax_transformer.training.host_memory import TUNABLES  # noqa: E402

# The worker builds the size's torch step, warms up, then answers each line "N" with N step
# times as one JSON line.
WORKER = """
import json, sys, time
sys.path.insert(0, sys.argv[2])
import torch
from bench.setup import DROPOUT, make_batch
from bench.train_throughput import torch_reference_variant
from flax_transformer import TransformerConfig
from flax_transformer.spec.presets import PRESETS
torch.set_num_threads(2)
size = sys.argv[1]
if size == "d512":
    fields = {**PRESETS["paper_base"], "src_vocab_size": 1000, "tgt_vocab_size": 1000,
              "max_len": 128, "num_encoder_layers": 3, "num_decoder_layers": 3}
    dims = (32, 64, 64)
elif size == "len256":
    fields, dims = {**PRESETS["reference"], "max_len": 256}, (8, 256, 256)
else:
    fields, dims = dict(PRESETS["reference"]), (32, 64, 64)
cfg = TransformerConfig(**{**fields, "dropout_rate": DROPOUT})
variant = torch_reference_variant("torch_eager", cfg, make_batch(cfg, *dims), False)
for _ in range(2):
    variant.step()
print("ready", flush=True)
for line in sys.stdin:
    times = []
    for _ in range(int(line)):
        start = time.perf_counter()
        variant.step()
        times.append(time.perf_counter() - start)
    print(json.dumps(times), flush=True)
"""


def main() -> None:
    size, rounds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    system = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    tunables = ":".join(f"{k}={v}" for k, v in TUNABLES.items())
    envs = {"system": system, "tuned": {**system, "GLIBC_TUNABLES": tunables}}
    workers = {}
    for name, env in envs.items():
        workers[name] = subprocess.Popen(
            [sys.executable, "-c", WORKER, size, ROOT],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        workers[name].stdout.readline()  # ready
    times = {name: [] for name in workers}
    per_round = {name: [] for name in workers}
    for r in range(rounds):  # alternate which goes first
        for name in list(workers) if r % 2 == 0 else list(workers)[::-1]:
            workers[name].stdin.write(f"{steps}\n")
            workers[name].stdin.flush()
            got = json.loads(workers[name].stdout.readline())
            times[name] += got
            per_round[name].append(statistics.median(got))
    for worker in workers.values():
        worker.stdin.close()
        worker.wait()
    medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    ratios = [b / a for a, b in zip(per_round["system"], per_round["tuned"], strict=True)]
    print(
        f"torch eager, {size}: system {medians['system']:.0f} ms, tuned {medians['tuned']:.0f}"
        f" ms; tuned / system {medians['tuned'] / medians['system']:.3f}, per-round "
        f"{statistics.median(ratios):.3f}; load {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
