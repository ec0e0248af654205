"""Where the Flax train step spends its time: `python -m bench.profile_step [--quick]`.

Traces a few steps of the benchmark's Flax step (bench.flax_step; the reference preset with
dropout 0.1, batch 32 x (64 + 64); `--batch --src-len --tgt-len --max-len` for other shapes,
e.g. `--batch 8 --src-len 256 --tgt-len 256 --max-len 256`) with `jax.profiler.trace`,
reads the trace back with `jax.profiler.ProfileData`, and sums the time of every XLA thunk
(fusion, GEMM, copy) per step. Each thunk is attributed to a part of the model through the
`op_name` metadata of the compiled HLO (its jax name stack), e.g. "bwd:ffn" = the
feed-forward layers' backward pass.
Also reports how much of the step no thunk was running (dispatch gaps and asynchronous Eigen
GEMMs the trace does not time).

The attempts in bench/NOTES.md were chosen from this table. Numbers overlap where XLA runs two
thunks at once, so a row's share is approximate.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import tempfile
from pathlib import Path

import jax

from bench import setup
from bench.flax_step import build_flax_step, step_loss
from flax_transformer.training.host_memory import reexec_with_tuned_malloc

# Profiler bookkeeping, not work.
_SKIPPED_EVENTS = ("ThunkExecutor", "Threadpool", "SlinkyThreadPool", "end:")
_PARTS = ("ffn", "norm", "embed", "lm_head")


def model_part(op_name: str) -> str:
    """'fwd:attn_dense' etc. from an HLO op_name such as
    'jit(train_step)/transpose(jvp(Transformer))/.../self_attn/query/dot_general'."""
    if "bernoulli" in op_name or "threefry" in op_name or "dropout" in op_name.lower():
        part = "dropout"
    elif re.search(r"(self|cross)_attn/(query|key|value|out)/", op_name):
        part = "attn_dense"
    elif "self_attn" in op_name or "cross_attn" in op_name:
        part = "attn_core"
    else:
        part = next((p for p in _PARTS if f"/{p}" in op_name), "other")
    if part == "norm":
        part = "layernorm"
    direction = "bwd" if "transpose(" in op_name else "fwd"
    return f"{direction}:{part}"


def hlo_op_names(hlo_text: str, infer: bool = False) -> dict[str, str]:
    """Instruction name -> op_name metadata, from compiled HLO text.

    infer: a fusion that holds a product (dot, convolution) takes the product's op_name, not
    its root's (YNNPACK fuses a product with the elementwise work around it); and the
    instructions XLA left without metadata (copies it added, split reductions, some dots)
    take the op_name of their first user that has one (or has one so inferred), else the
    longest common '/' prefix of their operands' op_names."""
    names, operands, users = {}, {}, collections.defaultdict(list)
    products, calls, computation = {}, {}, None
    pattern = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*)$")
    for line in hlo_text.splitlines():
        match = pattern.match(line)
        if not match:
            if line.rstrip().endswith("{"):  # a computation's header
                computation = line.removeprefix("ENTRY ").split()[0].lstrip("%")
            continue
        name, rest = match.groups()
        op_name = re.search(r'op_name="([^"]*)"', rest)
        if op_name:
            names.setdefault(name, op_name.group(1))
        if infer:
            operands[name] = re.findall(r"%([\w.\-]+)", rest.split("metadata=")[0])
            if op_name and re.search(r" (dot|convolution)\(", rest):
                products.setdefault(computation, op_name.group(1))
            called = re.search(r"calls=%([\w.\-]+)", rest)
            if called:
                calls[name] = called.group(1)
    if not infer:
        return names
    for name, called in calls.items():  # a fusion that holds a product is that product
        if called in products:
            names[name] = products[called]
    for name, args in operands.items():
        for arg in args:
            if arg in operands:
                users[arg].append(name)
    order = list(operands)
    for name in reversed(order):  # users follow their operands: a chain resolves in one pass
        user = next((names[u] for u in users[name] if u in names), None)
        if name not in names and user:
            names[name] = user
    for name in order:
        known = [names[a].split("/") for a in operands[name] if a in names]
        common = os.path.commonprefix(known) if known else []  # whole '/' components
        if name not in names and common:
            names[name] = "/".join(common)
    return names


