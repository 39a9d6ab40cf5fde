"""The only module that imports rich: tables and messages on a terminal, plain text when piped.

Data (diffs, tables, JSON) goes to stdout; narration and errors go to stderr. On a terminal, as
git does: diffs in git's colours and through a pager when longer than the screen, states in
colour, a spinner on stderr while a step takes more than a second. Piped, none of that.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO, Union

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.status import Status
from rich.table import Table
from rich.text import Text

from patcher import progress

_err = Console(stderr=True, highlight=False)


def _out() -> Console:
    return Console(highlight=False)


def say(message: str) -> None:
    _err.print(message, markup=False, soft_wrap=True)


def note(message: str) -> None:
    _err.print(f"note: {message}", markup=False, soft_wrap=True, style="yellow")


def error(message: str) -> None:
    _err.print(f"dynspec: error: {message}", markup=False, soft_wrap=True, style="bold red")


# -- colour ------------------------------------------------------------------------------------

COLOR_MODES = ("auto", "always", "never")


def wants_color(mode: str, stream: TextIO) -> bool:
    """git's --color: `always` and `never` win; `auto` colours a terminal unless NO_COLOR is set
    (no-color.org: set and not empty) or TERM is dumb."""
    if mode == "always":
        return True
    if mode == "never":
        return False
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


# git's defaults for color.diff: meta bold, frag cyan, old red, new green, context plain.
_BOLD, _CYAN, _RED, _GREEN, _RESET = "\x1b[1m", "\x1b[36m", "\x1b[31m", "\x1b[32m", "\x1b[m"
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def color_diff(text: str) -> str:
    """``text`` in git's diff colours; removing ANSI_ESCAPE gives back ``text`` exactly."""
    out: list[str] = []
    in_hunk = False
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\n")
        end = line[len(body) :]
        if body.startswith("diff --git "):
            in_hunk = False
        if body.startswith("@@ "):
            in_hunk = True
            close = body.find(" @@", 3) + 3  # what follows the range is the hunk's function line, plain
            out.append(f"{_CYAN}{body[:close]}{_RESET}{body[close:]}{end}")
        elif not in_hunk:
            out.append(f"{_BOLD}{body}{_RESET}{end}")
        elif body.startswith("+"):
            out.append(f"{_GREEN}{body}{_RESET}{end}")
        elif body.startswith("-"):
            out.append(f"{_RED}{body}{_RESET}{end}")
        else:
            out.append(line)
    return "".join(out)


# -- pager -------------------------------------------------------------------------------------


def pager_command() -> str | None:
    """$PAGER, else `less -FRX`; None (print directly) for an empty $PAGER or `cat`, as git does."""
    command = os.environ.get("PAGER")
    if command is None:
        return "less -FRX" if shutil.which("less") else None
    command = command.strip()
    return None if command in ("", "cat") else command


