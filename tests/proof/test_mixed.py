"""The ``mixed_load`` check: its schedule, repeated passes, the per-phase oracle and the verdict."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from patcher.proof import combine, mixed
from patcher.proof import report as reports
from patcher.proof.client import LevelResult, Reply, Request, prompt
from patcher.proof.run import Proof, run_proof
from patcher.proof.servers import Server

from .conftest import real_dir
from .test_run import options

SCHEDULE = mixed.Schedule((1, 8, 1), per_phase=2, new_tokens=8)


def mixed_options(root: Path, out: Path, **kw: Any) -> Any:
    """A mixed_load run small enough for fake servers; timing on a CPU is noise, so no verdict on it."""
    base: dict[str, Any] = {
        "checks": ("mixed_load",),
        "mixed_phases": (1, 8, 1),
        "mixed_per_phase": 1,
        "mixed_new_tokens": 4,
        "mixed_repeats": 2,
        "max_mixed_ratio": 100.0,
    }
    return options(root, out, **{**base, **kw})


def phase(c: int, seconds: float, failed: bool = False) -> LevelResult:
    reply = Reply(0, 500 if failed else 200, [1] * 8, {}, seconds, "HTTP 500" if failed else None)
    return LevelResult(c, 8, seconds, [reply])


def passes(*per_phase: Sequence[float], failed_phase: int | None = None) -> list[mixed.Run]:
    """One pass per sequence of phase times."""
    return [
        mixed.Run([phase(c, s, failed=i == failed_phase) for i, (c, s) in enumerate(zip(SCHEDULE.phases, times))])
        for times in per_phase
    ]


def test_the_schedule_numbers_prompts_in_order_and_sizes_phases_by_concurrency() -> None:
    phases = SCHEDULE.requests()
    assert [len(p) for p in phases] == [2, 16, 2]
    indices = [r.index for p in phases for r in p]
    assert indices == list(range(mixed.FIRST_PROMPT, mixed.FIRST_PROMPT + 20))
    assert all(r == Request(r.index, 8) for p in phases for r in p)  # no rid, no delay
    assert SCHEDULE.describe() == {
        "phases": [1, 8, 1],
        "requests_per_phase": [2, 16, 2],
        "new_tokens": 8,
        "first_prompt": mixed.FIRST_PROMPT,
        "prompts_per_pass": 20,
        "closed_loop": True,
    }
    second = [r.index for p in SCHEDULE.requests(1) for r in p]
    assert second == list(range(mixed.FIRST_PROMPT + 20, mixed.FIRST_PROMPT + 40))  # new prompts each pass
    assert not set(second) & set(indices) and SCHEDULE.requests(0) == phases  # control: pass 0 is the same


def test_output_lengths_that_differ_by_request_are_drawn_by_prompt_alike_everywhere() -> None:
    """--mixed-new-tokens-max: each request's length from new_tokens to the maximum, by its prompt, so
    every server and every call sends the same length for a prompt, and passes differ as their prompts
    do. The control: without it every request asks for new_tokens."""
    varied = mixed.Schedule((1, 8, 1), per_phase=2, new_tokens=32, new_tokens_max=224)
    lengths = [r.new_tokens for p in varied.requests(1) for r in p]
    assert all(32 <= n <= 224 for n in lengths) and len(set(lengths)) > 10
    assert lengths == [r.new_tokens for p in varied.requests(1) for r in p]  # drawn again: the same
    assert lengths != [r.new_tokens for p in varied.requests(2) for r in p]  # another pass's prompts
    assert varied.describe()["new_tokens_max"] == 224 and "new_tokens_max" not in SCHEDULE.describe()
    assert {r.new_tokens for p in SCHEDULE.requests(1) for r in p} == {8}


def test_a_mixed_load_with_varied_lengths_completes_every_request_at_its_own_length(site: Any, tmp_path: Path) -> None:
    """The fake servers answer each request with the tokens it asked for (ignore_eos); a shorter or
    longer answer would fail the pass."""
    opts = mixed_options(site(), tmp_path / "out", mixed_new_tokens=2, mixed_new_tokens_max=9)
    ml = run_proof(opts, lambda m: None)["mixed_load"]
    assert all(len(samples) == 2 for samples in ml["samples"].values())
    assert not [p for p in ml["problems"] if not p.startswith("dynspec is not faster than")]
    assert (ml["schedule"]["new_tokens"], ml["schedule"]["new_tokens_max"]) == (2, 9)


@pytest.mark.parametrize("parallel", [1, 3], ids=["one-after-another", "taking-turns"])
def test_each_server_reports_the_prompts_its_mixed_passes_found_cached(
    site: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parallel: int
) -> None:
    """Fake servers that log SGLang's prefill line as a prefix cache would: with new prompts each pass,
    no server's mixed passes find any cached, and the summary says nothing; the control, every pass
    sending pass 0's prompts (as before session 36), has every server's count above 0, said."""
    monkeypatch.setenv("FAKE_SGLANG_PREFIX_CACHE", "1")
    opts = mixed_options(site(), tmp_path / "new", parallel_starts=parallel)
    counts = {s["name"]: s[reports.MIXED_CACHED] for s in run_proof(opts, lambda m: None)["servers"]}
    assert counts == {"dynspec-sim": 0, "always-on-sim": 0, "base-sim": 0}
    repeat = mixed.Schedule.requests
    monkeypatch.setattr(mixed.Schedule, "requests", lambda self, pass_index=0: repeat(self, 0))
    result = run_proof(mixed_options(site(), tmp_path / "same", parallel_starts=parallel), lambda m: None)
    counts = {s["name"]: s[reports.MIXED_CACHED] for s in result["servers"]}
    prompt_tokens = sum(len(prompt(r.index)) for phase in opts.mixed_schedule.requests() for r in phase)
    assert counts == dict.fromkeys(counts, 2 * prompt_tokens) and len(counts) == 3  # the 2 timed passes
    assert "found in the prefix cache, by server" in reports.summary(result)


def test_the_oracle_is_the_faster_static_server_phase_by_phase() -> None:
    problems: list[str] = []
    runs = {"base": passes([3, 1, 3]), "always_on": passes([1, 2, 1]), "dynspec": passes([1.0, 1.02, 1.0])}
    entry = mixed.judge(SCHEDULE, runs, 1.03, problems)
    assert entry["passed"] and problems == []
    assert entry["oracle_seconds"] == 3.0 and entry["dynspec_over_oracle"] == round(3.02 / 3, 4)
    assert entry["seconds"] == {"base": 7.0, "always_on": 4.0, "dynspec": 3.02}
    low = {
        "C": 1,
        "requests": 2,
        "oracle_s": 1,
        "base_s": 3,
        "always_on_s": 1,
        "dynspec_s": 1.0,
        "faster_static": "always_on",
    }
    high = {
        "C": 8,
        "requests": 16,
        "oracle_s": 1,
        "base_s": 1,
        "always_on_s": 2,
        "dynspec_s": 1.02,
        "faster_static": "base",
    }
    assert entry["phases"] == [low, high, low]  # the schedule's C=1 phases ran alike
    assert entry["detail"] == "dynspec 3.02 s, oracle 3.00 s (1.007x), base 7.00 s, always-on 4.00 s"


def test_phases_and_totals_are_medians_over_the_passes() -> None:
    base = passes([1, 5, 1], [2, 2, 2], [5, 1, 5])  # phase medians 2, 2, 2; totals 7, 6, 11
    entry = mixed.judge(SCHEDULE, {"base": base, "always_on": passes([9, 9, 9]), "dynspec": passes([2, 2, 2])}, 2.0, [])
    assert [row["base_s"] for row in entry["phases"]] == [2, 2, 2]
    assert entry["seconds"]["base"] == 7.0  # the median pass, not the sum of the phase medians (6)
    assert entry["samples"]["base"] == [7.0, 6.0, 11.0]
    assert entry["oracle_seconds"] == 6.0


def test_the_sums_of_per_phase_medians_are_reported_beside_the_verdict() -> None:
    """dynspec's passes each have one slow phase, a different one each time: its median total (8)
    counts one; the sum of its phase medians (6), the oracle's statistic, none. The verdict stays
    on the totals. The control: passes without a slow phase read the same both ways."""
    dynspec = passes([4, 2, 2], [2, 4, 2], [2, 2, 4])
    entry = mixed.judge(
        SCHEDULE, {"base": passes([2, 3, 2]), "always_on": passes([3, 2, 3]), "dynspec": dynspec}, 1.1, []
    )
    assert entry["oracle_seconds"] == 6.0 and entry["seconds"]["dynspec"] == 8.0
    assert entry["phase_median_sums"] == {"base": 7.0, "always_on": 8.0, "dynspec": 6.0}
    assert (entry["dynspec_over_oracle"], entry["dynspec_over_oracle_by_phase"]) == (1.3333, 1.0)
    assert not entry["passed"]  # 8 > 1.1 x 6, and not faster than always-on's 8
    steady = mixed.judge(
        SCHEDULE, {"base": passes([2, 3, 2]), "always_on": passes([3, 2, 3]), "dynspec": passes([2, 2, 2])}, 1.1, []
    )
    assert steady["dynspec_over_oracle"] == steady["dynspec_over_oracle_by_phase"] == 1.0 and steady["passed"]
    text = reports.summary({"mixed_load": {**entry, "repeats": 3}})
    assert "sums of phase medians: base 7.00, always-on 8.00, dynspec 6.00 (1.000x the oracle; not the verdict)" in text


def test_more_than_max_ratio_times_the_oracle_fails() -> None:
    entry = mixed.judge(
        SCHEDULE,
        {"base": passes([3, 1, 3]), "always_on": passes([1, 2, 1]), "dynspec": passes([1.1, 1.1, 1.0])},
        1.03,
        [],
    )
    assert not entry["passed"]
    assert entry["problems"] == ["dynspec took 3.20 s, 1.067x the oracle's 3.00 s (at most 1.03x)"]


def test_being_no_faster_than_a_static_server_fails_even_near_the_oracle() -> None:
    """When one static server wins every phase the oracle is that server: dynspec must still beat it."""
    entry = mixed.judge(
        SCHEDULE, {"base": passes([1, 1, 1]), "always_on": passes([2, 2, 2]), "dynspec": passes([1, 1.05, 1])}, 1.03, []
    )
    assert not entry["passed"] and entry["dynspec_over_oracle"] == round(3.05 / 3, 4)
    assert entry["problems"] == ["dynspec is not faster than base (3.00 s): 3.05 s"]
    tie = mixed.judge(
        SCHEDULE, {"base": passes([1, 1, 1]), "always_on": passes([1, 1, 1]), "dynspec": passes([1, 1, 1])}, 1.03, []
    )
    assert tie["problems"] == ["dynspec is not faster than base (3.00 s) and always_on (3.00 s): 3.00 s"]


def test_a_missing_server_or_one_without_a_complete_pass_fails() -> None:
    entry = mixed.judge(SCHEDULE, {"base": passes([1, 1, 1]), "dynspec": passes([1, 1, 1])}, 1.03, [])
    assert not entry["passed"] and entry["problems"] == ["no complete pass of the load on always_on"]
    assert (entry["oracle_seconds"], entry["dynspec_over_oracle"], entry["phases"]) == (None, None, [])
    assert entry["detail"] == "incomplete" and entry["seconds"] == {"base": 3.0, "always_on": None, "dynspec": 3.0}
    failed = {"base": passes([1, 1, 1]), "always_on": passes([1, 1, 1]), "dynspec": passes([1, 1, 1], failed_phase=1)}
    entry = mixed.judge(SCHEDULE, failed, 1.03, [])
    assert entry["problems"] == [
        "dynspec: phase 1 (C=8): prompt 0: HTTP 500",
        "no complete pass of the load on dynspec",
    ]
    assert entry["detail"] == "incomplete"


def test_a_failed_or_short_pass_is_reported_and_left_out_of_the_medians() -> None:
    dynspec = passes([1, 1, 1], [9, 9, 9], failed_phase=None) + passes([5, 5, 5], failed_phase=0)
    dynspec[1].phases = dynspec[1].phases[:2]  # stopped after two phases
    entry = mixed.judge(
        SCHEDULE, {"base": passes([2, 2, 2]), "always_on": passes([3, 3, 3]), "dynspec": dynspec}, 1.5, []
    )
    assert entry["samples"]["dynspec"] == [3.0] and entry["seconds"]["dynspec"] == 3.0
    assert entry["problems"] == ["dynspec: phase 0 (C=1): prompt 0: HTTP 500"]


def test_measure_warms_up_untimed_and_stops_at_the_first_failing_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    failing = {7}  # the 8th phase sent: the second phase of the second timed pass

    def fake_run_requests(client: Any, requests: Sequence[Request], concurrency: int) -> LevelResult:
        calls.append(concurrency)
        return phase(concurrency, 1.0, failed=len(calls) - 1 in failing and concurrency == 8)

    monkeypatch.setattr(mixed, "run_requests", fake_run_requests)
    runs = mixed.measure(None, SCHEDULE, repeats=3, warmup=True)  # type: ignore[arg-type]
    assert len(calls) == 9  # warm-up, one good pass, the failing one: no third
    assert len(runs) == 2 and runs[0].failures == [] and runs[1].failures == ["phase 1 (C=8): prompt 0: HTTP 500"]
    calls.clear()
    failing = {1}  # the warm-up fails: it is what is returned
    runs = mixed.measure(None, SCHEDULE, repeats=3, warmup=True)  # type: ignore[arg-type]
    assert len(calls) == 3 and len(runs) == 1 and runs[0].failures


def test_mixed_load_runs_on_the_three_throughput_servers(site: Any, tmp_path: Path) -> None:
    opts = mixed_options(site(), tmp_path / "out")
    result = run_proof(opts, lambda m: None)
    ml = result["mixed_load"]
    assert [s["name"] for s in result["servers"]] == ["dynspec-sim", "always-on-sim", "base-sim"]
    assert all(s["env"]["SGLANG_SIMULATE_ACC_LEN"] == "3" for s in result["servers"])
    assert set(ml["seconds"]) == {"base", "always_on", "dynspec"} and all(
        isinstance(v, float) for v in ml["seconds"].values()
    )
    assert [row["C"] for row in ml["phases"]] == [1, 8, 1] and ml["oracle_seconds"] > 0
    assert all(len(samples) == 2 for samples in ml["samples"].values())
    assert (ml["repeats"], ml["shape"], ml["schedule"]["requests_per_phase"]) == (2, "8b", [1, 8, 1])
    assert all(p.startswith("dynspec is not faster than") for p in ml["problems"])  # nothing failed or is missing
    assert "throughput" not in result
    assert "mixed load: total s, median of 2" in reports.summary(result)


def test_a_variant_runs_right_after_dynspec_with_its_own_env_and_is_reported_not_judged(
    site: Any, tmp_path: Path
) -> None:
    opts = mixed_options(site(), tmp_path / "out", mixed_variants=(("prefill-kv", (("DYNSPEC_PREFILL_KV", "1"),)),))
    result = run_proof(opts, lambda m: None)
    servers = result["servers"]
    assert [s["name"] for s in servers] == ["dynspec-sim", "dynspec-prefill-kv-sim", "always-on-sim", "base-sim"]
    assert [s["env"].get("DYNSPEC_PREFILL_KV") for s in servers] == [None, "1", None, None]
    assert servers[1]["mode"] == "dynspec" and "--speculative-disable-batch-size" in servers[1]["argv"]
    ml = result["mixed_load"]
    variant = ml["variants"]["prefill-kv"]
    assert variant["env"] == {"DYNSPEC_PREFILL_KV": "1"} and len(variant["samples"]) == 2
    assert variant["over_dynspec"] == round(variant["seconds"] / ml["seconds"]["dynspec"], 4)
    assert len(variant["phases_s"]) == 3 and variant["dynspec_over_oracle"] > 0
    assert set(ml["seconds"]) == {"base", "always_on", "dynspec"}  # the verdict's servers are unchanged
    assert "variant prefill-kv (DYNSPEC_PREFILL_KV=1)" in reports.summary(result)


def test_a_variant_without_a_complete_pass_is_reported_as_such(site: Any, tmp_path: Path) -> None:
    """Negative control: a variant whose server gave no runs is not passed and says why."""
    opts = options(site(), tmp_path / "out", checks=("mixed_load",), mixed_phases=(1, 8, 1),
                   mixed_variants=(("x", (("A", "1"),)),))  # fmt: skip
    run = Proof(opts, lambda m: None)
    runs = {"base": passes([3, 1, 3]), "always_on": passes([1, 2, 1]), "dynspec": passes([1, 1, 1])}
    entry = run.judge_mixed(runs, [], "8b", {"x": []})
    assert entry["passed"]  # dynspec's own verdict is not the variant's
    assert not entry["variants"]["x"]["passed"] and entry["variants"]["x"]["seconds"] is None
    assert "no complete pass of the load on dynspec" in entry["variants"]["x"]["problems"][0]


# -- servers up at once take turns (--parallel-starts covering the check, --interleave) ------------


def test_servers_taking_turns_rotate_the_order_each_pass_and_a_failing_one_drops_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[str] = []
    first_prompts: dict[str, list[int]] = {}  # each server's passes, by their first prompt

    def fake_run_requests(client: Any, requests: Sequence[Request], concurrency: int) -> LevelResult:
        if concurrency == SCHEDULE.phases[0] and sent.count(client) % len(SCHEDULE.phases) == 0:
            first_prompts.setdefault(client, []).append(requests[0].index)
        sent.append(client)
        passes_of_b = sent.count("b") // len(SCHEDULE.phases)
        return phase(concurrency, 1.0, failed=client == "b" and passes_of_b == 2 and concurrency == 8)

    monkeypatch.setattr(mixed, "run_requests", fake_run_requests)
    clients: dict[str, Any] = {"a": "a", "b": "b", "c": "c"}  # run_requests is all that sees a client
    runs = mixed.measure_together(clients, SCHEDULE, repeats=3, warmup=True)
    order = sent[:: len(SCHEDULE.phases)]  # one entry per pass
    # warm-up a b c; then a b c, b c a (b's second timed pass fails), c a (b dropped out)
    assert order == ["a", "b", "c", "a", "b", "c", "b", "c", "a", "c", "a"]
    assert [len(runs[n]) for n in "abc"] == [3, 2, 3]
    assert runs["b"][-1].failures and not any(r.failures for n in "ac" for r in runs[n])
    # the warm-up sends prompt set 0, timed pass j set j, on every server whatever its turn
    passes_of = [mixed.FIRST_PROMPT + k * SCHEDULE.prompts_per_pass for k in range(4)]
    assert first_prompts == {"a": passes_of, "b": passes_of[:3], "c": passes_of}
    first_prompts.clear()
    sent.clear()
    mixed.measure("d", SCHEDULE, repeats=3, warmup=False)  # type: ignore[arg-type]
    assert first_prompts == {"d": passes_of[1:]}  # without a warm-up: the timed passes' sets all the same
    sent.clear()
    alone = mixed.measure("a", SCHEDULE, repeats=3, warmup=True)  # type: ignore[arg-type]
    assert len(sent) == 4 * len(SCHEDULE.phases) and len(alone) == 3  # negative control: one server, no turns


def test_the_rotation_puts_each_server_once_in_every_position() -> None:
    from patcher.proof.client import rotated

    names = ["dynspec", "always_on", "base"]
    turns = [rotated(names, t) for t in range(3)]
    assert turns == [names, ["always_on", "base", "dynspec"], ["base", "dynspec", "always_on"]]
    assert all(sorted(column) == sorted(names) for column in zip(*turns))
    assert rotated(names, 3) == names and rotated([], 5) == []


def level_lines(notes: list[str]) -> list[str]:
    """``server C=n`` of each throughput level's progress line, in the order they were said."""
    return [f"{m[1]} C={m[2]}" for note in notes if (m := re.match(r"\s+(\S+) C=(\d+): \d+ tokens in", note))]


