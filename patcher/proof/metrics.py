"""dynspec's Prometheus counters on a live server (``--enable-metrics``), around the crossing ramp.

The runtime exports three counters (``dynspec_runtime.DynspecMetrics``); the ``metrics`` check
scrapes ``/metrics`` before and after the ramp and holds them to the server's own log: the switches
counted must equal the switch lines written in between, and both kinds of iteration must have run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

SWITCHES = "sglang:dynspec_switches_total"
SPEC = "sglang:dynspec_spec_iterations_total"
FALLBACK = "sglang:dynspec_fallback_iterations_total"
COUNTERS = (SPEC, FALLBACK, SWITCHES)
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)")


def parse(text: str) -> dict[str, float]:
    """dynspec's counters in a Prometheus text exposition, summed over their labels (one model)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and m.group(1) in COUNTERS:
            values[m.group(1)] = values.get(m.group(1), 0.0) + float(m.group(3))
    return values


def judge(before: Mapping[str, float], after: Mapping[str, float], switches_logged: int) -> dict[str, Any]:
    """The ``metrics`` report entry: every counter exported after the ramp, the switches counted
    during it equal to those logged, and speculative and fallback iterations both counted."""
    problems = [f"/metrics has no {name} after the ramp" for name in COUNTERS if name not in after]
    delta = {name: after[name] - before.get(name, 0.0) for name in COUNTERS if name in after}
    if SWITCHES in delta and delta[SWITCHES] != switches_logged:
        problems.append(
            f"{SWITCHES} rose by {delta[SWITCHES]:g} during the ramp, the log has {switches_logged} switch lines"
        )
    for name in (SPEC, FALLBACK):
        if name in delta and delta[name] <= 0:
            problems.append(f"{name} did not rise during the ramp")
    return {
        "passed": not problems,
        "before": dict(before),
        "after": dict(after),
        "switches_logged": switches_logged,
        "switches_counted": delta.get(SWITCHES),
        "problems": problems,
        "detail": f"the three dynspec counters exported; {switches_logged} switches logged, "
        f"{delta.get(SWITCHES, 0):g} counted during the ramp",
    }
