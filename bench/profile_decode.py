"""Where a step of HFModel.generate's beam search spends its time, part by part.

    python -m bench.profile_decode [--batch 8 --beams 4] [--calls 2] [--quantize int8] [--quick]
        [--json OUT]

Builds the random opus-mt-size Marian of bench.hf_generate (its `make_checkpoint`; --quick: its
tiny model, a smoke run), loads it with `hf.load` (float32, or `--quantize int8`) and calls
`HFModel.generate` as that bench does (`batch` random sources of 32 tokens, 64 new tokens,
min_new_tokens = 64 so no row stops early; --quick: 8 and 4). One untimed call compiles; then
`--calls` calls run under `jax.profiler.trace`. The trace's XLA thunks (events named after an
instruction of the search's compiled HLO: `hf.generation._run`, its arguments caught from the
first call, its `lower(...).compile()` being the cached executable) are read back with
bench.profile_step's `read_trace`, and each is named by its op_name metadata (the jax name
stack) through `hlo_op_names(hlo, infer=True)`: a fusion that holds a matrix product takes the
product's op_name (YNNPACK fuses the output projection with the logits bias and log_softmax's
max and subtraction, and a layer norm's scale and shift with the product after it: that work is
counted with the product), and an instruction XLA left without metadata takes its first user's
op_name, else its operands' common prefix.

Attribution rules. A thunk of a while loop's body or condition (by the HLO computation it
belongs to) is part of a decode step; the per-step figures are those thunks' times summed over
the traced calls and divided by the loops' iterations (the search runs one loop per cache
length; each run's iterations are the count most of its body thunks have; in all, new
tokens - 1 per call, the first token being chosen before the loop). Within the
loop, the first rule that matches the op_name decides:

- output_proj: the output projection, `shared_embed.attend` (the tied 58101 x 512 table), an
  `lm_head`, and `logits_bias` (its add);
- self_attn_proj: `self_attn/{query,key,value,out}/` (the products and their bias adds);
- self_cache_write: `self_attn._update_self_cache` (the new key/value written into the cache);
- self_attn_core: the rest of `self_attn` (scores over the cache, mask, softmax, weighted sum);
- cross_attn_proj: `cross_attn/{query,out}/` (keys/values are projected once, before the loop);
- cross_attn_core: the rest of `cross_attn` (scores over the source, softmax, weighted sum);
- ffn: `/ffn/`; layernorm: `/norm1/`, `/norm2/`, `/norm3/` and any other `norm` module;
- embed: the token embedding lookup (`shared_embed/`), positions (`_positions`);
- decoder_other: anything else under `Transformer.decode` (the embedding scale, reshapes);
- cache_reorder: `take_along_axis` ops outside the model whose result is floating point of
  rank >= 4, i.e. the self-attention cache leaves gathered by parent beam
  (`CachedState.reordered`), and the copies XLA adds for them; on the CPU the in-place
  reorder's custom calls instead (`/beam_reorder/`, kernels.beam_reorder);
- beam_log_softmax: `log_softmax`; beam_top_k: `top_k` (both top-k's of transformers' rules);
- beam_other: every other op of the loop body outside the model: above all the (B, K * V)
  candidate scores (log_softmax's last subtraction, the processors' masks and the running
  scores, one fusion), then the candidate sequences and scores gathered by parent, the
  finished pool, the engine's counters;
- other: no metadata even after inference, and the loop's condition (`/while/cond/`).

The loop's wall time runs from its `while` thunk's start to the end of its last thunk (XLA:CPU
can return from the while thunk before the body has run). gaps = that wall time minus the time
at least one of its thunks ran, per step: dispatch between thunks, and work the trace does not
time. XLA:CPU can run independent thunks at once (2 cores), so parts + gaps can exceed the
step's wall time by `overlap` (thunk time - busy time); shares are of the step's wall time.

Once per call (reported separately, ms per call): encoder (`Transformer.encode`), cross_kv (the
cross-attention keys/values of the source, `_cross_keys_values`), first_step (the rest of the
program outside the loop: the prefill decoder call, the first choice, the beams' expansion),
and gaps outside the loop; host = a call's wall time (time.perf_counter) minus its program's
execution (argument checks, transfers, the output's copy back).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from bench import ct2_peer
from bench import hf_generate as hg
from bench.profile_step import busy_ns, hlo_op_names, read_trace

STEP_PARTS = (
    "output_proj", "self_attn_proj", "self_cache_write", "self_attn_core", "cross_attn_proj",
    "cross_attn_core", "ffn", "layernorm", "embed", "decoder_other", "cache_reorder",
    "beam_log_softmax", "beam_top_k", "beam_other", "other",
)  # fmt: skip
ONCE_PARTS = ("encoder", "cross_kv", "first_step", "other")
_MODEL_RULES = (
    ("output_proj", r"\.attend/|/lm_head/|/logits_bias/"),
    ("self_attn_proj", r"self_attn/(query|key|value|out)/"),
    ("self_cache_write", r"_update_self_cache"),
    ("self_attn_core", r"self_attn"),
    ("cross_attn_proj", r"cross_attn/(query|key|value|out)/"),
    ("cross_attn_core", r"cross_attn"),
    ("ffn", r"/ffn/"),
    ("layernorm", r"/\w*norm\w*/"),
    ("embed", r"shared_embed/|_embed/|_positions"),
    ("decoder_other", r"Transformer\.decode"),
)


def step_part(op_name: str, dtype: str = "", rank: int = 0) -> str:
    """The part of a decode step a loop thunk belongs to (module docstring), from its op_name
    and its result's dtype and rank."""
    for part, pattern in _MODEL_RULES:
        if re.search(pattern, op_name):
            return part
    if "take_along_axis" in op_name and dtype.startswith(("f", "bf")) and rank >= 4:
        return "cache_reorder"
    if "/beam_reorder/" in op_name:
        return "cache_reorder"
    if "log_softmax" in op_name:
        return "beam_log_softmax"
    if "top_k" in op_name:
        return "beam_top_k"
    if "/while/body/" in op_name:
        return "beam_other"
    return "other"