@pytest.mark.parametrize(("parallel", "interleave", "together"), [(3, True, True), (1, True, False), (3, False, False)])
def test_throughput_and_mixed_load_servers_up_at_once_take_turns(
    site: Any, tmp_path: Path, parallel: int, interleave: bool, together: bool
) -> None:
    """With --parallel-starts covering the three servers, every level is done on all three before the
    next one starts, and each report says how it was measured; without (negative controls) one
    server's levels follow another's, as before."""
    from patcher.proof.run import ORDER_ALONE, ORDER_TOGETHER

    notes: list[str] = []
    opts = mixed_options(
        site(), tmp_path / "out", checks=("throughput", "mixed_load"), throughput_repeats=2,
        parallel_starts=parallel, interleave=interleave,
    )  # fmt: skip
    result = run_proof(opts, notes.append)
    names = ["dynspec-sim", "always-on-sim", "base-sim"]
    said = level_lines(notes)
    if together:
        assert said == [f"{n} C={c}" for c in (1, 8) for n in names]
    else:
        assert said == [f"{n} C={c}" for n in names for c in (1, 8)]
    order = ORDER_TOGETHER if together else ORDER_ALONE
    tp, ml = result["throughput"], result["mixed_load"]
    assert (tp["order"], ml["order"]) == (order, order)
    assert reports.summary(result).count(f"    order: {order}") == 2
    assert all(len(s) == 2 for server in tp["samples"].values() for s in server)
    assert all(len(s) == 2 for s in ml["samples"].values()) and set(ml["seconds"]) == {"base", "always_on", "dynspec"}
    assert tp["dynspec"] is not None and all(x is not None for x in tp["dynspec"])
    assert set(tp["per_run"]) <= {"dynspec", "always_on", "base"} and tp["per_run"]
    assert all(s["stopped_by"] == "SIGTERM" for s in result["servers"])


