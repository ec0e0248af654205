"""A/B of the Flax train step of two source trees, interleaved step by step on one machine.

    python -m bench.ab_step --tree A=/path/to/old/checkout --tree B=. --json OUT.json
        [--rounds 10] [--steps 3] [--preset reference] [--batch 32 --src-len 64 --tgt-len 64]
        [--max-len 256] [--layers 3 --vocab 1000]
    python -m bench.ab_step --tree system=. --tree tuned=. --system-malloc system
    python -m bench.ab_step --tree default=. --tree flag=. --xla-flags flag=--xla_cpu_...=true

One worker process per tree (its directory first on sys.path, so `flax_transformer` and
`bench.flax_step` are that tree's) compiles the tree's own benchmark step
(`bench.flax_step.build_flax_step`, present in both trees) on the same config and the same
batch, then waits. The driver asks the workers in turn for `--steps` timed steps, alternating
which goes first each round, so a neighbour's load that comes and goes between rounds lands on
both alike: on a shared machine this compares two versions far more tightly than two separate
`bench.train_throughput` runs. Reports each tree's median step, the ratio of medians and the
median of the per-round ratios (B / A: below 1 = B faster). The driver re-executes itself with
training/host_memory.py's malloc tunables, as train.py does, and the workers inherit them;
`--system-malloc NAME` runs that tree's worker with glibc's defaults instead (the second
command: one tree, with and without the tunables).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.setup import DROPOUT, REFERENCE_BATCH, bench_config, make_batch
from flax_transformer.spec.presets import PRESETS
from flax_transformer.training import host_memory

# Runs inside the worker, in the tree under test: reads the config and batch, compiles, then
# answers each line "N" on stdin with the N step times (seconds) as one JSON line.
WORKER = r"""
import hashlib, json, re, sys, time
import numpy as np
import flax_transformer
from flax_transformer import TransformerConfig
from bench.flax_step import build_flax_step, step_loss
config_path, batch_path = sys.argv[1:3]
cfg = TransformerConfig(**json.loads(open(config_path).read()))
batch = dict(np.load(batch_path))
state, jitted, batch_device = build_flax_step(cfg, batch)
step = jitted.lower(state, batch_device).compile()
# The optimised program without its debug information (source files, op names) and with its
# instructions renamed in order of appearance (names come from Python function names, which
# differ between trees): equal hashes = the two trees run the same program.
hlo = re.sub(r", metadata=\{[^}]*\}", "", step.as_text())
tables = r"^(FileNames|FunctionNames|FileLocations|StackFrames)$|^\d+ "
hlo = "\n".join(line for line in hlo.splitlines() if not re.match(tables, line))
names = {}
hlo = re.sub(r"%[\w.\-]+", lambda m: names.setdefault(m.group(0), f"%v{len(names)}"), hlo)
for _ in range(2):  # warm-up
    state, metrics = step(state, batch_device)
    step_loss(metrics)
print(json.dumps({
    "package": flax_transformer.__file__,
    "config": cfg.to_dict(),
    "hlo_sha256": hashlib.sha256(hlo.encode()).hexdigest(),
}), flush=True)
for line in sys.stdin:
    times = []
    for _ in range(int(line)):
        start = time.perf_counter()
        state, metrics = step(state, batch_device)
        step_loss(metrics)  # waits for the step
        times.append(time.perf_counter() - start)
    print(json.dumps(times), flush=True)
