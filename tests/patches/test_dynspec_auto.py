"""``--speculative-disable-batch-size auto`` (``patches/runtime/dynspec_auto.py``) on recorded timings.

The step costs come from real runs: the decode log lines of 0.5.17's throughput check (always-on's
speculative steps, dynspec's fallback steps, 8B shape, 256 new tokens), session 26's on an H200
and session 33's on an H100, whose crossover lies elsewhere.
A small simulator replays a load through the runtime's own ``SwitchController``, driven by
``AutoDriver`` or by a fixed N, on a clock that advances by those costs (with seeded noise).
"""

from __future__ import annotations

import json
import random
import re
import statistics
import tarfile
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest

from patches.runtime import dynspec_runtime as runtime
from patches.runtime.dynspec_auto import AutoDriver, AutoThreshold, Thresholds, bucket_of
from patches.runtime.dynspec_settings import AUTO, parse_threshold

PROOF = Path(__file__).parents[2] / "docs/proof"
RECORDED = {"h200": PROOF / "0.5.17-v2-s26-r22-tput/logs.tar.xz", "h100": PROOF / "0.5.17-v2-s33-r29-tput/logs.tar.xz"}
DECODE = re.compile(
    r"Decode batch, #running-req: (\d+), .*?(?:accept len: ([\d.]+), .*?)?gen throughput \(token/s\): ([\d.]+)"
)
MIXED = (1, 4, 16, 64, 128, 64, 16, 4, 1)  # the proof's mixed_load phases: 2 x C requests of 128 tokens each
SWEEP = (8, 16, 32, 48, 64, 96)


def steady_ms(log: str, speculative: bool) -> dict[int, float]:
    """Median milliseconds of a steady decode iteration by batch size, from a server's log lines of
    that mode: intervals at the same batch size as the one before, time = tokens / throughput."""
    samples: dict[int, list[float]] = defaultdict(list)
    previous = None
    for size, accept, tput in ((int(b), float(a or 1), float(t)) for b, a, t in DECODE.findall(log)):
        if previous == size and (accept > 1.5) == speculative:
            samples[size].append(1000 * size * accept / tput)
        previous = size
    return {b: statistics.median(v) for b, v in samples.items() if len(v) >= 3 and b in (1, 4, 16, 32, 64, 128)}


@cache
def recorded_ms(gpu: str = "h200") -> dict[bool, dict[int, float]]:
    """Speculation's costs from always-on's log; the fallback's from dynspec's (64 and 128, where it
    ran) and below that from plain decode's, scaled by the fallback's cost over plain decode's at 64."""
    with tarfile.open(RECORDED[gpu]) as tar:
        logs = {n: tar.extractfile(f"{n}-sim.log").read().decode() for n in ("always-on", "dynspec", "base")}  # type: ignore[union-attr]
    fallback, plain = steady_ms(logs["dynspec"], False), steady_ms(logs["base"], False)
    scale = fallback[64] / plain[64]
    return {True: steady_ms(logs["always-on"], True), False: {**{b: ms * scale for b, ms in plain.items()}, **fallback}}


def cost_ms(speculative: bool, size: int, gpu: str = "h200") -> float:
    """Linear between the recorded sizes, flat beyond them."""
    table = recorded_ms(gpu)[speculative]
    sizes = sorted(table)
    if size <= sizes[0] or size >= sizes[-1]:
        return table[sizes[0] if size <= sizes[0] else sizes[-1]]
    lo = max(b for b in sizes if b <= size)
    hi = min(b for b in sizes if b >= size)
    return table[lo] if lo == hi else table[lo] + (table[hi] - table[lo]) * (size - lo) / (hi - lo)


