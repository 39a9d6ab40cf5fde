"""The whole proof against fake SGLang servers started as real process groups."""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from patcher.proof import detect, features, launch, metrics, pools, run
from patcher.proof import report as reports
from patcher.proof.errors import ProofUsageError
from patcher.proof.run import ProofOptions, run_proof

from .conftest import alive, real_dir, some_port


def options(root: Path, out: Path, faults: str = "", **kw: object) -> ProofOptions:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNSPEC_")}
    env.update(PYTHONPATH=str(root), FAKE_SGLANG_FAULT=faults, FAKE_SGLANG_DELAY="0.05", DYNSPEC_EARLY_FENCE="1")
    env.pop("SGLANG_SIMULATE_ACC_LEN", None)
    base: dict[str, object] = {
        "out": out,
        "python": sys.executable,
        "threshold": 4,
        "levels": (1, 2, 8),
        "new_tokens": 8,
        "ramp_low": 1,
        "ramp_high": 8,
        "ramp_new_tokens": 4,
        "min_crossings": 10,
        "ramp_max_waves": 60,
        "throughput_levels": (1, 8),
        "throughput_new_tokens": 8,
        "port": some_port(),
        "start_timeout": 30,
        "stop_timeout": 5,
        "poll_interval": 0.05,
        "settle": 0.05,
        "command": "dynspec proof --test",
        "env": env,
    }
    base.update(kw)
    return ProofOptions(**base)  # type: ignore[arg-type]


def server_pids(out: Path) -> list[int]:
    return [int(p) for log in out.glob("*.log") for p in re.findall(r"scheduler pid (\d+)", log.read_text())]


def test_a_correct_dynspec_passes_every_check(site, tmp_path):
    out = tmp_path / "out"
    notes: list[str] = []
    opts = options(site(), out, checks=("equivalence", "crossings", "throughput"), min_envelope_ratio=0.0)
    result = run_proof(opts, notes.append)  # timing on a CPU is noise: the ratio is tested below
    assert result["passed"] is True and result["complete"] is True, reports.summary(result)
    assert reports.exit_code(result) == 0

    saved = json.loads((out / "report.json").read_text())
    assert saved == json.loads(json.dumps(result))
    for key in ("sglang_version", "path", "gpu", "command", "equivalence", "crossings", "throughput"):
        assert key in saved
    assert saved["sglang_version"] == "0.5.12" and saved["path"] == "v2" and saved["dynspec_applied"] is True

    eq = saved["equivalence"]
    assert eq["passed"] and eq["levels"] == [1, 2, 8]
    assert set(eq["digests"]) == {"base", "always_on", "dynspec", "dynspec_after_ramp"}
    assert len(set(eq["digests"]["base"])) == 3  # each level has its own outputs
    assert all(len(set(d)) == 1 for d in zip(*eq["digests"].values()))
    states = [row["dynspec_state"] for row in eq["per_level"]]
    assert states[0].startswith("ON") and "OFF" in states[2]  # the switched path was exercised

    cr = saved["crossings"]
    assert cr["passed"] and cr["count"] >= 10 and cr["off"] and cr["on"] and cr["errors"] == []
    assert cr["stop_reason"] == "target reached" and cr["ok_requests"] == cr["requests"]

    assert saved["dynspec_env"] == {"DYNSPEC_EARLY_FENCE": "1"}  # the runtime switches the servers ran with

    tp = saved["throughput"]
    assert tp["levels"] == [1, 8]
    for key in ("base", "always_on", "dynspec", "envelope_ratio"):
        assert len(tp[key]) == 2 and all(isinstance(x, float) for x in tp[key])
    assert all(a > 2 for a in tp["accept_length"]["always_on"])  # SGLANG_SIMULATE_ACC_LEN reached it
    assert tp["accept_length"]["base"] == [None, None]
    assert (tp["warmup"], tp["repeats"]) == (True, 3)
    for mode in ("base", "always_on", "dynspec"):
        for value, runs in zip(tp[mode], tp["samples"][mode]):
            assert len(runs) == 3 and value == sorted(runs)[1]  # the median run counts
    # The fake logs 3 decode lines at 8 requests; the first has no steady line before it. Always-on
    # adds 3 tokens per request and step, so it has no steady interval to compare.
    assert tp["per_step"] == {"dynspec": {"8": {"pairs": 2, "min": 0.85, "median": 0.85, "max": 0.85}}}
    assert "dynspec: C=8 0.85-0.85 (median 0.85, 2 pairs)" in reports.summary(saved)
    assert tp["per_run"] == {"dynspec": {"8": [850]}, "base": {"8": [1000]}}  # always-on: nothing steady
    assert "    dynspec: C=8 850" in reports.summary(saved)

    assert '"POST /flush_cache HTTP/1.1" 200' in (out / "dynspec.log").read_text()  # before the second pass
    names = [s["name"] for s in saved["servers"]]
    assert names == ["dynspec", "always-on", "base", "dynspec-sim", "always-on-sim", "base-sim"]
    for server in saved["servers"]:
        log = Path(server["log"]).read_text()
        assert server["stopped_by"] == "SIGTERM" and server["errors"] == []
        assert ("SGLANG_SIMULATE_ACC_LEN=3 " in log) == server["name"].endswith("-sim")
        assert server["startup_notes"] == []  # the benign import warning is not an error
    assert any("starting dynspec server" in n for n in notes)
    pids = server_pids(out)
    assert len(pids) == 6 and not any(alive(p) for p in pids)


def test_outputs_that_change_when_speculation_is_off_fail_equivalence(site, tmp_path):
    result = run_proof(options(site(), tmp_path / "out", faults="diverge", checks=("equivalence",)), lambda m: None)
    eq = result["equivalence"]
    assert not eq["passed"] and reports.exit_code(result) == 1
    assert eq["mismatch_count"] > 0
    assert {m["server"] for m in eq["mismatches"]} == {"dynspec"}
    assert all(m["C"] == 8 and m["first_diff"] == 2 for m in eq["mismatches"])
    assert "differ from base" in eq["problems"][0]


def test_without_a_cache_flush_the_levels_are_not_sent_again_after_the_ramp(site, tmp_path):
    opts = options(site(), tmp_path / "out", faults="noflush", settle=0.01)
    result = run_proof(opts, lambda m: None)
    assert result["passed"]  # a missing endpoint is a note, not a failure
    assert set(result["equivalence"]["digests"]) == {"base", "always_on", "dynspec"}
    assert result["notes"][0].startswith("/flush_cache answered 400")


def test_a_threshold_that_never_switches_fails_both_checks(site, tmp_path):
    result = run_proof(options(site(), tmp_path / "out", faults="noswitch", ramp_max_waves=6), lambda m: None)
    assert not result["equivalence"]["passed"]
    assert any("did not test the switched path" in p for p in result["equivalence"]["problems"])
    cr = result["crossings"]
    assert not cr["passed"] and cr["count"] == 0 and cr["stop_reason"] == "wave cap (6) reached"
    assert "only 0 switches logged, 10 needed" in cr["problems"]


def test_errors_and_failed_requests_fail_the_crossings(site, tmp_path):
    result = run_proof(
        options(site(), tmp_path / "out", faults="http500,traceback", checks=("crossings",)), lambda m: None
    )
    cr = result["crossings"]
    assert not cr["passed"] and cr["stop_reason"] == "a request failed"
    assert any("HTTP 500" in e for e in cr["errors"])
    assert any("RuntimeError: injected" in e for e in cr["errors"])
    assert any('"POST /generate HTTP/1.1" 500' in e for e in cr["errors"])  # seen in the access log too
    assert [s["name"] for s in result["servers"]] == ["dynspec"]


def test_a_switch_on_the_wrong_side_of_the_threshold_fails(site, tmp_path):
    result = run_proof(options(site(), tmp_path / "out", faults="wrongside", checks=("crossings",)), lambda m: None)
    assert "switched OFF at batch size 4 <= threshold 4" in result["crossings"]["problems"]


def auto_options(root: Path, out: Path, faults: str = "", **kw: object) -> ProofOptions:
    """``--threshold auto`` as the command sets it up: levels and a ramp past auto's ceiling (127)."""
    settings: dict[str, object] = {
        "threshold": "auto",
        "levels": (1, 2, 128),
        "ramp_high": 128,
        "min_crossings": 6,
        "checks": ("equivalence", "crossings"),
    }
    opts = options(root, out, faults, **{**settings, **kw})
    # The fake counts requests in flight: 128 must all be in at once to pass the ceiling, so each is
    # held long enough for the last to arrive on a loaded machine (0.05 s was not, once in CI).
    assert opts.env is not None
    opts.env = {**opts.env, "FAKE_SGLANG_DELAY": "0.5"}
    return opts


