"""auto on a host whose speed drifts: docs/design/auto-real-weights.md, "Why the bar is a coin".

The simulator of tests/patches/test_dynspec_auto.py with real text's drafts, on session 47's real
costs: every step's cost times exp(sigma * z), z an AR(1) factor (rho 0.995), so that speculation
and the fallback are timed at different host speeds. Prints, for 20 seeds, each fixed N's time and
auto's, then how often auto came within 3 % of the best N (the issue's bar), with the drift and,
as the control, without it.

    .venv/bin/python scripts/auto_drift_sim.py [window=4 stale_after=1024 margin=0.2 ...]

Arguments are AutoThreshold's options for the auto server.
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "patches"))

import test_dynspec_auto as sim  # noqa: E402

from patches.runtime.dynspec_settings import AUTO  # noqa: E402

RHO = 0.995
# ms per step by batch size: session 47's logs (plain decode 1.4 - 2.5 ms, the fallback 3.2 - 4.9 at 16 -
# 128), speculation at 1 and 4 where the GPU's logged gains put it (1.2 - 1.6 x the fallback's tokens/s)
COSTS = {
    True: {1: 2.5, 4: 3.4, 16: 11.5, 64: 13.9},
    False: {1: 2.35, 4: 2.31, 16: 3.18, 64: 3.34, 128: 4.89},
}


class Drifting(sim.Simulated):
    """The simulator's server on session 47's costs, its host's speed an AR(1) factor of size ``sigma``."""

    drift = 0.0
    sigma = 0.35

    def step_ms(self, speculative: bool, size: int) -> float:
        return sim.interpolated(COSTS[speculative], size)

    def speed(self) -> float:
        self.drift = RHO * self.drift + math.sqrt(1 - RHO**2) * self.rng.gauss(0, 1)
        return math.exp(self.sigma * self.drift)


def seconds(n: int | str, seed: int, sigma: float, **options: float) -> float:
    server = Drifting(n, 0, seed=seed, real_text=True, **options)
    server.sigma = sigma
    server.mixed()
    return statistics.median(server.mixed() for _ in range(2))


if __name__ == "__main__":
    options = {key: float(value) for key, value in (arg.split("=", 1) for arg in sys.argv[1:])}
    options.update(
        {k: int(v) for k, v in options.items() if k in ("window", "stale_after", "every", "probe_iterations")}
    )
    for sigma in (0.35, 0.0):
        ratios = []
        for seed in range(20):
            fixed = {n: seconds(n, seed, sigma) for n in sim.SWEEP}
            auto = seconds(AUTO, seed, sigma, **options)
            ratios.append(auto / min(fixed.values()))
            if sigma:
                print(
                    f"seed {seed}: fixed N "
                    + ", ".join(f"{n} {s:.2f}" for n, s in fixed.items())
                    + f"; auto {auto:.2f}"
                )
        print(
            f"drift {sigma}: auto median {statistics.median(ratios):.3f}x, mean {statistics.mean(ratios):.3f}x the best N;"
            f" within 3 % in {sum(r <= 1.03 for r in ratios)} of {len(ratios)}"
        )
