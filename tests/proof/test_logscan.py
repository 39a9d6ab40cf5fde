from __future__ import annotations

from pathlib import Path

from patcher.proof.logscan import (
    AutoDecision,
    LogFollower,
    auto_decisions,
    kv_pool_tokens,
    read_window,
    scan,
    scan_file,
    tail,
)
from patches.runtime.dynspec_auto import Decision, Thresholds
from patches.runtime.dynspec_runtime import SWITCH_LOG

LOG = """\
[2026-11-29 12:00:00] server_args=ServerArgs(model_path='/m/target', log_level='info')
[2026-11-29 12:00:01] Ignore import error when loading sglang.srt.models.x: ModuleNotFoundError: No module named 'y'
[2026-11-29 12:00:09 TP0] Decode batch. #running-req: 1, #token: 40, gen throughput (token/s): 99.0
INFO:     127.0.0.1:5000 - "POST /generate HTTP/1.1" 200 OK
[2026-11-29 12:00:10 TP0] dynspec: speculation OFF at batch size 64
[2026-11-29 12:00:11 TP0] dynspec: speculation ON at batch size 1
[2026-11-29 12:00:12 TP0] dynspec: speculation OFF at batch size 40
"""


def test_switch_lines_are_counted_with_direction_size_and_line():
    result = scan(LOG)
    assert [(t.direction, t.batch_size, t.line) for t in result.transitions] == [
        ("OFF", 64, 5),
        ("ON", 1, 6),
        ("OFF", 40, 7),
    ]
    assert (result.count, result.off, result.on) == (3, 2, 1)


def test_the_thresholds_in_force_are_read_from_the_runtimes_own_switch_line():
    line = SWITCH_LOG.format(state="OFF", batch_size=64, off=52, on=44)
    (t,) = scan(f"[2026-12-05 04:48:59 TP0] {line}\n", first_line=9).transitions
    assert (t.direction, t.batch_size, t.line, t.off_above, t.on_at_most) == ("OFF", 64, 9, 52, 44)
    assert t.against_its_thresholds() is None
    # lines of the runtime's first revisions name none, and nothing is judged against them
    assert [(t.off_above, t.on_at_most, t.against_its_thresholds()) for t in scan(LOG).transitions] == [
        (None, None, None)
    ] * 3


def test_a_switch_its_own_thresholds_do_not_allow_is_named():
    off, on = (SWITCH_LOG.format(state=state, batch_size=44, off=44, on=40) for state in ("OFF", "ON"))
    wrong_off, wrong_on = scan(f"{off}\n{on}\n").transitions
    assert wrong_off.against_its_thresholds() == "line 1: OFF at batch size 44, not above 44"
    assert wrong_on.against_its_thresholds() == "line 2: ON at batch size 44, above 40"
    right_off, right_on = scan(off.replace("size 44", "size 45") + "\n" + on.replace("size 44", "size 40")).transitions
    assert right_off.against_its_thresholds() is None and right_on.against_its_thresholds() is None


def test_a_clean_log_has_no_errors():
    # the benign import warning, a decode log line, a 200 access line and switch lines
    assert scan(LOG).errors == []
    refused = 'INFO:     127.0.0.1:1 - "POST /flush_cache HTTP/1.1" 400 Bad Request\n'
    assert scan(refused + 'INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 503 Service Unavailable\n').errors == []


def test_the_server_args_dump_is_not_an_error_though_it_names_the_sigquit_handler():
    """Session 34: a server that ran out of memory was reported by its first "error", the start-up
    dump of its arguments (``custom_sigquit_handler=None``), not by the OOM below it."""
    dump = "[x] server_args=ServerArgs(model_path='/m', custom_sigquit_handler=None, crash_dump_folder=None)"
    oom = "[x] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 210.00 MiB."
    errors = scan(f"{dump}\n{oom}\n").errors
    assert [(e.line, e.text) for e in errors] == [(2, oom)]
    assert scan(dump.replace("server_args=ServerArgs(", "args: ")).errors  # the control: the words alone are one


def test_a_traceback_is_one_error_naming_its_exception():
    text = (
        "[x TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/s/scheduler.py", line 10, in event_loop\n'
        "    self.run()\n"
        "RuntimeError: The size of tensor a (160) must match the size of tensor b (2)\n"
        "[x] next line\n"
    )
    errors = scan(text, first_line=41).errors
    assert len(errors) == 1
    assert errors[0].line == 41
    assert errors[0].text.endswith("RuntimeError: The size of tensor a (160) must match the size of tensor b (2)")


