"""Generation speed of a decoder-only LLM of Qwen2.5-0.5B's shape: this project against
transformers and CTranslate2, float32 and int8.

    python -m bench.llm_generate --json OUT.json [--rounds 3] [--batches 1 8] [--new-tokens 128]
        [--quick] [--no-ct2] [--layers N --d-model N --heads N --kv-heads N --d-ff N --vocab N]

A random Qwen2 model (transformers' Qwen2Config: 24 layers, d 896, 14 heads of 64, 2 KV heads,
d_ff 4864, vocab 151936, tied embeddings, rope_theta 1e6, q/k/v biases; the size flags shrink
it, --quick is a tiny one for the test suite) is written with save_pretrained to a temporary
directory and loaded by every side:
- flax: `hf.load(dir)` and its `generate` (float32);
- flax_int8: `hf.load(dir, quantize="int8")` (int8 weights per output channel, activations
  quantised per row at run time);
- hf: transformers' `Qwen2ForCausalLM.from_pretrained(dir).generate` (float32, torch threads =
  the CPU count);
- hf_int8: the same model through torch's dynamic quantisation (`quantize_dynamic` of every
  nn.Linear, the tied head included, to qint8: int8 weights per tensor, activations quantised
  at run time; the embedding lookup stays float32);
- ct2_float32 / ct2_int8 (optional: the `bench` extra): CTranslate2's own TransformersConverter
  (bench/ct2_peer.py), a Generator with compute_type float32 / int8 (int8 weights per output
  channel, activations quantised at run time), intra_threads = the CPU count.
Every cell (batch 1 and 8) greedy-generates exactly `--new-tokens` tokens per row after random
prompts of 16-32 tokens (ragged: left-padded for the project and transformers, as lists for
CTranslate2); EOS is suppressed until then on every side (min_new_tokens = max_new_tokens;
CTranslate2: min_length = max_length). Each side runs each cell once untimed (compilation,
warm-up); then every round times every cell on every side in turn (interleaved: a noisy
neighbour slows all alike). tokens/s = batch * new tokens / seconds per call; the min and the
median time over the rounds are reported, with the load average at the start, after each round
and at the end. same_tokens: the project's float32 array equals transformers' in every round;
*_agreement: the lowest share over the rounds of new tokens equal to transformers' float32
(flax_int8_agreement: to the project's float32). distinct_tokens: different new tokens in
transformers' output (a random model often repeats a few). The CPU's model name and vector
extensions are printed above the table.
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

QWEN25_05B = dict(
    vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
    num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
    rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
    max_window_layers=24, bos_token_id=151643, eos_token_id=151643,
)  # fmt: skip
QUICK = dict(
    QWEN25_05B, vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    max_window_layers=2, bos_token_id=255, eos_token_id=255,
)  # fmt: skip
# Flag -> Qwen2Config field, for a smaller (or other) shape.
SHAPE_FLAGS = {
    "layers": "num_hidden_layers",
    "d_model": "hidden_size",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "d_ff": "intermediate_size",
    "vocab": "vocab_size",
}
# The std of the random weights: transformers' default 0.02 makes a tied model echo its last
# prompt token forever; 0.05 gives varied continuations (distinct_tokens in the result).
INIT_STD = 0.05
SIDE_CHOICES = ("flax", "hf", "flax_int8", "hf_int8", "ct2", "flax_int8_xla")
DEFAULT_SIDES = SIDE_CHOICES[:5]
PROMPT_LENGTHS = (16, 32)  # each prompt's length drawn from this range (inclusive)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", required=True, help="where to write the results")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (min and median)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="batch sizes")
    parser.add_argument(
        "--new-tokens", type=int, help="tokens generated per row (default 128; --quick: 8)"
    )
    parser.add_argument("--quick", action="store_true", help="a tiny model (smoke test)")
    parser.add_argument(
        "--sides", nargs="+", choices=SIDE_CHOICES, default=list(DEFAULT_SIDES),
        help=f"which engines run (default: {' '.join(DEFAULT_SIDES)}; ct2: float32 and int8; "
        "flax_int8_xla: the project's int8 on XLA's dot, FLAX_TRANSFORMER_INT8_KERNEL=xla)",
    )  # fmt: skip
    parser.add_argument(
        "--no-ct2", dest="ct2", action="store_false", help="leave CTranslate2 out of the run"
    )
    for flag, field in SHAPE_FLAGS.items():
        parser.add_argument(
            "--" + flag.replace("_", "-"), type=int, help=f"{field} (default: Qwen2.5-0.5B's)"
        )
    args = parser.parse_args(argv)
    for name in ("rounds", "new_tokens", *SHAPE_FLAGS):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if not args.ct2:
        args.sides = [side for side in args.sides if side != "ct2"]
    if args.new_tokens is None:
        args.new_tokens = 8 if args.quick else 128
    if min(args.batches) < 1:
        parser.error(f"--batches must be >= 1, got {args.batches}")
    return args


def model_sizes(args: argparse.Namespace) -> dict:
    """Qwen2Config's keyword arguments: Qwen2.5-0.5B's (or --quick's tiny ones) with the size
    flags applied; EOS and BOS the last id. A ValueError naming the flags for a bad shape."""
    sizes = dict(QUICK if args.quick else QWEN25_05B)
    for flag, field in SHAPE_FLAGS.items():
        if getattr(args, flag) is not None:
            sizes[field] = getattr(args, flag)
    sizes["max_window_layers"] = sizes["num_hidden_layers"]
    if args.vocab is not None:
        sizes["bos_token_id"] = sizes["eos_token_id"] = args.vocab - 1
    heads, kv = sizes["num_attention_heads"], sizes["num_key_value_heads"]
    if sizes["hidden_size"] % heads or heads % kv:
        raise ValueError(
            f"--d-model {sizes['hidden_size']} must divide by --heads {heads}, and --heads by "
            f"--kv-heads {kv}"
        )
    if sizes["vocab_size"] < 8:
        vocab = sizes["vocab_size"]
        raise ValueError(f"--vocab must be >= 8 (prompts avoid the special ids), got {vocab}")
    return sizes


def make_checkpoint(directory: Path, sizes: dict) -> None:
    """A random Qwen2 model of `sizes` (normal weights of std INIT_STD, norms 1, biases
    random too), saved with save_pretrained; EOS = BOS = sizes' eos_token_id."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**sizes, initializer_range=INIT_STD))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):  # Qwen2's q/k/v biases: transformers starts them at 0
                param.normal_(0.0, INIT_STD)
    eos = sizes["eos_token_id"]
    model.generation_config = GenerationConfig(bos_token_id=eos, eos_token_id=eos)
    model.save_pretrained(directory)


def make_prompts(batch: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """`batch` random prompts of PROMPT_LENGTHS tokens (below the special ids at the top)."""
    rng = np.random.default_rng(seed)
    low, high = PROMPT_LENGTHS
    return [
        rng.integers(0, vocab - 4, int(rng.integers(low, high + 1))).tolist() for _ in range(batch)
    ]


def left_padded(prompts: list[list[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask) of the prompts left-padded to the longest."""
    width = max(map(len, prompts))
    ids = np.full((len(prompts), width), pad, np.int64)
    mask = np.zeros((len(prompts), width), np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = prompt
        mask[row, width - len(prompt) :] = 1
    return ids, mask


def ct2_names(vocab: int, eos: int) -> list[str]:
    """The stand-in vocabulary for CTranslate2: EOS at `eos`, UNK and PAD just below it."""
    from bench import ct2_peer

    return ct2_peer.token_names(vocab, eos=eos, pad=eos - 1, unk=eos - 2)


def load_ct2(hf_dir: str, sizes: dict, threads: int, wanted: bool) -> tuple[dict, str | None]:
    """({"ct2_float32": peer, "ct2_int8": peer}, None) or ({}, why not)."""
    from bench import ct2_peer

    why = None if wanted else "CTranslate2 left out (--no-ct2)"
    why = why or ct2_peer.missing()
    if why:
        return {}, why
    names = ct2_names(sizes["vocab_size"], sizes["eos_token_id"])
    converted = ct2_peer.convert(hf_dir, Path(hf_dir) / "ct2", names)
    peers = {
        f"ct2_{kind}": ct2_peer.CT2GeneratorPeer(converted, names, kind, threads)
        for kind in ct2_peer.COMPUTE_TYPES
    }
    return peers, None


def share_equal(reference: np.ndarray, other: np.ndarray) -> float:
    """Share of positions where two (batch, new_tokens) arrays agree."""
    return float(np.mean(np.asarray(reference) == np.asarray(other)))


def run(args, argv: list[str]) -> dict:
    import jax
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from bench import ct2_peer
    from flax_transformer import hf

    sizes = model_sizes(args)
    new_tokens = args.new_tokens
    transformers.logging.set_verbosity_error()
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    load_start = os.getloadavg()
    eos = sizes["eos_token_id"]
    with tempfile.TemporaryDirectory() as tmp:
        make_checkpoint(Path(tmp), sizes)
        wanted = set(args.sides)
        flax_model = hf.load(tmp) if "flax" in wanted else None
        flax_int8 = hf.load(tmp, quantize="int8") if "flax_int8" in wanted else None
        flax_int8_xla = _int8_on_xla(tmp) if "flax_int8_xla" in wanted else None
        torch_model = None
        if "hf" in wanted:
            torch_model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
        torch_int8 = _torch_int8(tmp) if "hf_int8" in wanted else None
        ct2_models, ct2_missing = load_ct2(tmp, sizes, threads, "ct2" in wanted)
    if ct2_missing:
        print(ct2_missing, file=sys.stderr, flush=True)
    vocab = sizes["vocab_size"]
    prompts = {batch: make_prompts(batch, vocab, seed=batch) for batch in args.batches}
    padded = {batch: left_padded(p, eos) for batch, p in prompts.items()}

    def project(model):
        def call(batch):
            ids, mask = padded[batch]
            out = model.generate(
                ids, mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                do_sample=False, num_beams=1,
            )  # fmt: skip
            return np.asarray(out)[:, ids.shape[1] :]

        return call

    def torch_side(model):
        def call(batch, tokens=new_tokens):
            ids, mask = (torch.as_tensor(a) for a in padded[batch])
            with torch.inference_mode():
                out = model.generate(
                    ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                    do_sample=False, num_beams=1, pad_token_id=eos,
                )  # fmt: skip
            return out.numpy()[:, ids.shape[1] :]

        return call

    models = {"flax": flax_model, "flax_int8": flax_int8, "flax_int8_xla": flax_int8_xla}
    sides = {side: project(model) for side, model in models.items() if model is not None}
    for side, model in (("hf", torch_model), ("hf_int8", torch_int8)):
        if model is not None:
            sides[side] = torch_side(model)
    for side, peer in ct2_models.items():
        sides[side] = lambda batch, tokens=new_tokens, peer=peer: peer.generate(
            prompts[batch], tokens
        )
    for batch in args.batches:  # untimed: the project compiles (for this length); others warm up
        for side, call in sides.items():
            call(batch) if side.startswith("flax") else call(batch, 2)
    times = {batch: {side: [] for side in sides} for batch in args.batches}
    reference = {side: "flax" if side.startswith("flax_int8") else "hf" for side in sides}
    compared = [s for s in sides if s not in ("flax", "hf") and reference[s] in sides]
    agree = {batch: {side: [] for side in compared} for batch in args.batches}
    same = dict.fromkeys(args.batches, True)
    distinct, loads = {}, []
    for round_index in range(args.rounds):
        for batch in args.batches:
            outputs = {}
            for side, call in sides.items():
                start = time.perf_counter()
                outputs[side] = call(batch)
                times[batch][side].append(time.perf_counter() - start)
            if "flax" in sides and "hf" in sides:
                same[batch] &= bool(np.array_equal(outputs["flax"], outputs["hf"]))
            first = outputs.get("hf", next(iter(outputs.values())))
            distinct[batch] = len(np.unique(first))
            for side in agree[batch]:
                agree[batch][side].append(share_equal(outputs[reference[side]], outputs[side]))
            timings = ", ".join(f"{side} {times[batch][side][-1]:.2f} s" for side in sides)
            print(
                f"round {round_index + 1}/{args.rounds} batch {batch}: {timings}",
                file=sys.stderr,
                flush=True,
            )
        loads.append(os.getloadavg()[0])
    cells = []
    for batch in args.batches:
        cell = {"batch": batch}
        for side, samples in times[batch].items():
            cell[f"{side}_tok_s"] = round(batch * new_tokens / statistics.median(samples), 2)
            cell[f"{side}_tok_s_best"] = round(batch * new_tokens / min(samples), 2)
        cell["same_tokens"] = same[batch] if "flax" in sides and "hf" in sides else None
        cell["distinct_tokens"] = distinct[batch]
        for side, shares in agree[batch].items():
            cell[f"{side}_agreement"] = round(min(shares), 4)
        cell["prompt_lengths"] = [len(p) for p in prompts[batch]]
        cells.append(cell)
    machine = {
        "command": " ".join(["python", "-m", "bench.llm_generate", *argv]),
        "platform": platform.platform(),
        "cpu_count": threads,
        "cpu": ct2_peer.cpu_info(),
        "jax": jax.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "transformers": transformers.__version__,
        "ctranslate2": ct2_peer.version(),
        "ctranslate2_skipped": ct2_missing,
        "f32_kernel": _kernel_line("f32"),
        "int8_kernel": _kernel_line("int8"),
        "sides": list(sides),
        "hf_int8": "torch quantize_dynamic (qint8, nn.Linear incl. the head)"
        if torch_int8 is not None
        else None,
        "loadavg_start": load_start,
        "loadavg_after_rounds": loads,
        "loadavg_end": os.getloadavg(),
        "rounds": args.rounds,
        "new_tokens": new_tokens,
        "model": ("tiny Qwen2 (--quick)" if args.quick else "Qwen2 of Qwen2.5-0.5B's shape")
        + ", random",
        "sizes": sizes,
    }
    return {"cells": cells, "machine": machine}


def _int8_on_xla(path: str):
    """The project's int8 model with its products on XLA's int8 dot (the kernels' switch at
    xla while it is packed; a plain Int8Matrix then runs XLA's dot whatever the switch)."""
    from flax_transformer import hf
    from flax_transformer.kernels import KERNELS

    before = os.environ.get(KERNELS.int8.variable)
    os.environ[KERNELS.int8.variable] = "xla"
    try:
        return hf.load(path, quantize="int8")
    finally:
        if before is None:
            del os.environ[KERNELS.int8.variable]
        else:
            os.environ[KERNELS.int8.variable] = before


def _torch_int8(path: str):
    """transformers' model under torch's dynamic int8 quantisation of every nn.Linear."""
    import warnings

    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with warnings.catch_warnings():  # torch's deprecation notice of quantized tensors
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, torch.qint8)


def _kernel_line(which: str) -> str:
    """Which product generation ran: the packed-weight kernel, or XLA's dot and why."""
    from flax_transformer.kernels import KERNELS

    if which == "f32":
        choice = KERNELS.f32.choose()
        return f"{choice.build} (packed weights)" if choice.why is None else f"xla ({choice.why})"
    choice = KERNELS.int8.choose()
    return f"{choice.build} (packed weights)" if choice.why is None else f"xla ({choice.why})"


SIDES = (
    ("flax", "project f32"),
    ("hf", "transformers f32"),
    ("ct2_float32", "CT2 f32"),
    ("flax_int8", "project int8"),
    ("flax_int8_xla", "project int8 on XLA's dot"),
    ("hf_int8", "torch dyn. int8"),
    ("ct2_int8", "CT2 int8"),
)


def format_table(result: dict) -> str:
    """The CPU line and one table: tokens/s (median, best in brackets) per side and cell, the
    project's ratio to CTranslate2 in each dtype, tokens identical to transformers."""
    from bench import ct2_peer

    cells, machine = result["cells"], result["machine"]
    sides = [(key, name) for key, name in SIDES if f"{key}_tok_s" in cells[0]]
    head = ["batch", *(f"{name} tok/s" for _, name in sides)]
    ct2 = "ct2_float32_tok_s" in cells[0] and "flax_tok_s" in cells[0]
    ct2 = ct2 and "flax_int8_tok_s" in cells[0]
    if ct2:
        head += ["project / CT2 f32", "project / CT2 int8"]
    head += ["same tokens as transformers (f32)", "distinct tokens"]
    lines = [ct2_peer.describe_cpu(machine["cpu"])]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        row = [c["batch"]]
        row += [f"{c[f'{key}_tok_s']:.1f} ({c[f'{key}_tok_s_best']:.1f})" for key, _ in sides]
        if ct2:
            row += [
                f"{c['flax_tok_s'] / c['ct2_float32_tok_s']:.2f}x",
                f"{c['flax_int8_tok_s'] / c['ct2_int8_tok_s']:.2f}x",
            ]
        same = {True: "yes", False: "NO", None: "-"}[c["same_tokens"]]
        row += [same, c["distinct_tokens"]]
        lines.append("| " + " | ".join(str(x) for x in row) + " |")
    agreements = [
        f"{key} {c[f'{key}_agreement']:.1%} (batch {c['batch']})"
        for c in cells
        for key, _ in sides
        if f"{key}_agreement" in c
    ]
    lines.append("token agreement: " + ", ".join(agreements))
    lines.append(f"float32 products: {machine['f32_kernel']}; int8: {machine['int8_kernel']}")
    lines.append(
        f"load average: {machine['loadavg_start'][0]:.2f} at the start, "
        f"{', '.join(f'{x:.2f}' for x in machine['loadavg_after_rounds'])} after each round"
    )
    if machine.get("ctranslate2_skipped"):
        lines.append(machine["ctranslate2_skipped"])
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    try:
        model_sizes(args)
    except ValueError as err:
        print(f"bench.llm_generate: {err}", file=sys.stderr)
        return 2
    result = run(args, argv)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
