"""auto on a host whose speed drifts: docs/design/auto-real-weights.md, "Not built" item 1.

The simulator of tests/patches/test_dynspec_auto.py with real text's drafts, on session 47's real
costs as the 8B table's shape cannot give them: every step's cost times exp(sigma * z), z an AR(1)
factor (rho 0.995), so that speculation and the fallback are timed at different host speeds.
Prints, for 20 seeds, each fixed N's time and auto's under r7's acceptance and r6's (the control),
then each rule's median and mean over the best N and how often it came within 3 %.

    .venv/bin/python scripts/auto_drift_sim.py [window=4 stale_after=1024 margin=0.2 ...]

Arguments are AutoThreshold's options for the r7 server (r6's control keeps the defaults).
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "patches"))

import test_dynspec_auto as sim  # noqa: E402

from patches.runtime import dynspec_runtime as runtime  # noqa: E402
from patches.runtime.dynspec_auto import AutoThreshold  # noqa: E402
from patches.runtime.dynspec_settings import AUTO  # noqa: E402

RHO, SIGMA = 0.995, 0.35
# ms per step by batch size: session 47's logs (plain decode 1.4 - 2.5 ms, the fallback 3.2 - 4.9 at 16 -
# 128), speculation at 1 and 4 where the GPU's logged gains put it (1.2 - 1.6 x the fallback's tokens/s)
COSTS = {
    True: {1: 2.5, 4: 3.4, 16: 11.5, 64: 13.9},
    False: {1: 2.35, 4: 2.31, 16: 3.18, 64: 3.34, 128: 4.89},
}


class Drifting(sim.Simulated):
    """The simulator's server on session 47's costs, its host's speed an AR(1) factor."""

    drift = 0.0

    def step_seconds(self, step: str, size: int) -> float:
        self.drift = RHO * self.drift + math.sqrt(1 - RHO**2) * self.rng.gauss(0, 1)
        ms = sim.interpolated(COSTS[step == runtime.SPECULATE], size) * (1.15 if step == runtime.RESUME else 1.0)
        return ms / 1000 * math.exp(SIGMA * self.drift)


def seconds(n: int | str, seed: int, rule: type[AutoThreshold] = AutoThreshold, **options: float) -> float:
    server = Drifting(n, 0, seed=seed, rule=rule, real_text=True, **options)
    server.mixed()
    return statistics.median(server.mixed() for _ in range(2))


if __name__ == "__main__":
    # AutoThreshold's options for r7's server, e.g. window=4 stale_after=1024 margin=0.2
    options = {key: float(value) for key, value in (arg.split("=", 1) for arg in sys.argv[1:])}
    options.update({k: int(v) for k, v in options.items() if k in ("window", "stale_after", "every")})
    ratios: dict[str, list[float]] = {"r7": [], "r6": []}
    for seed in range(20):
        fixed = {n: seconds(n, seed) for n in sim.SWEEP}
        best = min(fixed.values())
        r7, r6 = seconds(AUTO, seed, **options), seconds(AUTO, seed, sim.PerVerify)
        ratios["r7"].append(r7 / best)
        ratios["r6"].append(r6 / best)
        print(
            f"seed {seed}: fixed N "
            + ", ".join(f"{n} {s:.2f}" for n, s in fixed.items())
            + f"; auto r7 {r7:.2f} ({r7 / best:.3f}x the best), r6 {r6:.2f} ({r6 / best:.3f}x)"
        )
    for rule, values in ratios.items():
        print(
            f"{rule}: median {statistics.median(values):.3f}x, mean {statistics.mean(values):.3f}x the best N;"
            f" within 3 % in {sum(v <= 1.03 for v in values)} of {len(values)}"
        )
