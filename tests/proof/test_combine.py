"""``dynspec proof --combine``: parts of an auto_threshold sweep, each judged within its own call,
joined into the issue's one ``by_acceptance`` entry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from patcher.cli import main
from patcher.proof import combine, mixed
from patcher.proof import report as reports

from .test_mixed import SCHEDULE, auto_runs

SWEEP = (8, 32, 64, 96)
BOUND = 1.03


def part(auto: float, fixed: dict[int, float], base: float = 10.0, always_on: float = 9.0, **run: Any) -> dict:
    """A part's report: the run fields of one card and runtime, and judge_auto's entry at acceptance 3."""
    entry = mixed.judge_auto(auto_runs(auto, fixed, base, always_on), SCHEDULE, ["3"], sorted(fixed), BOUND)
    entry.update(shape="8b", repeats=3)
    fields = {
        "sglang_version": "0.5.17",
        "path": "v2",
        "gpu": "NVIDIA H100 80GB HBM3",
        "dynspec_applied": True,
        "dynspec_revisions": {"speculative_dynspec_runtime": 30},
        "dynspec_env": {},
        "model": "dummy",
        "model_sha256": None,
        "attention_backend": "triton",
        "deterministic": False,
        "command": "python -m patcher proof --checks auto_threshold --freeze-gc",
    }
    return {**fields, **run, "checks": ["auto_threshold"], "auto_threshold": entry, "passed": entry["passed"]}


def joined_of(*parts: tuple[str, dict], sweep: tuple[int, ...] = SWEEP) -> dict:
    return combine.combine(list(parts), sweep, BOUND)


def test_parts_that_each_pass_make_one_sweep_with_the_best_n_of_all() -> None:
    """N = 8, 32 in one call (auto 8.1, its best N = 32 at 8.0) and N = 64, 96 in another (auto 7.9,
    N = 64 at 7.8, the best of all): every N of the sweep ran, auto is within 3 % of each call's N,
    and the combined row is the call that compared auto with N = 64 (auto 7.9, not the parts' median
    8.0 against a server of another call), with the medians beside."""
    joined = joined_of(("a", part(8.1, {8: 8.5, 32: 8.0}, base=10.2)), ("b", part(7.9, {64: 7.8, 96: 8.2})))
    assert joined["passed"] and joined["combined_from"] == ["a", "b"] and joined["gpu"] == "NVIDIA H100 80GB HBM3"
    entry = joined["auto_threshold"]
    assert entry["sweep"] == [8, 32, 64, 96] and entry["problems"] == [] and entry["repeats"] == 3
    row = entry["by_acceptance"]["3"]
    assert (row["best_fixed_n"], row["best_fixed_s"], row["auto_over_best_fixed"]) == (64, 7.8, 1.0128)
    assert (row["compared_in"], row["auto_s"], row["base_s"], row["always_on_s"]) == ("b", 7.9, 10.0, 9.0)
    assert (row["auto_s_median"], row["base_s_median"]) == (8.0, 10.1)
    assert row["fixed_s"] == {"8": 8.5, "32": 8.0, "64": 7.8, "96": 8.2}
    assert [(p["source"], p["sweep"], p["best_fixed_n"]) for p in row["parts"]] == [
        ("a", [8, 32], 32),
        ("b", [64, 96], 64),
    ]
    assert row["faster_than_both"] and entry["max_ratio"] == BOUND
    text = reports.summary(joined)
    assert "part: a" in text and "auto_threshold PASS   acceptance 3: auto 7.90 s, best N=64 7.80 s" in text
    assert "logs and report in" not in text  # a combined report has no logs of its own


def test_an_n_run_in_two_parts_counts_at_its_median_and_the_call_where_auto_fared_worst() -> None:
    joined = joined_of(
        ("a", part(8.0, {32: 7.9})), ("b", part(8.3, {32: 8.1, 64: 9.0})), ("c", part(8.1, {8: 9.9, 96: 9.0}))
    )
    row = joined["auto_threshold"]["by_acceptance"]["3"]
    assert row["fixed_s"]["32"] == 8.0 and row["best_fixed_n"] == 32
    # b's, the worse of a's (8.0 / 7.9) and b's (8.3 / 8.1): its row, its N = 32
    assert (row["compared_in"], row["best_fixed_s"], row["auto_over_best_fixed"]) == ("b", 8.1, round(8.3 / 8.1, 4))


def test_a_part_beyond_the_ratio_or_slower_than_both_fails_the_whole() -> None:
    """The negative controls: one part's auto 4 % behind its own best N; one slower than both
    static servers; one between them passes but is not faster than both."""
    behind = joined_of(("a", part(8.32, {8: 8.5, 32: 8.0})), ("b", part(7.9, {64: 7.8, 96: 8.2})))
    assert not behind["passed"]
    assert (
        "acceptance 3: a's auto is 1.040x its best fixed N (N=32; at most 1.03x)"
        in behind["auto_threshold"]["problems"]
    )
    slow = joined_of(("a", part(9.5, {8: 9.5, 32: 9.4}, base=9.0, always_on=8.9)), ("b", part(7.9, {64: 7.8, 96: 8.2})))
    assert "acceptance 3: a's auto is slower than base and always-on" in slow["auto_threshold"]["problems"]
    between = joined_of(("a", part(9.5, {8: 9.5, 32: 9.4})), ("b", part(7.9, {64: 7.8, 96: 8.2})))
    row = between["auto_threshold"]["by_acceptance"]["3"]
    assert between["passed"] and not row["faster_than_both"] and not row["parts"][0]["faster_than_both"]


def test_a_parts_own_ratio_is_recomputed_not_trusted() -> None:
    """A hand-edited part claiming 1.0 where its times say 1.04 fails as the times say."""
    edited = part(8.32, {8: 8.5, 32: 8.0})
    edited["auto_threshold"]["by_acceptance"]["3"]["auto_over_best_fixed"] = 1.0
    edited["auto_threshold"]["problems"] = []
    joined = joined_of(("a", edited), ("b", part(7.9, {64: 7.8, 96: 8.2})))
    assert joined["auto_threshold"]["problems"] == [
        "acceptance 3: a's auto is 1.040x its best fixed N (N=32; at most 1.03x)"
    ]


def test_a_sweep_with_an_n_no_part_ran_fails_and_a_parts_own_problems_carry_over() -> None:
    short = joined_of(("a", part(8.1, {8: 8.5, 32: 8.0})), ("b", part(7.9, {64: 7.8})))
    assert not short["passed"] and short["auto_threshold"]["problems"] == ["acceptance 3: N=96 ran in no part"]
    failed = part(7.9, {64: 7.8, 96: 8.2})
    failed["auto_threshold"]["problems"] = ["dynspec-n96-sim: request 3 failed: HTTP 500"]
    joined = joined_of(("a", part(8.1, {8: 8.5, 32: 8.0})), ("b", failed))
    assert joined["auto_threshold"]["problems"] == ["b: dynspec-n96-sim: request 3 failed: HTTP 500"]


def interrupted_before(n: int, fixed: dict[int, float]) -> dict[str, Any]:
    """A part whose call stopped before its N = ``n`` server: judge_auto's entry for a sweep that
    names ``n`` with no passes of it, and run.py's line for the stop in front."""
    stopped = part(7.9, fixed)
    entry = mixed.judge_auto(auto_runs(7.9, fixed), SCHEDULE, ["3"], sorted([*fixed, n]), BOUND)
    entry["problems"] = [mixed.INTERRUPTED.format(5, 6), *entry["problems"]]
    entry.update(shape="8b", repeats=3, passed=False)
    stopped.update(auto_threshold=entry, passed=False)
    return stopped


