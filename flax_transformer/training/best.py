"""`--keep-best METRIC` and `--early-stop PATIENCE`: the best evaluation so far, its checkpoint,
and how many evaluations since it.

The best checkpoint lives in its own Orbax directory, workdir/checkpoints_best/ (one step kept),
not among the last N in checkpoints/: Orbax's `best_fn` would make that manager keep the best
N instead of the last N, and resume needs the latest. The tracker's state (best value and step,
evaluations since) is saved in every regular checkpoint's meta, so a resumed run, an early
stopped one included, goes on with the best so far and its patience count.
"""

from __future__ import annotations

import dataclasses
import math

# metric -> True if larger is better
METRICS = {"valid_loss": False, "exact_match": True}


@dataclasses.dataclass
class BestTracker:
    """The best evaluation so far of one metric (valid_loss, lower is better; exact_match, higher
    is better), its step, and the evaluations since it; ValueError for another metric."""

    metric: str = "valid_loss"
    patience: int | None = None  # evaluations without improvement before stopping; None: never
    best: float | None = None
    best_step: int | None = None
    evals_since_best: int = 0
    last_step: int | None = None  # the step of the last evaluation counted

    def __post_init__(self):
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {tuple(METRICS)}, got {self.metric!r}")

    def update(self, step: int, scores: dict) -> bool:
        """Counts the evaluation at `step` (once per step); True if it is the best so far."""
        if step == self.last_step:  # e.g. the final evaluation of a run stopped at an eval
            return False
        self.last_step = step
        value = float(scores[self.metric])
        better = (
            self.best is None
            or (value > self.best if METRICS[self.metric] else value < self.best)
            or (math.isnan(self.best) and not math.isnan(value))
        )
        if better:
            self.best, self.best_step, self.evals_since_best = value, step, 0
        else:
            self.evals_since_best += 1
        return better

    @property
    def should_stop(self) -> bool:
        """True once `patience` evaluations in a row have not improved on the best (never when
        patience is None)."""
        return self.patience is not None and self.evals_since_best >= self.patience

    def to_json(self) -> dict:
        """The tracker's state for a checkpoint's meta (every field but patience, which comes
        from the flags)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ("patience",)}

    @classmethod
    def from_json(cls, data: dict, patience: int | None) -> BestTracker:
        """The tracker saved in a checkpoint; `patience` is this run's (it may be changed)."""
        return cls(patience=patience, **data)
