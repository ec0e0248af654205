"""Autoregressive decoding: one entry point, `generate`, for both kinds of model.

- `strategies`: `Greedy()`, `Sample(temperature, top_k, top_p)`, `Beam(size, alpha)`.
- `api`: `generate(model, variables, inputs, strategy, ...)`, `search` (generate after its
  host-side checks, for traced callers such as jax.export) and the historical one-call
  wrappers (`greedy_decode`, `sample_decode`, `beam_search`, `lm_*`).
- `inputs`: prompts and sources, checked; `cache`: the KV cache (`init_cache`) and the steppers;
  `engine`: the one search loop (`run_search`), which runs a stepper with a selector;
  `token_search`: the one-token-per-row selector (greedy / sampling); `rules`: how a token is
  chosen (first-maximum argmax, the sampling rule); `beam_gnmt`: beam search with GNMT's length
  penalty; `top_k`: beam search's candidates (lax.top_k's answer, through chunks); `cli`: the
  generate command; `longrope`: Phi-3's switch-over to the long rotary table (each row as it
  would go alone). `sampling` and `beam` are deprecated shims.
"""

from flax_transformer.lazy import lazy_exports

_API = "flax_transformer.decoding.api"
_STRATEGIES = "flax_transformer.decoding.strategies"
_EXPORTS = {
    "generate": _API,
    "search": _API,
    "greedy_decode": _API,
    "sample_decode": _API,
    "beam_search": _API,
    "lm_greedy_decode": _API,
    "lm_sample_decode": _API,
    "lm_beam_search": _API,
    "Greedy": _STRATEGIES,
    "Sample": _STRATEGIES,
    "Beam": _STRATEGIES,
    "Strategy": _STRATEGIES,
    "init_cache": "flax_transformer.decoding.cache",
    "length_penalty": "flax_transformer.decoding.beam_gnmt",
    "run_search": "flax_transformer.decoding.engine",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