class Simulated:
    """A server's decode loop on a virtual clock: closed-loop phases of ``2 x C`` requests."""

    def __init__(
        self, n: int | str, acceptance: int, *, noise: float = 0.03, seed: int = 0, gpu: str = "h200", **auto: object
    ) -> None:
        self.acceptance = acceptance
        self.gpu = gpu
        self.rng = random.Random(seed)
        self.noise = noise
        self.now = 0.0
        self.controller = runtime.SwitchController(127 if n == AUTO else int(n), min_steps=8, log=False)
        self.threshold: AutoThreshold | None = None
        self.driver: AutoDriver | runtime.SwitchController = self.controller
        if n == AUTO:
            self.threshold = AutoThreshold(1, 127, **auto)  # type: ignore[arg-type]
            self.driver = AutoDriver(self.controller, self.threshold, clock=lambda: self.now, log=False)

    def phase(self, concurrency: int, requests: int, tokens: int = 128) -> float:
        start, pending, running = self.now, requests, []
        while pending or running:
            while pending and len(running) < concurrency:
                running.append(tokens)
                pending -= 1
            step = self.driver.step(len(running))
            speculative = step == runtime.SPECULATE
            ms = cost_ms(speculative, len(running), self.gpu) * (1.15 if step == runtime.RESUME else 1.0)
            self.now += ms / 1000 * (1 + self.rng.gauss(0, self.noise))
            if speculative and self.threshold is not None:
                self.threshold.verified([self.acceptance - 1] * len(running))
            emitted = self.acceptance if speculative else 1
            running = [left - emitted for left in running if left > emitted]
        return self.now - start

    def mixed(self) -> float:
        return sum(self.phase(c, 2 * c) for c in MIXED)


def mixed_seconds(n: int | str, acceptance: int, passes: int = 3, gpu: str = "h200") -> float:
    """The median of ``passes`` mixed loads through one server (as the proof's median of passes)."""
    server = Simulated(n, acceptance, gpu=gpu)
    return statistics.median(server.mixed() for _ in range(passes))


def test_the_recorded_costs_are_the_runs_own() -> None:
    """The tables the simulator replays: speculation's step grows with the batch far faster than
    the fallback's (session 26, 0.5.17, 8B shape)."""
    spec, fallback = recorded_ms()[True], recorded_ms()[False]
    assert sorted(spec) == sorted(fallback) == [1, 4, 16, 32, 64, 128]
    assert 7 < spec[1] < 8 and 35 < spec[128] < 36 and 5.5 < fallback[64] < 6 and 6.5 < fallback[128] < 7
    assert spec[128] / spec[1] > 4 > 1.5 > fallback[128] / fallback[1]


def test_an_h100s_steps_cost_more_and_speculation_pays_further_up() -> None:
    """Session 33's H100 against session 26's H200, same release, shape and load: every step costs
    more, the fallback's relatively more, so speculation's cost per token meets the fallback's at a
    larger batch (at 64: 1.19x the fallback's on the H200, 0.99x on the H100)."""
    h100, h200 = recorded_ms("h100"), recorded_ms("h200")
    assert all(h100[mode][b] > h200[mode][b] for mode in (True, False) for b in h100[mode])
    per_token = {gpu: t[True][64] / 3 / t[False][64] for gpu, t in (("h100", h100), ("h200", h200))}
    assert (round(per_token["h200"], 2), round(per_token["h100"], 2)) == (1.19, 0.99)


@pytest.mark.parametrize(
    ("gpu", "outside_ms"), [("h200", {"always_on": -1, "base": 199}), ("h100", {"always_on": 53, "base": 175})]
)
def test_off_its_steady_steps_a_plain_server_loses_more_than_a_speculative_one(gpu: str, outside_ms: dict) -> None:
    """What auto, timing steady steps only, does not see: a run of 64 requests x 256 tokens takes
    plain decode ~0.2 s more than 255 of its steady steps, always-on ~0 - 50 ms more than its verifies
    (the runs' median end-to-end tok/s against each log's median steady step). Not explained yet;
    it moves the end-to-end crossover above the one the step costs give."""
    report = json.loads((RECORDED[gpu].parent / "report.json").read_text())["throughput"]
    at = report["levels"].index(64)
    with tarfile.open(RECORDED[gpu]) as tar:
        plain = steady_ms(tar.extractfile("base-sim.log").read().decode(), False)[64]  # type: ignore[union-attr]
    steps = {
        "always_on": 255 / report["accept_length"]["always_on"][at] * recorded_ms(gpu)[True][64],
        "base": 255 * plain,
    }
    run_ms = {s: 1000 * 64 * 256 / statistics.median(report["samples"][s][at]) for s in steps}
    assert {s: round(run_ms[s] - steps[s]) for s in steps} == outside_ms
    # the control: dynspec, falling back at 64, loses as plain decode does, not as always-on
    fallback = 1000 * 64 * 256 / statistics.median(report["samples"]["dynspec"][at]) - 255 * recorded_ms(gpu)[False][64]
    assert fallback > 100 > max(outside_ms["always_on"], 0)


