"""Command-line flags checked by the same value rules as configs (`spec/validate.py`): an argparse
`type=` that parses and checks a numeric flag, the check of flag values read back from JSON, and
the one spelling of a run directory (`--workdir RUN`, the old positional form still read)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import Any

from flax_transformer.spec.validate import SEED, Bool, Choice, Float, Int, Text

__all__ = ["SEED", "flag_type", "one_run_dir", "run_config_problems"]


def flag_type(rule: Int | Float, flag: str):
    """An argparse `type=` for a numeric flag: parses, then checks the rule; argparse reports a
    failure as `argument --flag: must be ..., got ...` and exits with status 2."""

    def parse(text: str):
        try:
            value = rule.parse(text)
        except ValueError:
            kind = "an int" if isinstance(rule, Int) else "a number"
            raise argparse.ArgumentTypeError(f"must be {kind}, got {text!r}") from None
        problem = rule.problem(value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = flag  # argparse names the type in some messages
    parse.rule = rule  # read by run_config_problems
    return parse


def run_config_problems(parser: argparse.ArgumentParser, values: Mapping[str, Any]) -> list[str]:
    """What is wrong with flag values read from JSON (`--run-config`), flag by flag: the same
    rules as on the command line, plus the JSON type a flag without a rule needs."""
    actions = {a.dest: a for a in parser._actions}
    problems = []
    for dest, value in values.items():
        action = actions.get(dest)
        if action is None:
            continue
        flag = action.option_strings[0] if action.option_strings else dest
        rule = getattr(action.type, "rule", None)
        optional = action.default is None  # null: "flag not given", as run.json records it
        if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
            problem = Bool().problem(value)
        elif action.choices is not None:
            problem = Choice(tuple(action.choices), optional=optional).problem(value)
        elif rule is not None:
            problem = dataclasses.replace(rule, optional=optional).problem(value)
        elif action.type is int:
            problem = Int(optional=optional).problem(value)
        elif action.type is float:
            problem = Float(optional=optional).problem(value)
        else:
            problem = Text(optional=optional).problem(value)
        if problem:
            problems.append(f"{flag} {problem}")
    return problems


def one_run_dir(parser: argparse.ArgumentParser, workdir, positional, *, what: str = "RUN_DIR"):
    """The run directory a command reads: `--workdir RUN` (every command's spelling) or the old
    positional RUN_DIR; a usage error (exit 2) when neither or two different ones are given."""
    if workdir is None and positional is None:
        parser.error(f"give the run directory: --workdir RUN (or the old positional {what})")
    if workdir is not None and positional is not None and str(workdir) != str(positional):
        parser.error(
            f"two run directories: --workdir {workdir} and {what} {positional}; give one "
            "(--workdir)"
        )
    return workdir if workdir is not None else positional