def test_an_interrupted_part_counts_for_what_it_measured_where_another_part_ran_the_rest() -> None:
    """Session 48: a call stopped before its N = 96; a second call ran N = 96 alone."""
    parts = (("a", part(8.1, {8: 8.5, 32: 8.0})), ("b", interrupted_before(96, {64: 7.8})))
    assert parts[1][1]["auto_threshold"]["problems"] == [
        "interrupted after 5 of 6 servers were measured",
        "acceptance 3: no complete pass on N=96",
    ]
    joined = joined_of(*parts, ("c", part(7.95, {96: 8.2})))
    assert joined["passed"] and joined["auto_threshold"]["problems"] == []
    # the control: without the part that ran it, the missing N fails the join, in the join's own words
    alone = joined_of(*parts)
    assert not alone["passed"] and alone["auto_threshold"]["problems"] == ["acceptance 3: N=96 ran in no part"]


@pytest.mark.parametrize(
    ("problem", "only_unmeasured"),
    [
        (mixed.INTERRUPTED.format(4, 5), True),
        ("acceptance 2: no complete pass on N=96", True),
        ("acceptance real: no complete pass on auto, N=8", True),
        ("acceptance 3: auto took 8.40 s, 1.050x the best fixed N's (N=32, 8.00 s; at most 1.03x)", False),
        ("the dynspec-n96-sim server did not start", False),
        ("dynspec-n96-sim: request 3 failed: no complete pass on the stream", False),
    ],
)
def test_only_lines_about_unmeasured_servers_are_left_to_the_join(problem: str, only_unmeasured: bool) -> None:
    assert mixed.unmeasured(problem) is only_unmeasured


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gpu": "NVIDIA H200"}, "b: gpu 'NVIDIA H200' differs from a's 'NVIDIA H100 80GB HBM3'"),
        ({"dynspec_revisions": {"speculative_dynspec_runtime": 31}}, "b: dynspec_revisions"),
        ({"sglang_version": "0.5.16"}, "b: sglang_version '0.5.16' differs"),
        ({"dynspec_env": {"DYNSPEC_DRAFT_KV": "full"}}, "b: dynspec_env"),
        # batch-invariant kernels (real weights before --deterministic auto left timing runs off)
        ({"deterministic": True}, "b: deterministic True differs from a's False"),
        (
            {"command": "python -m patcher proof --freeze-gc --extra-args '--disable-piecewise-cuda-graph'"},
            "server_flags",
        ),
        ({"command": "python -m patcher proof"}, "server_flags"),
    ],
)
def test_parts_of_other_runs_are_refused_by_name(change: dict, message: str) -> None:
    with pytest.raises(combine.CombineError, match=message):
        joined_of(("a", part(8.1, {8: 8.5})), ("b", part(7.9, {64: 7.8}, **change)))


