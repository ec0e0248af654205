"""`train --resume` with settings that differ from the run's: refuse what changes the result, record
the rest in run.json.

A resumed run takes its flags from run.json, and flags on the command line override them. A
flag that changes what the run computes (the data, the batches, the optimizer, the seed) would
silently make the run neither the old one nor a new one, so it is refused by name (exit status
2). The flags in COMPATIBLE change only how long the run goes on, how often it evaluates, saves
and logs, or where its arrays live; they are applied and written into run.json with a
"resumed" entry saying what changed. The model flags are checked against config.json
(runs/train.py make_config).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from flax_transformer.runs.spec import MODEL_FLAGS, NOT_RECORDED, TrainSpec, UsageError

# Safe to change on --resume (docs/training.md, "Resume"): the length of the run, the
# evaluation / checkpoint / logging schedule, what is kept and reported, the device layout.
COMPATIBLE = (
    "steps",
    "eval_every",
    "save_every",
    "keep_checkpoints",
    "log_every",
    "bleu_tokenize",
    "valid_max",
    "keep_best",
    "early_stop",
    "profile_steps",
    "mesh",
)
# Not settings of the run: where it lives and how this command was started. (The model flags
# are compared as the config they make, against config.json.)
NOT_COMPARED = ("workdir", *NOT_RECORDED)
# Flags whose absence (None) means a value: --task means the built-in "reverse" task.
IMPLIED = {"task": "reverse"}  # (DataOptions.task; options.py loads optax)


def _plain(value: Any) -> Any:
    """The value as run.json holds it (tuples as lists, paths as strings)."""
    return json.loads(json.dumps(value, default=str))


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _shown(value: Any) -> str:
    return "none" if value is None else str(value)


def changed_settings(spec: TrainSpec, saved: dict[str, Any]) -> dict[str, list]:
    """{field: [saved, now]} for the settings (not the model's) whose value differs from the
    saved run's (`saved`: runs.spec.spec_values of its run.json); UsageError naming each one
    that changes the result. A field the saved run.json does not know (written by an older
    version) is not compared."""
    model = {*MODEL_FLAGS, "preset", "config", "dtype"}
    changed, refused = {}, []
    for name, value in sorted(dataclasses.asdict(spec).items()):
        if name in NOT_COMPARED or name in model or name not in saved:
            continue
        before, now = _plain(saved[name]), _plain(value)
        if name in IMPLIED:  # no value: the default, the same as naming it
            before, now = (IMPLIED[name] if v is None else v for v in (before, now))
        if before == now:
            continue
        if name in COMPATIBLE:
            changed[name] = [before, now]
        else:
            refused.append(f"{_flag(name)} {_shown(now)} differs from the run's {_shown(before)}")
    if refused:
        raise UsageError(
            "--resume: "
            + "; ".join(refused)
            + "; start a new --workdir to change "
            + ("it" if len(refused) == 1 else "them")
        )
    return changed
