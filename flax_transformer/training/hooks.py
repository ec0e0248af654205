"""Step hooks: your code, called by the training loop after every optimizer step and evaluation.

    def stop_when_learned(info: StepInfo):
        if info.event == "eval" and info.metrics["token_accuracy"] > 0.99:
            return STOP

    run_training(job, hooks=[stop_when_learned])    # or train.main(argv, hooks=[...])

A hook receives a read-only `StepInfo` and returns None to go on or `STOP` to end the run at
this step: the step is then logged and checkpointed, and the run finishes as it would after its
last step (final evaluation, pictures, exported weights, results.json with "stopped_early").
Every hook sees every call, even after another one asked to stop. Hooks run in the training
process between steps, so a slow hook slows training, and an exception raised in a hook ends
the run (checkpoints already saved are kept, and `--resume` continues from the latest).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from flax_transformer.training.state import TrainState

STOP = "stop"


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What a hook may look at; nothing here changes the run.

    event "step": called right after optimizer step `step`, before that step's logging,
    evaluation and checkpoint; `metrics` holds the step's device scalars "loss_sum",
    "token_count", "correct" (sums over the batch) and "grad_norm" (float() waits for the step).
    event "eval": called after each evaluation on the validation set, the final one included
    (a STOP there changes nothing); `metrics` holds the floats "valid_loss", "token_accuracy"
    (and, at the evaluations during a --keep-best exact_match run, "exact_match").
    """

    event: str
    step: int  # optimizer updates done
    metrics: Mapping[str, Any]
    # The state after the step. The next step reuses its buffers (the state is donated), so
    # copy what you keep: jax.device_get(info.state.params). With a mesh it is sharded: copy
    # it to the host before computing with it (other sharded programs between train steps can
    # deadlock XLA:CPU's collectives).
    state: TrainState
    workdir: Path
    wait_for_checkpoints: Callable[[], None]  # blocks until every save started so far is done

    @property
    def params(self):
        """The params after the step (state.params; donated, so copy what you keep)."""
        return self.state.params


class StepHook(Protocol):
    """A step hook: called with a StepInfo after each step and evaluation; returns None to go on
    or STOP to end the run."""

    def __call__(self, info: StepInfo) -> str | None: ...


def call_hooks(hooks: Sequence[StepHook], info: StepInfo) -> bool:
    """Calls every hook with `info`; True if any of them returned STOP."""
    stop = False
    for hook in hooks:
        answer = hook(info)
        if answer is None:
            continue
        if not (isinstance(answer, str) and answer == STOP):
            raise TypeError(f"a step hook returns None or STOP, {hook!r} returned {answer!r}")
        stop = True
    return stop