def test_parts_run_at_other_thresholds_join_unless_auto_came_back_on_at_another_size() -> None:
    """No server of the sweep runs with --threshold (kv-auto passes 32, real-auto 8), so the parts
    join whatever it was, and whatever the ``enable_threshold`` it made a report say; auto's own
    switch-on bound, --enable-threshold, must agree (the control), and must be a number."""
    at_8 = {"command": "python -m patcher proof --threshold 8 --freeze-gc", "enable_threshold": 8}
    joined = joined_of(
        ("a", part(8.1, {8: 8.5, 32: 8.0}, enable_threshold=32)), ("b", part(7.9, {64: 7.8, 96: 8.2}, **at_8))
    )
    assert joined["passed"] and joined["enable_threshold"] is None
    bound = {"command": "python -m patcher proof --enable-threshold 4 --freeze-gc"}
    with pytest.raises(combine.CombineError, match="^b: --enable-threshold '4' differs from a's None$"):
        joined_of(("a", part(8.1, {8: 8.5})), ("b", part(7.9, {64: 7.8}, **bound)))
    both = joined_of(("a", part(8.1, {8: 8.5, 32: 8.0}, **bound)), ("b", part(7.9, {64: 7.8, 96: 8.2}, **bound)))
    assert both["enable_threshold"] == 4
    for bad in ("x", "0", "\u00b2"):  # click writes IntRange(1)'s; a hand-edited command may not
        with pytest.raises(combine.CombineError, match=f"^a: --enable-threshold '{bad}' is not a batch size$"):
            command = f"python -m patcher proof --enable-threshold {bad}"
            joined_of(("a", part(8.1, {8: 8.5}, command=command)), ("b", part(7.9, {64: 7.8})))


