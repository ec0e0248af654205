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
import re
import tempfile
from pathlib import Path

import jax

from bench import setup
from bench.flax_step import build_flax_step, step_loss

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


def hlo_op_names(hlo_text: str) -> dict[str, str]:
    """Instruction name -> op_name metadata, from compiled HLO text."""
    names = {}
    pattern = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*?op_name=\"([^\"]*)\"")
    for line in hlo_text.splitlines():
        match = pattern.match(line)
        if match:
            names.setdefault(match.group(1), match.group(2))
    return names


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
        trace = next(Path(trace_dir).rglob("*.xplane.pb"))
        data = jax.profiler.ProfileData.from_file(str(trace))
    per_part = collections.defaultdict(float)
    per_kind = collections.defaultdict(lambda: collections.defaultdict(float))
    intervals, step_spans = [], []
    for plane in data.planes:
        for line in plane.lines:
            if line.name == "python":
                continue
            for event in line.events:
                if event.name.startswith("ThunkExecutor::Execute (wait"):
                    step_spans.append((event.start_ns, event.duration_ns))
                if event.name.startswith(_SKIPPED_EVENTS):
                    continue
                ms = event.duration_ns / 1e6 / steps
                part = model_part(op_names.get(event.name, ""))
                per_part[part] += ms
                per_kind[part][re.sub(r"\.\d+$", "", event.name)] += ms
                intervals.append((event.start_ns, event.start_ns + event.duration_ns))
    # Idle time inside the longest step: wall minus the union of thunk intervals.
    start, duration = max(step_spans, key=lambda span: span[1])
    busy, reach = 0, start
    for begin, end in sorted(i for i in intervals if start <= i[0] <= start + duration):
        busy += max(0, end - max(begin, reach))
        reach = max(reach, end)
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
    raise SystemExit(main())
