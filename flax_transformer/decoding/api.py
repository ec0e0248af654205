"""`generate`: the one entry point of decoding, for both kinds of model and every strategy.

    tokens = generate(model, variables, src, Greedy(), max_new_tokens=64, bos_id=1, eos_id=2)
    tokens = generate(lm, variables, prompts, Sample(0.8, top_p=0.9), rng=key, ...)
    tokens, scores = generate(model, variables, src, Beam(4, alpha=0.6), ...)

`inputs` is the source (B, S) of a seq2seq `Transformer` (padded with pad_id, or give
`src_mask`; the decoder starts from `bos_id`), or the right-padded prompts (B, P) of a
`TransformerLM`, each starting with BOS (`lengths` (B,) defaults to the non-pad count). The
output is the `max_new_tokens` tokens after each prompt, int32 (B, max_new_tokens), the first
EOS kept and pad after it (`eos_id=None` never stops early; a sequence of ids, e.g. a chat
model's end-of-turn and end-of-text, stops at any of them); `Beam(K)` returns tokens
(B, K, max_new_tokens) and scores (B, K), best first. `Sample` needs `rng`: same key, same
output. `use_cache=False` recomputes every step without the KV cache (the reference).

One jitted function decodes: the model, the strategy's class, Beam.size, max_new_tokens, the
input shapes and the shortest prompt length are compile-time constants; the strategy's numbers
and eos_id are traced. A longrope LM (Phi-3) generates each row as transformers generates it
alone: over to the long table past original_max_position_embeddings (decoding.longrope), so a
row's tokens do not depend on the rest of its batch. The six functions at the end are the
historical names, each one call of `generate`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax

from flax_transformer.decoding.beam_gnmt import GNMTBeam
from flax_transformer.decoding.cache import make_stepper
from flax_transformer.decoding.engine import run_search
from flax_transformer.decoding.inputs import Prompts, Source, decoder_inputs, eos_array
from flax_transformer.decoding.longrope import plan_rows_alone, stepper_for_rows_alone, tables
from flax_transformer.decoding.strategies import Beam, Greedy, Sample, Strategy
from flax_transformer.decoding.token_search import token_selector


@dataclasses.dataclass(frozen=True)
class _Shape:
    """What is static about one search besides the model and the strategy (jit static arg)."""

    max_new_tokens: int
    prefix_len: int  # tokens prefilled in one call: the shortest prompt
    pad_id: int
    use_cache: bool
    rope: str = "plain"  # a longrope LM's plan (decoding.longrope.plan_rows_alone)
    long_prompts: bool = True  # "switch": a prompt may pass the long table's length


@functools.partial(jax.jit, static_argnames=("model", "shape"))
def _search(
    model, variables, prompts: Prompts, source: Source | None, strategy, eos_id, rng, shape
):
    cache_len = prompts.tokens.shape[1] + shape.max_new_tokens - 1  # the last token is not fed
    if shape.rope == "switch":  # longrope: each row over to the long table as it would alone
        stepper = stepper_for_rows_alone(
            model, variables, prompts.lengths, cache_len, shape.use_cache, shape.long_prompts
        )
    else:
        model = tables(model)[1] if shape.rope == "long" else model
        stepper = make_stepper(model, variables, source, cache_len, shape.use_cache)
    if isinstance(strategy, Beam):
        selector = GNMTBeam(prompts, strategy, eos_id, shape.max_new_tokens, shape.pad_id)
        return run_search(stepper, prompts, selector, prefix_len=shape.prefix_len)
    selector = token_selector(
        prompts, strategy, eos_id, rng, max_new_tokens=shape.max_new_tokens, pad_id=shape.pad_id
    )
    return run_search(stepper, prompts, selector, prefix_len=shape.prefix_len)[0]


def search(
    model,
    variables,
    prompts: Prompts,
    source: Source | None,
    strategy: Strategy,
    *,
    max_new_tokens: int,
    prefix_len: int,
    eos_id: int | None,
    rng: jax.Array | None = None,
    use_cache: bool = True,
):
    """`generate` after its host-side checks: for callers that build Prompts (and the Source)
    themselves, e.g. under a trace with symbolic shapes (jax.export). prefix_len tokens of
    every prompt are prefilled at once (at most the shortest prompt's length)."""
    shape = _Shape(int(max_new_tokens), int(prefix_len), model.config.pad_id, bool(use_cache))
    if source is None:  # an LM: Phi-3's longrope table goes over per row (decoding.longrope)
        cache_len = prompts.tokens.shape[1] + shape.max_new_tokens - 1
        rope, long_prompts = plan_rows_alone(model.config, prompts.lengths, cache_len)
        shape = dataclasses.replace(shape, rope=rope, long_prompts=long_prompts)
    eos = eos_array(eos_id, model.config.tgt_vocab_size)
    return _search(model, variables, prompts, source, strategy, eos, rng, shape)


def generate(
    model,
    variables,
    inputs,
    strategy: Strategy = Greedy(),  # noqa: B008 (frozen, so a shared default is safe)
    *,
    max_new_tokens: int,
    eos_id: int | Sequence[int] | None,
    bos_id: int | None = None,
    lengths=None,
    src_mask=None,
    rng: jax.Array | None = None,
    use_cache: bool = True,
):
    """Decode `inputs` with `strategy` (see the module docstring for shapes and arguments).

    variables = {"params": ...}. bos_id is required for a seq2seq model and refused for an LM;
    lengths is for an LM, src_mask for a seq2seq model. Returns int32 tokens
    (B, max_new_tokens), or (tokens (B, K, max_new_tokens), scores (B, K)) for Beam(K).
    """
    if not isinstance(strategy, Greedy | Sample | Beam):
        raise TypeError(f"strategy must be Greedy(), Sample(...) or Beam(...), got {strategy!r}")
    if isinstance(strategy, Sample):
        if rng is None:
            raise ValueError("Sample needs rng, a jax.random.key: same key, same output")
        vocab = model.config.tgt_vocab_size
        if isinstance(strategy.top_k, int) and strategy.top_k > vocab:
            raise ValueError(
                f"Sample top_k {strategy.top_k} is larger than the vocabulary ({vocab})"
            )
    else:
        rng = None  # only sampling draws
    prompts, source = decoder_inputs(
        model,
        inputs,
        lengths=lengths,
        src_mask=src_mask,
        max_new_tokens=max_new_tokens,
        bos_id=bos_id,
        eos_id=eos_id,
    )
    return search(
        model, variables, prompts, source, strategy, max_new_tokens=max_new_tokens,
        prefix_len=int(prompts.lengths.min()), eos_id=eos_id, rng=rng, use_cache=use_cache,
    )  # fmt: skip


# ----------------------------------------------------- the historical names: one call each


def greedy_decode(
    model, variables, src, *, max_new_tokens, bos_id, eos_id, src_mask=None, use_cache=True
) -> jax.Array:
    """Greedy translation with a seq2seq Transformer: tokens (B, max_new_tokens)."""
    return generate(
        model, variables, src, Greedy(), max_new_tokens=max_new_tokens, bos_id=bos_id,
        eos_id=eos_id, src_mask=src_mask, use_cache=use_cache,
    )  # fmt: skip


def sample_decode(
    model, variables, src, *, rng, max_new_tokens, bos_id, eos_id, temperature=1.0, top_k=0,
    top_p=1.0, src_mask=None, use_cache=True,
) -> jax.Array:  # fmt: skip
    """Sampled translation (see Sample): tokens (B, max_new_tokens)."""
    return generate(
        model, variables, src, Sample(temperature, top_k, top_p), rng=rng,
        max_new_tokens=max_new_tokens, bos_id=bos_id, eos_id=eos_id, src_mask=src_mask,
        use_cache=use_cache,
    )  # fmt: skip


def beam_search(
    model, variables, src, *, beam_size, max_new_tokens, bos_id, eos_id, alpha=0.6,
    src_mask=None, use_cache=True,
) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """Beam search translation: tokens (B, beam_size, max_new_tokens), scores (B, beam_size)."""
    return generate(
        model, variables, src, Beam(beam_size, alpha), max_new_tokens=max_new_tokens,
        bos_id=bos_id, eos_id=eos_id, src_mask=src_mask, use_cache=use_cache,
    )  # fmt: skip


def lm_greedy_decode(
    model, variables, prompts, lengths=None, *, max_new_tokens, eos_id, use_cache=True
) -> jax.Array:
    """Greedy continuation of right-padded prompts by a TransformerLM."""
    return generate(
        model, variables, prompts, Greedy(), lengths=lengths, max_new_tokens=max_new_tokens,
        eos_id=eos_id, use_cache=use_cache,
    )  # fmt: skip


def lm_sample_decode(
    model, variables, prompts, lengths=None, *, rng, max_new_tokens, eos_id, temperature=1.0,
    top_k=0, top_p=1.0, use_cache=True,
) -> jax.Array:  # fmt: skip
    """Sampled continuation of prompts by a TransformerLM (see Sample)."""
    return generate(
        model, variables, prompts, Sample(temperature, top_k, top_p), rng=rng, lengths=lengths,
        max_new_tokens=max_new_tokens, eos_id=eos_id, use_cache=use_cache,
    )  # fmt: skip


def lm_beam_search(
    model, variables, prompts, lengths=None, *, beam_size, max_new_tokens, eos_id, alpha=0.6,
    use_cache=True,
) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """Beam search continuation of prompts by a TransformerLM: tokens and scores."""
    return generate(
        model, variables, prompts, Beam(beam_size, alpha), lengths=lengths,
        max_new_tokens=max_new_tokens, eos_id=eos_id, use_cache=use_cache,
    )  # fmt: skip