def test_auto_proves_equivalence_and_crossings_where_it_moves_its_switch_point(site, tmp_path):
    result = run_proof(auto_options(site(version="0.5.17"), tmp_path / "out"), lambda m: None)
    assert result["passed"], reports.summary(result)
    assert result["threshold"] == "auto" and result["enable_threshold"] is None
    assert result["dynspec_flags"] == "--speculative-disable-batch-size auto"
    states = [row["dynspec_state"] for row in result["equivalence"]["per_level"]]
    assert states[0].startswith("ON") and "OFF" in states[2]  # 128 is above any switch point auto may choose
    # speculating everywhere at first (the ceiling both ways) until level 128, then where the fake "timed" it
    assert "OFF at batch size 128 (off above 127, on at or below 127)" in (tmp_path / "out" / "dynspec.log").read_text()
    cr = result["crossings"]
    assert cr["thresholds_logged"] == [[48, 40]] and cr["against_thresholds"] == []
    assert cr["detail"].endswith("auto's thresholds (off above / on at or below): 48 / 40")
    assert (
        cr["count"] >= 6 and min(cr["transitions_off_batch_sizes"]) > 48 and max(cr["transitions_on_batch_sizes"]) <= 40
    )


def test_auto_fails_crossings_where_a_switch_disagrees_with_its_own_thresholds(site, tmp_path):
    # the control: each switch off names its own batch size as the size it is off above
    result = run_proof(auto_options(site(version="0.5.17"), tmp_path / "out", "autowrong"), lambda m: None)
    cr = result["crossings"]
    assert not cr["passed"] and result["equivalence"]["passed"]
    assert re.search(r"^line \d+: OFF at batch size (\d+), not above \1$", cr["against_thresholds"][0])
    assert any("switch(es) against the thresholds their own line names" in p for p in cr["problems"])


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"checks": ("exact_kv",)}, "--threshold auto with exact_kv"),
        ({"upstream_adaptive": True, "checks": ("throughput",)}, "--threshold auto with --upstream-adaptive"),
        ({"version": "0.5.13"}, "--threshold auto needs --path v2 on SGLang 0.5.14 or later"),
        ({"levels": (1, 2, 64)}, "one > 127, so equivalence is checked below its floor and above auto's ceiling 127"),
        ({"ramp_high": 100}, "--ramp 1,100 must go from <= 1 to > 127"),
    ],
)
def test_auto_refuses_what_it_cannot_judge_before_any_server(site, tmp_path, kw, message):
    version = str(kw.pop("version", "0.5.17"))
    opts = auto_options(site(version=version), tmp_path / "out", **kw)
    with pytest.raises(ProofUsageError) as error:
        run_proof(opts, lambda m: None)
    assert message in str(error.value)
    assert not (tmp_path / "out").exists()


def test_the_counters_follow_the_switch_lines_through_the_ramp(site, tmp_path):
    result = run_proof(options(site(), tmp_path / "out", checks=("crossings", "metrics")), lambda m: None)
    m = result["metrics"]
    assert m["passed"] and result["passed"], reports.summary(result)
    assert m["switches_counted"] == m["switches_logged"] == result["crossings"]["count"] >= 10
    assert set(m["after"]) == {metrics.SPEC, metrics.FALLBACK, metrics.SWITCHES}
    (server,) = result["servers"]
    assert "--enable-metrics" in server["argv"]


@pytest.mark.parametrize(
    ("fault", "problem"),
    [
        ("metricsdrift", "sglang:dynspec_switches_total rose by"),
        ("nometrics", "/metrics has no sglang:dynspec_spec_iterations_total after the ramp"),
    ],
)
def test_counters_that_miss_switches_or_are_absent_fail(site, tmp_path, fault, problem):
    result = run_proof(options(site(), tmp_path / "out", faults=fault, checks=("crossings", "metrics")), lambda m: None)
    assert not result["metrics"]["passed"] and result["crossings"]["passed"]
    assert result["metrics"]["problems"][0].startswith(problem)


def test_metrics_without_the_ramp_is_a_usage_error(site, tmp_path):
    with pytest.raises(ProofUsageError, match="metrics are read around the crossings' ramp"):
        run_proof(options(site(), tmp_path / "out", checks=("equivalence", "metrics")), lambda m: None)


def test_every_refused_combination_exits_with_one_line_naming_it(site, tmp_path):
    out = tmp_path / "out"
    result = run_proof(options(site(adaptive=True), out, checks=("refusals",)), lambda m: None)
    refusals = result["refusals"]
    assert refusals["passed"] and result["passed"], reports.summary(result)
    rows = {row["name"]: row for row in refusals["cases"]}
    # 0.5.12: upstream's adaptive mode exists, auto does not yet
    assert list(rows) == ["topk", "dp-attention", "max-running", "graph-size", "bad-value", "adaptive", "auto"]
    assert rows["max-running"]["args"] == ["--speculative-disable-batch-size", "128"]
    assert rows["max-running"]["line"] == (
        "error: --speculative-disable-batch-size 128 can never trigger: at most 128 requests run at once; "
        "lower it or raise --max-running-requests"
    )
    assert all(row["exit_code"] == 2 and row["problems"] == [] for row in rows.values())
    assert rows["graph-size"]["args"] == ["--speculative-disable-batch-size", "16", "--cuda-graph-max-bs", "16"]
    assert {s["name"] for s in result["servers"]} == {f"refusal-{name}" for name in rows}


def test_refusals_hold_where_the_release_renamed_or_drops_what_they_ask_for(site, tmp_path, monkeypatch):
    """0.5.17 on an H100 (session 28): the graph-size case served, since 0.5.14 keeps --cuda-graph-max-bs
    in cuda_graph_max_bs_decode, and --enable-dp-attention alone served, since one DP rank turns it off.
    The fake server does both as the releases do; the check and the cases now hold there."""
    result = run_proof(options(site(version="0.5.17"), tmp_path / "a", checks=("refusals",)), lambda m: None)
    rows = {row["name"]: row for row in result["refusals"]["cases"]}
    assert result["refusals"]["passed"], reports.summary(result)
    assert rows["graph-size"]["line"].startswith(
        "error: --speculative-disable-batch-size 16 is not below the largest CUDA-graph batch size (16)"
    )
    assert rows["dp-attention"]["args"] == ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"]
    # the control: the case as it was (one DP rank) starts a server that serves
    old = [run.Refusal("dp-attention", ("--enable-dp-attention",), rows["dp-attention"]["says"])]
    monkeypatch.setattr(run, "refusal_cases", lambda sglang, path: old)
    served = run_proof(options(site(version="0.5.17"), tmp_path / "b", checks=("refusals",)), lambda m: None)
    assert served["refusals"]["cases"][0]["problems"][0].startswith("still running after")


FEATURES = ("sampling", "logprobs", "penalties")  # grammar: test_grammar_* below


def fast_features(opts: ProofOptions) -> ProofOptions:
    """On real weights (sampling and logprobs need them), the sampling check's default sample (1200
    requests a phase) at 10 ms a request: long enough that a closed loop of the off phase's size
    keeps the fake above its threshold."""
    assert opts.env is not None
    model = real_dir(opts.out.with_name(f"{opts.out.name}-model"))
    return replace(opts, env={**opts.env, "FAKE_SGLANG_DELAY": "0.01"}, model="real", model_dir=model)


def test_sampling_and_logprobs_on_dummy_weights_are_a_usage_error(site, tmp_path):
    """Their controls are blind on flat dummy logits (0.5.17, session 28); penalties are not refused."""
    with pytest.raises(
        ProofUsageError, match=r"^sampling, logprobs need --model real: sampling: dummy weights' logits"
    ):
        run_proof(options(site(), tmp_path / "a", checks=FEATURES), lambda m: None)
    result = run_proof(options(site(), tmp_path / "b", checks=("penalties",)), lambda m: None)
    assert result["penalties"]["passed"], reports.summary(result)


def test_sampling_logprobs_and_penalties_pass_on_servers_that_serve_them_alike(site, tmp_path):
    result = run_proof(fast_features(options(site(), tmp_path / "out", checks=FEATURES)), lambda m: None)
    assert all(result[c]["passed"] for c in FEATURES), reports.summary(result)
    sampled = result["sampling"]["phases"]
    assert {p: sampled[p]["batch"] for p in sampled} == {"on": 4, "off": 12}
    assert sampled["off"]["dynspec"]["samples"] == [1200, 1200] and sampled["off"]["control"]["p_value"] < 0.01
    # the fake draws by seed: with base's seeds dynspec's draws are base's, with its own most are not
    same = sampled["off"]["same_seeds"]
    assert (same["requests"], same["apart"]) == (1200, 0) and same["own_seeds_apart"] > 600
    assert "same_seeds" not in sampled["on"]
    assert result["logprobs"]["phases"]["off"]["compared"] > 0
    assert {s["name"] for s in result["servers"]} == {"base-features", "always-on-features", "dynspec-features"}
    assert all(result[c]["base_mode"] == "base" for c in FEATURES)  # v2: plain decode overlaps, as dynspec's


