"""The metrics check's reading of ``/metrics`` (patcher/proof/metrics.py)."""

from __future__ import annotations

from patcher.proof import metrics
from patches.runtime.dynspec_runtime import DynspecMetrics

EXPOSITION = """\
# HELP sglang:dynspec_switches_total Times dynspec switched speculation on or off.
# TYPE sglang:dynspec_switches_total counter
sglang:dynspec_switches_total{model_name="m"} 3.0
sglang:dynspec_switches_created{model_name="m"} 1.7331e+09
sglang:dynspec_spec_iterations_total{model_name="m"} 120.0
sglang:dynspec_spec_iterations_total{model_name="other"} 5.0
sglang:dynspec_fallback_iterations_total{model_name="m"} 40.0
sglang:num_running_reqs{model_name="m"} 0.0
"""


def test_the_counters_are_the_runtimes_and_are_summed_over_their_labels() -> None:
    assert set(metrics.COUNTERS) == {name for _, name, _ in DynspecMetrics.NAMES}
    assert metrics.parse(EXPOSITION) == {metrics.SWITCHES: 3.0, metrics.SPEC: 125.0, metrics.FALLBACK: 40.0}
    assert metrics.parse("sglang:num_running_reqs 1.0\n") == {}  # the control: none of dynspec's


def test_the_judge_holds_the_counted_switches_to_the_logged_ones() -> None:
    before = {metrics.SWITCHES: 3.0, metrics.SPEC: 100.0, metrics.FALLBACK: 10.0}
    after = {metrics.SWITCHES: 13.0, metrics.SPEC: 150.0, metrics.FALLBACK: 90.0}
    assert metrics.judge(before, after, 10)["passed"]
    assert metrics.judge(before, after, 11)["problems"] == [
        "sglang:dynspec_switches_total rose by 10 during the ramp, the log has 11 switch lines"
    ]
    still = {**after, metrics.FALLBACK: 10.0}
    assert metrics.judge(before, still, 10)["problems"] == [
        "sglang:dynspec_fallback_iterations_total did not rise during the ramp"
    ]
