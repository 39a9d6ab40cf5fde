"""`dynspec remote` and `dynspec bundle` against a real OpenSSH server on 127.0.0.1.

The fixture starts ``sshd`` on a free loopback port with a temporary host key and one authorized
temporary client key; every ssh call goes through a temporary ssh_config (``-F``) with its own
known_hosts, so the user's ~/.ssh is never read or written. The "server" runs the system python3,
which has none of dynspec's dependencies: what runs there is the shipped stdlib-only applier.
Trees are real SGLang releases from PyPI.
"""

from __future__ import annotations

import ast
import getpass
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from patcher import remote, txn
from patcher.errors import ConnectionLost, ExitCode, Refused, RemotePythonMissing
from patcher.registry import load_recipe
from patcher.remote import bundle
from patches.server_args_dynspec_check import ServerArgsDynspecCheck
from tests.conftest import ROOT, snapshot, targets
from tests.terminal import Tmux, fixed_length_dir, needs_tmux, same_place
from tests.test_terminal import check_screen

VERSION = "0.5.23"  # two targets: srt/server_args.py and srt/arg_groups/fields/spec.py
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
HAVE_SSH = Path(SSHD).exists() and shutil.which("ssh") and shutil.which("ssh-keygen") and shutil.which("scp")
# Skipped on a machine without OpenSSH, never in CI: .ci/run installs it, and a missing sshd there must fail.
pytestmark = pytest.mark.skipif(
    not HAVE_SSH and not os.environ.get("CI"), reason="needs openssh-server and openssh-client (.ci/run installs them)"
)

# The CLI as a user runs it; remote and bundle are registered the way patcher/cli.py does.
CLI = (
    "import sys; from patcher.cli import main, run; from patcher.remote.command import bundle, remote; "
    "main.add_command(remote); main.add_command(bundle); sys.argv[0] = 'dynspec'; run()"
)


def dynspec(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CLI, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1"},
        timeout=120,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    config: Path  # ssh -F
    dir: Path
    process: subprocess.Popen[bytes]

    def ssh(self, host: str, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ssh", "-F", str(self.config), host, command], capture_output=True, text=True, timeout=60
        )

    def remote(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`dynspec remote CMD HOST ...` with the test's ssh config."""
        return dynspec("remote", *args, "-F", str(self.config))


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dynspec-test", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    d = tmp_path_factory.mktemp("sshd")
    host_key = keygen(d / "host_key")
    (d / "authorized_keys").write_text(keygen(d / "client_key"))
    keygen(d / "stranger_key")  # a key the server does not know
    other_host_key = keygen(d / "other_host_key")
    port, closed = free_port(), free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n"
        f"AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nUsePAM no\nPermitRootLogin yes\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\nUseDNS no\n"
        "PrintMotd no\nPrintLastLog no\nSubsystem sftp internal-sftp\nMaxStartups 50\nLogLevel VERBOSE\n"
    )
    hostkey = " ".join(host_key.split()[:2])
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {hostkey}\n")
    (d / "known_hosts_other").write_text(f"[127.0.0.1]:{port} {' '.join(other_host_key.split()[:2])}\n")
    (d / "known_hosts_empty").write_text("")
    common = (
        f"  HostName 127.0.0.1\n  Port {port}\n  User {getpass.getuser()}\n  IdentitiesOnly yes\n  IdentityAgent none\n"
        "  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n  LogLevel ERROR\n"
    )
    (d / "ssh_config").write_text(
        f"Host good good2\n{common}  IdentityFile {d}/client_key\n  UserKnownHostsFile {d}/known_hosts\n"
        f"Host stranger\n{common}  IdentityFile {d}/stranger_key\n  UserKnownHostsFile {d}/known_hosts\n"
        f"Host unknown-hostkey\n{common}  IdentityFile {d}/client_key\n  UserKnownHostsFile {d}/known_hosts_empty\n"
        f"Host changed-hostkey\n{common}  IdentityFile {d}/client_key\n  UserKnownHostsFile {d}/known_hosts_other\n"
        f"Host closed\n  HostName 127.0.0.1\n  Port {closed}\n  UserKnownHostsFile {d}/known_hosts\n"
    )
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation dir
    with open(d / "sshd.log", "wb") as log:
        process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"sshd did not start: {(d / 'sshd.log').read_text()}") from None
                time.sleep(0.05)
        yield Server(d / "ssh_config", d, process)
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def tree(release_tree) -> Path:
    return release_tree(VERSION)


@pytest.fixture
def patched_twin(release_tree, tmp_path: Path) -> Path:
    """The same release, patched by a local `dynspec apply`: what the remote one must equal."""
    package = release_tree(VERSION, where=tmp_path / "twin")
    done = dynspec("apply", "--sglang", str(package))
    assert done.returncode == 0, done.stderr
    (tmp_path / "twin-apply.stderr").write_text(done.stderr)
    return package


