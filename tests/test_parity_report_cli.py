"""`python -m flax_transformer.parity A B`: exit 0 when A (in Flax) and B (in torch) agree,
1 with the first divergence named when they do not, 2 with a clear message for bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torch_reference
from flax_transformer.cli.parity import main
from flax_transformer.data.tokenizer import ByteTokenizer
from flax_transformer.interop.convert import save_flax_params, save_torch_state, torch_state_to_flax

from .test_parity_report import CONFIG

ROOT = Path(__file__).resolve().parents[1]
SMALL_RUN = ["--batch-size", "3", "--src-len", "7", "--tgt-len", "6"]
BROKEN_KEY = "decoder.layers.1.ffn.linear1.weight"


def torch_state(config=CONFIG, kind="seq2seq", seed=0):
    torch.manual_seed(seed)
    model_cls = torch_reference.Transformer if kind == "seq2seq" else torch_reference.TransformerLM
    return torch_reference.state_dict_to_numpy(model_cls(config))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The same weights as a torch file and a Flax file, and a broken torch copy."""
    root = tmp_path_factory.mktemp("parity_cli")
    state = torch_state()
    paths = {"torch": root / "torch.safetensors", "flax": root / "flax.safetensors"}
    save_torch_state(paths["torch"], state, CONFIG)
    save_flax_params(paths["flax"], torch_state_to_flax(state, CONFIG), CONFIG)
    broken = dict(state)
    weight = broken[BROKEN_KEY] = state[BROKEN_KEY].copy()  # (d_ff, d_model)
    weight[:, 2] += 0.05  # input feature 2 of every hidden unit: some are active on any batch
    paths["broken"] = root / "broken.safetensors"
    save_torch_state(paths["broken"], broken, CONFIG)
    return paths


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_same_weights_in_both_formats_pass(files, capsys):
    code, out, err = run([files["flax"], files["torch"], *SMALL_RUN], capsys)
    assert code == 0, out + err
    assert "OK: all 31 tensors within relative tolerance 1e-10" in out
    assert ", float64," in out.splitlines()[0]
    assert "A=" in out and "(Flax)" in out and "(torch)" in out


def test_broken_weight_fails_and_names_the_layer(files, capsys, tmp_path):
    report_path = tmp_path / "report.json"
    argv = [files["torch"], files["broken"], "--json", report_path]
    code, out, _ = run(argv + SMALL_RUN, capsys)
    assert code == 1
    marked = [line for line in out.splitlines() if "<-- divergence starts here" in line]
    assert len(marked) == 1 and "decoder.layers.1.ffn " in marked[0]
    assert "the divergence starts at decoder.layers.1.ffn" in out
    report = json.loads(report_path.read_text())
    assert report["ok"] is False and report["first_divergence"] == "decoder.layers.1.ffn"
    assert report["dtype"] == "float64" and report["tol"] == 1e-10
    by_name = {t["name"]: t for t in report["tensors"]}
    assert by_name["decoder.layers.1.norm2"]["within_tol"] is True
    assert by_name["decoder.layers.1.norm2"]["rel"] < 1e-12
    assert by_name["logits"]["status"] == "FAIL"


def test_loose_tolerance_and_json_on_stdout(files, capsys):
    argv = [files["torch"], files["broken"], "--tol", "0.5", "--json", "-", *SMALL_RUN]
    code, out, _ = run(argv + ["--dtype", "float32"], capsys)
    assert code == 0
    report = json.loads(out)
    assert report["ok"] is True and report["tol"] == 0.5 and report["model"] == "seq2seq"
    assert report["dtype"] == "float32"
    assert report["inputs"] == {"src": [3, 7], "tgt_in": [3, 6]}


