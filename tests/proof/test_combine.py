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


def part(auto: float, fixed: dict[int, float], base: float = 10.0, always_on: float = 9.0, **run: Any) -> dict:
    """A part's report: the run fields of one card and runtime, and judge_auto's entry at acceptance 3."""
    entry = mixed.judge_auto(auto_runs(auto, fixed, base, always_on), SCHEDULE, ["3"], sorted(fixed), 1.03)
    entry.update(shape="8b", repeats=3)
    fields = {
        "sglang_version": "0.5.17",
        "path": "v2",
        "gpu": "NVIDIA H100 80GB HBM3",
        "dynspec_applied": True,
        "dynspec_revisions": {"speculative_dynspec_runtime": 30},
        "model": "dummy",
        "model_sha256": None,
        "attention_backend": "triton",
        "dynspec_flags": "--speculative-disable-batch-size 32",
    }
    return {**fields, **run, "checks": ["auto_threshold"], "auto_threshold": entry, "passed": entry["passed"]}


def test_parts_that_each_pass_make_one_sweep_with_the_best_n_of_all() -> None:
    """N = 8, 32 in one call (auto 8.1, its best N = 32 at 8.0) and N = 64, 96 in another (auto 7.9,
    N = 64 at 7.8, the best of all): every N of the sweep ran, auto is within 3 % of each call's N,
    and the combined ratio is the same-call one of the part that ran N = 64, not auto's median
    against a server of another call."""
    joined = combine.combine([("a", part(8.1, {8: 8.5, 32: 8.0})), ("b", part(7.9, {64: 7.8, 96: 8.2}))], SWEEP)
    assert joined["passed"] and joined["combined_from"] == ["a", "b"] and joined["gpu"] == "NVIDIA H100 80GB HBM3"
    entry = joined["auto_threshold"]
    assert entry["sweep"] == [8, 32, 64, 96] and entry["problems"] == [] and entry["repeats"] == 3
    row = entry["by_acceptance"]["3"]
    assert (row["best_fixed_n"], row["best_fixed_s"], row["auto_over_best_fixed"]) == (64, 7.8, 1.0128)
    assert (row["auto_s"], row["base_s"], row["always_on_s"]) == (8.0, 10.0, 9.0)  # medians over the parts
    assert row["fixed_s"] == {"8": 8.5, "32": 8.0, "64": 7.8, "96": 8.2}
    assert [(p["source"], p["sweep"], p["best_fixed_n"]) for p in row["parts"]] == [
        ("a", [8, 32], 32),
        ("b", [64, 96], 64),
    ]
    assert row["faster_than_both"]
    text = reports.summary(joined)
    assert "part: a" in text and "auto_threshold PASS   acceptance 3: auto 8.00 s, best N=64 7.80 s" in text
    assert "logs and report in" not in text  # a combined report has no logs of its own


def test_an_n_run_in_two_parts_counts_at_its_median_and_the_worse_same_call_ratio() -> None:
    joined = combine.combine(
        [("a", part(8.0, {32: 7.9})), ("b", part(8.3, {32: 8.1, 64: 9.0})), ("c", part(8.1, {8: 9.9, 96: 9.0}))], SWEEP
    )
    row = joined["auto_threshold"]["by_acceptance"]["3"]
    assert row["fixed_s"]["32"] == 8.0 and row["best_fixed_n"] == 32
    assert row["auto_over_best_fixed"] == round(8.3 / 8.1, 4)  # b's, the worse of a's (8.0 / 7.9) and b's


def test_a_part_beyond_the_ratio_or_slower_than_both_fails_the_whole() -> None:
    """The negative controls: one part's auto 4 % behind its own best N; one slower than both
    static servers; the same numbers within the ratio pass (above)."""
    behind = combine.combine([("a", part(8.32, {8: 8.5, 32: 8.0})), ("b", part(7.9, {64: 7.8, 96: 8.2}))], SWEEP)
    assert not behind["passed"]
    assert (
        "acceptance 3: a's auto is 1.040x its best fixed N (N=32; at most 1.03x)"
        in behind["auto_threshold"]["problems"]
    )
    slow = combine.combine(
        [("a", part(9.5, {8: 9.5, 32: 9.4}, base=9.0, always_on=8.9)), ("b", part(7.9, {64: 7.8, 96: 8.2}))], SWEEP
    )
    assert "acceptance 3: a's auto is slower than base and always-on" in slow["auto_threshold"]["problems"]


