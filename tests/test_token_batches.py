"""--batch-tokens (batches sized in tokens, as the paper batches) and --valid-max (a bounded
evaluation), issue #25."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import train
from flax_transformer.data.pipeline import BatchLoader, Dataset, Pair, bucket_boundaries
from flax_transformer.data.token_batches import (
    BatchTokensError,
    batch_shapes,
    check_budget_fits,
    logits_bytes,
    plan_token_batches,
    rows_for,
)
from flax_transformer.runs.run_dir import read_metrics

TINY = [
    "--task-min-len", "1", "--task-max-len", "12", "--task-train-size", "300",
    "--task-valid-size", "40", "--d-model", "16", "--num-heads", "2", "--num-layers", "1",
    "--d-ff", "32", "--max-len", "16", "--warmup", "2", "--dropout", "0.0", "--steps", "4",
    "--save-every", "4", "--eval-every", "2", "--log-every", "1",
]  # fmt: skip


def ragged_dataset(count: int, seed: int = 0, longest: int = 60) -> Dataset:
    """`count` examples of random lengths 1..longest (source and target lengths differ)."""
    rng = np.random.default_rng(seed)
    src, tgt_in, tgt_out, pairs = [], [], [], []
    for i in range(count):
        s, t = rng.integers(1, longest + 1, 2)
        src.append(np.full(s, 5, np.int32))
        tgt_in.append(np.full(t, 6, np.int32))
        tgt_out.append(np.full(t, 7, np.int32))
        pairs.append(Pair("x", "y", f"gen:{i + 1}"))
    return Dataset(tgt_in, tgt_out, src, pairs)


@pytest.mark.parametrize("budget, multiple", [(64, 1), (100, 1), (256, 4), (1000, 2)])
def test_no_batch_exceeds_its_token_budget_and_every_example_comes_once(budget, multiple):
    dataset = ragged_dataset(500)
    loader = BatchLoader(dataset, 8, 64, seed=3, batch_tokens=budget, multiple=multiple)
    plan = loader._epoch_plan()
    seen = np.concatenate([indices for _, (_, indices) in plan])
    assert sorted(seen.tolist()) == list(range(len(dataset)))  # each example exactly once
    shapes = set()
    for _ in range(len(plan)):
        batch = next(loader)
        for key in ("src", "tgt_in", "tgt_out"):
            rows, length = batch[key].shape
            assert rows * length <= budget, (key, rows, length)  # padding counted
            assert rows % multiple == 0
            # The real tokens (not padding) are within the budget a fortiori.
            assert int((batch[key] != 0).sum()) <= budget
        shapes.add(batch["src"].shape)
    # One shape per bucket at most: the step compiles a bounded number of times.
    assert len(shapes) <= len(bucket_boundaries(64))


def test_token_batches_fill_short_buckets_with_more_rows():
    shapes = dict((length, rows) for rows, length in batch_shapes(2048, bucket_boundaries(256)))
    assert shapes[8] == 256 and shapes[256] == 8  # 2048 tokens: 256 rows of 8, 8 rows of 256
    assert rows_for(24, 100, multiple=2) == 4  # 100 // 24 = 4, a multiple of 2


def test_a_budget_below_the_longest_bucket_is_refused_naming_the_fix():
    with pytest.raises(
        BatchTokensError, match="--batch-tokens 200 cannot hold 1 row.*at least 256"
    ):
        batch_shapes(200, bucket_boundaries(256))
    with pytest.raises(BatchTokensError, match="cannot hold 4 row"):
        plan_token_batches(np.array([3, 5]), 40, bucket_boundaries(16), multiple=4)


def test_the_plan_is_deterministic_from_the_seed():
    dataset = ragged_dataset(200)
    a = BatchLoader(dataset, 8, 64, seed=1, batch_tokens=128)
    b = BatchLoader(dataset, 8, 64, seed=1, batch_tokens=128)
    for _ in range(30):  # across an epoch boundary
        x, y = next(a), next(b)
        assert all(np.array_equal(x[k], y[k]) for k in x)
    b.restore(a.state())
    x, y = next(a), next(b)
    assert all(np.array_equal(x[k], y[k]) for k in x)


@pytest.mark.slow  # a training run (about 12 s)
def test_training_with_batch_tokens_and_a_capped_validation_set(tmp_path, capsys):
    workdir = tmp_path / "run"
    flags = [*TINY, "--batch-tokens", "128", "--valid-max", "10", "--workdir", str(workdir)]
    assert train.main(flags) == 0
    out = capsys.readouterr().out
    assert "--batch-tokens 128: 2 batch shapes (rows x length) 16x8, 8x16" in out
    assert re.search(r"validation: the first 10 of \d\d examples \(--valid-max 10\)", out)
    evals = [r for r in read_metrics(workdir / "metrics.jsonl") if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [2, 4]
    assert [(r["valid_examples"], r["decoded_examples"]) for r in evals] == [(10, 0), (10, 10)]
    results = json.loads((workdir / "results.json").read_text())
    assert (results["valid_examples"], results["decoded_examples"]) == (10, 10)
    run = json.loads((workdir / "run.json").read_text())
    assert run["spec"]["training"]["batch_tokens"] == 128


def test_a_batch_token_budget_too_small_is_refused_before_anything_is_written(tmp_path, capsys):
    workdir = tmp_path / "run"
    assert train.main([*TINY, "--batch-tokens", "12", "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert "--batch-tokens 12 cannot hold 1 row(s) of 16 tokens" in err
    assert not workdir.exists()


def test_a_budget_far_above_the_memory_is_refused_before_anything_is_written(tmp_path, capsys):
    """--batch-tokens far larger than the data and the machine: a MemoryError after minutes,
    and a run directory that refused the corrected command; now one line, nothing written."""
    workdir = tmp_path / "run"
    budget = 10**11
    assert train.main([*TINY, "--batch-tokens", str(budget), "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert f"error: --batch-tokens {budget}: a batch of " in err and "Traceback" not in err
    assert "GiB for its logits alone" in err and "GiB available: use at most" in err
    assert not workdir.exists()


def test_the_budget_check_counts_the_largest_batch_logits():
    shapes = [(16, 8), (8, 16), (2, 60)]
    assert logits_bytes(shapes, 100) == 128 * 100 * 4
    check_budget_fits(128, shapes, 100, available=128 * 100 * 4)  # exactly fits
    check_budget_fits(128, shapes, 100, available=None)  # unknown: not refused
    with pytest.raises(BatchTokensError, match=r"a batch of 2 rows x 60 tokens .* at most 119 "):
        check_budget_fits(128, [(2, 60)], 100, available=119 * 100 * 4 + 3)


# ----------------------------------------------------------------------------- --pack
def test_packed_loader_gives_one_shape_and_every_example_once_an_epoch():
    dataset = ragged_dataset(300, longest=20)
    loader = BatchLoader(dataset, 4, 64, seed=2, pack=True)
    plan = loader._epoch_plan()
    placed = sorted(i for batch in plan for row in batch for i in row)
    assert placed == list(range(len(dataset)))
    real = 0
    for _ in range(len(plan)):
        batch = next(loader)
        assert {array.shape for array in batch.values()} == {(4, 64)}  # one compiled shape
        assert set(batch) >= {"src_segments", "tgt_segments", "src_positions", "tgt_positions"}
        real += int((batch["tgt_segments"] > 0).sum())
    assert real == sum(len(t) for t in dataset.tgt_in)  # every target token, once
    # Packing fills rows: far fewer batches than one example per row would need (300 / 4).
    assert len(plan) < 300 / 4 / 2


@pytest.mark.slow  # a training run (about 12 s)
def test_training_with_pack(tmp_path, capsys):
    workdir = tmp_path / "run"
    assert train.main([*TINY, "--pack", "--batch-size", "4", "--workdir", str(workdir)]) == 0
    run = json.loads((workdir / "run.json").read_text())
    assert run["spec"]["training"]["pack"] is True
    results = json.loads((workdir / "results.json").read_text())
    assert np.isfinite(results["valid_loss"])


def test_pack_with_batch_tokens_is_refused(tmp_path, capsys):
    workdir = tmp_path / "run"
    assert train.main([*TINY, "--pack", "--batch-tokens", "64", "--workdir", str(workdir)]) == 2
    assert "--pack and --batch-tokens both size the batches" in capsys.readouterr().err
    assert not workdir.exists()