def local_apply_said(twin: Path, tree: Path) -> str:
    """What the local `dynspec apply` of the twin printed, as it reads for ``tree``."""
    return (twin.parent.parent / "twin-apply.stderr").read_text().replace(str(twin), str(tree))


def same_files(a: Path, b: Path) -> None:
    """Byte-equal trees; state.json equal but for the transaction id."""
    sa, sb = snapshot(a), snapshot(b)
    state = ".dynspec/state.json"
    assert {k: v for k, v in sa.items() if k != state} == {k: v for k, v in sb.items() if k != state}
    if state in sa or state in sb:
        load = lambda p: {k: v for k, v in json.loads((p / state).read_text()).items() if k != "txid"}  # noqa: E731
        assert load(a) == load(b)


def one_line_error(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("dynspec: error: "), stderr
    return lines[0]


# -- the round trip ------------------------------------------------------------------------------


def test_apply_status_reapply_revert_over_ssh_is_byte_exact(server: Server, tree: Path, patched_twin: Path) -> None:
    before = snapshot(tree)
    local_diff = dynspec("diff", "--sglang", str(tree))
    diff = server.remote("diff", "good", "--sglang", str(tree))
    assert diff.returncode == 0, diff.stderr
    assert diff.stdout == local_diff.stdout and diff.stdout.startswith("diff --git")
    assert server.remote("diff", "good", "--check", "--sglang", str(tree)).returncode == 1
    assert snapshot(tree) == before, "diff writes nothing"

    applied = server.remote("apply", "good", "--sglang", str(tree))
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout == ""
    assert applied.stderr == local_apply_said(patched_twin, tree), "the same lines as a local apply"
    assert "patched srt/server_args.py\npatched srt/arg_groups/fields/spec.py\n" in applied.stderr
    same_files(tree, patched_twin)

    remote_status = server.remote("status", "good", "--sglang", str(tree))
    local_status = dynspec("status", "--sglang", str(tree))
    assert remote_status.returncode == local_status.returncode == 0
    assert remote_status.stdout == local_status.stdout, "a local status on the server agrees"
    assert re.search(r"\bapplied  r[0-9]+\b", remote_status.stdout)
    remote_json = json.loads(server.remote("status", "good", "--json", "--sglang", str(tree)).stdout)
    assert remote_json.pop("host") == "good"
    assert remote_json == json.loads(dynspec("status", "--json", "--sglang", str(tree)).stdout)
    assert server.remote("status", "good", "--check", "--sglang", str(tree)).returncode == 0

    patched = snapshot(tree)
    again = server.remote("apply", "good", "--sglang", str(tree))
    assert again.returncode == 0 and again.stderr == f"already applied: nothing to do for SGLang {VERSION}\n"
    assert snapshot(tree) == patched

    reverted = server.remote("revert", "good", "--sglang", str(tree))
    assert reverted.returncode == 0, reverted.stderr
    assert "restored srt/server_args.py" in reverted.stderr
    assert snapshot(tree) == before
    assert not (tree / ".dynspec").exists()
    nothing = server.remote("revert", "good", "--sglang", str(tree))
    assert nothing.returncode == 0 and "nothing to revert" in nothing.stderr


def test_remote_apply_then_local_revert_and_back(server: Server, tree: Path) -> None:
    # Same state dir both ways: what one side wrote, the other reads.
    before = snapshot(tree)
    assert server.remote("apply", "good", "--sglang", str(tree.parent)).returncode == 0
    assert dynspec("revert", "--sglang", str(tree)).returncode == 0
    assert snapshot(tree) == before
    assert dynspec("apply", "--sglang", str(tree)).returncode == 0
    done = server.remote("revert", "good", "--sglang", str(tree))
    assert done.returncode == 0, done.stderr
    assert snapshot(tree) == before


def test_several_hosts_get_a_summary_and_the_first_failure_code(server: Server, tree: Path, patched_twin: Path) -> None:
    done = server.remote("apply", "good", "closed", "stranger", "--sglang", str(tree))
    assert done.returncode == ExitCode.UNREACHABLE, done.stderr
    same_files(tree, patched_twin)
    rows = [
        line.split()[:2]
        for line in done.stderr.splitlines()
        if line.split()[:1] in (["good"], ["closed"], ["stranger"])
    ]
    assert rows == [["good", VERSION], ["closed", "?"], ["stranger", "?"]]
    assert "good: patched srt/server_args.py" in done.stderr
    assert "dynspec: error: closed: cannot reach the server" in done.stderr
    assert "dynspec: error: stranger: ssh authentication failed" in done.stderr
    status = server.remote("status", "good", "good2", "--sglang", str(tree))
    assert status.returncode == 0
    applied = [
        line
        for line in status.stdout.splitlines()
        if line.split()[:3] == ["server_args_dynspec_check", f"r{ServerArgsDynspecCheck.REVISION}", "applied"]
    ]
    assert len(applied) == 2
    assert "# good2: SGLang" in status.stdout


# -- one clear line and a distinct exit code per failure ---------------------------------------


@pytest.mark.parametrize(
    ("host", "extra", "code", "message"),
    [
        ("closed", [], ExitCode.UNREACHABLE, "closed: cannot reach the server (ssh: connect to host 127.0.0.1 port"),
        (
            "nosuchhost.invalid",
            [],
            ExitCode.UNREACHABLE,
            "nosuchhost.invalid: cannot reach the server (ssh: Could not resolve hostname",
        ),
        ("stranger", [], ExitCode.AUTH, "stranger: ssh authentication failed"),
        ("unknown-hostkey", [], ExitCode.HOST_KEY, "unknown-hostkey: the server's host key is unknown or has changed"),
        ("changed-hostkey", [], ExitCode.HOST_KEY, "changed-hostkey: the server's host key is unknown or has changed"),
        (
            "good",
            ["--python", "/nonexistent/python3"],
            ExitCode.REMOTE_PYTHON,
            "good: cannot run /nonexistent/python3 on the server",
        ),
        (
            "good",
            ["--sglang", "/nonexistent"],
            ExitCode.USAGE,
            "good: /nonexistent is not an SGLang tree: no such directory",
        ),
    ],
    ids=[
        "port-closed",
        "unknown-name",
        "unauthorized-key",
        "unknown-host-key",
        "changed-host-key",
        "no-python",
        "wrong-path",
    ],
)
def test_failures_are_one_line_with_their_exit_code(
    server: Server, tree: Path, host: str, extra: list[str], code: int, message: str
) -> None:
    before = snapshot(tree)
    args = ["--sglang", str(tree), *extra]
    for command in ("apply", "status"):
        done = server.remote(command, host, *args)
        assert done.returncode == code, done.stderr
        assert one_line_error(done.stderr).startswith(f"dynspec: error: {message}")
    assert snapshot(tree) == before


def test_not_an_sglang_tree_says_what_local_says(server: Server, release_tree, tmp_path: Path) -> None:
    fifo = release_tree(VERSION, where=tmp_path / "fifo")
    (fifo / "srt" / "server_args.py").unlink()
    os.mkfifo(fifo / "srt" / "server_args.py")
    for path, why in [(tmp_path, "expected python/sglang/srt"), (fifo, "srt/server_args.py is not a regular file")]:
        done = server.remote("apply", "good", "--sglang", str(path))
        local = dynspec("apply", "--sglang", str(path))
        assert done.returncode == local.returncode == ExitCode.USAGE
        assert one_line_error(done.stderr) == one_line_error(local.stderr).replace("error: ", "error: good: ", 1)
        assert why in one_line_error(done.stderr)


def test_the_servers_version_sources_read_as_local_ones(server: Server, tree: Path) -> None:
    """The applier reads the versions on the server with the local rules: a disagreeing dist-info
    is the same note, and without version files the dist-info is the version."""
    other = tree.parent / "sglang-0.5.22.dist-info"
    other.mkdir()
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.22\n")
    remote_status = server.remote("status", "good", "--sglang", str(tree))
    local_status = dynspec("status", "--sglang", str(tree))
    assert remote_status.returncode == local_status.returncode == 0, remote_status.stderr
    note = "version sources disagree: _version.py says 0.5.23, sglang-0.5.22.dist-info says 0.5.22"
    assert note in local_status.stderr and note in remote_status.stderr
    (tree / "_version.py").unlink()
    (tree / "version.py").unlink()
    remote_json = json.loads(server.remote("status", "good", "--json", "--sglang", str(tree)).stdout)
    local_json = json.loads(dynspec("status", "--json", "--sglang", str(tree)).stdout)
    assert remote_json["sglang_version"] == local_json["sglang_version"] == "0.5.22"


def test_sglang_auto_is_what_the_servers_python_imports(server: Server, tree: Path, tmp_path: Path) -> None:
    python = tmp_path / "python-with-sglang"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={tree.parent} exec python3 "$@"\n')
    python.chmod(0o755)
    done = server.remote("status", "good", "--json", "--python", str(python))  # --sglang defaults to auto
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["package_dir"] == str(tree)
    bare = server.remote("status", "good")
    assert bare.returncode == ExitCode.USAGE
    assert (
        one_line_error(bare.stderr)
        == "dynspec: error: good: --sglang auto: no 'sglang' package is importable by this Python"
    )


def test_a_release_outside_the_recipe_is_refused_alike_local_remote_and_bundle(
    server: Server, tree: Path, tmp_path: Path
) -> None:
    """``Recipe.refuse_unsupported``: one line and exit 4 from all three; --force goes ahead with a note."""
    (tree / "_version.py").write_text("__version__ = version = '0.5.99'\n")
    before = snapshot(tree)
    local = dynspec("diff", "--sglang", str(tree))
    remote_diff = server.remote("diff", "good", "--sglang", str(tree))
    bundled = dynspec("bundle", "--from", str(tree), "-o", str(tmp_path / "plan.pyz"))
    assert local.returncode == remote_diff.returncode == bundled.returncode == ExitCode.REFUSED
    line = (
        f"dynspec: error: SGLang 0.5.99 is not a release recipe 'default' supports ({load_recipe('default').sglang}); "
        "--force tries anyway"
    )
    assert one_line_error(local.stderr) == one_line_error(bundled.stderr) == line
    assert one_line_error(remote_diff.stderr) == line.replace("error: ", "error: good: ", 1)
    forced = server.remote("diff", "good", "--force", "--sglang", str(tree))
    assert forced.returncode == 0 and forced.stdout.startswith("diff --git"), forced.stderr
    assert "supports" in forced.stderr and "going ahead because of --force" in forced.stderr
    assert snapshot(tree) == before and not (tmp_path / "plan.pyz").exists()


def test_refusals_on_the_server_write_nothing(server: Server, tree: Path) -> None:
    assert server.remote("apply", "good", "--sglang", str(tree)).returncode == 0
    target = tree / "srt" / "server_args.py"
    target.write_text(target.read_text() + "# edited on the server\n")
    before = snapshot(tree)
    for command in ("apply", "revert"):
        done = server.remote(command, "good", "--sglang", str(tree))
        assert done.returncode == ExitCode.REFUSED
        assert "srt/server_args.py changed after dynspec patched it" in one_line_error(done.stderr)
    assert snapshot(tree) == before
    with txn.Tree(str(tree)).locked():
        locked = server.remote("revert", "good", "--force", "--sglang", str(tree))
    assert locked.returncode == ExitCode.REFUSED and "another dynspec is working on" in locked.stderr
    assert server.remote("revert", "good", "--force", "--sglang", str(tree)).returncode == 0


def test_help_documents_the_exit_codes() -> None:
    done = dynspec("remote", "--help")
    assert done.returncode == 0
    for line in (
        "5    ssh authentication failed",
        "6    the server's host key",
        "7    the server cannot be reached",
        "8    no python3",
        "9    the connection broke",
    ):
        assert line in done.stdout


# -- interrupted connections and killed appliers ---------------------------------------------------


def ssh_for(server: Server, **kwargs: object) -> remote.Ssh:
    return remote.Ssh(config=str(server.config), **kwargs)  # type: ignore[arg-type]


def run_apply(server: Server, tree: Path, **kwargs: object) -> dict[str, object]:
    box: dict[str, object] = {}
    try:
        box["result"] = remote.run("apply", "good", ssh_for(server), str(tree), load_recipe("default"), **kwargs)  # type: ignore[arg-type]
    except Exception as error:  # noqa: BLE001 - the test inspects it
        box["error"] = error
    return box


@pytest.mark.parametrize("when", ["snapshot", "midway"])
def test_connection_cut_before_the_plan_has_arrived_writes_nothing(server: Server, tree: Path, when: str) -> None:
    before = snapshot(tree)

    def cut(event: str, conn: remote.Connection) -> None:
        if event == when:
            conn.process.kill()
            conn.process.wait()

    box = run_apply(server, tree, _hook=cut)
    assert isinstance(box.get("error"), ConnectionLost), box
    assert "the tree is either as it was or fully written" in str(box["error"])
    time.sleep(0.3)  # the applier sees end of input and exits
    assert snapshot(tree) == before
    assert server.remote("apply", "good", "--sglang", str(tree)).returncode == 0, "the lock was released"


def test_a_file_edited_between_read_and_write_is_refused_by_name_and_hash(server: Server, tree: Path) -> None:
    target = tree / "srt" / "server_args.py"

    def edit(event: str, conn: remote.Connection) -> None:
        if event == "snapshot":  # the plan is made; someone edits the file before it arrives
            target.write_text(target.read_text() + "# edited meanwhile\n")

    box = run_apply(server, tree, _hook=edit)
    edited = snapshot(tree)
    error = box.get("error")
    assert isinstance(error, Refused), box
    digest = txn.sha256(target.read_bytes())
    assert str(error).startswith("srt/server_args.py is not the file dynspec planned for: expected sha256 ")
    assert f"found {digest}; nothing written" in str(error)
    assert snapshot(tree) == edited and not (tree / ".dynspec").exists()


def wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def wait_gone(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text(errors="replace"):
        assert time.monotonic() < deadline, f"process {pid} did not exit"
        time.sleep(0.01)


def paused_apply(server: Server, tree: Path, tmp_path: Path) -> tuple[threading.Thread, dict[str, object], int, Path]:
    """Start a remote apply that stops between the first and second file replace."""
    tmp_path.mkdir(exist_ok=True)
    pause = tmp_path / "pause"
    box: dict[str, object] = {}

    def keep(event: str, conn: remote.Connection) -> None:
        box["conn"] = conn

    worker = threading.Thread(
        target=lambda: box.update(run_apply(server, tree, _hook=keep, _pause={"file": str(pause), "after": 1}))
    )
    worker.start()
    wait_for(Path(f"{pause}.paused"))
    pid = int(Path(f"{pause}.paused").read_text())
    return worker, box, pid, pause


def test_connection_cut_mid_write_still_leaves_the_new_files(
    server: Server, tree: Path, patched_twin: Path, tmp_path: Path
) -> None:
    worker, box, pid, pause = paused_apply(server, tree, tmp_path)
    assert (tree / ".dynspec" / "journal.json").exists(), "paused between two renames"
    conn = box["conn"]
    assert isinstance(conn, remote.Connection)
    conn.process.kill()  # the ssh connection dies while the server is writing
    worker.join(timeout=60)
    assert isinstance(box.get("error"), ConnectionLost), box
    Path(f"{pause}.go").touch()
    wait_gone(pid)
    same_files(tree, patched_twin)  # the applier held SIGHUP/SIGPIPE back and finished
    assert not (tree / ".dynspec" / "journal.json").exists()
    status = server.remote("status", "good", "--check", "--sglang", str(tree))
    assert status.returncode == 0 and "note" not in status.stderr


def test_killed_applier_is_rolled_back_by_the_next_run(
    server: Server, tree: Path, patched_twin: Path, tmp_path: Path
) -> None:
    before = snapshot(tree)
    worker, box, pid, _ = paused_apply(server, tree, tmp_path)
    os.kill(pid, signal.SIGKILL)  # the server side dies between the two renames
    worker.join(timeout=60)
    assert isinstance(box.get("error"), ConnectionLost), box

    status = server.remote("status", "good", "--sglang", str(tree))
    assert "note: an interrupted dynspec write is pending" in status.stderr
    local = dynspec("status", "--sglang", str(tree))
    assert "note: an interrupted dynspec write is pending" in local.stderr

    reverted = server.remote("revert", "good", "--sglang", str(tree))
    assert reverted.returncode == 0, reverted.stderr
    assert "its partial write was rolled back" in reverted.stderr
    assert snapshot(tree) == before, "rolled back to the old files, byte for byte"

    worker, box, pid, _ = paused_apply(server, tree, tmp_path / "again")
    os.kill(pid, signal.SIGKILL)
    worker.join(timeout=60)
    applied = server.remote("apply", "good", "--sglang", str(tree))
    assert applied.returncode == 0, applied.stderr
    assert applied.stderr.startswith(
        "note: an earlier dynspec run was interrupted; its partial write was rolled back\n"
    )
    assert applied.stderr.endswith(local_apply_said(patched_twin, tree))
    same_files(tree, patched_twin)


def test_full_disk_on_the_server_leaves_the_old_files(
    server: Server, tree: Path, patched_twin: Path, tmp_path: Path
) -> None:
    # A python whose file size limit lets every pre-image be saved but not the largest patched
    # file: the kernel answers EFBIG where a full disk answers ENOSPC, midway through the write.
    written = json.loads((patched_twin / ".dynspec" / "state.json").read_text())["files"]
    limit = max((tree / target).stat().st_size for target, entry in written.items() if entry["pre"])
    assert any((patched_twin / target).stat().st_size > limit for target in written)
    limited = tmp_path / "limited-python"
    limited.write_text(
        "#!/usr/bin/env python3\n"
        "import os, resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
        "os.execvp('python3', ['python3', *sys.argv[1:]])\n"
    )
    limited.chmod(0o755)
    before = snapshot(tree)
    done = server.remote("apply", "good", "--python", str(limited), "--sglang", str(tree))
    assert done.returncode == ExitCode.REFUSED, done.stderr
    assert "writing failed (File too large); every file was left as it was" in one_line_error(done.stderr)
    assert snapshot(tree) == before
    assert not (tree / ".dynspec").exists()


# -- the bundle ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plan_pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "dynspec-plan.pyz"
    done = dynspec("bundle", "--sglang-version", VERSION, "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "srt/server_args.py: expects sha256 " in done.stderr
    return out


def test_bundle_round_trip_over_scp_and_ssh(
    server: Server, plan_pyz: Path, tree: Path, patched_twin: Path, tmp_path: Path
) -> None:
    drop = tmp_path / "home"
    drop.mkdir()
    copied = subprocess.run(
        ["scp", "-q", "-F", str(server.config), str(plan_pyz), f"good:{drop}/"], capture_output=True, text=True
    )
    assert copied.returncode == 0, copied.stderr
    before = snapshot(tree)

    def pyz(*args: str) -> subprocess.CompletedProcess[str]:
        return server.ssh("good", f"python3 {drop}/dynspec-plan.pyz {' '.join(args)} --sglang {tree}")

    diff = pyz("diff")
    assert diff.returncode == 0 and diff.stdout == dynspec("diff", "--sglang", str(tree)).stdout
    pristine_status = pyz("status")
    assert pristine_status.stdout == dynspec("status", "--sglang", str(tree)).stdout
    assert pyz("status", "--check").returncode == 1
    applied = pyz("apply")
    assert applied.returncode == 0, applied.stderr
    assert applied.stderr == local_apply_said(patched_twin, tree)
    same_files(tree, patched_twin)
    status = pyz("status")
    assert status.returncode == 0 and status.stdout == dynspec("status", "--sglang", str(tree)).stdout
    assert json.loads(pyz("status", "--json").stdout) == json.loads(
        dynspec("status", "--json", "--sglang", str(tree)).stdout
    )
    assert pyz("status", "--check").returncode == 0
    again = pyz("apply")
    assert again.returncode == 0 and "already applied" in again.stderr
    assert pyz("diff", "--check").returncode == 0
    reverted = pyz("revert")
    assert reverted.returncode == 0 and "file(s) restored" in reverted.stderr
    assert snapshot(tree) == before


def test_bundle_diff_of_a_checkout_matches_the_local_diff(plan_pyz: Path, release_tree, tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    release_tree(VERSION, where=checkout / "python")
    done = subprocess.run(["python3", str(plan_pyz), "diff", "--sglang", str(checkout)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("diff --git a/python/sglang/srt/server_args.py b/python/sglang/srt/server_args.py\n")
    assert done.stdout == dynspec("diff", "--sglang", str(checkout)).stdout


def test_bundle_refuses_other_files_naming_file_and_hash(plan_pyz: Path, release_tree) -> None:
    other = release_tree("0.5.22")
    before = snapshot(other)
    done = subprocess.run(["python3", str(plan_pyz), "apply", "--sglang", str(other)], capture_output=True, text=True)
    assert done.returncode == ExitCode.REFUSED
    line = one_line_error(done.stderr)
    plan = json.loads(zipfile.ZipFile(plan_pyz).read("plan.json"))
    assert "srt/server_args.py is not the file this plan was made for (pristine SGLang 0.5.23)" in line
    assert "expected sha256 " in line and "found " in line
    assert plan["files"]["srt/server_args.py"]["pre"] in line
    assert snapshot(other) == before
    assert not (other / ".dynspec").exists()


def test_bundle_applied_tree_is_revertible_by_dynspec_and_back(plan_pyz: Path, tree: Path) -> None:
    before = snapshot(tree)
    assert (
        subprocess.run(["python3", str(plan_pyz), "apply", "--sglang", str(tree)], capture_output=True).returncode == 0
    )
    assert dynspec("status", "--check", "--sglang", str(tree)).returncode == 0
    assert dynspec("revert", "--sglang", str(tree)).returncode == 0
    assert snapshot(tree) == before
    assert dynspec("apply", "--sglang", str(tree)).returncode == 0
    done = subprocess.run(["python3", str(plan_pyz), "revert", "--sglang", str(tree)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert snapshot(tree) == before


def test_bundle_from_fetched_files_is_the_same_file(plan_pyz: Path, release_tree, tmp_path: Path) -> None:
    fetched = tmp_path / "fetched"
    package = release_tree(VERSION)
    for target in [*targets(), "_version.py"]:
        if not (package / target).exists():
            continue  # a file dynspec adds
        (fetched / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(package / target, fetched / target)
    out = tmp_path / "from-files.pyz"
    done = dynspec("bundle", "--from", str(fetched), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == plan_pyz.read_bytes(), "reproducible: same files, same bytes"


def test_bundle_needs_a_version() -> None:
    done = dynspec("bundle", "-o", "/tmp/never.pyz")
    assert done.returncode == ExitCode.USAGE and "--sglang-version" in done.stderr


# -- what runs on servers --------------------------------------------------------------------------


def test_shipped_code_is_python_3_9_and_stdlib_only() -> None:
    shipped = {
        **remote.shipped_sources(),
        "__main__": bundle.MAIN,
        "bootstrap": remote.BOOTSTRAP,
        "program": remote.program().decode(),
    }
    for name, source in shipped.items():
        tree = ast.parse(source, filename=name, feature_version=(3, 9))
        for node in ast.walk(tree):
            if isinstance(node, ast.Match):  # pragma: no cover - the check itself
                raise AssertionError(f"{name}: match statement")
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not (isinstance(node, ast.ImportFrom) and node.level):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for module in modules:
                    top = module.split(".")[0]
                    assert top in sys.stdlib_module_names or top in (*remote.SHIPPED, "patcher"), (name, module)
    # Each shipped module imports from patcher only modules shipped before it (the order they load in).
    loaded: list[str] = []
    for name, module in remote.SHIPPED.items():
        for node in ast.walk(ast.parse(remote.shipped_sources()[name])):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("patcher"):
                assert node.module == "patcher" and {a.name for a in node.names} <= set(loaded), ast.unparse(node)
        loaded.append(module.__name__.removeprefix("patcher."))


BARE = ("-I", "-S")  # no site-packages (so no dynspec, libcst or click), nothing from the working directory


def test_the_shipped_set_runs_on_a_bare_interpreter(plan_pyz: Path, tree: Path, tmp_path: Path) -> None:
    """What `dynspec remote` pipes to a server and what `dynspec bundle` zips imports and finds a real
    tree on a Python with nothing but its standard library: this one and, where there is one, 3.9."""
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    for name, source in remote.shipped_sources().items():
        (shipped / f"{name}.py").write_text(source)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import dynspec_applier; "
        "assert not {'patcher', 'libcst', 'click'} & {m.split('.')[0] for m in sys.modules}; "
        "print(dynspec_applier.locate(sys.argv[2])[1])"
    )
    program = remote.program()
    for python in [p for p in (sys.executable, PY39) if p]:
        imported = subprocess.run([python, *BARE, "-c", code, shipped, tree.parent], capture_output=True, text=True)
        assert imported.returncode == 0 and imported.stdout == f"{tree}\n", (python, imported.stderr)
        # the program behind BOOTSTRAP loads the set and serves; a closed pipe ends the conversation
        piped = subprocess.run(
            [python, *BARE, "-c", remote.BOOTSTRAP], input=b"%d\n%s" % (len(program), program), capture_output=True
        )
        assert piped.returncode == 0 and piped.stderr == b"", (python, piped.stderr)
        zipped = subprocess.run([python, *BARE, plan_pyz, "status", "--json", "--sglang", tree], capture_output=True)
        assert zipped.returncode == 0 and json.loads(zipped.stdout)["package_dir"] == str(tree), (python, zipped.stderr)
    (shipped / "dynspec_treefacts.py").unlink()  # control: the set is all there is; without a module, no import
    missing = subprocess.run([sys.executable, *BARE, "-c", code, shipped, tree.parent], capture_output=True, text=True)
    assert missing.returncode == 1 and "No module named 'dynspec_treefacts'" in missing.stderr


def test_classify_too_old_python() -> None:
    error = remote.classify(
        "python3", remote.TOO_OLD, "dynspec: /usr/bin/python3 is Python 3.8; dynspec needs python3 >= 3.9\n"
    )
    assert isinstance(error, RemotePythonMissing)
    assert str(error).startswith("/usr/bin/python3 is Python 3.8; dynspec needs python3 >= 3.9")


# -- the server's python: the oldest supported one works, older ones get a clear refusal --------


def pyenv_python(version: str) -> str | None:
    """An interpreter of that version from pyenv, where this machine has one."""
    found = sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    return str(found[-1]) if found else None


PY39, PY38, PY27 = pyenv_python("3.9"), pyenv_python("3.8"), pyenv_python("2.7")


@pytest.mark.skipif(PY39 is None, reason="no python3.9 on this machine")
def test_python_3_9_on_the_server_does_the_whole_round_trip(
    server: Server, plan_pyz: Path, tree: Path, patched_twin: Path
) -> None:
    assert PY39 is not None
    before = snapshot(tree)
    applied = server.remote("apply", "good", "--python", PY39, "--sglang", str(tree), "--verbose")
    assert applied.returncode == 0, applied.stderr
    assert "(python 3.9." in applied.stderr
    same_files(tree, patched_twin)
    assert server.remote("status", "good", "--python", PY39, "--check", "--sglang", str(tree)).returncode == 0
    assert server.remote("revert", "good", "--python", PY39, "--sglang", str(tree)).returncode == 0
    assert snapshot(tree) == before

    def pyz(command: str) -> subprocess.CompletedProcess[str]:
        return server.ssh("good", f"{PY39} {plan_pyz} {command} --sglang {tree}")

    assert pyz("apply").returncode == 0
    same_files(tree, patched_twin)
    assert pyz("status").stdout == dynspec("status", "--sglang", str(tree)).stdout
    assert pyz("revert").returncode == 0
    assert snapshot(tree) == before


@pytest.mark.parametrize(
    "python",
    [p for p in (PY38, PY27) if p] or [pytest.param(None, marks=pytest.mark.skip(reason="no python < 3.9 here"))],
)
def test_too_old_python_on_the_server_is_one_clear_line(
    server: Server, plan_pyz: Path, tree: Path, python: str
) -> None:
    before = snapshot(tree)
    done = server.remote("apply", "good", "--python", python, "--sglang", str(tree))
    assert done.returncode == ExitCode.REMOTE_PYTHON
    assert "dynspec needs python3 >= 3.9; pass --python with the path of one that is" in one_line_error(done.stderr)
    bundled = server.ssh("good", f"{python} {plan_pyz} apply --sglang {tree}")
    assert bundled.returncode == ExitCode.REMOTE_PYTHON
    assert bundled.stderr.strip().endswith("this plan needs python3 >= 3.9")
    assert snapshot(tree) == before


# -- hostile trees on the server (issue 14) ------------------------------------------------------


def test_the_servers_git_config_never_runs(server: Server, release_tree, tmp_path: Path) -> None:
    """The applier asks git about the server's checkout with every program git could run switched off."""
    from tests.faults.test_git_config import armed_checkout

    marker = tmp_path / "MARKER"
    checkout = tmp_path / "sglang"
    release_tree(VERSION, where=checkout / "python")
    armed_checkout(checkout, marker)
    assert server.ssh("good", f"git -C {checkout} ls-files >/dev/null").returncode == 0
    assert marker.exists(), "the trap is armed: plain git on the server runs core.fsmonitor"
    marker.unlink()
    for command in ("status", "diff", "apply", "revert"):
        done = server.remote(command, "good", "--sglang", str(checkout))
        assert done.returncode == 0, done.stderr
        assert not marker.exists(), f"dynspec remote {command} ran {marker.read_text()}"


def test_a_damaged_state_on_the_server_is_exit_10(server: Server, tree: Path) -> None:
    assert server.remote("apply", "good", "--sglang", str(tree)).returncode == 0
    (tree / ".dynspec" / "state.json").write_text('{"format": 1, "files": []}')
    before = snapshot(tree)
    for command in ("status", "apply", "revert"):
        done = server.remote(command, "good", "--sglang", str(tree))
        assert done.returncode == 10, done.stderr
        assert "state.json is damaged" in one_line_error(done.stderr)
    assert snapshot(tree) == before


def test_a_state_dir_linking_out_is_refused_on_the_server(server: Server, tree: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside-state"
    outside.mkdir()
    (tree / ".dynspec").symlink_to(outside)
    done = server.remote("apply", "good", "--sglang", str(tree))
    assert done.returncode == 10, done.stderr
    assert "is a link to" in one_line_error(done.stderr)
    assert list(outside.iterdir()) == []


def test_a_bundle_refuses_a_target_linking_out(tree: Path, tmp_path: Path) -> None:
    plan_pyz = tmp_path / "plan.pyz"
    bundle.build(plan_pyz, VERSION)
    target = tree / "srt" / "server_args.py"
    outside = tmp_path / "server_args.py"
    target.rename(outside)
    target.symlink_to(outside)
    kept = outside.read_bytes()
    done = subprocess.run(
        [sys.executable, str(plan_pyz), "apply", "--sglang", str(tree)], capture_output=True, text=True
    )
    assert done.returncode == 4, done.stderr
    assert "is a link to" in one_line_error(done.stderr)
    assert outside.read_bytes() == kept


# -- on a terminal: the summary as a person sees it (tests/terminal.py) ------------------------


@needs_tmux
@pytest.mark.parametrize("columns", [80, 160])
def test_summary_screen(server: Server, release_tree, columns: int) -> None:
    where = fixed_length_dir()
    tmux = Tmux(columns, 40)
    try:
        tree = release_tree(VERSION, where=where / "site-packages")
        hosts = ["good", "unknown-hostkey", "changed-hostkey"]  # messages that name no user or port
        command = ["-c", CLI, "remote", "apply", *hosts, "--sglang", str(tree), "-F", str(server.config)]
        tmux.start(*command, env={"DYNSPEC_SPINNER_DELAY": "0"}, program=[sys.executable])
        assert tmux.wait_exit() == ExitCode.HOST_KEY
        screen = same_place(tmux.screen(), where).replace(str(server.dir), "SSHD")
        check_screen(f"remote-summary-{columns}", screen)
        files = len({p.TARGET for p in load_recipe("default").patches if p.applies_to(VERSION)})
        assert f"\x1b[32mpatched {files} file(s)" in tmux.colours()
    finally:
        tmux.close()
        shutil.rmtree(where, ignore_errors=True)
