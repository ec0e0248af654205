"""Generation speed of an imported opus-mt-size Marian model (or a t5-small-size T5): this
project against transformers and CTranslate2.

    python -m bench.hf_generate --json OUT.json [--rounds 3] [--quick] [--no-ct2] [--quantize int8]
        [--model marian|t5|t5-gated]

--model t5: a random T5 of t5-small size (transformers' T5Config: d_model 512, 8 heads of 64,
6+6 layers, d_ff 2048, vocab 32128, relu, relative position bias, the head tied and the output
scaled); t5-gated: the same with v1.1's gated gelu_new feed-forward and a head of its own
(Flan-T5's layout). The rest as for Marian below (decoding starts from the pad id 0; EOS 1),
without CTranslate2 (its peer here is written for the Marian checkpoint).

A random Marian model of opus-mt size (transformers' MarianConfig: d_model 512, 8 heads, 6+6
layers, d_ff 2048, vocab 58101, swish, shared and tied embeddings; generation_config.json as
opus-mt's: bad_words_ids [[pad]], forced_eos_token_id, max_length 512, num_beams 4) is written
with save_pretrained to a temporary directory and loaded by both sides: `hf.load(dir)`
(float32) and `MarianMTModel.from_pretrained(dir)` (float32, torch threads = JAX's = the CPU
count). Each cell (batch 1 and 8 x greedy and beam 4) translates `batch` random sources of
32 tokens into 64 new tokens; EOS is suppressed the same way on both sides (min_new_tokens=64,
so every row makes all 64 tokens). Each cell runs once untimed on this side (compilation) and
transformers makes one short warm-up call; then every round times every cell on both sides in
turn (interleaved: a noisy neighbour slows both alike), and the medians are reported.
tokens/s = batch * 64 / seconds per call. same_tokens: both returned the same token array in
every timed round.

CTranslate2 (optional: the `bench` extra; without it one line says so and its columns are left
out) converts the same checkpoint with its own TransformersConverter (bench/ct2_peer.py) and
runs it as two more sides of every round, compute_type float32 and int8, intra_threads = the
CPU count, inter_threads 1: `translate_batch` with beam_size = num_beams and exactly 64 new
tokens (min_decoding_length = max_decoding_length = 64). ct2_*_agreement: the share of its
tokens equal to transformers' (the forced final EOS excluded), the lowest of the rounds.
distinct_tokens: how many different new tokens transformers' output holds; a random model often
repeats one token per row, and then token agreement says little.
The CPU's model name and vector extensions (/proc/cpuinfo flags) are printed above the table.

floor_tok_s, the roofline of the cell, per decoding step the larger of
(a) the bytes of every decoder and output weight read once (cross-attention keys/values are
    computed once per source, so their weights are not counted) at the bandwidth of a
    58101 x 512 float32 matrix-vector product timed in the same run, and
(b) the step's matmul FLOPs (batch * beams rows through those weights, plus attention over the
    cache and the source) at the float32 GEMM peak timed in the same run (JAX, 2048^3);
floor_tok_s = batch / that time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

OPUS_MT = dict(
    vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
    decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
    max_position_embeddings=512, pad_token_id=58100, eos_token_id=0,
    decoder_start_token_id=58100, activation_function="swish", scale_embedding=True,
    share_encoder_decoder_embeddings=True,
)  # fmt: skip
T5_SMALL = dict(
    vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=6,
    num_heads=8, relative_attention_num_buckets=32, relative_attention_max_distance=128,
    dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
)  # fmt: skip
T5_TINY = dict(
    T5_SMALL, vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1,
    num_heads=2, relative_attention_num_buckets=8, relative_attention_max_distance=16,
)  # fmt: skip
MODELS = ("marian", "t5", "t5-gated")
TINY = dict(
    OPUS_MT, vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1,
    encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
    decoder_ffn_dim=32, max_position_embeddings=64, pad_token_id=63,
    decoder_start_token_id=63,
)  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", required=True, help="where to write the results")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (median reported)")
    parser.add_argument("--quick", action="store_true", help="a tiny model (smoke test)")
    parser.add_argument(
        "--quantize",
        choices=("int8",),
        help="also time the project with hf.load(quantize='int8') (int8 products), interleaved",
    )
    parser.add_argument(
        "--no-ct2", dest="ct2", action="store_false", help="leave CTranslate2 out of the run"
    )
    parser.add_argument(
        "--model", choices=MODELS, default="marian", help="default: an opus-mt-size Marian"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    return args


def make_t5_checkpoint(directory: Path, sizes: dict, gated: bool) -> None:
    """A random T5 (gated: v1.1's feed-forward and a head of its own), saved with
    save_pretrained; generation from the pad id 0 to EOS 1."""
    import torch
    from transformers import GenerationConfig, T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    changes = dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False) if gated else {}
    model = T5ForConditionalGeneration(T5Config(**sizes, **changes))
    if gated:  # Flan-T5's layout: an lm_head of its own
        model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight) * 0.05)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=0, eos_token_id=1, pad_token_id=0, max_length=512
    )
    model.save_pretrained(directory)


def make_checkpoint(directory: Path, sizes: dict) -> None:
    """A random Marian model with opus-mt's generation settings, saved with save_pretrained."""
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    torch.manual_seed(0)
    model = MarianMTModel(MarianConfig(**sizes))
    pad, eos = sizes["pad_token_id"], sizes["eos_token_id"]
    model.generation_config = GenerationConfig(
        bad_words_ids=[[pad]], bos_token_id=0, decoder_start_token_id=pad, eos_token_id=eos,
        forced_eos_token_id=eos, max_length=512, num_beams=4, pad_token_id=pad,
    )  # fmt: skip
    model.save_pretrained(directory)


def roofline_weights(sizes: dict, model: str = "marian") -> tuple[int, int]:
    """(parameters read once per step, their matmul parameters): every decoder weight except
    the cross-attention key/value maps, plus the output projection and logits bias. T5: no
    biases, RMS norms (d each), heads of d_kv, two input projections when gated."""
    if model != "marian":
        d, ff, vocab = sizes["d_model"], sizes["d_ff"], sizes["vocab_size"]
        inner, layers = sizes["num_heads"] * sizes["d_kv"], sizes["num_decoder_layers"]
        inputs = 2 if model == "t5-gated" else 1
        matmul_per_layer = 6 * d * inner + (inputs + 1) * d * ff
        bias_table = sizes["relative_attention_num_buckets"] * sizes["num_heads"]
        params = layers * (matmul_per_layer + 3 * d) + bias_table + d + vocab * d
        return params, layers * matmul_per_layer + vocab * d
    d, ff, vocab = sizes["d_model"], sizes["decoder_ffn_dim"], sizes["vocab_size"]
    layers = sizes["decoder_layers"]
    linear = lambda n_in, n_out: n_in * n_out + n_out  # noqa: E731
    per_layer = 4 * linear(d, d) + 2 * linear(d, d) + linear(d, ff) + linear(ff, d) + 3 * 2 * d
    matmul_per_layer = 6 * d * d + 2 * d * ff
    return layers * per_layer + vocab * d + vocab, layers * matmul_per_layer + vocab * d


def step_flops(
    sizes: dict, rows: int, src_len: int, cache_len: int, model: str = "marian"
) -> float:
    """Matmul FLOPs of one decoding step for `rows` sequences (attention included)."""
    _, matmul_params = roofline_weights(sizes, model)
    layers = sizes["decoder_layers" if model == "marian" else "num_decoder_layers"]
    width = sizes["d_model"] if model == "marian" else sizes["num_heads"] * sizes["d_kv"]
    attention = layers * 2 * 2 * width * (cache_len + src_len)
    return 2.0 * rows * matmul_params + rows * attention


def matvec_bandwidth(repeats: int) -> float:
    """GB/s of a jitted 58101 x 512 float32 matrix-vector product (best of `repeats`)."""
    import jax
    import jax.numpy as jnp

    weight = jax.random.normal(jax.random.key(0), (58101, 512), jnp.float32)
    vector = jnp.ones((512,), jnp.float32)
    matvec = jax.jit(lambda w, v: w @ v)
    matvec(weight, vector).block_until_ready()
    best = min(_timed(lambda: matvec(weight, vector).block_until_ready()) for _ in range(repeats))
    return weight.size * 4 / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(args, argv: list[str]) -> dict:
    import jax
    import torch
    import transformers
    from transformers import AutoModelForSeq2SeqLM

    from bench import ct2_peer
    from bench.train_throughput import best_gemm_gflops
    from flax_transformer import hf

    t5 = args.model != "marian"
    if t5:
        sizes = T5_TINY if args.quick else T5_SMALL
    else:
        sizes = TINY if args.quick else OPUS_MT
    src_len, new_tokens = (8, 4) if args.quick else (32, 64)
    cells = [(1, 1), (1, 4), (8, 1), (8, 4)] if not args.quick else [(1, 1), (2, 2)]
    transformers.logging.set_verbosity_error()  # its max_length vs max_new_tokens notice
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        if t5:
            make_t5_checkpoint(Path(tmp), sizes, gated=args.model == "t5-gated")
        else:
            make_checkpoint(Path(tmp), sizes)
        flax_model = hf.load(tmp)
        int8_model = hf.load(tmp, quantize=args.quantize) if args.quantize else None
        torch_model = AutoModelForSeq2SeqLM.from_pretrained(tmp).eval()
        if t5:  # the CTranslate2 peer is written for the Marian checkpoint
            ct2_models, ct2_missing = {}, "CTranslate2 left out (a T5 model)"
        else:
            ct2_models, ct2_missing = ct2_peer.load_peers(tmp, sizes, threads, wanted=args.ct2)
    if ct2_missing:
        print(ct2_missing, file=sys.stderr, flush=True)
    rng = np.random.default_rng(0)
    sources = rng.integers(1, sizes["vocab_size"] - 1, (max(b for b, _ in cells), src_len))

    def flax_call(batch, beams):
        ids = sources[:batch]
        return flax_model.generate(
            ids, np.ones_like(ids), num_beams=beams, max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
        )  # fmt: skip

    def flax_int8_call(batch, beams):
        ids = sources[:batch]
        return int8_model.generate(
            ids, np.ones_like(ids), num_beams=beams, max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
        )  # fmt: skip

    ct2_sides = {
        side: (lambda batch, beams, peer=peer: peer.generate(sources[:batch], beams, new_tokens))
        for side, peer in ct2_models.items()
    }

    def torch_call(batch, beams):
        ids = torch.as_tensor(sources[:batch])
        with torch.inference_mode():
            out = torch_model.generate(
                ids, attention_mask=torch.ones_like(ids), num_beams=beams,
                max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            )  # fmt: skip
        return out.numpy()

    sides = {"flax": flax_call, "hf": torch_call}
    if int8_model is not None:
        sides["flax_int8"] = flax_int8_call
    sides.update(ct2_sides)
    times = {cell: {side: [] for side in sides} for cell in cells}
    same = {cell: True for cell in cells}
    distinct = {}  # distinct new tokens in transformers' output: 1 = every row repeats one token
    agree = {cell: {side: [] for side in ct2_sides} for cell in cells}
    int8_same = {cell: [] for cell in cells}  # share of project int8 tokens = project float32's
    for cell in cells:  # untimed: compilation (transformers has none; one short warm-up call)
        flax_call(*cell)
        if int8_model is not None:
            flax_int8_call(*cell)
        for call in ct2_sides.values():
            call(*cell)
    torch_model.generate(torch.as_tensor(sources[:1]), max_new_tokens=2)
    for round_index in range(args.rounds):
        for cell in cells:
            outputs = {}
            for side, call in sides.items():
                start = time.perf_counter()
                outputs[side] = call(*cell)
                times[cell][side].append(time.perf_counter() - start)
            same[cell] &= bool(np.array_equal(outputs["flax"], outputs["hf"]))
            distinct[cell] = len(np.unique(outputs["hf"][:, 1:-1]))  # no start, no forced EOS
            if int8_model is not None:
                int8_same[cell].append(
                    ct2_peer.agreement(outputs["flax"], outputs["flax_int8"][:, 1:])
                )  # both have the start token; agreement wants it on the reference only
            for side in ct2_sides:
                agree[cell][side].append(ct2_peer.agreement(outputs["hf"], outputs[side]))
            timings = ", ".join(f"{side} {times[cell][side][-1]:.2f} s" for side in sides)
            print(
                f"round {round_index + 1}/{args.rounds} batch {cell[0]} beams {cell[1]}: {timings}",
                file=sys.stderr,
                flush=True,
            )

    bandwidth = matvec_bandwidth(5 if args.quick else 20)
    gemm = best_gemm_gflops(256 if args.quick else 2048, 3 if args.quick else 5)["jax"]
    weight_bytes = roofline_weights(sizes, args.model)[0] * 4
    result_cells = []
    for batch, beams in cells:
        step_seconds = max(
            weight_bytes / (bandwidth * 1e9),
            step_flops(sizes, batch * beams, src_len, 1 + new_tokens, args.model) / (gemm * 1e9),
        )
        cell = {"batch": batch, "num_beams": beams}
        for side, samples in times[(batch, beams)].items():
            cell[f"{side}_tok_s"] = round(batch * new_tokens / statistics.median(samples), 2)
        cell["floor_tok_s"] = round(batch / step_seconds, 2)
        cell["same_tokens"] = bool(same[(batch, beams)])
        cell["distinct_tokens"] = distinct[(batch, beams)]
        for side, shares in agree[(batch, beams)].items():
            cell[f"{side}_agreement"] = round(min(shares), 4)
        if int8_same[(batch, beams)]:
            cell["flax_int8_same_as_f32"] = round(min(int8_same[(batch, beams)]), 4)
        result_cells.append(cell)
    machine = {
        "command": " ".join(["python", "-m", "bench.hf_generate", *argv]),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": threads,
        "jax": jax.__version__,
        "jax_backend": jax.default_backend(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu": ct2_peer.cpu_info(),
        "ctranslate2": ct2_peer.version(),
        "ctranslate2_skipped": ct2_missing,
        # which int8 product ran: kernels.int8_amx's kernel, or XLA's dot and why
        "int8_kernel": (_int8_kernel() if args.quantize else None),
        # which float32 product generation ran: kernels.f32_packed's kernel, or XLA's dot and why
        "f32_kernel": _f32_kernel(),
        # how beam search moved its cache: kernels.beam_reorder in place, or XLA's gather
        "reorder_kernel": _reorder_kernel(),
        "ct2_intra_threads": threads if ct2_models else None,
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        "matvec_gb_s": round(bandwidth, 2),
        "gemm_gflops": round(gemm, 2),
        "weight_bytes_per_step": weight_bytes,
        "rounds": args.rounds,
        "src_len": src_len,
        "new_tokens": new_tokens,
        "model": {
            "marian": "opus-mt-size Marian, random",
            "t5": "t5-small-size T5 (relu, tied head), random",
            "t5-gated": "t5-small-size T5 v1.1 (gated gelu_new, own head), random",
        }[args.model]
        + (" (--quick: tiny)" if args.quick else ""),
    }
    return {"cells": result_cells, "machine": machine}


def _int8_kernel() -> str:
    from flax_transformer.kernels import KERNELS

    why = KERNELS.int8.reason_unavailable()
    return "amx" if why is None else f"xla ({why})"


def _f32_kernel() -> str:
    from flax_transformer.kernels import KERNELS

    choice = KERNELS.f32.choose()
    return f"{choice.build} (packed weights)" if choice.why is None else f"xla ({choice.why})"


def _reorder_kernel() -> str:
    from flax_transformer.kernels import KERNELS

    why = KERNELS.reorder.reason_unavailable()
    return "in place (kernels.beam_reorder)" if why is None else f"XLA's gather ({why})"


def format_table(result: dict) -> str:
    """The CPU line, the table (CTranslate2's columns when it ran) and what was skipped."""
    from bench import ct2_peer

    machine = result["machine"]
    ct2 = "ct2_float32_tok_s" in result["cells"][0]
    head = ["batch", "beams", "project tok/s", "transformers tok/s"]
    if ct2:
        head += ["CT2 f32 tok/s", "CT2 int8 tok/s"]
    head += ["floor tok/s", "project / transformers", "same tokens", "distinct tokens"]
    if ct2:
        head += ["project / CT2 f32", "CT2 int8 / project", "CT2 f32 agree", "CT2 int8 agree"]
    lines = [ct2_peer.describe_cpu(machine["cpu"])]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in result["cells"]:
        row = [c["batch"], c["num_beams"], f"{c['flax_tok_s']:.1f}", f"{c['hf_tok_s']:.1f}"]
        if ct2:
            row += [f"{c['ct2_float32_tok_s']:.1f}", f"{c['ct2_int8_tok_s']:.1f}"]
        row += [f"{c['floor_tok_s']:.1f}", f"{c['flax_tok_s'] / c['hf_tok_s']:.2f}x"]
        row += ["yes" if c["same_tokens"] else "NO", c.get("distinct_tokens", "-")]
        if ct2:
            row += [
                f"{c['flax_tok_s'] / c['ct2_float32_tok_s']:.2f}x",
                f"{c['ct2_int8_tok_s'] / c['flax_tok_s']:.2f}x",
                f"{c['ct2_float32_agreement']:.1%}",
                f"{c['ct2_int8_agreement']:.1%}",
            ]
        lines.append("| " + " | ".join(str(x) for x in row) + " |")
    if "flax_int8_tok_s" in result["cells"][0]:
        lines += _int8_table(result["cells"], ct2)
        if machine.get("int8_kernel"):
            lines.append(f"int8 products: {machine['int8_kernel']}")
    if machine.get("f32_kernel"):
        lines.append(f"float32 products: {machine['f32_kernel']}")
    if machine.get("reorder_kernel"):
        lines.append(f"beam cache reorder: {machine['reorder_kernel']}")
    if machine.get("ctranslate2_skipped"):
        lines.append(machine["ctranslate2_skipped"])
    return "\n".join(lines)


def _int8_table(cells: list[dict], ct2: bool) -> list[str]:
    """The --quantize int8 rows: project int8 against project float32 and CT2 int8."""
    head = ["batch", "beams", "project f32 tok/s", "project int8 tok/s", "int8 / f32"]
    head += ["CT2 int8 tok/s", "project int8 / CT2 int8"] if ct2 else []
    head += ["int8 tokens same as f32"]
    lines = ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        row = [c["batch"], c["num_beams"], f"{c['flax_tok_s']:.1f}", f"{c['flax_int8_tok_s']:.1f}"]
        row += [f"{c['flax_int8_tok_s'] / c['flax_tok_s']:.2f}x"]
        if ct2:
            row += [
                f"{c['ct2_int8_tok_s']:.1f}",
                f"{c['flax_int8_tok_s'] / c['ct2_int8_tok_s']:.2f}x",
            ]
        row += [f"{c['flax_int8_same_as_f32']:.1%}"]
        lines.append("| " + " | ".join(str(x) for x in row) + " |")
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    result = run(args, argv)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
