from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from patcher import releases
from patcher.patch import Patch
from patcher.registry import all_patches

ROOT = Path(__file__).resolve().parent.parent
RELEASES = [v for v in (ROOT / "tests" / "releases.txt").read_text().splitlines() if v and not v.startswith("#")]


def releases_of(patch: type[Patch]) -> list[str]:
    """The releases of ``RELEASES`` that ``patch`` applies to: a test's list follows the patch's range,
    so a new release is added to tests/releases.txt alone."""
    return [v for v in RELEASES if patch.applies_to(v)]


def targets() -> list[str]:
    return sorted({p.TARGET for p in all_patches().values()})


@pytest.fixture
def release_tree(tmp_path: Path) -> Callable[[str], Path]:
    """``release_tree("0.5.12")`` → a fresh copy of that real release's package dir."""

    def make(version: str, where: Path | None = None) -> Path:
        dest = where or tmp_path / f"site-{version}"
        dest.mkdir(parents=True, exist_ok=True)
        return releases.copy_tree(version, targets(), dest)

    return make


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root``: 'no byte changed' is an equality of snapshots."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def run_dynspec(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real console entry point in a subprocess: exit codes and streams as a user sees them."""
    return subprocess.run(
        [sys.executable, "-m", "patcher", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "NO_COLOR": "1", **(env or {})},
        timeout=120,
    )
