"""Where the train step's time goes, Flax (XLA) and PyTorch eager side by side, per category.

    python -m bench.profile_vs_torch [--steps 3] [bench.train_throughput's size flags]
        [--json OUT.json]

The same model, batch and AdamW as `bench.train_throughput` (its flags: --preset, --d-model,
--batch, --src-len, ...). The Flax step (bench.flax_step) is traced with `jax.profiler` and
every XLA thunk is attributed through the compiled HLO's op_name metadata
(bench.profile_step.hlo_op_names); torch_reference's eager step runs under `torch.profiler`
and every op's self time is attributed by its name and by the step phase around it
(forward, loss, backward, clip, optimizer). Both are sorted into the same categories:

    dense GEMMs fwd / bwd    the q/k/v/out, feed-forward and output-layer matrix products
    attention products       q k^T and weights @ v (batched), forward and backward
    attention softmax+mask   the softmax, its backward and the masking around it
    loss                     log-softmax / cross-entropy over the vocabulary, and its backward
    LayerNorm                forward and backward
    dropout                  the random bits, the masks and their backward
    optimizer                gradient clipping and the AdamW update
    copies/transposes        layout copies (XLA copy/transpose thunks, torch copy_/clone)
    other                    residual adds, activations, embeddings, everything else
    outside ops              XLA: no thunk running; torch: Python and dispatch between ops

XLA runs two thunks at once at times, so its rows can add up to more than the step. Each
side's rows are ms per step, averaged over the traced steps; both sides run in one process,
one after the other (not interleaved: compare the shares, and time with
bench.train_throughput).
"""

from __future__ import annotations

import collections
import json
import re
import sys
import tempfile
import time

CATEGORIES = (
    "dense GEMMs fwd",
    "dense GEMMs bwd",
    "attention products",
    "attention softmax+mask",
    "loss",
    "LayerNorm",
    "dropout",
    "optimizer",
    "copies/transposes",
    "other",
    "outside ops",
)


# ----------------------------------------------------------------------------- XLA side
def product_instructions(hlo_text: str) -> set[str]:
    """Names of the instructions that are matrix products: dots, convolutions, and fusions
    (or custom calls) whose called computation holds one."""
    products, calls, computation = set(), {}, None
    holders: set[str] = set()
    pattern = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*)$")
    for line in hlo_text.splitlines():
        match = pattern.match(line)
        if not match:
            if line.rstrip().endswith("{"):
                computation = line.removeprefix("ENTRY ").split()[0].lstrip("%")
            continue
        name, rest = match.groups()
        if re.search(r" (dot|convolution)\(", rest):
            products.add(name)
            holders.add(computation)
        called = re.search(r"calls=%([\w.\-]+)", rest)
        if called:
            calls[name] = called.group(1)
    return products | {name for name, called in calls.items() if called in holders}


def xla_category(op_name: str, thunk: str, is_product: bool) -> str:
    """The category of one XLA thunk from its HLO op_name and thunk name."""
    backward = "transpose(" in op_name
    if "jvp(" not in op_name and op_name:  # outside the differentiated function
        return "optimizer"
    if "dropout" in op_name.lower() or "threefry" in op_name or "bernoulli" in op_name:
        return "dropout"
    if thunk.startswith(("copy", "transpose")):  # layout copies, wherever they are
        return "copies/transposes"
    attention = re.search(r"(self|cross)_attn", op_name)
    if attention and not re.search(r"(self|cross)_attn/(query|key|value|out)/", op_name):
        return "attention products" if is_product else "attention softmax+mask"
    if is_product:
        return "dense GEMMs bwd" if backward else "dense GEMMs fwd"
    if re.search(r"/(norm|\w*_norm|LayerNorm)\w*/", op_name + "/"):
        return "LayerNorm"
    if "log_softmax" in op_name or "Transformer" not in op_name:
        return "loss"
    return "other"


def profile_flax(cfg, batch: dict, steps: int, warmup: int) -> dict:
    import jax

    from bench.flax_step import build_flax_step, step_loss
    from bench.profile_step import busy_ns, hlo_op_names, read_trace

    state, step, batch_device = build_flax_step(cfg, batch)
    hlo = step.lower(state, batch_device).compile().as_text()
    op_names, products = hlo_op_names(hlo, infer=True), product_instructions(hlo)
    for _ in range(warmup):
        state, metrics = step(state, batch_device)
        step_loss(metrics)
    with tempfile.TemporaryDirectory() as trace_dir:
        start = time.perf_counter()
        with jax.profiler.trace(trace_dir):
            for _ in range(steps):
                state, metrics = step(state, batch_device)
                step_loss(metrics)
        wall_ms = (time.perf_counter() - start) * 1e3 / steps
        events, spans = read_trace(trace_dir)
    ms = collections.defaultdict(float)
    thunks = collections.defaultdict(lambda: collections.defaultdict(float))
    intervals = []
    for name, start_ns, duration_ns in events:
        category = xla_category(op_names.get(name, ""), name, name in products)
        ms[category] += duration_ns / 1e6 / steps
        thunks[category][re.sub(r"\.\d+$", "", name)] += duration_ns / 1e6 / steps
        intervals.append((start_ns, start_ns + duration_ns))
    step_ns = sum(duration for _, duration in spans)
    busy = sum(busy_ns(intervals, begin, begin + duration) for begin, duration in spans)
    ms["outside ops"] = (step_ns - busy) / 1e6 / steps
    return {
        "step_ms": step_ns / 1e6 / steps,
        "wall_ms": wall_ms,
        "ms": dict(ms),
        "top": {c: _top(t) for c, t in thunks.items()},
    }


