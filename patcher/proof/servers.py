"""Start an SGLang server in its own process group, wait until it answers, and always stop it.

``Server`` is a context manager: leaving the ``with`` block, normally or by an exception
(Ctrl-C included), stops the whole process group: SIGTERM, up to ``stop_timeout`` seconds for
every member to exit, then SIGKILL. SGLang's scheduler and detokenizer are child processes of
the launcher in the same group, so nothing it started outlives it. The log is kept.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from patcher.proof import logscan
from patcher.proof.client import Client
from patcher.proof.errors import ServerStartError

Progress = Callable[[str], None]


def stderr_progress(message: str) -> None:
    print(f"[proof] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ServerSpec:
    """What to run: ``argv`` with ``env`` (the whole environment), logging to ``log``."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    log: Path
    port: int
    env_changes: Mapping[str, str | None] = field(default_factory=dict)  # for the report; None = removed


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(first: int, tries: int = 200, taken: Collection[int] = ()) -> int:
    """The first free port from ``first`` on, other than ``taken`` (given to servers that may not
    listen yet); a busy port may be an old server we must not talk to."""
    for port in range(first, first + tries):
        if port not in taken and port_is_free(port):
            return port
    raise ServerStartError(f"no free port in {first}..{first + tries - 1}")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group. Reads /proc; elsewhere, asks ``killpg``."""
    proc = Path("/proc")
    if not proc.is_dir():  # pragma: no cover - Linux is the only target
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may contain spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on TCP ``port`` (IPv4 and IPv6), from /proc/net."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def group_listens_on(pgid: int, port: int) -> bool | None:
    """Whether a process of the group holds the socket listening on ``port``; None if unknown."""
    inodes = listening_inodes(port)
    if not inodes:
        return None
    for pid in group_members(pgid):
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return True
    return False


class Server:
    """One server process group. Use as ``with Server(spec) as s: s.wait_ready(); ...``."""

    def __init__(
        self,
        spec: ServerSpec,
        *,
        stop_timeout: float = 60.0,
        progress: Progress = stderr_progress,
    ) -> None:
        self.spec = spec
        self.stop_timeout = stop_timeout
        self.progress = progress
        self.popen: subprocess.Popen[bytes] | None = None
        self.ready_offset = 0  # log size when the server first answered
        self.stop_offset = 0  # log size just before it was asked to stop
        self.start_seconds = 0.0
        self.started_at: float | None = None  # time.monotonic() at start()
        self.stopped_by = ""  # "exited", "SIGTERM" or "SIGKILL"
        self._terminated = False  # SIGTERM sent (by begin_stop or stop)

    @property
    def client(self) -> Client:
        return Client("127.0.0.1", self.spec.port)

    @property
    def pgid(self) -> int:
        assert self.popen is not None
        return self.popen.pid  # start_new_session=True: the launcher leads its own group

    def start(self) -> None:
        self.started_at = time.monotonic()
        self.spec.log.parent.mkdir(parents=True, exist_ok=True)
        with self.spec.log.open("wb") as log:
            self.popen = subprocess.Popen(
                list(self.spec.argv),
                env=dict(self.spec.env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(
        self,
        timeout: float = 600.0,
        poll_interval: float = 1.0,
        progress_every: float = 10.0,
        probe_timeout: float = 5.0,
    ) -> float:
        """Block until ``/health`` answers 200; return the seconds since ``start()``.

        Prints a progress line every ``progress_every`` seconds with the last log line. Raises
        ``ServerStartError`` (with the log tail) if the process exits or ``timeout`` passes.
        """
        assert self.popen is not None
        client = Client("127.0.0.1", self.spec.port, timeout=probe_timeout)
        start = time.monotonic() if self.started_at is None else self.started_at
        next_note = start + progress_every
        paths = ["/health", "/model_info", "/get_model_info"]
        while True:
            code = self.popen.poll()
            if code is not None:
                raise ServerStartError(
                    f"{self.spec.name} server exited with code {code} before answering; "
                    f"last lines of {self.spec.log}:\n{logscan.tail(self.spec.log)}"
                )
            for path in paths:
                try:
                    status, _ = client.request("GET", path)
                except OSError:
                    break  # not listening yet
                if status == 200:
                    if group_listens_on(self.pgid, self.spec.port) is False:
                        raise ServerStartError(
                            f"port {self.spec.port} answers, but not from the {self.spec.name} server: "
                            "another server is running there"
                        )
                    self.start_seconds = time.monotonic() - start
                    self.ready_offset = logscan.size(self.spec.log)
                    return self.start_seconds
                if status != 404:
                    break  # e.g. 503 while SGLang warms up: ask again later
            now = time.monotonic()
            if now - start >= timeout:
                raise ServerStartError(
                    f"{self.spec.name} server did not answer within {timeout:g} s; "
                    f"last lines of {self.spec.log}:\n{logscan.tail(self.spec.log)}"
                )
            if now >= next_note:
                next_note = now + progress_every
                size_kb = logscan.size(self.spec.log) // 1024
                self.progress(
                    f"  {self.spec.name}: starting, {now - start:.0f} s, log {size_kb} KB: "
                    f"{logscan.last_line(self.spec.log)}"
                )
            time.sleep(poll_interval)

    def begin_stop(self) -> None:
        """Send the process group SIGTERM and return at once; ``stop`` then waits for it. Servers
        asked together wind down side by side (session 51: SmolLM2 servers one after another took
        about 6 s each)."""
        if self.popen is None or self.stopped_by or self._terminated:
            return
        self.stop_offset = logscan.size(self.spec.log)
        if self.popen.poll() is not None and not group_members(self.pgid):
            return  # gone already: stop says "exited"
        self._terminated = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGTERM)

    def stop(self) -> str:
        """Stop the process group: SIGTERM (unless ``begin_stop`` sent it), wait, SIGKILL.
        Idempotent. Returns what it took."""
        if self.popen is None or self.stopped_by:
            return self.stopped_by
        self.begin_stop()
        if not self._terminated:  # gone before it was asked
            self.stopped_by = "exited"
            return self.stopped_by
        pgid = self.pgid
        self.stopped_by = "SIGTERM"
        if not self._wait_group(pgid, self.stop_timeout):
            self.stopped_by = "SIGKILL"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            if not self._wait_group(pgid, 30.0):
                self.progress(f"  {self.spec.name}: processes {group_members(pgid)} survived SIGKILL")
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)
        return self.stopped_by

    def _wait_group(self, pgid: int, timeout: float) -> bool:
        assert self.popen is not None
        deadline = time.monotonic() + timeout
        while True:
            self.popen.poll()  # reap the leader, or it stays a zombie in the group
            if not group_members(pgid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