"""


def start_worker(
    tree: Path,
    config_path: Path,
    batch_path: Path,
    system_malloc: bool = False,
    xla_flags: str | None = None,
) -> subprocess.Popen:
    """system_malloc: the worker runs with glibc's default malloc (no GLIBC_TUNABLES), not the
    tuned one this driver re-executed itself with (training/host_memory.py). xla_flags: added
    to the worker's XLA_FLAGS (after the driver's own)."""
    code = f"import sys; sys.path.insert(0, {str(tree)!r})\n{WORKER}"
    env = dict(os.environ)
    if system_malloc:
        env.pop("GLIBC_TUNABLES", None)
    if xla_flags:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {xla_flags}".strip()
    return subprocess.Popen(
        [sys.executable, "-c", code, str(config_path), str(batch_path)],
        cwd=tree,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def read_reply(name: str, worker: subprocess.Popen):
    line = worker.stdout.readline()
    if not line:
        raise RuntimeError(f"worker {name} exited with code {worker.wait()}")
    return json.loads(line)


def run(
    trees: dict[str, Path],
    fields: dict,
    batch: dict,
    rounds: int,
    steps: int,
    system_malloc: frozenset[str] = frozenset(),
    xla_flags: dict[str, str] | None = None,
) -> dict:
    """`fields`: the TransformerConfig fields to set; every tree must know them (later trees
    may have added fields: those keep their defaults). `system_malloc`: names of the trees
    whose worker runs with glibc's default malloc. `xla_flags`: tree name -> XLA_FLAGS added
    to that tree's worker."""
    xla_flags = xla_flags or {}
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        config_path, batch_path = Path(tmp, "config.json"), Path(tmp, "batch.npz")
        config_path.write_text(json.dumps(fields))
        np.savez(batch_path, **batch)
        workers, ready = {}, {}
        try:
            for name, tree in trees.items():  # one compiles while the other waits
                workers[name] = start_worker(
                    tree,
                    config_path,
                    batch_path,
                    system_malloc=name in system_malloc,
                    xla_flags=xla_flags.get(name),
                )
                ready[name] = read_reply(name, workers[name])
            times = {name: [] for name in workers}
            per_round = {name: [] for name in workers}
            names = list(workers)
            a, b = names
            for r in range(rounds):
                for name in names if r % 2 == 0 else names[::-1]:
                    workers[name].stdin.write(f"{steps}\n")
                    workers[name].stdin.flush()
                    got = read_reply(name, workers[name])
                    times[name] += got
                    per_round[name].append(statistics.median(got))
        finally:
            for worker in workers.values():
                worker.stdin.close()
                worker.wait()
    medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    round_ratios = [tb / ta for ta, tb in zip(per_round[a], per_round[b], strict=True)]
    return {
        "trees": {name: str(tree) for name, tree in trees.items()},
        "flax_transformer": {name: r["package"] for name, r in ready.items()},
        "config": {name: r["config"] for name, r in ready.items()},
        "compiled_hlo_sha256": {name: r["hlo_sha256"] for name, r in ready.items()},
        "same_compiled_program": ready[a]["hlo_sha256"] == ready[b]["hlo_sha256"],
        "batch": {k: list(v.shape) for k, v in batch.items()},
        "loadavg_start": load_start,
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
        "system_malloc": sorted(system_malloc),
        "xla_flags": {name: xla_flags.get(name, "") for name in trees},
        "loadavg_end": os.getloadavg(),
        "rounds": rounds,
        "steps_per_round": steps,
        "step_ms": {
            name: {"median": medians[name], "min": min(t) * 1e3, "n": len(t)}
            for name, t in times.items()
        },
        "round_median_ms": {name: [t * 1e3 for t in v] for name, v in per_round.items()},
        f"{b}_over_{a}_median_ratio": medians[b] / medians[a],
        f"{b}_over_{a}_round_ratio_median": statistics.median(round_ratios),
        f"{b}_over_{a}_round_ratio_range": [min(round_ratios), max(round_ratios)],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=DIR, twice (A then B)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per tree per round")
    parser.add_argument("--preset", choices=tuple(PRESETS), default="reference")
    parser.add_argument("--batch", type=int, default=REFERENCE_BATCH[0])
    parser.add_argument("--src-len", type=int, default=REFERENCE_BATCH[1])
    parser.add_argument("--tgt-len", type=int, default=REFERENCE_BATCH[2])
    parser.add_argument("--max-len", type=int, help="the model's max_len (default: the preset's)")
    parser.add_argument("--layers", type=int, help="encoder and decoder layers each")
    parser.add_argument("--vocab", type=int, help="source and target vocabulary size")
    parser.add_argument(
        "--system-malloc",
        metavar="NAME",
        action="append",
        default=[],
        help="run this tree's worker with glibc's default malloc (A/B of host_memory's tunables)",
    )
    parser.add_argument(
        "--xla-flags",
        metavar="NAME=FLAGS",
        action="append",
        default=[],
        help="add FLAGS to this tree's XLA_FLAGS (A/B of XLA options: --tree a=. --tree b=.)",
    )
    args = parser.parse_args(argv)
    if len(args.tree) != 2 or any("=" not in t for t in args.tree):
        parser.error("give exactly two --tree NAME=DIR")
    trees = {n: Path(d).resolve() for n, d in (t.split("=", 1) for t in args.tree)}
    if len(trees) != 2:
        parser.error("the two trees need different names")
    for name, tree in trees.items():
        if not (tree / "bench" / "flax_step.py").is_file():
            parser.error(f"--tree {name}={tree}: no bench/flax_step.py there")
    if min(args.rounds, args.steps) <= 0:
        parser.error("--rounds and --steps must be positive")
    fields = {**PRESETS[args.preset], "dropout_rate": DROPOUT}
    if args.max_len is not None:
        fields["max_len"] = args.max_len
    if args.layers is not None:
        fields.update(num_encoder_layers=args.layers, num_decoder_layers=args.layers)
    if args.vocab is not None:
        fields.update(src_vocab_size=args.vocab, tgt_vocab_size=args.vocab)
    if unknown := set(args.system_malloc) - set(trees):
        parser.error(f"--system-malloc {', '.join(sorted(unknown))}: not a --tree name")
    if args.system_malloc and not os.environ.get(host_memory.DONE):
        parser.error(
            "--system-malloc: this driver runs with glibc's defaults itself (not started as "
            "`python -m bench.ab_step`, FLAX_TRANSFORMER_MALLOC=system, not Linux/glibc, or a "
            "JAX plugin installed), so both workers would: nothing to compare"
        )
    if any("=" not in f for f in args.xla_flags):
        parser.error("--xla-flags takes NAME=FLAGS")
    xla_flags = dict(f.split("=", 1) for f in args.xla_flags)
    if unknown := set(xla_flags) - set(trees):
        parser.error(f"--xla-flags {', '.join(sorted(unknown))}: not a --tree name")
    try:
        overrides = {k: v for k, v in fields.items() if k != "dropout_rate"}
        cfg = bench_config(args.preset, **overrides)
        batch = make_batch(cfg, args.batch, args.src_len, args.tgt_len)
    except ValueError as err:
        parser.error(str(err))
    malloc = frozenset(args.system_malloc)
    result = run(trees, fields, batch, args.rounds, args.steps, malloc, xla_flags)
    a, b = trees
    for name in trees:
        stats = result["step_ms"][name]
        print(f"{name}: median {stats['median']:.1f} ms, min {stats['min']:.1f} ms ({stats['n']})")
    print(f"same compiled program (debug info and names aside): {result['same_compiled_program']}")
    print(
        f"{b} / {a}: ratio of medians {result[f'{b}_over_{a}_median_ratio']:.3f}, "
        f"median per-round ratio {result[f'{b}_over_{a}_round_ratio_median']:.3f}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    host_memory.reexec_with_tuned_malloc()  # as train.py (FLAX_TRANSFORMER_MALLOC=system: off)
    sys.exit(main())
