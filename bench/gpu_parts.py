"""The measuring parts of bench.gpu: a bf16 GEMM peak, the training step (Flax bf16 against
torch SDPA eager and torch.compile under bf16 autocast) and Hugging Face decoding (Flax bf16
against transformers bf16 SDPA, eager and static-cache compiled). `device` is "cuda", or
"cpu" for the plumbing test (`--allow-cpu --tiny`)."""

from __future__ import annotations

import statistics
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from bench import setup
from bench.train_throughput import TimeBox, time_box

# name: (preset, overrides, (batch, src_len, tgt_len)); the scaling table's four sizes
# (docs/speed.md: train.py's default `small`, the reference, its 256 + 256 form, d_model 512
# 3+3) and the paper's base model with its 32,000-token vocabulary.
TRAIN_SIZES = {
    "small": ("small", {}, (32, 64, 64)),
    "reference": ("reference", {}, (32, 64, 64)),
    "reference_len256": ("reference", {"max_len": 256}, (8, 256, 256)),
    "d512_3x3_vocab1000": (
        "paper_base",
        {"src_vocab_size": 1000, "tgt_vocab_size": 1000, "max_len": 128}
        | {"num_encoder_layers": 3, "num_decoder_layers": 3},
        (32, 64, 64),
    ),
    "paper_base": ("paper_base", {"max_len": 128}, (32, 64, 64)),
}
TINY_SIZES = {"tiny": ("tiny", {}, (2, 8, 8))}


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _best_seconds(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def gemm_peak_tflops(device: str, n: int, repeats: int = 5) -> dict[str, float]:
    """Best of `repeats` n x n bf16 matrix products, in JAX and in torch, TFLOP/s."""
    import jax
    import jax.numpy as jnp
    import torch

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    matmul = jax.jit(jnp.matmul)
    matmul(a, a).block_until_ready()
    jax_s = _best_seconds(lambda: matmul(a, a).block_until_ready(), repeats)
    t = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    torch.matmul(t, t)
    _sync(device)
    torch_s = _best_seconds(lambda: (torch.matmul(t, t), _sync(device)), repeats)
    flops = 2 * n**3
    return {"jax": round(flops / jax_s / 1e12, 3), "torch": round(flops / torch_s / 1e12, 3)}


# ----------------------------------------------------------------------------- training
def _flax_step(cfg, batch):
    from bench.flax_step import build_flax_step, step_loss

    state, step_fn, batch_device = build_flax_step(cfg, batch)
    holder = {"state": state}

    def step() -> float:
        holder["state"], metrics = step_fn(holder["state"], batch_device)
        return step_loss(metrics)

    return step


def _torch_step(cfg, batch, device: str, compile_: bool):
    """torch_reference.Transformer with F.scaled_dot_product_attention, float32 parameters,
    bf16 autocast; the benchmark's AdamW (decay on matrices), clipping and label smoothing."""
    import torch
    import torch.nn.functional as F

    import torch_reference

    torch.manual_seed(0)
    model = torch_reference.Transformer(cfg.replace(attention_impl="fused")).to(device).train()
    optimizer = setup.torch_adamw(model)
    forward = torch.compile(model) if compile_ else model
    tensors = {k: torch.from_numpy(v).long().to(device) for k, v in batch.items()}
    targets = tensors["tgt_out"]

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            logits = forward(tensors["src"], tensors["tgt_in"])
        loss_sum = F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]),
            targets.reshape(-1),
            ignore_index=cfg.pad_id,
            label_smoothing=setup.LABEL_SMOOTHING,
            reduction="sum",
        )
        loss = loss_sum / (targets != cfg.pad_id).sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), setup.CLIP_NORM)
        optimizer.step()
        return loss.item()

    return step


def _builders(cfg32, batch: dict, device: str, with_compile: bool) -> dict:
    """variant name -> a function that builds its step (Flax computes in bf16 with float32
    parameters; torch keeps float32 parameters under bf16 autocast)."""
    builders = {
        "flax_bf16": lambda: _flax_step(cfg32.replace(dtype="bfloat16"), batch),
        "torch_sdpa_eager": lambda: _torch_step(cfg32, batch, device, False),
    }
    if with_compile:
        builders["torch_sdpa_compile"] = lambda: _torch_step(cfg32, batch, device, True)
    return builders


def _interleave(steps: dict, times: dict, rounds: int, repeats: int) -> None:
    for _ in range(rounds):
        for name, step in steps.items():
            for _ in range(repeats):
                start = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)


