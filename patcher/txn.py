"""All-or-nothing writes into an SGLang tree, and the state dir that makes revert exact.

Standard library only, on purpose: the remote applier ships this module to servers that have
nothing but python3 (>= 3.9).

Layout of the state dir, ``<sglang package>/.dynspec/``::

    state.json      what is applied: patches and revisions, per file the pre/post sha256
    blobs/<sha256>  the exact pre-image of every touched file
    journal.json    present only while a write is in flight (or was interrupted)
    .gitignore      "*", so a git checkout never shows the state dir as untracked

A write goes: pre-image blobs, journal, each file to a temp file then ``os.replace``, state.json,
journal removed. An error rolls the replaced files back at once; a process killed midway leaves the
journal, and the next run rolls the files back before doing anything else.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import uuid
from typing import Any, Dict, Iterable, Iterator, Mapping, Optional

STATE_DIR = ".dynspec"
STATE_FORMAT = 1


class TxnError(Exception):
    """A write was refused or failed; the tree is as it was before."""


def sha256(data: Optional[bytes]) -> Optional[str]:
    return None if data is None else hashlib.sha256(data).hexdigest()


def read_bytes(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _write_atomic(path: str, data: bytes, mode: Optional[int] = None) -> None:
    tmp = f"{path}.dynspec-tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class Tree:
    """The files of one SGLang package dir, addressed by paths relative to it."""

    def __init__(self, package_dir: str) -> None:
        self.root = os.path.realpath(package_dir)
        self.state_dir = os.path.join(self.root, STATE_DIR)

    # -- paths ---------------------------------------------------------------------------------
    def path(self, rel: str) -> str:
        """Absolute path of ``rel``; refuses anything that would land outside the tree."""
        if os.path.isabs(rel) or rel != os.path.normpath(rel) or rel.split(os.sep)[0] == "..":
            raise TxnError(f"refusing path {rel!r}: not a plain path inside the SGLang tree")
        full = os.path.join(self.root, rel)
        parent = os.path.realpath(os.path.dirname(full))
        if parent != self.root and not parent.startswith(self.root + os.sep):
            raise TxnError(f"refusing path {rel!r}: it resolves outside the SGLang tree")
        return full

    def read(self, rel: str) -> Optional[bytes]:
        return read_bytes(self.path(rel))

    # -- lock ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold an exclusive lock on the tree; a second dynspec on the same tree is refused.

        The lock is an flock on the package directory itself, so taking it writes nothing.
        """
        fd = os.open(self.root, os.O_RDONLY)
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

    # -- state ---------------------------------------------------------------------------------
    def load_state(self) -> Optional[Dict[str, Any]]:
        data = read_bytes(os.path.join(self.state_dir, "state.json"))
        if data is None:
            return None
        try:
            state = json.loads(data)
        except ValueError:
            raise TxnError(f"{self.state_dir}/state.json is not valid JSON") from None
        if not isinstance(state, dict):
            raise TxnError(f"{self.state_dir}/state.json is not a JSON object")
        if state.get("format") != STATE_FORMAT:
            raise TxnError(
                f"{self.state_dir}/state.json has format {state.get('format')!r}; "
                f"this dynspec reads format {STATE_FORMAT}"
            )
        return state

    def blob(self, digest: str) -> bytes:
        data = read_bytes(os.path.join(self.state_dir, "blobs", digest))
        if data is None or sha256(data) != digest:
            raise TxnError(f"pre-image {digest[:12]} is missing or damaged in {self.state_dir}/blobs")
        return data

    # -- checks before writing -----------------------------------------------------------------
    def check_writable(self, rel: str) -> None:
        """Refuse read-only targets by their permission bits (root ignores them otherwise)."""
        full = self.path(rel)
        target = full if os.path.exists(full) else os.path.dirname(full)
        st = os.stat(target)
        if not st.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(target, os.W_OK):
            raise TxnError(f"{rel} is read-only; make it writable or run dynspec as its owner")
        parent = os.path.dirname(full)
        if not os.access(parent, os.W_OK) or not os.stat(parent).st_mode & stat.S_IWUSR:
            raise TxnError(f"{os.path.relpath(parent, self.root)}/ is read-only; cannot replace {rel}")

    # -- recovery ------------------------------------------------------------------------------
    def recover(self) -> Optional[str]:
        """Finish or roll back a write that was interrupted. Returns a sentence, or None."""
        journal_path = os.path.join(self.state_dir, "journal.json")
        data = read_bytes(journal_path)
        if data is None:
            return None
        journal = json.loads(data)
        state = self.load_state()
        if state is not None and state.get("txid") == journal["txid"]:
            os.unlink(journal_path)
            return "an earlier dynspec run was interrupted after its last write; it is complete"
        for rel, entry in journal["files"].items():
            current = sha256(self.read(rel))
            if current == entry["pre"]:
                continue
            if current != entry["post"]:
                raise TxnError(
                    f"an interrupted dynspec run left {rel} in an unknown state; "
                    f"restore it by hand (pre-image sha256 {entry['pre']})"
                )
            self._put(rel, None if entry["pre"] is None else self.blob(entry["pre"]), entry.get("mode"))
        os.unlink(journal_path)
        if state is None:
            self._remove_state_dir_if_only_blobs()
        return "an earlier dynspec run was interrupted; its partial write was rolled back"

    # -- the write -----------------------------------------------------------------------------
    def commit(self, writes: Mapping[str, Optional[bytes]], state: Optional[Dict[str, Any]]) -> None:
        """Replace every file in ``writes`` (None deletes) and the state, all or nothing.

        ``state`` None removes the state dir: the tree is back to pristine.
        """
        for rel in writes:
            self.check_writable(rel)
        originals: Dict[str, Optional[bytes]] = {rel: self.read(rel) for rel in writes}
        modes = {rel: self._mode(rel) for rel in writes}
        txid = uuid.uuid4().hex
        try:
            self._save_pre_images(originals.values())
        except BaseException:
            self._remove_state_dir_if_only_blobs()  # nothing was replaced yet: leave no trace
            raise
        journal = {
            "txid": txid,
            "files": {
                rel: {"pre": sha256(originals[rel]), "post": sha256(new), "mode": modes[rel]}
                for rel, new in writes.items()
            },
        }
        journal_path = os.path.join(self.state_dir, "journal.json")
        _write_atomic(journal_path, json.dumps(journal, indent=1).encode())
        done = []
        try:
            for rel, new in writes.items():
                self._put(rel, new, modes[rel])
                done.append(rel)
            if state is None:
                self._remove_state_dir()
                return
            state = dict(state, txid=txid, format=STATE_FORMAT)
            _write_atomic(os.path.join(self.state_dir, "state.json"), json.dumps(state, indent=1).encode())
            os.unlink(journal_path)
        except BaseException:
            for rel in reversed(done):
                self._put(rel, originals[rel], modes[rel])
            with contextlib.suppress(FileNotFoundError):
                os.unlink(journal_path)
            if self.load_state() is None:
                self._remove_state_dir_if_only_blobs()
            raise

    def _save_pre_images(self, originals: "Iterable[Optional[bytes]]") -> None:
        os.makedirs(os.path.join(self.state_dir, "blobs"), exist_ok=True)
        _write_atomic(os.path.join(self.state_dir, ".gitignore"), b"*\n")
        for data in originals:
            if data is not None:
                blob = os.path.join(self.state_dir, "blobs", sha256(data) or "")
                if not os.path.exists(blob):
                    _write_atomic(blob, data)

    def _mode(self, rel: str) -> Optional[int]:
        try:
            return stat.S_IMODE(os.stat(self.path(rel)).st_mode)
        except FileNotFoundError:
            return None

    def _put(self, rel: str, data: Optional[bytes], mode: Optional[int]) -> None:
        full = self.path(rel)
        if data is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(full)
        else:
            _write_atomic(full, data, mode if mode is not None else 0o644)

    def _remove_state_dir(self) -> None:
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def _remove_state_dir_if_only_blobs(self) -> None:
        if not os.path.exists(os.path.join(self.state_dir, "state.json")):
            self._remove_state_dir()
