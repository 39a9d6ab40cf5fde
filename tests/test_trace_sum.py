"""scripts/trace_sum.py (the `prof` step's reader of torch-profiler traces): busy, idle and tables per step,
a row per forward step, and Python functions by exclusive time (all of it, and while the GPU idled)."""

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


def section(out: str, title: str) -> str:
    """The lines of ``out`` from the one that starts with ``-- title`` to the next section's."""
    return out.split(f"-- {title}", 1)[1].split("\n--", 1)[0]


def host(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid, "args": args}


def mark(name: str, ts: float, dur: float) -> dict:
    return host("user_annotation", name, ts, dur)


# Two scheduler iterations. The first (after an idle loop's receive at -500) launches the prefill,
# which runs 500-1500; the second launches a decode (1500-2000) and waits on the prefill in
# process_batch_result (cudaEventSynchronize, 700 us).
ITERATIONS = [
    mark("scheduler.recv_requests", -500, 10),
    mark("scheduler.recv_requests", 0, 50),
    mark("scheduler.process_input_requests", 50, 150),
    mark("scheduler.get_next_batch_to_run", 200, 100),
    mark("scheduler.run_batch", 300, 400),
    mark("step[EXTEND bs=2 toks=4]", 350, 150),
    mark("step[EXTEND bs=2 toks=4]", 500, 150),  # the draft's prefill: the same label, shown once
    kernel("prefill", 500, 1000),
    mark("scheduler.recv_requests", 800, 20),
    mark("scheduler.process_input_requests", 820, 10),
    mark("scheduler.get_next_batch_to_run", 830, 70),
    mark("scheduler.run_batch", 900, 200),
    mark("step[DECODE bs=2]", 950, 100),
    {"ph": "X", "cat": "gpu_user_annotation", "name": "step[DECODE bs=2]", "ts": 1500, "dur": 500},
    kernel("decode", 1500, 500),
    mark("scheduler.process_batch_result", 1100, 800),
]
WAIT = host("cuda_runtime", "cudaEventSynchronize", 1150, 700)


def test_each_forward_step_gets_a_row_with_its_span_gpu_time_sync_wait_and_scheduler_stages(tmp_path: Path) -> None:
    write_trace(tmp_path, [*ITERATIONS, WAIT])
    rows = section(summary(tmp_path, 2), "forward steps").splitlines()
    table = [line.split() for line in rows if line.split()[:1] in (["1"], ["2"], ["mean"])]
    # step, at ms (from the first GPU event, 500), span, busy, idle, sync, unblocked, input, sched, run, result
    assert table == [
        ["1", "-0.50", "800", "300", "500", "0", "800", "200", "100", "400", "0", "EXTEND", "bs=2", "toks=4"],
        ["2", "0.30", "1200", "1200", "0", "700", "500", "30", "70", "200", "800", "DECODE", "bs=2"],
        ["mean", "x1", "800", "300", "500", "0", "800", "200", "100", "400", "0", "EXTEND", "bs=2", "toks=4"],
        ["mean", "x1", "1200", "1200", "0", "700", "500", "30", "70", "200", "800", "DECODE", "bs=2"],
    ]


def test_a_step_without_a_sync_call_is_unblocked_all_its_span(tmp_path: Path) -> None:
    """The control: the sync column reads the trace's *Synchronize calls, not a constant."""
    write_trace(tmp_path, ITERATIONS)
    rows = section(summary(tmp_path, 2), "forward steps").splitlines()
    assert ["2", "0.30", "1200", "1200", "0", "0", "1200"] in [line.split()[:7] for line in rows]


def test_a_trace_without_cpu_activity_has_no_step_rows(tmp_path: Path) -> None:
    write_trace(tmp_path, [e for e in ITERATIONS if e["cat"] == "kernel"])
    assert "   none: no scheduler.run_batch annotation" in section(summary(tmp_path, 2), "forward steps")


