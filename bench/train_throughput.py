"""Training throughput: the Flax jitted train step against three PyTorch variants, one process.

    python -m bench.train_throughput --json OUT.json [--quick] [--steps N] [--rounds R]
        [--preset tiny|small|reference|paper_base] [--d-model D] [--heads H] [--layers L]
        [--d-ff F] [--vocab V] [--max-len M] [--batch B] [--src-len S] [--tgt-len T]
        [--variants flax,torch_eager,...] [--skip-compile]

The model is a preset of flax_transformer.spec.presets (default `reference`: d_model 256,
4 heads, 3+3 layers, d_ff 1024, vocab 1000), with any size flag overriding it; the batch is
B x (S source + T target) tokens (default 32 x (64 + 64)); dropout is 0.1 unless --dropout.

Same config, batch and AdamW hyper-parameters for every variant:
- flax: the jitted train step (forward, backward, clip, AdamW), state donated;
- flax_remat: the same with config.remat=True (blocks rematerialised in the backward pass);
- torch_eager: torch_reference.Transformer, eager;
- torch_compile: the same under torch.compile (time-boxed; a failure is recorded, not hidden);
- nn_transformer_eager: a model built on torch.nn.Transformer of the same sizes.

Timing is interleaved: each round times `--steps` steps of every variant in turn, so a noisy
neighbour on a shared machine slows all variants alike; the reported step time is the median of
all timed steps. Tokens per step = batch * (src_len + tgt_len).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import resource
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from bench.ct2_peer import cpu_info, describe_cpu
from bench.setup import (
    ADAM_EPS,
    BETAS,
    CLIP_NORM,
    DROPOUT,
    LABEL_SMOOTHING,
    LEARNING_RATE,
    QUICK_BATCH,
    REFERENCE_BATCH,
    WEIGHT_DECAY,
    bench_config,
    make_batch,
    model_flops_per_step,
    torch_adamw,
)
from flax_transformer.spec.config import TransformerConfig
from flax_transformer.spec.presets import PRESETS
from flax_transformer.training.host_memory import reexec_with_tuned_malloc


# ----------------------------------------------------------------------------- measuring
class PhaseMemory:
    """Peak resident memory of one phase: resets the kernel's high-water mark (VmHWM) at the
    start where Linux allows it; else falls back to getrusage's process-wide maxrss."""

    def __enter__(self):
        self.reset = False
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")
            self.reset = True
        return self

    def __exit__(self, *exc):
        self.peak_mib = _vm_hwm_mib() if self.reset else None
        if self.peak_mib is None:
            self.peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return False


def _vm_hwm_mib() -> float | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None


def best_gemm_gflops(n: int, repeats: int) -> dict[str, float]:
    """Best of `repeats` n x n float32 GEMMs, in JAX and in PyTorch."""
    import jax
    import jax.numpy as jnp
    import torch

    flops = 2 * n**3
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()
    jax_best = min(_timed(lambda: matmul(a, b).block_until_ready()) for _ in range(repeats))
    ta, tb = torch.randn(n, n), torch.randn(n, n)
    torch.matmul(ta, tb)
    torch_best = min(_timed(lambda: torch.matmul(ta, tb)) for _ in range(repeats))
    return {"jax": flops / jax_best / 1e9, "torch": flops / torch_best / 1e9}


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class TimeBox(Exception):
    pass


@contextlib.contextmanager
def time_box(seconds: int):
    """Raise TimeBox in the main thread after `seconds` (0 = no limit)."""
    if seconds <= 0 or not hasattr(signal, "SIGALRM"):
        yield
        return

    def _raise(signum, frame):
        raise TimeBox(f"did not finish within {seconds} s")

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ----------------------------------------------------------------------------- variants
class Variant:
    """A named train step: `step()` runs one synchronised step and returns the loss."""

    def __init__(self, name: str, step: Callable[[], float], extra: dict | None = None):
        self.name, self.step, self.extra = name, step, extra or {}
        self.times: list[float] = []
        self.first_loss: float | None = None
        self.last_loss: float | None = None