def once_part(op_name: str) -> str:
    """The part of the once-per-call work (outside the loop) a thunk belongs to."""
    if "Transformer.encode" in op_name:
        return "encoder"
    if "_cross_keys_values" in op_name:
        return "cross_kv"
    return "first_step" if op_name else "other"


def hlo_instructions(hlo_text: str) -> dict[str, tuple[str, int, str]]:
    """Instruction name -> (element type, rank of its result, "body" / "condition" when it
    belongs to a while loop's body / condition, else ""), from compiled HLO text; a tuple
    result is ("tuple", 0)."""
    roles = {c: r for r, c in re.findall(r"(body|condition)=%?([\w.\-]+)", hlo_text)}
    pattern = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\w+)\[([\d,]*)\]")
    instructions, computation = {}, None
    for line in hlo_text.splitlines():
        if " = " not in line and line.rstrip().endswith("{"):  # a computation's header
            computation = line.removeprefix("ENTRY ").split()[0].lstrip("%")
            continue
        match = pattern.match(line)
        if match:
            dims = match.group(3)
            rank = len(dims.split(",")) if dims else 0
            info = (match.group(2), rank, roles.get(computation, ""))
        else:
            match = re.match(r"^\s*(?:ROOT )?%?([\w.\-]+) = \(", line)
            info = ("tuple", 0, roles.get(computation, ""))
        if match:
            instructions[match.group(1)] = info
    return instructions


@contextlib.contextmanager
def _catch_search_arguments(caught: list):
    """hf.generation._run, wrapped to keep its arguments (the program's HLO is compiled from
    them); restored on exit. Generation itself is unchanged."""
    from flax_transformer.hf import generation

    original = generation._run

    def spy(*args, **kwargs):
        caught.append((args, kwargs))
        return original(*args, **kwargs)

    generation._run = spy
    try:
        yield original
    finally:
        generation._run = original


