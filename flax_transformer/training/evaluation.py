"""Evaluation: teacher-forced loss and token accuracy, greedy decoding with exact match and
sacrebleu BLEU, and the cross-attention maps of one example (for the heatmap)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.data.pipeline import Dataset, eval_batches
from flax_transformer.training.steps import add_sums, summarize


def evaluate_loss(eval_step, params, batches) -> dict[str, float]:
    """{"loss", "token_accuracy"} over `batches` ([(indices, batch)]), per real target token."""
    sums = None
    for _, batch in batches:
        sums = add_sums(sums, eval_step(params, batch))
    return summarize(sums)


@dataclasses.dataclass
class DecodeResult:
    """Decodes of the validation examples: exact-match fraction, corpus BLEU (0..100) and
    the texts behind them."""

    exact_match: float  # fraction of examples decoded exactly right
    bleu: float  # sacrebleu corpus BLEU, 0..100
    sources: list[str]
    references: list[str]
    hypotheses: list[str]


def cut_at_eos(ids, eos_id: int) -> list[int]:
    """Token ids up to (without) the first `eos_id`, as Python ints; all of them when there is
    none."""
    ids = [int(i) for i in ids]
    return ids[: ids.index(eos_id)] if eos_id in ids else ids


def evaluate_decoding(
    model,
    params,
    dataset: Dataset,
    tokenizer,
    *,
    batch_size: int,
    max_len: int,
    bleu_tokenize: str = "13a",
    strategy=None,
) -> DecodeResult:
    """Decode every source of a seq2seq `dataset` (greedy, or `strategy`: e.g. Beam(4, 0.6))
    and score it against its target."""
    import sacrebleu

    from flax_transformer.decoding import Greedy, generate  # one compilation per bucket length

    strategy = Greedy() if strategy is None else strategy

    variables = {"params": params}
    sources, references, hypotheses = [], [], []
    for indices, batch in eval_batches(dataset, batch_size, max_len, tokenizer.pad_id):
        length = batch["src"].shape[1]
        # A bucket holds its targets plus EOS, so its length is enough new tokens.
        out = generate(
            model,
            variables,
            jnp.asarray(batch["src"]),
            strategy,
            max_new_tokens=min(length, max_len),
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
        )
        if isinstance(out, tuple):  # Beam(K): (tokens (B, K, len), scores (B, K)), best first
            out = out[0][:, 0]
        out = np.asarray(out)  # (B, len)
        for row, i in enumerate(indices):
            sources.append(tokenizer.decode(dataset.src[i]))
            references.append(tokenizer.decode(dataset.tgt_out[i]))
            hypotheses.append(tokenizer.decode(cut_at_eos(out[row], tokenizer.eos_id)))
    exact = float(np.mean([h == r for h, r in zip(hypotheses, references, strict=True)]))
    bleu = sacrebleu.corpus_bleu(hypotheses, [references], tokenize=bleu_tokenize).score
    return DecodeResult(exact, float(bleu), sources, references, hypotheses)


@functools.partial(jax.jit, static_argnames="model")
def _intermediates(model, params, src, tgt_in):
    # One compiled program instead of hundreds of eager ops; cached per model and shape.
    return model.apply({"params": params}, src, tgt_in, mutable=["intermediates"])[1]


def cross_attention_maps(model, params, src, tgt_in) -> list[np.ndarray]:
    """Per decoder layer, the cross-attention weights (heads, tgt_len, src_len) of one example.

    src and tgt_in are 1-D token arrays (no padding), run teacher-forced."""
    state = _intermediates(model, params, jnp.asarray(src)[None], jnp.asarray(tgt_in)[None])
    layers = state["intermediates"]["decoder"]
    maps = []
    num_layers = sum(name.startswith("layers_") for name in layers)
    for i in range(num_layers):
        weights = layers[f"layers_{i}"]["cross_attn"]["attention_weights"][0]
        maps.append(np.asarray(weights[0], dtype=np.float32))  # (heads, tgt_len, src_len)
    return maps