@pytest.mark.parametrize("gpu", ["h200", "h100"])
@pytest.mark.parametrize("acceptance", [2, 3, 4])
def test_auto_is_within_3_percent_of_the_best_fixed_n_on_the_mixed_load(acceptance: int, gpu: str) -> None:
    """auto against the sweep N in {8, 16, 32, 48, 64, 96} at the same acceptance, and against
    both static servers (N above every batch: always on; N = 0: never), on each GPU's costs."""
    fixed = {n: mixed_seconds(n, acceptance, gpu=gpu) for n in SWEEP}
    best = min(fixed.values())
    auto = mixed_seconds(AUTO, acceptance, gpu=gpu)
    always_on = mixed_seconds(128, acceptance, gpu=gpu)
    assert auto <= 1.03 * best, (auto, fixed)
    assert auto < always_on
    # The control: the sweep's worst N misses by more than 3 %, so the bound can fail.
    assert max(fixed.values()) > 1.03 * best


def test_the_best_fixed_n_moves_with_acceptance() -> None:
    """Why auto exists: the best N of the sweep moves up with acceptance (the load's phases at 16
    and 64 requests leave 16 - 48 alike at acceptance 2 and 3)."""
    best = {a: min(SWEEP, key=lambda n: mixed_seconds(n, a)) for a in (2, 3, 4)}
    assert best[2] <= best[3] < best[4], best


@pytest.mark.parametrize(
    ("gpu", "acceptance", "between"),
    [
        ("h200", 2, (12, 32)),
        ("h200", 3, (40, 56)),
        ("h200", 4, (64, 127)),
        ("h100", 2, (16, 40)),
        ("h100", 3, (57, 72)),
        ("h100", 4, (64, 127)),
    ],
)
def test_auto_settles_where_the_recorded_costs_cross(gpu: str, acceptance: int, between: tuple[int, int]) -> None:
    """Where auto puts N after two mixed loads: higher with acceptance, and higher on the H100 than on
    the H200 at acceptance 3 (ranges that do not overlap: the GPU alone moves the point)."""
    server = Simulated(AUTO, acceptance, gpu=gpu)
    for _ in range(2):
        server.mixed()
    assert server.threshold is not None
    settled = server.threshold.thresholds
    assert between[0] <= settled.disable_above <= between[1], settled
    assert settled.enable_at_or_below <= settled.disable_above