# ----------------------------------------------------------------------------- torch side
_TORCH_NAMES = (
    (("aten::bmm", "aten::baddbmm"), "attention products"),
    (("aten::mm", "aten::addmm"), "dense GEMMs"),
    (("log_softmax", "nll_loss", "cross_entropy"), "loss"),  # before "_softmax": a substring
    (("_softmax", "aten::masked_fill", "aten::where"), "attention softmax+mask"),
    (("layer_norm",), "LayerNorm"),
    (("dropout", "bernoulli"), "dropout"),
    (("aten::copy_", "aten::clone", "aten::contiguous"), "copies/transposes"),
)
PHASES = ("forward", "loss", "backward", "clip", "optimizer")


def torch_category(name: str, phase: str | None) -> str:
    """The category of one torch op from its name and the step phase it ran in."""
    if phase in ("clip", "optimizer"):
        return "optimizer"
    for needles, category in _TORCH_NAMES:
        if any(needle in name for needle in needles):
            if category == "dense GEMMs":
                return "dense GEMMs bwd" if phase == "backward" else "dense GEMMs fwd"
            return category
    return "other"


def _phase(event) -> str | None:
    while event is not None:
        if event.name in PHASES:
            return event.name
        event = event.cpu_parent
    return None


def profile_torch(cfg, batch: dict, steps: int, warmup: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    import torch_reference
    from bench.train_throughput import torch_variant

    torch.manual_seed(0)
    model = torch_reference.Transformer(cfg)
    # bench.train_throughput's torch step, each phase a profiler range
    step = torch_variant("torch_eager", model, batch, lambda m, s, t: m(s, t), record_function).step

    for _ in range(warmup):
        step()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    wall_ms = (time.perf_counter() - start) * 1e3 / steps
    ms = collections.defaultdict(float)
    ops = collections.defaultdict(lambda: collections.defaultdict(float))
    for event in prof.events():
        if event.name in PHASES or event.cpu_parent is None and event.name.startswith("Profiler"):
            continue
        category = torch_category(event.name, _phase(event))
        ms[category] += event.self_cpu_time_total / 1e3 / steps
        ops[category][event.name] += event.self_cpu_time_total / 1e3 / steps
    ms["outside ops"] = max(0.0, wall_ms - sum(ms.values()))
    return {"wall_ms": wall_ms, "ms": dict(ms), "top": {c: _top(o) for c, o in ops.items()}}


def _top(times: dict[str, float], count: int = 3) -> dict[str, float]:
    return dict(sorted(times.items(), key=lambda item: -item[1])[:count])


# ----------------------------------------------------------------------------- driver
def format_table(xla: dict, torch_: dict) -> str:
    rows = ["| category | XLA ms | torch ms | XLA - torch |", "|---|---:|---:|---:|"]
    for category in CATEGORIES:
        x, t = xla["ms"].get(category, 0.0), torch_["ms"].get(category, 0.0)
        rows.append(f"| {category} | {x:.1f} | {t:.1f} | {x - t:+.1f} |")
    rows.append(
        f"| step (wall, profiled) | {xla['wall_ms']:.1f} | {torch_['wall_ms']:.1f} | "
        f"{xla['wall_ms'] - torch_['wall_ms']:+.1f} |"
    )
    return "\n".join(rows)


def main(argv=None) -> int:
    import os

    import torch

    from bench import setup
    from bench.train_throughput import parse_args

    args = parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    cfg = args.config
    batch = setup.make_batch(cfg, args.batch, args.src_len, args.tgt_len)
    load_start = os.getloadavg()
    xla = profile_flax(cfg, batch, args.steps, args.warmup)
    torch_ = profile_torch(cfg, batch, args.steps, args.warmup)
    from bench.ct2_peer import cpu_info, describe_cpu

    cpu = cpu_info()
    print(describe_cpu(cpu))
    print(format_table(xla, torch_))
    print(f"load average {load_start[0]:.2f} -> {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        result = {
            "config": cfg.to_dict(),
            "batch": [args.batch, args.src_len, args.tgt_len],
            "steps": args.steps,
            "cpu": cpu,
            "loadavg": [load_start, os.getloadavg()],
            "xla": xla,
            "torch": torch_,
        }
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from flax_transformer.training.host_memory import reexec_with_tuned_malloc

    reexec_with_tuned_malloc()  # as train.py and bench.train_throughput
    sys.exit(main())
