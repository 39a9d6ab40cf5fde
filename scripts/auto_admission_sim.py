"""auto where a prefill costs several decode steps: docs/design/auto-real-weights.md, "Admissions".

The simulator of tests/patches/test_dynspec_auto.py with real text's drafts, on the steps of session
48's real-weights logs read without their prefills, and a fixed cost for every prefill (the requests
that join before one iteration). A speculating server's requests finish apart, so a closed loop's
places are refilled a prefill at a time; auto times decode steps only. Prints, for each prefill cost,
the prefills per 1000 tokens at 64 requests (always-on against N = 8, which falls back there), each
fixed N's time and auto's (medians over seeds), and how often auto came within 3 % of the best N;
then the same with output lengths that differ by request (32 - 224 tokens, drawn alike for every
server), where requests finish apart in either mode and every server refills a prefill at a time.
With --own-chance each request keeps one chance of each draft for its life, drawn alike for every
server (a prompt's text is prose or code on any server), where it is otherwise drawn anew at every
verify: session 47's closer model of real text, whose slow requests stay slow (session 49).

    .venv/bin/python scripts/auto_admission_sim.py [--own-chance] [PREFILL_MS ...]   (default: 0 5 27)
"""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "patches"))

import test_dynspec_auto as sim  # noqa: E402

from patches.runtime.dynspec_settings import AUTO  # noqa: E402

# ms per decode step by batch size, from session 48's and 47's intervals without a prefill (SmolLM2-135M,
# an H100): speculation at about 1.7 accepted + 1, the fallback at one token a request
STEPS_MS = {
    True: {1: 2.8, 4: 3.0, 16: 3.5, 64: 5.1, 128: 7.0},
    False: {1: 2.3, 4: 2.05, 16: 2.05, 64: 2.4, 128: 2.9},
}
SEEDS = 10


class Admitting(sim.Simulated):
    """The simulator's server on those steps, every prefill costing ``prefill_ms``."""

    prefill_ms = 0.0
    prefills = 0  # how many it ran
    lengths: random.Random | None = None  # output lengths by request, else the phase's for all
    chances: random.Random | None = None  # each request's own draft chance, else one per verify

    def step_ms(self, speculative: bool, size: int) -> float:
        return sim.interpolated(STEPS_MS[speculative], size)

    def prefill_seconds(self, requests: int) -> float:
        self.prefills += 1
        return self.prefill_ms / 1000

    def request_tokens(self, tokens: int) -> int:
        return tokens if self.lengths is None else self.lengths.randint(32, 224)

    def request_chance(self) -> float | None:
        return None if self.chances is None else self.chances.uniform(0.1, 0.7)


def server(n: int | str, seed: int, prefill_ms: float, staggered: bool = False, own_chance: bool = False) -> Admitting:
    made = Admitting(n, 0, seed=seed, real_text=True)
    made.prefill_ms = prefill_ms
    if staggered:  # the same lengths, request by request, on every server of a seed
        made.lengths = random.Random(1000 + seed)
    if own_chance:  # the same chances, request by request, on every server of a seed
        made.chances = random.Random(2000 + seed)
    return made


def seconds(n: int | str, seed: int, prefill_ms: float, staggered: bool = False, own_chance: bool = False) -> float:
    one = server(n, seed, prefill_ms, staggered, own_chance)
    one.mixed()  # the warm-up pass
    return statistics.median(one.mixed() for _ in range(2))


def prefills_per_1000_tokens(n: int | str, prefill_ms: float, own_chance: bool = False) -> float:
    """In a closed loop of 64 places, 4 x 64 requests of 128 tokens."""
    one = server(n, 0, prefill_ms, own_chance=own_chance)
    one.phase(64, 256)
    return 1000 * one.prefills / (256 * 128)


if __name__ == "__main__":
    own_chance = "--own-chance" in sys.argv[1:]
    costs = [float(a) for a in sys.argv[1:] if a != "--own-chance"] or [0.0, 5.0, 27.0]
    print("each request's own draft chance" if own_chance else "a draft chance per request and verify")
    for staggered in (False, True):
        print("output lengths " + ("32 - 224 tokens by request" if staggered else "128 tokens, every request"))
        for prefill_ms in costs:
            rates = {n: prefills_per_1000_tokens(n, prefill_ms, own_chance) for n in (128, 8)}
            ratios, fixed_all, auto_all, always_on_all = [], [], [], []
            for seed in range(SEEDS):
                fixed = {n: seconds(n, seed, prefill_ms, staggered, own_chance) for n in sim.SWEEP}
                auto = seconds(AUTO, seed, prefill_ms, staggered, own_chance)
                ratios.append(auto / min(fixed.values()))
                fixed_all.append(fixed)
                auto_all.append(auto)
                always_on_all.append(seconds(128, seed, prefill_ms, staggered, own_chance))
            medians = {n: statistics.median(f[n] for f in fixed_all) for n in sim.SWEEP}
            print(
                f"  prefill {prefill_ms:g} ms: prefills per 1000 tokens at 64 (waves), always-on {rates[128]:.2f},"
                f" N=8 {rates[8]:.2f}; fixed N "
                + ", ".join(f"{n} {s:.2f}" for n, s in medians.items())
                + f"; always-on {statistics.median(always_on_all):.2f}"
                + f"; auto {statistics.median(auto_all):.2f} s, {statistics.median(ratios):.3f}x the best N"
                f" (within 3 % in {sum(r <= 1.03 for r in ratios)} of {SEEDS})"
            )
