"""The only module that imports rich: tables and messages on a terminal, plain text when piped.

Data (diffs, tables, JSON) goes to stdout; narration and errors go to stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

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
    _table(_out(), sys.stdout, title, columns, rows)


def _table(console: Console, stream: TextIO, title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A rich table when ``stream`` is a terminal, else aligned plain columns."""
    if stream.isatty():
        grid = Table(title=title, title_justify="left")
        for column in columns:
            grid.add_column(column, overflow="fold")
        for row in rows:
            grid.add_row(*row)
        console.print(grid)
        return
    widths = [max(len(str(c)) for c in col) for col in zip(columns, *rows)]
    for line in [columns, *rows]:
        stream.write("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() + "\n")
    stream.flush()


def as_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


# -- dynspec remote ----------------------------------------------------------------------------


def heading(text: str) -> None:
    """A line on stdout that says which host the data below it comes from."""
    if sys.stdout.isatty():
        _out().rule(text, align="left")
    else:
        sys.stdout.write(f"# {text}\n")
        sys.stdout.flush()


def summary(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A table on stderr: the per-host summary is narration, stdout keeps the data."""
    _table(_err, sys.stderr, title, columns, rows)


# -- dynspec matrix ----------------------------------------------------------------------------

_MATRIX_STYLES = {
    "ok": "green",
    "n/a": "dim",
    "upstream": "cyan",
    "fail": "bold red",
    "changed": "bold magenta",
    "error": "yellow",
}


def matrix_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[tuple[str, str]]]) -> None:
    """The release × patch table; each cell is (text, kind), and a terminal colours it by kind."""
    if not sys.stdout.isatty():
        table(title, columns, [[text for text, _ in row] for row in rows])
        return
    from rich.text import Text

    grid = Table(title=title, title_justify="left")
    for column in columns:
        grid.add_column(column, overflow="fold")
    for row in rows:
        grid.add_row(*(Text(text, style=_MATRIX_STYLES.get(kind, "")) for text, kind in row))
    _out().print(grid)


class MatrixProgress:
    """Progress over releases on stderr: a bar on a terminal, else one line per finished release."""

    def __init__(self) -> None:
        self.advance: Callable[[str], None] = say  # report one finished release
        self.stop: Callable[[], None] = _nothing

    def start(self, total: int) -> None:
        if not sys.stderr.isatty() or total == 0:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        progress = Progress(*columns, console=_err, transient=True)
        task = progress.add_task("SGLang releases", total=total)

        def advance(line: str) -> None:
            progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
            progress.advance(task)

        def stop() -> None:
            progress.stop()
            self.advance, self.stop = say, _nothing

        progress.start()
        self.advance, self.stop = advance, stop


def _nothing() -> None:
    pass
