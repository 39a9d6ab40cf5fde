"""scripts/trace_sum.py (the `prof` step's reader of torch-profiler traces): busy, idle and tables per step."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def summary(directory: Path, steps: int) -> str:
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "trace_sum.py"), str(directory), str(steps)],
        capture_output=True, text=True, timeout=60, check=True,
    )
    return run.stdout


def write_trace(directory: Path, events: list[dict]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with gzip.open(directory / "x-TP-0.trace.json.gz", "wt") as handle:
        json.dump({"traceEvents": events}, handle)


def kernel(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}


def test_busy_idle_and_kernel_table_per_step(tmp_path: Path) -> None:
    # Two steps: kernels cover 0-100, 150-250 (one overlapping 200-300) and 1000-1100; 50 + 700 us idle.
    write_trace(tmp_path, [
        kernel("gemm", 0, 100), kernel("gemm", 150, 100), kernel("norm", 200, 100), kernel("gemm", 1000, 100),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0, "dur": 40},
        {"ph": "i", "cat": "kernel", "name": "instant, not counted", "ts": 5},
    ])
    out = summary(tmp_path, 2)
    assert "per step: span 550 us, busy 175 us, idle 375 us" in out
    assert "idle by gap size (us/step): 20-100us 25, >=100us 350" in out
    assert "    150.0 us x  1.50  gemm" in out and "     50.0 us x  0.50  norm" in out
    assert "     20.0 us x  0.50  cudaGraphLaunch" in out


def test_a_folder_without_traces_says_so(tmp_path: Path) -> None:
    assert summary(tmp_path, 5).strip() == f"{tmp_path}: no trace events"
