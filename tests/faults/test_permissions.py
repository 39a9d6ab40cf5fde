"""Permission cases, run by an unprivileged user: the fork drops to ``nobody`` when the suite runs as
root (as CI does), else it runs as the user it is.

Unreadable targets and state files are one-line refusals (exit 4), not a PermissionError; a tree
the user may not write is refused before anything is written; a tree root patched for its owner
can be reverted by that owner.
"""

from __future__ import annotations

import os
import pwd
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from patcher import releases
from tests.conftest import targets
from tests.faults.harness import KNOWN_EXIT_CODES, Run, cli, forked, picture, world_readable_dir

VERSION = "0.5.12"
AS_ROOT = os.geteuid() == 0


def unprivileged() -> tuple[int, int]:
    """nobody's uid and gid; the kernel needs no passwd entry, so 65534 serves where there is none."""
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


USER = unprivileged() if AS_ROOT else None  # None: run as the (unprivileged) user we are


@pytest.fixture
def package() -> Iterator[Path]:
    with world_readable_dir("dynspec-perm-") as scratch:
        yield releases.copy_tree(VERSION, targets(), scratch / "site")


def run(package: Path, *args: str, user: tuple[int, int] | None = USER) -> Run:
    done = forked(cli(*args, "--sglang", str(package)), user=user, timeout=120)
    assert done.code in KNOWN_EXIT_CODES and "Traceback" not in done.err, done.err
    return done


def refused(done: Run, message: str) -> None:
    assert done.code == 4, done.err
    assert len(done.lines) == 1 and message in done.lines[0], done.err


def test_the_suite_really_runs_unprivileged(package: Path) -> None:
    done = forked(lambda: 0 if os.geteuid() != 0 else 1, user=USER)
    assert done.code == 0, "the permission cases would prove nothing as root"


@pytest.mark.parametrize("target", ["srt/server_args.py", "srt/speculative/eagle_worker.py"])
def test_an_unreadable_target_is_refused(package: Path, target: str) -> None:
    (package / target).chmod(0)
    before = picture(package)
    for command in ("status", "diff", "apply"):
        refused(run(package, command), f"cannot read {target}: permission denied")
    assert picture(package) == before


def test_a_tree_the_user_may_not_write_is_refused_before_writing(package: Path) -> None:
    if not AS_ROOT:
        for path in [package, *package.rglob("*")]:
            path.chmod(0o555 if path.is_dir() else 0o444)
    before = picture(package)
    refused(run(package, "apply"), "is read-only")
    assert picture(package) == before


def test_an_unreadable_state_file_or_dir_is_refused(package: Path) -> None:
    assert run(package, "apply", user=None).code == 0
    if not AS_ROOT:
        assert run(package, "apply").code == 0
    state_dir = package / ".dynspec"
    before = picture(package)
    (state_dir / "state.json").chmod(0)
    for command in ("status", "apply", "revert"):
        refused(run(package, command), "state.json: permission denied")
    (state_dir / "state.json").chmod(0o644)
    state_dir.chmod(0)
    for command in ("status", "revert"):
        refused(run(package, command), f"cannot read {state_dir}: permission denied")
    state_dir.chmod(0o755)
    assert picture(package) == before


@pytest.mark.skipif(not AS_ROOT, reason="needs root to patch a tree it does not own")
def test_what_root_patched_for_a_user_the_user_can_revert(package: Path) -> None:
    assert USER is not None
    for path in [package, *package.rglob("*")]:
        os.chown(path, *USER)
    before = picture(package)
    assert run(package, "apply", user=None).code == 0
    done = run(package, "revert")
    assert done.code == 0, done.err
    assert picture(package) == before


@pytest.mark.skipif(not AS_ROOT, reason="needs root to own the state dir of a user's tree")
def test_a_state_dir_the_user_may_not_change_is_refused_and_the_tree_kept(package: Path) -> None:
    """Written by an older dynspec run as root: the state dir is root's, the files the user's."""
    assert USER is not None
    assert run(package, "apply", user=None).code == 0
    for path in [package, *package.rglob("*")]:
        if ".dynspec" not in path.parts:
            os.chown(path, *USER)
    for path in [package / ".dynspec", *(package / ".dynspec").rglob("*")]:
        os.chown(path, 0, 0)
    before = picture(package)
    done = run(package, "revert")
    refused(done, "Permission denied")
    assert picture(package) == before
    shutil.rmtree(package / ".dynspec")
