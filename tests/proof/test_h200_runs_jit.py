"""scripts/h200-runs.sh's compile-cache steps, run by bash here on caches made in the test:
``jit-save`` packs them into parts that fit what a device call brings back, ``jit-load`` puts
them back where they were, byte for byte, and both refuse what they cannot do."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "h200-runs.sh"
pytestmark = pytest.mark.skipif(shutil.which("xz") is None, reason="xz")


def run(step: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), step], cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def caches(tmp_path: Path) -> dict[str, str]:
    """Three cache dirs as the servers would leave them, found through each tool's own variable."""
    env = {
        "SGLANG_CACHE_DIR": str(tmp_path / "sglang"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        "OUT": str(tmp_path / "out"),
    }
    for name, size in (("sglang", 1000), ("inductor", 300_000), ("triton", 5)):
        d = tmp_path / name / "k" / "v"
        d.mkdir(parents=True)
        (d / "artifact.bin").write_bytes(os.urandom(size))
    return env


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.parent.name == "v"
    }


def test_the_caches_come_back_where_they_were_made(tmp_path: Path, caches: dict[str, str]) -> None:
    before = {name: snapshot(tmp_path / name) for name in ("sglang", "inductor", "triton")}
    saved = run("jit-save", tmp_path, caches)
    assert saved.returncode == 0, saved.stdout + saved.stderr
    parts = sorted((tmp_path / "out" / "jit").iterdir())
    assert [p.name for p in parts] == ["jit.tar.xz.part-0"] and parts[0].stat().st_size < 15 * 1024 * 1024
    for name in before:
        shutil.rmtree(tmp_path / name)
    work = tmp_path / "work"
    (work / ".gpu" / "jit").mkdir(parents=True)
    shutil.copy(parts[0], work / ".gpu" / "jit")
    loaded = run("jit-load", work, caches)
    assert loaded.returncode == 0 and "compile caches restored" in loaded.stdout, loaded.stdout + loaded.stderr
    assert {name: snapshot(tmp_path / name) for name in before} == before


def test_a_damaged_part_is_refused(tmp_path: Path, caches: dict[str, str]) -> None:
    assert run("jit-save", tmp_path, caches).returncode == 0
    work = tmp_path / "work"
    (work / ".gpu" / "jit").mkdir(parents=True)
    part = (tmp_path / "out" / "jit" / "jit.tar.xz.part-0").read_bytes()
    (work / ".gpu" / "jit" / "jit.tar.xz.part-0").write_bytes(part[: len(part) // 2])
    assert run("jit-load", work, caches).returncode == 3


def test_nothing_to_save_or_load_is_its_own_error(tmp_path: Path) -> None:
    empty = {
        "SGLANG_CACHE_DIR": str(tmp_path / "none-1"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "none-2"),
        "TRITON_CACHE_DIR": str(tmp_path / "none-3"),
        "OUT": str(tmp_path / "out"),
    }
    saved = run("jit-save", tmp_path, empty)
    assert saved.returncode == 3 and "no compile cache" in saved.stdout
    loaded = run("jit-load", tmp_path, empty)
    assert loaded.returncode == 3 and "carry .gpu/jit" in loaded.stdout