def test_v1_is_judged_while_off_against_plain_decode_on_its_own_scheduler(site, tmp_path, monkeypatch):
    """v1 never overlaps, and penalties count late on the overlap scheduler (0.5.12 v1, session 44:
    1 of 16 requests apart from the overlapping base): v1's base runs --disable-overlap-schedule.
    The control, judged against the overlapping base, fails the phase off and only it."""
    v1 = fast_features(options(site(), tmp_path / "a", checks=("penalties",), path="v1"))
    result = run_proof(v1, lambda m: None)
    assert result["penalties"]["passed"] and result["penalties"]["base_mode"] == "base_no_overlap", reports.summary(
        result
    )
    argv = {s["name"]: s["argv"] for s in result["servers"]}
    assert set(argv) == {"base-no-overlap-features", "always-on-features", "dynspec-features"}
    assert all("--disable-overlap-schedule" in a for a in argv.values())
    monkeypatch.setattr(run, "plain_reference", lambda path: "base")
    control = run_proof(replace(v1, out=tmp_path / "b"), lambda m: None)
    assert not control["penalties"]["passed"]
    assert [p.split(" requests")[0] for p in control["penalties"]["problems"]] == ["off: 12 of 12"]


@pytest.mark.parametrize(
    ("fault", "check", "problem"),
    [
        ("skewsampling", "sampling", r"off: dynspec's tokens are distributed unlike base's"),
        ("logprobdrift", "logprobs", r"off: prompt \d+: \d+ of \d+ logprobs apart by up to 0\.2"),
        ("nologprobs", "logprobs", r"off: prompt \d+: no logprob for every emitted token \(dynspec\)"),
        ("droppenalty", "penalties", r"off: \d+ of 12 requests gave other tokens than base"),
    ],
)
def test_a_fallback_that_skews_sampling_logprobs_or_penalties_fails(site, tmp_path, fault, check, problem):
    """Each fault changes only what a dynspec server serves while off: the check of that phase fails."""
    result = run_proof(fast_features(options(site(), tmp_path / "out", faults=fault, checks=(check,))), lambda m: None)
    assert not result[check]["passed"]
    assert re.match(problem, result[check]["problems"][0]), result[check]["problems"]
    assert not any(p.startswith("on:") for p in result[check]["problems"])
    if fault == "skewsampling":  # with base's seeds too, another temperature parts the draws
        assert result["sampling"]["phases"]["off"]["same_seeds"]["apart"] > 600


BACKEND_CHECKS = ("equivalence", "crossings", "backends")


def test_a_dynspec_server_that_never_switches_off_fails_the_phase_off(site, tmp_path):
    """Its tokens may still be base's (the fake's are): the check must see that nothing was off."""
    stuck = run_proof(
        fast_features(options(site(), tmp_path / "out", faults="noswitch", checks=("penalties",))), lambda m: None
    )
    assert not stuck["penalties"]["passed"]
    assert (
        stuck["penalties"]["problems"] == ["off: dynspec never switched off for the phase off (no switch logged)"] * 1
    )


def test_grammar_passes_where_every_output_fits_the_schema_and_fails_a_broken_one(site, tmp_path):
    result = run_proof(fast_features(options(site(), tmp_path / "a", checks=("grammar",))), lambda m: None)
    grammar = result["grammar"]
    assert grammar["passed"], reports.summary(result)
    assert grammar["phases"]["off"]["valid"] == {"base": 12, "always_on": 12, "dynspec": 12, "control": 0}
    for server in result["servers"]:  # the tokenizer loaded, JSON without free whitespace
        assert "--skip-tokenizer-init" not in server["argv"]
        assert "--constrained-json-disable-any-whitespace" in server["argv"]
    broken = run_proof(
        fast_features(options(site(), tmp_path / "b", faults="grammarbreak", checks=("grammar",))), lambda m: None
    )
    assert not broken["grammar"]["passed"]
    assert re.match(
        r"off: \d+ dynspec outputs break the schema, e.g. prompt \d+: not JSON", broken["grammar"]["problems"][0]
    )
    with pytest.raises(
        ProofUsageError, match="grammar needs --model real: grammar: the dummy models have no tokenizer"
    ):
        run_proof(options(site(), tmp_path / "c", checks=("grammar",)), lambda m: None)


def test_a_ballast_reply_cut_short_is_a_problem_of_its_own(site, tmp_path):
    """Fault ``shortbatch``: a batched reply without a schema comes a token short. The ballast's
    replies, not judged, are still read; the control's (no schema either) may end early anyway."""
    result = run_proof(
        fast_features(options(site(), tmp_path / "out", "shortbatch", checks=("grammar",))), lambda m: None
    )
    problems = result["grammar"]["problems"]
    assert not result["grammar"]["passed"] and len(problems) == 4, problems
    for role in ("base", "always_on", "dynspec", "control"):
        assert (
            f"off {role} ballast: 12 of 12 requests failed, e.g. 63 tokens instead of 64 (ignore_eos is set)"
            in problems
        )
    assert not any(p.startswith("on") for p in problems)  # the phase on has no ballast


def test_a_grammar_wave_the_servers_cannot_admit_whole_is_a_usage_error(site, tmp_path):
    """Threshold 48: the phase off is 96 requests, with its ballast 192, more than 128 run at once."""
    opts = replace(fast_features(options(site(), tmp_path / "out", checks=("grammar",))), threshold=48)
    with pytest.raises(ProofUsageError, match=r"^grammar's phase off sends 192 requests at once \(96 and as much"):
        run_proof(opts, lambda m: None)
    assert not (tmp_path / "out").exists()


def test_grammar_requests_ending_one_by_one_switch_dynspec_back_on_without_the_ballast(site, tmp_path, monkeypatch):
    """The fake's constrained requests leave the batch at their EOS, as SGLang's did on real weights
    (0.5.17, session 31): without the ballast the phase off's batch shrinks to the threshold while
    some still decode, dynspec switches back on, and the check must say so."""
    monkeypatch.setattr(features, "grammar_ballast", lambda phase, size: 0)
    result = run_proof(fast_features(options(site(), tmp_path / "out", checks=("grammar",))), lambda m: None)
    assert not result["grammar"]["passed"]
    assert result["grammar"]["problems"] == ["off: dynspec switched back on during a load of the phase off (OFF ON)"]


def test_backends_judges_equivalence_and_crossings_on_flashinfer(site, tmp_path):
    result = run_proof(
        options(site(), tmp_path / "out", checks=BACKEND_CHECKS, attention_backend="flashinfer"), lambda m: None
    )
    assert result["backends"]["passed"] and result["passed"], reports.summary(result)
    assert result["attention_backend"] == result["backends"]["attention_backend"] == "flashinfer"
    for server in result["servers"]:
        argv = server["argv"]
        assert argv[argv.index("--attention-backend") + 1] == "flashinfer" and argv.count("--attention-backend") == 1
    # the control: a fallback that changes outputs while off fails it
    broken = run_proof(
        options(site(), tmp_path / "b", faults="diverge", checks=BACKEND_CHECKS, attention_backend="flashinfer"),
        lambda m: None,
    )
    assert not broken["backends"]["passed"] and broken["backends"]["problems"][0].startswith("equivalence: ")


@pytest.mark.parametrize("speed", [1.0, 0.9])
def test_throughput_reports_dynspecs_speculating_steps_against_always_ons(site, tmp_path, speed):
    """Session 39: where dynspec speculates, its R(C) is against always-on; its steps are read against
    always-on's from the logs (``per_step_speculating``), not judged. The control: none without them."""
    opts = options(site(), tmp_path / "out", checks=("throughput",), min_envelope_ratio=0.0)
    opts.env["FAKE_SGLANG_SPECULATING_SPEED"] = str(speed)
    saved = run_proof(opts, lambda m: None)
    tp = saved["throughput"]
    assert tp["per_step_speculating"] == {"dynspec": {"8": {"pairs": 2, "min": speed, "median": speed, "max": speed}}}
    assert f"dynspec: C=8 {speed:.2f}-{speed:.2f} (median {speed:.2f}, 2 pairs)" in reports.summary(saved)
    assert "per speculative step, speed / always-on's" in reports.summary(saved)
    assert tp["per_step"]["dynspec"]["8"]["median"] == 0.85  # the fallback lines, read as before
    del opts.env["FAKE_SGLANG_SPECULATING_SPEED"]
    opts.out = tmp_path / "control"
    assert run_proof(opts, lambda m: None)["throughput"]["per_step_speculating"] == {}


