"""Train a Transformer with JAX/Flax: `python train.py` learns the built-in `reverse` task.

  python train.py                                  # reverse random strings, ~2 min on a CPU
  python train.py --task sort --steps 3000
  python train.py --train-tsv train.tsv --valid-tsv valid.tsv --workdir runs/mt
  python train.py --lm-text book.txt               # decoder-only language model
  python train.py --resume                         # continue the run in --workdir

Everything is written into --workdir (default runs/<task or file name>); its files are
listed in runs/run_dir.py (and docs/training.md, "Run directory"). The flags are built in
cli/train_flags.py, which makes them a TrainSpec (runs/spec.py); runs/train.py trains it.
`main(argv, hooks=[...])` is the Python entry (`train.main` of the root train.py, `ftx train`,
`python -m flax_transformer.train`); `flax_transformer.runs.train.train(spec, hooks)` is the
one without a command line.
"""

from __future__ import annotations

import contextlib
import sys
import time
from contextlib import nullcontext
from pathlib import Path

from flax_transformer.cli.output import emit
from flax_transformer.cli.process import exit_process
from flax_transformer.cli.train_flags import (  # noqa: F401  (train.X names of the old train.py)
    add_option_flags,
    build_parser,
    parse_args,
    spec_from_args,
)
from flax_transformer.files.space import is_out_of_space, out_of_space_message
from flax_transformer.runs import run_dir
from flax_transformer.runs.checks import (  # noqa: F401  (train.X names of the old train.py)
    bleu_tokenizer,
    check_model_flags,
    default_workdir,
    model_values,
    wants_float64,
)
from flax_transformer.runs.checks import check_spec as check_args  # noqa: F401  (as above)
from flax_transformer.runs.spec import (  # noqa: F401  (train.X names of the old train.py)
    DEFAULT_PRESET,
    DISTRIBUTED_FLAGS,
    DTYPES,
    MODEL_DEFAULTS,
    MODEL_FLAGS,
    UsageError,
)
from flax_transformer.runs.train import (  # noqa: F401  (train.X names of the old train.py)
    make_config,
    split_off_validation,
    train,
)
from flax_transformer.training.interrupts import exit_status, sigterm_raises

# An input path that is not there (or not a file): bad input like any other, exit status 2.
MISSING_INPUT = (FileNotFoundError, NotADirectoryError, IsADirectoryError)


def main(argv=None, hooks=None) -> int:
    """The command line; `hooks` are step hooks for the run (flax_transformer.training.hooks:
    called after every step and evaluation, they may stop the run early). Returns the exit
    status: 0 done, 1 the run failed, 2 bad flags or input, 130 Ctrl-C, 143 SIGTERM (the run
    stops at a step; --resume continues from its last checkpoint)."""
    hooks = tuple(hooks or ())
    started = time.perf_counter()
    with sigterm_raises():  # SIGTERM, like Ctrl-C, ends the run through its cleanup
        return _main(argv, hooks, started)


def _main(argv, hooks, started: float) -> int:
    from flax_transformer.training import distributed

    try:
        try:
            args = parse_args(argv)
        except SystemExit as exit:  # argparse printed its error (or --help)
            if exit.code == 0:
                raise
            return 2
        json_out = args.json  # how to print the results, not a setting of the run
        spec = spec_from_args(args)
        # --warmup longer than --steps: said when the user chose the warmup, once (not on
        # every short run with the default warmup, nor again on --resume).
        warmup_warning = warmup_chosen(argv, spec)
        # --json alone: stdout holds the JSON only; the progress lines go to stderr.
        with contextlib.redirect_stdout(sys.stderr) if json_out == "-" else nullcontext():
            results = train(spec, hooks, warmup_warning=warmup_warning, started=started)
        if results is not None:  # process 0 of the run (with --json -, the JSON alone)
            emit(results, summary_lines(results), json_out)
        return 0
    except (ValueError, *MISSING_INPUT) as err:
        # Bad input: flags, data files, configs, a run directory (the project raises a
        # ValueError subclass for each, naming the file and line).
        print(f"error: {distributed.describe_failure(err)}", file=sys.stderr)
        distributed.exit_now(2)  # a multi-process run: no waiting for the others
        return 2
    except (OSError, RuntimeError) as err:
        # The run failed: it diverged, a checkpoint could not be written, the disk filled up.
        if isinstance(err, OSError) and is_out_of_space(err):  # outside the loop (the loop's
            # own TrainingError already says which checkpoint is kept)
            err = OSError(out_of_space_message(err))
        print(f"error: {distributed.describe_failure(err)}", file=sys.stderr)
        distributed.exit_now(1)
        return 1
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (interrupts.Terminated)
        # runs.train's TrainingInterrupted says the step and the last checkpoint, or what an
        # interruption before the first step left; earlier (parsing the flags), nothing.
        message = str(err) or "interrupted before training started"
        print(message, file=sys.stderr)
        distributed.exit_now(exit_status(err))
        return exit_status(err)