def read_trace(
    trace_dir: str | Path, span_prefix: str = "ThunkExecutor::Execute (wait"
) -> tuple[list[tuple[str, int, int]], list[tuple[int, int]]]:
    """The XLA thunks of a `jax.profiler.trace` directory as (name, start_ns, duration_ns),
    profiler bookkeeping and the python line left out, and the (start_ns, duration_ns) of the
    events whose name starts with span_prefix (by default ThunkExecutor's "wait for completion"
    spans: the train step's executions)."""
    trace = next(Path(trace_dir).rglob("*.xplane.pb"))
    data = jax.profiler.ProfileData.from_file(str(trace))
    events, spans = [], []
    for plane in data.planes:
        for line in plane.lines:
            if line.name == "python":
                continue
            for event in line.events:
                if event.name.startswith(span_prefix):
                    spans.append((event.start_ns, event.duration_ns))
                if not event.name.startswith(_SKIPPED_EVENTS):
                    events.append((event.name, event.start_ns, event.duration_ns))
    return events, spans


def busy_ns(intervals, start: int, end: int) -> int:
    """How long at least one of the (begin, end) intervals that begin in [start, end] runs."""
    busy, reach = 0, start
    for begin, stop in sorted(i for i in intervals if start <= i[0] <= end):
        busy += max(0, stop - max(begin, reach))
        reach = max(reach, stop)
    return busy


def profile(cfg, batch_dims: tuple[int, int, int], steps: int = 3, warmup: int = 3) -> dict:
    batch = setup.make_batch(cfg, *batch_dims)
    state, step, batch_device = build_flax_step(cfg, batch)
    op_names = hlo_op_names(step.lower(state, batch_device).compile().as_text())
    for _ in range(warmup):
        state, metrics = step(state, batch_device)
        step_loss(metrics)
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            for _ in range(steps):
                state, metrics = step(state, batch_device)
                step_loss(metrics)
        events, step_spans = read_trace(trace_dir)
    per_part = collections.defaultdict(float)
    per_kind = collections.defaultdict(lambda: collections.defaultdict(float))
    intervals = []
    for name, start_ns, duration_ns in events:
        ms = duration_ns / 1e6 / steps
        part = model_part(op_names.get(name, ""))
        per_part[part] += ms
        per_kind[part][re.sub(r"\.\d+$", "", name)] += ms
        intervals.append((start_ns, start_ns + duration_ns))
    # Idle time inside the longest step: wall minus the union of thunk intervals.
    start, duration = max(step_spans, key=lambda span: span[1])
    busy = busy_ns(intervals, start, start + duration)
    return {
        "step_ms": duration / 1e6,
        "idle_ms": (duration - busy) / 1e6,
        "parts": dict(per_part),
        "kinds": {part: dict(kinds) for part, kinds in per_kind.items()},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny preset, for a smoke run")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--batch", type=int, help="batch rows (default 32; --quick: 2)")
    parser.add_argument("--src-len", type=int, help="source tokens per row (default 64)")
    parser.add_argument("--tgt-len", type=int, help="target tokens per row (default 64)")
    parser.add_argument("--max-len", type=int, help="the model's max_len (default: the preset's)")
    args = parser.parse_args(argv)
    name, dims = ("tiny", setup.QUICK_BATCH) if args.quick else ("reference", setup.REFERENCE_BATCH)
    dims = tuple(
        default if given is None else given
        for given, default in zip((args.batch, args.src_len, args.tgt_len), dims, strict=True)
    )
    overrides = {} if args.max_len is None else {"max_len": args.max_len}
    cfg = setup.bench_config(name, **overrides)
    if max(dims[1:]) > cfg.max_len:
        parser.error(f"a length of {max(dims[1:])} exceeds max_len {cfg.max_len} (raise --max-len)")
    result = profile(cfg, dims, steps=args.steps)
    step_ms, idle_ms = result["step_ms"], result["idle_ms"]
    print(f"longest traced step {step_ms:.1f} ms, no thunk running {idle_ms:.1f} ms")
    print(f"{'ms/step':>8}  part             biggest thunk kinds")
    ranked = sorted(result["parts"].items(), key=lambda item: -item[1])
    for part, ms in ranked[: args.top]:
        kinds = sorted(result["kinds"][part].items(), key=lambda item: -item[1])[:3]
        detail = ", ".join(f"{kind} {kind_ms:.1f}" for kind, kind_ms in kinds)
        print(f"{ms:8.1f}  {part:15s}  {detail}")
    return 0


if __name__ == "__main__":
    reexec_with_tuned_malloc()  # as train.py (FLAX_TRANSFORMER_MALLOC=system: off)
    raise SystemExit(main())
