from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

from patcher.proof import exactkv, metrics, mixed, plot, report
from patcher.proof.client import LevelResult
from patcher.proof.logscan import AutoDecision
from patcher.proof.run import Refusal


def sample(**over: object) -> dict[str, Any]:
    data: dict[str, Any] = {
        "sglang_version": "0.5.12",
        "path": "v1",
        "gpu": "NVIDIA H200",
        "command": "dynspec proof",
        "dynspec_applied": True,
        "dynspec_flags": "--speculative-disable-batch-size 32",
        "threshold": 32,
        "out": "/tmp/o",
        "skipped": {"throughput": "not asked for"},
        "equivalence": {
            "passed": True,
            "levels": [1, 48],
            "shape": "small",
            "new_tokens": 64,
            "digests": {"base": ["a" * 12, "b" * 12], "dynspec": ["a" * 12, "c" * 12]},
            "per_level": [
                {"C": 1, "base": "a" * 12, "dynspec": "a" * 12, "dynspec_state": "ON"},
                {"C": 48, "base": "b" * 12, "dynspec": "c" * 12, "dynspec_state": "ON->OFF"},
            ],
            "problems": [],
            "detail": "2 levels token-identical",
        },
        "crossings": {"passed": True, "count": 120, "errors": [], "problems": [], "detail": "120 switches"},
    }
    data.update(over)
    return data


def test_envelope_ratio_is_dynspec_over_the_better_of_the_other_two():
    assert report.envelope_ratio([200.0, 10000.0], [350.0, 7000.0], [340.0, 9900.0]) == [0.9714, 0.99]
    assert report.envelope_ratio([None, 100.0], [100.0, None], [50.0, None]) == [0.5, None]
    with pytest.raises(ValueError):
        report.envelope_ratio([1.0], [1.0, 2.0], [1.0])


