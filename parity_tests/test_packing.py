"""Packing proved (issue #25, `--pack`): the same examples packed several to a row and one per
row give the same per-example losses and the same gradients, float64, to ~1e-12 relative, in
Flax and in the torch twin; and the two twins agree on the packed batch. For the encoder-decoder
and for the decoder-only LM, with learned and with sinusoidal positions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_reference
from flax_transformer.data.packing import (
    PackingError,
    pack_examples,
    packed_model_kwargs,
    plan_packed_batches,
)
from flax_transformer.data.pipeline import Dataset, Pair, make_batch
from flax_transformer.interop.convert import torch_state_to_flax
from flax_transformer.nn.kinds import model_for
from flax_transformer.spec.kinds import LM, SEQ2SEQ
from flax_transformer.training.steps import compute_logits, smoothed_cross_entropy

from .helpers import small_config

ROW = 24  # packed row length
# Source / target lengths of the examples (with bos/eos), chosen so that first-fit packs them
# 3 + 2 into two rows of ROW tokens.
LENGTHS = [(7, 5), (4, 9), (10, 6), (6, 8), (5, 4)]
SMOOTHING = 0.1


def examples(kind: str, config, seed: int = 0) -> Dataset:
    """Random examples of LENGTHS; the LM takes the target side only."""
    rng = np.random.default_rng(seed)
    src, tgt_in, tgt_out, pairs = [], [], [], []
    for i, (s, t) in enumerate(LENGTHS):
        src.append(rng.integers(3, config.src_vocab_size, s).astype(np.int32))
        target = rng.integers(3, config.tgt_vocab_size, t + 1).astype(np.int32)
        tgt_in.append(target[:-1])
        tgt_out.append(target[1:])
        pairs.append(Pair("s", "t", f"ex:{i + 1}"))
    return Dataset(tgt_in, tgt_out, None if kind == LM else src, pairs)


def batches(dataset: Dataset):
    """(packed batch and its rows, unpacked batch: one example per row)."""
    rows = plan_packed_batches(dataset, rows=2, length=ROW, order=np.arange(len(dataset)))
    assert len(rows) == 1 and len(rows[0]) == 2  # one batch of two rows: packing happened
    packed = pack_examples(dataset, rows[0], 2, ROW)
    plain = make_batch(dataset, np.arange(len(dataset)), ROW, len(dataset))
    return packed, rows[0], plain


def per_token_losses(logits, targets):
    """(rows, len) smoothed per-token losses, 0 on padding."""
    out = []
    for r in range(targets.shape[0]):
        row = []
        for t in range(targets.shape[1]):
            weight = jnp.asarray(targets[r, t] != 0)
            loss, _ = smoothed_cross_entropy(
                logits[r, t][None], jnp.asarray(targets[r, t])[None], weight[None], SMOOTHING
            )
            row.append(loss)
        out.append(row)
    return np.array(out)


def example_losses(token_losses, rows, dataset, packed: bool):
    """Summed loss of each example: from its segment of a packed row, or its own row."""
    losses = {}
    if not packed:
        return {i: token_losses[i].sum() for i in range(len(dataset))}
    for r, indices in enumerate(rows):
        start = 0
        for index in indices:
            size = len(dataset.tgt_in[index])
            losses[index] = token_losses[r, start : start + size].sum()
            start += size
    return losses


# The fast suite proves the LM case (the seq2seq one, ~40 s on 2 cores, runs in CI's slow set,
# like the other two: float64 gradients of both twins); tests/test_nnx.py's packed seq2seq
# loss against linen's stays fast.
CASES = [
    pytest.param((SEQ2SEQ, "sinusoidal"), marks=pytest.mark.slow),
    pytest.param((SEQ2SEQ, "learned"), marks=pytest.mark.slow),
    pytest.param((LM, "sinusoidal"), marks=pytest.mark.slow),
    pytest.param((LM, "learned"), marks=pytest.mark.slow),  # ~30 s: the 8-minute budget
]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def twins(request):
    kind, positions = request.param
    config = small_config(positional=positions)
    torch.manual_seed(0)
    torch_cls = torch_reference.Transformer if kind == SEQ2SEQ else torch_reference.TransformerLM
    torch_model = torch_cls(config).eval()
    params = torch_state_to_flax(torch_reference.state_dict_to_numpy(torch_model), config, kind)
    return kind, config, model_for(config, kind), params["params"], torch_model


def test_packing_fills_rows_without_splitting_or_losing_an_example():
    dataset = examples(SEQ2SEQ, small_config())
    order = np.random.default_rng(1).permutation(len(dataset))
    plan = plan_packed_batches(dataset, rows=1, length=16, order=order)
    placed = [i for batch in plan for row in batch for i in row]
    assert sorted(placed) == list(range(len(dataset)))  # each example exactly once
    for batch in plan:
        assert len(batch) <= 1
        for row in batch:  # neither side overflows the row
            assert sum(len(dataset.src[i]) for i in row) <= 16
            assert sum(len(dataset.tgt_in[i]) for i in row) <= 16
    with pytest.raises(PackingError, match="ex:3: an example longer than the packed row length 9"):
        plan_packed_batches(dataset, rows=2, length=9, order=np.arange(len(dataset)))


def test_packed_segments_and_positions():
    dataset = examples(SEQ2SEQ, small_config())
    packed, rows, _ = batches(dataset)
    for r, indices in enumerate(rows):
        segments = packed["tgt_segments"][r]
        for segment, index in enumerate(indices, start=1):
            where = np.flatnonzero(segments == segment)
            assert len(where) == len(dataset.tgt_in[index])
            np.testing.assert_array_equal(packed["tgt_in"][r, where], dataset.tgt_in[index])
            np.testing.assert_array_equal(packed["tgt_positions"][r, where], np.arange(len(where)))
            src_where = np.flatnonzero(packed["src_segments"][r] == segment)
            np.testing.assert_array_equal(packed["src"][r, src_where], dataset.src[index])
        assert (packed["tgt_in"][r, segments == 0] == 0).all()  # the rest is padding


def test_packed_losses_and_gradients_equal_unpacked_in_flax(twins):
    kind, config, model, params, _ = twins
    dataset = examples(kind, config)
    packed, rows, plain = batches(dataset)

    def loss_sum(p, batch):
        logits = compute_logits(model, p, batch)
        weights = batch["tgt_out"] != 0
        return smoothed_cross_entropy(logits, batch["tgt_out"], weights, SMOOTHING)[0]

    logits_packed = compute_logits(model, params, packed)
    logits_plain = compute_logits(model, params, plain)
    a = example_losses(per_token_losses(logits_packed, packed["tgt_out"]), rows, dataset, True)
    b = example_losses(per_token_losses(logits_plain, plain["tgt_out"]), rows, dataset, False)
    for index in range(len(dataset)):
        assert abs(a[index] - b[index]) <= 1e-12 * abs(b[index]), index
    grad_packed = jax.grad(loss_sum)(params, packed)
    grad_plain = jax.grad(loss_sum)(params, plain)
    largest = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grad_plain))
    for g, h in zip(jax.tree.leaves(grad_packed), jax.tree.leaves(grad_plain), strict=True):
        assert float(jnp.abs(g - h).max()) <= 1e-12 * largest


def torch_logits(kind, torch_model, batch, packed: bool):
    """The torch twin's logits for a batch, packed (masks and positions from the segments, as
    packed_model_kwargs builds them for Flax) or plain."""
    t = {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}
    if not packed:
        inputs = (t["tgt_in"],) if kind == LM else (t["src"], t["tgt_in"])
        return torch_model(*inputs)
    seg = torch_reference.make_segment_mask
    causal = torch_reference.make_causal_mask(t["tgt_in"].shape[1])
    self_mask = seg(t["tgt_segments"], t["tgt_segments"]) & causal
    if kind == LM:
        return torch_model(t["tgt_in"], mask=self_mask, positions=t["tgt_positions"].long())
    return torch_model(
        t["src"], t["tgt_in"],
        src_mask=seg(t["src_segments"], t["src_segments"]),
        tgt_mask=self_mask,
        cross_mask=seg(t["tgt_segments"], t["src_segments"]),
        src_positions=t["src_positions"].long(),
        tgt_positions=t["tgt_positions"].long(),
    )  # fmt: skip


def torch_token_losses(logits, targets):
    """(rows, len) smoothed per-token losses (torch's cross_entropy), 0 on padding."""
    flat = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        targets.reshape(-1).long(),
        label_smoothing=SMOOTHING,
        reduction="none",
    ).reshape(targets.shape)
    return flat * (targets != 0)


