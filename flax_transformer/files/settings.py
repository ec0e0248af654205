"""A bad value of an environment variable the package reads (a kernel switch, ...): the user's
setting, not a bug, so every command says it in one line and exits 2 (files.interruptions'
`one_line_failures`, cli/main.py), never with a traceback."""

from __future__ import annotations


class SettingError(ValueError):
    """An environment setting with a value the package cannot use; the message names the
    variable and the values it takes."""
