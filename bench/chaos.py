"""Chaos: random signals at random times, then the same command again (or --resume).

    python -m bench.chaos [--rounds 50] [--seed 0] [--json OUT.json]

Each round picks, with a seeded generator, one of three commands, starts it in a process group
of its own, and after a random delay sends it SIGINT (as a terminal's Ctrl-C: to the whole
group), SIGTERM or SIGKILL:
  train      `train.py --train-tsv` on a corpus that goes through the token cache (tokenizing,
             then 12 steps of a tiny model, a checkpoint every 3): the signal lands in the
             scan, the tokenization, the compile, a step or a save
  resume     the same, interrupted a second time during the --resume that follows the first
  hf_import  `ftx hf import` of a tiny GPT-2 directory with a tokenizer
The delay is uniform from 0.5 s (EARLIEST_S: the interpreter's own start) to 0.8 of the
command's uninterrupted wall time (measured once, at the start).
Then the command is run again until it finishes: `--resume` when the run directory holds a
run.json, else the same command (the README's rule); an import that finished before the
signal is refused as "not an empty directory" and kept. A round passes when
  - no output of an interrupted or repeated command holds a Python traceback (SIGKILL's own
    process prints nothing; its retry is checked),
  - nothing is left beside the run (no `.token_cache.partial-*`, no Orbax `*tmp*` directory),
  - the result equals the uninterrupted run's bit for bit: the trained weights
    (flax_params.safetensors) or every tensor the import wrote.
Prints one line a round and a summary; writes JSON (default bench/results/chaos.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TRAIN_FLAGS = [
    "--d-model", "16", "--num-heads", "2", "--num-layers", "1", "--d-ff", "32",
    "--max-len", "32", "--batch-size", "16", "--log-every", "3", "--eval-every", "6",
    "--save-every", "3", "--steps", "12", "--dropout", "0", "--warmup", "2", "--seed", "3",
]  # fmt: skip
SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL}
# What an interrupted command may exit with: 0 (done before the signal), 130 / 143 (Ctrl-C,
# SIGTERM: the project's one line), -9 (SIGKILL).
# The earliest signal: before it, CPython itself starts (site, the .pth files of the venv), and a
# Ctrl-C there gets CPython's own KeyboardInterrupt traceback before any of the project's code
# runs (no program can answer it; from the first line of train.py on, the project does).
EARLIEST_S = 0.5
EXPECTED = {"SIGINT": {0, 130}, "SIGTERM": {0, 143}, "SIGKILL": {0, -9}}


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else the machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def write_corpus(path: Path, count: int, seed: int = 0) -> None:
    """`count` pairs of random words (the target reversed), seeded."""
    rng = np.random.default_rng(seed)
    words = ["".join(rng.choice(list("abcdefgh"), size=rng.integers(2, 6))) for _ in range(300)]
    lines = []
    for _ in range(count):
        chosen = [words[i] for i in rng.integers(0, len(words), size=rng.integers(1, 5))]
        lines.append(" ".join(chosen) + "\t" + " ".join(chosen[::-1]) + "\n")
    path.write_text("".join(lines), encoding="utf-8")


def write_hf_dir(path: Path) -> None:
    """A tiny GPT-2 with a tokenizer, as save_pretrained writes it."""
    import torch
    import transformers

    sys.path.insert(0, str(ROOT))
    from tests import hf_models

    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(hf_models.gpt2_config()).save_pretrained(path)
    hf_models.marian_tokenizer().save_pretrained(path)


class Command:
    """One of the chaos commands: its argv in a given run directory, and its result."""

    def __init__(self, name: str, argv: list[str]):
        self.name, self.argv = name, argv

    def args(self, workdir: Path, resume: bool = False) -> list[str]:
        return [a.replace("{WORKDIR}", str(workdir)) for a in self.argv] + (
            ["--resume"] if resume else []
        )


def start(argv: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    return subprocess.Popen(
        [sys.executable, *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def run_to_end(argv: list[str]) -> tuple[int, str, float]:
    started = time.perf_counter()
    proc = start(argv)
    out, err = proc.communicate()
    return proc.returncode, out + err, time.perf_counter() - started


def interrupt(argv: list[str], delay: float, sig: str) -> tuple[int, str]:
    """Run `argv`, send `sig` to its process group after `delay` seconds (if still running)."""
    proc = start(argv)
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, SIGNALS[sig])
        except ProcessLookupError:
            pass
    out, err = proc.communicate()
    return proc.returncode, out + err


def tensors_of(workdir: Path, pattern: str) -> dict[str, np.ndarray]:
    """Every tensor of the safetensors files under `workdir` matching `pattern`."""
    from safetensors.numpy import load_file

    found = {}
    for path in sorted(workdir.rglob(pattern)):
        for name, array in load_file(str(path)).items():
            found[f"{path.relative_to(workdir)}:{name}"] = array
    return found


def same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def leftovers(tmp: Path) -> list[str]:
    """What an interrupted command may have left beside or inside the run directories."""
    left = [p.name for p in tmp.glob(".token_cache.partial-*")]
    left += [str(p) for p in tmp.rglob("*orbax-checkpoint-tmp*")]
    left += [p.name for p in tmp.glob(".*.partial*")]
    return left


def recover(command: Command, workdir: Path, log: list[str]) -> tuple[int, str]:
    """Run the command again until it finishes: --resume when the run directory holds a run,
    else the same command; an import refused as already done counts as finished."""
    for _ in range(3):
        resume = command.name != "hf_import" and (workdir / "run.json").exists()
        code, output, _ = run_to_end(command.args(workdir, resume))
        log.append(output)
        if code == 0:
            return 0, "resume" if resume else "again"
        if command.name == "hf_import" and "is not an empty directory" in output:
            return 0, "already imported"
        if command.name != "hf_import" and "already holds a run" in output:
            continue  # (the next try resumes)
        return code, output.strip().splitlines()[-1] if output.strip() else "(no output)"
    return 1, "did not finish in 3 tries"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus-pairs", type=int, default=20000)
    parser.add_argument("--json", default=str(ROOT / "bench" / "results" / "chaos.json"))
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="chaos-"))
    corpus, hf_dir = tmp / "corpus.tsv", tmp / "gpt2"
    write_corpus(corpus, args.corpus_pairs)
    write_hf_dir(hf_dir)
    commands = {
        "train": Command("train", ["train.py", "--train-tsv", str(corpus), "--workdir",
                                   "{WORKDIR}", *TRAIN_FLAGS]),
        "hf_import": Command("hf_import", ["-m", "flax_transformer.cli", "hf", "import",
                                           str(hf_dir), "--workdir", "{WORKDIR}"]),
    }  # fmt: skip
    commands["resume"] = commands["train"]
    # The uninterrupted results and wall times.
    reference, wall = {}, {}
    for name, pattern in (("train", "flax_params.safetensors"), ("hf_import", "*.safetensors")):
        workdir = tmp / f"reference-{name}"
        code, output, wall[name] = run_to_end(commands[name].args(workdir))
        if code != 0:
            raise SystemExit(f"the uninterrupted {name} failed ({code}):\n{output[-3000:]}")
        reference[name] = tensors_of(workdir, pattern)
    print(f"uninterrupted: train {wall['train']:.1f} s, hf import {wall['hf_import']:.1f} s")
    rows, failures = [], 0
    for index in range(args.rounds):
        name = rng.choice(["train", "train", "resume", "hf_import"])
        sig = rng.choice(list(SIGNALS))
        command = commands[name]
        base = "hf_import" if name == "hf_import" else "train"
        workdir = tmp / f"round{index}"
        # (over 0.8 of the uninterrupted time: a signal after the end interrupts nothing)
        delay = rng.uniform(EARLIEST_S, 0.8 * wall[base])
        outputs, problems = [], []
        if name == "resume":  # a first interruption, resumed, then interrupted again
            first = rng.uniform(EARLIEST_S, 0.8 * wall[base])
            code, output = interrupt(command.args(workdir), first, "SIGINT")
            outputs.append(output)
            resume = (workdir / "run.json").exists()
            code, output = interrupt(command.args(workdir, resume), delay, sig)
        else:
            code, output = interrupt(command.args(workdir), delay, sig)
        outputs.append(output)
        if code not in EXPECTED[sig]:
            problems.append(f"exit {code} after {sig}")
        finished, how = (0, "finished first") if code == 0 else recover(command, workdir, outputs)
        if finished != 0:
            problems.append(f"the retry failed: {how}")
        if any("Traceback" in o for o in outputs):
            problems.append("a traceback was printed")
        left = leftovers(tmp)
        if left:
            problems.append(f"left behind: {left}")
        pattern = "flax_params.safetensors" if base == "train" else "*.safetensors"
        if finished == 0 and not same_tensors(tensors_of(workdir, pattern), reference[base]):
            problems.append("the result differs from the uninterrupted run")
        failures += bool(problems)
        row = {"round": index, "command": name, "signal": sig, "delay_s": round(delay, 2),
               "exit": code, "recovery": how, "ok": not problems, "problems": problems}  # fmt: skip
        if problems:  # what the commands printed, for the diagnosis
            row["output_tail"] = [o[-2000:] for o in outputs]
        rows.append(row)
        print(f"round {index:2d}: {name:9s} {sig:7s} at {delay:5.1f} s -> exit {code:4d}, "
              f"{how}: {'ok' if not problems else '; '.join(problems)}", flush=True)  # fmt: skip
    summary = {
        "rounds": args.rounds, "failed": failures, "seed": args.seed,
        "cpu": cpu_name(), "python": platform.python_version(),
        "interrupted": sum(r["recovery"] != "finished first" for r in rows),
        "uninterrupted_s": wall, "rows": rows,
    }  # fmt: skip
    Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{args.rounds - failures} of {args.rounds} rounds: nothing lost, no traceback, "
          "the same result as the uninterrupted run")  # fmt: skip
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
