"""The compiled search of hf.generate, as opcodes and shapes: to compare two trees' programs.

    PYTHONPATH=TREE python bench/results/engine_ab/hlo_ops.py OUT_PREFIX BATCH BEAMS [TINY|OPUS]

Writes OUT_PREFIX.hlo (the optimised HLO of the jitted search for a random Marian model, 8
source tokens, 6 new tokens), OUT_PREFIX.body and OUT_PREFIX.all (one line per instruction of
the while loop's body / the whole module: opcode, result shape, fusion kind; sorted, so
instruction names do not matter) and prints the opcode counts. Two trees compiled the same
program when `diff A.all B.all` and `diff A.body B.body` print nothing.
"""

from __future__ import annotations

import collections
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

INSTRUCTION = re.compile(r"\s*(?:ROOT )?%[\w.\-]+ = (\S+) (\w[\w\-]*)\(")


def instructions(text: str) -> list[str]:
    found = []
    for line in text.splitlines():
        if match := INSTRUCTION.match(line):
            kind = re.search(r"kind=(\w+)", line)
            found.append(f"{match.group(2)} {match.group(1)} {kind.group(1) if kind else ''}")
    return sorted(found)


def main(prefix: str, batch: int, beams: int, size: str = "TINY") -> None:
    from bench.hf_generate import OPUS_MT, TINY, make_checkpoint
    from flax_transformer import hf
    from flax_transformer.hf import generation

    sizes = {"TINY": TINY, "OPUS": OPUS_MT}[size]
    with tempfile.TemporaryDirectory() as tmp:
        make_checkpoint(Path(tmp), sizes)
        model = hf.load(tmp)
    real, texts = generation._run, []

    def spy(*args, **kwargs):
        texts.append(real.lower(*args, **kwargs).compile().as_text())
        return real(*args, **kwargs)

    generation._run = spy
    ids = np.random.default_rng(0).integers(1, sizes["vocab_size"] - 1, (batch, 8))
    model.generate(ids, np.ones_like(ids), num_beams=beams, max_new_tokens=6, min_new_tokens=6)
    (hlo,) = texts
    (body_name,) = set(re.findall(r"\bwhile\(.*?body=%?([\w.\-]+)", hlo))
    body = re.search(rf"^%?{re.escape(body_name)} \(.*?^\}}", hlo, re.S | re.M).group(0)
    Path(prefix + ".hlo").write_text(hlo)
    for suffix, text in (("body", body), ("all", hlo)):
        ops = instructions(text)
        Path(f"{prefix}.{suffix}").write_text("\n".join(ops) + "\n")
        counts = collections.Counter(op.split()[0] for op in ops)
        print(suffix, len(ops), dict(counts.most_common()))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:])