THREE_AND_ONE = [
    # (path, checks, the compared servers, taking turns, then the one only told about, alone)
    ("v1", ("throughput",), ["dynspec-sim", "always-on-sim", "base-no-overlap-sim"], ["base-sim"]),
    ("v2", ("throughput",), ["dynspec-sim", "always-on-sim", "base-sim"], ["base-no-overlap-sim"]),
    ("v1", ("mixed_load",), ["dynspec-sim", "always-on-sim", "base-sim"], ["base-no-overlap-sim"]),
    # negative control: four compared servers (v1's throughput judged against one base, its mixed
    # load against the other) do not fit three starts (the most the 8B shape allows)
    ("v1", ("throughput", "mixed_load"), [], ["dynspec-sim", "always-on-sim", "base-sim", "base-no-overlap-sim"]),
]


@pytest.mark.parametrize(("path", "checks", "together", "alone"), THREE_AND_ONE, ids=["v1", "v2", "v1-mixed", "four"])
def test_with_a_fourth_plain_server_the_compared_three_take_turns_and_it_follows(
    site: Any, tmp_path: Path, path: str, checks: tuple[str, ...], together: list[str], alone: list[str]
) -> None:
    """--no-overlap-base adds a plain-decode server that a check's verdict may not compare: the three it
    compares start together and take turns at every level and pass, then that one is measured alone
    (session 37's v1 servers, one after another, drifted by up to 8 % from run to run)."""
    from patcher.proof.run import ORDER_ALONE, ORDER_FIRST_TOGETHER

    from .test_run import order_of

    notes: list[str] = []
    opts = mixed_options(
        site(), tmp_path / "out", checks=checks, throughput_repeats=2, parallel_starts=3, path=path,
        no_overlap_base=True, min_envelope_ratio=0.0,
    )  # fmt: skip
    result = run_proof(opts, notes.append)
    events = order_of(notes)
    assert [e[1:] for e in events if e[0] == "+"] == together + alone
    if together:
        # the three up before any is measured or stopped; the fourth starts once they have stopped
        assert events[:6] == [*(f"+{n}" for n in together), *(f"={n}" for n in together)]
        assert sorted(events[6:9]) == sorted(f"-{n}" for n in together) and events[9] == f"+{alone[0]}"
        order = ORDER_FIRST_TOGETHER.format(", ".join(together), alone[0])
    else:
        order = ORDER_ALONE  # started three at once, measured one after another
    if "throughput" in checks:
        said = level_lines(notes)
        turns = [f"{n} C={c}" for c in (1, 8) for n in together]
        assert said == turns + [f"{n} C={c}" for n in alone for c in (1, 8)]
        tp = result["throughput"]
        assert tp["order"] == order and tp["passed"], reports.summary(result)
        assert all(len(s) == 2 for server in tp["samples"].values() for s in server) and len(tp["samples"]) == 4
    if "mixed_load" in checks:
        ml = result["mixed_load"]
        assert ml["order"] == order and all(len(s) == 2 for s in ml["samples"].values())
        assert ml["no_overlap"]["seconds"]["base"] is not None
    assert reports.summary(result).count(f"    order: {order}") == len(checks)
    assert all(s["stopped_by"] == "SIGTERM" for s in result["servers"])


