"""`dynspec remote`: the local engine, a server's files, and the system OpenSSH client between them.

One ssh connection per host and command, so ``~/.ssh/config``, agents and ProxyJump work as they do
for ``ssh HOST``. Over it runs ``python3 -c BOOTSTRAP``, which reads the ``SHIPPED`` modules
(``patcher/txn.py``, ``patcher/treefacts.py``, ``applier.py``) from the same pipe (nothing is
installed or left on the server). The applier sends a snapshot of the tree: its versions and git
facts (read by treefacts, as for a local tree), every target, the state dir's record and pre-images. Here a ``SnapshotTree`` gives
that snapshot the read interface of ``txn.Tree``, so ``engine.plan`` / ``status`` /
``revert_writes`` / ``unified_diff`` run exactly as for a local tree.
For apply and revert the applier holds the tree's lock from before the snapshot until the write,
recovers an interrupted write first, then gets the writes with the sha256 every file must still
have, and writes with ``Tree.commit``: the same state dir as a local apply.

Nothing here imports click or rich; ``command`` renders the results.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from patcher import engine, progress, treefacts, txn
from patcher.engine import targets_in_order
from patcher.errors import (
    AnchorNotFound,
    ConnectionLost,
    DamagedState,
    DynspecError,
    ExitCode,
    HostUnreachable,
    Interrupted,
    NotAnSGLangTree,
    Refused,
    RemotePythonMissing,
    SshAuthFailed,
    UnknownHostKey,
    UsageError,
)
from patcher.registry import Recipe
from patcher.remote import applier
from patcher.tree import choose_version

MARK = applier.MARK
TOO_OLD = 86  # BOOTSTRAP's exit status on a python older than 3.9

# Runs on any python, even 2.x, far enough to say that it is too old. The program it reads next is
# length-prefixed, so the rest of stdin stays free for the JSON lines of the conversation.
BOOTSTRAP = (
    "import sys;"
    "sys.version_info<(3,9) and (sys.stderr.write('dynspec: '+sys.executable+' is Python %d.%d; "
    "dynspec needs python3 >= 3.9\\n'%sys.version_info[:2]),sys.exit(86));"
    "b=sys.stdin.buffer;exec(compile(b.read(int(b.readline())),'<dynspec>','exec'))"
)

_PROGRAM = """\
import sys, types
def _load(name, source):
    module = types.ModuleType(name)
    module.__file__ = "<dynspec>/" + name + ".py"
    sys.modules[name] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module
for _name, _source in {modules!r}:
    _load(_name, _source)
sys.exit(sys.modules["dynspec_applier"].serve())
"""

# The modules that run on servers, by their name there, each after those it imports.
SHIPPED = {"dynspec_txn": txn, "dynspec_treefacts": treefacts, "dynspec_applier": applier}


def shipped_sources() -> dict[str, str]:
    """The source of every module in SHIPPED, by its name on the server."""
    return {name: Path(str(module.__file__)).read_text(encoding="utf-8") for name, module in SHIPPED.items()}


def program() -> bytes:
    return _PROGRAM.format(modules=list(shipped_sources().items())).encode()


# -- ssh ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ssh:
    """How to reach the servers: the system ssh with the user's config, never a password prompt."""

    python: str = "python3"
    config: str | None = None  # ssh -F
    options: tuple[str, ...] = ()  # ssh -o, before dynspec's own, so they win
    connect_timeout: int = 10

    def argv(self, host: str) -> list[str]:
        ssh = shutil.which("ssh")
        if ssh is None:
            raise UsageError("dynspec remote needs the OpenSSH client, and there is no `ssh` on PATH")
        if not host or host.startswith("-"):
            raise UsageError(f"{host!r} is not a host name")
        argv = [ssh, "-T", "-x"]
        if self.config:
            argv += ["-F", self.config]
        for option in self.options:
            argv += ["-o", option]
        argv += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout}"]
        argv += ["-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4"]
        return [*argv, "--", host, f"{remote_word(self.python)} -c {shlex.quote(BOOTSTRAP)}"]


def remote_word(path: str) -> str:
    """Quote for the remote shell, keeping a leading ``~/`` for it to expand."""
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


class RemoteCrash(Exception):
    """The applier on the server failed with a traceback: a bug in dynspec, not the user's."""

    def __init__(self, stderr: str) -> None:
        self.stderr = stderr
        last = stderr.strip().splitlines()[-1] if stderr.strip() else "no message"
        super().__init__(f"the dynspec applier on the server failed: {last}")


_HOST_KEY = ("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED", "host key is known for")
_AUTH = ("Permission denied", "Too many authentication failures", "No more authentication methods")
_UNREACHABLE = (
    "Could not resolve hostname",
    "Name or service not known",
    "Temporary failure in name resolution",
    "Connection refused",
    "timed out",
    "No route to host",
    "Network is unreachable",
    "Connection closed by UNKNOWN",
)


