"""train.py end to end with tiny models: what a run leaves behind, the way out to torch,
exact resume after SIGKILL, step hooks, and the messages bad input gets.

Every run compiles, so the module trains few runs and shares them: one straight run serves the
artifact, export, overwrite, run-config and resume checks, one LM run the LM and hook checks;
only the run that must crash runs in its own process.
"""

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import train
from flax_transformer.interop.convert import load_safetensors
from flax_transformer.runs.load import load_run
from flax_transformer.spec.naming import flatten_params
from flax_transformer.training.hooks import STOP

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--task-min-len", "1", "--task-max-len", "5", "--task-train-size", "300",
    "--task-valid-size", "24", "--d-model", "16", "--num-heads", "2", "--num-layers", "1",
    "--d-ff", "32", "--max-len", "16", "--batch-size", "8", "--log-every", "2",
    "--dropout", "0.1", "--lr", "3e-3", "--warmup", "3",
]  # fmt: skip
STRAIGHT = TINY + ["--steps", "10", "--eval-every", "8", "--save-every", "4"]
# Runs whose checks do not involve dropout turn it off: it doubles the train step's compile time.
NO_DROPOUT = ["--dropout", "0"]
# Crashes train.py for real, with no test switch in the library: a step hook that SIGKILLs its
# own process after step argv[1] (once pending saves are on disk, so the crash point is fixed).
KILL_AT_STEP = """
import os, signal, sys
import train

def kill(info):
    if info.event == "step" and info.step == int(sys.argv[1]):
        info.wait_for_checkpoints()
        os.kill(os.getpid(), signal.SIGKILL)

sys.exit(train.main(sys.argv[2:], hooks=[kill]))
"""


def run_main(capsys, *argv, hooks=()):
    code = train.main([str(a) for a in argv], hooks=hooks)
    out, err = capsys.readouterr()
    return code, out, err


def read_records(workdir):
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line]


def steps_of(records, kind):
    return [r["step"] for r in records if r["kind"] == kind]


def checkpoint_steps(workdir):
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def assert_checkpoint_is_the_exported_model(workdir, step):
    """The latest checkpoint is `step` and holds exactly the exported Flax parameters."""
    run = load_run(workdir)
    assert run.step == step
    exported, _ = load_safetensors(workdir / "flax_params.safetensors")
    flat = flatten_params(run.params)
    assert {"/".join(path) for path in flat} == set(exported)
    for path, value in flat.items():
        np.testing.assert_array_equal(exported["/".join(path)], value)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("run") / "reverse"
    assert train.main(STRAIGHT + ["--workdir", str(workdir)]) == 0
    return workdir


def test_run_leaves_results_pictures_checkpoints(straight):
    for name in ("config.json", "run.json", "tokenizer.json", "metrics.jsonl", "curves.png",
                 "attention.png", "results.json", "flax_params.safetensors",
                 "torch_model.safetensors"):  # fmt: skip
        assert (straight / name).stat().st_size > 0, name
    assert checkpoint_steps(straight) == [4, 8, 10]  # every 4 steps, and the last one
    results = json.loads((straight / "results.json").read_text())
    for key in ("exact_match", "bleu", "valid_loss", "token_accuracy", "tokens_per_sec",
                "wall_time_s", "steps", "examples"):  # fmt: skip
        assert key in results, key
    assert results["steps"] == 10 and 0.0 <= results["exact_match"] <= 1.0
    assert results["stopped_early"] is False
    assert np.isfinite(results["valid_loss"]) and results["tokens_per_sec"] > 0
    records = read_records(straight)
    assert steps_of(records, "train") == [2, 4, 6, 8, 10]
    assert steps_of(records, "eval") == [8, 10]
    run = json.loads((straight / "run.json").read_text())
    assert run["model"] == "seq2seq" and run["tokenizer"] == "byte"


