"""`--profile-steps A:B`: a jax.profiler trace of optimizer steps A..B in workdir/profile/.

The trace starts before step A is dispatched and stops once step B has finished, so the steps
in it are whole (with A = 1 it holds the compilation too). Open it with
`tensorboard --logdir <workdir>/profile` (Profile tab) or load the .xplane.pb / trace.json.gz
into Perfetto (ui.perfetto.dev).
"""

from __future__ import annotations

from pathlib import Path

import jax


def parse_step_range(text: str) -> tuple[int, int]:
    """ "A:B" -> (A, B) with 1 <= A <= B; ValueError naming what is wrong."""
    first, sep, last = text.partition(":")
    try:
        if not sep:
            raise ValueError
        a, b = int(first), int(last)
    except ValueError:
        raise ValueError(f"must be FIRST:LAST step numbers, e.g. 10:12, got {text!r}") from None
    if not 1 <= a <= b:
        raise ValueError(f"must be FIRST:LAST with 1 <= FIRST <= LAST, got {text!r}")
    return a, b


class StepProfiler:
    """Call `before(step)` before a step is dispatched and `after(step, state)` after it."""

    def __init__(self, directory: Path, steps: tuple[int, int] | None):
        self.directory, self.steps, self.active = Path(directory), steps, False

    def before(self, step: int) -> None:
        """Start the JAX trace before the first profiled step is dispatched."""
        if self.steps and step == self.steps[0]:
            self.directory.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.directory))
            self.active = True

    def after(self, step: int, state) -> None:
        """Stop the trace after the last profiled step has run (waits for `state`)."""
        if self.active and step == self.steps[1]:
            jax.block_until_ready(state)  # the last profiled step has run, not only dispatched
            self.stop()

    def stop(self) -> None:
        """Stop the trace if one is running (also for a run that ends inside the profiled range)."""
        if self.active:
            jax.profiler.stop_trace()
            self.active = False
