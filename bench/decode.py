"""Decoding speed: KV-cached against recompute-everything greedy decoding, one process.

    python -m bench.decode --json OUT.json [--plot docs/decode_latency.png] [--quick]

A seq2seq Transformer of fixed size (d_model 256, 4 heads, 3+3 layers, d_ff 1024, vocab 1000,
float32, random weights) greedy-decodes `--batch` sources of `--src-len` tokens for each count
of new tokens (EOS off, so every run makes exactly that many). Both paths are the same jitted
`lax.while_loop` (flax_transformer.decoding.generate with Greedy()):
- cached: one token per step through the KV cache; the encoder output is projected once;
- uncached (use_cache=False): every step re-runs the decoder over the whole (batch, length)
  token buffer, causal mask; static shapes under jit, as a jitted decoder without a cache must.
Each function is compiled and run once before timing. Timing is interleaved (a round times every
length and path in turn, the cheap cached path --cached-repeats times), so a noisy neighbour
slows all of them alike; reported times are medians over all timed runs (the JSON also holds
the fastest run of each). tokens/s = batch * new tokens / seconds; per-token latency = seconds /
new tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from flax_transformer.spec.config import TransformerConfig
from flax_transformer.spec.presets import preset

LENGTHS = (32, 64, 128, 256, 512)


def bench_config(quick: bool) -> TransformerConfig:
    if quick:  # a smoke run for the test suite
        return preset("tiny", src_vocab_size=64, tgt_vocab_size=64, d_ff=64, max_len=32)
    return preset("reference", dropout_rate=0.0, max_len=512)


def run(
    config: TransformerConfig,
    lengths,
    *,
    batch: int,
    src_len: int,
    rounds: int,
    cached_repeats: int,
) -> dict:
    import jax

    from flax_transformer import Transformer
    from flax_transformer.decoding import Greedy, generate
    from flax_transformer.nn.kinds import abstract_variables

    model = Transformer(config)
    rng = np.random.default_rng(0)
    src = rng.integers(3, config.src_vocab_size, (batch, src_len)).astype(np.int32)
    # Random weights of the model's shapes, drawn by numpy (the values do not change the time).
    params = jax.tree.map(
        lambda s: rng.normal(0.0, 0.05, s.shape).astype(s.dtype), abstract_variables(model)
    )

    def decode(n_new: int, use_cache: bool):
        out = generate(
            model, params, src, Greedy(), max_new_tokens=n_new, bos_id=1, eos_id=None,
            use_cache=use_cache,
        )  # fmt: skip
        return np.asarray(out)  # blocks until done

    paths = ("cached", "uncached")
    tokens, compile_s = {}, {}
    for n_new in lengths:  # the first call of each compiles; its output is kept for comparison
        for path in paths:
            start = time.perf_counter()
            tokens[n_new, path] = decode(n_new, path == "cached")
            compile_s[n_new, path] = time.perf_counter() - start
    times = {key: [] for key in tokens}
    for round_index in range(rounds):
        for n_new in lengths:
            for path in paths:
                # The cached path is cheap: time it several times per round (less noise).
                for _ in range(cached_repeats if path == "cached" else 1):
                    start = time.perf_counter()
                    decode(n_new, path == "cached")
                    times[n_new, path].append(time.perf_counter() - start)
        print(f"round {round_index + 1}/{rounds} done", flush=True)

    median = {key: statistics.median(values) for key, values in times.items()}
    best = {key: min(values) for key, values in times.items()}
    same = [bool(np.array_equal(tokens[n, "cached"], tokens[n, "uncached"])) for n in lengths]
    return {
        "lengths": list(lengths),
        "cached_tok_s": [batch * n / median[n, "cached"] for n in lengths],
        "uncached_tok_s": [batch * n / median[n, "uncached"] for n in lengths],
        "cached_ms_per_token": [1e3 * median[n, "cached"] / n for n in lengths],
        "uncached_ms_per_token": [1e3 * median[n, "uncached"] / n for n in lengths],
        "speedup": [median[n, "uncached"] / median[n, "cached"] for n in lengths],
        # The fastest run of each: less sensitive to other processes on a shared machine.
        "cached_best_ms_per_token": [1e3 * best[n, "cached"] / n for n in lengths],
        "uncached_best_ms_per_token": [1e3 * best[n, "uncached"] / n for n in lengths],
        "same_tokens": all(same),
        "same_tokens_per_length": same,
        "first_call_s": {p: [compile_s[n, p] for n in lengths] for p in paths},
        "all_times_s": {p: [times[n, p] for n in lengths] for p in paths},
        "batch": batch,
        "src_len": src_len,
        "rounds": rounds,
        "cached_repeats": cached_repeats,
        "config": config.to_dict(),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "jax": jax.__version__,
            "device": str(jax.devices()[0]),
            "load_average_at_end": os.getloadavg(),
        },
    }


def table(result: dict) -> str:
    rows = [
        "| new tokens | cached tok/s | uncached tok/s | cached ms/token | uncached ms/token "
        "| speedup | same tokens |",
        "|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for i, n in enumerate(result["lengths"]):
        same = "yes" if result["same_tokens_per_length"][i] else "no"
        rows.append(
            f"| {n} | {result['cached_tok_s'][i]:.1f} | {result['uncached_tok_s'][i]:.1f} "
            f"| {result['cached_ms_per_token'][i]:.2f} | {result['uncached_ms_per_token'][i]:.2f} "
            f"| {result['speedup'][i]:.1f}x | {same} |"
        )
    return "\n".join(rows)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, style in (("cached", "o-"), ("uncached", "s--")):
        ax.plot(result["lengths"], result[f"{name}_ms_per_token"], style, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(result["lengths"], [str(n) for n in result["lengths"]])
    ax.set_xlabel("new tokens generated")
    ax.set_ylabel("ms per token (median)")
    cfg = result["config"]
    ax.set_title(
        f"Greedy decoding, batch {result['batch']}: d_model {cfg['d_model']}, "
        f"{cfg['num_encoder_layers']}+{cfg['num_decoder_layers']} layers",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="where to write the results")
    parser.add_argument("--plot", type=Path, help="save per-token latency vs length as a PNG")
    parser.add_argument("--quick", action="store_true", help="tiny model and lengths (smoke run)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--src-len", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (interleaved)")
    parser.add_argument(
        "--cached-repeats", type=int, default=5, help="cached runs timed per length and round"
    )
    parser.add_argument("--lengths", type=int, nargs="+", help=f"new-token counts {LENGTHS}")
    args = parser.parse_args(argv)
    config = bench_config(args.quick)
    lengths = args.lengths or ((4, 8) if args.quick else LENGTHS)
    if max(lengths) > config.max_len:
        parser.error(f"lengths must be <= the model's max_len {config.max_len}")
    src_len = min(args.src_len, config.max_len)
    rounds = 1 if args.quick else args.rounds
    result = run(
        config,
        lengths,
        batch=args.batch,
        src_len=src_len,
        rounds=rounds,
        cached_repeats=1 if args.quick else args.cached_repeats,
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.plot:
        plot(result, args.plot)
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