def test_exported_torch_weights_give_the_same_logits(straight):
    import jax
    import jax.numpy as jnp
    import torch

    import torch_reference
    from flax_transformer.interop.convert import load_torch_state
    from flax_transformer.spec.numerics import assert_close

    state, config, kind = load_torch_state(straight / "torch_model.safetensors")
    assert kind == "seq2seq"
    torch_model = torch_reference.load_numpy_state(torch_reference.Transformer(config), state)
    run = load_run(straight)
    assert run.config == config
    src = np.array([[5, 9, 12, 2, 0, 0], [7, 7, 8, 9, 10, 2]])
    tgt = np.array([[1, 12, 9, 5], [1, 10, 9, 0]])
    flax_logits = jax.jit(run.model.apply)(run.params, jnp.asarray(src), jnp.asarray(tgt))
    with torch.no_grad():
        torch_logits = torch_model.eval()(torch.from_numpy(src), torch.from_numpy(tgt)).numpy()
    assert_close(np.asarray(flax_logits), torch_logits, rtol=1e-5, what="exported logits")
    # The last checkpoint and the exported Flax file hold the same parameters.
    assert_checkpoint_is_the_exported_model(straight, 10)


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_is_exact(straight, tmp_path, capsys):
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-c", KILL_AT_STEP, "7", *STRAIGHT, "--workdir", str(killed)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert checkpoint_steps(killed) == [4]
    assert not (killed / "results.json").exists()
    assert steps_of(read_records(killed), "train") == [2, 4, 6]  # 6: after the checkpoint

    # Only the crash needs its own process: the resume runs in this one.
    code, out, err = run_main(capsys, *STRAIGHT, "--workdir", killed, "--resume")
    assert code == 0, err
    assert "resumed from step 4" in out
    expected, _ = load_safetensors(straight / "flax_params.safetensors")
    actual, _ = load_safetensors(killed / "flax_params.safetensors")
    assert expected.keys() == actual.keys()
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)  # bit-exact
    # The killed run's step-6 record was dropped on resume and written again once.
    assert steps_of(read_records(killed), "train") == [2, 4, 6, 8, 10]


@pytest.mark.slow  # trains a BPE and a run (~16 s on 2 cores): CI runs it
def test_tsv_corpus_with_bpe_trains_with_one_command_and_a_step_hook_stops_it(tmp_path, capsys):
    rng = np.random.default_rng(0)
    words = ["chat", "chien", "maison", "arbre", "soleil", "lune", "eau", "feu"]
    lines = []
    for _ in range(60):
        chosen = rng.choice(words, size=2)
        lines.append(" ".join(chosen) + "\t" + " ".join(w.upper() for w in chosen))
    noise = "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), size=80))
    lines.append(noise + "\ty")  # longer than --max-len 16: skipped with a warning
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    workdir = tmp_path / "mt"

    def stop_at_step_3(info):
        return STOP if info.event == "step" and info.step == 3 else None

    code, out, err = run_main(
        capsys, *TINY, *NO_DROPOUT, "--train-tsv", tmp_path / "train.tsv", "--tokenizer", "bpe",
        "--bpe-vocab-size", "300", "--steps", "6", "--eval-every", "4", "--save-every", "4",
        "--workdir", workdir, hooks=[stop_at_step_3],
    )  # fmt: skip
    assert code == 0, err
    assert "warning: 1 pair(s) longer than max_len 16 were skipped" in err
    assert "train.tsv:61" in err
    assert "held out 3 of 61 examples" in out
    run = json.loads((workdir / "run.json").read_text())
    assert run["tokenizer"] == "bpe" and run["train_examples"] + run["valid_examples"] == 60
    # Stopped by the hook after step 3 (no log or save step): logged and saved like a last step.
    results = json.loads((workdir / "results.json").read_text())
    assert results["steps"] == 3 and results["stopped_early"] is True
    assert "stopped early by a step hook" in out
    assert steps_of(read_records(workdir), "train") == [2, 3]
    assert checkpoint_steps(workdir) == [3]
    assert_checkpoint_is_the_exported_model(workdir, 3)


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """An LM run of 8 steps whose hook records every call and stops it at the step-3 evaluation."""
    tmp = tmp_path_factory.mktemp("lm")
    text = "the cat sat on the mat\n机器学习很有趣\nhello world\n" * 4
    (tmp / "book.txt").write_text(text, encoding="utf-8")
    seen = []

    def record_and_stop(info):
        metrics = {name: float(value) for name, value in info.metrics.items()}
        seen.append((info.event, info.step, int(info.state.step), metrics))
        return STOP if info.event == "eval" and info.step == 3 else None

    workdir = tmp / "lm"
    argv = TINY + NO_DROPOUT + ["--lm-text", str(tmp / "book.txt"), "--steps", "8",
                                "--eval-every", "3", "--save-every", "4",
                                "--workdir", str(workdir)]  # fmt: skip
    assert train.main(argv, hooks=[record_and_stop]) == 0
    return workdir, seen


