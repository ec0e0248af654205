"""Encoder speed (BERT family, last hidden state): this project against torch eager, ONNX
Runtime and CTranslate2's Encoder (float32 and int8), on the CPU.

    python -m bench.encoder --json OUT.json [--model minilm|roberta|distilbert] [--rounds 5]
        [--tiny] [--no-ort] [--no-ct2]

The model (default: all-MiniLM-L6-v2's shape, a BertModel with 6 layers, d 384, 12 heads,
d_ff 1536, vocab 30522; --model roberta: RoBERTa-base's, 12 layers, d 768, 12 heads, d_ff
3072, vocab 50265; --model distilbert: DistilBERT's, 6 layers, d 768, 12 heads, d_ff 3072,
vocab 30522; --tiny: the same architecture at a toy size, a smoke test) is random, saved with
transformers' save_pretrained to a temporary directory, and read by every side:

- project: `hf.load(dir).forward(ids, mask)`, numpy in and out (what a user calls);
- project_jit: `jax.jit(hf.load(dir).encoder_fn())(ids, mask)`, the result read back as numpy;
- project_int8: `hf.load(dir, quantize="int8").forward(ids, mask)` (dynamic int8 products);
- torch: transformers' model, eager, under torch.inference_mode;
- ort: ONNX Runtime on that model exported with torch.onnx.export (bench/encoder_peers.py);
- ct2_float32, ct2_int8: CTranslate2's Encoder on its own conversion of the checkpoint.

Every side uses all the CPU's cores (torch threads, ONNX Runtime's and CTranslate2's intra-op
threads = the CPU count; XLA:CPU's pool is the CPU count by default). The cells are batch x
tokens 1 x 16 (latency), 32 x 128 and 8 x 512 (--tiny: 1 x 8 and 4 x 16), random ids, every
token real (attention mask all ones). Each side runs each cell once untimed (compilation, the
first call), and its output is compared with torch's: the largest absolute difference of the
last hidden state (float32 sides are expected within 1e-5), and for the int8 sides the cosine
of each token's vector to torch's (the lowest and the mean). Then every round times every cell
on every side, the sides in an order rotated each round (interleaved: a noisy neighbour slows
all alike); a sample is the mean of `calls` back-to-back calls (enough for ~50 ms, the same
count for every side of a cell; one with --tiny). Reported per side: the minimum and the
median over the rounds (ms per call) and sequences/s from the median. The CPU's name and
vector extensions and the load average (start and end of the run) are written beside them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MINILM = dict(
    vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
    intermediate_size=1536, max_position_embeddings=512,
)  # fmt: skip
ROBERTA_BASE = dict(
    vocab_size=50265, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
    intermediate_size=3072, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
    bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5,
)  # fmt: skip
DISTILBERT = dict(
    vocab_size=30522, dim=768, n_layers=6, n_heads=12, hidden_dim=3072,
    max_position_embeddings=512,
)  # fmt: skip
# --model: (the architecture in bench.encoder_peers, its sizes, the same at --tiny)
MODELS = {
    "minilm": (
        "bert",
        MINILM,
        dict(MINILM, vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=64),
    ),
    "roberta": (
        "roberta",
        ROBERTA_BASE,
        dict(ROBERTA_BASE, vocab_size=128, hidden_size=32, num_hidden_layers=2,
             num_attention_heads=4, intermediate_size=64, max_position_embeddings=66),
    ),
    "distilbert": (
        "distilbert",
        DISTILBERT,
        dict(DISTILBERT, vocab_size=128, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
             max_position_embeddings=64),
    ),
}  # fmt: skip
CELLS = ((1, 16), (32, 128), (8, 512))
TINY_CELLS = ((1, 8), (4, 16))
FLOAT32_TOLERANCE = 1e-5  # the last hidden state against torch's, float32
SAMPLE_SECONDS = 0.05  # a timed sample is at least this long (several calls when fast)
MAX_CALLS = 100


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", required=True, help="where to write the results")
    parser.add_argument("--model", choices=sorted(MODELS), default="minilm")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (min and median)")
    parser.add_argument("--tiny", action="store_true", help="a toy-size model (smoke test)")
    parser.add_argument("--no-ort", dest="ort", action="store_false", help="leave ORT out")
    parser.add_argument("--no-ct2", dest="ct2", action="store_false", help="leave CT2 out")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    return args


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The cosine of each token's vector in `a` to the same token's in `b` (..., d) -> (...)."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return np.sum(a * b, axis=-1) / np.maximum(norms, 1e-30)


def compare(side: str, out: np.ndarray, reference: np.ndarray) -> dict:
    """A side's output against torch's: the largest difference; cosines for the int8 sides."""
    if out.shape != reference.shape:
        return {"shape": list(out.shape), "reference_shape": list(reference.shape)}
    result = {"max_abs_diff": float(np.max(np.abs(out - reference)))}
    if side.endswith("int8"):
        cos = cosines(out, reference)
        result.update(cosine_min=float(cos.min()), cosine_mean=float(cos.mean()))
    else:
        result["within_tolerance"] = result["max_abs_diff"] <= FLOAT32_TOLERANCE
    return result


def load_sides(directory: Path, args, threads: int) -> tuple[dict, list[str]]:
    """{side name: callable(ids) -> last hidden state}, and a line per side left out."""
    import jax
    import torch

    from bench import encoder_peers
    from flax_transformer import hf

    skipped = []
    project = hf.load(directory)
    encode = jax.jit(project.encoder_fn())
    sides = {
        "project": lambda ids: project.forward(ids, np.ones_like(ids)),
        "project_jit": lambda ids: np.asarray(encode(ids, np.ones_like(ids))),
    }
    try:
        project_int8 = hf.load(directory, quantize="int8")
    except ValueError as err:
        skipped.append(f"project int8 left out: {err}")
    else:
        sides["project_int8"] = lambda ids: project_int8.forward(ids, np.ones_like(ids))
    model = encoder_peers.torch_model(directory)

    def torch_side(ids):
        with torch.inference_mode():
            ids = torch.as_tensor(ids)
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
            return out.last_hidden_state.numpy()

    sides["torch"] = torch_side
    why = None if args.ort else "ONNX Runtime left out (--no-ort)"
    why = why or encoder_peers.missing(("onnxruntime", "onnx", "onnxscript"), "ONNX Runtime")
    if why is None:
        max_len = max(length for _, length in (TINY_CELLS if args.tiny else CELLS))
        onnx_path = encoder_peers.export_onnx(model, directory / "model.onnx", max_len)
        sides["ort"] = encoder_peers.OrtPeer(onnx_path, threads)
    else:
        skipped.append(why)
    why = None if args.ct2 else "CTranslate2 left out (--no-ct2)"
    why = why or encoder_peers.missing(("ctranslate2",), "CTranslate2")
    if why is None:
        vocab = model.config.vocab_size
        converted = encoder_peers.convert_ct2(directory, directory / "ct2", vocab)
        for kind in ("float32", "int8"):
            sides[f"ct2_{kind}"] = encoder_peers.CT2Peer(converted, kind, threads)
    else:
        skipped.append(why)
    return sides, skipped


def _timed(call, ids, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        call(ids)
    return (time.perf_counter() - start) / calls


def run(args, argv: list[str]) -> dict:
    import jax
    import torch

    from bench import ct2_peer, encoder_peers

    architecture, full, tiny = MODELS[args.model]
    sizes = tiny if args.tiny else full
    cells = TINY_CELLS if args.tiny else CELLS
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    load_start = os.getloadavg()
    rng = np.random.default_rng(0)
    vocab = sizes["vocab_size"]
    inputs = {cell: rng.integers(5, vocab, cell).astype(np.int32) for cell in cells}
    with tempfile.TemporaryDirectory() as tmp:
        encoder_peers.make_checkpoint(Path(tmp), architecture, sizes)
        sides, skipped = load_sides(Path(tmp), args, threads)
        for line in skipped:
            print(line, file=sys.stderr, flush=True)
        agreement, calls = {}, {}
        for cell in cells:  # untimed: compilation; the outputs compared with torch's
            outputs, seconds = {}, {}
            for side, call in sides.items():
                outputs[side] = call(inputs[cell])  # the first call: compiles
                seconds[side] = _timed(call, inputs[cell], 1)
            agreement[cell] = {
                side: compare(side, out, outputs["torch"])
                for side, out in outputs.items()
                if side != "torch"
            }
            fastest = min(seconds.values())
            calls[cell] = 1 if args.tiny else min(MAX_CALLS, math.ceil(SAMPLE_SECONDS / fastest))
        times = {cell: {side: [] for side in sides} for cell in cells}
        names = list(sides)
        for round_index in range(args.rounds):
            order = names[round_index % len(names) :] + names[: round_index % len(names)]
            for cell in cells:
                for side in order:
                    times[cell][side].append(_timed(sides[side], inputs[cell], calls[cell]))
                line = ", ".join(f"{s} {times[cell][s][-1] * 1e3:.2f} ms" for s in names)
                print(
                    f"round {round_index + 1}/{args.rounds} {cell[0]} x {cell[1]}: {line}",
                    file=sys.stderr,
                    flush=True,
                )
    result_cells = []
    for batch, length in cells:
        cell = {"batch": batch, "tokens": length, "calls_per_sample": calls[(batch, length)]}
        for side, samples in times[(batch, length)].items():
            median = statistics.median(samples)
            cell[side] = {
                "min_ms": round(min(samples) * 1e3, 3),
                "median_ms": round(median * 1e3, 3),
                "seq_s": round(batch / median, 2),
            }
            if side != "torch":
                cell[side].update(agreement[(batch, length)][side])
        result_cells.append(cell)
    machine = {
        "command": " ".join(["python", "-m", "bench.encoder", *argv]),
        "platform": platform.platform(),
        "cpu": ct2_peer.cpu_info(),
        "cpu_count": threads,
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        "jax": jax.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "onnxruntime": _version("onnxruntime"),
        "ctranslate2": _version("ctranslate2"),
        "skipped": skipped,
        "rounds": args.rounds,
        "model": f"{args.model} ({architecture}), random" + (" (--tiny)" if args.tiny else ""),
        "sizes": sizes,
    }
    return {"cells": result_cells, "machine": machine}


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


# Table columns: (side, heading); ratios: (numerator, denominator).
COLUMNS = (
    ("project", "project"),
    ("project_jit", "project jit"),
    ("project_int8", "project int8"),
    ("torch", "torch"),
    ("ort", "ORT"),
    ("ct2_float32", "CT2 f32"),
    ("ct2_int8", "CT2 int8"),
)
RATIOS = (
    ("project", "ort"),
    ("project", "ct2_float32"),
    ("project", "torch"),
    ("project_int8", "ct2_int8"),
)


def format_table(result: dict) -> str:
    """The CPU and load lines, then per cell: sequences/s (median) and min / median ms per side,
    the project's ratios to the peers, and the outputs' agreement with torch."""
    from bench import ct2_peer

    machine, cells = result["machine"], result["cells"]
    present = [(side, head) for side, head in COLUMNS if side in cells[0]]
    head = ["batch x tokens"] + [f"{h} seq/s (min / median ms)" for _, h in present]
    ratios = [(a, b) for a, b in RATIOS if a in cells[0] and b in cells[0]]
    head += [f"{a} / {b}" for a, b in ratios]
    load = ", ".join(f"{x:.2f}" for x in machine["loadavg_start"])
    load_end = ", ".join(f"{x:.2f}" for x in machine["loadavg_end"])
    lines = [ct2_peer.describe_cpu(machine["cpu"]), f"load average: {load} (start), {load_end} "
             f"(end); {machine['model']}; {machine['rounds']} rounds"]  # fmt: skip
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        row = [f"{c['batch']} x {c['tokens']}"]
        for side, _ in present:
            s = c[side]
            row.append(f"{s['seq_s']:.1f} ({s['min_ms']:.2f} / {s['median_ms']:.2f})")
        row += [f"{c[a]['seq_s'] / c[b]['seq_s']:.2f}x" for a, b in ratios]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "| batch x tokens | side | max abs diff to torch | agreement |"]
    lines.append("|---|---|---|---|")
    for c in cells:
        for side, heading in present:
            if side == "torch":
                continue
            s = c[side]
            if "cosine_min" in s:
                verdict = f"cosine min {s['cosine_min']:.5f}, mean {s['cosine_mean']:.5f}"
            else:
                verdict = "within 1e-5" if s.get("within_tolerance") else "NOT within 1e-5"
            diff = f"{s['max_abs_diff']:.2e}" if "max_abs_diff" in s else "shape differs"
            lines.append(f"| {c['batch']} x {c['tokens']} | {heading} | {diff} | {verdict} |")
    lines += list(machine.get("skipped") or [])
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    result = run(args, argv)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
