"""Phi-3's longrope switch-over during generation, as transformers' generate makes it.

transformers picks longrope's table per forward call from seq_len = max(position_ids) + 1 over
the whole batch: the short factors while it is <= original_max_position_embeddings (O), the
long ones past it (modeling_rope_utils.longrope_frequency_update). A cached key keeps the table
of the call that computed it, so Phi3ForCausalLM.prepare_inputs_for_generation drops the cache
once, at the step whose input_ids reach O + 1 columns while at most O are cached, and the whole
sequence runs again (on the long table when a row has no left padding).

This engine feeds each row at its own real position (prompts right-aligned to position 0), so
transformers' batch-wide column becomes a per-row position: with W the prompt width and m the
smallest left padding, row r's column is pos + pads[r] and its call's seq_len is
pos + pads[r] + 1 - m. Hence, per row, `long_from[r] = O + m - pads[r]`: the first position fed
on the long table; below it the short one. With m == 0 that position is also where the row's
keys are all computed again on the long table (transformers' re-run); with m > 0 transformers'
re-run is on the short table (seq_len O + 1 - m), the same keys, so nothing is recomputed. A
prompt whose own seq_len (W - m) passes O is on the long table from the prefill on.

The stepper that runs the plan is the engine's (decoding/longrope.py: switching_stepper);
this module holds transformers' batch-wide rule only.
"""

from __future__ import annotations

import numpy as np


def plan(config, pads: np.ndarray, width: int, max_length: int):
    """How a longrope LM generates from left-padded prompts (pads (B,), width W) up to
    max_length tokens: ("plain", None, False) when no call's seq_len passes O (the model as
    it is); ("long", None, False) when the prompt's does; else ("switch", long_from (B,),
    recompute) (module docstring)."""
    if config.rope_scaling != "longrope":
        return "plain", None, False
    original, least = config.rope_original_max_len, int(pads.min())
    if width - least > original:
        return "long", None, False
    if max_length - 1 - least <= original:  # the last token fed sits at column max_length - 2
        return "plain", None, False
    long_from = (original + least - pads).astype(np.int32)
    return "switch", long_from, least == 0
