"""The crossing ramp: alternate waves of low and high concurrency inside one server lifetime.

Each wave is sent whole and awaited before the next, so the decode batch goes from ``low`` up
past the threshold to ``high`` and back, two switches per pair of waves. The ramp stops as
soon as the log shows enough switches both ways, or at a cap on waves or time, or after the
first wave with a failed request (a server that fell over would only time out from then on).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from patcher.proof.client import Client, run_level
from patcher.proof.logscan import LogFollower

FIRST_RAMP_PROMPT = 100_000  # ramp prompts differ from the equivalence prompts and between waves


@dataclass(frozen=True)
class Wave:
    index: int
    concurrency: int
    new_tokens: int
    first_prompt: int

    @property
    def prompts(self) -> range:
        return range(self.first_prompt, self.first_prompt + self.concurrency)


class RampSchedule:
    """Waves low, high, low, high, ... until ``done()`` is true, ``max_waves`` or ``max_seconds``."""

    def __init__(
        self,
        low: int,
        high: int,
        new_tokens: int,
        max_waves: int,
        max_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < low < high:
            raise ValueError(f"need 0 < low < high, got {low}, {high}")
        self.low, self.high, self.new_tokens = low, high, new_tokens
        self.max_waves, self.max_seconds, self.clock = max_waves, max_seconds, clock
        self.stop_reason = ""

    def waves(self, done: Callable[[], bool]) -> Iterator[Wave]:
        start = self.clock()
        index = 0
        first = FIRST_RAMP_PROMPT
        while True:
            if done():
                self.stop_reason = "target reached"
                return
            if index >= self.max_waves:
                self.stop_reason = f"wave cap ({self.max_waves}) reached"
                return
            if self.clock() - start >= self.max_seconds:
                self.stop_reason = f"time cap ({self.max_seconds:g} s) reached"
                return
            concurrency = self.low if index % 2 == 0 else self.high
            yield Wave(index, concurrency, self.new_tokens, first)
            first += concurrency
            index += 1


@dataclass
class RampResult:
    waves: int = 0
    requests: int = 0
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    stop_reason: str = ""


def run_ramp(
    client: Client,
    schedule: RampSchedule,
    follower: LogFollower,
    target: int,
    settle: float = 0.5,
    progress: Callable[[str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> RampResult:
    """Run the waves of ``schedule``; ``follower`` counts switches as the server logs them."""
    result = RampResult()
    stopped_on_failure = False

    def done() -> bool:
        nonlocal stopped_on_failure
        if result.failures:
            stopped_on_failure = True
            return True
        follower.poll()
        return len(follower.transitions) >= target and follower.off > 0 and follower.on > 0

    start = time.perf_counter()
    for wave in schedule.waves(done):
        level = run_level(client, wave.prompts, wave.new_tokens)
        result.waves += 1
        result.requests += len(level.replies)
        result.ok += sum(r.error is None for r in level.replies)
        result.failures.extend(f"wave {wave.index} (C={wave.concurrency}) {f}" for f in level.failures)
        if progress and (wave.index % 20 == 19 or level.failures):
            progress(
                f"ramp: {result.waves} waves, {len(follower.transitions)} switches so far "
                f"({follower.off} OFF / {follower.on} ON), {len(result.failures)} failed requests"
            )
    result.seconds = time.perf_counter() - start
    result.stop_reason = "a request failed" if stopped_on_failure else schedule.stop_reason
    sleep(settle)  # the scheduler may log the last switch just after the last reply
    follower.poll()
    return result