def _inside(x: tuple[int, int], y: tuple[int, int]) -> bool:
    """Span x (start, duration) lies within span y."""
    return y[0] <= x[0] and x[0] + x[1] <= y[0] + y[1]


def attribute(events, executions, op_names, instructions, calls: int) -> dict:
    """Thunk events of `calls` traced calls -> ms per decode step and per call, by part.

    events: (name, start_ns, duration_ns), those not named after an HLO instruction (python
    tracer events, profiler bookkeeping) ignored; executions: (start_ns, duration_ns) of every
    ThunkExecutor span of the trace; op_names: hlo_op_names(hlo, infer=True); instructions:
    hlo_instructions(hlo)."""
    events = [e for e in events if e[0] in instructions]
    is_loop = lambda name: instructions[name][0] == "tuple" and name.startswith("while")  # noqa: E731
    ends = {start: start + duration for name, start, duration in events if is_loop(name)}
    whiles = sorted(ends)
    if not whiles:
        raise RuntimeError("no while thunk in the trace: is this a search?")
    loop_events, once_events = [], []
    for name, start, duration in events:
        if not is_loop(name):
            inside = bool(instructions[name][2])
            (loop_events if inside else once_events).append((name, start, duration))
    # Each loop thunk belongs to the loop run (one per call and cache length) that started last
    # before it. XLA:CPU's while thunk can return before its body has run (the body runs
    # asynchronously): a loop lasts from its while thunk's start to the end of the thunk or of
    # the last loop thunk after it, whichever is later. Its iterations: the count most of its
    # body thunks have (not the largest count: XLA:CPU's sort thunk reports twice an execution).
    body_counts = collections.defaultdict(collections.Counter)
    for name, start, duration in loop_events:
        loop = whiles[max(0, bisect.bisect_right(whiles, start) - 1)]
        ends[loop] = max(ends[loop], start + duration)
        if instructions[name][2] == "body":
            body_counts[loop][name] += 1
    loops = [(begin, ends[begin]) for begin in whiles]
    steps = sum(statistics.mode(counts.values()) for counts in body_counts.values())
    per_step = dict.fromkeys(STEP_PARTS, 0.0)
    kinds = collections.defaultdict(lambda: collections.defaultdict(float))
    for name, _, duration in loop_events:
        part = step_part(op_names.get(name, ""), *instructions[name][:2])
        per_step[part] += duration / 1e6 / steps
        kinds[part][re.sub(r"\.\d+$", "", name)] += duration / 1e6 / steps
    loop_ns = sum(end - begin for begin, end in loops)
    busy = sum(busy_ns([(s, s + d) for _, s, d in loop_events], b, e) for b, e in loops)
    once = dict.fromkeys(ONCE_PARTS, 0.0)
    for name, _, duration in once_events:
        once[once_part(op_names.get(name, ""))] += duration / 1e6 / calls
    # The program's executions: the outermost executor spans that hold the loop.
    executions = [(s, d) for s, d in executions if any(s <= b <= s + d for b, _ in loops)]
    executions = [x for x in executions if not any(y != x and _inside(x, y) for y in executions)]
    run_ns = sum(d for _, d in executions)
    once_busy = sum(
        busy_ns([(s, s + d) for _, s, d in once_events], s, s + d) for s, d in executions
    )
    once["gaps"] = (run_ns - loop_ns - once_busy) / 1e6 / calls if run_ns else 0.0
    return {
        "steps": steps,
        "step_ms": loop_ns / 1e6 / steps,
        "per_step_ms": per_step,
        "gaps_ms": (loop_ns - busy) / 1e6 / steps,
        "overlap_ms": (sum(d for _, _, d in loop_events) - busy) / 1e6 / steps,
        "kinds": {
            part: dict(sorted(k.items(), key=lambda i: -i[1])[:4]) for part, k in kinds.items()
        },
        "once_per_call_ms": once,
        "execution_ms": run_ns / 1e6 / calls,
        "loop_ms": loop_ns / 1e6 / calls,
    }


