"""Every default of a training run, in one place, with the help text train.py shows for it.

`TrainOptions` is what the loop needs (optimizer, schedule, batching, checkpoints, logging);
`DataOptions` is how train.py makes its data (built-in task sizes, tokenizer, long pairs).
Each field is `option(default, help, rule, **flag keywords)`, so the training command builds
its flags from these classes (`--batch-size` is the field `batch_size`) and no default is
written twice; the rule (spec/validate.py: type, finiteness, range) checks the field here and
the flag's value at parse time.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from flax_transformer.data.pipeline import CLASSIFY, LONG_POLICIES, TASKS
from flax_transformer.data.tokenizer import BPE_MIN_VOCAB, TOKENIZERS
from flax_transformer.spec.validate import SEED, Bool, Choice, Float, Int, Rule, Text
from flax_transformer.training.best import METRICS
from flax_transformer.training.optim import SCHEDULES
from flax_transformer.training.profiling import parse_step_range

# sacrebleu's tokenizers for the BLEU score; "char" scores the built-in tasks letter by letter.
BLEU_TOKENIZERS = ("13a", "char", "zh", "intl", "none")


def option(default: Any, help: str, rule: Rule | None = None, **flag: Any) -> Any:
    """A dataclass field carrying its help text, its value rule and extra keywords for its
    command-line flag (e.g. choices, metavar; a field with choices needs no rule)."""
    return dataclasses.field(default=default, metadata={"help": help, "rule": rule, **flag})


class OptionError(ValueError):
    """An option out of range; `field` names it (train.py turns it into its flag's name)."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field} {problem}")
        self.field, self.problem = field, problem


def rule_of(field: dataclasses.Field) -> Rule:
    """The field's rule: its own, else its choices, else any string."""
    if field.metadata.get("rule") is not None:
        return field.metadata["rule"]
    if field.metadata.get("choices") is not None:
        return Choice(tuple(field.metadata["choices"]), optional=field.default is None)
    return Text()


def _check(options) -> None:
    """Every field against its rule; the first problem is an OptionError naming the field."""
    for field in dataclasses.fields(options):
        problem = rule_of(field).problem(getattr(options, field.name))
        if problem:
            raise OptionError(field.name, problem)


class WarmupWarning(UserWarning):
    """--warmup longer than --steps (the training CLI says it only when --warmup was chosen)."""


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """How the loop trains; the defaults learn the default task in minutes on 2 CPU cores."""

    steps: int = option(1500, "optimizer steps in total", Int(min=1))
    batch_size: int = option(64, "sequences per optimizer step", Int(min=1))
    grad_accum: int = option(
        1,
        "split each batch into N micro-batches, run one after the other and summed into one "
        "optimizer step (same update, less memory)",
        Int(min=1),
    )
    batch_tokens: int | None = option(
        None,
        "instead of --batch-size sentences: batches of at most N tokens a side (source and "
        "target each, padding counted; the paper used about 25000), bucketed by length",
        Int(min=1, optional=True),
        metavar="N",
    )
    pack: bool = option(
        False,
        "pack several examples into each row of --max-len tokens (segment ids keep them "
        "apart: attention and loss never cross examples); batches are --batch-size rows",
        Bool(),
        action="store_true",
    )
    lr: float = option(2e-3, "peak learning rate", Float(gt=0))
    warmup: int = option(150, "linear warmup steps", Int(min=1))
    schedule: str = option(
        "cosine", "after warmup: the paper's 1/sqrt(step) or cosine to 0", choices=SCHEDULES
    )
    label_smoothing: float = option(0.1, "label smoothing eps", Float(ge=0, lt=1))
    clip_norm: float = option(1.0, "global gradient norm clip (0 = off)", Float(ge=0))
    weight_decay: float = option(0.01, "AdamW decay on matrices", Float(ge=0))
    seed: int = option(0, "seeds init, dropout and shuffling", SEED)
    eval_every: int = option(500, "validation loss every N steps", Int(min=1))
    save_every: int = option(500, "checkpoint every N steps", Int(min=1))
    keep_checkpoints: int = option(3, "checkpoints kept", Int(min=1))
    log_every: int = option(25, "metrics.jsonl line every N steps", Int(min=1))
    bleu_tokenize: str = option("13a", "sacrebleu tokenizer", choices=BLEU_TOKENIZERS)
    num_examples: int = option(5, "decoded validation examples printed and stored", Int(min=0))
    valid_max: int = option(
        1000,
        "validation examples evaluated (loss) and decoded (BLEU, exact match) at each "
        "evaluation: the first N of the validation set",
        Int(min=1),
        metavar="N",
    )
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
        Int(min=1, optional=True, why="(evaluations)"),
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
        "start from the weights, config and tokenizer of a run directory (one of ftx train, "
        "or one made by `ftx hf import`); not with --config or model flags",
        metavar="RUN_DIR",
    )
    mesh: str | None = option(
        None,
        "shard training over devices, e.g. data=2,model=4 (batch over data, heads and FFN "
        "units over model); on CPU set JAX_NUM_CPU_DEVICES=N first to get N devices",
    )

    def __post_init__(self):
        _check(self)
        if self.profile_steps is not None:
            try:
                first, last = parse_step_range(self.profile_steps)
            except ValueError as err:
                raise OptionError("profile_steps", str(err)) from None
            if last > self.steps:
                raise OptionError(
                    "profile_steps", f"ends at step {last}, after the last step ({self.steps})"
                )
        if self.pack and self.batch_tokens is not None:
            raise OptionError(
                "pack",
                "and --batch-tokens both size the batches; --pack fills --batch-size rows of "
                "--max-len tokens",
            )
        if self.batch_tokens is None and self.batch_size % self.grad_accum:
            raise OptionError(
                "grad_accum",
                f"({self.grad_accum}) must divide --batch-size ({self.batch_size}) into "
                "equal micro-batches",
            )
        if self.warmup > self.steps:
            warnings.warn(
                f"--warmup {self.warmup} is longer than --steps {self.steps}: the learning rate "
                f"never reaches its peak --lr {self.lr:g}",
                WarmupWarning,
                stacklevel=3,
            )


