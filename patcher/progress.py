"""Which step a command is in (parse, check, write, ssh), for whoever shows it.

The engine and ``patcher.remote`` mark their slow steps with ``step("checking srt/server_args.py")``.
Nobody listens unless the CLI installs a listener (a spinner on a terminal, ``patcher.render``), so
a step costs nothing in the engine's other callers: ``dynspec matrix``'s workers, the bundle
builder, the tests. Steps may nest and may run in several threads at once (``dynspec remote``
works on hosts in parallel); the listener is told of each one's start and end.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Protocol


class Listener(Protocol):
    def begin(self, token: int, what: str) -> None: ...

    def end(self, token: int) -> None: ...


_listener: Listener | None = None
_tokens = itertools.count()


def listen(listener: Listener | None) -> None:
    """Send every step from now on to ``listener`` (``None``: to nobody)."""
    global _listener
    _listener = listener


@contextlib.contextmanager
def step(what: str) -> Iterator[None]:
    """Mark the code inside as one step, described by ``what`` (a phrase: "writing 5 files")."""
    listener = _listener
    if listener is None:
        yield
        return
    token = next(_tokens)
    listener.begin(token, what)
    try:
        yield
    finally:
        listener.end(token)