def classify(python: str, returncode: int, stderr: str) -> Exception:
    """ssh's exit status and stderr → the one-line error and its exit code."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith("@@@@")]

    def line_with(needles: Iterable[str]) -> str | None:
        """The first line holding the first needle that occurs at all: needles go best first."""
        return next((line for needle in needles for line in lines if needle in line), None)

    last = lines[-1] if lines else ""
    if returncode == 255:
        found = line_with(_HOST_KEY)
        if found:
            return UnknownHostKey(
                f"the server's host key is unknown or has changed ({found.rstrip('.')}); "
                "check it, then add it to known_hosts (e.g. by running `ssh HOST true` once)"
            )
        found = line_with(_AUTH)
        if found:
            return SshAuthFailed(
                f"ssh authentication failed ({found.rstrip('.')}); `ssh HOST true` must work without a prompt: "
                "load the key into your agent or name it with IdentityFile"
            )
        found = line_with(_UNREACHABLE)
        if found:
            return HostUnreachable(f"cannot reach the server ({found.rstrip('.')})")
        why = last.rstrip(".") if last else "ssh exited with 255 and no message"
        return ConnectionLost(
            f"the ssh connection failed or was cut ({why}); the tree is either as it was or fully written: "
            "`dynspec remote status` tells which"
        )
    if returncode < 0:
        return ConnectionLost(
            f"ssh was stopped by signal {-returncode}; the tree is either as it was or fully written: "
            "`dynspec remote status` tells which"
        )
    if returncode in (126, 127):
        return RemotePythonMissing(
            f"cannot run {python} on the server ({last or f'exit {returncode}'}); "
            "pass --python with the path of a python3 >= 3.9"
        )
    if returncode == TOO_OLD and last.startswith("dynspec: "):
        return RemotePythonMissing(f"{last[len('dynspec: ') :]}; pass --python with the path of one that is")
    return RemoteCrash(stderr or f"exit status {returncode}")


class Connection:
    """One ssh process running the applier; JSON lines both ways."""

    def __init__(self, ssh: Ssh, host: str) -> None:
        self.ssh, self.host = ssh, host
        self.process = subprocess.Popen(
            ssh.argv(host), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self._stderr = bytearray()
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()
        code = program()
        self._write(str(len(code)).encode() + b"\n" + code)

    def _read_stderr(self) -> None:
        stream = self.process.stderr
        assert isinstance(stream, io.BufferedReader)  # Popen(stderr=PIPE), unbuffered=False
        for chunk in iter(lambda: stream.read1(65536), b""):
            self._stderr += chunk

    def _write(self, data: bytes, midway: Callable[[], None] | None = None) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        try:
            if midway is None:
                stdin.write(data)
            else:  # a test cuts the connection with half of the message sent
                stdin.write(data[: len(data) // 2])
                stdin.flush()
                midway()
                stdin.write(data[len(data) // 2 :])
            stdin.flush()
        except (BrokenPipeError, ConnectionResetError, ValueError):
            raise self.failure() from None

    def send(self, message: dict[str, Any], midway: Callable[[], None] | None = None) -> None:
        self._write(json.dumps(message, separators=(",", ":")).encode() + b"\n", midway)

    def receive(self) -> dict[str, Any]:
        """The applier's next message; its errors and a broken connection are raised."""
        stdout: IO[bytes] | None = self.process.stdout
        assert stdout is not None
        while True:
            line = stdout.readline()
            if not line.endswith(b"\n"):
                raise self.failure()
            if line.startswith(MARK):
                break  # anything else is a login script talking; ignore it
        message: dict[str, Any] = json.loads(line[len(MARK) :])
        if "error" in message:
            raise remote_error(message["error"])
        return message

    def failure(self) -> Exception:
        with contextlib.suppress(OSError, ValueError):
            self.process.stdin.close()  # type: ignore[union-attr]
        try:
            returncode = self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            returncode = self.process.wait()
        self._drain.join(timeout=5)
        return classify(self.ssh.python, returncode, self._stderr.decode(errors="replace"))

    def close(self) -> None:
        """End the conversation: the applier sees end of input and exits, releasing the lock."""
        with contextlib.suppress(OSError, ValueError):
            self.process.stdin.close()  # type: ignore[union-attr]
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._drain.join(timeout=5)
        for stream in (self.process.stdout, self.process.stderr):
            with contextlib.suppress(OSError):
                stream.close()  # type: ignore[union-attr]


