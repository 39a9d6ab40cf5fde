"""auto comparing what each mode makes per second, every period kept: tried in session 51, not built.

docs/design/auto-real-weights.md, "Session 51". ``RateThreshold`` is ``dynspec_auto``'s
``AutoThreshold`` timing every period between two decode starts (a prefill's included, charged to the
iteration before it; a resume's and any over 20 x its bucket's median left out) and comparing the
modes by the mean period, not the median steady one. On the admission simulator (real text's drafts,
a cost per prefill) it closes part of r6's gap on session 50's steps and little on session 48's: the
refills a mode's periods carry are not all that mode's doing. Prints, over 5 seeds, the median of
auto / the best fixed N and how many within 3 %:

1. real text, session 48's steps and session 50's, chances drawn per verify and per request
   (``--own-chance``), prefills of 8, 15 and 27 ms, every output 128 tokens; then 32 - 224 at 15 ms;
2. with ``8b``: the 8B shape at simulated acceptance 2, 3, 4 on both cards' costs, prefills free and
   at 30 ms, 3 seeds (the control: it should change nothing there).

    .venv/bin/python scripts/auto_rate_sim.py [8b]      (about 5 minutes each)
"""

from __future__ import annotations

import statistics
import sys
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import auto_admission_sim as admission  # noqa: E402
import auto_charge_sim as charge  # noqa: E402
from auto_admission_sim import sim  # noqa: E402

from patches.runtime.dynspec_auto import AutoDriver, AutoThreshold, bucket_of  # noqa: E402

GAP = 20.0  # a period this many times its bucket's median: idle, or a burst of admissions
WINDOW = 64  # periods kept per mode and bucket (a refill comes every few while speculating)
SEEDS = 5


class RateThreshold(AutoThreshold):
    def __init__(self, floor: int, ceiling: int) -> None:
        super().__init__(floor, ceiling, window=WINDOW)
        self._before: tuple[int, bool, float, bool] | None = None  # the last iteration: size, mode, start, steady

    def iteration(self, batch_size: int, speculates: bool, started: float, steady: bool = True) -> None:
        self.iterations += 1
        self._recent_sizes.append(batch_size)
        self._speculated_last = speculates
        before, self._before = self._before, (batch_size, speculates, started, steady)
        if before is None or not before[3] or started <= before[2]:
            return
        key = (before[1], bucket_of(before[0]))
        periods = self._seconds.setdefault(key, deque(maxlen=self.window))
        if len(periods) >= 3 and started - before[2] > GAP * statistics.median(periods):
            return
        periods.append(started - before[2])
        self._sampled_at[key] = self.iterations

    def interrupted(self) -> None:
        """A prefill's time stays in the period it falls in."""

    def seconds(self, speculates: bool, bucket: int) -> float | None:
        periods = self._seconds.get((speculates, bucket))
        return statistics.fmean(periods) if periods else None


def rated(server: sim.Simulated) -> sim.Simulated:
    """``server`` (an auto one) with ``RateThreshold`` in place of r6's."""
    server.threshold = RateThreshold(1, 127)
    server.driver = AutoDriver(server.controller, server.threshold, clock=lambda: server.now, log=False)
    return server


if __name__ == "__main__":
    if sys.argv[1:] == ["8b"]:
        for gpu in ("h100", "h200"):
            for acceptance in (2, 3, 4):
                for prefill_ms in (0.0, 30.0):
                    print(charge.eight_b(gpu, acceptance, prefill_ms, seeds=3, swap=rated, name="rate"), flush=True)
    else:
        print(f"real text ({SEEDS} seeds)")
        for steps, table in (("session 48's", dict(admission.STEPS_MS)), ("session 50's", charge.S50_STEPS_MS)):
            admission.STEPS_MS.update(table)
            for own in (False, True):
                for prefill_ms in (8.0, 15.0, 27.0):
                    print(
                        charge.real_text(steps, prefill_ms, False, own=own, seeds=SEEDS, swap=rated, name="rate"),
                        flush=True,
                    )
            print(charge.real_text(steps, 15.0, True, seeds=SEEDS, swap=rated, name="rate"), flush=True)
