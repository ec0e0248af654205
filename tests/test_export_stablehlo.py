"""The StableHLO export round-trips: a fresh process that imports only jax and numpy loads
forward.stablehlo and greedy.stablehlo and gets the Flax model's logits (float32, 1e-6
relative) and greedy tokens (identical), for two batch sizes and two lengths; seq2seq, LM, and
the int8 export against the int8 Flax model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from flax_transformer.cli.export import main
from flax_transformer.decoding import Greedy, generate
from flax_transformer.export.int8 import int8_model, quantize_variables
from flax_transformer.export.stablehlo import forward_function
from flax_transformer.runs.load import load_run
from tests.export_runs import fabricate_run, lm_prompts, source_batch

pytestmark = pytest.mark.slow
N_NEW = 7

# What a server runs: jax and numpy only (asserted: neither flax nor this project is loaded).
LOADER = """
import json, sys
import jax, numpy as np
directory, inputs, outputs = sys.argv[1:4]
manifest = json.load(open(f"{directory}/manifest.json"))
programs = {
    name: jax.export.deserialize(open(f"{directory}/{entry['file']}", "rb").read())
    for name, entry in manifest["files"].items()
}
arrays = np.load(inputs)
cases = sorted({key.rsplit(".", 1)[0] for key in arrays.files})
results = {}
for case in cases:  # "forward/2x5": arrays "forward/2x5.0", "forward/2x5.1", ...
    count = sum(key.startswith(case + ".") for key in arrays.files)
    args = [arrays[f"{case}.{i}"] for i in range(count)]
    results[case] = np.asarray(programs[case.split("/")[0]].call(*args))
np.savez(outputs, **results)
loaded = [m for m in sys.modules if m.split(".")[0] in ("flax", "flax_transformer", "torch")]
assert not loaded, loaded
"""


def load_in_fresh_process(directory: Path, cases: dict[str, list], tmp: Path) -> dict:
    arrays = {f"{case}.{i}": a for case, args in cases.items() for i, a in enumerate(args)}
    np.savez(tmp / "in.npz", **arrays)
    script = tmp / "serve.py"
    script.write_text(LOADER)
    result = subprocess.run(
        [sys.executable, str(script), str(directory), str(tmp / "in.npz"), str(tmp / "out.npz")],
        cwd=tmp, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(np.load(tmp / "out.npz"))


def check_round_trip(run_dir: Path, tmp: Path, kind: str, int8: bool) -> None:
    out = tmp / "exported"
    argv = [str(run_dir), "--format", "stablehlo", "--out", str(out)]
    argv += ["--max-new-tokens", str(N_NEW)] + (["--int8"] if int8 else [])
    assert main(argv) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["int8"] is int8 and manifest["files"]["greedy"]["max_new_tokens"] == N_NEW
    for name in ("forward", "greedy"):  # int8 weights are stored as int8 constants
        module = jax.export.deserialize((out / f"{name}.stablehlo").read_bytes()).mlir_module()
        assert ("xi8>" in module) is int8, name
    run = load_run(run_dir)
    model, variables = run.model, run.params
    if int8:
        model, variables = int8_model(model), quantize_variables(variables)
    forward = forward_function(model, variables)
    cases, expected = {}, {}
    for batch, length in [(2, 5), (3, 11)]:
        if kind == "lm":
            tokens = lm_prompts(batch, length, seed=length)
            cases[f"forward/{batch}x{length}"] = [tokens]
            kw = dict(max_new_tokens=N_NEW, eos_id=2)
        else:
            tokens = source_batch(batch, length, seed=length)
            cases[f"forward/{batch}x{length}"] = [tokens, lm_prompts(batch, length - 2, seed=1)]
            kw = dict(max_new_tokens=N_NEW, eos_id=2, bos_id=1)
        expected[f"forward/{batch}x{length}"] = forward(*cases[f"forward/{batch}x{length}"])
        cases[f"greedy/{batch}x{length}"] = [tokens]
        expected[f"greedy/{batch}x{length}"] = generate(model, variables, tokens, Greedy(), **kw)
    got = load_in_fresh_process(out, cases, tmp)
    for name, want in expected.items():
        want = np.asarray(want)
        if name.startswith("greedy"):
            assert got[name].dtype == np.int32 and got[name].shape == want.shape
            np.testing.assert_array_equal(got[name], want, err_msg=name)
        else:
            assert got[name].dtype == np.float32
            error = np.abs(got[name] - want).max() / np.abs(want).max()
            assert error <= 1e-6, (name, error)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {kind: fabricate_run(root / kind, kind) for kind in ("seq2seq", "lm")}


def test_seq2seq_round_trip(runs, tmp_path):
    check_round_trip(runs["seq2seq"], tmp_path, "seq2seq", int8=False)


def test_lm_round_trip(runs, tmp_path):
    check_round_trip(runs["lm"], tmp_path, "lm", int8=False)


def test_int8_round_trip(runs, tmp_path):
    check_round_trip(runs["seq2seq"], tmp_path, "seq2seq", int8=True)
