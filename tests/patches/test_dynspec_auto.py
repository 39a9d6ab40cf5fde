"""``--speculative-disable-batch-size auto`` (``patches/runtime/dynspec_auto.py``) on recorded timings.

The step costs come from real runs: the decode log lines of 0.5.17's throughput check (always-on's
speculative steps, dynspec's fallback steps, 8B shape, 256 new tokens), session 26's on an H200
and session 33's on an H100, whose crossover lies elsewhere.
A small simulator replays a load through the runtime's own ``SwitchController``, driven by
``AutoDriver`` or by a fixed N, on a clock that advances by those costs (with seeded noise).
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
import statistics
import tarfile
from collections import defaultdict
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from patcher.proof.logscan import auto_decisions
from patcher.proof.mixed import decided
from patches.runtime import dynspec_runtime as runtime
from patches.runtime.dynspec_auto import AutoDriver, AutoThreshold, Thresholds, bucket_of
from patches.runtime.dynspec_settings import AUTO, parse_threshold

PROOF = Path(__file__).parents[2] / "docs/proof"
RECORDED = {
    "h200": PROOF / "0.5.17-v2-s26-r22-tput/logs.tar.xz",
    "h100": PROOF / "0.5.17-v2-s33-r29-tput/logs.tar.xz",
    # session 39, every server on FlashInfer (r30 / r50), C = 64 and 128 only
    "h200-flashinfer": PROOF / "0.5.17-v2-s39-r30-flashinfer-tput-n32/logs.tar.xz",
}
DECODE = re.compile(
    r"Decode batch, #running-req: (\d+), #token: (\d+), .*?(?:accept len: ([\d.]+), .*?)?gen throughput \(token/s\): ([\d.]+)"
)
MIXED = (1, 4, 16, 64, 128, 64, 16, 4, 1)  # the proof's mixed_load phases: 2 x C requests of 128 tokens each
SWEEP = (8, 16, 32, 48, 64, 96)


def steady_ms(log: str, speculative: bool, loose: bool = False) -> dict[int, float]:
    """Median milliseconds of a steady decode iteration by batch size, from a server's log lines of
    that mode (time = tokens / throughput): intervals at the same batch size as the line before, with
    no prefill between them and the KV grown, so none spans the idle time between two runs (each
    run starts with a prefill). ``loose`` drops those two conditions, as sessions 26 - 32 read the
    logs: a speculating run logs only about two lines, so an interval across the idle gap was often
    counted and sped speculation's step cost up by ~10 % at 64 requests (session 33)."""
    samples: dict[int, list[float]] = defaultdict(list)
    previous: tuple[int, int] | None = None
    for line in log.splitlines():
        if "Prefill batch" in line and not loose:
            previous = None
            continue
        m = DECODE.search(line)
        if m is None:
            continue
        size, tokens, accept, tput = int(m.group(1)), int(m.group(2)), float(m.group(3) or 1), float(m.group(4))
        grew = loose or (previous is not None and tokens > previous[1])
        if previous is not None and previous[0] == size and grew and (accept > 1.5) == speculative:
            samples[size].append(1000 * size * accept / tput)
        previous = (size, tokens)
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
    return interpolated(recorded_ms(gpu)[speculative], size)


def interpolated(table: dict[int, float], size: int) -> float:
    """Linear between the recorded sizes, flat beyond them."""
    sizes = sorted(table)
    if size <= sizes[0] or size >= sizes[-1]:
        return table[sizes[0] if size <= sizes[0] else sizes[-1]]
    lo = max(b for b in sizes if b <= size)
    hi = min(b for b in sizes if b >= size)
    return table[lo] if lo == hi else table[lo] + (table[hi] - table[lo]) * (size - lo) / (hi - lo)