def test_error_lines_of_every_kind_are_found():
    lines = [
        "[x TP0] CUDA error: an illegal memory access was encountered",
        "ERROR:    Exception in ASGI application",
        'INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 500 Internal Server Error',
        "[x] Received sigquit from a child process. It usually means the child failed.",
        "[x TP0] token_to_kv_pool_allocator memory leak detected!",
        "[x TP0] torch.OutOfMemoryError: CUDA out of memory.",
        "AssertionError",
    ]
    errors = scan("\n".join(lines)).errors
    assert [e.line for e in errors] == [1, 2, 3, 4, 5, 6, 7]


def test_windows_are_byte_ranges_with_their_line_numbers(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    log.write_text(LOG)
    start = LOG.index("[2026-11-29 12:00:11")
    text, first = read_window(log, start)
    assert first == 6 and text.startswith("[2026-11-29 12:00:11")
    result = scan_file(log, start)
    assert [(t.direction, t.line) for t in result.transitions] == [("ON", 6), ("OFF", 7)]
    assert scan_file(log, 0, start).count == 1
    assert tail(log, 1) == LOG.splitlines()[-1]
    assert scan_file(tmp_path / "missing.log").count == 0


def test_the_follower_reads_only_whole_new_lines(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    log.write_text("[x] dynspec: speculation OFF at batch size 9\n")
    follower = LogFollower(log, offset=log.stat().st_size)  # earlier lines are not counted
    assert follower.poll() == []
    with log.open("a") as f:
        f.write("[x] dynspec: speculation ON at batch size 1\n[x] dynspec: speculation OFF at bat")
    assert [(t.direction, t.line) for t in follower.poll()] == [("ON", 2)]
    with log.open("a") as f:
        f.write("ch size 33\n")
    assert [(t.direction, t.batch_size, t.line) for t in follower.poll()] == [("OFF", 33, 3)]
    assert (follower.off, follower.on) == (1, 1)


def test_the_kv_pool_is_read_from_sglangs_start_up_line():
    """The line as 0.5.17 wrote it in session 32 (two servers of one call); the last one counts."""
    line = (
        "[2026-12-06 04:29:06] max_total_num_tokens={}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        "max_running_requests=128, context_len=8192, available_gpu_mem=9.28 GB"
    )
    assert kv_pool_tokens(line.format(131072)) == 131072
    assert kv_pool_tokens(line.format(131072) + "\n" + line.format(44032)) == 44032
    assert kv_pool_tokens("The server is fired up and ready to roll!") is None  # the control


def test_auto_decisions_are_read_from_the_runtimes_own_line() -> None:
    """The harness reads auto's threshold changes in the format the runtime writes them
    (``Decision.describe``), with SGLang's prefix; a decision made before any verify was timed
    says its acceptance is unknown."""
    settled = Decision(Thresholds(63, 56), 32, "estimated", 3.0, ((16, 1.5), (64, 0.99)))
    early = Decision(Thresholds(127, 127), 32, "speculating until both modes are timed", None, ())
    text = "\n".join(f"[2026-12-06 06:31:22] {d.describe()}" for d in (early, settled)) + "\n"
    assert auto_decisions(text) == [
        AutoDecision(127, 127, "speculating until both modes are timed", None),
        AutoDecision(63, 56, "estimated", 3.0),
    ]
    # the controls: a switch line and a line without auto's estimates are not decisions
    other = (
        "dynspec: speculation OFF at batch size 64 (off above 63, on at or below 56)\n"
        "dynspec auto: off above 48, on at or below 40 (as timed)\n"
    )
    assert auto_decisions(other) == []


# Session 38's v1 dynspec server (0.5.12), the line and the two around it, as SGLang wrote them
GC_LOG = """\
[2026-12-06 17:15:50] dynspec: speculation ON at batch size 96 (off above 96, on at or below 96)
[2026-12-06 17:15:50] LONG GARBAGE COLLECTION DETECTED | Generation 2 | Duration: 0.4592s | # Objects: gen0=0, gen1=0, gen2=762126 | This may cause latency jitter. Consider calling the freeze_gc API after sending a few warmup requests.
[2026-12-06 17:15:50] Freezing GC in scheduler process. gen0: 120->0, gen1: 40->0, gen2: 9000->0
"""


def test_long_collections_are_read_from_sglangs_line_and_are_no_error() -> None:
    result = scan(GC_LOG, first_line=1065)
    assert [c.entry() for c in result.collections] == [{"line": 1066, "generation": 2, "seconds": 0.4592}]
    assert result.errors == [] and result.count == 1
    # control: the freeze line and a log without the warning hold none
    assert scan(GC_LOG.splitlines()[2]).collections == [] and scan(LOG).collections == []