@dataclasses.dataclass(frozen=True)
class DataOptions:
    """How train.py makes its data when no file is given, and how it tokenizes."""

    task: str = option(
        "reverse",
        f"built-in generated task; {CLASSIFY}: fine-tune --init-from's encoder on --train-tsv "
        "'text<TAB>label' lines",
        choices=(*TASKS, CLASSIFY),
    )
    task_min_len: int = option(1, "shortest task string", Int(min=1))
    task_max_len: int = option(16, "longest task string", Int(min=1))
    task_train_size: int = option(100000, "training strings", Int(min=1))
    task_valid_size: int = option(500, "held-out strings", Int(min=1))
    tokenizer: str = option(
        "byte",
        "byte: UTF-8 bytes, any language; bpe: subword BPE trained on the training text",
        choices=tuple(TOKENIZERS),
    )
    bpe_vocab_size: int = option(
        4000,
        "BPE vocabulary size",
        Int(min=BPE_MIN_VOCAB, why="(the 256 byte symbols and 3 special tokens)"),
    )
    on_long: str = option(
        "skip",
        "a pair longer than --max-len is skipped (with a warning), truncated, or an error",
        choices=LONG_POLICIES,
    )

    def __post_init__(self):
        _check(self)
        if self.task_min_len > self.task_max_len:
            raise OptionError(
                "task_min_len",
                f"({self.task_min_len}) must be <= --task-max-len ({self.task_max_len})",
            )


@dataclasses.dataclass(frozen=True)
class DistributedOptions:
    """How this process joins a multi-process run (training/distributed.py). They belong to
    one launch, not to the run: run.json does not keep them, and a resume gives its own."""

    coordinator: str | None = option(
        None,
        "HOST:PORT of process 0, where the processes meet (with --num-processes and "
        "--process-id); without these flags a SLURM or Open MPI job of several tasks is "
        "detected, else the run is one process",
        metavar="HOST:PORT",
    )
    num_processes: int | None = option(None, "processes in the run", type=int, metavar="N")
    process_id: int | None = option(None, "this process: 0 .. N-1", type=int, metavar="I")

    def __post_init__(self):
        names = ("coordinator", "num_processes", "process_id")
        given = [name for name in names if getattr(self, name) is not None]
        if not given:
            return
        missing = [f"--{name.replace('_', '-')}" for name in names if name not in given]
        if missing:
            raise OptionError(given[0], "needs " + " and ".join(missing))
        host, sep, port = self.coordinator.rpartition(":")
        if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
            raise OptionError("coordinator", f"must be HOST:PORT, got {self.coordinator!r}")
        if self.num_processes < 1:
            raise OptionError("num_processes", f"must be >= 1, got {self.num_processes}")
        if not 0 <= self.process_id < self.num_processes:
            raise OptionError(
                "process_id", f"must be in 0..{self.num_processes - 1}, got {self.process_id}"
            )


def option_fields(cls) -> dict[str, dataclasses.Field]:
    """name -> field of an options class (for building command-line flags)."""
    return {field.name: field for field in dataclasses.fields(cls)}