@pytest.mark.parametrize(
    ("path", "no_overlap", "speed", "bar"),
    [
        ("v2", False, 0.99, 0.98),
        ("v2", False, 0.85, 0.98),  # the control: the fake's steps at 0.85 of base's
        ("v1", True, 0.99, 0.97),
        ("v1", True, 0.85, 0.97),
        ("v1", False, 0.85, None),  # v1 against the overlapping base: not judged, and said so
    ],
    ids=["v2-at-the-bar", "v2-slow-step", "v1-at-the-bar", "v1-slow-step", "v1-overlap-base"],
)
def test_backends_holds_the_fallback_step_to_issue_13s_bar_where_throughput_ran(
    site, tmp_path, path, no_overlap, speed, bar
):
    """Session 38: on FlashInfer equivalence and crossings held while the fallback step ran at 0.55 of a
    plain one. With throughput beside it, backends judges the step against the base throughput judged
    against: 0.98 on v2, 0.97 on v1 against plain decode without overlap."""
    opts = options(
        site(),
        tmp_path / "out",
        checks=(*BACKEND_CHECKS, "throughput"),
        attention_backend="flashinfer",
        path=path,
        no_overlap_base=no_overlap,
        min_envelope_ratio=0.0,
    )
    opts.env["FAKE_SGLANG_FALLBACK_SPEED"] = str(speed)
    backends = run_proof(opts, lambda m: None)["backends"]
    assert backends["equivalence"] and backends["per_step"]["dynspec"]
    if bar is None:
        assert backends["passed"] and "min_step_ratio" not in backends and not backends["problems"]
        assert backends["detail"].endswith(
            "fallback step not judged (v1's bar is against plain decode without overlap: --no-overlap-base)"
        )
        return
    assert backends["min_step_ratio"] == bar
    assert backends["passed"] is (speed >= bar), backends["problems"]
    assert f", fallback step {speed} at C=" in backends["detail"]
    if speed < bar:
        assert backends["problems"][0].startswith("per_step: dynspec's fallback step at C=")
        assert backends["problems"][0].endswith(f"runs at {speed} of a plain one (at least {bar})")


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"checks": BACKEND_CHECKS}, "backends judges equivalence and crossings on another attention backend"),
        ({"checks": ("equivalence", "backends"), "attention_backend": "flashinfer"}, "add --attention-backend"),
        ({"checks": ("equivalence",), "attention_backend": "vulkan"}, "--attention-backend 'vulkan': choose triton"),
    ],
)
def test_backends_needs_another_backend_and_both_checks(site, tmp_path, kw, words):
    with pytest.raises(ProofUsageError, match=re.escape(words)):
        run_proof(options(site(), tmp_path / "out", **kw), lambda m: None)


def test_a_refusal_with_a_traceback_or_none_at_all_fails(site, tmp_path):
    traced = run_proof(options(site(), tmp_path / "a", faults="refusaltraceback", checks=("refusals",)), lambda m: None)
    assert not traced["refusals"]["passed"]
    assert all(row["problems"] == ["its log has a Python traceback"] for row in traced["refusals"]["cases"])
    assert {row["exit_code"] for row in traced["refusals"]["cases"]} == {1}  # an uncaught ValueError
    served = run_proof(options(site(), tmp_path / "b", faults="norefusal", checks=("refusals",)), lambda m: None)
    assert not served["refusals"]["passed"]
    assert all(row["problems"][0].startswith("still running after") for row in served["refusals"]["cases"])


def test_switch_lines_that_name_other_thresholds_than_the_configured_fail(site, tmp_path):
    result = run_proof(options(site(), tmp_path / "out", faults="thresholdlie", checks=("crossings",)), lambda m: None)
    cr = result["crossings"]
    assert not cr["passed"] and cr["thresholds_logged"] == [[4, 4], [5, 4]]  # the ON lines tell the truth
    assert "switched with thresholds 5 / 4, not the configured 4 / 4" in cr["problems"]
    assert "dynspec applied: yes (--speculative-disable-batch-size 4)" in reports.summary(result)  # the control
    assert result["enable_threshold"] == 4


def test_without_dynspec_only_off_and_always_on_are_compared(site, tmp_path):
    opts = options(site(applied=False), tmp_path / "out", checks=("equivalence", "crossings", "throughput"))
    result = run_proof(opts, lambda m: None)
    assert result["passed"] and result["dynspec_applied"] is False
    assert "crossings" not in result and "dynspec is not applied" in result["skipped"]["crossings"]
    assert set(result["equivalence"]["digests"]) == {"base", "always_on"}
    assert result["throughput"]["dynspec"] is None and result["throughput"]["envelope_ratio"] is None
    assert [s["name"] for s in result["servers"]] == ["always-on", "base", "always-on-sim", "base-sim"]
    assert "dynspec applied: no" in reports.summary(result)


def test_a_low_envelope_ratio_fails_throughput(site, tmp_path):
    opts = options(site(), tmp_path / "out", checks=("throughput",), min_envelope_ratio=100.0)
    tp = run_proof(opts, lambda m: None)["throughput"]
    assert not tp["passed"] and tp["problems"][0].startswith("R(C) below 100 at C=1")


def test_a_server_that_crashes_at_start_ends_the_run_and_fails(site, tmp_path):
    out = tmp_path / "out"
    opts = options(site(), out, faults="crash", checks=("equivalence", "crossings", "throughput"))
    result = run_proof(opts, lambda m: None)
    assert reports.exit_code(result) == 1 and result["complete"] is False
    assert "exited with code 1" in result["equivalence"]["problems"][0]
    assert result["throughput"] == {"passed": False, "problems": ["not run: the dynspec server did not start"]}
    assert [s["name"] for s in result["servers"]] == ["dynspec"]
    assert "CUDA error: injected" in result["servers"][0]["start_error"]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"levels": (1, 2, 4)}, "must have a level <= 4 and one > 4"),
        ({"threshold": 128}, "< 128"),
        ({"enable_threshold": 8}, "--enable-threshold (8) <= --threshold (4)"),
        ({"ramp_high": 4}, "--ramp 1,4 must go from <= 4 to > 4"),
        ({"checks": ("speed",)}, "unknown check(s) speed"),
        ({"path": "v1", "sglang": "v2only"}, "has no v1 EAGLE worker"),
        ({"levels": (0, 8)}, "distinct positive integers"),
    ],
)
def test_impossible_requests_are_usage_errors_before_any_server(site, tmp_path, kw, message):
    root = site(workers=("v2",))
    if kw.get("sglang") == "v2only":
        kw = {**kw, "sglang": str(root)}
    opts = options(root, tmp_path / "out", **kw)
    with pytest.raises(ProofUsageError) as error:
        run_proof(opts, lambda m: None)
    assert message in str(error.value)
    assert not (tmp_path / "out").exists()


def test_crossings_alone_without_dynspec_is_a_usage_error(site, tmp_path):
    with pytest.raises(ProofUsageError, match="nothing to check"):
        run_proof(options(site(applied=False), tmp_path / "out", checks=("crossings",)), lambda m: None)


def adaptive_options(root: Path, out: Path, dynspec_delay: str, adaptive_delay: str, **kw: object) -> ProofOptions:
    opts = options(root, out, checks=("throughput",), min_envelope_ratio=0.0, upstream_adaptive=True, **kw)
    assert opts.env is not None
    opts.env = {**opts.env, "FAKE_SGLANG_DELAY": dynspec_delay, "FAKE_SGLANG_ADAPTIVE_DELAY": adaptive_delay}
    return opts


def test_upstream_adaptive_on_v2_where_sglang_turns_it_off_there_is_a_usage_error(site, tmp_path):
    root = site(adaptive=True)
    (root / "sglang" / "srt" / "speculative" / "adaptive_spec_params.py").write_text(
        "def adaptive_unsupported_reason(server_args):\n"
        "    if not server_args.disable_overlap_schedule:\n"
        '        return "the overlap scheduler (spec v2) is enabled"\n'
    )
    with pytest.raises(ProofUsageError, match=r"turns --speculative-adaptive off under the overlap scheduler"):
        run_proof(adaptive_options(root, tmp_path / "out", "0.05", "1.0"), lambda m: None)
    assert not (tmp_path / "out").exists()


def test_upstream_adaptive_is_a_4th_throughput_server_with_its_config(site, tmp_path):
    out = tmp_path / "out"
    result = run_proof(adaptive_options(site(adaptive=True), out, "0.05", "1.0"), lambda m: None)
    assert result["passed"], reports.summary(result)
    servers = {s["name"]: s for s in result["servers"]}
    assert list(servers) == ["dynspec-sim", "always-on-sim", "base-sim", "upstream-adaptive-sim"]
    config = out / "upstream-adaptive.json"
    assert config.read_text() == '{"1": {"candidate_steps": [3]}, "5": {"candidate_steps": [0]}}\n'
    up, on = servers["upstream-adaptive-sim"], servers["always-on-sim"]
    port_of = on["argv"].index("--port") + 1
    want = [*on["argv"], "--speculative-adaptive", "--speculative-adaptive-config", str(config)]
    want[port_of] = str(up["port"])
    assert up["argv"] == want  # always-on's flags (v2: no --disable-overlap-schedule), no dynspec flag
    assert "--disable-overlap-schedule" not in up["argv"]
    assert not any(a.startswith("--speculative-disable") for a in up["argv"])
    assert up["env"] == on["env"] and up["env"]["SGLANG_SIMULATE_ACC_LEN"] == "3"
    log = Path(up["log"]).read_text()
    assert 'adaptive config {"1": {"candidate_steps": [3]}, "5": {"candidate_steps": [0]}}' in log

    tp = result["throughput"]
    assert len(tp["upstream_adaptive"]) == len(tp["dynspec_over_upstream"]) == len(tp["levels"]) == 2
    assert tp["dynspec_over_upstream"] == reports.over(tp["dynspec"], tp["upstream_adaptive"])
    assert tp["dynspec_over_upstream"][1] > 2  # 1 s per upstream request against 0.05 s
    assert tp["min_upstream_ratio"] == 2.0 and tp["upstream_failed_levels"] == []
    assert tp["upstream_adaptive_config"] == {"1": {"candidate_steps": [3]}, "5": {"candidate_steps": [0]}}
    assert tp["per_step"]["upstream_adaptive"]["8"]["median"] == 0.4  # its zero-step steps against base's
    for key in ("base", "always_on", "dynspec", "envelope_ratio"):
        assert len(tp[key]) == 2  # the existing keys are unchanged
    assert "dyn/ad" in reports.summary(result)