def profile(
    batch: int = 8, beams: int = 4, calls: int = 2, quick: bool = False, quantize: str | None = None
) -> dict:
    """Trace `calls` generate calls of the bench's Marian model (tiny with quick) and attribute
    their thunks; the returned dict is what --json writes."""
    from flax_transformer import hf

    sizes = hg.TINY if quick else hg.OPUS_MT
    src_len, new_tokens = (8, 4) if quick else (32, 64)
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        hg.make_checkpoint(Path(tmp), sizes)
        model = hf.load(tmp, quantize=quantize)
    rng = np.random.default_rng(0)
    ids = rng.integers(1, sizes["vocab_size"] - 1, (batch, src_len))

    def call():
        return model.generate(
            ids, np.ones_like(ids), num_beams=beams, max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
        )  # fmt: skip

    caught = []
    with _catch_search_arguments(caught) as search:
        call()  # compiles
    args, kwargs = caught[0]
    hlo = search.lower(*args, **kwargs).compile().as_text()
    op_names, instructions = hlo_op_names(hlo, infer=True), hlo_instructions(hlo)
    walls = []
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            for _ in range(calls):
                start = time.perf_counter()
                call()
                walls.append(time.perf_counter() - start)
        events, executions = read_trace(trace_dir, span_prefix="ThunkExecutor::Execute")
    result = attribute(events, executions, op_names, instructions, calls)
    result["once_per_call_ms"]["host"] = statistics.mean(walls) * 1e3 - result["execution_ms"]
    result["call_ms"] = [round(w * 1e3, 1) for w in walls]
    result["setup"] = {
        "model": "opus-mt-size Marian, random" + (" (--quick: tiny)" if quick else ""),
        "quantize": quantize,
        "batch": batch, "num_beams": beams, "src_len": src_len, "new_tokens": new_tokens,
        "calls": calls,
    }  # fmt: skip
    result["machine"] = {
        "platform": platform.platform(),
        "cpu": ct2_peer.cpu_info(),
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "jax_backend": jax.default_backend(),
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
    }
    return result


def format_table(result: dict) -> str:
    """The per-step table (ms and share of the step), then the once-per-call work."""
    step = result["step_ms"]
    setup = result["setup"]
    lines = [
        ct2_peer.describe_cpu(result["machine"]["cpu"]),
        f"batch {setup['batch']}, beams {setup['num_beams']}: {result['steps']} traced steps, "
        f"{step:.2f} ms a step (the loop's wall time / steps)",
        "| part | ms / step | share | biggest thunks (ms / step) |",
        "|---|---:|---:|---|",
    ]
    rows = [(p, ms) for p, ms in result["per_step_ms"].items() if ms > 0]
    rows.sort(key=lambda row: -row[1])
    for part, ms in rows + [("gaps", result["gaps_ms"])]:
        kinds = result["kinds"].get(part, {})
        detail = ", ".join(f"{kind} {kind_ms:.2f}" for kind, kind_ms in list(kinds.items())[:3])
        lines.append(f"| {part} | {ms:.2f} | {ms / step:.1%} | {detail} |")
    lines.append(
        f"thunks overlapped for {result['overlap_ms']:.2f} ms a step (parts + gaps - step)"
    )
    once = ", ".join(f"{part} {ms:.1f}" for part, ms in result["once_per_call_ms"].items())
    lines.append(
        f"once per call (ms): {once}; loop {result['loop_ms']:.1f}, program "
        f"{result['execution_ms']:.1f}, calls {result['call_ms']}"
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    """The command line (module docstring)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--calls", type=int, default=2, help="traced generate calls")
    parser.add_argument("--quantize", choices=["int8"], help="hf.load(path, quantize=...)")
    parser.add_argument("--quick", action="store_true", help="a tiny model (smoke run)")
    parser.add_argument("--json", help="where to write the result")
    args = parser.parse_args(argv)
    if min(args.batch, args.beams, args.calls) < 1:
        parser.error("--batch, --beams and --calls must be >= 1")
    result = profile(args.batch, args.beams, args.calls, args.quick, args.quantize)
    result["machine"]["command"] = " ".join(["python", "-m", "bench.profile_decode", *argv])
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