def test_packed_losses_and_gradients_equal_unpacked_in_torch_and_match_flax(twins):
    kind, config, model, params, torch_model = twins
    dataset = examples(kind, config)
    packed, rows, plain = batches(dataset)
    losses, grads = {}, {}
    for name, batch, is_packed in (("packed", packed, True), ("plain", plain, False)):
        torch_model.zero_grad()
        logits = torch_logits(kind, torch_model, batch, is_packed)
        tokens = torch_token_losses(logits, torch.from_numpy(batch["tgt_out"]))
        tokens.sum().backward()
        losses[name] = example_losses(tokens.detach().numpy(), rows, dataset, is_packed)
        grads[name] = {k: p.grad.clone() for k, p in torch_model.named_parameters()}
        if is_packed:  # the twins agree on the packed batch
            flax_logits = np.asarray(compute_logits(model, params, packed))
            scale = np.abs(flax_logits).max()
            assert np.abs(flax_logits - logits.detach().numpy()).max() <= 1e-12 * scale
    for index in range(len(dataset)):
        a, b = losses["packed"][index], losses["plain"][index]
        assert abs(a - b) <= 1e-12 * abs(b), index
    largest = max(float(g.abs().max()) for g in grads["plain"].values())
    for key, g in grads["packed"].items():
        assert float((g - grads["plain"][key]).abs().max()) <= 1e-12 * largest, key


