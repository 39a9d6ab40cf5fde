"""All-or-nothing writes into an SGLang tree, and the state dir that makes revert exact.

Standard library only, on purpose: the remote applier ships this module to servers that have
nothing but python3 (>= 3.9).

Layout of the state dir, ``<sglang package>/.dynspec/``::

    state.json      what is applied: patches and revisions, per file the pre/post sha256
    blobs/<sha256>  the exact pre-image of every touched file
    journal.json    present only while a write is in flight (or was interrupted)
    .gitignore      "*", so a git checkout never shows the state dir as untracked

Every file is reached from a descriptor of the package dir, one component at a time, with
``O_NOFOLLOW``: a link inside the tree is followed only while it stays inside, a link out is refused,
and the state dir and everything in it must be real files and directories. A file is replaced by
writing a new ``O_EXCL`` temp file under an unpredictable name next to it and renaming that over
it; the new file keeps the old one's mode and owner.

An apply goes: pre-image blobs, journal, each file replaced, state.json, journal removed. A revert
goes: journal, each file restored, state.json removed, journal removed, state dir removed. Ctrl-C,
SIGTERM and SIGHUP are held back for the whole write. An error rolls the replaced files back at
once. A process killed midway leaves the journal; the next run (``recover``) rolls an apply back and
finishes a revert, and always removes dynspec's own temp files.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import posixpath
import re
import secrets
import signal
import stat
import threading
import uuid
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

STATE_DIR = ".dynspec"
STATE_FORMAT = 1
JOURNAL_FORMAT = 1
MAX_FILE_BYTES = 16 << 20  # SGLang's largest target is ~0.4 MiB; anything this big is not one
MAX_LINK_HOPS = 40  # as the kernel's own limit (ELOOP)
TEMP_INFIX = ".dynspec-tmp-"
_TEMP_NAME = re.compile(r"\.dynspec-tmp-[0-9a-f]+\Z")  # ours, and those of dynspec <= 0.x (pid-named)
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
_TXID = re.compile(r"[0-9a-f]{32}\Z")
_PATCH_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}\Z")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC


class TxnError(Exception):
    """A write was refused or failed; the tree is as it was before."""


class DamagedState(TxnError):
    """The state dir is not what dynspec wrote: a link, not a directory, bad JSON, a missing blob."""


def damaged_way_out(state_dir: str, version: Optional[str]) -> str:
    """What to do about a damaged state dir, for the end of its one-line refusal."""
    release = version or "<its version>"
    return (
        f"nothing was written; to start over, restore SGLang's original files (git checkout, or "
        f"pip install --force-reinstall --no-deps sglang=={release}) and delete {state_dir}"
    )


class Interrupted(KeyboardInterrupt):
    """Ctrl-C arrived during a write and was held back until it was over; ``completed`` says how
    it ended: True, every file is new; False, every file is as it was."""

    def __init__(self, completed: bool) -> None:
        super().__init__()
        self.completed = completed


def sha256(data: Optional[bytes]) -> Optional[str]:
    return None if data is None else hashlib.sha256(data).hexdigest()


def read_bytes(path: str, limit: int = MAX_FILE_BYTES) -> Optional[bytes]:
    """The bytes of a regular file of at most ``limit`` bytes, else None (missing, a directory, a
    FIFO, a device, unreadable, too big). For files that are only read, such as version files."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        return _read_all(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_all(fd: int, limit: int) -> Optional[bytes]:
    chunks: List[bytes] = []
    size = 0
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)


def is_plain_path(rel: Any) -> bool:
    """A relative POSIX path inside the tree that names no parent and not the state dir."""
    return (
        isinstance(rel, str)
        and 0 < len(rel) <= 1024
        and "\0" not in rel
        and "\\" not in rel
        and not rel.startswith("/")
        and posixpath.normpath(rel) == rel
        and ".." not in rel.split("/")
        and rel.split("/")[0] != STATE_DIR
    )


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISLNK(mode):
        return "a link"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "of an unknown kind"