def test_lm_text_trains_a_decoder_only_model(lm_run):
    import torch

    import torch_reference
    from flax_transformer.interop.convert import load_torch_state

    workdir, _ = lm_run
    results = json.loads((workdir / "results.json").read_text())
    assert results["perplexity"] == pytest.approx(np.exp(results["valid_nll"]))
    assert 1.0 < results["perplexity"] < 1000.0
    assert json.loads((workdir / "run.json").read_text())["model"] == "lm"
    state, config, kind = load_torch_state(workdir / "torch_model.safetensors")
    assert kind == "lm"
    model = torch_reference.load_numpy_state(torch_reference.TransformerLM(config), state)
    with torch.no_grad():
        assert model.eval()(torch.tensor([[1, 5, 6]])).shape == (1, 3, config.tgt_vocab_size)


def test_a_hook_sees_every_step_and_evaluation_and_can_stop_the_run(lm_run):
    workdir, seen = lm_run
    steps = [(step, state_step) for event, step, state_step, _ in seen if event == "step"]
    assert steps == [(1, 1), (2, 2), (3, 3)]  # every step, with the state after it
    for event, _, _, metrics in seen:
        if event == "step":
            assert set(metrics) == {"loss_sum", "token_count", "correct", "grad_norm"}
            assert metrics["token_count"] > 0 and np.isfinite(metrics["loss_sum"])
    # The eval that stopped the run, then the final one: what metrics.jsonl records.
    evals = [(step, metrics) for event, step, _, metrics in seen if event == "eval"]
    records = read_records(workdir)
    logged = [{k: r[k] for k in ("valid_loss", "token_accuracy")} for r in records
              if r["kind"] == "eval"]  # fmt: skip
    assert [step for step, _ in evals] == [3, 3] and [m for _, m in evals] == logged
    # Step 3 is neither a log nor a save step; the stop logs and saves it like a last step.
    assert steps_of(records, "train") == [2, 3]
    assert checkpoint_steps(workdir) == [3]
    results = json.loads((workdir / "results.json").read_text())
    assert results["steps"] == 3 and results["stopped_early"] is True
    assert_checkpoint_is_the_exported_model(workdir, 3)


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
    assert_clean_error(code, err, 2, *fragments)
    assert not (workdir / "run.json").exists()  # nothing written for a broken run


def test_existing_run_is_never_overwritten(straight, capsys):
    before = {p: p.stat().st_mtime_ns for p in straight.rglob("*")}
    code, _, err = run_main(capsys, *TINY, "--steps", "8", "--workdir", straight)
    assert_clean_error(code, err, 2, "already holds a run", "--resume")
    # A resume that asks for a different model is refused before anything is written.
    code, _, err = run_main(capsys, *TINY, "--d-model", "32", "--resume", "--workdir", straight)
    assert_clean_error(code, err, 2, "--resume: the model config differs",
                       "d_model: 16 in the checkpoint, 32 requested")  # fmt: skip
    assert {p: p.stat().st_mtime_ns for p in straight.rglob("*")} == before


