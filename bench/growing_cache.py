"""The growing KV cache against one cache of the full length, side by side.

    python -m bench.growing_cache --json OUT [--rounds 3] [--new-tokens 64,256]
        [--ends-at 64 --max-new-tokens 511] [--quick]

`HFModel.generate` on bench.hf_generate's random opus-mt-size Marian (32 source tokens), batch
8, greedy and beam 4, exactly N new tokens (min_new_tokens = max_new_tokens = N, so the cache
holds N slots): once with the engine's growing cache (decoding.cache.growing_lengths: 32, 64,
... N) and once with one N-slot cache, the way the engine ran before. Each round runs both
sides of every cell in turn; each side is compiled again before its timed call (the cache
lengths are read when generate is traced), so the times exclude compilation. The tokens of
the two sides must be equal (the bench stops otherwise).

`--ends-at N --max-new-tokens M` times what a translation with a max_length meets: the cache
is sized for M new tokens (opus-mt's max_length 512: M = 511) but every sentence ends after N.
The model's final logits bias makes EOS its first choice everywhere, and min_new_tokens = N
holds it back until then, so every row and beam has exactly N tokens and then EOS.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import hf_generate as hg
from bench.ct2_peer import cpu_info, describe_cpu

SIDES = {"growing": None, "one length": 1 << 30}  # FIRST_CACHE_LEN: the default, or past any


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", required=True, help="where to write the results")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (median reported)")
    parser.add_argument("--new-tokens", default="64,256", help="comma-separated N")
    parser.add_argument("--ends-at", type=int, help="every sentence ends after this many tokens")
    parser.add_argument("--max-new-tokens", type=int, help="with --ends-at: the cache's size")
    parser.add_argument("--quick", action="store_true", help="a tiny model (smoke test)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    import jax

    from flax_transformer import hf
    from flax_transformer.decoding import cache

    args = parse_args(argv)
    sizes = hg.TINY if args.quick else hg.OPUS_MT
    if (args.ends_at is None) != (args.max_new_tokens is None):
        raise SystemExit("--ends-at and --max-new-tokens go together")
    early = args.ends_at is not None
    lengths = [args.max_new_tokens] if early else [int(n) for n in args.new_tokens.split(",")]
    default_first = cache.FIRST_CACHE_LEN
    with tempfile.TemporaryDirectory() as tmp:
        hg.make_checkpoint(Path(tmp), sizes)
        if early:
            _favour_eos(Path(tmp), sizes["eos_token_id"])
        model = hf.load(tmp)
    ids = np.random.default_rng(0).integers(1, sizes["vocab_size"] - 1, (8, 32))
    cells = [(n, beams) for n in lengths for beams in (1, 4)]
    times = {(cell, side): [] for cell in cells for side in SIDES}
    load_start = os.getloadavg()
    for round_ in range(args.rounds):
        for n, beams in cells:
            tokens = {}
            for side, first in SIDES.items():
                cache.FIRST_CACHE_LEN = first or default_first
                jax.clear_caches()

                def call(n=n, beams=beams):
                    return model.generate(
                        ids, np.ones_like(ids), num_beams=beams, max_new_tokens=n,
                        min_new_tokens=args.ends_at or n,
                    )  # fmt: skip

                call()  # compiles
                start = time.perf_counter()
                tokens[side] = np.asarray(call())
                times[(n, beams), side].append(time.perf_counter() - start)
                if early and tokens[side].shape[1] != args.ends_at + 2:  # start, N, EOS
                    print(f"{side}: {tokens[side].shape[1] - 2} tokens before EOS, not "
                          f"{args.ends_at}", file=sys.stderr)  # fmt: skip
                    return 1
            cache.FIRST_CACHE_LEN = default_first
            if not np.array_equal(*tokens.values()):
                print(f"tokens differ at {n} new tokens, beams {beams}", file=sys.stderr)
                return 1
            line = ", ".join(f"{side} {times[(n, beams), side][-1]:.2f} s" for side in SIDES)
            print(f"round {round_ + 1}/{args.rounds} {n} new, beams {beams}: {line}", flush=True)
    rows = []
    for n, beams in cells:
        grow, one = (statistics.median(times[(n, beams), side]) for side in SIDES)
        rows.append({"new_tokens": n, "beams": beams, "growing_s": grow, "one_length_s": one,
                     "speedup": one / grow, "lengths": cache.growing_lengths(1, n)})  # fmt: skip
    result = {
        "cpu": cpu_info(), "rounds": args.rounds, "ends_at": args.ends_at, "batch": 8,
        "src_len": 32, "load_start": load_start, "load_end": os.getloadavg(), "cells": rows,
    }  # fmt: skip
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(describe_cpu(result["cpu"]))
    if early:
        print(f"every sentence ends after {args.ends_at} tokens")
    print("| new tokens | beams | cache lengths | growing s | one length s | speedup |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        lengths = ", ".join(map(str, r["lengths"]))
        print(f"| {r['new_tokens']} | {r['beams']} | {lengths} | {r['growing_s']:.2f} | "
              f"{r['one_length_s']:.2f} | {r['speedup']:.2f}x |")  # fmt: skip
    return 0


def _favour_eos(directory: Path, eos: int) -> None:
    """EOS the model's first choice at every step: its final logits bias raised by 100."""
    from safetensors.numpy import load_file, save_file

    path = directory / "model.safetensors"
    tensors = load_file(path)
    tensors["final_logits_bias"][..., eos] += 100.0
    save_file(tensors, path, metadata={"format": "pt"})


if __name__ == "__main__":
    sys.exit(main())
