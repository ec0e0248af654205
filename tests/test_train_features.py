"""train.py's --grad-accum, TensorBoard events, --profile-steps, --keep-best and --early-stop,
end to end with tiny in-process runs (each run compiles, so the runs are shared)."""

import json

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import train
from flax_transformer.cli import generate as generate_cli
from flax_transformer.interop.convert import load_safetensors
from flax_transformer.runs.load import checkpoint_steps, load_run
from flax_transformer.spec.naming import flatten_params
from flax_transformer.training.best import BestTracker

TINY = [
    "--task-min-len", "3", "--task-max-len", "5", "--task-train-size", "300",
    "--task-valid-size", "16", "--d-model", "16", "--num-heads", "2", "--num-layers", "1",
    "--d-ff", "32", "--max-len", "16", "--batch-size", "8", "--warmup", "2", "--dropout", "0.0",
]  # fmt: skip
# 6 steps, a checkpoint and an evaluation every 2, a metrics line every step.
RUN = TINY + ["--steps", "6", "--save-every", "2", "--eval-every", "2", "--log-every", "1"]
RUN += ["--lr", "3e-3"]


class Crash(Exception):  # not one train.main turns into an exit status
    pass


def crash_at(step):
    """A step hook that ends the run at `step` once pending checkpoints are on disk."""

    def hook(info):
        if info.event == "step" and info.step == step:
            info.wait_for_checkpoints()
            raise Crash(f"crash at step {step}")

    return hook


def main(*argv, hooks=()):
    return train.main([str(a) for a in argv], hooks=hooks)


@pytest.fixture(scope="module")
def accumulated(tmp_path_factory):
    """--grad-accum 4 (profiled at steps 2..3), crashed after step 5 (last checkpoint: 4) and
    resumed, next to the same run with --grad-accum 1 and --keep-best valid_loss."""
    root = tmp_path_factory.mktemp("features")
    accum, plain = root / "accum", root / "plain"
    flags = RUN + ["--grad-accum", "4", "--profile-steps", "2:3", "--workdir", accum]
    with pytest.raises(Crash):
        main(*flags, hooks=[crash_at(5)])
    assert main(*flags, "--resume") == 0
    assert main(*RUN, "--grad-accum", "1", "--keep-best", "valid_loss", "--workdir", plain) == 0
    return accum, plain


@pytest.mark.slow
def test_grad_accum_run_ends_with_the_weights_of_the_plain_run(accumulated):
    accum, plain = accumulated
    expected, _ = load_safetensors(plain / "flax_params.safetensors")
    actual, _ = load_safetensors(accum / "flax_params.safetensors")
    assert expected.keys() == actual.keys()
    for name in expected:
        if name.endswith("key/bias"):
            # Softmax ignores a shift shared by a row of scores: 0 gradient in exact
            # arithmetic, rounding noise that Adam scales up to ~lr per step in both runs.
            assert np.abs(actual[name] - expected[name]).max() <= 2 * 3e-3 * 6, name
            continue
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-5, atol=1e-5, err_msg=name)
    run = json.loads((accum / "run.json").read_text())
    assert run["spec"]["training"]["grad_accum"] == 4


def test_bad_grad_accum_names_both_flags(tmp_path, capsys):
    assert main(*RUN, "--grad-accum", "3", "--workdir", tmp_path / "run") == 2
    err = capsys.readouterr().err
    assert "--grad-accum (3) must divide --batch-size (8)" in err
    assert not (tmp_path / "run").exists()


def read_events(directory):
    events = EventAccumulator(str(directory), size_guidance={"scalars": 0, "tensors": 0})
    return events.Reload()


@pytest.mark.slow
def test_tensorboard_holds_the_metrics_once_per_step(accumulated):
    accum, _ = accumulated
    events = read_events(accum / "tensorboard")
    tags = events.Tags()
    for tag in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_sec"):
        # The crashed run logged step 5 after its last checkpoint (4); the resumed run purges
        # it and logs it again: the reader sees every step once.
        assert [e.step for e in events.Scalars(tag)] == [1, 2, 3, 4, 5, 6], tag
    for tag in ("valid/loss", "valid/token_accuracy"):
        assert [e.step for e in events.Scalars(tag)] == [2, 4, 6], tag
    assert [e.step for e in events.Scalars("valid/exact_match")] == [6]
    assert tags["images"] == ["valid/attention"]
    assert "valid/examples/text_summary" in tags["tensors"]
    records = [json.loads(line) for line in (accum / "metrics.jsonl").read_text().splitlines()]
    train_loss = [r["train_loss"] for r in records if r["kind"] == "train"]
    np.testing.assert_allclose(
        [e.value for e in events.Scalars("train/loss")], train_loss, rtol=1e-6
    )


