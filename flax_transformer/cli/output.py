"""One output style for every command: readable lines for a person by default, JSON for a
machine with `--json`.

    --json          the result as one JSON object on stdout, instead of the lines
    --json -        the same
    --json OUT      the lines on stdout, and the result as JSON in the file OUT (written whole)

Commands that stream one result per input line (generate, classify) write JSON Lines instead.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable

JSON_HELP = (
    "the result as JSON: alone (or `--json -`) on stdout instead of the readable lines; "
    "`--json OUT` also writes it to the file OUT"
)

JSON_LINES_HELP = (
    "one JSON object an input line (JSON Lines): alone (or `--json -`) on stdout instead of "
    "the readable lines; `--json OUT` also writes them to the file OUT"
)


def add_json_flag(parser: argparse.ArgumentParser, help: str = JSON_HELP) -> None:
    """The --json flag of a command (see the module docstring)."""
    parser.add_argument("--json", nargs="?", const="-", default=None, metavar="OUT", help=help)


def check_json_path(parser: argparse.ArgumentParser, json_to: str | None, inputs) -> None:
    """A --json OUT file that is one of the command's `inputs` ([(what, path)]) or sits in a
    missing directory: the argparse error (exit 2), before any work."""
    if json_to in (None, "-"):
        return
    from flax_transformer.files.atomic_io import OutputPathError, check_output_path

    try:
        check_output_path(json_to, inputs=inputs, what="--json")
    except OutputPathError as err:
        parser.error(str(err))


def emit(result: dict, lines: Iterable[str], json_to: str | None) -> None:
    """Print `lines` (or, with --json / --json -, `result` as JSON instead); with --json OUT
    also write `result` to OUT."""
    _emit(json.dumps(result, indent=2, default=str) + "\n", lines, json_to)


def emit_lines(records: list[dict], lines: list[str], json_to: str | None) -> None:
    """A command that answers line by line (generate, classify): print `lines` (or, with --json
    / --json -, `records` as JSON Lines instead: one object a line); with --json OUT also
    write the records to OUT as JSON Lines."""
    text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    _emit(text, lines, json_to)


def _emit(text: str, lines: Iterable[str], json_to: str | None) -> None:
    if json_to == "-":
        print(text, end="")
        return
    for line in lines:
        print(line)
    if json_to:
        from flax_transformer.files.atomic_io import atomic_write_text

        atomic_write_text(json_to, text)