def _not_a_directory(dfd: int, name: str, where: str) -> DamagedState:
    """The refusal for a part of the state dir that is not a real directory, naming what it is."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError:
        return DamagedState(f"{where} is not a directory")
    if stat.S_ISLNK(st.st_mode):
        return DamagedState(
            f"{where} is a link to {os.readlink(name, dir_fd=dfd)}; dynspec keeps its state only in a real "
            "directory inside the tree"
        )
    return DamagedState(f"{where} is {_kind(st.st_mode)}, not a directory")


# -- signals ----------------------------------------------------------------------------------


class SignalsHeld:
    """Hold Ctrl-C, SIGTERM and SIGHUP back while files are replaced; deliver them afterwards.

    Ctrl-C becomes ``Interrupted``, which says whether the write completed; SIGTERM and SIGHUP are
    re-raised with the handlers they had. Only the main thread can set handlers: elsewhere this
    holds nothing back.
    """

    SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))

    def __enter__(self) -> "SignalsHeld":
        self.caught: List[int] = []
        self._previous: Dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._hold)
        return self

    def _hold(self, signum: int, frame: Any) -> None:
        self.caught.append(signum)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        for signum in dict.fromkeys(self.caught):
            if signum == signal.SIGINT and self._previous.get(signum) is signal.default_int_handler:
                raise Interrupted(completed=exc_type is None)
            signal.raise_signal(signum)


# -- schemas of state.json and journal.json -----------------------------------------------------


def _problem_in_files(files: Any, extra: Tuple[str, ...]) -> Optional[str]:
    if not isinstance(files, dict):
        return "'files' is not an object"
    for rel, entry in files.items():
        if not is_plain_path(rel):
            return f"'files' names {rel!r}, which is not a plain path inside the tree"
        if not isinstance(entry, dict):
            return f"the entry of {rel} is not an object"
        if set(entry) - {"pre", "post", *extra} or not {"pre", "post"} <= set(entry):
            return f"the entry of {rel} has keys {sorted(entry)}, not pre and post"
        for key in ("pre", "post"):
            if entry[key] is not None and not (isinstance(entry[key], str) and _SHA256.match(entry[key])):
                return f"{rel}: {key!r} is not a sha256"
        if "mode" in entry and not (entry["mode"] is None or type(entry["mode"]) is int):
            return f"{rel}: 'mode' is not a number"
    return None


def state_problem(state: Any) -> Optional[str]:
    """What is wrong with a state.json's content, or None. The engine relies on nothing else."""
    if not isinstance(state, dict):
        return "it is not a JSON object"
    if state.get("format") != STATE_FORMAT:
        return f"it has format {state.get('format')!r}; this dynspec reads format {STATE_FORMAT}"
    known = {"format", "txid", "dynspec", "sglang_version", "recipe", "patches", "files"}
    if set(state) - known:
        return f"it has unknown keys {sorted(set(state) - known)}"
    if not isinstance(state.get("txid"), str) or not _TXID.match(state["txid"]):
        return "'txid' is missing or not a transaction id"
    for key in ("dynspec", "sglang_version", "recipe"):
        if key in state and not isinstance(state[key], str):
            return f"{key!r} is not a string"
    patches = state.get("patches", {})
    if not isinstance(patches, dict):
        return "'patches' is not an object"
    for patch_id, revision in patches.items():
        if not _PATCH_ID.match(patch_id) or type(revision) is not int or revision < 1:
            return f"'patches' has {patch_id!r}: {revision!r}, not a patch id and revision"
    return _problem_in_files(state.get("files", {}), ())