@pytest.mark.slow
def test_profile_steps_writes_a_trace(accumulated, tmp_path, capsys):
    accum, _ = accumulated
    traces = list((accum / "profile").rglob("*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0
    for value, message in [
        ("3", "--profile-steps must be FIRST:LAST step numbers, e.g. 10:12, got '3'"),
        ("4:2", "--profile-steps must be FIRST:LAST with 1 <= FIRST <= LAST, got '4:2'"),
        ("5:9", "--profile-steps ends at step 9, after the last step (6)"),
    ]:
        assert main(*RUN, "--profile-steps", value, "--workdir", tmp_path / "run") == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_keep_best_keeps_the_lowest_validation_loss(accumulated):
    _, plain = accumulated
    records = [json.loads(line) for line in (plain / "metrics.jsonl").read_text().splitlines()]
    evals = {r["step"]: r["valid_loss"] for r in records if r["kind"] == "eval"}
    best_step = min(evals, key=evals.get)
    assert checkpoint_steps(plain / "checkpoints_best") == [best_step]
    results = json.loads((plain / "results.json").read_text())
    assert results["best"]["best_step"] == best_step
    assert results["best"]["best"] == pytest.approx(evals[best_step], rel=1e-6)
    assert load_run(plain).checkpoint == "best" and load_run(plain).step == best_step
    assert load_run(plain, "last").step == 6
    assert load_run(plain, 4).step == 4
    with pytest.raises(ValueError, match="no checkpoint of step 3"):
        load_run(plain, 3)


@pytest.mark.slow
def test_early_stop_and_its_resume(tmp_path, capsys):
    """An untrained model's exact match stays 0: the first evaluation (step 2) is the best and
    every later one is a miss. Patience 1 stops at step 4; resumed with patience 2, the run
    knows it already missed once and stops at step 6 (a fresh count would stop at step 10)."""
    workdir = tmp_path / "run"
    flags = TINY + ["--steps", "20", "--eval-every", "2", "--save-every", "2", "--lr", "1e-6"]
    flags += ["--keep-best", "exact_match", "--workdir", workdir]
    assert main(*flags, "--early-stop", "1") == 0
    out = capsys.readouterr().out
    results = json.loads((workdir / "results.json").read_text())
    assert results["steps"] == 4 and results["stopped_early"] is True
    assert results["stop_reason"] == "early_stop" and "exact_match has not improved" in out
    assert results["best"] == {
        "metric": "exact_match", "best": 0.0, "best_step": 2, "evals_since_best": 1,
        "last_step": 4,
    }  # fmt: skip
    assert checkpoint_steps(workdir / "checkpoints_best") == [2]
    assert main(*flags, "--early-stop", "2", "--resume") == 0
    assert (
        "best exact_match so far 0.0000 at step 2, 1 evaluation(s) since" in capsys.readouterr().out
    )
    results = json.loads((workdir / "results.json").read_text())
    assert results["steps"] == 6 and results["stop_reason"] == "early_stop"
    assert results["best"]["evals_since_best"] == 2
    assert checkpoint_steps(workdir / "checkpoints_best") == [2]
    best = load_run(workdir)
    assert best.step == 2 and load_run(workdir, "last").step == 6
    # The best checkpoint is exported beside the last one.
    exported, _ = load_safetensors(workdir / "best_flax_params.safetensors")
    for path, value in flatten_params(best.params).items():
        np.testing.assert_array_equal(exported["/".join(path)], value)
    assert results["weights"]["best_torch"].endswith("best_torch_model.safetensors")
    # generate: --checkpoint picks, a bad value is a usage error.
    (tmp_path / "in.txt").write_text("abc\n")
    assert generate_cli.main(["--workdir", str(workdir), "--checkpoint", "6",
                              "--input", str(tmp_path / "in.txt")]) == 0  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        generate_cli.main(["--workdir", str(workdir), "--checkpoint", "newest"])
    assert exit_info.value.code == 2
    assert "--checkpoint must be last, best or a step number" in capsys.readouterr().err


def test_best_tracker_counts_misses_once_per_step():
    tracker = BestTracker("valid_loss", patience=2)
    assert tracker.update(2, {"valid_loss": 3.0})
    assert not tracker.update(4, {"valid_loss": 3.0})  # equal is no improvement
    assert not tracker.update(4, {"valid_loss": 9.0})  # the same step again: not counted
    assert tracker.evals_since_best == 1 and not tracker.should_stop
    assert tracker.update(6, {"valid_loss": 2.5}) and tracker.best_step == 6
    assert not tracker.update(8, {"valid_loss": 2.6}) and not tracker.update(
        10, {"valid_loss": 2.7}
    )
    assert tracker.should_stop
    again = BestTracker.from_json(json.loads(json.dumps(tracker.to_json())), patience=3)
    assert again == BestTracker("valid_loss", 3, 2.5, 6, 2, 10) and not again.should_stop
    higher = BestTracker("exact_match")
    assert higher.update(1, {"exact_match": 0.5}) and higher.update(2, {"exact_match": 0.6})
    with pytest.raises(ValueError, match="metric must be one of"):
        BestTracker("bleu")


def test_the_loop_reads_no_init_run_itself(tmp_path):
    """--init-from's parameters reach the loop loaded (runs.load.init_params_from): a Job that
    names an init run but carries no parameters is refused, not silently trained from scratch."""
    from flax_transformer.training.loop import Job, run_training
    from flax_transformer.training.options import TrainOptions

    job = Job(tmp_path, None, "seq2seq", None, None, None, TrainOptions(init_from="elsewhere"))
    with pytest.raises(ValueError, match="init_params_from"):
        run_training(job)
