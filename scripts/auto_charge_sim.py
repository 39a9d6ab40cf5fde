"""auto charged for the prefills after each mode's steps: tried in session 50, not built.

docs/design/auto-real-weights.md, "Session 50". ``ChargedThreshold`` is ``dynspec_auto``'s
``AutoThreshold`` that also keeps, per mode and batch-size bucket, the prefill time that followed
that mode's iterations (the two periods after ``interrupted()`` beyond their bucket's median step)
per token they emitted, and adds it to each mode's cost per token where both modes have one there.
On session 50's real-weights run the refills followed the history, not the mode (auto's own
falling-back intervals at 33 - 64 ran more prefills than its speculating ones), so this would have
charged the fallback there; the simulator, whose refills follow the mode, likes it. Prints:

1. real text (each request's own chance), session 48's steps and session 50's (a cheaper speculative
   step at 64 and 128), every output 128 tokens, then 32 - 224: auto r6 and charged, against the best
   fixed N (medians over 10 seeds, how many within 3 %);
2. the 8B shape at simulated acceptance 2, 3, 4 on both cards' costs, prefills free and at 30 ms: the
   same over 5 seeds (the control: with every request alike the charge should change nothing).

    .venv/bin/python scripts/auto_charge_sim.py      (about 40 s)
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import auto_admission_sim as admission  # noqa: E402
from auto_admission_sim import sim  # noqa: E402

from patches.runtime.dynspec_auto import BUCKETS, AutoDriver, AutoThreshold, bucket_of  # noqa: E402
from patches.runtime.dynspec_settings import AUTO  # noqa: E402

# Session 50's steps, ms by batch size. Speculative: always-on's steady steps at 1 - 16, at 64 its one
# interval without a prefill, at 128 a guess (it had none). The fallback: N = 8's steady steps at 16 - 128,
# below that guessed alike.
S50_STEPS_MS = {
    True: {1: 2.95, 4: 2.9, 16: 3.15, 64: 4.0, 128: 5.5},
    False: {1: 2.1, 4: 2.06, 16: 2.06, 64: 2.4, 128: 2.9},
}
LEDGER_TOKENS = 4096  # each (mode, bucket) keeps about this many tokens' worth of charge
MIN_TOKENS = 512  # a charge with fewer tokens behind it is not compared


class ChargedThreshold(AutoThreshold):
    def __init__(self, floor: int, ceiling: int) -> None:
        super().__init__(floor, ceiling)
        self.ledger: dict[tuple[bool, int], list[float]] = defaultdict(lambda: [0.0, 0.0])  # [seconds, tokens]
        self._after_prefill = 0  # periods left to charge
        self._last: tuple[int, bool, float] | None = None

    def interrupted(self) -> None:
        super().interrupted()
        self._after_prefill = 2  # under the overlap scheduler a prefill lands in one of the next two

    def iteration(self, batch_size: int, speculates: bool, started: float, steady: bool = True) -> None:
        if self._last is not None:
            size, speculated, then = self._last
            key = (speculated, bucket_of(size))
            seconds, tokens = self.ledger[key]
            emitted = size * ((self.acceptance or 1.0) if speculated else 1.0)
            keep = min(1.0, max(LEDGER_TOKENS - emitted, 0.0) / tokens) if tokens else 1.0
            seconds, tokens = seconds * keep, tokens * keep + emitted
            step = self.seconds(speculated, key[1])
            if self._after_prefill and step is not None:
                seconds += max(started - then - step, 0.0)
            self.ledger[key] = [seconds, tokens]
        self._after_prefill = max(self._after_prefill - 1, 0)
        self._last = (batch_size, speculates, started)
        super().iteration(batch_size, speculates, started, steady)

    def charge(self, speculates: bool, bucket: int) -> float | None:
        seconds, tokens = self.ledger.get((speculates, bucket), (0.0, 0.0))
        return seconds / tokens if tokens >= MIN_TOKENS else None

    def gains(self) -> list[tuple[int, float]]:
        if self.acceptance is None:
            return []
        out = []
        for bucket in BUCKETS:
            spec, fallback = self.seconds(True, bucket), self.seconds(False, bucket)
            if spec is None or fallback is None:
                continue
            charges = self.charge(True, bucket), self.charge(False, bucket)
            on, off = (0.0, 0.0) if None in charges else charges  # one mode without a charge: neither has one
            out.append((bucket, (fallback / bucket + off) / (spec / (bucket * self.acceptance) + on)))  # type: ignore[operator]
        return out


def charged(server: sim.Simulated) -> sim.Simulated:
    """``server`` (an auto one) with ``ChargedThreshold`` in place of r6's."""
    server.threshold = ChargedThreshold(1, 127)
    server.driver = AutoDriver(server.controller, server.threshold, clock=lambda: server.now, log=False)
    return server