def test_an_upstream_adaptive_as_fast_as_dynspec_fails_above_the_threshold(site, tmp_path):
    # C=1 is below the threshold: not checked even though upstream is faster there too
    opts = adaptive_options(site(adaptive=True), tmp_path / "out", "0.3", "0.01")
    result = run_proof(opts, lambda m: None)
    tp = result["throughput"]
    assert not tp["passed"] and reports.exit_code(result) == 1
    assert tp["upstream_failed_levels"] == [8]
    assert tp["dynspec_over_upstream"][1] < 2
    assert tp["problems"] == [f"dynspec / upstream adaptive below 2 at C=8 ({tp['dynspec_over_upstream'][1]:.2f})"]


def test_adaptive_mode_turned_off_by_sglang_fails_throughput(site, tmp_path):
    opts = adaptive_options(site(adaptive=True), tmp_path / "out", "0.05", "1.0", faults="adaptiveoff")
    tp = run_proof(opts, lambda m: None)["throughput"]
    assert not tp["passed"]
    assert tp["problems"][0].startswith("upstream-adaptive-sim: SGLang turned its adaptive mode off")


def test_off_by_default_no_4th_server_and_no_new_keys(site, tmp_path):
    out = tmp_path / "out"
    result = run_proof(
        options(site(adaptive=True), out, checks=("throughput",), min_envelope_ratio=0.0), lambda m: None
    )
    assert [s["name"] for s in result["servers"]] == ["dynspec-sim", "always-on-sim", "base-sim"]
    assert not {"upstream_adaptive", "dynspec_over_upstream"} & set(result["throughput"])
    assert not (out / "upstream-adaptive.json").exists()


@pytest.mark.parametrize(
    ("adaptive", "kw", "message"),
    [
        (False, {}, "has no --speculative-adaptive"),
        (True, {"checks": ("equivalence",)}, "--upstream-adaptive needs the throughput check"),
        (True, {"throughput_levels": (1, 4)}, "has none"),
    ],
)
def test_upstream_adaptive_usage_errors_before_any_server(site, tmp_path, adaptive, kw, message):
    opts = options(
        site(adaptive=adaptive), tmp_path / "out", **{"checks": ("throughput",), "upstream_adaptive": True, **kw}
    )
    with pytest.raises(ProofUsageError) as error:
        run_proof(opts, lambda m: None)
    assert message in str(error.value)
    assert not (tmp_path / "out").exists()


def test_a_v1_run_can_add_plain_decode_on_its_own_scheduler(site, tmp_path):
    opts = options(
        site(), tmp_path / "out", checks=("throughput",), min_envelope_ratio=0.0, path="v1", no_overlap_base=True
    )
    result = run_proof(opts, lambda m: None)
    assert result["passed"], reports.summary(result)
    servers = {s["name"]: s for s in result["servers"]}
    # the compared three first (v1 is judged against the non-overlapping base), the overlapping one last
    assert list(servers) == ["dynspec-sim", "always-on-sim", "base-no-overlap-sim", "base-sim"]
    base, no_overlap = servers["base-sim"]["argv"], servers["base-no-overlap-sim"]["argv"]
    want = [*base, "--disable-overlap-schedule"]
    want[base.index("--port") + 1] = no_overlap[no_overlap.index("--port") + 1]
    assert no_overlap == want  # plain decode, only the scheduler differs
    tp = result["throughput"]
    assert len(tp["base_no_overlap"]) == 2 and all(isinstance(x, float) for x in tp["base_no_overlap"])
    expected = reports.envelope_ratio(tp["base_no_overlap"], tp["always_on"], tp["dynspec"])
    assert tp["envelope_ratio_no_overlap"] == expected
    assert "base-noov" in reports.summary(result)
    # v1 is judged on its own scheduler (the issue's rule), and its steps are read against that base too
    assert tp["judged_against"] == "base_no_overlap"
    assert tp["detail"].startswith("R(C) against max(non-overlap base, always-on) >= 0 at all 2 levels")
    assert set(tp["per_step_no_overlap"]) <= {"dynspec"} and set(tp["per_step"]) >= set(tp["per_step_no_overlap"])


def test_a_v2_run_with_the_non_overlap_base_is_still_judged_against_the_overlap_one(site, tmp_path):
    """Negative control of the rule above: only v1 changes its reference."""
    opts = options(site(), tmp_path / "out", checks=("throughput",), min_envelope_ratio=0.0, no_overlap_base=True)
    tp = run_proof(opts, lambda m: None)["throughput"]
    assert tp["judged_against"] == "base" and tp["detail"].startswith("R(C) >= 0 at all 2 levels")
    assert "base_no_overlap" in tp


FROZE = "Freezing GC in scheduler process."


@pytest.mark.parametrize("freeze", [True, False], ids=["freeze-gc", "control"])
def test_freeze_gc_freezes_each_server_after_its_warm_up_request(site, tmp_path, freeze):
    """--freeze-gc: every server is asked to freeze its garbage collector once, after the warm-up
    request and before anything measured; without it (the control) none is."""
    opts = options(site(), tmp_path / "out", checks=("throughput",), min_envelope_ratio=0.0, freeze_gc=freeze)
    result = run_proof(opts, lambda m: None)
    assert result["passed"], reports.summary(result)
    assert len(result["servers"]) == 3
    for server in result["servers"]:
        log = Path(server["log"]).read_text()
        assert log.count(FROZE) == (1 if freeze else 0) and server.get("gc_frozen", False) is freeze
        if freeze:
            first_request = log.index('"POST /generate')
            assert first_request < log.index(FROZE) < log.index('"POST /generate', first_request + 1)


@pytest.mark.parametrize(
    ("fault", "said"), [("nofreeze", "/freeze_gc answered 404 "), ("freezedrop", "/freeze_gc did not answer: ")]
)
def test_freeze_gc_on_a_server_that_will_not_stops_with_one_line(site, tmp_path, fault, said):
    opts = options(site(), tmp_path / "out", faults=fault, checks=("throughput",), freeze_gc=True)
    result = run_proof(opts, lambda m: None)
    assert result["passed"] is False and result["complete"] is False
    problem = result["throughput"]["problems"][0]
    assert problem.startswith(f"dynspec-sim: --freeze-gc: {said}") and "\n" not in problem


GC_FLAGS = ["--gc-warning-threshold-secs", "0.05"]


@pytest.mark.parametrize(
    ("declared", "freeze", "extra", "found"),
    [
        (True, False, (), 1),
        (True, True, (), 0),  # frozen after the warm-up: the start-up's objects are no longer scanned
        (True, False, ("--gc-warning-threshold-secs", "1.0"), 0),  # the caller's threshold wins
        (False, False, (), None),  # control: a release without the flag gets none and is not read
        (True, False, ("--gc-warning-threshold-secs", "0"), None),  # the caller turned it off: not read
    ],
    ids=["logged", "frozen", "callers-threshold", "no-flag", "callers-off"],
)
def test_long_collections_are_listed_by_server_where_the_release_logs_them(
    site, tmp_path, declared, freeze, extra, found
):
    """Session 38: the stalls that decided R(128) were one ~0.45 s generation-2 collection per server,
    in SGLang's HTTP process. Where ServerArgs declares --gc-warning-threshold-secs each server gets
    0.05 and its entry lists what SGLang logged while it served (the fake logs one on its 3rd request
    unless frozen)."""
    opts = options(
        site(gc_warning=declared),
        tmp_path / "out",
        checks=("throughput",),
        min_envelope_ratio=0.0,
        freeze_gc=freeze,
        extra_args=extra,
    )
    result = run_proof(opts, lambda m: None)
    assert result["passed"], reports.summary(result)
    for server in result["servers"]:
        argv = server["argv"]
        has_flags = any(argv[i : i + 2] == GC_FLAGS for i in range(len(argv)))
        assert has_flags is declared
        if found is None:
            assert reports.LONG_GC not in server and reports.LONG_GC_OVER not in server
            continue
        lines = Path(server["log"]).read_text().splitlines()
        logged = [n for n, line in enumerate(lines, 1) if "LONG GARBAGE COLLECTION" in line]
        assert len(logged) == found
        assert server[reports.LONG_GC] == [{"line": n, "generation": 2, "seconds": 0.4592} for n in logged]
        assert server[reports.LONG_GC_OVER] == (1.0 if extra else 0.05)
    said = "long garbage collections of SGLang's HTTP process" in reports.summary(result)
    assert said is bool(found)


def test_a_throughput_miss_says_so_in_its_detail(site, tmp_path):
    """Session 16's report said 'R(C) >= 0.97 at all 3 levels (min 0.94)' beside its failure."""
    opts = options(site(), tmp_path / "out", checks=("throughput",), min_envelope_ratio=100.0)
    tp = run_proof(opts, lambda m: None)["throughput"]
    assert not tp["passed"] and tp["detail"].startswith("R(C) below 100 at 2 of 2 levels (min ")


