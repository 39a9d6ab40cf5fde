"""dynspec auto threshold: the switch point a server finds from its own timings.

For ``--speculative-disable-batch-size auto``. The switch controller tells ``AutoThreshold``
the batch size and mode of every decode iteration, with the time it started, and the verify's
acceptance while speculating; every ``every`` iterations it asks for the two thresholds it then
applies exactly as it applies fixed ones (off above one, on at or below the other, with its
dwell). So a fixed N needs none of this, and the decision on each tensor-parallel rank is the
one rank 0 made: only ``Thresholds`` cross ranks, at the same iteration on every rank.

The rule. A speculative iteration at batch size b emits ``acceptance`` tokens per request, a
fallback iteration one, so speculation pays while ``acceptance * t_fallback(b) > t_speculate(b)``.
``gain(b)`` is that ratio: the predicted tokens/s of speculation over the fallback's. Speculation
goes off above the largest size up to which it never loses, and comes back on at or below the
largest size up to which it always wins by ``margin``: the gap between the two (a few requests
where the gain falls steeply), the controller's dwell and the medians below keep a batch that
wanders near the switch point, or noisy timings, from switching back and forth.

The estimates. Per batch-size bucket and mode, the median of the last ``window`` steady periods
(from one iteration's start to the next's, when the last three iterations ran the same size and
mode: under the overlap scheduler that period is the GPU time of the iteration before it). Only buckets where both modes have run are compared: between two, the
switch point is where the straight line through their gains crosses the level; no cost is guessed
for a size neither mode has run at. The acceptance is an EMA of accepted drafts + 1 per verify,
kept while speculation is off. Where the batch has run lately with no sample of the other mode,
or only one older than ``stale_after`` iterations, the next period is a probe: the thresholds
move just past that size for ``probe_iterations`` iterations, so that the controller runs the
other mode there and measures it. Until then it speculates wherever it may.

Pure Python, no torch or SGLang: run and tested anywhere.
"""

from __future__ import annotations

import bisect
import logging
import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Deque, Dict, List, Optional, Protocol, Sequence, Tuple

logger = logging.getLogger(__name__)

# Batch-size buckets: CUDA graphs pad a batch to the next captured size, so nearby sizes cost alike.
BUCKETS: Tuple[int, ...] = (
    1,
    2,
    4,
    8,
    12,
    16,
    24,
    32,
    40,
    48,
    56,
    64,
    80,
    96,
    112,
    128,
    160,
    192,
    256,
    384,
    512,
    768,
    1024,
)


def bucket_of(batch_size: int) -> int:
    """The smallest bucket that holds ``batch_size`` (the largest bucket beyond it)."""
    i = bisect.bisect_left(BUCKETS, batch_size)
    return BUCKETS[min(i, len(BUCKETS) - 1)]


@dataclass(frozen=True)
class Thresholds:
    """What the switch controller applies: off above ``disable_above``, on at or below ``enable_at_or_below``."""

    disable_above: int
    enable_at_or_below: int


@dataclass(frozen=True)
class Decision:
    """One answer of ``AutoThreshold.decide``: the thresholds for the next ``iterations`` decode
    iterations, and what they came from (for the log line and the metrics)."""

    thresholds: Thresholds
    iterations: int
    reason: str  # "estimated", "probe ...", or why the estimates cannot decide yet
    acceptance: Optional[float]
    gains: Tuple[Tuple[int, float], ...]  # (bucket, predicted speculative / fallback tokens/s)

    def describe(self) -> str:
        accept = "unknown" if self.acceptance is None else f"{self.acceptance:.2f}"
        gains = ", ".join(f"{b}: {g:.2f}" for b, g in self.gains) or "none yet"
        return (
            f"dynspec auto: off above {self.thresholds.disable_above}, on at or below "
            f"{self.thresholds.enable_at_or_below} ({self.reason}; acceptance {accept}; "
            f"speculative / fallback tokens/s by batch size {gains})"
        )


