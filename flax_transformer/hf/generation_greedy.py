"""Deprecated: greedy search and sampling with transformers' rules run on the decoding engine
(flax_transformer.decoding.engine) as its `TokenSelector`, transformers' processors plugged in
(hf/generation.py builds it). Every old name still works, with a DeprecationWarning naming its
new home."""

from __future__ import annotations

from flax_transformer.lazy import moved_names, warn_moved

__getattr__, __dir__ = moved_names(
    __name__,
    {
        "Rows": "flax_transformer.hf.generation_rows:Rows",
        "write_column": "flax_transformer.hf.generation_rows:write_column",
        "first_argmax": "flax_transformer.decoding.rules:first_argmax",
        "GreedyLoop": "flax_transformer.decoding.token_search:TokenCarry",
    },
)


def greedy_search(
    stepper, rows, plan, knobs, rng, *, n_new: int, prefix_len: int, sample: bool, has_eos: bool
):
    """(seq (B, max_length), steps (B,)): one run of the engine."""
    from flax_transformer.decoding.engine import run_search
    from flax_transformer.hf.generation import token_selector

    warn_moved(
        f"{__name__}.greedy_search",
        "flax_transformer.decoding.engine.run_search with "
        "flax_transformer.hf.generation.token_selector",
    )
    selector = token_selector(rows, plan, knobs, rng, n_new=n_new, sample=sample, has_eos=has_eos)
    return run_search(stepper, rows, selector, prefix_len=prefix_len)
