"""A checkout whose own git config names programs: dynspec runs none of them.

The trap sets every config key that makes git run a program on a read (core.fsmonitor, hooks,
pager, external diff, filters and textconv drivers) to a script that leaves a marker. Each test
first shows that plain git does run it on this repository, so the trap is armed, then that no
dynspec command does, with the package at the top of the checkout or below a repository that
merely contains it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.faults.harness import cli, forked

VERSION = "0.5.12"
COMMANDS = (("diff",), ("status",), ("status", "--json"), ("apply", "--dry-run"), ("apply",), ("revert",))
HOOKS = ("pre-commit", "post-checkout", "post-index-change", "reference-transaction", "post-rewrite")


def git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)


def defused_git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """git with the programs the trap names switched off: for building the repository, not for testing."""
    off = ("-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "-c", "filter.trap.clean=cat")
    return git(repo, *off, *args)


def armed_checkout(root: Path, marker: Path) -> None:
    """An armed repository at ``root`` with everything in it committed."""
    armed_repo(root, marker)
    defused_git(root, "add", "-A")
    defused_git(root, "commit", "-q", "-m", "sglang")


def armed_repo(root: Path, marker: Path) -> None:
    """Make ``root`` a git repository whose config runs a marker-leaving script wherever it can."""
    script = root.parent / "trap.sh"
    script.write_text(f'#!/bin/sh\necho "$0 $*" >> {marker}\n')
    script.chmod(0o755)
    hooks = root.parent / "hooks"
    hooks.mkdir()
    for name in HOOKS:
        (hooks / name).symlink_to(script)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitattributes").write_text("* filter=trap diff=trap\n")
    for key, value in {
        "user.name": "t", "user.email": "t@example.com", "core.fsmonitor": str(script), "core.hooksPath": str(hooks),
        "core.pager": str(script), "diff.external": str(script), "filter.trap.clean": str(script),
        "filter.trap.smudge": str(script), "diff.trap.textconv": str(script),
    }.items():  # fmt: skip
        git(root, "config", key, value)


@pytest.fixture(params=["checkout", "repository above site-packages"])
def package(request: pytest.FixtureRequest, release_tree, tmp_path: Path) -> tuple[Path, Path, Path]:
    """(the --sglang path, the repository, the marker)"""
    marker = tmp_path / "MARKER"
    if request.param == "checkout":
        root = tmp_path / "sglang"
        release_tree(VERSION, where=root / "python")
        armed_checkout(root, marker)
        git(root, "tag", f"v{VERSION}")
        return root, root, marker
    root = tmp_path / "project"
    package = release_tree(VERSION, where=root / "venv" / "site-packages")
    armed_repo(root, marker)
    (root / "README").write_text("a project with a virtualenv inside\n")
    defused_git(root, "add", "README")
    return package, root, marker


def test_git_config_of_the_tree_never_runs(package: tuple[Path, Path, Path]) -> None:
    sglang, repo, marker = package
    subprocess.run(["git", "-C", str(repo), "ls-files"], capture_output=True, check=True)
    assert marker.exists(), "the trap is armed: plain git runs core.fsmonitor on this repository"
    marker.unlink()
    for command in COMMANDS:
        done = forked(cli(*command, "--sglang", str(sglang)))
        assert done.code == 0, (command, done.err)
        assert not marker.exists(), f"dynspec {' '.join(command)} ran {marker.read_text()}"
    if repo == sglang:
        described = forked(cli("status", "--json", "--sglang", str(sglang)))
        assert '"sglang_version": "0.5.12"' in described.out, "git facts are still read, with the programs off"