def test_different_configs_are_refused_with_the_fields_named(files, capsys, tmp_path):
    other = tmp_path / "eps.safetensors"
    # Flax's own LayerNorm default (1e-6) against torch's (1e-5): a classic porting bug.
    save_torch_state(other, torch_state(), CONFIG.replace(layer_norm_eps=1e-6))
    code, _, err = run([files["torch"], other, *SMALL_RUN], capsys)
    assert code == 2
    assert "different configs (layer_norm_eps: A 1e-05, B 1e-06)" in err
    assert "--allow-config-diff" in err and "Traceback" not in err
    # Allowed: each side runs its own config, and the first LayerNorm is where it starts.
    code, out, _ = run([files["torch"], other, "--allow-config-diff", *SMALL_RUN], capsys)
    assert code == 1
    assert "the divergence starts at encoder.layers.0.norm1" in out
    # float32 noise hides it: why float64 is the default.
    argv = [files["torch"], other, "--allow-config-diff", "--dtype", "float32", *SMALL_RUN]
    assert run(argv, capsys)[0] == 0


def test_different_shapes_cannot_be_matched(files, capsys, tmp_path):
    wider = CONFIG.replace(d_ff=48)
    other = tmp_path / "wider.safetensors"
    save_torch_state(other, torch_state(wider), wider)
    code, _, err = run([files["torch"], other, "--allow-config-diff"], capsys)
    assert code == 2 and "d_ff: A 40, B 48" in err and "different weight shapes" in err


def test_model_kinds_must_agree(files, capsys, tmp_path):
    lm = tmp_path / "lm.safetensors"
    save_torch_state(lm, torch_state(kind="lm"), CONFIG, model="lm")
    code, _, err = run([files["torch"], lm], capsys)
    assert code == 2 and "A is a 'seq2seq' model and B a 'lm' model" in err


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda p: p.write_text("not weights"), "not a readable safetensors file"),
        (lambda p: None, "no such file or directory"),
        (lambda p: p.mkdir(), "a directory without flax_params.safetensors"),
    ],
)
def test_unknown_inputs_are_clear_errors(files, capsys, tmp_path, make, message):
    bad = tmp_path / "weights.bin.txt"
    make(bad)
    code, out, err = run([bad, files["torch"]], capsys)
    assert code == 2 and message in err and out == ""


def test_workdir_with_input_text_through_its_tokenizer(capsys, tmp_path):
    """A train.py workdir: flax_params.safetensors and tokenizer.json (byte tokenizer)."""
    config = CONFIG.replace(src_vocab_size=259, tgt_vocab_size=259)
    state = torch_state(config, kind="lm")
    save_flax_params(
        tmp_path / "flax_params.safetensors", torch_state_to_flax(state, config), config, "lm"
    )
    ByteTokenizer().save(tmp_path / "tokenizer.json")
    weights = tmp_path / "torch_weights.safetensors"
    save_torch_state(weights, state, config, "lm")
    argv = [tmp_path, weights, "--input", "hello", "--input", "parity!", "--json", "-"]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["inputs"] == {"tgt_in": [2, 8]}  # [bos] + 7 bytes, padded
    # "hello" is shorter: its padding rows are excluded from every comparison.
    embedded = next(t for t in report["tensors"] if t["name"] == "tgt_embedded")
    assert embedded["compared"] == (6 + 8) * config.d_model


def test_input_needs_a_tokenizer(files, capsys):
    code, _, err = run([files["torch"], files["flax"], "--input", "hi"], capsys)
    assert code == 2 and "--input needs a tokenizer" in err


@pytest.mark.slow
def test_module_entry_point_exit_status(files):
    """What another project's CI runs: the exit status says whether the two agree."""
    command = [sys.executable, "-m", "flax_transformer.parity", *SMALL_RUN]
    broken = subprocess.run(
        command + [str(files["flax"]), str(files["broken"])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert broken.returncode == 1, broken.stderr
    assert "the divergence starts at decoder.layers.1.ffn" in broken.stdout


def test_the_workflow_runs_without_a_command_line(files):
    """runs.parity.parity(ParitySpec(...)): the report the command prints, from a typed spec
    (no argparse object); a broken B is out of tolerance and named."""
    from flax_transformer.runs.parity import ParitySpec, parity

    sizes = {"batch_size": 3, "src_len": 7, "tgt_len": 6}
    assert parity(ParitySpec(a=files["flax"], b=files["torch"], **sizes)).ok
    report = parity(ParitySpec(a=files["flax"], b=files["broken"], **sizes))
    assert not report.ok and "ffn" in report.format_table()