def test_a_combined_report_or_one_without_its_command_is_not_a_part() -> None:
    """A combined report names no command (its parts' servers were given theirs), so it would read as
    run without --enable-threshold, --extra-args or --freeze-gc whatever its parts had: refused, as
    is any report without a command line. The control: the same parts join."""
    joined = joined_of(("a", part(8.1, {8: 8.5, 32: 8.0})), ("b", part(7.9, {64: 7.8, 96: 8.2})))
    with pytest.raises(combine.CombineError, match="^ab: a combined report, not a part: give the parts"):
        joined_of(("ab", joined), ("c", part(7.9, {64: 7.8})))
    with pytest.raises(combine.CombineError, match="^b: no dynspec proof command line"):
        joined_of(("a", part(8.1, {8: 8.5})), ("b", part(7.9, {64: 7.8}, command=None)))
    assert joined["passed"]


def test_another_load_the_same_run_twice_a_report_without_the_check_and_a_lone_part_are_refused() -> None:
    other = part(7.9, {64: 7.8})
    other["auto_threshold"]["repeats"] = 2
    with pytest.raises(combine.CombineError, match="b: auto_threshold repeats 2 differs from a's 3"):
        joined_of(("a", part(8.1, {8: 8.5})), ("b", other))
    at = "2026-12-07T10:22:00"
    with pytest.raises(combine.CombineError, match=f"b: the same run as a \\(started {at}\\)"):
        joined_of(("a", part(8.1, {8: 8.5}, started=at)), ("b", part(8.1, {8: 8.5}, started=at)))
    with pytest.raises(combine.CombineError, match="b: no auto_threshold entry"):
        joined_of(("a", part(8.1, {8: 8.5})), ("b", {"checks": ["mixed_load"]}))
    with pytest.raises(combine.CombineError, match="two or more parts"):
        joined_of(("a", part(8.1, {8: 8.5})))


def broken(edit: Any) -> dict:
    report = part(7.9, {64: 7.8})
    edit(report["auto_threshold"], report["auto_threshold"]["by_acceptance"]["3"])
    return report


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda e, r: r.update(auto_s="7.9"), "auto_s '7.9' is not a time"),
        (lambda e, r: r.update(oracle_s=float("nan")), "oracle_s nan is not a time"),
        (lambda e, r: r.update(base_s=True), "base_s True is not a time"),
        (lambda e, r: r.pop("fixed_s"), "no fixed_s"),
        (lambda e, r: r["fixed_s"].update({"x": 1.0}), "fixed_s 'x'"),
        (lambda e, r: r["fixed_s"].update({"96": float("inf")}), "fixed_s '96'"),
        (lambda e, r: r.update(auto_decisions="settled"), "auto_decisions 'settled'"),
        (lambda e, r: e.update(problems=3), "problems are not a list"),
    ],
)
def test_a_row_not_judge_autos_is_refused_by_name_not_with_a_traceback(edit: Any, message: str) -> None:
    with pytest.raises(combine.CombineError, match=f"b: .*{message}"):
        joined_of(("a", part(8.1, {8: 8.5})), ("b", broken(edit)))


def relabelled(report: dict, label: str, **weights: Any) -> dict:
    """``report`` with its one acceptance row under ``label`` and other weights (a real model's part)."""
    entry = report["auto_threshold"]
    (row,) = entry["by_acceptance"].values()
    entry["by_acceptance"] = {label: row}
    entry["shape"] = weights.pop("shape", entry["shape"])
    return {**report, **weights}