def test_the_kwargs_keep_examples_apart():
    """A token of one example changed: no other example's logits move (exactly)."""
    config = small_config()
    model = model_for(config, SEQ2SEQ)
    dataset = examples(SEQ2SEQ, config)
    packed, rows, _ = batches(dataset)
    params = model.init(
        jax.random.key(0), jnp.asarray(packed["src"]), jnp.asarray(packed["tgt_in"])
    )["params"]
    before = np.asarray(compute_logits(model, params, packed))
    changed = dict(packed)
    first = rows[0][0]
    changed["src"] = packed["src"].copy()
    changed["src"][0, 0] = (packed["src"][0, 0] % (config.src_vocab_size - 4)) + 3
    after = np.asarray(compute_logits(model, params, changed))
    others = packed["tgt_segments"][0] != 1  # segment 1 of row 0 is example `first`
    np.testing.assert_array_equal(after[0][others], before[0][others])
    np.testing.assert_array_equal(after[1], before[1])
    assert not np.array_equal(after[0][~others], before[0][~others]), first
    assert set(packed_model_kwargs(packed, SEQ2SEQ, config)) == {
        "src_mask", "tgt_mask", "cross_mask", "src_positions", "tgt_positions"
    }  # fmt: skip


def test_a_real_token_equal_to_pad_id_is_hidden_as_in_an_unpacked_row():
    """Unpacked, a source key holding pad_id is masked even inside the text (and a target one
    with mask_target_padding); packed rows must do the same or the examples would differ."""
    config = small_config(mask_target_padding=True)
    model = model_for(config, SEQ2SEQ)
    dataset = examples(SEQ2SEQ, config)
    dataset.src[1][2] = config.pad_id
    dataset.tgt_in[3][2] = config.pad_id  # (tgt_out keeps real targets: the loss is the same)
    packed, rows, plain = batches(dataset)
    params = model.init(jax.random.key(1), jnp.asarray(plain["src"]), jnp.asarray(plain["tgt_in"]))
    logits_packed = compute_logits(model, params["params"], packed)
    logits_plain = compute_logits(model, params["params"], plain)
    a = example_losses(per_token_losses(logits_packed, packed["tgt_out"]), rows, dataset, True)
    b = example_losses(per_token_losses(logits_plain, plain["tgt_out"]), rows, dataset, False)
    for index in range(len(dataset)):
        assert abs(a[index] - b[index]) <= 1e-12 * abs(b[index]), index
