"""Deprecated: beam search is the decoding engine's `GNMTBeam` selector
(decoding/beam_gnmt.py, run by decoding/engine.py). Every old name still works, with a
DeprecationWarning naming its new home."""

from __future__ import annotations

from flax_transformer.lazy import moved_names, warn_moved

__getattr__, __dir__ = moved_names(
    __name__,
    {
        "NEG_INF": "flax_transformer.decoding.rules:NEG_INF",
        "length_penalty": "flax_transformer.decoding.beam_gnmt:length_penalty",
        "Hypotheses": "flax_transformer.decoding.beam_gnmt:Hypotheses",
        "BeamLoop": "flax_transformer.decoding.engine:SearchState",
    },
)


def beam_search(stepper, prompts, strategy, eos_id, *, prefix_len, max_new_tokens, pad_id):
    """Tokens (B, K, max_new_tokens) and scores (B, K), best first: one run of the engine."""
    from flax_transformer.decoding.beam_gnmt import GNMTBeam
    from flax_transformer.decoding.engine import run_search

    warn_moved(
        f"{__name__}.beam_search",
        "flax_transformer.decoding.engine.run_search with "
        "flax_transformer.decoding.beam_gnmt.GNMTBeam",
    )
    selector = GNMTBeam(prompts, strategy, eos_id, max_new_tokens, pad_id)
    return run_search(stepper, prompts, selector, prefix_len=prefix_len)