def remote_error(error: dict[str, Any]) -> Exception:
    kind, message = error.get("kind"), str(error.get("message"))
    if kind == "not_a_tree":
        return NotAnSGLangTree(error["path"], error["why"])
    if kind == "usage":
        return UsageError(message)
    if kind in ("refused", "mismatch"):
        return Refused(message)
    if kind == "damaged":
        return DamagedState(f"{message}; {txn.damaged_way_out(str(error.get('state_dir', txn.STATE_DIR)), None)}")
    if kind == "interrupted":
        return Interrupted(message)
    return RemoteCrash(message)


# -- the snapshot as a tree ----------------------------------------------------------------------


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


class SnapshotTree(txn.Tree):
    """A server's files as the applier sent them, behind ``txn.Tree``'s read interface."""

    def __init__(
        self,
        package_dir: str,
        state_dir: str,
        files: dict[str, bytes | None],
        blobs: dict[str, bytes],
        state: dict[str, Any] | None,
    ) -> None:
        self.root, self.state_dir = package_dir, state_dir
        self._files, self._blobs, self._state = files, blobs, state

    @classmethod
    def from_snapshot(cls, snap: dict[str, Any]) -> SnapshotTree:
        problem = None if snap["state"] is None else txn.state_problem(snap["state"])
        if problem:
            raise txn.DamagedState(f"{snap['state_dir']}/state.json is damaged: {problem}")
        files = {rel: _unb64(data) for rel, data in snap["files"].items()}
        blobs = {digest: base64.b64decode(data) for digest, data in snap["blobs"].items()}
        return cls(snap["package_dir"], snap["state_dir"], files, blobs, snap["state"])

    def read(self, rel: str) -> bytes | None:
        return self._files[rel]  # KeyError: the applier was not asked for it, a bug

    def blob(self, digest: str) -> bytes:
        data = self._blobs.get(digest)
        if data is None or txn.sha256(data) != digest:
            raise txn.TxnError(f"pre-image {digest[:12]} is missing or damaged in {self.state_dir}/blobs")
        return data

    def load_state(self) -> dict[str, Any] | None:
        return self._state

    def commit(self, writes: Any, state: Any) -> None:
        raise TypeError("a snapshot is read-only; the applier on the server writes")


@dataclass
class RemoteTree:
    """What ``Session`` is for a local tree, built from a snapshot: files, version, display paths."""

    host: str
    files: SnapshotTree
    recipe: Recipe
    version: str
    package_dir: PurePosixPath
    diff_root: PurePosixPath
    python: str
    journal: bool
    notes: list[str] = field(default_factory=list)
    override: str | None = None  # as Session.override

    def display_path(self, target: str) -> str:
        return (self.package_dir / target).relative_to(self.diff_root).as_posix()


def open_snapshot(
    host: str, snap: dict[str, Any], recipe: Recipe, force: bool, sglang_version: str | None
) -> RemoteTree:
    """Session.open's rules: version from the files (then git describe), recipe range, diff root."""
    package_dir = PurePosixPath(snap["package_dir"])
    git = snap["git"]
    chosen = choose_version(snap["versions"], sglang_version, git.get("describe"), str(package_dir))
    version, notes = chosen.version, chosen.notes
    forced = recipe.refuse_unsupported(version, force)
    if forced:
        notes.append(forced)
    top = git.get("toplevel")
    inside = top is not None and (package_dir == PurePosixPath(top) or PurePosixPath(top) in package_dir.parents)
    diff_root = PurePosixPath(top) if inside else PurePosixPath(snap["root"])
    try:
        files = SnapshotTree.from_snapshot(snap)
    except txn.DamagedState as error:
        raise DamagedState(f"{error}; {txn.damaged_way_out(snap['state_dir'], version)}") from None
    return RemoteTree(
        host,
        files,
        recipe,
        version,
        package_dir,
        diff_root,
        snap["python"],
        snap["journal"],
        notes,
        chosen.override,
    )


# -- one command on one host ---------------------------------------------------------------------

OPS = ("status", "diff", "apply", "revert")
_ENGINE = threading.Lock()  # planning is CPU-bound; one host at a time keeps the in-memory parse cache simple


@dataclass
class HostResult:
    host: str
    op: str
    tree: RemoteTree | None = None
    notes: list[str] = field(default_factory=list)
    said: list[str] = field(default_factory=list)
    diff: str = ""
    report: list[engine.PatchStatus] | None = None
    written: list[str] = field(default_factory=list)
    pending: bool = False  # diff/apply --check: something to write
    error: BaseException | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def version(self) -> str | None:
        return self.tree.version if self.tree else None


Hook = Callable[[str, Connection], None]


