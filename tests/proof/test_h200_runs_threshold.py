"""scripts/h200-runs.sh's kv-tput / kv-mixed threshold: the card's switch point for the 8B shape
(sessions 33 - 35), read from nvidia-smi, run by bash here against a stand-in nvidia-smi."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "h200-runs.sh"


def chosen_threshold(tmp_path: Path, card: str | None) -> str:
    """What the script's threshold line sets with ``card`` as nvidia-smi's name (None: no nvidia-smi)."""
    (line,) = [line.strip() for line in SCRIPT.read_text().splitlines() if line.strip().startswith("thr=")]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "nvidia-smi"
    if card is None:
        fake.unlink(missing_ok=True)
    else:
        fake.write_text(f"#!/bin/sh\necho '{card}'\n")
        fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    done = subprocess.run(["bash", "-c", f'{line}; echo "$thr"'], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("card", "threshold"),
    [("NVIDIA H100 80GB HBM3", "96"), ("NVIDIA H200", "32"), (None, "32")],
    ids=["h100", "h200", "no-nvidia-smi"],
)
def test_kv_tput_takes_the_cards_switch_point(tmp_path: Path, card: str | None, threshold: str) -> None:
    """An H100 gets 96, where both v2 paths' mixed loads met their oracle (session 35); an H200, or a
    machine whose card cannot be read, 32 (the issue's N, an H200's switch point)."""
    assert chosen_threshold(tmp_path, card) == threshold


def test_the_threshold_reaches_the_proof_and_proof_flags_come_after_it() -> None:
    """The chosen threshold is what kv-tput passes, and PROOF_FLAGS are appended after every step's
    own flags, so that a --threshold there wins (the proof takes a flag's last value)."""
    script = SCRIPT.read_text()
    assert '--threshold "$thr"' in script and "--threshold 32 $extra" not in script
    assert 'set -- "$@" ${PROOF_FLAGS:-}' in script
