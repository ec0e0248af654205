"""Deprecated: beam search with transformers' rules is the decoding engine's `HFBeam` selector
(hf/beam_selector.py, run by flax_transformer.decoding.engine). Every old name still works,
with a DeprecationWarning naming its new home."""

from __future__ import annotations

from flax_transformer.lazy import moved_names, warn_moved

__getattr__, __dir__ = moved_names(
    __name__,
    {
        "BIG": "flax_transformer.hf.beam_selector:BIG",
        "BeamLoop": "flax_transformer.hf.beam_selector:BeamCarry",
    },
)


def beam_search(stepper, rows, plan, knobs, *, beams: int, n_eos: int, n_new: int, prefix_len):
    """(pool seq (B, K, max_length), pool lengths (B, K)), best first: one run of the engine."""
    from flax_transformer.decoding.engine import run_search
    from flax_transformer.hf.beam_selector import HFBeam
    from flax_transformer.hf.generation_processors import HFProcessors

    warn_moved(
        f"{__name__}.beam_search",
        "flax_transformer.decoding.engine.run_search with flax_transformer.hf.beam_selector.HFBeam",
    )
    selector = HFBeam(rows, HFProcessors(plan, knobs), beams=beams, n_eos=n_eos, n_new=n_new)
    return run_search(stepper, rows, selector, prefix_len=prefix_len)