def test_a_real_models_part_joins_the_simulated_ones_under_its_own_label() -> None:
    """The issue's one report holds acceptances 2 – 4 on dummy weights and ``real`` on the real model:
    weights and the servers' extra flags must agree only within a label. The control: two parts of
    one label on other heads."""
    real = {
        "model": "SmolLM2-135M-Instruct",
        "model_sha256": {"gguf": "b179", "head": "8379"},
        "shape": "real",
        "command": "python -m patcher proof --freeze-gc --extra-args '--disable-piecewise-cuda-graph'",
    }
    parts = [
        ("a", part(8.1, {8: 8.5, 32: 8.0})),
        ("b", part(7.9, {64: 7.8, 96: 8.2})),
        ("r1", relabelled(part(5.0, {8: 5.2, 32: 5.1}), "real", **real)),
        ("r2", relabelled(part(5.0, {64: 5.3, 96: 5.4}), "real", **real)),
    ]
    joined = joined_of(*parts)
    assert joined["passed"] and set(joined["auto_threshold"]["by_acceptance"]) == {"3", "real"}
    weights = joined["auto_threshold"]["weights"]
    assert weights["real"]["model"] == "SmolLM2-135M-Instruct"
    assert weights["real"]["server_flags"] == {"extra_args": ["--disable-piecewise-cuda-graph"], "freeze_gc": True}
    assert weights["3"] == {
        "model": "dummy",
        "model_sha256": None,
        "shape": "8b",
        "server_flags": {"extra_args": [], "freeze_gc": True},
    }
    assert "model" not in joined and "shape" not in joined["auto_threshold"]  # two kinds: no one name for both
    alone = joined_of(*parts[:2])
    assert alone["model"] == "dummy" and alone["auto_threshold"]["shape"] == "8b"
    other = relabelled(
        part(5.0, {64: 5.3, 96: 5.4}), "real", **{**real, "model_sha256": {"gguf": "b179", "head": "ff"}}
    )
    with pytest.raises(combine.CombineError, match="r2: acceptance real's model_sha256 .* differs from r1's"):
        joined_of(*parts[:3], ("r2", other))


def write(path: Path, report: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report))
    return path


def test_the_command_writes_the_joined_report_and_exits_by_its_verdict(tmp_path: Path) -> None:
    a = write(tmp_path / "a" / "report.json", part(8.1, {8: 8.5, 32: 8.0}))
    b = write(tmp_path / "b" / "report.json", part(7.9, {64: 7.8, 96: 8.2}))
    args = ["proof", "--combine", str(a), "--combine", str(b), "--auto-sweep", "8,32,64,96"]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "joined")])
    assert result.exit_code == 0, result.output
    saved = reports.load(tmp_path / "joined" / "report.json")
    assert saved["auto_threshold"]["by_acceptance"]["3"]["best_fixed_n"] == 64
    assert (tmp_path / "joined" / "summary.txt").read_text() == result.output
    # the control: the default sweep has 16 and 48, which no part ran, so the same parts fail
    again = CliRunner().invoke(main, ["proof", "--combine", str(a), "--combine", str(b)])
    assert again.exit_code == 1 and "N=16, 48 ran in no part" in again.output


def test_bad_parts_exit_2_with_one_line_and_write_nothing(tmp_path: Path) -> None:
    a = write(tmp_path / "a" / "report.json", part(8.1, {8: 8.5}))
    b = write(tmp_path / "b" / "report.json", part(7.9, {64: 7.8}, gpu="NVIDIA H200"))
    out = tmp_path / "joined"
    result = CliRunner().invoke(main, ["proof", "--combine", str(a), "--combine", str(b), "--out", str(out)])
    assert result.exit_code == 2 and "--combine: " in result.output and "gpu 'NVIDIA H200' differs" in result.output
    assert not out.exists()
    junk = tmp_path / "junk.json"
    junk.write_text("not json")
    result = CliRunner().invoke(main, ["proof", "--combine", str(a), "--combine", str(junk)])
    assert result.exit_code == 2 and "--combine: " in result.output


