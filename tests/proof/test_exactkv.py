"""The ``exact_kv`` check: reading recordings, comparing them, the verdict, and the whole check on fake servers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from patcher.proof import exactkv
from patcher.proof import report as reports
from patcher.proof.exactkv import RID_PREFIX, Recording, compare, judge, parse
from patcher.proof.run import DRAFT_KV_ENV, KV_ONLY_MODE, KV_ONLY_MODES, KV_ONLY_WORDS, Proof, ProofOptions, run_proof

from . import fake_sglang
from .test_run import options

A, B = f"{RID_PREFIX}0-long-1", f"{RID_PREFIX}0-long-2"


def line(step: str, rids: list[str], positions: list[int], drafts: list[list[int]] | None = None) -> str:
    entry: dict[str, Any] = {"step": step, "rid": rids, "pos": positions}
    if drafts is not None:
        entry["draft"] = drafts
    return json.dumps(entry)


def spec(rids: list[str], positions: list[int], drafts: list[list[int]]) -> str:
    return line(exactkv.SPECULATE, rids, positions, drafts)


def off(rids: list[str], positions: list[int]) -> str:
    return line(exactkv.FALL_BACK, rids, positions)


# -- parse ---------------------------------------------------------------------------------------


def test_parse_keeps_each_requests_first_fallback_and_its_drafts_by_position() -> None:
    rec = parse(
        [
            spec([A, B], [10, 20], [[1, 2], [3, 4]]),
            off([A, B], [11, 21]),
            off([A], [12]),
            line(exactkv.RESUME, [A], [13]),
            spec([A], [14], [[5, 6]]),
            "",
        ]
    )
    assert (rec.lines, rec.bad_lines) == (5, 0)
    assert rec.first_off == {A: 11, B: 21}
    assert rec.drafts == {A: {10: [1, 2], 14: [5, 6]}, B: {20: [3, 4]}}
    assert rec.history == {
        A: {
            10: (exactkv.SPECULATE, 2),
            11: (exactkv.FALL_BACK, 2),
            12: (exactkv.FALL_BACK, 1),
            13: (exactkv.RESUME, 1),
            14: (exactkv.SPECULATE, 1),
        },
        B: {20: (exactkv.SPECULATE, 2), 21: (exactkv.FALL_BACK, 2)},
    }


def test_parse_ignores_requests_not_named_with_the_prefix() -> None:
    rec = parse([spec(["warmup", A], [5, 6], [[9], [8]]), off(["other"], [7])])
    assert rec.first_off == {} and rec.drafts == {A: {6: [8]}}
    assert parse([spec([A], [6], [[8]])], prefix="elsewhere-").drafts == {}


@pytest.mark.parametrize(
    "bad",
    [
        "not json",
        '{"step": "speculate", "rid": ["x"]}',  # no positions
        json.dumps({"step": "speculate", "rid": [A, B], "pos": [1], "draft": [[1], [2]]}),  # columns differ
        json.dumps({"step": "speculate", "rid": [A], "pos": [1], "draft": [[1], [2]]}),
        json.dumps({"step": "fall back", "rid": 5, "pos": [1]}),
        '{"step": "speculate", "rid": ["dynspec-record-x"], "pos": [1], "dr',  # cut off mid-write
    ],
    ids=["not-json", "no-pos", "short-pos", "long-draft", "rid-not-a-list", "truncated"],
)
def test_a_bad_line_is_counted_and_the_rest_still_read(bad: str) -> None:
    rec = parse([spec([A], [3], [[1]]), bad, off([A], [4])])
    assert (rec.lines, rec.bad_lines) == (3, 1)
    assert rec.drafts == {A: {3: [1]}} and rec.first_off == {A: 4}


def entry(step: str, rids: Any, positions: Any, drafts: Any = None) -> str:
    fields: dict[str, Any] = {"step": step, "rid": rids, "pos": positions}
    if drafts is not None:
        fields["draft"] = drafts
    return json.dumps(fields)


@pytest.mark.parametrize(
    "bad",
    [
        entry(exactkv.SPECULATE, [A], [1], [5]),  # a draft row that is not a list
        entry(exactkv.SPECULATE, [A], [1], [["x"]]),
        entry(exactkv.SPECULATE, [A], [1], [[[1]]]),
        entry(exactkv.SPECULATE, [A], [1], [None]),
        entry(exactkv.SPECULATE, [A], [1], {"0": [1]}),  # drafts that are not a list of rows
        entry(exactkv.SPECULATE, [A, B], [1, 2], [[7], ["x"]]),  # one bad row spoils the line
        entry(exactkv.FALL_BACK, [A], ["x"]),
        entry(exactkv.FALL_BACK, [A], [None]),
        entry(exactkv.FALL_BACK, [A], [[1]]),
        '{"step": "fall back", "rid": ["' + A + '"], "pos": [Infinity]}',  # Python's json reads it, int() cannot
        '{"step": "speculate", "rid": ["' + A + '"], "pos": [1], "draft": [[Infinity]]}',
        '{"step": "speculate", "rid": ["' + A + '"], "pos": [1], "draft": [[NaN]]}',
        "[1, 2]",  # not an object
        '"fall back"',
        "7",
    ],
    ids=[
        "draft-row-int",
        "draft-row-str",
        "draft-row-nested",
        "draft-row-null",
        "drafts-object",
        "one-bad-row",
        "pos-str",
        "pos-null",
        "pos-list",
        "pos-infinity",
        "draft-infinity",
        "draft-nan",
        "array",
        "string",
        "number",
    ],
)
def test_a_line_with_wrong_typed_values_is_a_bad_line_not_an_error(bad: str) -> None:
    rec = parse([spec([A], [3], [[1]]), bad, off([A], [4])])
    assert (rec.lines, rec.bad_lines) == (3, 1)
    assert rec.drafts == {A: {3: [1]}} and rec.first_off == {A: 4}  # nothing of the bad line, not even its good rows


def test_reading_a_missing_recording_is_an_empty_one(tmp_path: Path) -> None:
    assert exactkv.read(tmp_path / "none.jsonl") == Recording()
    path = tmp_path / "r.jsonl"
    path.write_text(spec([A], [3], [[1]]) + "\n")
    assert exactkv.read(path).drafts == {A: {3: [1]}}


# -- compare -------------------------------------------------------------------------------------


def recording(first_off: dict[str, int], drafts: dict[str, dict[int, list[int]]]) -> Recording:
    return Recording(first_off=first_off, drafts=drafts)


def test_compare_looks_only_after_the_references_first_fallback() -> None:
    reference = recording({A: 10}, {A: {5: [1], 10: [2], 11: [3], 12: [4]}})
    other = recording({A: 11}, {A: {5: [9], 11: [3], 12: [7], 13: [8]}})  # 5 differs, but before the fallback
    result = compare(reference, other)
    assert (result.requests, result.steps) == (1, 2)  # positions 11 and 12: recorded by both, after 10
    assert result.mismatches == [{"rid": A, "pos": 12, "reference": [4], "other": [7], "same_history": True}]
    assert result.differs


def test_requests_without_a_fallback_or_without_drafts_after_it_are_not_compared() -> None:
    reference = recording({A: 10, B: 20}, {A: {11: [1]}, B: {19: [1]}, "never-off": {30: [1]}})
    other = recording({}, {A: {12: [1]}, B: {21: [2]}, "never-off": {30: [2]}})
    assert compare(reference, other).requests == 0 and not compare(reference, other).differs


def timeline(resume_at: int, batch: int = 4, last: int = 20, rid: str = A) -> list[str]:
    """``rid`` speculates at 10, falls back from 11 in a batch of ``batch``, resumes at ``resume_at``."""
    rows = [spec([rid], [10], [[0]])] + [
        off([rid] + ["unrecorded"] * (batch - 1), [p] * batch) for p in range(11, resume_at)
    ]
    return (
        rows
        + [line(exactkv.RESUME, [rid], [resume_at])]
        + [spec([rid], [p], [[p]]) for p in range(resume_at + 1, last)]
    )


@pytest.mark.parametrize(
    ("other", "pos", "same"),
    [
        (timeline(15), 18, True),
        (timeline(16), 18, False),  # resumed a position later: position 15 ran as a fallback, not a resume
        (timeline(15, batch=5), 18, False),  # fell back in a bigger batch: other graphs wrote its K/V
        (timeline(15)[:-3] + [spec([A], [17], [[9]])], 17, True),  # what differs later does not count
    ],
)
def test_same_history_asks_whether_the_request_ran_every_iteration_alike(
    other: list[str], pos: int, same: bool
) -> None:
    assert exactkv.same_history(parse(timeline(15)), parse(other), A, pos) is same


def test_a_mismatch_says_whether_the_timelines_parted_before_it() -> None:
    reference = parse(timeline(15))
    parted = parse(timeline(16)[:-1] + [spec([A], [19], [[7]])])
    alike = parse(timeline(15)[:-1] + [spec([A], [19], [[7]])])
    assert [m["same_history"] for m in compare(reference, parted).mismatches] == [False]
    assert [m["same_history"] for m in compare(reference, alike).mismatches] == [True]


# -- judge ---------------------------------------------------------------------------------------

EXACT = recording({A: 10}, {A: {p: [p] for p in range(11, 31)}})
STALE = recording({A: 12}, {A: {p: [p + 1] for p in range(13, 31)}})
DIGESTS = {"kv": ["d1", "d2"], "full": ["d1", "d2"], "skip": ["d1", "d2"]}


def test_judge_passes_when_kv_equals_full_and_the_control_differs() -> None:
    problems: list[str] = []
    entry = judge({"kv": EXACT, "full": EXACT, "skip": STALE}, DIGESTS, 20, problems)
    assert entry["passed"] and problems == []
    assert (entry["compared_requests"], entry["compared_steps"], entry["mismatches"]) == (1, 20, 0)
    assert entry["control_differs"] and (entry["control_compared_steps"], entry["control_mismatches"]) == (18, 18)
    assert entry["recorded_lines"] == {"full": 0, "kv": 0, "skip": 0}


def test_judge_fails_on_a_mismatch_and_names_the_first() -> None:
    entry = judge({"kv": STALE, "full": EXACT, "skip": STALE}, DIGESTS, 10, [])
    assert not entry["passed"] and entry["mismatches"] == 18
    assert entry["mismatch_examples"][0] == {
        "rid": A,
        "pos": 13,
        "reference": [13],
        "other": [14],
        "same_history": True,
    }
    assert (entry["mismatches_same_history"], entry["control_mismatches_same_history"]) == (18, 18)
    assert entry["problems"] == [
        f"18 of 18 proposals differ from the full extend's (18 where the request's timeline matched the full "
        f"extend's), first: {A} at position 13: [14] instead of [13]"
    ]
    assert entry["detail"].startswith("18 of 18 proposals of 1 requests differ from the full extend's;")
    # The control: a pass says they are equal.
    assert "equal the full extend's" in judge({"kv": EXACT, "full": EXACT, "skip": STALE}, DIGESTS, 10, [])["detail"]


def test_judge_fails_when_the_control_cannot_tell_a_stale_kv() -> None:
    entry = judge({"kv": EXACT, "full": EXACT, "skip": EXACT}, DIGESTS, 10, [])
    assert not entry["passed"] and entry["control_differs"] is False
    assert entry["problems"][0].startswith(
        "the control (no draft extend while off) proposed the same as the full extend"
    )


@pytest.mark.parametrize(("min_steps", "passed"), [(20, True), (21, False)])
def test_judge_needs_min_steps_proposals(min_steps: int, passed: bool) -> None:
    entry = judge({"kv": EXACT, "full": EXACT, "skip": STALE}, DIGESTS, min_steps, [])
    assert entry["passed"] is passed
    if not passed:
        assert entry["problems"] == ["only 20 proposals compared after a fallback span, 21 needed"]


def test_judge_fails_on_different_outputs_missing_recordings_and_bad_lines() -> None:
    digests = {**DIGESTS, "skip": ["d1", "other"]}
    bad = Recording(first_off=EXACT.first_off, drafts=EXACT.drafts, lines=3, bad_lines=2)
    entry = judge({"kv": bad, "full": EXACT}, digests, 10, [])
    problems = entry["problems"]
    assert not entry["passed"]
    assert any(p.startswith("greedy outputs of the load differ between the servers") for p in problems)
    assert any(p.startswith("the control") for p in problems)  # no skip recording: nothing differs
    assert "2 unreadable line(s) in the kv recording" in problems
    assert judge({}, {}, 1, [])["problems"][0] == "only 0 proposals compared after a fallback span, 1 needed"


def test_the_load_names_every_request_and_sends_joiners_from_the_second_wave() -> None:
    waves = exactkv.Load(cycles=3, long=2, short=5, joiners=2, long_tokens=100, short_tokens=10).waves()
    assert [len(w) for w in waves] == [7, 9, 9]
    rids = [r.rid or "" for w in waves for r in w]
    assert all(rid.startswith(RID_PREFIX) for rid in rids) and len(set(rids)) == len(rids)
    assert [r.delay for r in waves[1]] == [0.0] * 7 + [exactkv.JOIN_DELAY] * 2
    assert [r.new_tokens for r in waves[1]] == [100, 100] + [10] * 5 + [100, 100]
    assert len({r.index for w in waves for r in w}) == 25  # every prompt its own


# -- the whole check on fake servers ---------------------------------------------------------------


def exact_kv_options(root: Path, out: Path, faults: str = "", **kw: object) -> Any:
    """threshold 8: 4 long requests decode through the span in which 12 short ones keep the batch above it."""
    opts = options(
        root,
        out,
        faults,
        checks=("exact_kv",),
        threshold=8,
        exact_kv_cycles=2,
        exact_kv_long_tokens=100,
        exact_kv_short_tokens=40,
        exact_kv_min_steps=20,
        **kw,
    )
    assert opts.env is not None
    opts.env = {**opts.env, "FAKE_SGLANG_STEP_DELAY": "0.002"}
    return opts


def passed_proof(opts: ProofOptions, check: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, dict[str, Any]]]:
    """The proof's result, ``check``'s entry and the servers by name, once the proof and the check passed."""
    result = run_proof(opts, lambda m: None)
    entry = result[check]
    assert result["passed"] and entry["passed"], reports.summary(result)
    return result, entry, {s["name"]: s for s in result["servers"]}


def test_exact_kv_passes_on_a_correct_dynspec(site: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result, kv, servers = passed_proof(exact_kv_options(site(), out), "exact_kv")
    assert list(servers) == ["dynspec", "dynspec-full", "dynspec-skip"]
    # the server proved runs the KV-only extend from its graph (KV_ONLY_MODE): the caller did not say otherwise
    for name, setting in (("dynspec", "kv-direct"), ("dynspec-full", "full"), ("dynspec-skip", "skip")):
        assert servers[name]["env"]["DYNSPEC_RECORD_DRAFTS"] == str(out / f"drafts-{name}.jsonl")
        assert servers[name]["env"].get("DYNSPEC_DRAFT_KV") == setting
    # the reference is today's fallback whole: the stock zero-step verify as well as the full extend
    assert [servers[n]["env"].get("DYNSPEC_LEAN_VERIFY") for n in servers] == [None, "0", None]
    assert KV_ONLY_WORDS in Path(servers["dynspec"]["log"]).read_text()
    assert fake_sglang.DRAFT_KV_WORDS["kv-direct"] in Path(servers["dynspec"]["log"]).read_text()
    assert (
        kv["kv_only_extend"] == "from a CUDA graph, replayed directly"
    )  # the report says which KV-only extend was proven
    # long requests of both waves and the joiners of the second went through a span and back
    assert kv["compared_requests"] >= 8 and kv["compared_steps"] >= 20 and kv["mismatches"] == 0
    assert kv["control_differs"] and kv["control_mismatches"] > 0
    assert len({tuple(d) for d in kv["digests"].values()}) == 1 and len(kv["digests"]["kv"]) == 2
    assert kv["load"]["long"] == 4 and kv["load"]["short"] == 12 and kv["threshold"] == 8
    recorded = [json.loads(x) for x in (out / "drafts-dynspec.jsonl").read_text().splitlines()]
    assert recorded and all(r.startswith(RID_PREFIX) for x in recorded for r in x["rid"])  # not the warm-up
    assert {x["step"] for x in recorded} == {exactkv.SPECULATE, exactkv.FALL_BACK, exactkv.RESUME}
    assert "exact_kv     PASS" in reports.summary(result)


def test_drafts_that_drift_after_a_fallback_span_fail_exact_kv(site: Any, tmp_path: Path) -> None:
    kv = run_proof(exact_kv_options(site(), tmp_path / "out", "kvdrift"), lambda m: None)["exact_kv"]
    assert not kv["passed"] and kv["mismatches"] > 0 and kv["control_differs"]
    first = kv["mismatch_examples"][0]
    assert first["other"][0] == first["reference"][0] + 1 and first["other"][1:] == first["reference"][1:]
    assert "proposals differ from the full extend's" in kv["problems"][0]


def test_a_control_that_drafts_like_full_fails_exact_kv(site: Any, tmp_path: Path) -> None:
    kv = run_proof(exact_kv_options(site(), tmp_path / "out", "nocontrol"), lambda m: None)["exact_kv"]
    assert not kv["passed"] and kv["control_differs"] is False and kv["mismatches"] == 0
    assert kv["problems"] == [
        f"the control (no draft extend while off) proposed the same as the full extend at all "
        f"{kv['control_compared_steps']} positions compared: this load cannot tell a stale draft KV from an exact one "
        "(a longer load, more --exact-kv-cycles, gives the control more chances to differ)"
    ]


def test_a_dynspec_server_without_the_kv_only_extend_fails_exact_kv(site: Any, tmp_path: Path) -> None:
    kv = run_proof(exact_kv_options(site(), tmp_path / "out", "kvoff"), lambda m: None)["exact_kv"]
    assert not kv["passed"] and kv["mismatches"] == 0 and kv["control_differs"]
    assert len(kv["problems"]) == 1
    assert kv["problems"][0].startswith("the dynspec server did not run the KV-only draft extend: ")
    assert kv["problems"][0].endswith(fake_sglang.DRAFT_KV_WORDS["full"])


def test_the_fakes_start_up_words_are_the_runtimes() -> None:
    from patches.runtime import dynspec_runtime as runtime

    assert set(fake_sglang.DRAFT_KV_WORDS) == set(runtime.DRAFT_KV_SETTINGS) - {"auto"}
    for mode, words in fake_sglang.DRAFT_KV_WORDS.items():
        draft_kv = runtime.DraftKV(mode, None)
        if mode in (runtime.DRAFT_KV_GRAPH, runtime.DRAFT_KV_DIRECT):
            draft_kv.graph = object()  # the fake plays a server whose twin graph was captured
            draft_kv.direct = object() if mode == runtime.DRAFT_KV_DIRECT else None  # and, for kv-direct, fed directly
        assert runtime.describe_draft_kv(draft_kv) == words
    assert (
        fake_sglang.draft_kv_mode(None) == fake_sglang.draft_kv_mode(" Auto ") == runtime.DRAFT_KV_DEFAULT_OWN_FALLBACK
    )
    assert (
        set(fake_sglang.KV_ONLY_MODES)
        == set(KV_ONLY_MODES)
        == {runtime.DRAFT_KV_ONLY, runtime.DRAFT_KV_GRAPH, runtime.DRAFT_KV_DIRECT}
    )
    assert fake_sglang.RECORD_RID_PREFIX == runtime.RECORD_RID_PREFIX


@pytest.mark.parametrize(
    ("setting", "faults", "says"),
    [
        (None, "", "kv-direct"),
        ("", "", "kv-direct"),
        ("auto", "", "kv-direct"),
        ("full", "", "full"),
        ("kv", "", "kv"),
        (" KV-Graph ", "", "kv-graph"),
        ("skip", "", "skip"),
        ("kv", "kvoff", "full"),
        ("kv-graph", "kvoff", "full"),
        ("skip", "kvoff", "skip"),
        (None, "kvoff", "full"),
    ],
)
def test_the_fake_says_what_the_runtime_would(
    setting: str | None, faults: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if setting is None:
        monkeypatch.delenv(DRAFT_KV_ENV, raising=False)
    else:
        monkeypatch.setenv(DRAFT_KV_ENV, setting)
    words = fake_sglang.State(8, None, True, set(filter(None, faults.split(",")))).draft_kv_words()
    assert words == fake_sglang.DRAFT_KV_WORDS[says]
    assert (KV_ONLY_WORDS in words) == (says in KV_ONLY_MODES)


# -- which KV-only mode exact_kv proves ------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "mode", "refused"),
    [
        (None, "kv-direct", False),
        ("", "kv-direct", False),
        ("  ", "kv-direct", False),
        ("kv", "kv", False),
        (" KV-Graph ", "kv-graph", False),
        ("full", "full", True),
        ("auto", "auto", True),  # auto names no mode (kv-direct on v2, full on v1): exact_kv proves a named one
        ("skip", "skip", True),
    ],
)
def test_exact_kv_proves_kv_direct_unless_the_caller_names_another_kv_only_mode(
    setting: str | None, mode: str, refused: bool, tmp_path: Path
) -> None:
    env = {} if setting is None else {DRAFT_KV_ENV: setting}
    proof = Proof(ProofOptions(out=tmp_path, env=env), progress=lambda message: None)
    problems: list[str] = []
    assert proof.kv_mode(problems) == mode
    assert KV_ONLY_MODE == "kv-direct" and KV_ONLY_MODES == ("kv-direct", "kv-graph", "kv")
    assert problems == (
        [
            "exact_kv proves the KV-only draft extend: DYNSPEC_DRAFT_KV must be unset or one of kv-direct, kv-graph, kv, "
            f"not {mode!r}"
        ]
        if refused
        else []
    )


def test_exact_kv_proves_the_eager_kv_only_extend_when_the_caller_asks(site: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    opts = exact_kv_options(site(), out)
    opts.env = {**opts.env, DRAFT_KV_ENV: "kv"}
    _, kv, servers = passed_proof(opts, "exact_kv")
    assert [servers[n]["env"].get(DRAFT_KV_ENV) for n in ("dynspec", "dynspec-full", "dynspec-skip")] == [
        "kv",
        "full",
        "skip",
    ]
    assert fake_sglang.DRAFT_KV_WORDS["kv"] in Path(servers["dynspec"]["log"]).read_text()
    assert kv["kv_only_extend"] == "eagerly"


def test_exact_kv_asked_to_prove_the_full_extend_fails(site: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    opts = exact_kv_options(site(), out)
    opts.env = {**opts.env, DRAFT_KV_ENV: "full"}
    kv = run_proof(opts, lambda m: None)["exact_kv"]
    assert not kv["passed"]
    assert kv["problems"][0] == (
        "exact_kv proves the KV-only draft extend: DYNSPEC_DRAFT_KV must be unset or one of kv-direct, kv-graph, kv, not 'full'"
    )
    assert kv["problems"][1].startswith("the dynspec server did not run the KV-only draft extend: ")


# -- --exact-kv-bits: the full-extend server compares the direct write's bits ---------------------------


def bits_file(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "bits.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_read_bits_sums_the_iterations_and_counts_bad_lines(tmp_path: Path) -> None:
    path = bits_file(
        tmp_path,
        '{"rows": 16, "direct": 0, "packed": 16}',
        '{"rows": 18, "direct": 2}',  # no control this iteration
        "",
        '{"rows": 4, "direct": 5, "packed": 0}',  # more differing rows than rows
        "not json",
    )
    bits = exactkv.read_bits(path)
    assert bits == exactkv.Bits(iterations=2, rows=34, differing=2, control_rows=16, control_differing=16, bad_lines=2)
    assert exactkv.read_bits(tmp_path / "missing.jsonl") is None


@pytest.mark.parametrize(
    ("bits", "passed"),
    [
        (exactkv.Bits(iterations=3, rows=48, differing=0, control_rows=48, control_differing=40), True),
        (exactkv.Bits(iterations=3, rows=48, differing=1, control_rows=48, control_differing=40), False),
        (exactkv.Bits(iterations=3, rows=48, differing=0, control_rows=48, control_differing=0), False),  # no teeth
        (exactkv.Bits(), False),  # no iteration compared
        (exactkv.Bits(iterations=3, rows=48, control_rows=48, control_differing=40, bad_lines=1), False),
    ],
)
def test_bits_pass_when_exact_with_a_control_that_differs(bits: exactkv.Bits, passed: bool) -> None:
    assert bits.entry()["passed"] is passed


EXACT_BITS = exactkv.Bits(iterations=3, rows=48, differing=0, control_rows=48, control_differing=40)


def test_exact_bits_excuse_mismatches_only_after_parted_timelines() -> None:
    """A's timeline parts (it resumes a position later) and one proposal differs; B's does not part."""
    reference = parse(timeline(15) + timeline(15, rid=B))
    parted = parse(timeline(16)[:-1] + [spec([A], [19], [[7]])] + timeline(15, rid=B))
    alike = parse(timeline(15)[:-1] + [spec([A], [19], [[7]])] + timeline(15, rid=B))
    digests = {"kv": ["d"], "full": ["d"], "skip": ["d"]}
    stale = parse(
        [x for rid in (A, B) for x in timeline(15, rid=rid)[:-4] + [spec([rid], [p], [[p + 1]]) for p in range(16, 20)]]
    )
    entry = judge({"kv": parted, "full": reference, "skip": stale}, digests, 4, [], EXACT_BITS)
    assert entry["passed"] and entry["mismatches"] == 1 and entry["bits"]["passed"], entry["problems"]
    assert entry["compared_steps_same_history"] == 4  # B's positions 16 - 19
    assert entry["detail"].startswith("1 of 7 proposals of 2 requests differ, all after the request's timeline parted")
    # Negative controls: without bits, where the timelines did not part, or with too few proposals
    # compared like for like, the same mismatch fails
    assert not judge({"kv": parted, "full": reference, "skip": stale}, digests, 4, [])["passed"]
    assert not judge({"kv": alike, "full": reference, "skip": stale}, digests, 4, [], EXACT_BITS)["passed"]
    assert not judge({"kv": parted, "full": reference, "skip": stale}, digests, 5, [], EXACT_BITS)["passed"]
    inexact = exactkv.Bits(iterations=3, rows=48, differing=1, control_rows=48, control_differing=40)
    failed = judge({"kv": parted, "full": reference, "skip": stale}, digests, 4, [], inexact)
    assert not failed["passed"] and failed["problems"][0].startswith("bits: the direct write left 1 of 48 rows")


def test_exact_kv_bits_on_fake_servers(site: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_proof(exact_kv_options(site(), out, exact_kv_bits=True), lambda m: None)
    kv = result["exact_kv"]
    assert kv["passed"] and kv["bits"]["passed"] and kv["bits"]["iterations"] > 0, reports.summary(result)
    full = {s["name"]: s for s in result["servers"]}["dynspec-full"]["env"]
    assert full["DYNSPEC_DRAFT_KV"] == "kv-direct" and full["DYNSPEC_CHECK_KV_BITS"] == str(
        out / "bits-dynspec-full.jsonl"
    )
    assert full["DYNSPEC_LEAN_VERIFY"] == "0"


@pytest.mark.parametrize("fault", ["bitsdrift", "nobitscontrol"])
def test_exact_kv_bits_fail_on_a_write_that_differs_or_a_control_that_does_not(
    site: Any, tmp_path: Path, fault: str
) -> None:
    kv = run_proof(exact_kv_options(site(), tmp_path / "out", fault, exact_kv_bits=True), lambda m: None)["exact_kv"]
    assert not kv["passed"] and not kv["bits"]["passed"]
    assert any(p.startswith("bits: the direct write left") for p in kv["problems"])


def test_exact_kv_bits_cannot_vouch_for_another_kv_only_mode(site: Any, tmp_path: Path) -> None:
    opts = exact_kv_options(site(), tmp_path / "out", exact_kv_bits=True)
    opts.env = {**opts.env, DRAFT_KV_ENV: "kv-graph"}
    kv = run_proof(opts, lambda m: None)["exact_kv"]
    assert not kv["passed"] and kv["bits"] is None
    assert "--exact-kv-bits checks kv-direct's write, the server under test runs kv-graph" in kv["problems"]


def test_without_the_flag_no_server_is_asked_for_bits(site: Any, tmp_path: Path) -> None:
    result = run_proof(exact_kv_options(site(), tmp_path / "out"), lambda m: None)
    assert result["exact_kv"]["bits"] is None
    assert all("DYNSPEC_CHECK_KV_BITS" not in s["env"] for s in result["servers"])


def test_exact_kv_bits_on_the_server_under_test(site: Any, tmp_path: Path) -> None:
    """--exact-kv-bits-on tested: the server under test (v1: the lean step) compares its rows' direct
    write with its full extend; the reference runs as always, unchecked."""
    out = tmp_path / "out"
    opts = exact_kv_options(site(), out, exact_kv_bits=True)
    opts.exact_kv_bits_on = "tested"
    result = run_proof(opts, lambda m: None)
    kv = result["exact_kv"]
    assert kv["passed"] and kv["bits"]["passed"] and kv["bits"]["server"] == "tested", reports.summary(result)
    env = {s["name"]: s["env"] for s in result["servers"]}
    assert env["dynspec"]["DYNSPEC_CHECK_KV_BITS"] == str(out / "bits-dynspec.jsonl")
    assert "DYNSPEC_CHECK_KV_BITS" not in env["dynspec-full"] and env["dynspec-full"]["DYNSPEC_DRAFT_KV"] == "full"
    assert not (out / "bits-dynspec-full.jsonl").exists()
    # The control: the same run with a write that differs fails on the bits.
    faulty = exact_kv_options(site(), tmp_path / "faulty", "bitsdrift", exact_kv_bits=True)
    faulty.exact_kv_bits_on = "tested"
    assert not run_proof(faulty, lambda m: None)["exact_kv"]["bits"]["passed"]