# -- --parallel-starts: a group of servers starts at once, each is measured alone ----------------


def order_of(notes: list[str]) -> list[str]:
    """The start, ready and stop events of the progress lines, as ``+name``, ``=name`` and ``-name``."""
    events = []
    for note in notes:
        if m := re.match(r"starting (\S+) server on port", note):
            events.append("+" + m[1])
        elif m := re.match(r"(\S+) is up after", note):
            events.append("=" + m[1])
        elif m := re.match(r"stopped (\S+) \(", note):
            events.append("-" + m[1])
    return events


def test_parallel_starts_start_a_group_and_measure_each_server_alone(site, tmp_path):
    out = tmp_path / "out"
    notes: list[str] = []
    opts = options(site(), out, checks=("equivalence", "crossings", "exact_kv"), parallel_starts=3)
    result = run_proof(opts, notes.append)
    assert result["passed"] is True, reports.summary(result)
    assert order_of(notes) == [
        "+dynspec", "+dynspec-full", "+dynspec-skip", "=dynspec", "=dynspec-full", "=dynspec-skip",
        "-dynspec", "-dynspec-full", "-dynspec-skip",
        "+always-on", "+base", "=always-on", "=base", "-always-on", "-base",
    ]  # fmt: skip
    servers = result["servers"]
    assert [s["name"] for s in servers] == ["dynspec", "dynspec-full", "dynspec-skip", "always-on", "base"]
    for s in servers:
        argv = s["argv"]
        assert argv[argv.index("--max-total-tokens") + 1] == "131072"
        assert argv[argv.index("--nccl-port") + 1] == str(s["nccl_port"])
    group = servers[:3]
    assert len({s["port"] for s in group} | {s["nccl_port"] for s in group}) == 6  # no port given twice at once
    assert all(s["stopped_by"] == "SIGTERM" and s["start_seconds"] > 0 for s in servers)
    assert not [p for p in server_pids(out) if alive(p)]


KV_PROOF = ("equivalence", "crossings", "exact_kv", "metrics", "refusals")  # h200-runs.sh kv-proof's default


def test_kv_proofs_five_checks_make_one_report_per_release(site, tmp_path):
    """Issue 18's one command per release: the correctness servers, then the refusal cases, one report."""
    result = run_proof(options(site(), tmp_path / "out", checks=KV_PROOF, parallel_starts=3), lambda m: None)
    assert result["passed"] is True, reports.summary(result)
    assert all(result[check]["passed"] for check in KV_PROOF)
    assert {row["name"] for row in result["refusals"]["cases"]} >= {"topk", "dp-attention", "bad-value"}
    script = (Path(__file__).resolve().parents[2] / "scripts" / "h200-runs.sh").read_text()
    assert f'--checks "${{KV_CHECKS:-{",".join(KV_PROOF)}}}"' in script


def test_one_start_at_a_time_is_todays_command_line(site, tmp_path):
    """Negative control: without --parallel-starts nothing starts early and no flag is added."""
    notes: list[str] = []
    result = run_proof(options(site(), tmp_path / "out", checks=("equivalence",)), notes.append)
    assert result["passed"] is True
    assert order_of(notes) == ["+dynspec", "=dynspec", "-dynspec", "+always-on", "=always-on", "-always-on",
                               "+base", "=base", "-base"]  # fmt: skip
    assert not {"--max-total-tokens", "--nccl-port"} & {a for s in result["servers"] for a in s["argv"]}


def test_a_group_member_that_fails_to_start_stops_the_check_and_every_server(site, tmp_path):
    out = tmp_path / "out"
    notes: list[str] = []
    from .test_mixed import mixed_options

    broken = (("broken", (("FAKE_SGLANG_FAULT", "crash"),)),)
    opts = mixed_options(site(), out, mixed_repeats=1, parallel_starts=3, mixed_variants=broken)
    result = run_proof(opts, notes.append)
    events = order_of(notes)
    assert events[:3] == ["+dynspec-sim", "+dynspec-broken-sim", "+always-on-sim"]
    assert "=dynspec-broken-sim" not in events and "-always-on-sim" in events  # stopped, never measured
    assert "+base-sim" not in events
    assert result["passed"] is False and result["complete"] is False
    assert result["mixed_load"]["problems"][0].startswith(
        "dynspec-broken-sim server exited with code 1 before answering"
    )
    broken = next(s for s in result["servers"] if s["name"] == "dynspec-broken-sim")
    assert "exited with code 1" in broken["start_error"]
    assert not [p for p in server_pids(out) if alive(p)]


def test_a_server_that_died_while_waiting_its_turn_is_not_handed_out(tmp_path):
    from patcher.proof.run import Plan, Proof
    from patcher.proof.servers import Server, ServerSpec, ServerStartError

    opts = options(tmp_path, tmp_path / "out", parallel_starts=2)
    proof = Proof(opts, lambda m: None)
    proof.report = {"servers": []}
    spec = ServerSpec("base", (sys.executable, "-c", "raise SystemExit(3)"), dict(os.environ), tmp_path / "base.log", 1)
    server = Server(spec, stop_timeout=5)
    server.start()
    assert server.popen is not None and server.popen.wait(timeout=30) == 3
    info: dict[str, object] = {"name": "base"}
    proof._started["base"] = (server, info)
    turn = proof.serve(Plan("base", "small", None, "base"))
    with pytest.raises(ServerStartError, match="base server exited with code 3 before its turn"), turn:
        pass
    assert info["stopped_by"] == "exited" and "before its turn" in str(info["start_error"])
    assert proof._started == {}


def test_a_group_member_that_cannot_launch_fails_at_its_turn(site, tmp_path, monkeypatch):
    """The second server of a group gets no port: the first is still measured, the second's turn
    reports why, nothing is left running."""
    from patcher.proof import run as proof_run
    from patcher.proof.servers import ServerStartError

    calls = []
    real_free_port = proof_run.free_port

    def free_port(first, tries=200, taken=()):
        calls.append(first)
        if len(calls) == 3:  # dynspec: port and NCCL port; always-on: its port
            raise ServerStartError(f"no free port in {first}..{first + tries - 1}")
        return real_free_port(first, tries, taken)

    monkeypatch.setattr(proof_run, "free_port", free_port)
    out = tmp_path / "out"
    notes: list[str] = []
    result = run_proof(options(site(), out, checks=("equivalence",), parallel_starts=2), notes.append)
    assert order_of(notes)[:3] == ["+dynspec", "=dynspec", "-dynspec"]
    assert result["equivalence"]["problems"][0].startswith("no free port in")
    assert [s["name"] for s in result["servers"]] == ["dynspec"] and result["complete"] is False
    assert not [p for p in server_pids(out) if alive(p)]


# -- how many 8B-shape servers share the GPU: its memory decides (session 32: 3 on an H100 ran out) --


def fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stdout: str, code: int = 0) -> None:
    """An ``nvidia-smi`` first on PATH that prints ``stdout`` whatever it is asked and exits ``code``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '{stdout}'\nexit {code}\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize(
    ("stdout", "code", "mib"),
    [("81559\\n", 0, 81559), ("143771\\n81559\\n", 0, 81559), ("81559\\n", 9, None), ("[N/A]\\n", 0, None)],
    ids=["h100", "smallest-of-two", "failed", "unreadable"],
)
def test_the_gpus_memory_is_read_from_nvidia_smi(tmp_path, monkeypatch, stdout, code, mib):
    fake_nvidia_smi(tmp_path, monkeypatch, stdout, code)
    assert detect.gpu_memory_mib() == mib


@pytest.mark.parametrize(
    ("stdout", "code", "name"),
    [("NVIDIA H200\\nNVIDIA H200\\n", 0, "2x NVIDIA H200"), ("NVIDIA H200\\n", 9, "unknown (nvidia-smi failed)")],
    ids=["two-alike", "failed"],
)
def test_the_gpus_are_named_from_the_same_query(tmp_path, monkeypatch, stdout, code, name):
    fake_nvidia_smi(tmp_path, monkeypatch, stdout, code)
    assert detect.gpu_name() == name


@pytest.mark.parametrize(("mib", "pool"), [(81559, "40960"), (143771, "131072")], ids=["h100", "h200"])
def test_three_8b_servers_get_pools_the_gpus_memory_holds(site, tmp_path, monkeypatch, mib, pool):
    """Session 32's three 8B servers at 131072 slots each overfilled an H100 (the third found 12 GiB and
    died): on an 80 GB GPU each now gets the pool its share of memory holds, base and two speculating
    servers 40960; on an H200 (the control) the pool sessions 15 - 31 ran with. The small-shape
    servers of the same run keep theirs."""
    fake_nvidia_smi(tmp_path, monkeypatch, f"{mib}\\n")
    result = run_proof(
        options(site(), tmp_path / "out", checks=("equivalence", "throughput"), parallel_starts=3), lambda m: None
    )
    assert result["gpu_memory_mib"] == mib
    assert {s["kv_pool_tokens"] for s in result["servers"] if s["name"].endswith("-sim")} == {int(pool)}
    pools = {s["name"]: s["argv"][s["argv"].index("--max-total-tokens") + 1] for s in result["servers"]}
    assert {n: v for n, v in pools.items() if n.endswith("-sim")} == {
        "base-sim": pool, "always-on-sim": pool, "dynspec-sim": pool
    }  # fmt: skip
    assert {v for n, v in pools.items() if not n.endswith("-sim")} == {"131072"}
    # a pool sized to the memory asks SGLang to keep less back from it (launch.SHARED_GPU_TIGHT_MEM_FRACTION)
    fractions = {
        s["argv"][s["argv"].index("--mem-fraction-static") + 1] for s in result["servers"] if s["name"].endswith("-sim")
    }
    assert fractions == ({"0.95"} if pool != "131072" else {"0.85"})


@pytest.mark.parametrize(
    ("checks", "stopped"), [(("throughput", "mixed_load"), True), (("throughput",), False)], ids=["mixed", "throughput"]
)
def test_a_pool_sglang_made_too_small_for_the_load_stops_the_check(site, tmp_path, monkeypatch, checks, stopped):
    """--max-total-tokens only caps a pool: SGLang makes a smaller one where the memory it found was
    short. Each 8B server's start-up line is read, and one whose pool cannot hold the loads of the
    checks asked stops the check: on an H100, half of 40960 is below the 23424 slots mixed_load's
    phase of 128 needs; throughput alone (the control) needs 504 here and runs every level (its
    verdict on speed is the fakes' timing on a CPU, noise: not asserted)."""
    fake_nvidia_smi(tmp_path, monkeypatch, "81559\\n")
    opts = options(site(), tmp_path / "out", faults="smallpool", checks=checks, parallel_starts=3)
    result = run_proof(opts, lambda m: None)
    tput = result["throughput"]
    pools = {s["name"]: s.get("kv_pool_tokens") for s in result["servers"]}
    if not stopped:
        assert not any("KV pool" in p for p in tput["problems"]), reports.summary(result)
        assert all(v is not None for mode in ("base", "always_on", "dynspec") for v in tput[mode])
        assert set(pools.values()) == {20480}
        tp = result["throughput"]  # where N belongs, from the medians it reports (information, not judged)
        assert tp["switch_point"] == reports.switch_point(tp["levels"], tp["base"], tp["always_on"]) is not None
    else:
        assert not tput["passed"]
        (first,) = [name for name, pool in pools.items() if pool is not None]  # the check stopped at it
        assert pools[first] == 20480
        assert f"{first}: SGLang made a KV pool of 20480 slots, fewer than the 23424 its loads need" in str(
            tput["problems"]
        )


def test_8b_servers_a_gpu_cannot_hold_are_a_usage_error_before_any_start(site, tmp_path, monkeypatch):
    """On a 40 GB GPU not even two 8B servers hold their loads: refused at once, naming the memory and
    the slots the loads need; nothing started, nothing written."""
    fake_nvidia_smi(tmp_path, monkeypatch, "40960\\n")
    out = tmp_path / "out"
    with pytest.raises(
        ProofUsageError,
        match=r"^--parallel-starts 3: at most 1 of the 8B shape's servers start side by side in this GPU's 40 GiB, with pools of the \d+ KV slots",
    ):
        run_proof(options(site(), out, checks=("throughput",), parallel_starts=3), lambda m: None)
    assert not out.exists()


@pytest.mark.parametrize(("mib", "fit"), [(81559, 3), (143771, 3), (None, 3), (40960, 1), (64000, 2)])
def test_how_many_8b_servers_fit_side_by_side(mib, fit):
    """An H100 80GB and an H200 take throughput's three, base and two speculating (the H100 with
    smaller pools); 64 GB two, 40 GB none beside another; unknown memory keeps the three that
    sessions 15 - 31 ran."""
    need = run.eight_b_slots_needed(ProofOptions(out=Path("unused"), checks=("throughput", "mixed_load")))
    assert pools.shared_gpu_8b_servers(mib, need) == fit
    assert pools.eight_b_pool_tokens(mib, fit - 1, plain=1) >= need or mib == 40960


def test_flashinfer_takes_more_of_the_gpu_than_triton(site, tmp_path):
    """Session 35: base and two speculating 8B servers with 40960-slot pools, which fit an H100 on
    Triton, overfilled it on FlashInfer. There two start side by side for throughput's loads, and
    --parallel-starts 3 is refused at once; Triton (the control) keeps three."""
    need = run.eight_b_slots_needed(ProofOptions(out=Path("unused"), checks=("throughput",)))
    assert pools.shared_gpu_8b_servers(81559, need, "flashinfer") == 2
    assert pools.shared_gpu_8b_servers(81559, need) == 3
    assert pools.eight_b_pool_tokens(81559, 2, 1, "flashinfer") < need <= pools.eight_b_pool_tokens(81559, 2, 1)
    sglang = detect.locate(str(site()), sys.executable, dict(os.environ))
    opts = options(
        site(), tmp_path / "out", checks=("throughput",), shape="8b", parallel_starts=3,
        throughput_levels=(64, 128), throughput_new_tokens=256,
    )  # fmt: skip
    with pytest.raises(ProofUsageError, match=r"^--parallel-starts 3: at most 2 of the 8B shape's servers"):
        run.plan(replace(opts, attention_backend="flashinfer"), sglang, 81559)
    assert run.plan(opts, sglang, 81559)[0] == ["throughput"]


def test_auto_thresholds_groups_get_pools_by_how_many_of_them_speculate(site, tmp_path, monkeypatch):
    """Sessions 34 - 35 on an H100: auto_threshold's second group, three speculating servers, ran out of
    memory with 44032- and then 32768-slot pools. A group's pools count its members: auto and the first
    two fixed N (three speculating) 24576, the last N, always-on and base 40960; the small loads of this
    run fit both. Each group took turns at its passes (``order``)."""
    fake_nvidia_smi(tmp_path, monkeypatch, "81559\\n")
    opts = options(
        site(version="0.5.17"), tmp_path / "out", checks=("auto_threshold",), path="v2", shape="8b",
        parallel_starts=3, auto_acceptances=(3.0,), auto_sweep=(2, 4, 6), max_auto_ratio=100.0,
        mixed_phases=(1, 8, 1), mixed_per_phase=1, mixed_new_tokens=4, mixed_repeats=1,
        extra_args=("--max-running-requests", "7"),
    )  # fmt: skip
    result = run_proof(opts, lambda m: None)
    pools = {s["name"]: s.get("kv_pool_tokens") for s in result["servers"]}
    assert pools == {
        "dynspec-auto-acc3": 24576, "dynspec-n2-acc3": 24576, "dynspec-n4-acc3": 24576,
        "dynspec-n6-acc3": 40960, "always-on-acc3": 40960, "base-auto": 40960,
    }  # fmt: skip
    assert result["auto_threshold"]["order"] == run.ORDER_GROUPS + (
        "dynspec-auto-acc3, dynspec-n2-acc3, dynspec-n4-acc3; dynspec-n6-acc3, always-on-acc3, base-auto"
    )
    # no one dynspec server for a flags line to describe: each names its own N in its argv
    assert result["dynspec_flags"] == "" and "dynspec applied: yes\n" in reports.summary(result)
    assert result["enable_threshold"] is None  # auto's own bound as given (its floor), not --threshold's
    assert "problems" not in result["auto_threshold"] or all(
        " is slower than " in p or "x the best fixed N" in p for p in result["auto_threshold"]["problems"]
    ), result["auto_threshold"]["problems"]


def stub_servers(proof: run.Proof) -> list[tuple[str, int]]:
    """Replace ``proof``'s server processes by stand-ins that come up at once: the (name, pool) of each launch."""
    launched: list[tuple[str, int]] = []

    def launch(plan: run.Plan, pool: int) -> tuple[Any, dict[str, Any]]:
        launched.append((plan.name, pool))
        stand_in = SimpleNamespace(popen=SimpleNamespace(poll=lambda: None), begin_stop=lambda: None)
        return stand_in, {"name": plan.name, "mode": plan.mode}

    proof._launch = launch  # type: ignore[method-assign]
    proof._wait = lambda server, info: None  # type: ignore[method-assign]
    proof._finish = lambda server, info: None  # type: ignore[method-assign]
    return launched


@pytest.mark.parametrize("broken", [None, "b"])
def test_a_group_is_measured_without_the_member_that_did_not_start_and_no_later_group_is_served(tmp_path, broken):
    """``serve_in_groups`` with three started at once: a member that does not come up is named among
    the problems, the others of its group are still measured together and stopped together, and the
    groups after it are not served. The control: with every member up, both groups are measured."""
    from patcher.proof.errors import ServerStartError

    proof = run.Proof(ProofOptions(out=tmp_path / "out", parallel_starts=3), lambda m: None)
    proof.report = {"servers": []}
    stub_servers(proof)
    stopping: list[str] = []

    def wait(server: Any, info: dict[str, Any]) -> None:
        server.begin_stop = lambda: stopping.append(info["name"])
        if info["name"] == broken:
            raise ServerStartError(f"{broken} server exited with code 1 before answering")

    proof._wait = wait  # type: ignore[method-assign]
    plans = [run.Plan("dynspec", "small", None, name) for name in "abcd"]
    measured: list[list[str]] = []
    problems = proof.serve_in_groups(plans, lambda group: measured.append([p.name for p, _ in group]), together=True)
    if broken:
        assert measured == [["a", "c"]] and stopping == ["a", "c"]
        assert problems == ["b server exited with code 1 before answering"]
    else:
        assert measured == [["a", "b", "c"], ["d"]] and stopping == ["a", "b", "c", "d"] and problems == []


def test_a_group_starts_as_many_as_leave_pools_that_hold_the_loads(tmp_path):
    """Three speculating 8B servers on an H100 would leave 24576-slot pools, fewer than throughput's
    39808: two start together, the run says so, and the third starts on its turn, alone; base among
    the three (the control) starts all three with 40960."""
    said: list[str] = []
    opts = ProofOptions(out=tmp_path / "out", checks=("throughput", "auto_threshold"), parallel_starts=3, shape="8b")
    proof = run.Proof(opts, said.append)
    proof.gpu_memory_mib = 81559
    launched = stub_servers(proof)
    speculating = [run.Plan("dynspec", "8b", 3.0, f"dynspec-n{n}") for n in (32, 64, 96)]
    with proof.starting(speculating):
        for plan in speculating:
            with proof.serve(plan):
                pass
    assert launched == [("dynspec-n32", 129024), ("dynspec-n64", 129024), ("dynspec-n96", 131072)]
    assert "starting 2 at once: more would leave 8B pools too small for the loads" in said
    assert proof._group_pool(speculating) == 24576 < 39808
    launched.clear()
    base = run.Plan("base", "8b", None, "base")
    with proof.starting([base, *speculating[:2]]):
        for plan in (base, *speculating[:2]):
            with proof.serve(plan):
                pass
    assert launched == [("base", 40960), ("dynspec-n32", 40960), ("dynspec-n64", 40960)]


def test_a_server_whose_pool_cannot_hold_the_loads_beside_those_up_is_refused_before_it_starts(tmp_path):
    """Servers being served count as up (a check's servers up together, as throughput's are): with two
    speculating 8B servers in use on an H100, a third speculating one would get 24576 slots, fewer
    than throughput's 39808: refused before it launches, naming why. Base in its place (the control)
    gets 40960 and is not refused."""
    proof = run.Proof(ProofOptions(out=tmp_path / "out", checks=("throughput",), parallel_starts=3), lambda m: None)
    proof.gpu_memory_mib = 81559
    launched = stub_servers(proof)
    first, second, third = (run.Plan("dynspec", "8b", 3.0, f"dynspec-n{n}") for n in (32, 64, 96))
    base = run.Plan("base", "8b", None, "base")
    with proof.starting([first, second]), proof.serve(first), proof.serve(second):
        proof._queue = [third, base]
        with pytest.raises(run.ServerStartError) as refused, proof.serve(third):
            pass
        assert str(refused.value) == (
            "dynspec-n96: beside the 2 server(s) still up its pool would be 24576 slots in this GPU's memory, "
            "fewer than the 39808 the 8B loads need: fewer --parallel-starts"
        )
        assert [name for name, _ in launched] == ["dynspec-n32", "dynspec-n64"]  # nothing more launched
        assert not proof._short([base]) and proof._group_pool([base]) == 40960
        with proof.serve(base):
            assert launched[-1] == ("base", 40960)


def test_the_slots_needed_are_the_largest_load_of_the_checks_asked():
    """kv-proof's checks at threshold 32 need exact_kv's wave (4 long, 36 short, 2 joiners of up to 128
    tokens: 42 x 183), not throughput's 128 x 311; asking throughput (the control) or a check with no
    load known here takes the larger."""

    def need(*checks: str) -> int:
        return run.eight_b_slots_needed(ProofOptions(out=Path("unused"), checks=checks, threshold=32))

    assert need("equivalence", "crossings", "exact_kv", "refusals", "metrics") == 42 * (47 + 128 + 8)
    assert need("equivalence", "crossings") == 48 * (47 + 64 + 8)
    assert need("equivalence", "throughput") == need("backends") == 128 * (47 + 256 + 8)
    assert need("auto_threshold") == need("mixed_load") == 128 * (47 + 128 + 8)


def test_a_servers_pool_counts_the_servers_still_up_beside_it(tmp_path):
    """A group starting while speculating servers of an earlier one are still up shares the GPU with
    them too; with nothing up (the control) base alone gets the most an H100 gives."""
    proof = run.Proof(ProofOptions(out=tmp_path / "out", parallel_starts=3), lambda m: None)
    proof.gpu_memory_mib = 81559
    base = run.Plan("base", "8b", None, "base")
    assert proof._group_pool([base]) == run.launch.SHARED_GPU_MAX_TOTAL_TOKENS
    for name in ("left-1", "left-2"):
        proof._started[name] = (None, {"mode": "dynspec"})
    assert proof._group_pool([base]) == pools.eight_b_pool_tokens(81559, 2, plain=1) == 40960


def test_one_server_at_a_time_is_never_refused_by_the_shared_pools_sum(site, tmp_path, monkeypatch):
    """With --parallel-starts 1 a server's pool is SGLang's own (no --max-total-tokens), so the sum
    that sizes pools side by side does not apply: on a 24 GiB GPU, where two 8B servers could not
    share, the 8B throughput servers start one after another and get no cap."""
    fake_nvidia_smi(tmp_path, monkeypatch, "24576\\n")
    result = run_proof(options(site(), tmp_path / "out", checks=("throughput",), shape="8b"), lambda m: None)
    assert len(result["servers"]) == 3
    assert all("--max-total-tokens" not in s["argv"] and "start_error" not in s for s in result["servers"])
    assert pools.eight_b_pool_tokens(24576, 1, plain=1) == 0  # the control: side by side they would not fit


def test_any_check_on_the_8b_shape_is_held_to_what_the_gpu_holds(site, tmp_path, monkeypatch):
    """Not only throughput's: equivalence on --shape 8b with four servers at once on an H100 would give
    each a pool of 0 slots (a review found it); refused. Three fit (the control)."""
    fake_nvidia_smi(tmp_path, monkeypatch, "81559\\n")
    sglang = detect.locate(str(site()), sys.executable, dict(os.environ))
    opts = options(site(), tmp_path / "out", checks=("equivalence",), shape="8b", parallel_starts=4)
    with pytest.raises(ProofUsageError, match=r"^--parallel-starts 4: at most 3 of the 8B shape's servers"):
        run.plan(opts, sglang, 81559)
    assert run.plan(replace(opts, parallel_starts=3), sglang, 81559)[0] == ["equivalence"]


def write_real_model(root: Path, target: dict[str, int], weights_bytes: int) -> Path:
    """A ``real prepare`` dir whose target has ``target``'s config and a (sparse) weights file of
    ``weights_bytes``, and SmolLM2's one-layer EAGLE-3 head."""
    model = real_dir(root)
    (model / launch.REAL_TARGET / "config.json").write_text(json.dumps(target))
    head = {"num_hidden_layers": 1, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    (model / launch.REAL_DRAFT / "config.json").write_text(json.dumps(head))
    with open(model / launch.REAL_TARGET / "model.safetensors", "wb") as weights:
        weights.truncate(weights_bytes)
    return model


SMOLLM2_135M = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
LLAMA_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}


@pytest.mark.parametrize(
    ("config", "weights", "fit"),
    [(SMOLLM2_135M, 270_000_000, 15), (LLAMA_8B, 16_000_000_000, 2), ({}, 270_000_000, 3)],
    ids=["smollm2-135m", "llama-8b", "no-config"],
)
def test_a_real_models_servers_side_by_side_are_as_many_as_the_memory_holds(
    site, tmp_path, monkeypatch, config, weights, fit
):
    """A real model is not the 8B shape: the GPU's memory holds as many of its servers as their weights,
    131072-slot pools and 2 GiB besides allow (session 50: 4.8 GiB each of SmolLM2-135M on an H100), so
    auto_threshold's whole sweep (9) can take turns. An 8B real model fits 2; a config that cannot be
    read keeps the old cap of 3 (the control), as does a GPU whose memory is unknown."""
    fake_nvidia_smi(tmp_path, monkeypatch, "81559\\n")
    model = write_real_model(tmp_path / "model", config, weights)
    opts = options(site(), tmp_path / "out", checks=("throughput",), parallel_starts=fit, model="real", model_dir=model)
    sglang = detect.locate(str(site()), sys.executable, dict(os.environ))
    assert run.plan(opts, sglang, 81559)[0] == ["throughput"]
    with pytest.raises(
        ProofUsageError,
        match=rf"^--parallel-starts {fit + 1}: at most {fit} of throughput's, mixed_load's and auto_threshold's servers "
        "start side by side in this GPU's 80 GiB; with fewer",
    ):
        run.plan(replace(opts, parallel_starts=fit + 1), sglang, 81559)
    assert pools.real_servers_side_by_side(None, *launch.real_dirs(model)) == 3