def flax_variant(name: str, cfg: TransformerConfig, batch: dict) -> Variant:
    from bench.flax_step import build_flax_step, step_loss

    state, step_fn, batch_device = build_flax_step(cfg, batch)
    holder = {"state": state}
    compiled = step_fn.lower(state, batch_device).compile()
    extra = {}
    with contextlib.suppress(Exception):
        mem = compiled.memory_analysis()
        extra["xla_temp_mib"] = mem.temp_size_in_bytes / 2**20
        extra["xla_argument_mib"] = mem.argument_size_in_bytes / 2**20

    def step() -> float:
        holder["state"], metrics = compiled(holder["state"], batch_device)
        return step_loss(metrics)

    return Variant(name, step, extra)


def _no_phase(name: str):
    return contextlib.nullcontext()


def torch_variant(name: str, model, batch: dict, forward, phase=_no_phase) -> Variant:
    """A torch training step (forward, loss, backward, clip, AdamW); `phase(name)` wraps each
    of the five (bench.profile_vs_torch passes torch.profiler.record_function)."""
    import torch
    import torch.nn.functional as F

    optimizer = torch_adamw(model)
    tensors = {k: torch.from_numpy(v).long() for k, v in batch.items()}
    pad_id = 0
    model.train()

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        with phase("forward"):
            logits = forward(model, tensors["src"], tensors["tgt_in"])
        targets = tensors["tgt_out"]
        with phase("loss"):
            loss_sum = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(),
                targets.reshape(-1),
                ignore_index=pad_id,
                label_smoothing=LABEL_SMOOTHING,
                reduction="sum",
            )
            loss = loss_sum / (targets != pad_id).sum()
        with phase("backward"):
            loss.backward()
        with phase("clip"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        with phase("optimizer"):
            optimizer.step()
        return loss.item()

    return Variant(name, step)


def torch_reference_variant(name: str, cfg: TransformerConfig, batch: dict, compile_: bool):
    import torch

    import torch_reference

    torch.manual_seed(0)
    model = torch_reference.Transformer(cfg)
    if compile_:
        model = torch.compile(model)
    return torch_variant(name, model, batch, lambda m, src, tgt: m(src, tgt))


def nn_transformer_variant(cfg: TransformerConfig, batch: dict) -> Variant:
    import torch

    from bench.nn_transformer_model import NNTransformerModel

    torch.manual_seed(0)
    model = NNTransformerModel(cfg)
    return torch_variant("nn_transformer_eager", model, batch, lambda m, src, tgt: m(src, tgt))


# ----------------------------------------------------------------------------- driver
def run(args: argparse.Namespace) -> dict:
    import jax
    import torch

    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    cfg, batch_size, src_len, tgt_len = args.config, args.batch, args.src_len, args.tgt_len
    gemm_n, gemm_repeats = (256, 3) if args.quick else (2048, 5)
    batch = make_batch(cfg, batch_size, src_len, tgt_len)
    tokens_per_step = batch_size * (src_len + tgt_len)
    flops = model_flops_per_step(cfg, batch_size, src_len, tgt_len)

    result: dict = {
        "preset": args.preset,
        "config": cfg.to_dict(),
        "batch": {"batch": batch_size, "src_len": src_len, "tgt_len": tgt_len},
        "tokens_per_step": tokens_per_step,
        "model_flops_per_step": flops,
        "optimizer": {
            "lr": LEARNING_RATE,
            "betas": BETAS,
            "eps": ADAM_EPS,
            "weight_decay": WEIGHT_DECAY,
            "clip_norm": CLIP_NORM,
            "label_smoothing": LABEL_SMOOTHING,
        },
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu": cpu_info(),  # model name, family/model, vector extensions
            "cpu_count": threads,
            "jax_backend": jax.default_backend(),
            "jax_devices": [str(d) for d in jax.devices()],
            "torch_threads": torch.get_num_threads(),
            "jax": jax.__version__,
            "torch": torch.__version__,
            "loadavg_start": os.getloadavg(),
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
        },
        "quick": args.quick,
    }

    gemm = best_gemm_gflops(gemm_n, gemm_repeats)
    result["matmul_gflops"] = {"n": gemm_n, **gemm}
    result["peak_matmul_gflops"] = max(gemm.values())

    builders: list[tuple[str, Callable[[], Variant]]] = [
        ("flax", lambda: flax_variant("flax", cfg, batch)),
        ("flax_remat", lambda: flax_variant("flax_remat", cfg.replace(remat=True), batch)),
        ("torch_eager", lambda: torch_reference_variant("torch_eager", cfg, batch, False)),
        ("nn_transformer_eager", lambda: nn_transformer_variant(cfg, batch)),
        ("torch_compile", lambda: torch_reference_variant("torch_compile", cfg, batch, True)),
    ]
    builders = [b for b in builders if b[0] in args.variants]
    if "torch_compile" not in args.variants:
        result["torch_compile_error"] = "skipped (not in --variants)"
    elif args.skip_compile or args.quick:
        result["torch_compile_error"] = "skipped (--skip-compile or --quick)"
        builders = [b for b in builders if b[0] != "torch_compile"]
    if cfg.dtype != "float32":
        # The torch twins train in float32 here; a bf16 run compares Flax with itself only.
        builders = [b for b in builders if b[0].startswith("flax")]
    result["variants"] = [name for name, _ in builders]

    variants: list[Variant] = []
    memory: dict[str, dict] = {}
    setup_seconds: dict[str, float] = {}
    for name, build in builders:
        start = time.perf_counter()
        limit = args.compile_timeout if name == "torch_compile" else 0
        try:
            with PhaseMemory() as mem, time_box(limit):
                variant = build()
                for _ in range(args.warmup):
                    loss = variant.step()
                    variant.first_loss = loss if variant.first_loss is None else variant.first_loss
        except (TimeBox, Exception) as err:  # recorded honestly, the others still run
            result[f"{name}_error"] = f"{type(err).__name__}: {err}"
            if not isinstance(err, TimeBox):
                result[f"{name}_traceback"] = traceback.format_exc(limit=5)
            print(f"[{name}] failed: {err}", file=sys.stderr)
            continue
        setup_seconds[name] = time.perf_counter() - start
        memory[name] = {"setup_peak_rss_mib": mem.peak_mib, **variant.extra}
        variants.append(variant)
        print(f"[{name}] ready in {setup_seconds[name]:.1f} s", file=sys.stderr)

    for _ in range(args.rounds):
        for variant in variants:
            with PhaseMemory() as mem:
                for _ in range(args.steps):
                    start = time.perf_counter()
                    variant.last_loss = variant.step()
                    variant.times.append(time.perf_counter() - start)
            previous = memory[variant.name].get("step_peak_rss_mib", 0.0)
            memory[variant.name]["step_peak_rss_mib"] = max(previous, mem.peak_mib)

    result["setup_seconds"] = setup_seconds
    result["memory"] = memory
    result["step_ms"] = {}
    result["losses"] = {}
    for variant in variants:
        median = statistics.median(variant.times)
        result["step_ms"][variant.name] = {
            "median": median * 1e3,
            "min": min(variant.times) * 1e3,
            "max": max(variant.times) * 1e3,
            "n": len(variant.times),
        }
        result[f"{variant.name}_tok_s"] = tokens_per_step / median
        result["losses"][variant.name] = {"first": variant.first_loss, "last": variant.last_loss}
    for key in ("torch_compile_tok_s",):
        result.setdefault(key, None)

    if "flax_tok_s" in result:
        achieved = flops / result["step_ms"]["flax"]["median"] * 1e3
        result["flax_achieved_gflops"] = achieved / 1e9
        result["flax_mfu"] = achieved / 1e9 / result["peak_matmul_gflops"]
        torch_rates = {
            k[: -len("_tok_s")]: v
            for k, v in result.items()
            if k.endswith("_tok_s") and k.startswith(("torch", "nn_")) and v
        }
        if torch_rates:
            fastest = max(torch_rates, key=torch_rates.get)
            result["fastest_torch_variant"] = fastest
            result["flax_speedup_vs_fastest_torch"] = result["flax_tok_s"] / torch_rates[fastest]
    result["machine"]["loadavg_end"] = os.getloadavg()
    return result


