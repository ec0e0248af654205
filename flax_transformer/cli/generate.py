"""Translate or continue text with a model trained by train.py.

    ftx generate --workdir RUN [--input FILE] [--beam N | --sample ...]

Reads one input per line (from --input or stdin) and writes one output line per input line to
stdout, in order. It loads the run's config, tokenizer and a checkpoint
(`runs.load.open_run`): the best one when the run kept one (train.py --keep-best), else
the latest; --checkpoint last|best|STEP chooses. A seq2seq run translates each line; a
language-model run continues it (the output is the continuation only; --echo prepends the
prompt). With --chat (an imported chat model's run) each line is a user message, with --system
a system message before it, rendered with the tokenizer's chat template (hf/chat_template.py)
and the output is the assistant's reply only: the search stops a row at any of the run's end
ids (its eos_id and the generation config's eos_token_id list, as transformers' generate).
Decoding is greedy by default, beam search with --beam N, sampling with --sample.
Newlines inside a generated text are written as the two characters \\n so that the output
stays line-aligned.

Bad input lines (empty, not valid UTF-8, or too long for the model's max_len) are reported on
stderr with their line number and produce an empty output line; the exit status is then 2. A
leading UTF-8 byte-order mark is dropped. Flag values out of range (e.g. --top-p 0, --top-k
larger than the vocabulary) and a workdir that is not a finished train.py run (no config,
tokenizer or checkpoint, or a config that does not match the checkpoint) are errors (exit
status 2), and so is a search flag without its search (--alpha without --beam, --temperature,
--top-k or --top-p without --sample): it would do nothing.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from flax_transformer.cli.flags import flag_type
from flax_transformer.cli.output import JSON_LINES_HELP, add_json_flag, emit_lines
from flax_transformer.files.interruptions import one_line_failures
from flax_transformer.files.text_lines import split_lines
from flax_transformer.runs.generate import (  # noqa: F401  (BUCKET, InputError, batches: as before)
    BUCKET,
    GenerateOptions,
    InputError,
    batches,
    generate_lines,
    prepare,
)
from flax_transformer.spec.kinds import LM, SEQ2SEQ
from flax_transformer.spec.validate import SEED, Float, Int

# The search flags' defaults, filled in after parsing: a flag given for a search it does not
# belong to (--alpha without --beam, --top-k without --sample) would do nothing, so it is an
# error, even when its value equals the default.
DEFAULTS = {"alpha": 0.6, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
SAMPLING_FLAGS = ("temperature", "top_k", "top_p")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse and check the generate flags (search strategy, lengths, --checkpoint); an argparse
    error (exit 2) names a bad flag."""
    from flax_transformer.decoding.strategies import BEAM_RULES, SAMPLE_RULES

    parser = argparse.ArgumentParser(
        prog="ftx generate",
        description="Translate / continue lines of text with a run of ftx train or ftx hf import.",
    )
    parser.add_argument("--workdir", type=Path, required=True, help="a run directory")
    parser.add_argument("--input", type=Path, help="input file, one text per line (default: stdin)")
    parser.add_argument(
        "--max-new-tokens",
        type=flag_type(Int(min=1), "--max-new-tokens"),
        help="tokens to generate at most (default: as many as max_len allows)",
    )
    parser.add_argument(
        "--batch-size",
        type=flag_type(Int(min=1), "--batch-size"),
        default=32,
        help="lines decoded together",
    )
    search = parser.add_mutually_exclusive_group()
    search.add_argument(
        "--beam",
        type=flag_type(BEAM_RULES["size"], "--beam"),
        metavar="N",
        help="beam search with N beams",
    )
    search.add_argument("--sample", action="store_true", help="sample instead of greedy")
    parser.add_argument(
        "--alpha",
        type=flag_type(BEAM_RULES["alpha"], "--alpha"),
        help=f"beam length penalty exponent (needs --beam; default: {DEFAULTS['alpha']})",
    )
    # Sampling at temperature 0 is greedy decoding: leave out --sample for that.
    parser.add_argument(
        "--temperature",
        type=flag_type(Float(gt=0.0), "--temperature"),
        help="sampling temperature (> 0; needs --sample; default: 1)",
    )
    parser.add_argument(
        "--top-k",
        type=flag_type(SAMPLE_RULES["top_k"], "--top-k"),
        help="sample from the k best (0: all; needs --sample; default: 0)",
    )
    parser.add_argument(
        "--top-p",
        type=flag_type(SAMPLE_RULES["top_p"], "--top-p"),
        help="nucleus mass (1: all; needs --sample; default: 1)",
    )
    parser.add_argument(
        "--seed", type=flag_type(SEED, "--seed"), default=0, help="sampling PRNG seed"
    )
    parser.add_argument("--echo", action="store_true", help="LM runs: print prompt + output")
    parser.add_argument(
        "--chat",
        action="store_true",
        help="each line is a user message, rendered with the tokenizer's chat template; the "
        "output is the assistant's reply (LM runs of ftx hf import)",
    )
    parser.add_argument("--system", metavar="TEXT", help="a system message (needs --chat)")
    parser.add_argument(
        "--int8", action="store_true", help="int8 weights (per-channel scales; export.int8)"
    )
    parser.add_argument(
        "--quantize",
        choices=("int8",),
        help="int8: int8 weights (per-channel scales) and dynamic int8 matrix products, "
        "activations quantised per row (nn.int8_products; faster on CPU, float32 runs only)",
    )
    parser.add_argument(
        "--checkpoint",
        metavar="last|best|STEP",
        help="which checkpoint: the latest, the best (ftx train --keep-best) or a step number "
        "(default: best when the run kept one, else last)",
    )
    add_json_flag(parser, JSON_LINES_HELP)
    args = parser.parse_args(argv)
    if args.int8 and args.quantize:
        parser.error("--int8 (weight-only) and --quantize int8 (int8 products): pick one")
    if args.checkpoint not in (None, "last", "best") and not args.checkpoint.isdigit():
        parser.error(f"--checkpoint must be last, best or a step number, got {args.checkpoint!r}")
    if args.system is not None and not args.chat:
        parser.error("--system needs --chat: without a chat template there is no system turn")
    if args.chat and args.echo:
        parser.error("--echo and --chat: a chat reply is printed without the prompt")
    problem = flags_that_do_nothing(args)
    if problem:
        parser.error(problem)
    for name, default in DEFAULTS.items():  # None until here: "given" is told from "default"
        if getattr(args, name) is None:
            setattr(args, name, default)
    try:
        args.strategy = strategy_of(args)
    except ValueError as err:
        parser.error(str(err))
    return args


