"""Hostile and damaged trees and state dirs, through the real console entry point.

Each case builds one tree from real SGLang 0.5.12 and runs status, diff, apply and revert on it.
Every command either refuses in one line with a documented exit code and changes nothing, or gives
the correct result; no command exits 123, follows a link out of the tree, or writes outside it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from patcher import txn
from tests.faults.harness import KNOWN_EXIT_CODES, Run, cli, difference, forked, picture

VERSION = "0.5.12"
SERVER_ARGS = "srt/server_args.py"
WORKER = "srt/speculative/eagle_worker.py"


@dataclass
class Tree:
    package: Path
    outside: Path
    pristine: Path  # an untouched copy of the package dir

    def run(self, *args: str) -> Run:
        done = forked(cli(*args, "--sglang", str(self.package)), timeout=60)
        assert done.code != 123 and "Traceback" not in done.err, done.err
        assert done.code in KNOWN_EXIT_CODES, (done.code, done.err)
        if done.code not in (0, 1):
            errors = [line for line in done.lines if line.startswith("dynspec: error: ")]
            assert len(errors) == 1 and done.lines[-1] == errors[0], f"not one line: {done.err!r}"
        return done

    def apply(self) -> None:
        assert self.run("apply").code == 0

    def state(self) -> dict:
        return json.loads((self.package / ".dynspec" / "state.json").read_text())

    def write_state(self, state: object) -> None:
        (self.package / ".dynspec" / "state.json").write_text(json.dumps(state))


@pytest.fixture
def tree(release_tree, tmp_path: Path) -> Tree:
    package = release_tree(VERSION, where=tmp_path / "site")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.py").write_text("untouched = True\n")
    shutil.copytree(package, tmp_path / "pristine", symlinks=True)
    return Tree(package, outside, tmp_path / "pristine")


@dataclass
class Case:
    setup: Callable[[Tree], None]
    codes: dict[str, int]  # command -> exit code
    message: str = ""  # a regex every refusal's line matches
    results: set[str] = field(default_factory=set)  # commands whose exit 0 is a correct change of the tree


def link_state_dir_out(t: Tree) -> None:
    (t.outside / "state").mkdir()
    (t.package / ".dynspec").symlink_to(t.outside / "state")


def link_state_dir_out_with_a_stale_journal(t: Tree) -> None:
    t.apply()
    shutil.move(t.package / ".dynspec", t.outside / "state")
    journal = {
        "txid": "0" * 32,
        "files": {SERVER_ARGS: {"pre": "1" * 64, "post": txn.sha256((t.package / SERVER_ARGS).read_bytes())}},
    }
    (t.outside / "state" / "journal.json").write_text(json.dumps(journal))
    (t.package / ".dynspec").symlink_to(t.outside / "state")


def link_blobs_out(t: Tree) -> None:
    t.apply()
    shutil.move(t.package / ".dynspec" / "blobs", t.outside / "blobs")
    (t.package / ".dynspec" / "blobs").symlink_to(t.outside / "blobs")


def state_dir_is_a_file(t: Tree) -> None:
    (t.package / ".dynspec").write_text("not a directory\n")


def state_json_is_a_directory(t: Tree) -> None:
    (t.package / ".dynspec" / "state.json").mkdir(parents=True)


def state_json_links_out(t: Tree) -> None:
    t.apply()
    shutil.move(t.package / ".dynspec" / "state.json", t.outside / "state.json")
    (t.package / ".dynspec" / "state.json").symlink_to(t.outside / "state.json")


def edit_state(change: Callable[[dict], object]) -> Callable[[Tree], None]:
    def setup(t: Tree) -> None:
        t.apply()
        t.write_state(change(t.state()))

    return setup


def raw_state(text: str) -> Callable[[Tree], None]:
    def setup(t: Tree) -> None:
        t.apply()
        (t.package / ".dynspec" / "state.json").write_text(text)

    return setup


def first_entry(state: dict, **changes: object) -> dict:
    state["files"][SERVER_ARGS].update(changes)
    return state


def renamed_entry(state: dict, rel: str) -> dict:
    state["files"][rel] = state["files"].pop(SERVER_ARGS)
    return state


def journal(change: Callable[[dict], object]) -> Callable[[Tree], None]:
    """An applied tree with a journal of an interrupted write, then ``change`` made to it."""

    def setup(t: Tree) -> None:
        t.apply()
        digest = txn.sha256((t.package / SERVER_ARGS).read_bytes())
        record = {
            "format": 1,
            "txid": "f" * 32,
            "revert": False,
            "files": {SERVER_ARGS: {"pre": digest, "post": digest}},
        }
        (t.package / ".dynspec" / "journal.json").write_text(json.dumps(change(record)))

    return setup


def replace_target(rel: str, make: Callable[[Path, Tree], None]) -> Callable[[Tree], None]:
    def setup(t: Tree) -> None:
        path = t.package / rel
        path.unlink()
        make(path, t)

    return setup


def fifo(path: Path, t: Tree) -> None:
    os.mkfifo(path)


def unix_socket(path: Path, t: Tree) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))


def link_out(path: Path, t: Tree) -> None:
    copy = t.outside / path.name
    shutil.copy(t.pristine / path.relative_to(t.package), copy)
    path.symlink_to(copy)


def hard_link_out(path: Path, t: Tree) -> None:
    copy = t.outside / path.name
    shutil.copy(t.pristine / path.relative_to(t.package), copy)
    os.link(copy, path)


def link_loop(path: Path, t: Tree) -> None:
    path.symlink_to(path.name + ".other")
    (path.parent / (path.name + ".other")).symlink_to(path.name)


def speculative_dir_links_out(t: Tree) -> None:
    shutil.move(t.package / "srt" / "speculative", t.outside / "speculative")
    (t.package / "srt" / "speculative").symlink_to(t.outside / "speculative")


def append(rel: str, text: str) -> Callable[[Tree], None]:
    def setup(t: Tree) -> None:
        with open(t.package / rel, "a") as f:
            f.write(text)

    return setup


ALL = ("status", "diff", "apply", "revert")


def every(code: int, *, but: dict[str, int] | None = None) -> dict[str, int]:
    return {**dict.fromkeys(ALL, code), **(but or {})}


CASES = {
    # -- the state dir is not a real directory inside the tree
    "state dir links out": Case(link_state_dir_out, every(10), r"\.dynspec is a link to .*outside"),
    "state dir links out to a stale journal": Case(link_state_dir_out_with_a_stale_journal, every(10), "is a link to"),
    "blobs link out": Case(link_blobs_out, every(10, but={"status": 0}), r"blobs is a link to .*outside"),
    "state dir is a file": Case(state_dir_is_a_file, every(10), r"\.dynspec is a regular file, not a directory"),
    "state.json is a directory": Case(state_json_is_a_directory, every(10), "state.json is a directory"),
    "state.json links out": Case(state_json_links_out, every(10), "state.json is a link"),
    # -- state.json damaged or forged
    "state.json truncated": Case(raw_state('{"format": 1, "files": {'), every(10), "not valid JSON"),
    "state.json deeply nested": Case(raw_state("[" * 100000 + "]" * 100000), every(10), "nested too deeply"),
    "state.json without txid": Case(
        edit_state(lambda s: {k: v for k, v in s.items() if k != "txid"}), every(10), "txid"
    ),
    "state.json files is a list": Case(
        edit_state(lambda s: dict(s, files=list(s["files"]))), every(10), "'files' is not an object"
    ),
    "state.json entry is a string": Case(
        edit_state(lambda s: first_entry(s) and dict(s, files={SERVER_ARGS: "x"})), every(10), "is not an object"
    ),
    "state.json pre is a number": Case(edit_state(lambda s: first_entry(s, pre=7)), every(10), "'pre' is not a sha256"),
    "state.json post missing": Case(
        edit_state(lambda s: dict(s, files={SERVER_ARGS: {"pre": None}})), every(10), "not pre and post"
    ),
    "state.json records a path out of the tree": Case(
        edit_state(lambda s: renamed_entry(s, "../outside/victim.py")), every(10), "not a plain path"
    ),
    "state.json records an absolute path": Case(
        edit_state(lambda s: renamed_entry(s, "/etc/passwd")), every(10), "not a plain path"
    ),
    "state.json records the state dir": Case(
        edit_state(lambda s: renamed_entry(s, ".dynspec/state.json")), every(10), "not a plain path"
    ),
    "state.json pre-image digest climbs out": Case(
        edit_state(lambda s: first_entry(s, pre="../../../outside/victim.py")), every(10), "not a sha256"
    ),
    "state.json entry carries a mode": Case(
        edit_state(lambda s: first_entry(s, mode=0o4777)), every(10), "not pre and post"
    ),
    "state.json carries an owner": Case(edit_state(lambda s: dict(s, owner=0)), every(10), "unknown keys"),
    "state.json revision is a string": Case(
        edit_state(lambda s: dict(s, patches={"x": "1"})), every(10), "not a patch id and revision"
    ),
    "state.json of a future format": Case(edit_state(lambda s: dict(s, format=2)), every(10), "format 2"),
    "pre-image blob missing": Case(
        lambda t: (t.apply(), shutil.rmtree(t.package / ".dynspec" / "blobs")),
        every(10, but={"status": 0}),
        "missing or damaged",
    ),
    # -- journal.json damaged or forged
    "journal not JSON": Case(journal(lambda j: "{"), every(10, but={"diff": 0}), "journal.json is damaged"),
    "journal without txid": Case(
        journal(lambda j: {k: v for k, v in j.items() if k != "txid"}), every(10, but={"diff": 0}), "txid"
    ),
    "journal without post": Case(
        journal(lambda j: dict(j, files={SERVER_ARGS: {"pre": None}})), every(10, but={"diff": 0}), "not pre and post"
    ),
    "journal files is a list": Case(
        journal(lambda j: dict(j, files=[SERVER_ARGS])), every(10, but={"diff": 0}), "not an object"
    ),
    "journal path out of the tree": Case(
        journal(lambda j: dict(j, files={"../outside/victim.py": j["files"][SERVER_ARGS]})),
        every(10, but={"diff": 0}),
        "not a plain path",
    ),
    # -- targets that are not plain files inside the tree
    "target is a directory": Case(
        replace_target(WORKER, lambda p, t: p.mkdir()), every(4, but={"revert": 0}), "eagle_worker.py is a directory"
    ),
    "target is a FIFO": Case(replace_target(WORKER, fifo), every(4, but={"revert": 0}), "eagle_worker.py is a FIFO"),
    "target is a socket": Case(
        replace_target(WORKER, unix_socket), every(4, but={"revert": 0}), "eagle_worker.py is a socket"
    ),
    "target links out": Case(
        replace_target(WORKER, link_out),
        every(4, but={"revert": 0}),
        r"eagle_worker.py is a link to .*outside the SGLang tree",
    ),
    "server_args.py links out": Case(
        replace_target(SERVER_ARGS, link_out), every(4, but={"revert": 0}), r"server_args.py is a link to .*outside"
    ),
    "target is a link loop": Case(
        replace_target(WORKER, link_loop), every(4, but={"revert": 0}), "too many levels of links"
    ),
    "srt/speculative links out": Case(
        speculative_dir_links_out, every(4, but={"revert": 0}), r"srt/speculative is a link to .*outside"
    ),
    "server_args.py is a FIFO": Case(
        replace_target(SERVER_ARGS, fifo), every(2), "server_args.py is not a regular file"
    ),
    "version.py is a FIFO": Case(replace_target("version.py", fifo), every(0), "", {"apply", "revert"}),
    # -- targets whose text dynspec cannot patch
    "a 5000-term expression": Case(
        append(SERVER_ARGS, "x = " + " + ".join(["1"] * 5000) + "\n"),
        every(4, but={"revert": 0}),
        "nests expressions too deeply",
    ),
    "a second class ServerArgs": Case(
        append(SERVER_ARGS, "\n\nclass ServerArgs:\n    pass\n"), every(0), "", {"apply", "revert"}
    ),
    "a file that runs code when imported": Case(
        append(SERVER_ARGS, "\nimport os\nos.system('touch MARKER')\n"), every(0), "", {"apply", "revert"}
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_refused_in_one_line_or_done_right_and_nothing_outside(tree: Tree, name: str) -> None:
    case = CASES[name]
    case.setup(tree)
    start, outside = picture(tree.package), picture(tree.outside)
    for command in ALL:
        before = picture(tree.package)
        done = tree.run(command)
        assert done.code == case.codes[command], f"{name}: {command} exited {done.code}: {done.err}"
        if done.code not in (0, 1):
            assert re.search(case.message, done.lines[-1]), f"{name}: {command}: {done.err}"
        if command not in case.results:
            assert picture(tree.package) == before, (
                f"{name}: {command} changed {difference(before, picture(tree.package))}"
            )
        assert picture(tree.outside) == outside, f"{name}: {command} changed a file outside the tree"
    assert not Path("MARKER").exists() and not (tree.package / "MARKER").exists(), "dynspec ran code from the tree"
    assert picture(tree.package) == start, "apply then revert gives back every byte, mode, owner and link"


def test_links_inside_the_tree_are_followed_and_kept(tree: Tree) -> None:
    worker = tree.package / WORKER
    worker.rename(worker.with_name("eagle_worker_real.py"))
    worker.symlink_to("eagle_worker_real.py")
    (tree.package / "srt" / "spec").symlink_to("speculative")
    before = picture(tree.package)
    assert tree.run("apply").code == 0
    assert worker.is_symlink() and "# dynspec: " in worker.read_text()
    assert tree.run("revert").code == 0
    assert picture(tree.package) == before


def test_a_hard_link_to_a_file_outside_is_replaced_not_written_through(tree: Tree) -> None:
    replace_target(WORKER, hard_link_out)(tree)
    outside = picture(tree.outside)
    assert tree.run("apply").code == 0
    assert "# dynspec: " in (tree.package / WORKER).read_text()
    assert picture(tree.outside) == outside
    assert tree.run("revert").code == 0
    assert picture(tree.outside) == outside


def test_planted_links_at_temp_names_are_never_written_through(tree: Tree) -> None:
    """Old dynspec wrote to ``<target>.dynspec-tmp-<pid>``: a link planted there got the patched file."""
    names = [f"{SERVER_ARGS}.dynspec-tmp-{pid}" for pid in range(os.getpid(), os.getpid() + 50)]
    for name in names:
        (tree.package / name).symlink_to(tree.outside / "victim.py")
    outside = picture(tree.outside)
    assert tree.run("apply").code == 0
    assert not (tree.package / SERVER_ARGS).is_symlink()
    assert not any(os.path.lexists(tree.package / n) for n in names), "recovery removes what looks like our temp files"
    (tree.package / ".dynspec" / "state.json.dynspec-tmp-1").symlink_to(tree.outside / "victim.py")
    assert tree.run("revert").code == 0
    assert picture(tree.outside) == outside
    assert picture(tree.package) == picture(tree.pristine)


def test_a_journal_never_sets_a_mode(tree: Tree) -> None:
    """A journal saying 0o4777 once made recovery set the setuid bit on server_args.py."""
    assert tree.run("apply").code == 0
    pristine = (tree.pristine / SERVER_ARGS).read_bytes()
    patched = (tree.package / SERVER_ARGS).read_bytes()
    entry = {"pre": txn.sha256(pristine), "post": txn.sha256(patched), "mode": 0o4777}
    journal = {"txid": "e" * 32, "files": {SERVER_ARGS: entry}}  # as dynspec before issue 14 wrote it
    (tree.package / ".dynspec" / "journal.json").write_text(json.dumps(journal))
    done = tree.run("apply")
    assert done.code == 0 and "rolled back" in done.err, done.err
    assert stat.S_IMODE((tree.package / SERVER_ARGS).stat().st_mode) == 0o644
    assert tree.run("revert").code == 0
    assert picture(tree.package) == picture(tree.pristine)


def test_a_revert_killed_after_its_journal_went_is_finished(tree: Tree) -> None:
    """dynspec before issue 14: files restored, journal gone, state.json left; every later run refused."""
    assert tree.run("apply").code == 0
    state = (tree.package / ".dynspec" / "state.json").read_bytes()
    assert tree.run("revert").code == 0
    (tree.package / ".dynspec" / "blobs").mkdir(parents=True)
    (tree.package / ".dynspec" / "state.json").write_bytes(state)
    assert tree.run("apply").code == 0
    assert tree.run("revert").code == 0
    assert picture(tree.package) == picture(tree.pristine)


def test_leftovers_of_an_interrupted_first_write_are_removed(tree: Tree) -> None:
    (tree.package / ".dynspec" / "blobs").mkdir(parents=True)
    (tree.package / ".dynspec" / ".gitignore").write_text("*\n")
    (tree.package / f"{SERVER_ARGS}.dynspec-tmp-4242").write_text("half a file")
    done = tree.run("revert")
    assert done.code == 0 and "nothing to revert" in done.err, done.err
    assert picture(tree.package) == picture(tree.pristine)


def test_another_release_given_names_the_detected_one(tree: Tree) -> None:
    done = forked(cli("apply", "--sglang", str(tree.package), "--sglang-version", "0.5.23"))
    assert done.code == 3
    assert done.lines[-1].endswith("the tree says it is SGLang 0.5.12; --sglang-version 0.5.23 overrides that"), (
        done.err
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can hand a tree to another owner")
def test_root_keeps_the_owners_of_a_users_tree(tree: Tree) -> None:
    for path in [tree.package, *tree.package.rglob("*")]:
        os.chown(path, 65534, 65534, follow_symlinks=False)
    before = picture(tree.package)
    assert tree.run("apply").code == 0
    owners = {(p.lstat().st_uid, p.lstat().st_gid) for p in [tree.package, *tree.package.rglob("*")]}
    assert owners == {(65534, 65534)}, "patched files, new files and the state dir belong to the tree's owner"
    assert tree.run("revert").code == 0
    assert picture(tree.package) == before


def committed_checkout(release_tree, where: Path) -> Path:
    import subprocess

    release_tree(VERSION, where=where / "python")
    for args in (
        ["init", "-q"],
        ["add", "-A"],
        ["-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "sglang"],
    ):
        subprocess.run(["git", "-C", str(where), *args], check=True, capture_output=True)
    return where


@pytest.mark.parametrize("damage", ["state.json", "state dir links out"])
def test_revert_from_git_is_the_way_out_of_a_damaged_state_dir(release_tree, tmp_path: Path, damage: str) -> None:
    import subprocess

    checkout = committed_checkout(release_tree, tmp_path / "sglang")
    outside = tmp_path / "outside"
    outside.mkdir()
    assert forked(cli("apply", "--sglang", str(checkout))).code == 0
    state_dir = checkout / "python" / "sglang" / ".dynspec"
    if damage == "state.json":
        (state_dir / "state.json").write_text("{")
    else:
        shutil.rmtree(state_dir)
        state_dir.symlink_to(outside)
    refused = forked(cli("apply", "--sglang", str(checkout)))
    assert refused.code == 10 and "`dynspec revert --from-git`" in refused.err, refused.err
    done = forked(cli("revert", "--from-git", "--sglang", str(checkout)))
    assert done.code == 0, done.err
    assert "restored python/sglang/srt/server_args.py from git" in done.err
    status = subprocess.run(
        ["git", "-C", str(checkout), "status", "--porcelain", "--ignored"], capture_output=True, text=True
    )
    assert status.stdout == "", "every target as committed, dynspec's own files and the state dir gone"
    assert list(outside.iterdir()) == []


def test_revert_from_git_needs_a_checkout(tree: Tree) -> None:
    done = tree.run("revert", "--from-git")
    assert done.code == 4 and "is not tracked by a git checkout" in done.err, done.err