class Simulated:
    """A server's decode loop on a virtual clock: closed-loop phases of ``2 x C`` requests. With
    ``real_text`` each request's drafts at each verify are drawn as real text's (``real_text_drafts``),
    not ``acceptance``'s."""

    def __init__(
        self,
        n: int | str,
        acceptance: int,
        *,
        noise: float = 0.03,
        seed: int = 0,
        gpu: str = "h200",
        real_text: bool = False,
        **auto: object,
    ) -> None:
        self.acceptance = acceptance
        self.real_text = real_text
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
        start, pending = self.now, requests
        running: list[tuple[int, float | None]] = []  # each request's tokens left, and its draft chance
        while pending or running:
            admitted = min(pending, concurrency - len(running))
            if admitted > 0:  # one prefill for the requests that join before this iteration, as a server's
                running += [(self.request_tokens(tokens), self.request_chance()) for _ in range(admitted)]
                pending -= admitted
                self.now += self.prefill_seconds(admitted)
                if self.threshold is not None:
                    self.threshold.interrupted()
            step = self.driver.step(len(running))
            self.now += self.step_seconds(step, len(running))
            drafts = [0] * len(running)
            if step == runtime.SPECULATE:
                size = len(running)
                chances = [chance for _, chance in running]
                drafts = real_text_drafts(self.rng, chances) if self.real_text else [self.acceptance - 1] * size
                if self.threshold is not None:
                    self.threshold.verified(drafts)
            running = [(left - 1 - d, chance) for (left, chance), d in zip(running, drafts) if left > 1 + d]
        return self.now - start

    def step_seconds(self, step: str, size: int) -> float:
        """One iteration's time: its step's cost (a resume's full draft extend 15 % more) at this step's speed."""
        ms = self.step_ms(step == runtime.SPECULATE, size) * (1.15 if step == runtime.RESUME else 1.0)
        return ms / 1000 * self.speed()

    def step_ms(self, speculative: bool, size: int) -> float:
        """A step's cost in ms: the recorded one."""
        return cost_ms(speculative, size, self.gpu)

    def speed(self) -> float:
        """The factor on this step's cost: seeded noise."""
        return 1 + self.rng.gauss(0, self.noise)

    def prefill_seconds(self, requests: int) -> float:
        """One prefill's time: none here (the recorded step costs are the steps' alone)."""
        return 0.0

    def request_tokens(self, tokens: int) -> int:
        """A new request's output length: the phase's, alike for every request here (the proof's load)."""
        return tokens

    def request_chance(self) -> float | None:
        """A new request's chance of each draft with ``real_text``: None here, drawn anew at every verify."""
        return None

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
    assert 6.5 < spec[1] < 7 and 34 < spec[128] < 35 and 5.5 < fallback[64] < 6 and 6.5 < fallback[128] < 7
    assert spec[128] / spec[1] > 4 > 1.5 > fallback[128] / fallback[1]


def test_an_h100s_steps_cost_more_and_speculation_pays_further_up() -> None:
    """Session 33's H100 against session 26's H200, same release, shape and load: a fallback step
    costs 24 - 30 % more at every batch size, a speculative one at 64 and 128 at most 11 % more, so
    speculation's cost per token meets the fallback's at a larger batch (at 64: 1.03x the
    fallback's on the H200, 0.91x on the H100)."""
    h100, h200 = recorded_ms("h100"), recorded_ms("h200")
    assert all(1.2 < h100[False][b] / h200[False][b] < 1.35 for b in h100[False])
    assert all(h100[True][b] / h200[True][b] < 1.15 for b in (64, 128))
    per_token = {gpu: t[True][64] / 3 / t[False][64] for gpu, t in (("h100", h100), ("h200", h200))}
    assert (round(per_token["h200"], 2), round(per_token["h100"], 2)) == (1.03, 0.91)


@pytest.mark.parametrize(
    ("gpu", "strict", "loose"),
    [
        ("h200", {"always_on": 253, "base": 211}, {"always_on": -1, "base": 199}),
        ("h100", {"always_on": 210, "base": 182}, {"always_on": 53, "base": 175}),
    ],
)
def test_read_strictly_the_steady_steps_leave_both_modes_the_same_time_outside_them(
    gpu: str, strict: dict, loose: dict
) -> None:
    """A run of 64 requests x 256 tokens against 255 tokens' worth of its own steady steps: plain
    decode and always-on alike spend ~0.2 s outside them (admission, prefill, the last replies), so
    the step costs alone place the switch point where the runs do. The control: read loosely (an
    interval across the idle gap between two runs counted), always-on seemed to spend ~0 - 50 ms
    there, which session 33 first took for a cost of plain decode's that auto could not see."""
    report = json.loads((RECORDED[gpu].parent / "report.json").read_text())["throughput"]
    at = report["levels"].index(64)
    with tarfile.open(RECORDED[gpu]) as tar:
        logs = {n: tar.extractfile(f"{n}-sim.log").read().decode() for n in ("base", "always-on")}  # type: ignore[union-attr]
    accept = report["accept_length"]["always_on"][at]
    run_ms = {s: 1000 * 64 * 256 / statistics.median(report["samples"][s][at]) for s in ("always_on", "base")}

    def outside(reading_loosely: bool) -> dict[str, int]:
        steps = {
            "always_on": 255 / accept * steady_ms(logs["always-on"], True, reading_loosely)[64],
            "base": 255 * steady_ms(logs["base"], False, reading_loosely)[64],
        }
        return {s: round(run_ms[s] - steps[s]) for s in steps}

    assert outside(False) == strict and outside(True) == loose


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


