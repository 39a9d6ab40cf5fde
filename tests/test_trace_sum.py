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
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
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
    write_trace(
        tmp_path,
        [
            kernel("gemm", 0, 100),
            kernel("gemm", 150, 100),
            kernel("norm", 200, 100),
            kernel("gemm", 1000, 100),
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0, "dur": 40},
            {"ph": "i", "cat": "kernel", "name": "instant, not counted", "ts": 5},
        ],
    )
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
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": ts - 30,
            "dur": 5,
            "args": {"correlation": correlation},
        },
    ]


def test_the_longest_gaps_name_their_kernels_and_what_the_host_did_between_the_launches(tmp_path: Path) -> None:
    # Idle 100-400 (300 us: the host ran prepare() for 250 us) and 500-620 (120 us); 450-500 covered.
    write_trace(
        tmp_path,
        [
            *launched("gemm", 0, 100, 1),
            *launched("norm", 400, 100, 2),
            *launched("attn", 620, 10, 3),
            {"ph": "X", "cat": "python_function", "name": "worker.py(10): prepare", "ts": 110, "dur": 250},
            {"ph": "X", "cat": "python_function", "name": "loop.py(1): event_loop", "ts": -50, "dur": 1000},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaEventSynchronize", "ts": 500, "dur": 50},
        ],
    )
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


# -- scripts/trace_diff.py: two summaries, the rows that differ most ----------------------------------

PROFILE = ROOT / "docs" / "proof" / "0.5.12-v2-s17-r23-profile"  # session 17's base and dynspec steps


def diff(ref: Path, other: Path, rows: int = 40) -> str:
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "trace_diff.py"), str(ref), str(other), str(rows)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return run.stdout


def test_the_diff_ranks_what_the_fallback_step_does_more_than_plain_decode() -> None:
    out = diff(PROFILE / "base-all.txt", PROFILE / "dyn-all.txt")
    host = out.split("-- Python functions", 1)[1]
    assert "+3453.7 |    2823.1 x  1.00 |    6276.8 x  1.00  sglang/srt/managers/scheduler.py(2996): run_batch" in host
    assert (
        "+5048.2 |         -         |    5048.2 x  0.95  sglang/srt/speculative/dynspec_v2.py(271): fall_back" in host
    )
    assert "threading.py" not in host  # longer than the step's span: a thread across the window, not the step
    assert (
        "-532.2 |     554.2 x  0.95 |      22.0 x  2.95  cudaEventSynchronize" in out
    )  # base waits on the GPU, dynspec does not


def test_a_summary_against_itself_differs_nowhere() -> None:
    """The control: no row survives when both sides are the same."""
    out = diff(PROFILE / "dyn-all.txt", PROFILE / "dyn-all.txt")
    assert out.splitlines()[1:] == []


def test_native_functions_named_by_address_are_compared_by_name(tmp_path: Path) -> None:
    ref, other = tmp_path / "ref.txt", tmp_path / "other.txt"
    table = "per step: span 100 us, busy 90 us, idle 10 us\n-- Python functions (host, inclusive): 2.0 per step, 30 us per step\n"
    ref.write_text(
        table
        + "     20.0 us x  1.00  <built-in method replay of X object at 0x7f01>\n     10.0 us x  1.00  <built-in method replay of X object at 0x7f02>\n"
    )
    other.write_text(table + "     45.0 us x  1.00  <built-in method replay of X object at 0x7e99>\n")
    assert "+15.0 |      30.0 x  2.00 |      45.0 x  1.00  <built-in method replay of X object>" in diff(ref, other)
