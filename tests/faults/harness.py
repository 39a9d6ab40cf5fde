"""The fault suite's tools: runs in forked children, kills at filesystem calls, whole-tree pictures.

A child is a fork of the test process, so it starts with dynspec already imported: a run costs a
few milliseconds instead of a Python start-up. ``cli`` runs the real console entry point
(``patcher.cli.run``) there; what it prints and its exit status come back as a ``Run``.

Kills use a CPython audit hook (PEP 578): every call that can change the file system raises an
audit event before it acts, so "the k-th such call inside the tree" is a precise place to stop.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import signal
import stat
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import patcher.cli
import patcher.render
import patcher.session
from patcher.registry import load_recipe

# Imported and read here once, so that no forked child imports anything: a child that dropped root
# may not be able to read this Python's own library (e.g. a pyenv install under /root).
load_recipe("default")
patcher.session.git_facts("/")

FULL = os.environ.get("DYNSPEC_FAULTS") == "full"  # `make fuzz`: every case, not a sample
KNOWN_EXIT_CODES = {0, 1, 2, 3, 4, 10, 130}  # README's table, less the remote-only 5-9; never 123

# Audit events (https://docs.python.org/3/library/audit_events.html) of calls that change the file system.
_CHANGES = {"os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link", "os.symlink",
            "os.truncate", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile", "os.mkfifo", "os.mknod"}  # fmt: skip
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


@dataclass
class Run:
    code: int  # exit status; -N: killed by signal N
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.err.strip().splitlines()


def changes_fs(event: str, args: tuple[Any, ...], inside: str) -> bool:
    """Whether an audit event is a call that changes something inside ``inside``.

    dynspec addresses files relative to directory descriptors, so a relative path is one of its
    own calls; calls on a descriptor (fchmod, fchown) are too.
    """
    if event == "open":
        path, flags = args[0], args[2]
        if not isinstance(flags, int) or not flags & _WRITES:
            return False
    elif event in _CHANGES:
        path = args[0]
    else:
        return False
    if isinstance(path, int):
        return True
    text = os.fsdecode(path) if isinstance(path, (str, bytes)) else ""
    return not os.path.isabs(text) or text == inside or text.startswith(inside + os.sep)


def describe(event: str, args: tuple[Any, ...]) -> str:
    shown = ", ".join(repr(a) for a in args[:2])
    return f"{event}({shown})"


def stop_at(k: int, inside: Path, signum: int = signal.SIGKILL) -> Callable[[str, tuple[Any, ...]], None]:
    """An audit hook that sends ``signum`` to this process just before its k-th change inside the tree."""
    seen = [0]
    where = str(inside)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if changes_fs(event, args, where):
            seen[0] += 1
            if seen[0] == k + 1:
                os.kill(os.getpid(), signum)

    return hook


def forked(
    work: Callable[[], Any],
    *,
    hook: Callable[[str, tuple[Any, ...]], None] | None = None,
    user: tuple[int, int] | None = None,
    timeout: float = 120,
) -> Run:
    """Run ``work`` in a forked child; its return value (or SystemExit) is the exit status.

    ``user`` (uid, gid) drops root first, for the permission cases. A child still running after
    ``timeout`` seconds is killed and the run fails: dynspec must never block.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        status = _fork(work, hook, user, timeout, out.fileno(), err.fileno())
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode(errors="replace"))
    return Run(os.waitstatus_to_exitcode(status), texts[0], texts[1])


def _fork(
    work: Callable[[], Any],
    hook: Callable[[str, tuple[Any, ...]], None] | None,
    user: tuple[int, int] | None,
    timeout: float,
    out: int,
    err: int,
) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.dup2(out, 1)
            os.dup2(err, 2)
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
            if user is not None:
                os.setgroups([])
                os.setgid(user[1])
                os.setuid(user[0])
            if hook is not None:
                sys.addaudithook(hook)
            result = work()
            code = result if isinstance(result, int) else 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        except BaseException:  # noqa: BLE001 - reported to the parent as exit 99
            traceback.print_exc()
            code = 99
        finally:
            with contextlib.suppress(BaseException):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"the child blocked for more than {timeout} s")
        time.sleep(0.002)


def cli(*args: str) -> Callable[[], Any]:
    """The console entry point with ``args``, for ``forked``."""

    def work() -> None:
        sys.argv = ["dynspec", *args]
        os.environ["NO_COLOR"] = "1"
        patcher.cli.run()

    return work


def count_changes(work: Callable[[], Any], inside: Path) -> list[str]:
    """Every change ``work`` makes inside the tree, in order (it runs to the end in a child)."""
    with tempfile.NamedTemporaryFile("r") as log:
        fd = os.open(log.name, os.O_WRONLY)  # opened before the hook, so not counted
        where = str(inside)

        def hook(event: str, args: tuple[Any, ...]) -> None:
            if changes_fs(event, args, where):
                os.write(fd, (describe(event, args) + "\n").encode())

        run = forked(work, hook=hook)
        os.close(fd)
        assert run.code == 0, run.err
        return log.read().splitlines()


# -- what a tree looks like ----------------------------------------------------------------------


def picture(root: Path, *, txid: bool = False) -> dict[str, str]:
    """Everything under ``root`` (not following links): kind, mode, owner, and the bytes' sha256 or
    the link's target. state.json is compared without its transaction id (random per write)."""
    found: dict[str, str] = {}
    if not os.path.lexists(root):
        return found
    for path in [root, *sorted(root.rglob("*"))]:
        st = path.lstat()
        rel = str(path.relative_to(root))
        owner = f"{st.st_uid}:{st.st_gid} {stat.filemode(st.st_mode)}"
        if stat.S_ISLNK(st.st_mode):
            found[rel] = f"link -> {os.readlink(path)}"
        elif stat.S_ISREG(st.st_mode):
            data = path.read_bytes()
            if path.name == "state.json" and not txid:
                with contextlib.suppress(ValueError, AttributeError, RecursionError):
                    record = json.loads(data)
                    record.pop("txid", None)
                    data = json.dumps(record, sort_keys=True).encode()
            found[rel] = f"{owner} {hashlib.sha256(data).hexdigest()}"
        else:
            found[rel] = owner
    return found


def difference(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """What differs between two pictures, for assertion messages."""
    keys = sorted(set(a) | set(b))
    return [f"{k}: {a.get(k, '(none)')} -> {b.get(k, '(none)')}" for k in keys if a.get(k) != b.get(k)][:8]


def sample(items: list[Any], count: int, seed: str) -> list[Any]:
    """``count`` of ``items``, spread deterministically (all of them under ``make fuzz``)."""
    if FULL or len(items) <= count:
        return items
    return sorted(random.Random(seed).sample(items, count), key=items.index)


@contextlib.contextmanager
def world_readable_dir(prefix: str) -> Iterator[Path]:
    """A scratch dir that an unprivileged user can enter (pytest's tmp_path is root's, mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    try:
        yield path
    finally:
        import shutil

        shutil.rmtree(path, ignore_errors=True)
