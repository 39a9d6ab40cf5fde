from __future__ import annotations

from pathlib import Path

import pytest

from patcher.proof.client import Client
from patcher.proof.logscan import LogFollower
from patcher.proof.ramp import RampSchedule, run_ramp


def test_waves_alternate_low_and_high_with_fresh_prompts():
    schedule = RampSchedule(1, 64, 16, max_waves=6, max_seconds=60)
    waves = list(schedule.waves(lambda: False))
    assert [w.concurrency for w in waves] == [1, 64, 1, 64, 1, 64]
    assert all(w.new_tokens == 16 for w in waves)
    prompts = [p for w in waves for p in w.prompts]
    assert len(prompts) == len(set(prompts)) == 3 * 65
    assert schedule.stop_reason == "wave cap (6) reached"


def test_the_schedule_stops_when_done_and_at_its_time_cap():
    calls = iter([False, False, True])
    schedule = RampSchedule(1, 8, 4, max_waves=100, max_seconds=60)
    assert len(list(schedule.waves(lambda: next(calls)))) == 2
    assert schedule.stop_reason == "target reached"

    now = [0.0]
    timed = RampSchedule(1, 8, 4, max_waves=100, max_seconds=10, clock=lambda: now[0])
    count = 0
    for _ in timed.waves(lambda: False):
        count += 1
        now[0] += 4
    assert count == 3 and timed.stop_reason == "time cap (10 s) reached"


def test_low_must_be_below_high():
    with pytest.raises(ValueError, match="low < high"):
        RampSchedule(8, 8, 4, 10, 10)


class LogToFile:
    """Points the in-thread fake's switch lines at a log file, as the real server's stdout."""

    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        from . import fake_sglang

        def log(message: str) -> None:
            with path.open("a") as f:
                f.write(f"[x TP0] {message}\n")

        monkeypatch.setattr(fake_sglang, "log", log)


def test_the_ramp_runs_until_enough_switches_both_ways(fake_server, tmp_path, monkeypatch):
    log = tmp_path / "dynspec.log"
    log.write_text("")
    LogToFile(log, monkeypatch)
    port, state = fake_server(disable=4, delay=0.05)
    follower = LogFollower(log)
    schedule = RampSchedule(1, 8, 4, max_waves=100, max_seconds=60)
    result = run_ramp(Client("127.0.0.1", port), schedule, follower, target=10, settle=0, sleep=lambda s: None)
    assert result.stop_reason == "target reached"
    assert len(follower.transitions) >= 10 and follower.off >= 5 and follower.on >= 5
    assert result.waves < 100 and result.waves >= 10
    assert result.requests == result.ok == state.generates
    assert result.failures == []


def test_the_ramp_stops_after_the_first_wave_with_a_failed_request(fake_server, tmp_path, monkeypatch):
    log = tmp_path / "dynspec.log"
    log.write_text("")
    LogToFile(log, monkeypatch)
    port, _ = fake_server(disable=4, faults="http500", delay=0.01)
    schedule = RampSchedule(1, 8, 4, max_waves=100, max_seconds=60)
    result = run_ramp(
        Client("127.0.0.1", port), schedule, LogFollower(log), target=1000, settle=0, sleep=lambda s: None
    )
    assert result.stop_reason == "a request failed"
    assert result.waves == 2  # the 5th request is in the second wave (1 + 8)
    assert result.failures and "HTTP 500" in result.failures[0]
    assert result.ok == result.requests - len(result.failures)