def journal_problem(journal: Any) -> Optional[str]:
    """What is wrong with a journal.json's content, or None. A recorded mode is read, never used."""
    if not isinstance(journal, dict):
        return "it is not a JSON object"
    if set(journal) - {"format", "txid", "revert", "files"}:
        return f"it has unknown keys {sorted(set(journal) - {'format', 'txid', 'revert', 'files'})}"
    if journal.get("format", JOURNAL_FORMAT) != JOURNAL_FORMAT:
        return f"it has format {journal.get('format')!r}; this dynspec reads format {JOURNAL_FORMAT}"
    if not isinstance(journal.get("txid"), str) or not _TXID.match(journal["txid"]):
        return "'txid' is missing or not a transaction id"
    if not isinstance(journal.get("revert", False), bool):
        return "'revert' is not true or false"
    if "files" not in journal:
        return "'files' is missing"
    return _problem_in_files(journal["files"], ("mode",))


def _parse_json(data: bytes) -> Tuple[Any, Optional[str]]:
    try:
        return json.loads(data), None
    except RecursionError:
        return None, "it is nested too deeply to be dynspec's"
    except ValueError:
        return None, "it is not valid JSON"


# -- the tree ---------------------------------------------------------------------------------


class Tree:
    """The files of one SGLang package dir, addressed by paths relative to it."""

    def __init__(self, package_dir: str) -> None:
        self.root = os.path.realpath(package_dir)
        self.state_dir = os.path.join(self.root, STATE_DIR)
        self._owner = self._owner_of_root()

    def _owner_of_root(self) -> Optional[Tuple[int, int]]:
        """Who new files belong to when root writes them: the package dir's owner."""
        if not hasattr(os, "geteuid") or os.geteuid() != 0:
            return None
        try:
            st = os.stat(self.root)
        except OSError:
            return None
        return st.st_uid, st.st_gid

    def _give_away(self, name: str, dfd: int) -> None:
        """A directory dynspec just made belongs to the package dir's owner, as its files do."""
        if self._owner is not None:
            with contextlib.suppress(PermissionError):
                os.chown(name, *self._owner, dir_fd=dfd, follow_symlinks=False)

    # -- paths ---------------------------------------------------------------------------------
    def resolve(self, rel: str) -> List[str]:
        """The components of ``rel`` inside the tree, with every link in it followed; a link that
        leads out of the tree is refused, naming it."""
        if not is_plain_path(rel):
            raise TxnError(f"refusing path {rel!r}: not a plain path inside the SGLang tree")
        done: List[str] = []
        todo = rel.split("/")
        hops = 0
        while todo:
            name = todo.pop(0)
            if name in ("", "."):
                continue
            if name == "..":
                if not done:
                    raise TxnError(f"refusing path {rel!r}: it resolves outside the SGLang tree")
                done.pop()
                continue
            here = "/".join([*done, name])
            try:
                link = os.readlink(os.path.join(self.root, here))
            except OSError:  # not a link, or not there: taken as it is
                done.append(name)
                continue
            hops += 1
            if hops > MAX_LINK_HOPS:
                raise TxnError(f"{rel}: too many levels of links")
            if os.path.isabs(link):
                inside = os.path.normpath(link)
                if inside != self.root and not inside.startswith(self.root + os.sep):
                    raise TxnError(
                        f"{here} is a link to {link}, outside the SGLang tree {self.root}; "
                        "dynspec follows no link out of the tree"
                    )
                done, todo = [], inside[len(self.root) :].split("/") + todo
            else:
                todo = link.split("/") + todo
        if not done or done[0] == STATE_DIR:
            raise TxnError(f"refusing path {rel!r}: it resolves to the tree itself or into the state dir")
        return done

    def path(self, rel: str) -> str:
        """Absolute path of ``rel`` (its links resolved); refuses anything outside the tree."""
        return os.path.join(self.root, *self.resolve(rel))

    @contextlib.contextmanager
    def _dir(self, parts: List[str], what: str) -> Iterator[int]:
        """A descriptor of the directory ``parts`` (no component a link). FileNotFoundError if absent."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
        try:
            for i, name in enumerate(parts):
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as error:
                    if error.errno in (errno.ELOOP, errno.ENOTDIR):
                        where = "/".join(parts[: i + 1])
                        raise TxnError(f"{where} (on the way to {what}) is not a directory inside the tree") from None
                    raise
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    def read(self, rel: str) -> Optional[bytes]:
        """The bytes of ``rel``, None if it does not exist; refuses anything but a regular file."""
        parts = self.resolve(rel)
        try:
            with self._dir(parts[:-1], rel) as dfd:
                return self._read_at(dfd, parts[-1], rel, TxnError)
        except FileNotFoundError:
            return None
        except PermissionError:
            raise TxnError(f"cannot read {rel}: permission denied; run dynspec as the tree's owner") from None

    def _read_at(self, dfd: int, name: str, what: str, error: "type[TxnError]") -> Optional[bytes]:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise error(f"{what} is {st.st_size} bytes; dynspec reads files of at most {MAX_FILE_BYTES} bytes")
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, dir_fd=dfd)
        except PermissionError:
            raise TxnError(f"cannot read {what}: permission denied; run dynspec as the tree's owner") from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise error(f"{what} became a link while dynspec read it") from None
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise error(f"{what} is not a regular file")
            data = _read_all(fd, MAX_FILE_BYTES)
        finally:
            os.close(fd)
        if data is None:
            raise error(f"{what} is larger than {MAX_FILE_BYTES} bytes")
        return data

    # -- lock ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold an exclusive lock on the tree; a second dynspec on the same tree is refused.

        The lock is an flock on the package directory itself, so taking it writes nothing.
        """
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
        except PermissionError:
            raise TxnError(f"cannot open {self.root}: permission denied") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise TxnError(
                        f"another dynspec is working on {self.root}; try again when it has finished"
                    ) from None
                raise
            yield
        finally:
            os.close(fd)

    # -- the state dir -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _state_dir(self, create: bool = False) -> Iterator[Optional[int]]:
        """A descriptor of the state dir (None when there is none and ``create`` is false)."""
        with self._dir([], STATE_DIR) as root_fd:
            try:
                st: Optional[os.stat_result] = os.stat(STATE_DIR, dir_fd=root_fd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is None and not create:
                yield None
                return
            if st is None:
                os.mkdir(STATE_DIR, 0o755, dir_fd=root_fd)
                self._give_away(STATE_DIR, root_fd)
            elif not stat.S_ISDIR(st.st_mode):
                raise _not_a_directory(root_fd, STATE_DIR, self.state_dir)
            try:
                fd = os.open(STATE_DIR, _DIR_FLAGS, dir_fd=root_fd)
            except PermissionError:
                raise TxnError(f"cannot read {self.state_dir}: permission denied") from None
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _not_a_directory(root_fd, STATE_DIR, self.state_dir) from None
                raise
            try:
                yield fd
            finally:
                os.close(fd)

    @contextlib.contextmanager
    def _blobs_dir(self, state_fd: int, create: bool = False) -> Iterator[Optional[int]]:
        try:
            fd = os.open("blobs", _DIR_FLAGS, dir_fd=state_fd)
        except FileNotFoundError:
            if not create:
                yield None
                return
            os.mkdir("blobs", 0o755, dir_fd=state_fd)
            self._give_away("blobs", state_fd)
            fd = os.open("blobs", _DIR_FLAGS, dir_fd=state_fd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise _not_a_directory(state_fd, "blobs", f"{self.state_dir}/blobs") from None
            raise
        try:
            yield fd
        finally:
            os.close(fd)

    def _read_json(self, state_fd: int, name: str) -> Tuple[Optional[bytes], str]:
        where = f"{self.state_dir}/{name}"
        return self._read_at(state_fd, name, where, DamagedState), where

    def load_state(self) -> Optional[Dict[str, Any]]:
        """The validated state.json, or None when dynspec has not patched the tree."""
        with self._state_dir() as fd:
            if fd is None:
                return None
            return self._load_state_at(fd)

    def _load_state_at(self, fd: int) -> Optional[Dict[str, Any]]:
        return self._load_checked_at(fd, "state.json", state_problem)

    def _load_journal_at(self, fd: int) -> Optional[Dict[str, Any]]:
        return self._load_checked_at(fd, "journal.json", journal_problem)

    def _load_checked_at(
        self, fd: int, name: str, problem_of: Callable[[Any], Optional[str]]
    ) -> Optional[Dict[str, Any]]:
        """The state dir's ``name``, parsed and checked by ``problem_of``; None when absent."""
        data, where = self._read_json(fd, name)
        if data is None:
            return None
        value, problem = _parse_json(data)
        problem = problem or problem_of(value)
        if problem:
            raise DamagedState(f"{where} is damaged: {problem}")
        return dict(value)

    def has_journal(self) -> bool:
        """Whether an interrupted write is pending (status says so; apply and revert finish it)."""
        with self._state_dir() as fd:
            return fd is not None and self._load_journal_at(fd) is not None

    def blob(self, digest: str) -> bytes:
        where = f"pre-image {str(digest)[:12]}"
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise DamagedState(f"{where} is not a sha256")
        with self._state_dir() as fd:
            data = None
            if fd is not None:
                with self._blobs_dir(fd) as blobs:
                    if blobs is not None:
                        data = self._read_at(blobs, digest, f"{self.state_dir}/blobs/{digest}", DamagedState)
        if data is None or sha256(data) != digest:
            raise DamagedState(f"{where} is missing or damaged in {self.state_dir}/blobs")
        return data

    # -- checks before writing -----------------------------------------------------------------
    def check_writable(self, rel: str) -> None:
        """Refuse read-only targets by their permission bits (root ignores them otherwise)."""
        parts = self.resolve(rel)
        parent = "/".join(parts[:-1]) or "."
        with self._dir(parts[:-1], rel) as dfd:
            try:
                st: Optional[os.stat_result] = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None:
                if not stat.S_ISREG(st.st_mode):
                    raise TxnError(f"{rel} is {_kind(st.st_mode)}, not a regular file")
                if not st.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(
                    parts[-1], os.W_OK, dir_fd=dfd
                ):
                    raise TxnError(f"{rel} is read-only; make it writable or run dynspec as its owner")
            if not os.fstat(dfd).st_mode & stat.S_IWUSR or not os.access(os.path.join(self.root, *parts[:-1]), os.W_OK):
                raise TxnError(f"{parent}/ is read-only; cannot replace {rel}")

    # -- recovery ------------------------------------------------------------------------------
    def recover(self, also: Iterable[str] = ()) -> Optional[str]:
        """Roll back an interrupted apply, finish an interrupted revert, and remove dynspec's temp
        files (next to the recorded files, to ``also``, and in the state dir). Returns a sentence
        when there was something to finish, else None."""
        with SignalsHeld():
            return self._recover(also)

    def _recover(self, also: Iterable[str]) -> Optional[str]:
        message = None
        recorded: List[str] = list(also)
        with self._state_dir() as fd:
            if fd is not None:
                _sweep_temp_files(fd)
                with self._blobs_dir(fd) as blobs:
                    if blobs is not None:
                        _sweep_temp_files(blobs)
                journal = self._load_journal_at(fd)
                state = self._load_state_at(fd)
                recorded += list((journal or {}).get("files", {})) + list((state or {}).get("files", {}))
                self._sweep_next_to(recorded)
                if journal is not None:
                    message = self._finish(fd, journal, state)
                    state = self._load_state_at(fd)
                if state is None:
                    if message is None:
                        message = (
                            "an earlier dynspec run was interrupted before it wrote any file; its state dir was removed"
                        )
                    self._remove_state_dir()
                else:
                    self._drop_unused_blobs(fd, state)
                return message
        self._sweep_next_to(recorded)
        return None

    def _finish(self, fd: int, journal: Dict[str, Any], state: Optional[Dict[str, Any]]) -> str:
        files = journal["files"]
        if state is not None and state.get("txid") == journal["txid"]:
            os.unlink("journal.json", dir_fd=fd)
            return "an earlier dynspec run was interrupted after its last write; it is complete"
        forward = bool(journal.get("revert"))
        for rel, entry in files.items():
            current = sha256(self.read(rel))
            wanted, other = (entry["post"], entry["pre"]) if forward else (entry["pre"], entry["post"])
            if current == wanted:
                continue
            if current != other:
                raise DamagedState(
                    f"an interrupted dynspec run left {rel} in an unknown state; "
                    f"restore it by hand (original sha256 {entry['pre'] if not forward else entry['post']})"
                )
            self._put(rel, None if wanted is None else self.blob(wanted))
        if forward:
            with contextlib.suppress(FileNotFoundError):
                os.unlink("state.json", dir_fd=fd)
            os.unlink("journal.json", dir_fd=fd)
            return "an earlier dynspec revert was interrupted; it is now finished"
        os.unlink("journal.json", dir_fd=fd)
        return "an earlier dynspec run was interrupted; its partial write was rolled back"

    def _sweep_next_to(self, rels: Iterable[str]) -> None:
        seen = set()
        for rel in rels:
            try:
                parts = self.resolve(rel)
            except TxnError:
                continue  # a path that cannot be written cannot have a temp file of ours either
            if tuple(parts[:-1]) in seen:
                continue
            seen.add(tuple(parts[:-1]))
            with contextlib.suppress(FileNotFoundError, TxnError), self._dir(parts[:-1], rel) as dfd:
                _sweep_temp_files(dfd)

    def _drop_unused_blobs(self, fd: int, state: Dict[str, Any]) -> None:
        used = {e["pre"] for e in state.get("files", {}).values()}
        with self._blobs_dir(fd) as blobs:
            if blobs is None:
                return
            for name in os.listdir(blobs):
                if name not in used:
                    _remove_at(blobs, name)

    # -- the write -----------------------------------------------------------------------------
    def commit(self, writes: Mapping[str, Optional[bytes]], state: Optional[Dict[str, Any]]) -> None:
        """Replace every file in ``writes`` (None deletes) and the state, all or nothing.

        ``state`` None removes the state dir: the tree is back to pristine (a revert).
        """
        with SignalsHeld():
            self._commit(writes, state)

    def _commit(self, writes: Mapping[str, Optional[bytes]], state: Optional[Dict[str, Any]]) -> None:
        for rel in writes:
            self.check_writable(rel)
        originals: Dict[str, Optional[bytes]] = {rel: self.read(rel) for rel in writes}
        txid = uuid.uuid4().hex
        revert = state is None
        journal = {
            "format": JOURNAL_FORMAT,
            "txid": txid,
            "revert": revert,
            "files": {rel: {"pre": sha256(originals[rel]), "post": sha256(new)} for rel, new in writes.items()},
        }
        with self._state_dir(create=True) as fd:
            assert fd is not None
            previous = self._load_state_at(fd)
            try:
                # An apply is rolled back from its pre-images; a revert is finished from its post-images.
                self._save_blobs(fd, writes.values() if revert else originals.values())
                _write_at(fd, "journal.json", json.dumps(journal, indent=1).encode(), self._owner)
            except BaseException:
                self._undo_blobs(fd, previous)  # nothing was replaced yet: leave no trace
                raise
            done = []
            try:
                for rel, new in writes.items():
                    self._put(rel, new)
                    done.append(rel)
                if revert:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink("state.json", dir_fd=fd)
                else:
                    record = dict(state or {}, txid=txid, format=STATE_FORMAT)
                    _write_at(fd, "state.json", json.dumps(record, indent=1).encode(), self._owner)
                os.unlink("journal.json", dir_fd=fd)
            except BaseException:
                for rel in reversed(done):
                    self._put(rel, originals[rel])
                if previous is not None and revert and not _exists_at(fd, "state.json"):
                    _write_at(fd, "state.json", json.dumps(previous, indent=1).encode(), self._owner)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink("journal.json", dir_fd=fd)
                self._undo_blobs(fd, previous)
                raise
            # The write is complete: what is left to tidy, the next recovery tidies if this cannot.
            if not revert:
                with contextlib.suppress(OSError):
                    self._drop_unused_blobs(fd, self._load_state_at(fd) or {})
        if revert:
            with contextlib.suppress(OSError):
                self._remove_state_dir()

    def _save_blobs(self, fd: int, contents: Iterable[Optional[bytes]]) -> None:
        if not _exists_at(fd, ".gitignore"):
            _write_at(fd, ".gitignore", b"*\n", self._owner)
        with self._blobs_dir(fd, create=True) as blobs:
            assert blobs is not None
            for data in contents:
                if data is not None:
                    name = sha256(data) or ""
                    if not _exists_at(blobs, name):
                        _write_at(blobs, name, data, self._owner)

    def _undo_blobs(self, fd: int, previous: Optional[Dict[str, Any]]) -> None:
        """After a failed write: no state dir if there was none, else only the blobs it uses."""
        if previous is None:
            self._remove_state_dir()
        else:
            self._drop_unused_blobs(fd, previous)

    def _put(self, rel: str, data: Optional[bytes]) -> None:
        """Replace (or delete, for None) one file; the new file keeps the old one's mode and owner."""
        parts = self.resolve(rel)
        with self._dir(parts[:-1], rel) as dfd:
            name = parts[-1]
            try:
                st: Optional[os.stat_result] = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and not stat.S_ISREG(st.st_mode):
                raise TxnError(f"{rel} is {_kind(st.st_mode)}, not a regular file")
            if data is None:
                if st is not None:
                    os.unlink(name, dir_fd=dfd)
                return
            if st is None:
                parent = os.fstat(dfd)
                owner = (parent.st_uid, parent.st_gid) if self._owner is not None else None
                _write_at(dfd, name, data, owner, 0o644)
            else:
                _write_at(dfd, name, data, (st.st_uid, st.st_gid), stat.S_IMODE(st.st_mode))

    def _remove_state_dir(self) -> None:
        with self._dir([], STATE_DIR) as root_fd:
            _remove_at(root_fd, STATE_DIR)

    def remove_state_dir(self) -> None:
        """Drop the state dir whatever is in it (a link is removed, never followed)."""
        with SignalsHeld():
            self._remove_state_dir()


def _exists_at(dfd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dfd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def _write_at(dfd: int, name: str, data: bytes, owner: Optional[Tuple[int, int]], mode: int = 0o644) -> None:
    """Write ``name`` in the directory ``dfd`` by an O_EXCL temp file renamed over it."""
    while True:
        temp = f"{name}{TEMP_INFIX}{secrets.token_hex(8)}"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o600, dir_fd=dfd)
            break
        except FileExistsError:
            continue
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if owner is not None:
                with contextlib.suppress(PermissionError):
                    os.fchown(fd, *owner)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=dfd)
        raise


def _remove_at(dfd: int, name: str) -> None:
    """Remove ``name`` in ``dfd`` and, for a real directory, everything under it; links are not followed."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dfd)
        return
    fd = os.open(name, _DIR_FLAGS, dir_fd=dfd)
    try:
        for child in os.listdir(fd):
            _remove_at(fd, child)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dfd)


def _sweep_temp_files(dfd: int) -> None:
    """Remove what an interrupted write of dynspec left in one directory: its temp files."""
    for name in os.listdir(dfd):
        if _TEMP_NAME.search(name):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    os.unlink(name, dir_fd=dfd)
