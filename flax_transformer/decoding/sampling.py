"""Deprecated: the greedy / sampling search is the decoding engine's `TokenSelector`
(decoding/engine.py runs it; decoding/token_search.py and decoding/rules.py hold its rules).
Every old name still works, with a DeprecationWarning naming its new home."""

from __future__ import annotations

from flax_transformer.lazy import moved_names, warn_moved

__getattr__, __dir__ = moved_names(
    __name__,
    {
        "NEG_INF": "flax_transformer.decoding.rules:NEG_INF",
        "TokenLoop": "flax_transformer.decoding.token_search:TokenCarry",
    },
)


def choose(strategy, logits, key):
    """Next token (B,) from logits (B, V) for a Greedy or Sample strategy."""
    from flax_transformer.decoding.token_search import chooser

    warn_moved(f"{__name__}.choose", "flax_transformer.decoding.token_search.chooser(strategy)")
    return chooser(strategy)(logits, key)


def greedy_or_sample(
    stepper, prompts, strategy, eos_id, rng, *, prefix_len, max_new_tokens, pad_id
):
    """New tokens (B, max_new_tokens), now one run of the decoding engine."""
    from flax_transformer.decoding.engine import run_search
    from flax_transformer.decoding.token_search import token_selector

    warn_moved(
        f"{__name__}.greedy_or_sample",
        "flax_transformer.decoding.engine.run_search with "
        "flax_transformer.decoding.token_search.token_selector",
    )
    selector = token_selector(
        prompts, strategy, eos_id, rng, max_new_tokens=max_new_tokens, pad_id=pad_id
    )
    return run_search(stepper, prompts, selector, prefix_len=prefix_len)[0]