def test_a_part_given_twice_or_an_out_over_a_part_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    a = write(tmp_path / "a" / "report.json", part(8.1, {8: 8.5, 32: 8.0}))
    b = write(tmp_path / "b" / "report.json", part(7.9, {64: 7.8, 96: 8.2}))
    before = a.read_text()
    twice = CliRunner().invoke(
        main, ["proof", "--combine", str(a), "--combine", str(tmp_path / "b" / ".." / "a" / "report.json")]
    )
    assert twice.exit_code == 2 and "is given twice" in twice.output
    over = CliRunner().invoke(main, ["proof", "--combine", str(a), "--combine", str(b), "--out", str(tmp_path / "a")])
    assert over.exit_code == 2 and "would overwrite a part's own report.json" in over.output
    assert a.read_text() == before


def test_each_part_carries_how_often_its_auto_swung_where_its_report_counted_it() -> None:
    """Parts since session 47 count auto's moves of N by more than 2x (``auto_decisions.swings``); the
    join keeps each part's count and the summary prints it; a part from before has no count, and the
    join adds none (the control)."""
    counted = part(8.1, {8: 8.5, 32: 8.0})
    counted["auto_threshold"]["by_acceptance"]["3"]["auto_decisions"] = {
        "count": 9,
        "estimated": 7,
        "swings": 4,
        "last": None,
        "last_estimated": None,
    }
    joined = joined_of(("a", counted), ("b", part(7.9, {64: 7.8, 96: 8.2})))
    a, b = joined["auto_threshold"]["by_acceptance"]["3"]["parts"]
    assert a["swings"] == 4 and "swings" not in b
    lines = [line for line in reports.summary(joined).splitlines() if ", part " in line]
    assert lines[0].endswith("; auto's estimates moved N by more than 2x 4 times") and "2x" not in lines[1]


def test_each_part_carries_its_servers_refills_where_its_report_read_them() -> None:
    """Parts since session 49 read each server's prefills per 1000 tokens; the join keeps each part's
    and the summary prints them under the part's line; a part from before has none (the control)."""
    read = part(8.1, {8: 8.5, 32: 8.0})
    rates = {"always_on": {"33-64": {"speculating": 2.3}}, "8": {"33-64": {"not_speculating": 0.4}}}
    read["auto_threshold"]["by_acceptance"]["3"]["prefills_per_1000_tokens"] = rates
    joined = joined_of(("a", read), ("b", part(7.9, {64: 7.8, 96: 8.2})))
    a, b = joined["auto_threshold"]["by_acceptance"]["3"]["parts"]
    assert a["prefills_per_1000_tokens"] == rates and "prefills_per_1000_tokens" not in b
    lines = reports.summary(joined).splitlines()
    at = next(i for i, line in enumerate(lines) if ", part a:" in line)
    assert (
        lines[at + 1]
        == "      prefills per 1000 tokens at 33-64 running: speculating always_on 2.30; not speculating 8 0.40"
    )
    assert sum("prefills per 1000" in line for line in lines) == 1


def test_each_part_carries_its_servers_steps_without_speculation_where_its_report_read_them() -> None:
    """Parts since session 50 read each server's steady steps without speculation and their spread;
    the join keeps each part's and the summary prints them under the part's line; a part from before
    has neither (the control)."""
    read = part(8.1, {8: 8.5, 32: 8.0})
    row = read["auto_threshold"]["by_acceptance"]["3"]
    row["fallback_step_ms"] = {"auto": {"64": 2.7}, "8": {"64": 2.4}, "base": {"64": 1.4}}
    row["fallback_step_spread"] = {"64": 1.125}
    joined = joined_of(("a", read), ("b", part(7.9, {64: 7.8, 96: 8.2})))
    a, b = joined["auto_threshold"]["by_acceptance"]["3"]["parts"]
    assert a["fallback_step_ms"] == row["fallback_step_ms"] and a["fallback_step_spread"] == {"64": 1.125}
    assert "fallback_step_ms" not in b and "fallback_step_spread" not in b
    lines = [line for line in reports.summary(joined).splitlines() if "without speculation" in line]
    assert lines == [
        "      steady step without speculation at 64 running, ms: auto 2.70, 8 2.40 (the same code, up to 1.12x apart);"
        " plain decode 1.40"
    ]
