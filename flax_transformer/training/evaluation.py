"""Evaluation: teacher-forced loss and token accuracy, greedy decoding with exact match,
sacrebleu BLEU and chrF (with a note when the references are too short for BLEU), and the
cross-attention maps of one example (for the heatmap)."""

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
    chrf: float = 0.0  # sacrebleu corpus chrF (character n-grams), 0..100
    bleu_note: str | None = None  # why BLEU says little here (short_reference_note)


def loss_words(label_smoothing: float) -> str:
    """What a reported loss is, in the words every command uses beside it: the training log's
    validation loss is the objective it trains (label smoothing included); `ftx score`'s is
    plain cross-entropy per target token (label_smoothing 0)."""
    if label_smoothing:
        return f"cross-entropy with label smoothing {label_smoothing:g}"
    return "cross-entropy, no label smoothing"


def scores_text(scores: dict, label_smoothing: float) -> str:
    """One line of validation scores: the loss (named, loss_words), then accuracy and macro-F1
    for a classifier (its examples are the units, not tokens), else token accuracy, exact
    match, BLEU and chrF where decoded, perplexity for a language model."""
    parts = [f"valid loss {scores['valid_loss']:.4f} ({loss_words(label_smoothing)})"]
    if "macro_f1" in scores:
        parts += [f"accuracy {scores['accuracy']:.4f}", f"macro-F1 {scores['macro_f1']:.4f}"]
        return ", ".join(parts)
    parts.append(f"token accuracy {scores['token_accuracy']:.4f}")
    if scores.get("exact_match") is not None:
        parts.append(f"exact match {scores['exact_match']:.4f}")
    if scores.get("bleu") is not None:
        parts += [f"BLEU {scores['bleu']:.2f}", f"chrF {scores['chrf']:.2f}"]
    if scores.get("perplexity") is not None:
        parts.append(f"perplexity {scores['perplexity']:.2f}")
    return ", ".join(parts)


# BLEU's longest n-gram: a reference shorter than this has no 4-gram to match, and BLEU's
# geometric mean over 1..4-grams is then 0 however good the output (sacrebleu's default).
BLEU_ORDER = 4


def short_reference_note(references: list[str], tokenize: str) -> str | None:
    """A note when most references have fewer than BLEU_ORDER tokens (as sacrebleu's
    `tokenize` splits them): BLEU is then near 0 even for outputs that are nearly all
    right; chrF and exact match say more. None otherwise."""
    from sacrebleu.metrics import BLEU

    split = BLEU(tokenize=tokenize).tokenizer
    short = sum(len(split(r).split()) < BLEU_ORDER for r in references)
    if not references or short * 2 <= len(references):
        return None
    return (
        f"{short} of {len(references)} references have fewer than {BLEU_ORDER} tokens "
        f"(BLEU's {BLEU_ORDER}-grams, tokenize={tokenize}): BLEU is near 0 whatever the "
        "quality; read chrF and exact match"
    )


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
    chrf = sacrebleu.corpus_chrf(hypotheses, [references]).score
    note = short_reference_note(references, bleu_tokenize)
    return DecodeResult(exact, float(bleu), sources, references, hypotheses, float(chrf), note)


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
