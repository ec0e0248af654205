"""Every default of a training run, in one place, with the help text train.py shows for it.

`TrainOptions` is what the loop needs (optimizer, schedule, batching, checkpoints, logging);
`DataOptions` is how train.py makes its data (built-in task sizes, tokenizer, long pairs).
Each field is `option(default, help, **argparse keywords)`, so train.py builds its flags from
these classes (`--batch-size` is the field `batch_size`) and no default is written twice.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flax_transformer.training.best import METRICS
from flax_transformer.training.data import LONG_POLICIES, TASKS
from flax_transformer.training.optim import SCHEDULES
from flax_transformer.training.profiling import parse_step_range
from flax_transformer.training.tokenizer import TOKENIZERS

# sacrebleu's tokenizers for the BLEU score; "char" scores the built-in tasks letter by letter.
BLEU_TOKENIZERS = ("13a", "char", "zh", "intl", "none")


def option(default: Any, help: str, **flag: Any) -> Any:
    """A dataclass field carrying its help text and extra argparse keywords (e.g. choices)."""
    return dataclasses.field(default=default, metadata={"help": help, **flag})


class OptionError(ValueError):
    """An option out of range; `field` names it (train.py turns it into its flag's name)."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field} {problem}")
        self.field, self.problem = field, problem


def _check(options, positive=(), non_negative=(), unit=()) -> None:
    for name in positive:
        if not getattr(options, name) > 0:
            raise OptionError(name, f"must be > 0, got {getattr(options, name)}")
    for name in non_negative:
        if not getattr(options, name) >= 0:
            raise OptionError(name, f"must be >= 0, got {getattr(options, name)}")
    for name in unit:
        if not 0 <= getattr(options, name) < 1:
            raise OptionError(name, f"must be in [0, 1), got {getattr(options, name)}")
    for field in dataclasses.fields(options):
        choices = field.metadata.get("choices")
        value = getattr(options, field.name)
        if choices is not None and value is not None and value not in choices:
            raise OptionError(
                field.name, f"must be one of {choices}, got {getattr(options, field.name)!r}"
            )


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """How the loop trains; the defaults learn the default task in minutes on 2 CPU cores."""

    steps: int = option(1500, "optimizer steps in total")
    batch_size: int = option(64, "sequences per optimizer step")
    grad_accum: int = option(
        1,
        "split each batch into N micro-batches, run one after the other and summed into one "
        "optimizer step (same update, less memory)",
    )
    lr: float = option(2e-3, "peak learning rate")
    warmup: int = option(150, "linear warmup steps")
    schedule: str = option(
        "cosine", "after warmup: the paper's 1/sqrt(step) or cosine to 0", choices=SCHEDULES
    )
    label_smoothing: float = option(0.1, "label smoothing eps")
    clip_norm: float = option(1.0, "global gradient norm clip (0 = off)")
    weight_decay: float = option(0.01, "AdamW decay on matrices")
    seed: int = option(0, "seeds init, dropout and shuffling")
    eval_every: int = option(500, "validation loss every N steps")
    save_every: int = option(500, "checkpoint every N steps")
    keep_checkpoints: int = option(3, "checkpoints kept")
    log_every: int = option(25, "metrics.jsonl line every N steps")
    bleu_tokenize: str = option("13a", "sacrebleu tokenizer", choices=BLEU_TOKENIZERS)
    num_examples: int = option(5, "decoded validation examples printed and stored")
    keep_best: str | None = option(
        None,
        "also keep the checkpoint with the best validation valid_loss or exact_match (in "
        "workdir/checkpoints_best; exact_match decodes the validation set at each evaluation)",
        choices=tuple(METRICS),
    )
    early_stop: int | None = option(
        None,
        "stop when the --keep-best metric (default valid_loss) has not improved for this many "
        "evaluations",
        type=int,
        metavar="PATIENCE",
    )
    profile_steps: str | None = option(
        None,
        "FIRST:LAST: write a jax.profiler trace of those optimizer steps into workdir/profile "
        "(open with TensorBoard's Profile tab or Perfetto)",
        metavar="FIRST:LAST",
    )
    init_from: str | None = option(
        None,
        "start from the weights, config and tokenizer of a run directory (a train.py workdir, "
        "or one made by `python -m flax_transformer.hf import`); not with --config or model flags",
        metavar="RUN_DIR",
    )
    mesh: str | None = option(
        None,
        "shard training over devices, e.g. data=2,model=4 (batch over data, heads and FFN "
        "units over model); on CPU set JAX_NUM_CPU_DEVICES=N first to get N devices",
    )

    def __post_init__(self):
        _check(
            self,
            positive=("steps", "batch_size", "lr", "warmup", "eval_every", "save_every")
            + ("keep_checkpoints", "log_every", "grad_accum"),
            non_negative=("clip_norm", "weight_decay", "num_examples"),
            unit=("label_smoothing",),
        )
        if self.early_stop is not None and self.early_stop < 1:
            raise OptionError("early_stop", f"must be >= 1 evaluations, got {self.early_stop}")
        if self.profile_steps is not None:
            try:
                first, last = parse_step_range(self.profile_steps)
            except ValueError as err:
                raise OptionError("profile_steps", str(err)) from None
            if last > self.steps:
                raise OptionError(
                    "profile_steps", f"ends at step {last}, after the last step ({self.steps})"
                )
        if self.batch_size % self.grad_accum:
            raise OptionError(
                "grad_accum",
                f"({self.grad_accum}) must divide --batch-size ({self.batch_size}) into "
                "equal micro-batches",
            )


@dataclasses.dataclass(frozen=True)
class DataOptions:
    """How train.py makes its data when no file is given, and how it tokenizes."""

    task: str = option("reverse", "built-in generated task", choices=TASKS)
    task_min_len: int = option(1, "shortest task string")
    task_max_len: int = option(16, "longest task string")
    task_train_size: int = option(100000, "training strings")
    task_valid_size: int = option(500, "held-out strings")
    tokenizer: str = option(
        "byte",
        "byte: UTF-8 bytes, any language; bpe: subword BPE trained on the training text",
        choices=tuple(TOKENIZERS),
    )
    bpe_vocab_size: int = option(4000, "BPE vocabulary size")
    on_long: str = option(
        "skip",
        "a pair longer than --max-len is skipped (with a warning), truncated, or an error",
        choices=LONG_POLICIES,
    )

    def __post_init__(self):
        _check(self, positive=("task_train_size", "task_valid_size", "bpe_vocab_size"))


def option_fields(cls) -> dict[str, dataclasses.Field]:
    """name -> field of an options class (for building command-line flags)."""
    return {field.name: field for field in dataclasses.fields(cls)}