def oscillating(server: Simulated, low: int, high: int, iterations: int) -> int:
    """Batch sizes alternating between ``low`` and ``high`` every 3 iterations; the switches made."""
    for i in range(iterations):
        size = high if (i // 3) % 2 else low
        step = server.driver.step(size)
        speculative = step == runtime.SPECULATE
        server.now += cost_ms(speculative, size) / 1000 * (1 + server.rng.gauss(0, server.noise))
        if speculative and server.threshold is not None:
            server.threshold.verified([server.acceptance - 1] * size)
    return server.controller.switches


def test_near_its_switch_point_auto_does_not_thrash() -> None:
    """A batch swinging across auto's own switch point (2 requests below it, 3 above) with 10 %
    timing noise: the margin's gap, the medians and the dwell hold the switches to a few. The
    control, with no margin, one sample per estimate and no dwell, switches over 100 times."""
    calm = Simulated(AUTO, 3, noise=0.10, seed=7)
    calm.mixed()  # learn both modes
    assert calm.threshold is not None
    point = calm.threshold.thresholds
    assert point.disable_above - point.enable_at_or_below >= 4
    before = calm.controller.switches
    assert oscillating(calm, point.disable_above - 2, point.disable_above + 3, 3000) - before <= 6

    jumpy = Simulated(AUTO, 3, noise=0.10, seed=7, margin=0.0, window=1)
    jumpy.controller.min_steps = 1
    jumpy.mixed()
    before = jumpy.controller.switches
    assert oscillating(jumpy, point.disable_above - 2, point.disable_above + 3, 3000) - before > 100


def test_a_steady_large_batch_probes_the_fallback_then_stays_off_and_probes_speculation_when_stale() -> None:
    server = Simulated(AUTO, 3, stale_after=2000)
    assert server.threshold is not None
    server.phase(1, 4)  # acceptance and speculation's cost at 1
    server.phase(100, 100 * 40, tokens=400)  # ~16000 iterations at 100
    t = server.threshold
    assert t.seconds(False, bucket_of(100)) is not None and t.seconds(True, bucket_of(100)) is not None
    assert t.thresholds.disable_above < 100
    # probes at 100: one for the fallback at first, then speculation again each time it went stale
    assert 4 <= server.controller.switches <= 2 + 2 * (16000 // 2000 + 1)


def test_every_rank_runs_rank_0s_thresholds() -> None:
    """Two ranks whose clocks disagree (rank 1's steps read 3x slower when speculating) decide alike
    through ``share``: the same step at every iteration. The control: without it they part."""

    def ranks(shared: bool) -> tuple[list[str], list[str]]:
        box: dict[str, tuple[Thresholds, int]] = {}

        def share(ours: tuple[Thresholds, int] | None) -> tuple[Thresholds, int]:
            if ours is not None:
                box["last"] = ours
            return box["last"]

        clocks = [0.0, 0.0]
        drivers = []
        for rank in (0, 1):
            controller = runtime.SwitchController(127, min_steps=8, log=False)
            drivers.append(
                AutoDriver(
                    controller,
                    AutoThreshold(1, 127),
                    rank0=rank == 0 or not shared,
                    share=share if shared else None,
                    clock=lambda r=rank: clocks[r],
                    log=False,
                )
            )
        steps: tuple[list[str], list[str]] = ([], [])
        rng = random.Random(3)
        for i in range(6000):
            size = [1, 4, 16, 64, 128][(i // 400) % 5] + rng.randrange(3)
            for rank, driver in enumerate(drivers):  # rank 0 first, as a broadcast from it would be
                step = driver.step(size)
                steps[rank].append(step)
                ms = cost_ms(step == runtime.SPECULATE, size) * (3 if rank == 1 and step == runtime.SPECULATE else 1)
                clocks[rank] += ms / 1000
                if step == runtime.SPECULATE:
                    driver.auto.verified([2] * size)
        return steps

    same = ranks(shared=True)
    assert same[0] == same[1] and runtime.FALL_BACK in same[0] and runtime.SPECULATE in same[0]
    apart = ranks(shared=False)
    assert apart[0] != apart[1]


def test_the_acceptance_is_an_ema_of_accepted_drafts_plus_one_kept_while_off() -> None:
    t = AutoThreshold(1, 64)
    assert t.acceptance is None
    t.verified([2, 2, 2, 2])
    assert t.acceptance == 3.0
    t.verified([0, 0])
    assert t.acceptance == pytest.approx(3.0 + 0.1 * (1.0 - 3.0))
    t.verified([])  # a fallback iteration's verify: nothing to learn
    assert t.acceptance == pytest.approx(2.8)


def test_only_steady_periods_are_timed() -> None:
    """Under overlap the period between two starts is the GPU time of the iteration before them: a
    sample needs three iterations in a row of one size and mode, none of them unsteady."""
    t = AutoThreshold(1, 64)
    t.iteration(8, True, 0.000)
    t.iteration(8, True, 0.010)
    t.iteration(8, True, 0.020)  # the third: 10 ms at bucket 8
    t.iteration(9, True, 0.030)  # the size changed: none until two more of it
    t.iteration(9, True, 0.040)
    t.iteration(9, False, 0.050)  # the mode changed
    t.iteration(9, False, 0.055, steady=False)  # a RESUME
    t.iteration(9, False, 0.060)
    t.iteration(9, False, 0.070)
    t.interrupted()  # a prefill ran: the next two periods overlap it
    t.iteration(9, False, 0.200)
    t.iteration(9, False, 0.210)
    assert t.seconds(True, 8) == pytest.approx(0.010)
    assert t.seconds(True, bucket_of(9)) is None and t.seconds(False, bucket_of(9)) is None
    t.iteration(9, False, 0.215)  # three in a row again: 5 ms
    assert t.seconds(False, bucket_of(9)) == pytest.approx(0.005)


def test_the_decision_names_its_estimates() -> None:
    t = AutoThreshold(1, 127)
    assert "no acceptance yet" in t.decide().describe()
    t.verified([2] * 4)
    for size, speculative, ms, n in (
        (16, True, 10.0, 3),
        (16, False, 5.0, 3),
        (64, True, 20.0, 5),
        (64, False, 5.8, 5),
    ):
        for i in range(n):  # the batch ran at 64 lately: no probe
            t.iteration(size, speculative, i * ms / 1000)
        t.interrupted()
    line = t.decide().describe()
    assert "(estimated; acceptance 3.00;" in line and "16: 1.50" in line and "64: 0.87" in line
    assert t.thresholds == Thresholds(54, 46)  # the gain's line crosses 1.0 at 54.1 and 1.1 at 46.5


@pytest.mark.parametrize(("value", "parsed"), [(None, None), ("auto", AUTO), (" Auto ", AUTO), ("32", 32), (32, 32)])
def test_the_flag_takes_a_positive_integer_or_auto(value: object, parsed: object) -> None:
    assert parse_threshold(value, "--speculative-disable-batch-size") == parsed


@pytest.mark.parametrize("value", ["0", "-1", "3.5", "autoo", "", 0, -4, True, 3.5])
def test_any_other_value_is_refused_naming_the_flag(value: object) -> None:
    with pytest.raises(ValueError, match=r"^--speculative-disable-batch-size must be a positive integer or auto, got "):
        parse_threshold(value, "--speculative-disable-batch-size")


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="floor"):
        AutoThreshold(0, 64)
    with pytest.raises(ValueError, match="floor"):
        AutoThreshold(65, 64)
    with pytest.raises(ValueError, match="margin"):
        AutoThreshold(1, 64, margin=1.0)


def test_a_probe_that_measured_nothing_hands_back_the_settled_thresholds() -> None:
    """The review's case: with no comparison yet, the period after a probe returns to what was
    settled (here the start: speculate everywhere), not the probe's thresholds. Its control: the
    probe itself moved them."""
    t = AutoThreshold(1, 127)
    t.verified([2, 2])
    for i in range(4):
        t.iteration(40, True, i * 0.01)  # speculating at 40, the fallback never timed there
    probe = t.decide()
    assert probe.reason == "probe: the fallback at 40" and probe.thresholds == Thresholds(39, 39)
    t._recent_sizes.clear()
    t._recent_sizes.extend([1] * 8)  # the batch went back to the floor, where no probe runs
    after = t.decide()
    assert after.reason == "no timings of both modes yet" and after.thresholds == Thresholds(127, 127)


def test_the_probe_reads_the_mode_the_controller_runs_not_the_thresholds() -> None:
    """Inside the hysteresis band the controller may be off below the off-threshold: then it is
    speculation that is probed there."""
    t = AutoThreshold(1, 127)
    t.verified([2])
    t.thresholds = Thresholds(50, 40)
    for i in range(4):
        t.iteration(45, False, i * 0.01)  # off at 45, inside the band
    assert t.decide().reason == "probe: speculation at 45"