def test_a_sweep_with_an_n_no_part_ran_fails_and_a_parts_own_problems_carry_over() -> None:
    short = combine.combine([("a", part(8.1, {8: 8.5, 32: 8.0})), ("b", part(7.9, {64: 7.8}))], SWEEP)
    assert not short["passed"] and short["auto_threshold"]["problems"] == ["acceptance 3: N=96 ran in no part"]
    interrupted = part(7.9, {64: 7.8, 96: 8.2})
    interrupted["auto_threshold"]["problems"] = ["interrupted after 4 of 5 servers were measured"]
    joined = combine.combine([("a", part(8.1, {8: 8.5, 32: 8.0})), ("b", interrupted)], SWEEP)
    assert joined["auto_threshold"]["problems"] == ["b: interrupted after 4 of 5 servers were measured"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gpu": "NVIDIA H200"}, "b: gpu 'NVIDIA H200' differs from a's 'NVIDIA H100 80GB HBM3'"),
        ({"dynspec_revisions": {"speculative_dynspec_runtime": 31}}, "b: dynspec_revisions"),
        ({"sglang_version": "0.5.16"}, "b: sglang_version '0.5.16' differs"),
    ],
)
def test_parts_of_other_runs_are_refused_by_name(change: dict, message: str) -> None:
    with pytest.raises(combine.CombineError, match=message):
        combine.combine([("a", part(8.1, {8: 8.5})), ("b", part(7.9, {64: 7.8}, **change))], SWEEP)


def test_another_load_a_report_without_the_check_and_a_lone_part_are_refused() -> None:
    other = part(7.9, {64: 7.8})
    other["auto_threshold"]["repeats"] = 2
    with pytest.raises(combine.CombineError, match="b: auto_threshold repeats 2 differs from a's 3"):
        combine.combine([("a", part(8.1, {8: 8.5})), ("b", other)], SWEEP)
    with pytest.raises(combine.CombineError, match="b: no auto_threshold entry"):
        combine.combine([("a", part(8.1, {8: 8.5})), ("b", {"checks": ["mixed_load"]})], SWEEP)
    with pytest.raises(combine.CombineError, match="two or more parts"):
        combine.combine([("a", part(8.1, {8: 8.5}))], SWEEP)


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


def test_a_row_without_its_numbers_is_refused_not_a_traceback() -> None:
    """A hand-edited part: a time as text, a row without fixed_s, no max_ratio."""
    texts = part(7.9, {64: 7.8})
    texts["auto_threshold"]["by_acceptance"]["3"]["auto_s"] = "7.9"
    bare = part(7.9, {64: 7.8})
    del bare["auto_threshold"]["by_acceptance"]["3"]["fixed_s"]
    unbounded = part(7.9, {64: 7.8})
    del unbounded["auto_threshold"]["max_ratio"]
    for broken, message in (
        (texts, "row is not judge_auto's"),
        (bare, "row is not judge_auto's"),
        (unbounded, "no max_ratio"),
    ):
        with pytest.raises(combine.CombineError, match=f"b: .*{message}"):
            combine.combine([("a", part(8.1, {8: 8.5})), ("b", broken)], SWEEP)


def relabelled(report: dict, label: str, **weights: Any) -> dict:
    """``report`` with its one acceptance row under ``label`` and other weights (a real model's part)."""
    entry = report["auto_threshold"]
    (row,) = entry["by_acceptance"].values()
    entry["by_acceptance"] = {label: row}
    entry["shape"] = weights.pop("shape", entry["shape"])
    return {**report, **weights}


def test_a_real_models_part_joins_the_simulated_ones_under_its_own_label() -> None:
    """The issue's one report holds acceptances 2 – 4 on dummy weights and ``real`` on the real model:
    weights must agree only within a label. The control: two parts of one label on other models."""
    real = {"model": "SmolLM2-135M-Instruct", "model_sha256": {"gguf": "b179", "head": "8379"}, "shape": "real"}
    parts = [
        ("a", part(8.1, {8: 8.5, 32: 8.0})),
        ("b", part(7.9, {64: 7.8, 96: 8.2})),
        ("r1", relabelled(part(5.0, {8: 5.2, 32: 5.1}), "real", **real)),
        ("r2", relabelled(part(5.0, {64: 5.3, 96: 5.4}), "real", **real)),
    ]
    joined = combine.combine(parts, SWEEP)
    assert joined["passed"] and set(joined["auto_threshold"]["by_acceptance"]) == {"3", "real"}
    assert joined["auto_threshold"]["weights"]["real"]["model"] == "SmolLM2-135M-Instruct"
    assert joined["auto_threshold"]["weights"]["3"] == {"model": "dummy", "model_sha256": None, "shape": "8b"}
    assert "model" not in joined and "shape" not in joined["auto_threshold"]  # two kinds: no one name for both
    alone = combine.combine(parts[:2], SWEEP)
    assert alone["model"] == "dummy" and alone["auto_threshold"]["shape"] == "8b"
    other = relabelled(
        part(5.0, {64: 5.3, 96: 5.4}), "real", **{**real, "model_sha256": {"gguf": "b179", "head": "ffff"}}
    )
    with pytest.raises(combine.CombineError, match="r2: acceptance real's model_sha256 .* differs from r1's"):
        combine.combine([*parts[:3], ("r2", other)], SWEEP)