# One host thread (tid 1) in its event loop: gemm runs 0-100, its next kernel is launched through the
# driver API (as Triton does) at 500 and runs 600-700: 400 us of the 500 us gap are host work, in
# prepare() (200 us its own) and pack() (100 us) and the loop's own 100 us. attn was launched at 650,
# before its gap (700-900) began: a wait on something else. Thread 2 waits all along.
GAPS = [
    {**kernel("gemm", 0, 100), "args": {"correlation": 1}},
    host("cuda_runtime", "cudaLaunchKernel", -30, 5, correlation=1),
    {**kernel("norm", 600, 100), "args": {"correlation": 2}},
    host("cuda_driver", "cuLaunchKernel", 500, 5, correlation=2),
    {**kernel("attn", 900, 50), "args": {"correlation": 3}},
    host("cuda_runtime", "cudaLaunchKernel", 650, 5, correlation=3),
    host("python_function", "loop.py(1): event_loop", -50, 1000),
    host("python_function", "worker.py(5): prepare", 150, 300),
    host("python_function", "worker.py(9): pack", 200, 100),
    host("python_function", "threading.py(300): wait", 0, 1000, tid=2),
]


def test_python_self_time_while_the_gpu_idled_is_the_launching_threads_before_the_launch(tmp_path: Path) -> None:
    write_trace(tmp_path, GAPS)
    out = summary(tmp_path, 1)
    idled = section(out, "Python functions while the GPU idled >= 100 us (host, exclusive)")
    assert idled.startswith(": 3.0 per step, 400 us per step\n")
    assert "(2 gaps, 700 us per step idle: 400 before the launch of the kernel after the gap" in idled
    assert "300 after it)" in idled
    assert "    200.0 us x  1.00  worker.py(5): prepare" in idled
    assert (
        "    100.0 us x  1.00  worker.py(9): pack" in idled and "    100.0 us x  1.00  loop.py(1): event_loop" in idled
    )
    assert "threading.py" not in idled  # another thread's time: not what the GPU waited on
    # Over the whole trace, each frame's own time; the inclusive table keeps what the children took.
    whole = section(out, "Python functions (host, exclusive)")
    assert "   1000.0 us x  1.00  threading.py(300): wait" in whole
    assert "    700.0 us x  1.00  loop.py(1): event_loop" in whole
    assert "    300.0 us x  1.00  worker.py(5): prepare" in section(out, "Python functions (host, inclusive)")


def test_driver_api_launches_give_triton_kernels_a_host_window(tmp_path: Path) -> None:
    write_trace(tmp_path, GAPS)
    out = summary(tmp_path, 1)
    assert "      5.0 us x  1.00  cuLaunchKernel" in section(out, "CUDA driver calls (host)")
    first_gap = section(out, "longest idle gaps").split("200 us at")[0]
    assert "500 us at     0.10 ms  gemm -> norm" in first_gap
    assert "host 530 us between the two launches:" in first_gap and "300 us  worker.py(5): prepare" in first_gap


def test_a_kernel_without_its_launch_gets_no_host_window_and_its_whole_gap_is_shared_out(tmp_path: Path) -> None:
    """The control: the same trace with norm's launch not in a launch category."""
    write_trace(tmp_path, [{**e, "cat": "other"} if e["name"] == "cuLaunchKernel" else e for e in GAPS])
    out = summary(tmp_path, 1)
    assert "host 530 us" not in section(out, "longest idle gaps")
    idled = section(out, "Python functions while the GPU idled >= 100 us (host, exclusive)")
    assert "(2 gaps, 700 us per step idle: 500 before the launch" in idled  # 100-600, on the busiest thread
    assert "    200.0 us x  1.00  loop.py(1): event_loop" in idled


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


def test_the_diff_reads_the_new_tables_and_skips_the_step_rows(tmp_path: Path) -> None:
    """A summary with the forward steps and the exclusive tables: against itself nothing differs (the
    control), against one whose prepare() took 100 us longer its exclusive table says so."""
    slower = [{**e, "dur": 400} if e["name"] == "worker.py(5): prepare" else e for e in GAPS]
    for name, trace in (("ref", GAPS), ("other", slower)):
        write_trace(tmp_path / name, [*ITERATIONS, WAIT, *trace])
        (tmp_path / f"{name}.txt").write_text(summary(tmp_path / name, 1))
    assert diff(tmp_path / "ref.txt", tmp_path / "ref.txt").splitlines()[1:] == []
    out = diff(tmp_path / "ref.txt", tmp_path / "other.txt")
    assert "forward steps" not in out
    assert "+100.0 |     200.0 x  1.00 |     300.0 x  1.00  worker.py(5): prepare" in section(
        out, "Python functions (host, exclusive)"
    )
