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


def launched(name: str, ts: float, dur: float, correlation: int) -> list[dict]:
    """A kernel and the runtime call that launched it, linked as the profiler links them."""
    return [
        {**kernel(name, ts, dur), "args": {"correlation": correlation}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts - 30, "dur": 5, "args": {"correlation": correlation}},
    ]


def test_the_longest_gaps_name_their_kernels_and_what_the_host_did_between_the_launches(tmp_path: Path) -> None:
    # Idle 100-400 (300 us: the host ran prepare() for 250 us) and 500-620 (120 us); 450-500 covered.
    write_trace(tmp_path, [
        *launched("gemm", 0, 100, 1), *launched("norm", 400, 100, 2), *launched("attn", 620, 10, 3),
        {"ph": "X", "cat": "python_function", "name": "worker.py(10): prepare", "ts": 110, "dur": 250},
        {"ph": "X", "cat": "python_function", "name": "loop.py(1): event_loop", "ts": -50, "dur": 1000},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaEventSynchronize", "ts": 500, "dur": 50},
    ])
    out = summary(tmp_path, 1)
    gaps = out.split("-- longest idle gaps")[1]
    assert gaps.startswith(" (of 2 >= 100 us)")
    first, second = gaps.index("300 us at     0.10 ms  gemm -> norm"), gaps.index("120 us at     0.50 ms  norm -> attn")
    assert first < second  # the longest first
    host = gaps[first:second]
    assert "host 400 us between the two launches:" in host and "250 us  worker.py(10): prepare" in host
    assert "event_loop" not in host  # it began before the window: not what the host did in the gap
    assert "50 us  cudaEventSynchronize" in gaps[second:]


def test_gaps_shorter_than_the_minimum_are_not_listed(tmp_path: Path) -> None:
    write_trace(tmp_path, [*launched("gemm", 0, 100, 1), *launched("norm", 199, 10, 2)])  # 99 us idle
    assert "longest idle gaps" not in summary(tmp_path, 1)