def format_table(result: dict) -> str:
    rows = ["| variant | step ms (median) | tokens/s | vs fastest torch |", "|---|---:|---:|---:|"]
    fastest = result.get("fastest_torch_variant")
    base = result.get(f"{fastest}_tok_s") if fastest else None
    for name, stats in result["step_ms"].items():
        rate = result[f"{name}_tok_s"]
        ratio = f"{rate / base:.2f}x" if base else "-"
        rows.append(f"| {name} | {stats['median']:.1f} | {rate:,.0f} | {ratio} |")
    if result.get("torch_compile_tok_s") is None and "torch_compile_error" in result:
        rows.append(f"| torch_compile | - | failed: {result['torch_compile_error'][:60]} | - |")
    return "\n".join(rows)


VARIANTS = ("flax", "flax_remat", "torch_eager", "nn_transformer_eager", "torch_compile")

# Size flags -> TransformerConfig fields they set (--layers and --vocab set two each).
SIZE_FLAGS = {
    "d_model": ("d_model",),
    "heads": ("num_heads",),
    "layers": ("num_encoder_layers", "num_decoder_layers"),
    "d_ff": ("d_ff",),
    "vocab": ("src_vocab_size", "tgt_vocab_size"),
    "max_len": ("max_len",),
}


def parse_args(argv=None) -> argparse.Namespace:
    """Flags, with `config` (the preset plus size overrides) and the batch shape resolved."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run (seconds): tiny preset, batch 2 x (8 + 8)"
    )
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps after compiling")
    size = parser.add_argument_group("model and batch (size flags override the preset)")
    size.add_argument(
        "--preset", choices=tuple(PRESETS), help="model size (default reference; tiny with --quick)"
    )
    size.add_argument("--d-model", type=int, help="model width")
    size.add_argument("--heads", "--num-heads", dest="heads", type=int, help="attention heads")
    size.add_argument(
        "--layers", "--num-layers", dest="layers", type=int, help="encoder and decoder layers each"
    )
    size.add_argument("--d-ff", type=int, help="feed-forward width")
    size.add_argument("--vocab", type=int, help="source and target vocabulary size")
    size.add_argument("--max-len", type=int, help="longest sequence the model accepts")
    size.add_argument("--batch", type=int, help="sequences per step (default 32; 2 with --quick)")
    size.add_argument("--src-len", type=int, help="source tokens (default 64; 8 with --quick)")
    size.add_argument("--tgt-len", type=int, help="target tokens (default 64; 8 with --quick)")
    size.add_argument(
        "--dropout", type=float, default=DROPOUT, help="dropout rate, whatever the preset's"
    )
    size.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument(
        "--variants",
        type=lambda text: text.split(","),
        default=list(VARIANTS),
        help=f"comma-separated subset of {','.join(VARIANTS)} (default: all)",
    )
    parser.add_argument("--skip-compile", action="store_true", help="leave out torch.compile")
    parser.add_argument(
        "--compile-timeout", type=int, default=900, help="seconds allowed for torch.compile"
    )
    args = parser.parse_args(argv)

    defaults = QUICK_BATCH if args.quick else REFERENCE_BATCH
    for name, default in zip(("batch", "src_len", "tgt_len"), defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    for name in ("steps", "rounds", "batch", "src_len", "tgt_len", *SIZE_FLAGS):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown or not args.variants:
        parser.error(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    if args.warmup < 1:
        parser.error("--warmup must be at least 1 (the first step compiles)")
    if not 0.0 <= args.dropout < 1.0:
        parser.error("--dropout must be in [0, 1)")

    args.preset = args.preset or ("tiny" if args.quick else "reference")
    overrides = {
        field: getattr(args, flag)
        for flag, fields in SIZE_FLAGS.items()
        for field in fields
        if getattr(args, flag) is not None
    }
    try:
        args.config = bench_config(args.preset, args.dtype, args.dropout, **overrides)
    except ValueError as err:  # e.g. d_model not divisible by heads
        parser.error(f"bad model size: {err}")
    for name in ("src_len", "tgt_len"):
        if getattr(args, name) > args.config.max_len:
            parser.error(
                f"--{name.replace('_', '-')} {getattr(args, name)} exceeds max_len "
                f"{args.config.max_len} of the model (raise --max-len)"
            )
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(describe_cpu(result["machine"]["cpu"]))
    print(format_table(result))
    if "flax_mfu" in result:
        print(
            f"model FLOPs/step {result['model_flops_per_step'] / 1e9:.2f} G, "
            f"peak matmul {result['peak_matmul_gflops']:.1f} GFLOP/s, "
            f"flax MFU {result['flax_mfu']:.1%}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=_json_default) + "\n")
    return 0


def _json_default(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


if __name__ == "__main__":
    reexec_with_tuned_malloc()  # as train.py (FLAX_TRANSFORMER_MALLOC=system: off)
    sys.exit(main())
