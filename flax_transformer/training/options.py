"""Every default of a training run, in one place, with the help text train.py shows for it.

`TrainOptions` is what the loop needs (optimizer, schedule, batching, checkpoints, logging);
`DataOptions` is how train.py makes its data (built-in task sizes, tokenizer, long pairs).
Each field is `option(default, help, **argparse keywords)`, so train.py builds its flags from
these classes (`--batch-size` is the field `batch_size`) and no default is written twice.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flax_transformer.training.data import LONG_POLICIES, TASKS
from flax_transformer.training.optim import SCHEDULES
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
        if choices is not None and getattr(options, field.name) not in choices:
            raise OptionError(
                field.name, f"must be one of {choices}, got {getattr(options, field.name)!r}"
            )


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """How the loop trains; the defaults learn the default task in minutes on 2 CPU cores."""

    steps: int = option(1500, "optimizer steps in total")
    batch_size: int = option(64, "sequences per batch")
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
    mesh: str | None = option(
        None,
        "shard training over devices, e.g. data=2,model=4 (batch over data, heads and FFN "
        "units over model); on CPU set JAX_NUM_CPU_DEVICES=N first to get N devices",
    )

    def __post_init__(self):
        _check(
            self,
            positive=("steps", "batch_size", "lr", "warmup", "eval_every", "save_every")
            + ("keep_checkpoints", "log_every"),
            non_negative=("clip_norm", "weight_decay", "num_examples"),
            unit=("label_smoothing",),
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