def warmup_chosen(argv, spec) -> bool:
    """--warmup given on this command line (or in --run-config) of a run that starts now."""
    from flax_transformer.training.options import TrainOptions

    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    on_line = any(a == "--warmup" or a.startswith("--warmup=") for a in argv)
    from_file = bool(spec.run_config) and spec.warmup != TrainOptions.warmup
    return not spec.resume and (on_line or from_file)


def summary_lines(results: dict) -> list[str]:
    """The end of a run for a person: steps and speed (or why it stopped early or trained
    nothing), the validation metrics, example decodes and where the results and weights are."""
    from flax_transformer.training.evaluation import scores_text

    lines = []
    early = ""
    if results.get("stop_reason") == "early_stop":
        best = results["best"]
        early = (
            f" (stopped early: {best['metric']} has not improved for "
            f"{best['evals_since_best']} evaluations; best {best['best']:.4f} at step "
            f"{best['best_step']}, in checkpoints_best/)"
        )
    elif results.get("stopped_early"):
        early = " (stopped early by a step hook)"
    if results.get("steps_trained") == 0:  # a --resume of a run that had reached --steps
        lines.append(
            f"\nnothing to train: the run was already at step {results['steps']} (--steps "
            f"{results['steps']}; pass a larger --steps to train on); evaluated again"
        )
    else:
        unit = "examples/s" if "macro_f1" in results else "target tokens/s"  # (a classifier's)
        # Speed counts the training steps only; the wall time adds reading and tokenizing
        # the data, evaluations, checkpoints and the final decode.
        lines.append(
            f"\ntrained {results['steps']} steps{early} in {results['train_time_s']:.0f} s of "
            f"training ({results['tokens_per_sec']:.0f} {unit}; "
            f"{results['wall_time_s']:.0f} s in all)"
        )
    lines.append(scores_text(results, results.get("label_smoothing", 0.0)))
    if results.get("bleu_note"):
        lines.append(f"note: {results['bleu_note']}")
    for name, label in results.get("per_label", {}).items():
        lines.append(
            f"  {name}: precision {label['precision']:.3f}, recall {label['recall']:.3f}, "
            f"F1 {label['f1']:.3f} ({label['support']} examples)"
        )
    for example in results.get("examples", []):
        mark = "ok " if example["hypothesis"] == example["reference"] else "BAD"
        lines.append(
            f"  [{mark}] {example['source']!r} -> {example['hypothesis']!r} "
            f"(reference {example['reference']!r})"
        )
    for name, path in results.get("pictures", {}).items():
        lines.append(f"{name}: {path}")
    lines.append(
        f"results: {Path(results['workdir']) / run_dir.RESULTS}; weights: "
        f"{results['weights']['torch']} (torch), {results['weights']['flax']} (flax)"
    )
    return lines


if __name__ == "__main__":
    from flax_transformer.training.host_memory import reexec_with_tuned_malloc

    reexec_with_tuned_malloc()  # (JAX is loaded by now: this entry pays a second start-up)
    exit_process(main())