def no_port_for_always_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The third port asked for (dynspec's port and NCCL port come first) is not to be had."""
    from patcher.proof import run as proof_run

    calls: list[int] = []
    real_free_port = proof_run.free_port

    def free_port(first: int, tries: int = 200, taken: Any = ()) -> int:
        calls.append(first)
        if len(calls) == 3:
            raise proof_run.ServerStartError(f"no free port in {first}..{first + tries - 1}")
        return int(real_free_port(first, tries, taken))

    monkeypatch.setattr(proof_run, "free_port", free_port)


@pytest.mark.parametrize("path", ["v1", "v2"])
def test_a_start_failure_among_the_compared_three_starts_no_fourth(
    site: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """always-on gets no port: nothing is measured, and the server that would follow the three alone
    never starts (the control of the split's failure path; the old code reached it only by a break)."""
    from .test_run import alive, order_of, server_pids

    no_port_for_always_on(monkeypatch)
    notes: list[str] = []
    out = tmp_path / "out"
    opts = mixed_options(
        site(), out, checks=("throughput",), parallel_starts=3, path=path, no_overlap_base=True,
        min_envelope_ratio=0.0,
    )  # fmt: skip
    result = run_proof(opts, notes.append)
    started = [e[1:] for e in order_of(notes) if e[0] == "+"]
    alone = "base-sim" if path == "v1" else "base-no-overlap-sim"
    assert started and alone not in started
    assert level_lines(notes) == []
    assert result["throughput"]["problems"][0].startswith("no free port in")
    assert result["complete"] is False and result["passed"] is False
    assert not [p for p in server_pids(out) if alive(p)]


def test_a_mixed_load_variant_keeps_every_server_one_after_another(site: Any, tmp_path: Path) -> None:
    """A --mixed-variant is measured right after its dynspec server, so nothing takes turns: its passes
    stay its own. The control (checked): counting the compared modes rather than servers, without the
    variants' guard, put the variant in dynspec's group, whose passes then overwrote dynspec's."""
    from patcher.proof.run import ORDER_ALONE

    notes: list[str] = []
    opts = mixed_options(
        site(), tmp_path / "out", parallel_starts=3, no_overlap_base=True,
        mixed_variants=(("prefill-kv", (("DYNSPEC_PREFILL_KV", "1"),)),),
    )  # fmt: skip
    ml = run_proof(opts, notes.append)["mixed_load"]
    assert ml["order"] == ORDER_ALONE
    told = [n.split()[0] for n in notes if "mixed load:" in n]
    names = ["dynspec-sim", "dynspec-prefill-kv-sim", "always-on-sim", "base-sim", "base-no-overlap-sim"]
    assert told == [n for n in names for _ in range(2)]
    assert len(ml["variants"]["prefill-kv"]["samples"]) == 2 and len(ml["samples"]["dynspec"]) == 2


def test_a_server_that_cannot_launch_among_those_taking_turns_stops_them_all(
    site: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """always-on gets no port: nothing is measured, the failure is the first problem of both checks,
    and no server is left running."""
    from .test_run import alive, server_pids

    no_port_for_always_on(monkeypatch)
    notes: list[str] = []
    out = tmp_path / "out"
    opts = mixed_options(site(), out, checks=("throughput", "mixed_load"), parallel_starts=3)
    result = run_proof(opts, notes.append)
    assert level_lines(notes) == [] and not any("mixed load:" in n for n in notes)
    assert result["complete"] is False and result["passed"] is False
    for check in ("throughput", "mixed_load"):
        assert result[check]["problems"][0].startswith("no free port in")
    assert not [p for p in server_pids(out) if alive(p)]


def test_levels_taking_turns_warm_up_rotate_and_keep_a_failed_run_as_that_servers_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per level: every server warmed up, then the timed runs in rotated order; a server whose run
    fails is out of that level (the failed run is its result) and back at the next level."""
    from patcher.proof import run as proof_run
    from patcher.proof.servers import Server, ServerSpec

    from .test_run import options

    sent: list[tuple[str, int]] = []

    def fake_run_level(client: Any, indices: Sequence[int], new_tokens: int) -> LevelResult:
        name = {30001: "a", 30002: "b", 30003: "c"}[client.port]
        c = len(indices)
        sent.append((name, c))
        failed = (
            name == "b" and c == 2 and sum(1 for n, k in sent if n == "b" and k == 2) == 3
        )  # b's 2nd timed run at C=2
        return LevelResult(
            c,
            new_tokens,
            0.5 + len(sent) / 100,
            [Reply(0, 500 if failed else 200, [1] * new_tokens, {}, 0.1, "HTTP 500" if failed else None)],
        )

    monkeypatch.setattr(proof_run, "run_level", fake_run_level)
    proof = Proof(options(tmp_path, tmp_path / "out", settle=0.0), lambda m: None)
    servers = []
    for port, name in ((30001, "a"), (30002, "b"), (30003, "c")):
        log = tmp_path / f"{name}.log"
        log.write_text("")
        servers.append(Server(ServerSpec(name, ("true",), {}, log, port)))
    out = proof.levels_together(servers, [1, 2], 4, warmup=True, repeats=3)
    at_2 = [n for n, c in sent if c == 2]
    # warm-ups a b c; timed a b c | b c a (b fails) | c a
    assert at_2 == ["a", "b", "c", "a", "b", "c", "b", "c", "a", "c", "a"]
    assert [n for n, c in sent if c == 1] == ["a", "b", "c", "a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert [len(r.samples) for r, _ in out["a"]] == [3, 3] and [len(r.samples) for r, _ in out["c"]] == [3, 3]
    first, second = (r for r, _ in out["b"])
    assert len(first.samples) == 3 and first.failures == []
    assert second.failures and second.samples == ()  # the failed run, not a median that hides it


# -- auto_threshold: auto against a sweep of fixed thresholds -------------------------------------


def auto_runs(
    auto: float, fixed: dict[int, float], base: float = 10.0, always_on: float = 9.0
) -> dict[str, list[mixed.Run]]:
    """Passes of SCHEDULE at acceptance 3 whose totals are the given seconds (split evenly over its phases)."""

    def runs(total: float) -> list[mixed.Run]:
        return passes(*[[total / 3] * 3] * 3)

    out = {"base": runs(base), "always_on@3": runs(always_on), "auto@3": runs(auto)}
    out.update({f"{n}@3": runs(s) for n, s in fixed.items()})
    return out


def test_auto_within_the_ratio_of_the_best_fixed_n_passes_and_says_which_n() -> None:
    entry = mixed.judge_auto(auto_runs(8.1, {8: 8.5, 32: 8.0, 64: 8.8}), SCHEDULE, ["3"], [8, 32, 64], 1.03)
    assert entry["passed"], entry["problems"]
    row = entry["by_acceptance"]["3"]
    assert (row["best_fixed_n"], row["best_fixed_s"], row["auto_s"], row["auto_over_best_fixed"]) == (
        32,
        8.0,
        8.1,
        1.0125,
    )
    assert row["faster_than_both"] and (row["base_s"], row["always_on_s"]) == (10.0, 9.0)
    assert row["fixed_s"] == {"8": 8.5, "32": 8.0, "64": 8.8}
    assert "acceptance 3: auto 8.10 s, best N=32 8.00 s (1.012x)" in entry["detail"]


def test_auto_is_set_beside_the_per_phase_oracle_of_base_and_always_on() -> None:
    """Session 34 had auto beat always-on, N = 32 and base with no oracle in its report to say how
    near the best it came: now mixed_load's oracle (phase by phase the faster static server) is
    reported beside, not judged. Base and always-on take 5 s each, each faster in other phases, so
    the oracle (4 s) is below both (the control: not either total); auto at 4.2 s is 1.05x it."""
    runs = {
        "base": passes([1.0, 3.0, 1.0], [1.0, 3.0, 1.0]),
        "always_on@3": passes([0.5, 4.0, 0.5], [0.5, 4.0, 0.5]),
        "auto@3": passes([0.6, 3.0, 0.6], [0.6, 3.0, 0.6]),
        "32@3": passes([0.6, 3.2, 0.6], [0.6, 3.2, 0.6]),
    }
    row = mixed.judge_auto(runs, SCHEDULE, ["3"], [32], 1.03)["by_acceptance"]["3"]
    assert (row["base_s"], row["always_on_s"], row["oracle_s"], row["auto_over_oracle"]) == (5.0, 5.0, 4.0, 1.05)
    assert row["oracle_s"] < min(row["base_s"], row["always_on_s"])
    # each server's passes and phase medians, for reading where auto gained: its middle phase is base's
    assert row["samples"] == {"base": [5.0, 5.0], "always_on": [5.0, 5.0], "auto": [4.2, 4.2], "32": [4.4, 4.4]}
    assert row["phase_medians"]["auto"] == [0.6, 3.0, 0.6] and row["phase_medians"]["32"] == [0.6, 3.2, 0.6]
    del runs["always_on@3"]  # without always-on there is no oracle, and nothing claims one
    assert "oracle_s" not in mixed.judge_auto(runs, SCHEDULE, ["3"], [32], 1.03)["by_acceptance"]["3"]


def test_auto_beyond_the_ratio_or_slower_than_both_static_servers_fails() -> None:
    """The negative controls: 4 % behind the best N; then slower than base and always-on alike."""
    behind = mixed.judge_auto(auto_runs(8.32, {32: 8.0}), SCHEDULE, ["3"], [32], 1.03)
    assert not behind["passed"] and "1.040x the best fixed N's (N=32, 8.00 s; at most 1.03x)" in behind["problems"][0]
    slow = mixed.judge_auto(auto_runs(10.5, {32: 10.4}, base=10.0, always_on=9.0), SCHEDULE, ["3"], [32], 1.03)
    assert not slow["passed"] and "slower than base (10.00) and always-on (9.00)" in slow["problems"][0]
    between = mixed.judge_auto(auto_runs(9.5, {32: 9.4}, base=10.0, always_on=9.0), SCHEDULE, ["3"], [32], 1.03)
    assert between["passed"] and not between["by_acceptance"]["3"]["faster_than_both"]  # reported, not judged


def test_auto_threshold_reports_each_servers_refills_under_its_own_name() -> None:
    """``refills`` keyed as the runs, reported by server name beside the times; a run that read none
    (the control) reports no such key, as reports from before session 49 have none."""
    rates = {"33-64": {"speculating": 2.3}}
    refills = {"base": {"33-64": {"not_speculating": 0.4}}, "always_on@3": rates, "auto@3": {}, "32@3": rates}
    row = mixed.judge_auto(auto_runs(8.0, {32: 8.0}), SCHEDULE, ["3"], [32], 1.03, None, refills)["by_acceptance"]["3"]
    assert row["prefills_per_1000_tokens"] == {
        "base": {"33-64": {"not_speculating": 0.4}},
        "always_on": rates,
        "auto": {},
        "32": rates,
    }
    assert (
        "prefills_per_1000_tokens"
        not in mixed.judge_auto(auto_runs(8.0, {32: 8.0}), SCHEDULE, ["3"], [32], 1.03)["by_acceptance"]["3"]
    )


def test_auto_threshold_reports_each_servers_steps_without_speculation_and_the_dynspec_servers_spread() -> None:
    """``fallback_steps`` keyed as the runs, reported by server name, and by concurrency how far apart
    the dynspec servers' (auto's and the fixed N's) lie; base and always-on run other code and stay out
    of the spread, a level only one server has gives none, and a sweep that read none (the control)
    reports neither key."""
    read = {
        "base": {"64": 1.4, "128": 1.6},
        "always_on@3": {"64": 9.0},
        "auto@3": {"64": 2.7, "128": 3.4},
        "32@3": {"64": 3.1},
    }
    row = mixed.judge_auto(auto_runs(8.0, {32: 8.0}), SCHEDULE, ["3"], [32], 1.03, None, None, read)["by_acceptance"][
        "3"
    ]
    assert row["fallback_step_ms"] == {
        "base": {"64": 1.4, "128": 1.6},
        "always_on": {"64": 9.0},
        "auto": {"64": 2.7, "128": 3.4},
        "32": {"64": 3.1},
    }
    assert row["fallback_step_spread"] == {"64": round(3.1 / 2.7, 3)}
    unread = mixed.judge_auto(auto_runs(8.0, {32: 8.0}), SCHEDULE, ["3"], [32], 1.03)["by_acceptance"]["3"]
    assert "fallback_step_ms" not in unread and "fallback_step_spread" not in unread


def test_a_server_without_a_complete_pass_fails_auto_threshold() -> None:
    runs = auto_runs(8.0, {32: 8.0})
    runs["32@3"] = passes([1.0, 1.0, 1.0], failed_phase=1)
    entry = mixed.judge_auto(runs, SCHEDULE, ["3"], [32], 1.03)
    assert not entry["passed"] and any("no complete pass on N=32" in p for p in entry["problems"])
    assert entry["detail"] == "incomplete"
    row = entry["by_acceptance"]["3"]  # a server with no complete pass has no samples to show
    assert "32" not in row["samples"] and "32" not in row["phase_medians"] and len(row["samples"]["auto"]) == 3


def test_auto_threshold_runs_base_once_and_its_servers_per_acceptance(site: Any, tmp_path: Path) -> None:
    from patcher.proof.run import ORDER_ALONE

    # 7 requests at most: the fake's auto starts at its ceiling, 6, which the phase of 8 crosses
    opts = mixed_options(
        site(version="0.5.17"), tmp_path / "out", checks=("auto_threshold",), path="v2",
        auto_acceptances=(2.0, 3.0), auto_sweep=(2, 6), max_auto_ratio=100.0,
        extra_args=("--max-running-requests", "7"),
    )  # fmt: skip
    result = run_proof(opts, lambda m: None)
    names = [s["name"] for s in result["servers"]]
    assert names == [
        "dynspec-auto-acc2", "dynspec-n2-acc2", "dynspec-n6-acc2", "always-on-acc2",
        "dynspec-auto-acc3", "dynspec-n2-acc3", "dynspec-n6-acc3", "always-on-acc3",
        "base-auto",
    ]  # fmt: skip
    assert result["auto_threshold"]["order"] == ORDER_ALONE  # one server started at a time
    servers = {s["name"]: s for s in result["servers"]}
    assert (
        servers["dynspec-auto-acc2"]["argv"][
            servers["dynspec-auto-acc2"]["argv"].index("--speculative-disable-batch-size") + 1
        ]
        == "auto"
    )
    assert servers["dynspec-n6-acc3"]["env"]["SGLANG_SIMULATE_ACC_LEN"] == "3"
    entry = result["auto_threshold"]
    # timing on a CPU is noise: only its verdict on speed may fail, nothing may be missing or broken
    assert all(" is slower than base " in p for p in entry["problems"]), entry["problems"]
    assert set(entry["by_acceptance"]) == {"2", "3"} and entry["by_acceptance"]["2"]["best_fixed_n"] in (2, 6)
    assert all(isinstance(e["auto_over_best_fixed"], float) for e in entry["by_acceptance"].values())
    assert "auto threshold: mixed-load total s, median of 2" in reports.summary(result)
    # each server's refills, read from its log over its passes: the fake's passes log no decode line
    assert all(
        e["prefills_per_1000_tokens"] == {"base": {}, "always_on": {}, "auto": {}, "2": {}, "6": {}}
        for e in entry["by_acceptance"].values()
    )
    # and each server's steady steps without speculation: none in the fake's passes either
    assert all(
        e["fallback_step_ms"] == {"base": {}, "always_on": {}, "auto": {}, "2": {}, "6": {}}
        and e["fallback_step_spread"] == {}
        for e in entry["by_acceptance"].values()
    )
    # where auto put N, from its own server's log: the fake's switch point at its first switch off
    for label, said in ((a, e["auto_decisions"]) for a, e in entry["by_acceptance"].items()):
        settled = {"disable_above": 48, "enable_at_or_below": 40, "reason": "estimated", "acceptance": float(label)}
        assert said == {"count": 1, "estimated": 1, "swings": 0, "last": settled, "last_estimated": settled}
    assert (
        "auto at acceptance 3: 1 threshold changes, its estimates moved N by more than 2x 0 times; its last estimate: off above 48, on at or below 40"
        in reports.summary(result)
    )
    # the control: a fixed N's server logs no decision, and one that never decided says so
    assert mixed.decided([]) == {"count": 0, "estimated": 0, "swings": 0, "last": None, "last_estimated": None}
    assert not any("dynspec auto:" in Path(s["log"]).read_text() for s in result["servers"] if "-n" in s["name"])


def test_an_auto_sweep_stopped_by_the_calls_time_limit_keeps_what_it_measured(
    site: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device call's limit stops the proof with SIGTERM (SystemExit) in the middle of a sweep: the
    report on disk still judges the servers measured before it (auto, N = 2 and 6, always-on) and says
    it was interrupted; base, never measured, has no time. Uninterrupted runs (the test above, the
    control) name no interruption."""
    measured = mixed.measure_together

    def limit_reached(clients: Any, schedule: mixed.Schedule, repeats: int, warmup: bool) -> Any:
        if "base-auto" in clients:
            raise SystemExit(143)
        return measured(clients, schedule, repeats, warmup)

    monkeypatch.setattr(mixed, "measure_together", limit_reached)
    out = tmp_path / "out"
    opts = mixed_options(
        site(version="0.5.17"), out, checks=("auto_threshold",), path="v2",
        auto_acceptances=(3.0,), auto_sweep=(2, 6), max_auto_ratio=100.0,
        extra_args=("--max-running-requests", "7"),
    )  # fmt: skip
    with pytest.raises(SystemExit):
        run_proof(opts, lambda m: None)
    saved = reports.load(out / "report.json")
    entry = saved["auto_threshold"]
    assert entry["problems"][0] == "interrupted after 4 of 5 servers were measured" and not entry["passed"]
    row = entry["by_acceptance"]["3"]
    assert all(isinstance(row[k], float) for k in ("auto_s", "always_on_s")) and row["base_s"] is None
    assert all(isinstance(row["fixed_s"][n], float) for n in ("2", "6"))
    assert not saved["passed"] and not saved["complete"]
    assert all(s["stopped_by"] for s in saved["servers"])  # every server it started was stopped


def test_an_auto_sweep_is_on_disk_before_each_group_of_servers_stops(
    site: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Session 51: a call's limit killed a sweep while its nine servers stopped, before the report was
    written. Each group's numbers are now on disk before its servers are asked to stop: at each stop
    the report there holds every server measured so far, said to be interrupted; the finished run's
    (the control) says no such thing."""
    out = tmp_path / "out"
    seen: list[tuple[str, list[str], bool]] = []  # at each stop: the server, the problems on disk, auto measured
    stop = Server.stop

    def looking(self: Server) -> str:
        on_disk = reports.load(out / "report.json").get("auto_threshold")
        if on_disk is not None and not self.stopped_by:
            seen.append((self.spec.name, on_disk["problems"][:1], on_disk["by_acceptance"]["3"]["auto_s"] is not None))
        return stop(self)

    monkeypatch.setattr(Server, "stop", looking)
    opts = mixed_options(
        site(version="0.5.17"), out, checks=("auto_threshold",), path="v2",
        auto_acceptances=(3.0,), auto_sweep=(2, 6), max_auto_ratio=100.0,
        extra_args=("--max-running-requests", "7"),
    )  # fmt: skip
    result = run_proof(opts, lambda m: None)
    assert [name for name, _, _ in seen] == [
        "dynspec-auto-acc3", "dynspec-n2-acc3", "dynspec-n6-acc3", "always-on-acc3", "base-auto",
    ]  # fmt: skip
    assert [problems for _, problems, _ in seen] == [
        [f"interrupted after {k} of 5 servers were measured"] for k in range(1, 6)
    ]
    assert all(measured for _, _, measured in seen)
    assert not any("interrupted" in p for p in result["auto_threshold"]["problems"])


def test_on_real_weights_auto_threshold_runs_at_the_models_own_acceptance(site: Any, tmp_path: Path) -> None:
    """Issue 16's "the same with the real model": one set of servers, none simulating, keyed ``real``."""
    model = real_dir(tmp_path / "model")
    opts = mixed_options(
        site(version="0.5.17"), tmp_path / "out", checks=("auto_threshold",), path="v2",
        auto_acceptances=(2.0, 3.0), auto_sweep=(2, 6), max_auto_ratio=100.0, model="real", model_dir=model,
    )  # fmt: skip
    result = run_proof(opts, lambda m: None)
    names = [s["name"] for s in result["servers"]]
    assert names == ["dynspec-auto-real", "dynspec-n2-real", "dynspec-n6-real", "always-on-real", "base-auto"]
    assert not any("SGLANG_SIMULATE_ACC_LEN" in s["env"] for s in result["servers"])  # the model's own acceptance
    entry = result["auto_threshold"]
    assert set(entry["by_acceptance"]) == {"real"} and entry["by_acceptance"]["real"]["best_fixed_n"] in (2, 6)
    assert all(" is slower than base " in p for p in entry["problems"]), entry["problems"]
    # timed on the kernels users serve with, as the simulated parts it joins (--combine wants them alike)
    assert result["deterministic"] is False
    assert not any("--enable-deterministic-inference" in s["argv"] for s in result["servers"])
    # the control: the same run on dummy weights simulates each acceptance asked for
    dummy = run_proof(dataclasses.replace(opts, model="dummy", model_dir=None, out=tmp_path / "out2"), lambda m: None)
    assert set(dummy["auto_threshold"]["by_acceptance"]) == {"2", "3"}


@pytest.mark.parametrize(("parallel", "interleave"), [(3, True), (1, True), (3, False)])
def test_auto_thresholds_servers_started_together_take_turns_at_each_pass(
    site: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parallel: int, interleave: bool
) -> None:
    """Session 50: one after another, a call's later servers ran slower (N = 32's passes 7.35, 8.72,
    11.61 s after N = 8's and 16's), more than the 3 % auto is judged by. With --parallel-starts 3, auto
    and the first two fixed N start together and take turns at every pass, the order rotated, then
    always-on and base; the controls (one start at a time, or --one-after-another) measure each
    server's passes in one go."""
    from patcher.proof.run import ORDER_ALONE, ORDER_GROUPS

    ran: list[str] = []  # the server of each pass, in the order they ran
    once, client_of = mixed.run_once, Proof.client

    def named_client(self: Proof, server: Any) -> Any:
        client = client_of(self, server)
        client.server = server.spec.name.removesuffix("-real")  # ports are reused from group to group
        return client

    def recorded(client: Any, schedule: mixed.Schedule, pass_index: int = 0) -> mixed.Run:
        ran.append(client.server)
        return once(client, schedule, pass_index)

    monkeypatch.setattr(Proof, "client", named_client)
    monkeypatch.setattr(mixed, "run_once", recorded)
    opts = mixed_options(
        site(version="0.5.17"), tmp_path / "out", checks=("auto_threshold",), path="v2",
        auto_acceptances=(3.0,), auto_sweep=(2, 6), max_auto_ratio=100.0,
        model="real", model_dir=real_dir(tmp_path / "model"), parallel_starts=parallel, interleave=interleave,
    )  # fmt: skip
    result = run_proof(opts, lambda m: None)
    a, n2, n6, on, base = "dynspec-auto", "dynspec-n2", "dynspec-n6", "always-on", "base-auto"
    if parallel > 1 and interleave:
        # a warm-up pass each, then two timed passes, the second in rotated order
        assert ran == [a, n2, n6, a, n2, n6, n2, n6, a, on, base, on, base, base, on]
        groups = "dynspec-auto-real, dynspec-n2-real, dynspec-n6-real; always-on-real, base-auto"
        assert result["auto_threshold"]["order"] == ORDER_GROUPS + groups
    else:
        assert ran == [name for name in (a, n2, n6, on, base) for _ in range(3)]
        assert result["auto_threshold"]["order"] == ORDER_ALONE
    row = result["auto_threshold"]["by_acceptance"]["real"]
    assert all(len(row["samples"][k]) == 2 for k in ("auto", "2", "6", "always_on", "base")), row["samples"]


def test_on_real_weights_deterministic_auto_stays_off_only_where_every_check_times(site: Any, tmp_path: Path) -> None:
    """``--deterministic auto`` on real weights: batch-invariant kernels for checks that compare tokens
    across servers, the kernels users serve with where every check only times servers. The control: a
    check that compares tokens beside a timing one turns it on for every server."""
    model = real_dir(tmp_path / "model")
    timing = mixed_options(
        site(version="0.5.17"), tmp_path / "out", checks=("mixed_load",), path="v2", model="real", model_dir=model
    )
    assert run_proof(timing, lambda m: None)["deterministic"] is False
    both = dataclasses.replace(timing, checks=("mixed_load", "equivalence"), out=tmp_path / "out2")
    result = run_proof(both, lambda m: None)
    assert result["deterministic"] is True
    assert all("--enable-deterministic-inference" in s["argv"] for s in result["servers"])


def test_the_real_models_sweep_joins_the_simulated_one_as_the_device_steps_run_them(site: Any, tmp_path: Path) -> None:
    """kv-auto (dummy weights, --threshold 32) and real-auto (--model real, --threshold 8, without
    piecewise prefill graphs) on one release: `dynspec proof --combine` joins their reports into the
    issue's one, acceptance 3 beside ``real``. Before session 46 it refused them twice over: the real
    run had deterministic inference on, and the report's enable_threshold followed --threshold. The
    control: a real run asked for batch-invariant kernels is still refused, by name."""
    root = site(version="0.5.17")
    sweep: dict[str, Any] = {
        "checks": ("auto_threshold",), "path": "v2", "auto_sweep": (2, 6), "max_auto_ratio": 100.0, "freeze_gc": True
    }  # fmt: skip
    dummy = mixed_options(
        root, tmp_path / "dummy", threshold=32, auto_acceptances=(3.0,), **sweep,
        command="python -m patcher proof --threshold 32 --checks auto_threshold --freeze-gc",
    )  # fmt: skip
    real_command = (
        "python -m patcher proof --model real --threshold 8 --checks auto_threshold --freeze-gc "
        "--extra-args --disable-piecewise-cuda-graph"
    )
    real = mixed_options(
        root, tmp_path / "real", threshold=8, model="real", model_dir=real_dir(tmp_path / "model"), **sweep,
        extra_args=("--disable-piecewise-cuda-graph",), command=real_command,
    )  # fmt: skip
    parts = [(name, run_proof(opts, lambda m: None)) for name, opts in (("dummy", dummy), ("real", real))]
    joined = combine.combine(parts, (2, 6), 100.0)
    assert set(joined["auto_threshold"]["by_acceptance"]) == {"3", "real"}, joined["auto_threshold"]["problems"]
    assert joined["auto_threshold"]["weights"]["real"]["server_flags"]["extra_args"] == [
        "--disable-piecewise-cuda-graph"
    ]
    on = run_proof(dataclasses.replace(real, deterministic="on", out=tmp_path / "on"), lambda m: None)
    with pytest.raises(combine.CombineError, match="^on: deterministic True differs from dummy's False$"):
        combine.combine([parts[0], ("on", on)], (2, 6), 100.0)


@pytest.mark.parametrize(("version", "path"), [("0.5.13", "v2"), ("0.5.17", "v1")])
def test_auto_threshold_needs_v2_on_0_5_14_or_later(site: Any, tmp_path: Path, version: str, path: str) -> None:
    from patcher.proof.errors import ProofUsageError

    opts = mixed_options(site(version=version), tmp_path / "out", checks=("auto_threshold",), path=path)
    with pytest.raises(ProofUsageError, match=r"auto_threshold needs --path v2 on SGLang 0.5.14 or later"):
        run_proof(opts, lambda m: None)


def test_swings_count_the_moves_of_the_switch_point_by_more_than_twice() -> None:
    """1 -> 127 and back are swings, 26 -> 50 and 50 -> 26 are not (at most 2 x), 26 -> 53 is; the
    control: a bound that stays put has none."""
    assert mixed.swings([1, 127, 127, 1, 26, 50, 26, 53]) == 4
    assert mixed.swings([88] * 20) == 0 and mixed.swings([]) == 0