class AutoThreshold:
    """Estimates and decides; see the module docstring. All sizes are batch sizes (requests)."""

    def __init__(
        self,
        floor: int,
        ceiling: int,
        *,
        margin: float = 0.1,
        every: int = 32,
        window: int = 16,
        acceptance_weight: float = 0.1,
        stale_after: int = 4096,
        probe_iterations: int = 16,
    ) -> None:
        if not 1 <= floor <= ceiling:
            raise ValueError(f"auto needs 1 <= floor ({floor}) <= ceiling ({ceiling})")
        if not 0 <= margin < 1:
            raise ValueError(f"auto's margin must be in [0, 1), not {margin}")
        self.floor = floor
        self.ceiling = ceiling
        self.margin = margin
        self.every = every
        self.window = window
        self.acceptance_weight = acceptance_weight
        self.stale_after = stale_after
        self.probe_iterations = probe_iterations
        # Until the timings can decide: speculate wherever it may, so that the first
        # probes, not a guess, place the switch.
        self.thresholds = Thresholds(ceiling, ceiling)
        self.acceptance: Optional[float] = None
        self.iterations = 0
        self._seconds: Dict[Tuple[bool, int], Deque[float]] = {}
        self._sampled_at: Dict[Tuple[bool, int], int] = {}  # the iteration of each bucket's latest sample
        # The last two iterations (batch size, speculated, start), cleared by anything unsteady.
        self._previous: Deque[Tuple[int, bool, float]] = deque(maxlen=2)
        self._recent_sizes: Deque[int] = deque(maxlen=every)
        self._speculated_last = True
        self._settled = self.thresholds  # the last estimated thresholds (a probe's end returns to them)

    # -- what the controller reports ------------------------------------------------------------

    def iteration(self, batch_size: int, speculates: bool, started: float, steady: bool = True) -> None:
        """A decode iteration of ``batch_size`` requests starts at ``started`` (seconds, monotonic).

        Under the overlap scheduler an iteration is launched before the previous one's result is
        waited for, so the time between two starts is the GPU time of the iteration before them.
        It counts as a step of this size and mode only when the last three iterations all ran it and
        were ``steady`` (the controller passes False for a ``RESUME``, which runs the full draft
        extend); without overlap this only drops one sample more."""
        self.iterations += 1
        self._recent_sizes.append(batch_size)
        self._speculated_last = speculates
        if not steady:
            self._previous.clear()
            return
        if len(self._previous) == 2 and all(
            size == batch_size and spec == speculates for size, spec, _ in self._previous
        ):
            then = self._previous[-1][2]
            if started > then:
                key = (speculates, bucket_of(batch_size))
                self._seconds.setdefault(key, deque(maxlen=self.window)).append(started - then)
                self._sampled_at[key] = self.iterations
        self._previous.append((batch_size, speculates, started))

    def interrupted(self) -> None:
        """Something other than a decode ran since the last iteration (a prefill): the periods it
        overlaps (the next two, under the overlap scheduler) are not steps."""
        self._previous.clear()

    def verified(self, accepted_drafts: Sequence[int]) -> None:
        """A speculative verify's accepted drafts per request (the bonus token not counted)."""
        if not accepted_drafts:
            return
        per_verify = 1.0 + sum(accepted_drafts) / len(accepted_drafts)
        if self.acceptance is None:
            self.acceptance = per_verify
        else:
            self.acceptance += self.acceptance_weight * (per_verify - self.acceptance)

    # -- what it answers -------------------------------------------------------------------------

    def seconds(self, speculates: bool, bucket: int) -> Optional[float]:
        """The median measured cost of a steady iteration in this bucket and mode, or None."""
        samples = self._seconds.get((speculates, bucket))
        return statistics.median(samples) if samples else None

    def gains(self) -> List[Tuple[int, float]]:
        """(bucket, measured speculative / fallback tokens/s), ascending, where both modes have run."""
        if self.acceptance is None:
            return []
        out = []
        for bucket in BUCKETS:
            spec, fallback = self.seconds(True, bucket), self.seconds(False, bucket)
            if spec is not None and fallback is not None:
                out.append((bucket, self.acceptance * fallback / spec))
        return out

    def decide(self) -> Decision:
        """The thresholds for the next period, and how many iterations it lasts."""
        gains = self.gains()
        probe = self._probe()
        if probe is not None:
            return self._adopt(Decision(probe[0], self.probe_iterations, probe[1], self.acceptance, tuple(gains)))
        if not gains:  # after a probe too: back to what was settled, not the probe's thresholds
            why = "no acceptance yet" if self.acceptance is None else "no timings of both modes yet"
            return self._adopt(Decision(self._settled, self.every, why, self.acceptance, ()))
        self._settled = self._from_gains(gains)
        return self._adopt(Decision(self._settled, self.every, "estimated", self.acceptance, tuple(gains)))

    def _from_gains(self, gains: List[Tuple[int, float]]) -> Thresholds:
        disable = self._crossing(gains, 1.0)
        enable = self._crossing(gains, 1.0 + self.margin)
        disable = min(max(disable, self.floor), self.ceiling)
        return Thresholds(disable, min(max(enable, self.floor), disable))

    def _crossing(self, gains: List[Tuple[int, float]], level: float) -> int:
        """The largest batch size up to which the measured gain stays at or above ``level``: between
        two measured buckets, where the straight line through their gains crosses it; beyond the
        largest measured bucket, the ceiling (a probe measures the sizes the batch reaches there)."""
        below = 0
        for bucket, gain in gains:
            if gain < level:
                if below == 0:
                    return 0
                lower, lower_gain = below, dict(gains)[below]
                return int(lower + (bucket - lower) * (lower_gain - level) / (lower_gain - gain))
            below = bucket
        return self.ceiling

    def _probe(self) -> Optional[Tuple[Thresholds, str]]:
        """Thresholds that make the controller run, at the size the batch has run at lately, the
        mode it does not run there, when that mode's estimate there is missing or stale."""
        if not self._recent_sizes or self.acceptance is None:
            return None
        size = int(statistics.median(self._recent_sizes))
        bucket = bucket_of(size)
        other = not self._speculated_last  # the mode the controller is not running now (hysteresis included)
        sampled = self._sampled_at.get((other, bucket))
        if sampled is not None and self.iterations - sampled < self.stale_after:
            return None
        if other and size > self.ceiling:
            return None  # speculation cannot run there
        if not other and size <= self.floor:
            return None  # the fallback may not run there
        if other:  # speculate at this size for a while
            return Thresholds(size, size), f"probe: speculation at {size}"
        below = max(self.floor, size - 1)
        return Thresholds(below, min(below, self.thresholds.enable_at_or_below)), f"probe: the fallback at {size}"

    def _adopt(self, decision: Decision) -> Decision:
        self.thresholds = decision.thresholds
        return decision