def train_rows(args, device: str) -> Iterator[dict]:
    """One row per size in args.sizes, yielded as it is measured: every variant's median step,
    tokens/s and losses (or its error)."""
    known = TINY_SIZES if args.tiny else TRAIN_SIZES
    for size in args.sizes:
        name, overrides, (batch_size, src_len, tgt_len) = known[size]
        cfg32 = setup.bench_config(name, "float32", setup.DROPOUT, **overrides)
        batch = setup.make_batch(cfg32, batch_size, src_len, tgt_len)
        steps, out = {}, {}
        for variant, build in _builders(cfg32, batch, device, not args.skip_compile).items():
            limit = args.compile_timeout if variant.endswith("compile") else 0
            start = time.perf_counter()
            try:
                with time_box(limit):
                    step = build()
                    first = step()  # compiles
                    step()
            except (TimeBox, Exception) as err:  # recorded; the other variants still run
                out[variant] = {"error": f"{type(err).__name__}: {err}"[:500]}
                out[variant]["traceback"] = traceback.format_exc(limit=3)[-1500:]
                continue
            steps[variant] = step
            out[variant] = {"setup_s": round(time.perf_counter() - start, 1), "first_loss": first}
        times = {variant: [] for variant in steps}
        _interleave(steps, times, args.rounds, args.steps)
        tokens = batch_size * (src_len + tgt_len)
        for variant, samples in times.items():
            median = statistics.median(samples)
            out[variant] |= {
                "median_ms": round(median * 1e3, 3),
                "min_ms": round(min(samples) * 1e3, 3),
                "n": len(samples),
                "tok_s": round(tokens / median, 1),
                "last_loss": steps[variant](),
            }
        steps.clear()
        yield {
            "size": size,
            "config": {k: cfg32.to_dict()[k] for k in ("d_model", "num_heads", "d_ff")}
            | {"layers": cfg32.num_encoder_layers, "vocab": cfg32.tgt_vocab_size},
            "batch": {"batch": batch_size, "src_len": src_len, "tgt_len": tgt_len},
            "tokens_per_step": tokens,
            "model_flops_per_step": setup.model_flops_per_step(cfg32, batch_size, src_len, tgt_len),
            "variants": out,
        }


# ----------------------------------------------------------------------------- decoding
def decode_cells(args, device: str) -> list[dict]:
    """bench.hf_generate's cells in bf16: tok/s per side and agreement with eager torch."""
    import torch
    import transformers
    from transformers import MarianMTModel

    from bench.hf_generate import OPUS_MT, TINY, make_checkpoint
    from flax_transformer import hf

    transformers.logging.set_verbosity_error()  # its max_length vs max_new_tokens notice
    sizes = TINY if args.tiny else OPUS_MT
    src_len, new_tokens = (8, 4) if args.tiny else (32, 64)
    cells = [(1, 1), (2, 2)] if args.tiny else [(1, 1), (1, 4), (8, 1), (8, 4)]
    with tempfile.TemporaryDirectory() as tmp:
        make_checkpoint(Path(tmp), sizes)
        flax_model = hf.load(tmp, dtype="bfloat16")
        torch_model = MarianMTModel.from_pretrained(
            tmp, dtype=torch.bfloat16, attn_implementation="sdpa"
        )
    torch_model = torch_model.to(device).eval()
    sources = np.random.default_rng(0).integers(
        1, sizes["vocab_size"] - 1, (max(b for b, _ in cells), src_len)
    )
    common = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens)

    def flax_call(batch, beams):
        ids = sources[:batch]
        return flax_model.generate(ids, np.ones_like(ids), num_beams=beams, **common)

    def torch_call(batch, beams, **extra):
        ids = torch.as_tensor(sources[:batch], device=device)
        with torch.inference_mode():
            out = torch_model.generate(
                ids, attention_mask=torch.ones_like(ids), num_beams=beams, **common, **extra
            )
        return out.cpu().numpy()

    sides = {"flax_bf16": flax_call, "torch_sdpa_eager": torch_call}
    if not args.skip_compile:
        sides["torch_sdpa_static_compile"] = lambda b, k: torch_call(
            b, k, cache_implementation="static"
        )
    errors: dict[str, str] = {}
    for cell in cells:  # untimed: compilation (and torch's warm-up)
        for side, call in list(sides.items()):
            try:
                with time_box(args.compile_timeout if "compile" in side else 0):
                    call(*cell)
            except (TimeBox, Exception) as err:
                errors[side] = f"{type(err).__name__}: {err}"[:500]
                del sides[side]
    times = {cell: {side: [] for side in sides} for cell in cells}
    agree = {cell: {side: [] for side in sides} for cell in cells}
    for _ in range(args.rounds):
        for cell in cells:
            outputs = {}
            for side, call in sides.items():
                start = time.perf_counter()
                outputs[side] = call(*cell)
                times[cell][side].append(time.perf_counter() - start)
            for side, tokens in outputs.items():
                agree[cell][side].append(_agreement(outputs["torch_sdpa_eager"], tokens))
    result = []
    for batch, beams in cells:
        row = {"batch": batch, "num_beams": beams}
        for side, samples in times[(batch, beams)].items():
            row[f"{side}_tok_s"] = round(batch * new_tokens / statistics.median(samples), 2)
            row[f"{side}_agreement"] = round(min(agree[(batch, beams)][side]), 4)
        row |= {f"{side}_error": error for side, error in errors.items()}
        result.append(row)
    return result


def _agreement(reference: np.ndarray, tokens: np.ndarray) -> float:
    """Share of positions with the same token (over the shorter of the two outputs)."""
    n = min(reference.shape[1], tokens.shape[1])
    return float(np.mean(reference[:, :n] == tokens[:, :n]))