def real_text_drafts(rng: random.Random, chances: Sequence[float | None]) -> list[int]:
    """Accepted drafts (0 - 3) at one verify of requests with these ``chances``, as real text's: each
    with its chance of each draft, or where None one drawn for that request at that verify (0.1 - 0.7,
    uniform), the chain stopping at the first miss; about 0.69 drafts a request, near session 47's
    head (1.74 accepted + 1 per verify held out)."""
    out = []
    for own in chances:
        chance, accepted = (rng.uniform(0.1, 0.7) if own is None else own), 0
        while accepted < 3 and rng.random() < chance:
            accepted += 1
        out.append(accepted)
    return out


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_with_real_texts_drafts_auto_stays_near_the_best_fixed_n(gpu: str) -> None:
    """The recorded 8B costs with drafts varying from request to request and verify to verify (about
    1.69 accepted + 1, not a constant), three seeds: auto 1.011 - 1.038 x the best fixed N (median of
    three passes), at the issue's 3 % bar and once past it, where with a constant acceptance it is
    within 0.2 %; the bound here is 5 %. The control: the worst N is 18 - 27 % behind the best."""
    for seed in range(3):
        fixed = [
            statistics.median(Simulated(n, 0, gpu=gpu, seed=seed, real_text=True).mixed() for _ in range(3))
            for n in SWEEP
        ]
        auto = statistics.median(Simulated(AUTO, 0, gpu=gpu, seed=seed, real_text=True).mixed() for _ in range(3))
        assert auto <= 1.05 * min(fixed) < max(fixed), (auto, fixed)


def test_the_best_fixed_n_moves_with_acceptance() -> None:
    """Why auto exists: the best N of the sweep moves up with acceptance (the load's phases at 16
    and 64 requests leave 16 - 48 alike at acceptance 2 and 3)."""
    best = {a: min(SWEEP, key=lambda n: mixed_seconds(n, a)) for a in (2, 3, 4)}
    assert best[2] <= best[3] < best[4], best


@pytest.mark.parametrize(
    ("gpu", "acceptance", "between"),
    [
        ("h200", 2, (16, 40)),
        ("h200", 3, (52, 72)),
        ("h200", 4, (96, 127)),
        ("h100", 2, (24, 48)),
        ("h100", 3, (96, 127)),
        ("h100", 4, (96, 127)),
    ],
)
def test_auto_settles_where_the_recorded_costs_cross(gpu: str, acceptance: int, between: tuple[int, int]) -> None:
    """Where auto puts N after two mixed loads: higher with acceptance, and higher on the H100 than on
    the H200 at acceptance 3 (ranges that do not overlap: the GPU alone moves the point; on the H100
    speculation pays up to auto's ceiling, 127, as always-on beat plain decode at 64 there)."""
    server = Simulated(AUTO, acceptance, gpu=gpu)
    for _ in range(2):
        server.mixed()
    assert server.threshold is not None
    settled = server.threshold.thresholds
    assert between[0] <= settled.disable_above <= between[1], settled
    assert settled.enable_at_or_below <= settled.disable_above