def run(
    op: str,
    host: str,
    ssh: Ssh,
    sglang: str,
    recipe: Recipe,
    *,
    force: bool = False,
    sglang_version: str | None = None,
    _hook: Hook | None = None,
    _pause: dict[str, Any] | None = None,
) -> HostResult:
    """Run ``op`` on ``host``; errors are raised. ``_hook`` and ``_pause`` are for tests only:
    ``_hook("snapshot", conn)`` runs before the plan is sent, ``_hook("midway", conn)`` with half
    of it sent; ``_pause`` makes the applier wait between two file replaces."""
    assert op in OPS
    result = HostResult(host, op)
    start = time.perf_counter()
    conn = Connection(ssh, host)
    try:
        targets = sorted(targets_in_order(recipe.patches))
        with progress.step("connecting over ssh, reading the tree"):
            conn.send(
                {
                    "protocol": applier.PROTOCOL,
                    "sglang": sglang,
                    "targets": targets,
                    "write": op in ("apply", "revert"),
                    "pause": _pause,
                }
            )
            first = conn.receive()
        result.timings["connect and read"] = time.perf_counter() - start
        if first.get("recovered"):
            result.notes.append(first["recovered"])
        planned = time.perf_counter()
        with _ENGINE:
            tree = open_snapshot(host, first["snapshot"], recipe, force or op in ("status", "revert"), sglang_version)
            result.tree = tree
            result.notes.extend(tree.notes)
            try:
                message = _plan(op, tree, result, force)
            except AnchorNotFound as error:
                raise error.with_note(tree.override) if tree.override else error from None
        result.timings["plan"] = time.perf_counter() - planned
        if op in ("apply", "revert"):
            written = time.perf_counter()
            if _hook:
                _hook("snapshot", conn)
            with progress.step("writing over ssh"):
                conn.send(message, midway=(lambda: _hook("midway", conn)) if _hook else None)
                if message["writes"] is not None:
                    conn.receive()
            if message["writes"] is not None:
                _report_written(op, tree, result)
            result.timings["write"] = time.perf_counter() - written
    except txn.TxnError as error:
        raise Refused(str(error)) from None
    finally:
        conn.close()
    result.timings["total"] = time.perf_counter() - start
    return result


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _plan(op: str, tree: RemoteTree, result: HostResult, force: bool) -> dict[str, Any]:
    """Do the engine's part of ``op``; for apply/revert return the message for the applier."""
    files, state = tree.files, tree.files.load_state()
    if op == "status":
        if tree.journal:
            result.notes.append(applier.INTERRUPTED_NOTE)
        result.report = engine.status(files, tree.recipe, tree.version, state)
        return {}
    if op == "diff":
        plan = engine.plan(files, tree.recipe, tree.version, state, force)
        result.diff = "".join(engine.unified_diff(tree.display_path(f.target), f.disk, f.new) for f in plan.pending)
        result.pending = bool(plan.pending)
        return {}
    if op == "apply":
        plan = engine.plan(files, tree.recipe, tree.version, state, force)
        result.notes.extend(plan.notes)
        if not plan.pending:
            result.said.append(f"already applied: nothing to do for SGLang {tree.version}")
            return {"writes": None}
        writes = engine.writes_for(plan)
        new_state: dict[str, Any] | None = engine.new_state(state, tree.recipe, plan)
    else:
        if state is None:
            result.said.append("nothing to revert: dynspec has not patched this tree")
            return {"writes": None}
        writes = engine.revert_writes(files, state, force)
        new_state = None
    result.written = list(writes)
    return {
        "writes": {rel: _b64(data) for rel, data in writes.items()},
        "expect": {rel: txn.sha256(files.read(rel)) for rel in writes},
        "state": new_state,
    }


def _report_written(op: str, tree: RemoteTree, result: HostResult) -> None:
    """The lines `dynspec apply` / `revert` print for a local tree."""
    if op == "apply":
        for target in result.written:
            result.said.append(f"patched {tree.display_path(target)}")
        result.said.append(
            f"{len(result.written)} file(s) patched for SGLang {tree.version}; state in {tree.files.state_dir}"
        )
    else:
        for target in sorted(result.written):
            result.said.append(f"restored {tree.display_path(target)}")
        result.said.append(f"{len(result.written)} file(s) restored")


def run_many(
    op: str, hosts: list[str], ssh: Ssh, sglang: str, recipe: Recipe, *, jobs: int = 8, **options: Any
) -> list[HostResult]:
    """``run`` on every host, ``jobs`` at a time; a host's error is kept in its result, in host order."""

    def one(host: str) -> HostResult:
        try:
            with progress.step(host):
                return run(op, host, ssh, sglang, recipe, **options)
        except Exception as error:  # noqa: BLE001 - reported per host; bugs keep their traceback
            return HostResult(host, op, error=error)

    if len(hosts) == 1:
        return [one(hosts[0])]
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(hosts)))) as pool:
        return list(pool.map(one, hosts))


def exit_code(error: BaseException) -> int:
    return int(error.exit_code) if isinstance(error, DynspecError) else int(ExitCode.INTERNAL)