def flags_that_do_nothing(args: argparse.Namespace) -> str | None:
    """The usage error for search flags given without their search (None: none), naming both
    flags; e.g. "--alpha needs --beam: ... (greedy decoding ignores it)"."""
    search = "beam search (--beam)" if args.beam else "sampling (--sample)" if args.sample else ""
    search = search or "greedy decoding (neither --beam nor --sample)"
    if args.alpha is not None and not args.beam:
        return f"--alpha needs --beam: {search} has no length penalty, so it would do nothing"
    given = [f"--{n.replace('_', '-')}" for n in SAMPLING_FLAGS if getattr(args, n) is not None]
    if given and not args.sample:
        verb, it = ("needs", "it") if len(given) == 1 else ("need", "them")
        return f"{', '.join(given)} {verb} --sample: {search} ignores {it}"
    return None


def strategy_of(args: argparse.Namespace):
    """The decoding strategy the flags ask for: Greedy, Beam(--beam, --alpha) or Sample."""
    from flax_transformer.decoding.strategies import Beam, Greedy, Sample

    if args.beam:
        return Beam(args.beam, args.alpha)
    if args.sample:
        return Sample(args.temperature, args.top_k, args.top_p)
    return Greedy()


def read_lines(path: Path | None) -> list[bytes]:
    """Raw input lines (stdin or --input), a leading BOM dropped; each is decoded on its own
    (`Generator.encode`), so an invalid line is reported and the others still decoded."""
    if path is None:
        stdin = sys.stdin
        data = stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode()
        return split_lines(data)
    try:
        return split_lines(path.read_bytes())
    except OSError as err:
        print(f"error: cannot read --input {path}: {err.strerror or err}", file=sys.stderr)
        raise SystemExit(2) from None


def check_flags_against_model(args: argparse.Namespace, config) -> str | None:
    """What only the loaded model can tell about the flags (None: nothing wrong)."""
    if args.max_new_tokens is not None and args.max_new_tokens > config.max_len:
        return (
            f"--max-new-tokens {args.max_new_tokens} is longer than the model's max_len "
            f"{config.max_len}"
        )
    if args.sample and args.top_k > config.tgt_vocab_size:
        return (
            f"--top-k {args.top_k} is larger than the model's vocabulary "
            f"({config.tgt_vocab_size} tokens)"
        )
    return None


@one_line_failures
def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m flax_transformer.generate` / `ftx generate`: print one output
    line per input line; exit status 2 for a bad workdir, flag or input line (an empty line is
    printed in its place), else 0."""
    args = parse_args(argv)
    from flax_transformer.runs.load import RunLoadError, open_run

    try:  # a bare encoder has no decoder: nothing to generate with
        run = open_run(args.workdir, args.checkpoint, kinds=(LM, SEQ2SEQ), purpose="generate")
    except RunLoadError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    options = GenerateOptions(**{f.name: getattr(args, f.name) for f in fields(GenerateOptions)})
    try:
        generator = prepare(run, options, args.workdir)
    except ValueError as err:  # a chat run without a template, --quantize of a float64 run
        print(f"error: {err}", file=sys.stderr)
        return 2
    problem = check_flags_against_model(args, run.config)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    outputs, errors = generate_lines(read_lines(args.input), generator, args.batch_size)
    for message in errors:
        print(f"error: {message}; an empty line is written in its place", file=sys.stderr)
    records = [{"line": number, "output": out} for number, out in enumerate(outputs, start=1)]
    emit_lines(records, outputs, args.json)  # (a bad line: "" in its place, as in the text)
    return 2 if errors else 0  # bad input lines: exit status 2, like every bad input


if __name__ == "__main__":
    raise SystemExit(main())
