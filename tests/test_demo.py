"""`make run` (scripts/demo.py): one line per step, the diff's stat and first hunk, or all of it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import ROOT, run_dynspec

VERSION = "0.5.12"


def demo_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("demo", ROOT / "scripts" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/demo.py", VERSION, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def numstat(diff: str, cwd: Path) -> list[tuple[str, int, int]]:
    """git's own count of the lines each file gains and loses."""
    done = subprocess.run(
        ["git", "apply", "--numstat", "-"], input=diff, cwd=cwd, capture_output=True, text=True, check=True
    )
    return [
        (path, int(added), int(removed))
        for added, removed, path in (line.split("\t") for line in done.stdout.splitlines())
    ]


@pytest.fixture(scope="module")
def full_diff(tmp_path_factory: pytest.TempPathFactory) -> str:
    from patcher import releases
    from tests.conftest import targets

    package = releases.copy_tree(VERSION, targets(), tmp_path_factory.mktemp("demo"))
    return run_dynspec("diff", "--sglang", str(package)).stdout


def test_make_run_prints_a_line_per_step_the_stat_and_the_first_hunk(full_diff: str, tmp_path: Path) -> None:
    done = make_run()
    assert done.returncode == 0, done.stderr
    out = done.stdout
    demo = demo_module()
    files, hunks = demo.diff_stat(full_diff)
    assert files == numstat(full_diff, tmp_path)
    assert "\n".join(demo.stat_lines(files)) in out
    assert f" {len(files)} files changed, {sum(a for _, a, _ in files)} insertions(+)\n" in out
    assert demo.first_hunk(full_diff) in out
    assert out.count("@@ ") == 1, "only the first hunk"
    assert f"the first of {hunks} hunks; `make run FULL_DIFF=1` prints the whole diff" in out
    for step in ("$ dynspec diff", "$ dynspec apply", "$ dynspec status", "$ dynspec revert", "restored byte for byte"):
        assert step in out


def test_make_run_full_diff_prints_all_of_it(full_diff: str) -> None:
    done = make_run("--full-diff")
    assert done.returncode == 0, done.stderr
    assert full_diff in done.stdout
    assert "make run FULL_DIFF=1" not in done.stdout


def test_diff_stat_counts_as_git_does_when_a_line_looks_like_a_header(tmp_path: Path) -> None:
    # An added line whose text starts with "++ " reads "+++ " in the diff; a removed "-- " reads "--- ".
    diff = "diff --git a/x.txt b/x.txt\n--- a/x.txt\n+++ b/x.txt\n@@ -1,2 +1,2 @@\n--- old\n+++ new\n keep\n"
    (tmp_path / "x.txt").write_text("-- old\nkeep\n")
    files, hunks = demo_module().diff_stat(diff)
    assert files == numstat(diff, tmp_path) == [("x.txt", 1, 1)] and hunks == 1