def test_the_switch_point_is_where_always_on_stops_beating_base():
    """Always-on 1.3x base at 32 and 0.94x at 64 (an H200, session 26's shape): N in 32 - 63, the
    ratio crossing 1 near 58 (linear); always-on faster everywhere, nowhere, or ahead again after
    losing (read up to its first loss); a missing number gives no answer."""
    levels = [1, 32, 64]
    assert report.switch_point(levels, [100.0, 100.0, 100.0], [200.0, 130.0, 94.0]) == {
        "speculation_faster_up_to": 32, "plain_faster_from": 64, "crossover_estimate": 58
    }  # fmt: skip
    assert report.switch_point(levels, [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]) == {
        "speculation_faster_up_to": 64, "plain_faster_from": None, "crossover_estimate": None
    }  # fmt: skip
    assert report.switch_point(levels, [2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == {
        "speculation_faster_up_to": None, "plain_faster_from": 1, "crossover_estimate": None
    }  # fmt: skip
    assert report.switch_point(levels, [1.0, 1.0, 1.0], [2.0, 0.5, 2.0]) == {
        "speculation_faster_up_to": 1, "plain_faster_from": 32, "crossover_estimate": 21
    }  # fmt: skip
    assert report.switch_point(levels, [1.0, None, 1.0], [2.0, 2.0, 2.0]) is None
    assert report.switch_point([], [], []) is None
    tp = {"levels": levels, "base": [1.0, 1.0, 1.0], "always_on": [2.0, 1.3, 0.94], "shape": "8b", "new_tokens": 8}
    tp["switch_point"] = report.switch_point(levels, tp["base"], tp["always_on"])
    assert (
        "switch point on this GPU and load: always-on faster up to C=32, plain decode from C=64: N in 32 - 63, "
        "near 58 (linear between the two)"
    ) in report.summary(sample(throughput=tp))


def test_the_verdict_needs_every_check_that_ran_to_pass():
    assert report.exit_code(sample()) == 0
    assert report.exit_code(sample(crossings={"passed": False, "count": 3, "errors": []})) == 1
    assert report.exit_code(sample(throughput={"passed": False})) == 1
    no_checks = {k: v for k, v in sample().items() if k not in report.CHECKS}
    assert report.exit_code(no_checks) == 1


def test_the_summary_fits_one_screen_and_marks_differing_digests():
    tp = {
        "passed": False, "levels": [1, 4, 16, 32, 64, 128], "shape": "8b", "new_tokens": 256, "simulate_acc_len": 3.0,
        "base": [210.0, 832.0, 3097.0, 5593.0, 10394.0, 10572.0],
        "always_on": [347.0, 1257.0, 4016.0, 6152.0, 7301.0, 7421.0],
        "dynspec": [345.0, 1250.0, 4000.0, 6100.0, 10300.0, 10500.0],
        "envelope_ratio": [0.99, 0.99, 1.0, 0.99, 0.99, 0.99],
        "problems": ["R(C) below 0.9 at C=64: 0.7"],
    }  # fmt: skip
    text = report.summary(sample(throughput=tp))
    lines = text.splitlines()
    assert len(lines) <= 40 and max(map(len, lines)) <= 110
    assert "throughput   FAIL   R(C) below 0.9 at C=64: 0.7" in lines
    assert "crossings    PASS   120 switches" in lines
    assert any(line.split()[:1] == ["48"] and "c" * 12 + "*" in line for line in lines)
    assert any(line.split() == ["64", "10394.0", "7301.0", "10300.0", "0.99"] for line in lines)
    assert lines[-1] == "RESULT: FAIL (exit 1)"


def test_skipped_checks_show_their_reason():
    text = report.summary(sample())
    assert "throughput   skip   not asked for" in text.splitlines()
    assert text.splitlines()[-1] == "RESULT: PASS (exit 0)"


def test_the_report_is_written_as_json_and_read_back(tmp_path):
    path = report.write(sample(), tmp_path / "new")
    assert path == tmp_path / "new" / "report.json"
    assert report.load(path) == json.loads(json.dumps(sample()))
    assert not list(path.parent.glob("*.tmp"))
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ValueError):
        report.load(tmp_path / "list.json")


THROUGHPUT = {
    "levels": [1, 16, 64],
    "base": [210.0, 3097.0, 10394.0],
    "always_on": [347.0, 4016.0, 7301.0],
    "dynspec": [345.0, 4000.0, None],
    "shape": "8b",
}


class FakeAxes:
    def __init__(self) -> None:
        self.lines: list[tuple[list[int], list[float], str]] = []
        self.vlines: list[float] = []

    def plot(self, x, y, marker, label):
        self.lines.append((x, y, label))

    def axvline(self, x, **kw):
        self.vlines.append(x)

    def __getattr__(self, name):
        return lambda *a, **k: None


def fake_matplotlib(monkeypatch: pytest.MonkeyPatch) -> FakeAxes:
    ax = FakeAxes()

    class Fig:
        def tight_layout(self):
            pass

        def savefig(self, path, dpi):
            path.write_bytes(b"\x89PNG fake")

    mpl = types.ModuleType("matplotlib")
    mpl.use = lambda backend: None  # type: ignore[attr-defined]
    pyplot = types.ModuleType("matplotlib.pyplot")
    pyplot.subplots = lambda figsize: (Fig(), ax)  # type: ignore[attr-defined]
    pyplot.close = lambda fig: None  # type: ignore[attr-defined]
    mpl.pyplot = pyplot  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", mpl)
    monkeypatch.setitem(__import__("sys").modules, "matplotlib.pyplot", pyplot)
    return ax


def test_the_plot_has_three_lines_from_the_report(tmp_path, monkeypatch):
    ax = fake_matplotlib(monkeypatch)
    png = tmp_path / "p" / "throughput.png"
    assert plot.render(sample(throughput=THROUGHPUT), png) is None
    assert png.read_bytes().startswith(b"\x89PNG")
    assert ax.lines == [
        ([1, 16, 64], [210.0, 3097.0, 10394.0], "speculation off"),
        ([1, 16, 64], [347.0, 4016.0, 7301.0], "EAGLE-3 always on"),
        ([1, 16], [345.0, 4000.0], "dynspec"),  # a failed level is left out, not drawn as zero
    ]
    assert ax.vlines == [32]


def test_without_matplotlib_the_plot_is_skipped_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    why = plot.render(sample(throughput=THROUGHPUT), tmp_path / "throughput.png")
    assert why is not None and "matplotlib is not installed" in why and "--plot" in why
    assert not (tmp_path / "throughput.png").exists()
    assert plot.render(sample(), tmp_path / "x.png") == "the report has no throughput measurements"


def test_a_real_png_when_matplotlib_is_installed(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "throughput.png"
    assert plot.render(sample(throughput=THROUGHPUT), png) is None
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dynspec_over_upstream_is_a_plain_ratio():
    assert report.over([345.0, 9000.0, None, 10.0], [300.0, 3000.0, 5.0, None]) == [1.15, 3.0, None, None]
    with pytest.raises(ValueError):
        report.over([1.0], [1.0, 2.0])


UPSTREAM = {**THROUGHPUT, "upstream_adaptive": [350.0, 4100.0, 3000.0], "dynspec_over_upstream": [0.9857, 0.9756, None]}


def test_the_plot_gets_a_4th_line_for_upstream_adaptive(tmp_path, monkeypatch):
    ax = fake_matplotlib(monkeypatch)
    assert plot.render(sample(throughput=UPSTREAM), tmp_path / "throughput.png") is None
    assert len(ax.lines) == 4
    assert ax.lines[3] == ([1, 16, 64], [350.0, 4100.0, 3000.0], "upstream --speculative-adaptive")


def test_the_summary_has_an_upstream_column_only_when_measured():
    tp = {**UPSTREAM, "passed": True, "new_tokens": 256, "simulate_acc_len": 3.0, "envelope_ratio": [0.99, 1.0, None]}
    lines = report.summary(sample(throughput=tp)).splitlines()
    assert any(line.split() == ["C", "base", "always-on", "dynspec", "R(C)", "adaptive", "dyn/ad"] for line in lines)
    assert any(line.split() == ["16", "3097.0", "4016.0", "4000.0", "1.00", "4100.0", "0.98"] for line in lines)
    assert any(line.split() == ["64", "10394.0", "7301.0", "-", "-", "3000.0", "-"] for line in lines)
    plain = report.summary(sample(throughput={**tp, "upstream_adaptive": None})).splitlines()
    assert not any("dyn/ad" in line for line in plain)


def test_a_real_png_with_four_lines(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    closed: list[Any] = []
    monkeypatch.setattr(plt, "close", closed.append)
    png = tmp_path / "throughput.png"
    assert plot.render(sample(throughput=UPSTREAM), png) is None
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    labels = [line.get_label() for line in closed[0].axes[0].get_lines()]
    assert labels == [
        "speculation off",
        "EAGLE-3 always on",
        "dynspec",
        "upstream --speculative-adaptive",
        "threshold 32",
    ]
    plt.close(closed[0])


def run(seconds: list[float]) -> list[mixed.Run]:
    """One mixed-load pass of the default phases, taking ``seconds`` each."""
    return [mixed.Run([LevelResult(c, 128, s) for c, s in zip(mixed.DEFAULT_PHASES, seconds)])]


def new_check_entries(mixed_dynspec: float = 1.0) -> dict[str, Any]:
    """exact_kv and mixed_load entries as their judges write them."""
    exact = exactkv.Recording(
        first_off={"dynspec-record-0-long-1": 10}, drafts={"dynspec-record-0-long-1": {11: [1], 12: [2]}}
    )
    stale = exactkv.Recording(first_off=exact.first_off, drafts={"dynspec-record-0-long-1": {11: [7], 12: [8]}})
    kv = exactkv.judge({"kv": exact, "full": exact, "skip": stale}, {"kv": ["d"], "full": ["d"], "skip": ["d"]}, 2, [])
    schedule = mixed.Schedule(mixed.DEFAULT_PHASES, 2, 128)

    n = len(schedule.phases)
    ml = mixed.judge(
        schedule,
        {
            "base": run([2.0] * n),
            "always_on": run([1.0] * (n // 2) + [3.0] * (n - n // 2)),
            "dynspec": run([mixed_dynspec] * n),
        },
        1.03,
        [],
    )
    ml["repeats"] = 3
    return {"exact_kv": kv, "mixed_load": ml}


def test_the_stable_keys_of_the_new_checks_are_what_their_judges_write():
    entries = new_check_entries()
    phases = mixed.DEFAULT_PHASES
    n = len(phases)

    assert {"passed", "compared_requests", "compared_steps", "control_differs"} <= set(entries["exact_kv"])
    ml = entries["mixed_load"]
    assert {"passed", "seconds", "oracle_seconds", "phases"} <= set(ml) and set(ml["seconds"]) == {
        "base",
        "always_on",
        "dynspec",
    }
    # the checks and their order (the summary's lines, --checks' choices) are part of the contract
    assert (
        " ".join(report.CHECKS)
        == "equivalence crossings exact_kv acceptance throughput mixed_load auto_threshold refusals metrics"
        " sampling logprobs penalties grammar backends"
    )
    # issue 18's metrics: the entry metrics.judge writes
    assert {"passed", "before", "after", "switches_logged", "switches_counted"} <= set(metrics.judge({}, {}, 0))
    # issue 18's refusals: each case's row (written by Refusal.judge)
    row = Refusal("x", ("--flag",), "says").judge(2, "error: says it\n", 1.0)
    assert set(row) == {"name", "args", "says", "exit_code", "seconds", "line", "problems"} and row["problems"] == []
    # issue 16's contract: auto_threshold.by_acceptance[a] has these keys
    auto = mixed.judge_auto(
        {"base": run([2.0] * n), "always_on@3": run([1.5] * n), "auto@3": run([1.0] * n), "32@3": run([1.0] * n)},
        mixed.Schedule(mixed.DEFAULT_PHASES, 2, 128),
        ["3"],
        [32],
        1.03,
    )
    assert {"passed", "by_acceptance"} <= set(auto) and auto["passed"]
    assert {"auto_s", "best_fixed_s", "best_fixed_n", "base_s", "always_on_s"} <= set(auto["by_acceptance"]["3"])
    from patcher.proof import acceptance

    entry = acceptance.judge({k: acceptance.Trace() for k in ("kv", "full", "skip", acceptance.NEVER_OFF)}, 1, [])
    assert {"passed", "always_on", "dynspec_resumed", "skip_resumed", "requests"} <= set(entry)


def test_the_summary_shows_the_new_checks_and_the_mixed_load_table():
    """Kept to 110 columns like the rest: the mixed-load header once ran to 125."""
    text = report.summary(sample(**new_check_entries()))
    lines = text.splitlines()
    assert max(map(len, lines)) <= 110
    checks = [
        line.split()[0]
        for line in lines
        if line.split()[:1] and line.split()[0] in report.CHECKS and len(line.split()) > 1
    ]
    assert checks == list(report.CHECKS)  # one line each, in order
    # the detail is cut at 110 columns like every check line's
    assert any(
        line.startswith("exact_kv     PASS   2 proposals of 1 requests after a fallback span equal the full")
        for line in lines
    )
    assert any(line.startswith("mixed_load   PASS   dynspec 9.00 s, oracle") for line in lines)
    assert "mixed load: total s, median of 3: base 18.00, always-on 19.00, dynspec 9.00" in lines
    assert "    per-phase oracle 14.00 (dynspec / oracle 0.643)" in lines
    assert any(line.split() == ["C", "base", "always-on", "dynspec", "oracle"] for line in lines)
    rows = [
        line.split()
        for line in lines
        if line.split()[:1] in (["1"], ["4"], ["16"], ["64"], ["128"]) and len(line.split()) == 5
    ]
    assert [r[0] for r in rows] == [str(c) for c in mixed.DEFAULT_PHASES]
    assert rows[0] == ["1", "2.00", "1.00", "1.00", "1.00"] and rows[-1] == ["1", "2.00", "3.00", "1.00", "2.00"]
    assert lines[-1] == "RESULT: PASS (exit 0)"


def test_a_failing_new_check_fails_the_run_and_shows_why():
    entries = new_check_entries(mixed_dynspec=2.5)
    text = report.summary(sample(**entries))
    assert (
        "mixed_load   FAIL   dynspec took 22.50 s, 1.607x the oracle's 14.00 s (at most 1.03x); dynspec is not" in text
    )
    assert report.exit_code(sample(**entries)) == 1
    assert text.splitlines()[-1] == "RESULT: FAIL (exit 1)"


def test_the_summary_gives_each_runs_time_outside_its_steady_steps_when_there_is_one() -> None:
    evidence = Path(__file__).resolve().parents[2] / "docs/proof/0.5.12-v2-s21-r32-prefill-graph-tput/report.json"
    tp = json.loads(evidence.read_text())["throughput"]
    text = report.summary(sample(throughput={**tp, "outside_steady_ms": {"dynspec": {"64": [125, 161, 173]}}}))
    assert "time beyond its tokens at its own steady speed" in text and "dynspec: C=64 125 161 173 ms" in text
    assert "time beyond its tokens" not in report.summary(sample(throughput=tp))  # older reports: no line


def test_the_summary_says_where_auto_settled_or_that_it_never_estimated() -> None:
    n = len(mixed.DEFAULT_PHASES)

    runs = {"base": run([2.0] * n), "always_on@3": run([1.5] * n), "auto@3": run([1.0] * n), "32@3": run([1.0] * n)}
    schedule = mixed.Schedule(mixed.DEFAULT_PHASES, 2, 128)
    probe = AutoDecision(127, 127, "probe the fallback at 64", 3.0)
    said = {"3": [AutoDecision(63, 56, "estimated", 2.98), probe]}
    entry = mixed.judge_auto(runs, schedule, ["3"], [32], 1.03, said)
    text = report.summary(sample(auto_threshold=entry))
    assert (
        "    auto at acceptance 3: 2 threshold changes, its estimates moved N by more than 2x 0 times; its last estimate: off above"
        " 63, on at or below 56 (acceptance 2.98)" in text
    )
    swung = {"3": [AutoDecision(1, 1, "estimated", 1.34), AutoDecision(127, 127, "estimated", 2.88), *said["3"]]}
    text = report.summary(sample(auto_threshold=mixed.judge_auto(runs, schedule, ["3"], [32], 1.03, swung)))
    assert (
        "auto at acceptance 3: 4 threshold changes, its estimates moved N by more than 2x 2 times; its last estimate:"
        in text
    )
    # the controls: a server that logged only probes never settled; a run without logs read says nothing;
    # a report from before the swings were counted does not print them
    never = report.summary(sample(auto_threshold=mixed.judge_auto(runs, schedule, ["3"], [32], 1.03, {"3": [probe]})))
    assert (
        "auto at acceptance 3: 1 threshold changes, its estimates moved N by more than 2x 0 times; its last estimate: none"
        in never
    )
    del entry["by_acceptance"]["3"]["auto_decisions"]["swings"]
    assert "auto at acceptance 3: 2 threshold changes; its last estimate: off above 63" in report.summary(
        sample(auto_threshold=entry)
    )
    assert "auto at acceptance" not in report.summary(
        sample(auto_threshold=mixed.judge_auto(runs, schedule, ["3"], [32], 1.03))
    )


def small_sweep() -> tuple[dict[str, Any], mixed.Schedule]:
    """One acceptance, one fixed N, every phase alike: the runs and schedule the readings' summary tests share."""
    n = len(mixed.DEFAULT_PHASES)
    runs = {"base": run([2.0] * n), "always_on@3": run([1.5] * n), "auto@3": run([1.0] * n), "32@3": run([1.0] * n)}
    return runs, mixed.Schedule(mixed.DEFAULT_PHASES, 2, 128)


def test_the_summary_prints_each_bands_refills_speculating_then_not() -> None:
    """A line per band, in order of size, servers that speculated there first; a report without
    refills (the control) prints none."""
    runs, schedule = small_sweep()
    refills = {
        "base": {"65-128": {"not_speculating": 0.33}, "33-64": {"not_speculating": 0.444}},
        "always_on@3": {"65-128": {"speculating": 1.745}, "33-64": {"speculating": 2.285}},
        "auto@3": {"33-64": {"speculating": 2.142, "not_speculating": 0.651}},
    }
    entry = mixed.judge_auto(runs, schedule, ["3"], [32], 1.03, None, refills)
    lines = [line for line in report.summary(sample(auto_threshold=entry)).splitlines() if "prefills per 1000" in line]
    assert lines == [
        "    prefills per 1000 tokens at 33-64 running: speculating always_on 2.29, auto 2.14; "
        "not speculating base 0.44, auto 0.65",
        "    prefills per 1000 tokens at 65-128 running: speculating always_on 1.75; not speculating base 0.33",
    ]
    unread = mixed.judge_auto(runs, schedule, ["3"], [32], 1.03)
    assert "prefills per 1000" not in report.summary(sample(auto_threshold=unread))


def test_the_summary_prints_each_concurrencys_steps_without_speculation_and_their_spread() -> None:
    """A line per concurrency, in order of size: the dynspec servers' steps, how far apart they lie,
    then plain decode's; a report without them (the control) prints none."""
    runs, schedule = small_sweep()
    read = {
        "base": {"128": 1.614, "64": 1.412, "16": 1.2},
        "auto@3": {"64": 2.687, "128": 3.418},
        "32@3": {"64": 3.099},
    }
    entry = mixed.judge_auto(runs, schedule, ["3"], [32], 1.03, None, None, read)
    lines = [
        line for line in report.summary(sample(auto_threshold=entry)).splitlines() if "without speculation" in line
    ]
    assert lines == [
        "    steady step without speculation at 16 running, ms: plain decode 1.20",  # only base there
        "    steady step without speculation at 64 running, ms: auto 2.69, 32 3.10 (the same code, up to 1.15x apart);"
        " plain decode 1.41",
        "    steady step without speculation at 128 running, ms: auto 3.42; plain decode 1.61",
    ]
    unread = mixed.judge_auto(runs, schedule, ["3"], [32], 1.03)
    assert "without speculation" not in report.summary(sample(auto_threshold=unread))


def test_the_summary_sets_auto_against_the_best_fixed_n_phase_by_phase() -> None:
    """Where auto gains or loses against the best fixed N, from the phase medians; an older report
    without them (the control) prints no such line. Kept to 110 columns."""
    n = len(mixed.DEFAULT_PHASES)
    auto = [1.0] * n
    auto[4] = 1.3  # the 128-phase, say, where auto probes
    runs = {"base": run([2.0] * n), "always_on@3": run([1.5] * n), "auto@3": run(auto), "32@3": run([1.1] * n)}
    entry = mixed.judge_auto(runs, mixed.Schedule(mixed.DEFAULT_PHASES, 2, 128), ["3"], [32], 1.03)
    text = report.summary(sample(auto_threshold=entry))
    line = "    auto - N=32 by phase, s, in the schedule's order: -0.10 -0.10 -0.10 -0.10 +0.20 -0.10 -0.10 -0.10 -0.10"
    assert line in text.splitlines() and len(line) <= 110
    del entry["by_acceptance"]["3"]["phase_medians"]
    assert "by phase, s" not in report.summary(sample(auto_threshold=entry))
