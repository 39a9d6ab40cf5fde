"""The only module that imports rich: tables and messages on a terminal, plain text when piped.

Data (diffs, tables, JSON) goes to stdout; narration and errors go to stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

_err = Console(stderr=True, highlight=False)


def _out() -> Console:
    return Console(highlight=False)


def say(message: str) -> None:
    _err.print(message, markup=False, soft_wrap=True)


def note(message: str) -> None:
    _err.print(f"note: {message}", markup=False, soft_wrap=True, style="yellow")


def error(message: str) -> None:
    _err.print(f"dynspec: error: {message}", markup=False, soft_wrap=True, style="bold red")


def diff(text: str) -> None:
    """Raw bytes when piped (so `git apply` takes them), highlighted on a terminal."""
    if not text:
        return
    if sys.stdout.isatty():
        _out().print(Syntax(text, "diff", theme="ansi_dark", word_wrap=False), soft_wrap=True)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    if sys.stdout.isatty():
        grid = Table(title=title, title_justify="left")
        for column in columns:
            grid.add_column(column, overflow="fold")
        for row in rows:
            grid.add_row(*row)
        _out().print(grid)
        return
    widths = [max(len(str(c)) for c in col) for col in zip(columns, *rows)]
    for line in [columns, *rows]:
        sys.stdout.write("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() + "\n")


def as_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