def screen_rows(text: str, columns: int) -> int:
    """How many terminal rows ``text`` takes at ``columns`` wide, long lines wrapped."""
    return sum(max(1, -(-cell_len(line.expandtabs()) // max(1, columns))) for line in text.splitlines())


def _page(text: str, command: str) -> None:
    # git sets these when they are unset, so that a plain PAGER=less shows colours and exits on a short text.
    env = {**os.environ, "LESS": os.environ.get("LESS", "FRX"), "LV": os.environ.get("LV", "-c")}
    sys.stdout.flush()
    pager = subprocess.Popen(command, shell=True, stdin=subprocess.PIPE, env=env)
    assert pager.stdin is not None
    # The pager owns Ctrl-C while it runs (less uses it to stop a search); the diff has nothing to undo.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with contextlib.suppress(BrokenPipeError):  # the user quit before the end
            pager.stdin.write(text.encode(sys.stdout.encoding or "utf-8", errors="replace"))
            pager.stdin.flush()
        with contextlib.suppress(BrokenPipeError):
            pager.stdin.close()
        pager.wait()
    finally:
        signal.signal(signal.SIGINT, previous)


def diff(text: str, color: str = "auto", pager: bool = True) -> None:
    """Raw bytes when piped (so `git apply` takes them); on a terminal in git's colours, and paged
    when longer than the screen unless ``pager`` is False."""
    diffs([(None, text)], color, pager)


def diffs(parts: Sequence[tuple[str | None, str]], color: str = "auto", pager: bool = True) -> None:
    """``diff`` for several hosts: each non-empty diff under its heading (see ``heading``), one page."""
    tty = sys.stdout.isatty()
    colored = wants_color(color, sys.stdout)
    size = shutil.get_terminal_size()
    chunks: list[str] = []
    for title, text in parts:
        if not text:
            continue
        if title is not None:
            chunks.append(_rule(title, size.columns, colored) if tty else f"# {title}\n")
        chunks.append(color_diff(text) if colored else text)
    shown = "".join(chunks)
    if not shown:
        return
    command = pager_command() if pager and tty else None
    if command is not None and screen_rows(ANSI_ESCAPE.sub("", shown), size.columns) >= size.lines:
        _page(shown, command)  # the last row is the shell's prompt: a text that fills the screen is paged
        return
    sys.stdout.write(shown)
    sys.stdout.flush()


def _rule(title: str, columns: int, colored: bool) -> str:
    """``heading``'s rule as text, so that it can go through the pager with the diffs."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=columns, force_terminal=colored, no_color=not colored, highlight=False)
    console.rule(title, align="left")
    return buffer.getvalue()


# -- tables ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Styled:
    """A table cell that a terminal shows in ``style`` (rich's style names); plain text when piped."""

    text: str
    style: str = ""


Cell = Union[str, Styled]

# git's colours: done green, pending yellow, broken red.
STATE_STYLES = {
    "applied": "green",
    "applied, not recorded": "yellow",
    "not applied": "yellow",
    "outdated": "yellow",
    "drifted": "bold red",
    "n/a": "dim",
    "provided upstream": "cyan",
}


def state(value: str) -> Styled:
    """A patch's state as a cell, coloured the way git colours its states."""
    return Styled(value, STATE_STYLES.get(value, ""))


COMPACT_BELOW = 100  # columns; narrower terminals get a table without borders


def _text(cell: Cell) -> str:
    return cell.text if isinstance(cell, Styled) else cell


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Cell]], fold: Sequence[int] = (-1,)) -> None:
    """A table on stdout; only the columns in ``fold`` (the detail) wrap, the others (ids) never do."""
    _table(_out(), sys.stdout, title, columns, rows, fold)


def _table(
    console: Console,
    stream: TextIO,
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    fold: Sequence[int] = (-1,),
) -> None:
    """A rich table when ``stream`` is a terminal, else aligned plain columns."""
    if stream.isatty():
        folding = {i % len(columns) for i in fold}
        if console.width < COMPACT_BELOW:
            grid = Table(
                title=title,
                title_justify="left",
                box=box.SIMPLE_HEAD,
                show_edge=False,
                pad_edge=False,
                collapse_padding=True,
            )
        else:
            grid = Table(title=title, title_justify="left")
        for i, column in enumerate(columns):
            if i in folding:
                grid.add_column(column, overflow="fold")
            else:
                widest = max(cell_len(_text(c)) for c in [column, *(row[i] for row in rows)])
                grid.add_column(column, no_wrap=True, min_width=widest)
        for row in rows:
            grid.add_row(*(Text(c.text, style=c.style) if isinstance(c, Styled) else Text(c) for c in row))
        console.print(grid)
        return
    texts = [[_text(c) for c in row] for row in rows]
    widths = [max(len(c) for c in col) for col in zip(columns, *texts)]
    for line in [list(columns), *texts]:
        stream.write("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() + "\n")
    stream.flush()


def as_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


# -- a spinner for slow steps ------------------------------------------------------------------


class Spinner:
    """A ``progress`` listener: a transient status line on stderr once a step has run ``delay`` s.

    Nothing shows for a step that ends sooner, so fast commands print exactly what they printed
    before; the line is erased when the last running step ends, before any output follows.
    """

    def __init__(self, console: Console, delay: float) -> None:
        self.console, self.delay = console, delay
        self._lock = threading.Lock()
        self._steps: dict[int, tuple[int, str]] = {}  # token: (thread, what), in the order they began
        self._timer: threading.Timer | None = None
        self._status: Status | None = None

    def _line(self) -> Text:
        """Each thread's steps, outer to inner ("gpu1: checking srt/server_args.py"); threads side by side."""
        chains: dict[int, list[str]] = {}
        for thread, what in self._steps.values():
            chains.setdefault(thread, []).append(what)
        line = " · ".join(": ".join(chain) for chain in chains.values())
        return Text(line, no_wrap=True, overflow="ellipsis")

    def begin(self, token: int, what: str) -> None:
        with self._lock:
            self._steps[token] = (threading.get_ident(), what)
            if self._status is not None:
                self._status.update(self._line())
            elif self._timer is None:
                self._timer = threading.Timer(self.delay, self._show)
                self._timer.daemon = True
                self._timer.start()

    def end(self, token: int) -> None:
        with self._lock:
            self._steps.pop(token, None)
            if self._steps:
                if self._status is not None:
                    self._status.update(self._line())
                return
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._status is not None:
                self._status.stop()
                self._status = None

    def _show(self) -> None:
        with self._lock:
            if self._timer is not threading.current_thread():  # cancelled, or a later timer's turn
                return
            self._timer = None
            self._status = Status(self._line(), console=self.console, spinner="dots")
            self._status.start()


SPINNER_DELAY = 1.0  # seconds a step runs before the spinner shows; DYNSPEC_SPINNER_DELAY overrides


def show_progress() -> None:
    """A spinner for the steps that follow, when stderr is a terminal; nothing otherwise."""
    if not sys.stderr.isatty():
        return
    try:
        delay = float(os.environ.get("DYNSPEC_SPINNER_DELAY", SPINNER_DELAY))
    except ValueError:
        delay = SPINNER_DELAY
    progress.listen(Spinner(_err, delay))


# -- dynspec remote ----------------------------------------------------------------------------


def heading(text: str) -> None:
    """A line on stdout that says which host the data below it comes from."""
    if sys.stdout.isatty():
        _out().rule(text, align="left")
    else:
        sys.stdout.write(f"# {text}\n")
        sys.stdout.flush()


def summary(title: str, columns: Sequence[str], rows: Sequence[Sequence[Cell]], fold: Sequence[int] = (-1,)) -> None:
    """A table on stderr: the per-host summary is narration, stdout keeps the data."""
    _table(_err, sys.stderr, title, columns, rows, fold)


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
