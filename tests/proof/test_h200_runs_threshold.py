"""scripts/h200-runs.sh's timed steps: kv-tput / kv-mixed's threshold, the card's switch point for the
8B shape (sessions 33 - 35), read from nvidia-smi, run by bash here against a stand-in nvidia-smi;
and the frozen collector (session 40)."""

from __future__ import annotations

import os
import re
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


def freeze_flag(freeze_gc: str | None) -> str:
    """What the script's ``freeze_gc`` prints with ``FREEZE_GC`` set to ``freeze_gc`` (None: unset)."""
    (line,) = [line for line in SCRIPT.read_text().splitlines() if line.startswith("freeze_gc() {")]
    env = {k: v for k, v in os.environ.items() if k != "FREEZE_GC"}
    if freeze_gc is not None:
        env["FREEZE_GC"] = freeze_gc
    done = subprocess.run(["bash", "-c", f"{line}; freeze_gc"], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(("freeze_gc", "flag"), [(None, "--freeze-gc"), ("1", "--freeze-gc"), ("0", "")])
def test_the_timed_steps_freeze_the_collector_unless_told_not_to(freeze_gc: str | None, flag: str) -> None:
    """Session 40: v1's R(128), missed twice by one collection in a timed run, met its bar with every
    server's collector frozen after its warm-up; FREEZE_GC=0 measures as before."""
    assert freeze_flag(freeze_gc) == flag


def test_every_timed_step_asks_for_it() -> None:
    """kv-tput / kv-mixed, kv-auto and real-auto pass it; the correctness steps (kv-proof) do not."""
    arms = re.split(r"^  ([\w|-]+)\) ", SCRIPT.read_text(), flags=re.M)  # the case's arms, name then body
    by_step = dict(zip(arms[1::2], arms[2::2]))
    timed = ("kv-tput|kv-mixed", "kv-auto", "real-auto")
    assert all("$(freeze_gc)" in by_step[name] for name in timed)
    assert "$(freeze_gc)" not in by_step["kv-proof"]


@pytest.mark.parametrize(
    ("graphs", "flags"),
    [(None, ["--disable-piecewise-cuda-graph"]), ("4 8 256", ["--cuda-graph-bs-prefill", "4", "8", "256"])],
    ids=["unset", "PREFILL_GRAPHS"],
)
def test_real_auto_starts_without_piecewise_prefill_graphs_unless_given_their_sizes(
    graphs: str | None, flags: list[str]
) -> None:
    """0.5.14+ capture piecewise prefill graphs at start-up, 168 s of a SmolLM2 server's 225 s in session
    44 (58 token counts): nine servers, three at a time, fit one call only without them. real-auto asks
    for that, keeping SERVER_ARGS; kv-auto (the 8B shape, whose parts the sessions before ran with them)
    does not. PREFILL_GRAPHS keeps them for the token counts it names (session 48: a speculating server
    admits the loop's requests one prefill at a time, each eager without them)."""
    arms = re.split(r"^  ([\w|-]+)\) ", SCRIPT.read_text(), flags=re.M)
    by_step = dict(zip(arms[1::2], arms[2::2]))
    assert 'SERVER_ARGS="$prefill ${SERVER_ARGS:-}" proof' in by_step["real-auto"]
    assert "piecewise" not in by_step["kv-auto"]
    lines = [line.strip() for line in SCRIPT.read_text().splitlines()]
    (choose,) = [line for line in lines if line.startswith('prefill="--disable-piecewise-cuda-graph"')]
    (extra,) = [line for line in lines if 'set -- "$@" --extra-args' in line]
    env = {k: v for k, v in os.environ.items() if k != "PREFILL_GRAPHS"}
    env["SERVER_ARGS"] = "--decode-log-interval 1"
    if graphs is not None:
        env["PREFILL_GRAPHS"] = graphs
    # what the proof function then passes: the choice and the caller's own flags, as one --extra-args
    done = subprocess.run(
        ["bash", "-c", f'{choose}; f() {{ {extra}; echo "$@"; }}; SERVER_ARGS="$prefill ${{SERVER_ARGS:-}}" f x'],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["x", "--extra-args", *flags, "--decode-log-interval", "1"]
