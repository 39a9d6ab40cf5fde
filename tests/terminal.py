"""dynspec as a person at a terminal sees it: through pseudo-terminals, and in tmux for screenshots.

``on_pty`` gives stdout and stderr a pseudo-terminal each (so the two streams stay apart and each
one's isatty() is true) of a chosen size. ``Tmux`` runs a command in a detached tmux session of a
chosen size and captures the screen with ``capture-pane``: what the terminal shows after every
cursor movement, erase and pager redraw, not the bytes that produced it.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import termios
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT

HAVE_TMUX = shutil.which("tmux") is not None and shutil.which("less") is not None
# Skipped on a machine without tmux or less, never in CI: .ci/run installs both, and a missing one there must fail.
needs_tmux = pytest.mark.skipif(
    not HAVE_TMUX and not os.environ.get("CI"), reason="needs tmux and less (.ci/run installs them)"
)

DYNSPEC = [sys.executable, "-m", "patcher"]


def terminal_env(**extra: str) -> dict[str, str]:
    """The test's environment as a user's terminal has it: no NO_COLOR, no PAGER, no LESS."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "PAGER", "LESS", "COLUMNS", "LINES")}
    env["TERM"] = "xterm-256color"
    env.update(extra)
    return env


@dataclass
class Seen:
    stdout: str  # what the program wrote to its stdout terminal, line ends as "\n"
    stderr: str
    returncode: int


def _pty(columns: int, rows: int) -> tuple[int, int]:
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    return parent, child


def on_pty(
    *args: str, columns: int = 80, rows: int = 24, env: dict[str, str] | None = None, stdout_pty: bool = True
) -> Seen:
    """Run dynspec with stdout and stderr on two pseudo-terminals (stdout piped if not ``stdout_pty``)."""
    out_parent, out_child = _pty(columns, rows)
    err_parent, err_child = _pty(columns, rows)
    process = subprocess.Popen(
        [*DYNSPEC, *args],
        stdin=subprocess.DEVNULL,
        stdout=out_child if stdout_pty else subprocess.PIPE,
        stderr=err_child,
        cwd=ROOT,
        env=env if env is not None else terminal_env(),
    )
    os.close(out_child)
    os.close(err_child)
    if stdout_pty:
        out_fd = out_parent
    else:
        assert process.stdout is not None
        out_fd = process.stdout.fileno()
    got = {out_fd: bytearray(), err_parent: bytearray()}
    open_fds = set(got)
    deadline = time.monotonic() + 120
    while open_fds and time.monotonic() < deadline:
        for fd in select.select(list(open_fds), [], [], 1)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child side of the pty is closed
                chunk = b""
            if chunk:
                got[fd] += chunk
            else:
                open_fds.discard(fd)
    process.wait(timeout=30)
    if process.stdout is not None:
        process.stdout.close()
    os.close(out_parent)
    os.close(err_parent)
    # A terminal turns "\n" into "\r\n" (onlcr); give back the program's own line ends.
    stdout = got[out_fd].decode().replace("\r\n", "\n") if stdout_pty else got[out_fd].decode()
    return Seen(stdout, got[err_parent].decode().replace("\r\n", "\n"), process.returncode)


class Tmux:
    """A tmux server of its own (``-S``, no config) with one detached session of a fixed size."""

    def __init__(self, columns: int, rows: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="dynspec-tmux-"))
        self.socket = self.dir / "socket"
        self.columns, self.rows = columns, rows

    def tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-u", "-S", str(self.socket), "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            check=True,
            env=terminal_env(),
            timeout=30,
        ).stdout

    def start(self, *args: str, env: dict[str, str] | None = None, program: list[str] = DYNSPEC) -> None:
        """Run ``dynspec ARGS`` in the session; its exit status goes to a file, and the pane stays."""
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
        command = " ".join(shlex.quote(a) for a in [*program, *args])
        script = f"cd {shlex.quote(str(ROOT))} && env {exports} {command}; echo $? > {self.dir}/rc; exec sleep 3600"
        self.tmux("new-session", "-d", "-x", str(self.columns), "-y", str(self.rows), "sh", "-c", script)

    def screen(self) -> str:
        """The pane's text, trailing blank lines dropped."""
        return self.tmux("capture-pane", "-p").rstrip("\n") + "\n"

    def colours(self) -> str:
        """The pane with its colours as escape sequences (``capture-pane -e``)."""
        return self.tmux("capture-pane", "-p", "-e")

    def wait_exit(self, timeout: float = 120) -> int:
        rc = self.dir / "rc"
        deadline = time.monotonic() + timeout
        while not rc.exists() or not rc.read_text().strip():
            if time.monotonic() > deadline:
                raise AssertionError(f"the command did not finish in {timeout} s; the screen:\n{self.screen()}")
            time.sleep(0.05)
        return int(rc.read_text())

    def wait_for(self, text: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while text not in (screen := self.screen()):
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} did not show in {timeout} s; the screen:\n{screen}")
            time.sleep(0.05)
        return screen

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", *keys)

    def close(self) -> None:
        subprocess.run(["tmux", "-S", str(self.socket), "kill-server"], capture_output=True, timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


def fixed_length_dir() -> Path:
    """A directory whose path always has the same length (/tmp/dynspec-XXXXXXXX), so that a
    screenshot's layout does not depend on where the test runs; ``same_place`` hides the random part."""
    return Path(tempfile.mkdtemp(prefix="dynspec-", dir="/tmp"))


def same_place(screen: str, where: Path) -> str:
    return screen.replace(str(where), "/tmp/dynspec-XXXXXXXX")