class Controller(Protocol):
    """What ``AutoDriver`` needs of the runtime's ``SwitchController``."""

    SPECULATE: str
    RESUME: str
    disable_above: int
    enable_at_or_below: int

    def step(self, batch_size: int) -> str: ...


# Rank 0's (thresholds, iterations) handed to every tensor-parallel rank: called on every rank at
# the same iteration, with rank 0's decision there and None elsewhere; it returns rank 0's.
Share = Callable[[Optional[Tuple[Thresholds, int]]], Tuple[Thresholds, int]]


class AutoDriver:
    """Runs a switch controller on ``AutoThreshold``'s thresholds: ``step`` stands in for the
    controller's, once per decode iteration, on every rank in the same order."""

    def __init__(
        self,
        controller: Controller,
        auto: AutoThreshold,
        *,
        rank0: bool = True,
        share: Optional[Share] = None,
        clock: Callable[[], float] = time.perf_counter,
        log: bool = True,
    ) -> None:
        self.controller = controller
        self.auto = auto
        self.rank0 = rank0
        self.share = share
        self.clock = clock
        self.log = log
        self._left = 0
        self._apply(auto.thresholds)

    def step(self, batch_size: int) -> str:
        started = self.clock()  # before a decision's broadcast, which is not the step's
        if self._left <= 0:
            self._next_period()
        self._left -= 1
        step = self.controller.step(batch_size)
        self.auto.iteration(
            batch_size, step == self.controller.SPECULATE, started, steady=step != self.controller.RESUME
        )
        return step

    def _next_period(self) -> None:
        decision = self.auto.decide() if self.rank0 or self.share is None else None
        ours = None if decision is None else (decision.thresholds, decision.iterations)
        if self.share is not None:
            thresholds, iterations = self.share(ours)
        else:
            assert ours is not None  # one rank, or every rank on its own (the tests' control)
            thresholds, iterations = ours
        self.auto.thresholds = thresholds  # rank 0's, on every rank
        self._left = iterations
        changed = (thresholds.disable_above, thresholds.enable_at_or_below) != (
            self.controller.disable_above,
            self.controller.enable_at_or_below,
        )
        self._apply(thresholds)
        if decision is not None:
            if self.log and changed:
                logger.info(decision.describe())
            metrics = getattr(self.controller, "metrics", None)  # the runtime's DynspecMetrics, rank 0 only
            if metrics is not None:
                metrics.auto_decision(thresholds.disable_above, thresholds.enable_at_or_below, decision.acceptance)

    def _apply(self, thresholds: Thresholds) -> None:
        self.controller.disable_above = thresholds.disable_above
        self.controller.enable_at_or_below = thresholds.enable_at_or_below