def test_run_config_reproduces_a_runs_flags(straight, tmp_path, capsys):
    args = train.parse_args(["--run-config", str(straight / "run.json"), "--workdir", "elsewhere",
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
        (["--steps", "0"], "argument --steps: must be a positive int, got 0"),
        (["--label-smoothing", "1.5"], "argument --label-smoothing: must be a finite number in"),
        (["--clip-norm", "-1"], "argument --clip-norm: must be a finite number >= 0, got -1.0"),
        (["--lr", "0"], "argument --lr: must be a finite number > 0"),
        (["--task", "copy", "--lm-text", "x.txt"], "choose one data source"),
        (["--tokenizer", "bpe"], "--tokenizer bpe needs a corpus"),
        (["--train-tsv", "missing.tsv"], "missing.tsv: cannot read"),
        (["--num-heads", "3"], "must be divisible by num_heads"),
    ],
)
def test_bad_flags(tmp_path, capsys, argv, fragment):
    # A small task, so that errors found after the data is made come quickly.
    code, _, err = run_main(capsys, "--task-train-size", "10", *argv, "--workdir", tmp_path / "w")
    assert code in (1, 2)
    if "argument --" in fragment:  # argparse's own error: usage, then the message
        assert code == 2 and fragment in err and "Traceback" not in err
    else:
        assert_clean_error(code, err, code, fragment)


def test_help_explains_the_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--task", "--train-tsv", "--lm-text", "--resume", "--schedule", "--workdir"):
        assert flag in out


def test_flag_defaults_are_the_options_defaults_and_the_small_preset():
    import dataclasses

    from flax_transformer.data.tokenizer import ByteTokenizer
    from flax_transformer.runs.checks import bleu_tokenizer, options_from_spec
    from flax_transformer.runs.spec import TrainSpec
    from flax_transformer.runs.train import make_config
    from flax_transformer.spec.presets import preset
    from flax_transformer.training.options import DataOptions, TrainOptions, option_fields

    args = train.parse_args([])
    without_flag = []
    for options_class in (TrainOptions, DataOptions):
        for field in dataclasses.fields(options_class):
            if field.name not in vars(args):
                without_flag.append(field.name)
            elif field.name not in ("task", "bleu_tokenize"):
                assert getattr(args, field.name) == field.default, field.name
    assert without_flag == ["num_examples"]  # every other option is a flag
    # These two default to "chosen for you": the built-in task, and its BLEU tokenizer.
    assert args.task is None and args.bleu_tokenize == "auto"
    spec = train.spec_from_args(args)
    assert spec == TrainSpec()  # the flags' defaults are the spec's
    assert options_from_spec(DataOptions, spec, task="reverse") == DataOptions()
    options = options_from_spec(TrainOptions, spec, bleu_tokenize=bleu_tokenizer(spec))
    assert options == dataclasses.replace(TrainOptions(), bleu_tokenize="char")
    config = make_config(spec, ByteTokenizer(), Path("unused"))
    assert config == preset("small", src_vocab_size=259, tgt_vocab_size=259)
    # --help shows those very defaults.
    text = " ".join(train.build_parser().format_help().split())
    for options_class, name in ((TrainOptions, "batch_size"), (DataOptions, "bpe_vocab_size")):
        field = option_fields(options_class)[name]
        assert f"{field.metadata['help']} (default: {field.default})" in text
    assert f"width (default: {config.d_model})" in text
    assert "built-in generated task (default: reverse)" in text


@pytest.mark.slow  # ~10 s on 2 cores: CI runs it
def test_diverging_run_stops_with_a_clear_message_and_saves_nothing_broken(tmp_path, capsys):
    # lr 1e30 without clipping: after the first updates the parameters' norm overflows.
    workdir = tmp_path / "diverged"
    code, _, err = run_main(
        capsys, *TINY, *NO_DROPOUT, "--lr", "1e30", "--clip-norm", "0", "--steps", "6",
        "--save-every", "2", "--workdir", workdir,
    )  # fmt: skip
    assert code == 1
    assert "the loss became" in err and "by step 2" in err and "--lr" in err
    checkpoints = workdir / "checkpoints"
    assert not checkpoints.exists() or not any(p.name.isdigit() for p in checkpoints.iterdir())
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(r.get("train_loss", 0.0)) for r in records)