def timed(server: sim.Simulated) -> float:
    server.mixed()  # the warm-up pass
    return statistics.median(server.mixed() for _ in range(2))


def line(label: str, r6: list[float], ours: list[float], name: str = "charged") -> str:
    def say(ratios: list[float]) -> str:
        return f"{statistics.median(ratios):.3f}x ({sum(r <= 1.03 for r in ratios)} of {len(ratios)} within 3 %)"

    return f"  {label}: r6 {say(r6)}, {name} {say(ours)}"


class Prefilling(sim.Simulated):
    """The 8B simulator with a cost per prefill."""

    prefill_ms = 0.0

    def prefill_seconds(self, requests: int) -> float:
        return self.prefill_ms / 1000


def real_text(
    steps: str,
    prefill_ms: float,
    staggered: bool,
    *,
    own: bool = True,
    seeds: int = admission.SEEDS,
    swap: Callable[[sim.Simulated], sim.Simulated] = charged,
    name: str = "charged",
) -> str:
    """Auto r6 and auto with ``swap``'s threshold against the best fixed N on real text, each request
    with its own chance (``own``) or one drawn at every verify."""
    r6, ours = [], []
    for seed in range(seeds):
        best = min(timed(admission.server(n, seed, prefill_ms, staggered, own)) for n in sim.SWEEP)
        r6.append(timed(admission.server(AUTO, seed, prefill_ms, staggered, own)) / best)
        ours.append(timed(swap(admission.server(AUTO, seed, prefill_ms, staggered, own))) / best)
    lengths = "32 - 224 tokens" if staggered else "128 tokens"
    chance = "" if own else ", a chance per verify"
    return line(f"{steps} steps, {lengths}{chance}, prefill {prefill_ms:g} ms", r6, ours, name)


def eight_b(
    gpu: str,
    acceptance: int,
    prefill_ms: float,
    *,
    seeds: int = 5,
    swap: Callable[[sim.Simulated], sim.Simulated] = charged,
    name: str = "charged",
) -> str:
    """The same on the 8B shape at a simulated acceptance, with a cost per prefill."""

    def made(n: int | str, seed: int) -> Prefilling:
        server = Prefilling(n, acceptance, seed=seed, gpu=gpu)
        server.prefill_ms = prefill_ms
        return server

    r6, ours = [], []
    for seed in range(seeds):
        best = min(timed(made(n, seed)) for n in sim.SWEEP)
        r6.append(timed(made(AUTO, seed)) / best)
        ours.append(timed(swap(made(AUTO, seed))) / best)
    return line(f"8B, {gpu}, acceptance {acceptance}, prefill {prefill_ms:g} ms", r6, ours, name)


if __name__ == "__main__":
    print("real text, each request's own chance (10 seeds)")
    for steps, table in (("session 48's", dict(admission.STEPS_MS)), ("session 50's", S50_STEPS_MS)):
        admission.STEPS_MS.update(table)
        for staggered in (False, True):
            for prefill_ms in (8.0, 15.0):
                print(real_text(steps, prefill_ms, staggered), flush=True)
    print("8B shape, simulated acceptance (5 seeds; the control)")
    for gpu in ("h100", "h200"):
        for acceptance in (2, 3, 4):
            for prefill_ms in (0.0, 30.0):
                print(eight_b(gpu, acceptance, prefill_ms), flush=True)
