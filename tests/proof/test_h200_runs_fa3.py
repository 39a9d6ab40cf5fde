"""scripts/h200-runs.sh's ``fa3`` step, run by bash here on parts made in the test as
scripts/gpu-fa3.sh makes them (an xz'd tar of ``sgl_kernel/flash_ops.abi3.so``, split): one call
carries one part, in any order, and the call that brings the last one unpacks them, byte for byte;
a damaged part unpacks nothing until a sound one replaces it."""

from __future__ import annotations

import io
import lzma
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "h200-runs.sh"
pytestmark = pytest.mark.skipif(shutil.which("xz") is None, reason="xz")
VERSION = "9.9.9"
SO = "sgl_kernel/flash_ops.abi3.so"


def parts_of(library: bytes, count: int) -> list[bytes]:
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w") as tar:
        info = tarfile.TarInfo(SO)
        info.size = len(library)
        tar.addfile(info, io.BytesIO(library))
    data = lzma.compress(packed.getvalue())
    size = -(-len(data) // count)
    return [data[i * size : (i + 1) * size] for i in range(count)]


def fa3_step(work: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), "fa3", VERSION],
        cwd=work,
        env={**os.environ, "FA3_HOME": str(work / "tmp")},
        capture_output=True,
        text=True,
        timeout=120,
    )


def carry(work: Path, index: int, parts: list[bytes], part: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """One device call that carried part ``index`` (1-based) and nothing else of the set."""
    gpu = work / ".gpu"
    shutil.rmtree(gpu, ignore_errors=True)
    gpu.mkdir(parents=True)
    (gpu / f"fa3-{VERSION}.part-{index}-of-{len(parts)}").write_bytes(parts[index - 1] if part is None else part)
    return fa3_step(work)


def unpacked(work: Path) -> Path:
    return work / "tmp" / f"fa3-{VERSION}" / SO


def test_the_last_part_to_come_unpacks_them_all(tmp_path: Path) -> None:
    library = os.urandom(300_000)
    parts = parts_of(library, 3)
    for n, index in enumerate((3, 1), start=1):
        call = carry(tmp_path, index, parts)
        assert call.returncode == 0 and f"FA3: {n} of 3 parts here" in call.stdout, call.stdout + call.stderr
        assert not unpacked(tmp_path).exists()
    last = carry(tmp_path, 2, parts)
    assert last.returncode == 0 and "FA3 unpacked" in last.stdout, last.stdout + last.stderr
    assert unpacked(tmp_path).read_bytes() == library
    assert not list((tmp_path / "tmp" / f"fa3-{VERSION}").glob("*.part-*"))


def test_a_damaged_part_unpacks_nothing_until_a_sound_one_replaces_it(tmp_path: Path) -> None:
    library = os.urandom(300_000)
    parts = parts_of(library, 3)
    carry(tmp_path, 1, parts)
    carry(tmp_path, 3, parts)
    damaged = bytearray(parts[1])
    damaged[len(damaged) // 2] ^= 0xFF
    call = carry(tmp_path, 2, parts, bytes(damaged))
    assert call.returncode == 3 and "FA3 parts do not unpack" in call.stdout, call.stdout + call.stderr
    assert not unpacked(tmp_path).exists()
    again = carry(tmp_path, 2, parts)
    assert again.returncode == 0, again.stdout + again.stderr
    assert unpacked(tmp_path).read_bytes() == library


def test_a_call_without_a_part_says_how_to_make_them(tmp_path: Path) -> None:
    (tmp_path / ".gpu").mkdir()
    call = fa3_step(tmp_path)
    assert call.returncode == 3 and f"scripts/gpu-fa3.sh {VERSION}" in call.stdout
