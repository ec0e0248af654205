"""The compiled search of `hf.load(...).generate` as opcodes and shapes, to compare two trees.

    PYTHONPATH=TREE python -m bench.hlo_ops OUT_PREFIX --batch 8 --beams 4 [--size tiny|opus]

What it measures: no time, the program. It compiles the jitted search of a random Marian
model (bench.hf_generate's TINY or OPUS_MT sizes; 8 source tokens, 6 new tokens) and writes
OUT_PREFIX.hlo (the optimised HLO), OUT_PREFIX.body and OUT_PREFIX.all (one line per
instruction of the while loop's body / of the whole module: opcode, result shape, fusion kind;
sorted, so instruction names do not matter), and prints the opcode counts. Two trees compiled
the same program when `diff A.all B.all` and `diff A.body B.body` print nothing: how the one
decoding engine was shown to compile what the code before it compiled (docs/decoding.md). It
was bench/results/engine_ab/hlo_ops.py until 2026-11-28.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

INSTRUCTION = re.compile(r"\s*(?:ROOT )?%[\w.\-]+ = (\S+) (\w[\w\-]*)\(")


def instructions(text: str) -> list[str]:
    """`opcode shape fusion-kind` of every instruction of an HLO text, sorted."""
    found = []
    for line in text.splitlines():
        if match := INSTRUCTION.match(line):
            kind = re.search(r"kind=(\w+)", line)
            found.append(f"{match.group(2)} {match.group(1)} {kind.group(1) if kind else ''}")
    return sorted(found)


def loop_body(hlo: str) -> str:
    """The computation that the module's one while loop runs as its body."""
    (body_name,) = set(re.findall(r"\bwhile\(.*?body=%?([\w.\-]+)", hlo))
    return re.search(rf"^%?{re.escape(body_name)} \(.*?^\}}", hlo, re.S | re.M).group(0)


def compiled_search(batch: int, beams: int, size: str) -> str:
    """The optimised HLO of the search that one generate call compiles."""
    from bench.hf_generate import OPUS_MT, TINY, make_checkpoint
    from flax_transformer import hf
    from flax_transformer.hf import generation

    sizes = {"tiny": TINY, "opus": OPUS_MT}[size]
    with tempfile.TemporaryDirectory() as tmp:
        make_checkpoint(Path(tmp), sizes)
        model = hf.load(tmp)
    real, texts = generation._run, []

    def spy(*args, **kwargs):
        texts.append(real.lower(*args, **kwargs).compile().as_text())
        return real(*args, **kwargs)

    generation._run = spy
    try:
        ids = np.random.default_rng(0).integers(1, sizes["vocab_size"] - 1, (batch, 8))
        mask = np.ones_like(ids)
        model.generate(ids, mask, num_beams=beams, max_new_tokens=6, min_new_tokens=6)
    finally:
        generation._run = real
    (hlo,) = texts
    return hlo


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.hlo_ops", description=__doc__.splitlines()[0]
    )
    parser.add_argument("prefix", help="write PREFIX.hlo, PREFIX.body and PREFIX.all")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--size", choices=("tiny", "opus"), default="tiny")
    args = parser.parse_args(argv)
    if min(args.batch, args.beams) <= 0:
        parser.error("--batch and --beams must be positive")
    hlo = compiled_search(args.batch, args.beams, args.size)
    Path(args.prefix + ".hlo").write_text(hlo)
    for suffix, text in (("body", loop_body(hlo)), ("all", hlo)):
        ops = instructions(text)
        Path(f"{args.prefix}.{suffix}").write_text("\n".join(ops) + "\n")
        counts = collections.Counter(op.split()[0] for op in ops)
        print(suffix, len(ops), dict(counts.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
