"""train.py end to end with tiny models: what a run leaves behind, the way out to torch,
exact resume after SIGKILL, and the messages bad input gets."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import train
from flax_transformer.interop.convert import load_safetensors

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--task-min-len", "1", "--task-max-len", "5", "--task-train-size", "300",
    "--task-valid-size", "24", "--d-model", "16", "--num-heads", "2", "--num-layers", "1",
    "--d-ff", "32", "--max-len", "16", "--batch-size", "8", "--log-every", "2",
    "--dropout", "0.1", "--lr", "3e-3", "--warmup", "3",
]  # fmt: skip


def run_main(capsys, *argv):
    code = train.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("run") / "reverse"
    code = train.main(TINY + ["--steps", "8", "--eval-every", "4", "--save-every", "4",
                              "--workdir", str(workdir)])  # fmt: skip
    assert code == 0
    return workdir


def test_run_leaves_results_pictures_checkpoints(tiny_run):
    for name in ("config.json", "run.json", "tokenizer.json", "metrics.jsonl", "curves.png",
                 "attention.png", "results.json", "flax_params.safetensors",
                 "torch_model.safetensors"):  # fmt: skip
        assert (tiny_run / name).stat().st_size > 0, name
    assert sorted(p.name for p in (tiny_run / "checkpoints").iterdir()) == ["4", "8"]
    results = json.loads((tiny_run / "results.json").read_text())
    for key in ("exact_match", "bleu", "valid_loss", "token_accuracy", "tokens_per_sec",
                "wall_time_s", "steps", "examples"):  # fmt: skip
        assert key in results, key
    assert results["steps"] == 8 and 0.0 <= results["exact_match"] <= 1.0
    assert np.isfinite(results["valid_loss"]) and results["tokens_per_sec"] > 0
    records = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().split("\n")
               if line]  # fmt: skip
    assert [r["step"] for r in records if r["kind"] == "train"] == [2, 4, 6, 8]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [4, 8]
    run = json.loads((tiny_run / "run.json").read_text())
    assert run["model"] == "transformer" and run["tokenizer"] == "byte"


def test_exported_torch_weights_give_the_same_logits(tiny_run):
    import jax.numpy as jnp
    import torch

    import torch_reference
    from flax_transformer.interop.convert import load_torch_state
    from flax_transformer.spec.numerics import assert_close
    from flax_transformer.training.run import load_run

    state, config, kind = load_torch_state(tiny_run / "torch_model.safetensors")
    assert kind == "transformer"
    torch_model = torch_reference.load_numpy_state(torch_reference.Transformer(config), state)
    run = load_run(tiny_run)
    assert run.config == config and run.step == 8
    src = np.array([[5, 9, 12, 2, 0, 0], [7, 7, 8, 9, 10, 2]])
    tgt = np.array([[1, 12, 9, 5], [1, 10, 9, 0]])
    flax_logits = run.model.apply(run.params, jnp.asarray(src), jnp.asarray(tgt))
    with torch.no_grad():
        torch_logits = torch_model.eval()(torch.from_numpy(src), torch.from_numpy(tgt)).numpy()
    assert_close(np.asarray(flax_logits), torch_logits, rtol=1e-5, what="exported logits")
    # The checkpoint and the exported Flax file hold the same parameters.
    exported, _ = load_safetensors(tiny_run / "flax_params.safetensors")
    from flax_transformer.spec.naming import flatten_params

    for path, value in flatten_params(run.params).items():
        np.testing.assert_array_equal(exported["/".join(path)], value)


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_is_exact(tmp_path, capsys):
    args = TINY + ["--steps", "10", "--save-every", "4", "--eval-every", "5"]
    straight = tmp_path / "straight"
    assert train.main(args + ["--workdir", str(straight)]) == 0
    capsys.readouterr()

    killed = tmp_path / "killed"
    env = dict(os.environ, FLAX_TRANSFORMER_TEST_SIGKILL_AT_STEP="6")
    cmd = [sys.executable, str(ROOT / "train.py"), *args, "--workdir", str(killed)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert [p.name for p in (killed / "checkpoints").iterdir() if p.name.isdigit()] == ["4"]
    assert not (killed / "results.json").exists()

    env.pop("FLAX_TRANSFORMER_TEST_SIGKILL_AT_STEP")
    resumed = subprocess.run(cmd + ["--resume"], env=env, cwd=ROOT, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from step 4" in resumed.stdout
    expected, _ = load_safetensors(straight / "flax_params.safetensors")
    actual, _ = load_safetensors(killed / "flax_params.safetensors")
    assert expected.keys() == actual.keys()
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)  # bit-exact
    records = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().split("\n")
               if line]  # fmt: skip
    train_steps = [r["step"] for r in records if r["kind"] == "train"]
    assert train_steps == [2, 4, 6, 8, 10]  # the killed run's step-6 record was dropped


def test_tsv_corpus_with_bpe_trains_with_one_command(tmp_path, capsys):
    rng = np.random.default_rng(0)
    words = ["chat", "chien", "maison", "arbre", "soleil", "lune", "eau", "feu"]
    lines = []
    for _ in range(60):
        chosen = rng.choice(words, size=3)
        lines.append(" ".join(chosen) + "\t" + " ".join(w.upper() for w in chosen))
    noise = "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), size=80))
    lines.append(noise + "\ty")  # longer than --max-len 24: skipped with a warning
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    workdir = tmp_path / "mt"
    code, out, err = run_main(
        capsys, *TINY, "--train-tsv", tmp_path / "train.tsv", "--tokenizer", "bpe",
        "--bpe-vocab-size", "300", "--max-len", "24", "--steps", "4", "--eval-every", "4",
        "--save-every", "4", "--workdir", workdir,
    )  # fmt: skip
    assert code == 0, err
    assert "warning: 1 pair(s) longer than max_len 24 were skipped" in err
    assert "train.tsv:61" in err
    assert "held out 3 of 61 examples" in out
    run = json.loads((workdir / "run.json").read_text())
    assert run["tokenizer"] == "bpe" and run["train_examples"] + run["valid_examples"] == 60
    assert json.loads((workdir / "results.json").read_text())["steps"] == 4


def test_lm_text_trains_a_decoder_only_model(tmp_path, capsys):
    import torch

    import torch_reference
    from flax_transformer.interop.convert import load_torch_state

    text = "the cat sat on the mat\n机器学习很有趣\nhello world\n" * 4
    (tmp_path / "book.txt").write_text(text, encoding="utf-8")
    workdir = tmp_path / "lm"
    code, _, err = run_main(
        capsys, *TINY, "--lm-text", tmp_path / "book.txt", "--steps", "4", "--eval-every", "4",
        "--save-every", "4", "--workdir", workdir,
    )  # fmt: skip
    assert code == 0, err
    results = json.loads((workdir / "results.json").read_text())
    assert results["perplexity"] == pytest.approx(np.exp(results["valid_nll"]))
    assert 1.0 < results["perplexity"] < 1000.0
    assert json.loads((workdir / "run.json").read_text())["model"] == "lm"
    state, config, kind = load_torch_state(workdir / "torch_model.safetensors")
    assert kind == "lm"
    model = torch_reference.load_numpy_state(torch_reference.TransformerLM(config), state)
    with torch.no_grad():
        assert model.eval()(torch.tensor([[1, 5, 6]])).shape == (1, 3, config.tgt_vocab_size)


# ----------------------------------------------------------------------------- bad input
def assert_clean_error(code, err, expected_code, *fragments):
    assert code == expected_code, err
    assert err.startswith("error: ")
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


@pytest.mark.parametrize(
    "content, fragments",
    [
        ("ok\tfine\nno tab on this line\n", ["bad.tsv line 2: no tab"]),
        ("", ["bad.tsv: the file is empty"]),
        (b"ok\tfine\n\xff\xfe\tx\n", ["bad.tsv line 2: not valid UTF-8", "0xff"]),
    ],
    ids=["no-tab", "empty", "not-utf8"],
)
def test_bad_tsv_gets_a_clear_message(tmp_path, capsys, content, fragments):
    path = tmp_path / "bad.tsv"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    workdir = tmp_path / "w"
    code, _, err = run_main(capsys, "--train-tsv", path, "--workdir", workdir)
    assert_clean_error(code, err, 1, *fragments)
    assert not (workdir / "run.json").exists()  # nothing written for a broken run


def test_existing_run_is_never_overwritten(tiny_run, capsys):
    before = {p: p.stat().st_mtime_ns for p in tiny_run.rglob("*")}
    code, _, err = run_main(capsys, *TINY, "--steps", "8", "--workdir", tiny_run)
    assert_clean_error(code, err, 2, "already holds a run", "--resume")
    # A resume that asks for a different model is refused before anything is written.
    code, _, err = run_main(capsys, *TINY, "--d-model", "32", "--resume", "--workdir", tiny_run)
    assert_clean_error(code, err, 2, "--resume: the model config differs",
                       "d_model: 16 in the checkpoint, 32 requested")  # fmt: skip
    assert {p: p.stat().st_mtime_ns for p in tiny_run.rglob("*")} == before


def test_run_config_reproduces_a_runs_flags(tiny_run, tmp_path, capsys):
    args = train.parse_args(["--run-config", str(tiny_run / "run.json"), "--workdir", "elsewhere",
                             "--steps", "3"])  # fmt: skip
    assert (args.d_model, args.num_layers, args.dropout, args.lr) == (16, 1, 0.1, 3e-3)
    assert (args.steps, args.workdir) == (3, "elsewhere")  # the command line wins
    (tmp_path / "bad.json").write_text('{"d_modle": 3}')
    code, _, err = run_main(capsys, "--run-config", tmp_path / "bad.json")
    assert_clean_error(code, err, 2, "bad.json has unknown flag(s): d_modle")


def test_unwritable_workdir(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    code, _, err = run_main(capsys, "--workdir", blocker / "run")
    assert_clean_error(code, err, 2, "--workdir", "not writable", "a_file")


def test_resume_without_a_run(tmp_path, capsys):
    code, _, err = run_main(capsys, "--resume", "--workdir", tmp_path / "nothing")
    assert_clean_error(code, err, 2, "--resume", "nothing to resume")


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--steps", "0"], "--steps must be > 0"),
        (["--label-smoothing", "1.5"], "--label-smoothing must be in [0, 1)"),
        (["--task", "copy", "--lm-text", "x.txt"], "choose one data source"),
        (["--tokenizer", "bpe"], "--tokenizer bpe needs a corpus"),
        (["--train-tsv", "missing.tsv"], "missing.tsv: cannot read"),
        (["--num-heads", "3"], "must be divisible by num_heads"),
    ],
)
def test_bad_flags(tmp_path, capsys, argv, fragment):
    code, _, err = run_main(capsys, *argv, "--workdir", tmp_path / "w")
    assert code in (1, 2)
    assert_clean_error(code, err, code, fragment)


def test_help_explains_the_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--task", "--train-tsv", "--lm-text", "--resume", "--schedule", "--workdir"):
        assert flag in out


def test_diverging_run_stops_with_a_clear_message_and_saves_nothing_broken(tmp_path, capsys):
    # lr 1e30 without clipping: after the first updates the parameters' norm overflows.
    workdir = tmp_path / "diverged"
    code, _, err = run_main(
        capsys, *TINY, "--lr", "1e30", "--clip-norm", "0", "--steps", "6", "--save-every", "2",
        "--workdir", workdir,
    )  # fmt: skip
    assert code == 1
    assert "the loss became" in err and "by step 2" in err and "--lr" in err
    checkpoints = workdir / "checkpoints"
    assert not checkpoints.exists() or not any(p.name.isdigit() for p in checkpoints.iterdir())
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(r.get("train_loss", 0.0)) for r in records)