def test_on_flashinfer_auto_speculates_up_to_its_ceiling_where_the_runs_put_the_switch_point() -> None:
    """Session 39's FlashInfer costs on an H200: a speculative step 12.8 / 21.2 ms at 64 / 128
    requests, a fallback step 6.1 / 7.1, so at acceptance 3 the two meet near 128 (18.07 against
    18.15 tokens a millisecond there; the runs said 121). Replayed, auto speculates up to its ceiling
    (127) at acceptance 3 and 4 and takes the mixed load within 0.1 % of N = 127, at least 5 % ahead
    of the issue's N = 32. The run timed no speculative step below 64, so the replay holds 64's cost
    there: that understates speculation at small batches, so the result stands for acceptance 3 and
    up. The control: at acceptance 2, the same costs, auto does not reach the ceiling."""
    spec, fallback = recorded_ms("h200-flashinfer")[True], recorded_ms("h200-flashinfer")[False]
    assert sorted(spec) == [64, 128] and 12.7 < spec[64] < 12.8 and 21.2 < spec[128] < 21.3
    assert 6.0 < fallback[64] < 6.1 and 7.0 < fallback[128] < 7.1
    assert 3 * 128 / spec[128] < 128 / fallback[128] < 1.01 * 3 * 128 / spec[128]
    for acceptance in (3, 4):
        server = Simulated(AUTO, acceptance, gpu="h200-flashinfer")
        auto_s = statistics.median(server.mixed() for _ in range(3))
        assert server.threshold is not None and server.threshold.thresholds == Thresholds(127, 127)
        assert auto_s <= 1.001 * mixed_seconds(127, acceptance, gpu="h200-flashinfer")
        assert 1.05 * auto_s <= mixed_seconds(32, acceptance, gpu="h200-flashinfer")
    control = Simulated(AUTO, 2, gpu="h200-flashinfer")
    control.mixed()
    control.mixed()
    assert control.threshold is not None and control.threshold.thresholds.disable_above < 127


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
    control, with no margin, one sample per estimate and no dwell, switches many times more."""
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
    # 47 switches with these costs and seed (153 - 713 with seeds 1 - 3): many times the calm one's bound
    assert oscillating(jumpy, point.disable_above - 2, point.disable_above + 3, 3000) - before > 5 * 6


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
    # dynspec proof's auto_threshold reads the same line back as where auto settled; the control:
    # the first line, before any estimate, is a decision but not a settling
    settled = {"disable_above": 54, "enable_at_or_below": 46, "reason": "estimated", "acceptance": 3.0}
    assert decided(auto_decisions(line))["last_estimated"] == settled
    first = decided(auto_decisions(AutoThreshold(1, 127).decide().describe()))
    assert (first["count"], first["last_estimated"]) == (1, None)


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


@cache
def admission_sim() -> Any:
    """scripts/auto_admission_sim.py as a module: the simulator with a cost per prefill."""
    script = Path(__file__).parents[2] / "scripts" / "auto_admission_sim.py"
    spec = importlib.util.spec_from_file_location("auto_admission_sim", script)
    assert spec is not None and spec.loader is not None
    admission = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(admission)
    return admission


def test_speculating_servers_admit_a_closed_loop_a_prefill_at_a_time_and_auto_does_not_see_it() -> None:
    """Session 48's finding on real weights, in the simulator (scripts/auto_admission_sim.py): with
    real text's drafts a speculating server's requests finish apart, so at 64 places always-on runs
    about twenty times the prefills per token of N = 8, which falls back there and refills in waves;
    the step costs are the logs' steps without a prefill. Auto times decode steps only, so as a
    prefill's cost grows (0, then 27 ms, the logs' rough reading) it drifts from within 3 % of the
    best N (1.010 - 1.015x on three seeds) to 5 - 18 % behind: the issue's real-weights failure in
    direction if not in size (the GPU: 1.21 - 1.31x). The controls: with free prefills auto is within
    3 % on every seed, and so it is at 27 ms when output lengths differ by request (32 - 224 tokens,
    alike on every server), where requests finish apart in either mode."""
    admission = admission_sim()
    rates = {n: admission.prefills_per_1000_tokens(n, 27.0) for n in (128, 8)}
    assert rates[128] > 2 > 0.2 > rates[8]
    for prefill_ms, low, high in ((0.0, 1.0, 1.03), (27.0, 1.04, 1.2)):
        ratios = []
        for seed in range(3):
            fixed = min(admission.seconds(n, seed, prefill_ms) for n in SWEEP)
            ratios.append(admission.seconds(AUTO, seed, prefill_ms) / fixed)
        assert all(low < r < high for r in ratios) if prefill_ms else all(r <= high for r in ratios), ratios
    for seed in range(3):
        fixed = min(admission.seconds(n, seed, 27.0, staggered=True) for n in SWEEP)
        assert admission.seconds(AUTO, seed, 27.0, staggered=True) <= 1.03 * fixed


def test_where_each_request_keeps_its_own_chance_speculation_costs_more_and_auto_holds_at_cheap_prefills() -> None:
    """Session 49, the admission simulator with ``--own-chance``: each request keeps one draft chance
    for its life (alike on every server), session 47's closer model of real text, so slow requests
    stay slow. Against chances drawn at every verify, always-on refills the 64-place loop about 1.8 x
    as often (4.18 against 2.29 prefills per 1000 tokens) and costs more against N = 8 (at 5 ms a
    prefill 1.48 - 1.49 x against 1.25 - 1.27 x; session 48 measured 1.56 x with eager prefills of
    13 - 16 ms). Auto at 5 ms a prefill, about what the prefill graphs should give: a median of
    1.020 x the best N over seeds 0 - 2 (the script's ten: 9 within 3 %). The control: at 27 ms the
    median is past the bar (1.053 x)."""
    admission = admission_sim()
    own = admission.prefills_per_1000_tokens(128, 5.0, own_chance=True)
    assert own > 1.5 * admission.prefills_per_1000_tokens(128, 5.0) > 1.5 * 0.12
    medians = {}
    for prefill_ms in (5.0, 27.0):
        ratios = []
        for seed in range(3):
            fixed = {n: admission.seconds(n, seed, prefill_ms, own_chance=True) for n in SWEEP}
            ratios.append(admission.seconds(AUTO, seed, prefill_ms, own_chance=True) / min(fixed.values()))
            if prefill_ms == 5.0:
                own_cost = admission.seconds(128, seed, 5.0, own_chance=True) / fixed[8]
                assert own_cost > 1.1 * admission.seconds(128, seed, 5.0) / admission.seconds(8, seed, 5.0)
        medians[prefill_ms] = statistics.median(ratios)
    assert medians[5.0] <= 1.03 < medians[27.0], medians
