"""The ``acceptance`` check: reading positions, windows after the switch back on, the verdict, and the
whole check on fake servers (whose recorded steps advance ``FAKE_SGLANG_ACCEPT`` tokens while the
draft KV is exact), with ``--model real`` plumbing: the model dir's weights and tokenized prompts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from patcher.proof import acceptance, launch
from patcher.proof import report as reports
from patcher.proof.acceptance import NEVER_OFF, Trace, judge, parse, window
from patcher.proof.client import Client
from patcher.proof.exactkv import FALL_BACK, RESUME, RID_PREFIX, SPECULATE
from patcher.proof.run import NEVER_OFF_NAME, run_proof

from .conftest import real_dir
from .test_exactkv import exact_kv_options, passed_proof

A = f"{RID_PREFIX}0-long-1"


def lines(steps: list[tuple[str, int]], rid: str = A) -> list[str]:
    return [json.dumps({"step": s, "rid": [rid], "pos": [p]}) for s, p in steps]


def test_the_window_starts_after_the_last_fallback_and_counts_tokens_per_verify() -> None:
    trace = parse(lines([(SPECULATE, 10), (SPECULATE, 13), (FALL_BACK, 14), (FALL_BACK, 15), (RESUME, 16),
                         (SPECULATE, 17), (SPECULATE, 19), (SPECULATE, 22), (SPECULATE, 25)]))  # fmt: skip
    assert acceptance.resumed_from(trace) == {A: 17}
    w = window(trace, {A: 17})
    assert (w.tokens, w.verifies, w.length) == (8, 3, 2.6667)  # 17 -> 25 in three verifies
    # a reference that never went off, measured over the same positions
    ref = parse(lines([(SPECULATE, p) for p in (10, 14, 18, 22, 26)]))
    assert window(ref, {A: 17}).length == 4.0  # 18 -> 26 in two verifies


def test_a_fallback_span_inside_the_window_is_not_counted_as_accepted() -> None:
    trace = parse(lines([(SPECULATE, 20), (SPECULATE, 21), (FALL_BACK, 22), (SPECULATE, 40), (SPECULATE, 42)]))
    assert window(trace, {A: 20}).length == 2.0  # only 40 -> 42: past the request's last fallback


def test_bad_lines_are_counted_and_reported() -> None:
    trace = parse(["not json", json.dumps({"step": SPECULATE, "rid": [A, A], "pos": [1]}), *lines([(SPECULATE, 3)])])
    assert trace.bad_lines == 2 and trace.speculate == {A: [3]}


def traces(resumed: list[int], always: list[int], skip: list[int]) -> dict[str, Trace]:
    off = [(FALL_BACK, 5), (RESUME, 6)]
    return {
        "kv": parse(lines([(SPECULATE, 1), *off] + [(SPECULATE, p) for p in resumed])),
        "full": parse(lines([(SPECULATE, 1), *off] + [(SPECULATE, p) for p in resumed])),
        "skip": parse(lines([(SPECULATE, 1), *off] + [(SPECULATE, p) for p in skip])),
        NEVER_OFF: parse(lines([(SPECULATE, p) for p in always])),
    }


def test_judge_passes_when_resumed_equals_always_on_and_the_control_drops() -> None:
    entry = judge(traces([7, 10, 13, 16], [4, 7, 10, 13, 16], [7, 8, 9, 10]), 3, [])
    assert entry["passed"], entry["problems"]
    assert (entry["always_on"], entry["dynspec_resumed"], entry["skip_resumed"], entry["requests"]) == (
        3.0,
        3.0,
        1.0,
        1,
    )
    assert entry["skip_over_always_on"] == 0.3333 and entry["full_resumed"] == 3.0


def test_judge_fails_when_resumed_acceptance_drops() -> None:
    entry = judge(traces([7, 9, 11, 13], [4, 7, 10, 13, 16], [7, 8, 9, 10]), 3, [])
    assert not entry["passed"] and entry["problems"] == [
        "resumed acceptance 2.000 is below 0.99 x always-on's 3.000 beyond the spread of its requests "
        "(ratio 0.6667, 95 % interval 0.6667 - 0.6667)"  # one request: no spread
    ]


B = f"{RID_PREFIX}0-long-2"


def two_requests(kv: tuple[int, int], full: tuple[int, int], always: tuple[int, int]) -> dict[str, Trace]:
    """Requests A and B fall back at 5 - 6 and then speculate 20 times, accepting per verify as given."""
    off = [(FALL_BACK, 5), (RESUME, 6)]

    def resumed(step_a: int, step_b: int) -> Trace:
        return parse(lines(off + [(SPECULATE, 7 + step_a * i) for i in range(21)])
                     + lines(off + [(SPECULATE, 7 + step_b * i) for i in range(21)], rid=B))  # fmt: skip

    never = parse(
        lines([(SPECULATE, 7 + always[0] * i) for i in range(21)])
        + lines([(SPECULATE, 7 + always[1] * i) for i in range(21)], rid=B)
    )
    return {"kv": resumed(*kv), "full": resumed(*full), "skip": resumed(1, 1), NEVER_OFF: never}


def test_judge_holds_the_resumed_acceptance_to_the_full_extends_on_the_same_requests() -> None:
    entry = judge(two_requests(kv=(3, 2), full=(3, 3), always=(3, 3)), 3, [])
    assert entry["problems"][0] == (
        "resumed acceptance is 0.8333 x the full extend's on the same requests, below 0.99 (2.500 against 3.000 over each server's own)"
    )
    assert entry["resumed_over_full"]["ratio"] == 0.8333 and entry["skip_over_full"]["ratio"] == 0.3333


def test_judge_lets_always_on_differ_within_the_spread_of_its_requests_only() -> None:
    """Always-on's text parts from the others': one request accepting more there, another less, is
    spread; both accepting more is a drop (negative control)."""
    spread = judge(two_requests(kv=(2, 4), full=(2, 4), always=(4, 2)), 3, [])
    assert spread["passed"], spread["problems"]
    low, high = spread["resumed_over_always_on"]["ci95"]
    assert spread["resumed_over_always_on"]["ratio"] == 1.0 and low < 0.99 < high
    below = judge(two_requests(kv=(2, 2), full=(2, 2), always=(4, 3)), 3, [])
    assert not below["passed"] and "beyond the spread of its requests" in below["problems"][0]
    assert below["control_drops"] is True  # skip accepts 1 where full accepts 2


def test_judge_reports_a_control_that_does_not_drop() -> None:
    entry = judge(traces([7, 10, 13, 16], [4, 7, 10, 13, 16], [7, 10, 13, 16]), 3, [])
    assert entry["passed"] and entry["control_drops"] is False and "no drop" in entry["detail"]


def test_a_request_that_advanced_no_token_is_left_out_not_divided_by() -> None:
    stuck = parse(lines([(FALL_BACK, 5), (RESUME, 6), (SPECULATE, 7), (SPECULATE, 7)]))
    assert acceptance.per_request(stuck, {A: 7}) == {}
    assert acceptance.ratio(acceptance.per_request(stuck, {A: 7}), {A: acceptance.Window(3, 1)}) is None


def test_judge_fails_with_too_few_verifies_or_no_resumed_request() -> None:
    assert "only 3 verifies" in judge(traces([7, 10, 13, 16], [4, 7, 10, 13, 16], [7, 8, 9, 10]), 50, [])["problems"][0]
    empty = {k: Trace() for k in ("kv", "full", "skip", NEVER_OFF)}
    assert judge(empty, 1, [])["problems"][0] == "no recorded request speculated again after a fallback span"


def acceptance_options(root: Path, out: Path, faults: str = "", accept: str = "3", **kw: object) -> Any:
    opts = dataclasses.replace(
        exact_kv_options(root, out, faults), checks=("acceptance",), acceptance_min_verifies=20, **kw
    )
    opts.env = {**opts.env, "FAKE_SGLANG_ACCEPT": accept}
    return opts


def test_acceptance_passes_on_a_correct_dynspec(site: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result, acc, servers = passed_proof(acceptance_options(site(), out), "acceptance")
    assert acc["always_on"] == 3.0 and acc["dynspec_resumed"] == 3.0 and acc["full_resumed"] == 3.0
    assert acc["skip_resumed"] < 0.99 * 3.0 and acc["requests"] >= 4  # how many went off and back is timing
    assert list(servers) == ["dynspec", "dynspec-full", "dynspec-skip", NEVER_OFF_NAME]
    never = servers[NEVER_OFF_NAME]["argv"]
    assert never[never.index("--speculative-disable-batch-size") + 1] == str(launch.MAX_RUNNING_REQUESTS - 1)
    assert "dynspec: speculation OFF" not in Path(servers[NEVER_OFF_NAME]["log"]).read_text()
    assert result["model"] == "dummy" and "acceptance   PASS" in reports.summary(result)
    assert result["model_sha256"] is None and "model:" not in reports.summary(result)


def test_a_control_that_keeps_its_acceptance_is_reported_not_judged(site: Any, tmp_path: Path) -> None:
    """A one-layer EAGLE-3 head may not see a stale draft KV at all (session 16): the control's drop
    is a number in the report; the verdict is the issue's, resumed against always-on."""
    acc = run_proof(acceptance_options(site(), tmp_path / "out", "nocontrol"), lambda m: None)["acceptance"]
    assert acc["passed"] and acc["skip_resumed"] == acc["always_on"] == 3.0
    assert acc["control_drops"] is False and acc["detail"].endswith(
        "do not see a stale draft KV (exact_kv proves the KV)"
    )
    dropped = run_proof(acceptance_options(site(), tmp_path / "out2"), lambda m: None)["acceptance"]
    assert dropped["control_drops"] is True and "no drop" not in dropped["detail"]  # the control that drops


def test_a_fallback_that_leaves_the_draft_kv_stale_fails_the_check(site: Any, tmp_path: Path) -> None:
    acc = run_proof(acceptance_options(site(), tmp_path / "out", "kvdrift"), lambda m: None)["acceptance"]
    assert not acc["passed"] and acc["dynspec_resumed"] == 1.0 and acc["full_resumed"] == 3.0
    assert acc["problems"][0].startswith(
        "resumed acceptance is 0.3333 x the full extend's on the same requests, below 0.99"
    )


def test_dummy_weights_accept_nothing_and_the_check_fails(site: Any, tmp_path: Path) -> None:
    acc = run_proof(acceptance_options(site(), tmp_path / "out", accept="1"), lambda m: None)["acceptance"]
    assert not acc["passed"] and acc["always_on"] == acc["skip_resumed"] == 1.0
    assert acc["problems"][0].startswith("always-on accepted 1.000 tokens per verify (below 1.1)")


def test_model_real_serves_the_dirs_weights_and_sends_its_prompts(site: Any, tmp_path: Path) -> None:
    model = real_dir(tmp_path / "model")
    result = run_proof(acceptance_options(site(), tmp_path / "out", model="real", model_dir=model), lambda m: None)
    assert result["model"] == "tiny-real" and result["acceptance"]["passed"], reports.summary(result)
    assert result["model_sha256"] == {"gguf": "ab" * 32, "head": None}  # the weights that ran, as model.json names them
    assert "model: tiny-real (sha256: gguf abababababab)" in reports.summary(result)
    for server in result["servers"]:
        argv = server["argv"]
        assert argv[argv.index("--model-path") + 1] == str(model / "target")
        assert argv[argv.index("--speculative-draft-model-path") + 1] == str(model / "draft")
        assert "dummy" not in argv  # neither --load-format nor --speculative-draft-load-format
    client = Client("127.0.0.1", 1, prompts=[[5, 6], [7]])
    assert client.prompt(0) == [5, 6] and client.prompt(3) == [7]  # prompt i is prompts[i % n]
    assert Client("127.0.0.1", 1).prompt(0)[0] >= 100  # without real prompts: the synthetic ids


def test_a_dir_of_real_own_serves_the_users_weights_through_its_links(site: Any, tmp_path: Path) -> None:
    """``dynspec real own``'s dir: every server is given its links, the report names the model."""
    from patcher.real import prepare

    weights = real_dir(tmp_path / "weights")
    draft_config = {"architectures": ["LlamaForCausalLMEagle3"]}
    (weights / launch.REAL_DRAFT / "config.json").write_text(json.dumps(draft_config))
    model = tmp_path / "mine"
    prepare.own(
        model, weights / launch.REAL_TARGET, weights / launch.REAL_DRAFT, weights / launch.REAL_PROMPTS, "my 8B"
    )
    result = run_proof(acceptance_options(site(), tmp_path / "out", model="real", model_dir=model), lambda m: None)
    assert result["model"] == "my 8B" and result["acceptance"]["passed"], reports.summary(result)
    target, draft = weights / launch.REAL_TARGET, weights / launch.REAL_DRAFT
    assert result["model_paths"] == {"target": str(target.resolve()), "head": str(draft.resolve())}
    assert f"model: my 8B (target {target.resolve()}, head {draft.resolve()})" in reports.summary(result)
    for server in result["servers"]:
        argv = server["argv"]
        assert Path(argv[argv.index("--model-path") + 1]).resolve() == weights / launch.REAL_TARGET
        assert Path(argv[argv.index("--speculative-draft-model-path") + 1]).resolve() == weights / launch.REAL_DRAFT


def test_real_weights_run_every_server_deterministic_where_the_release_can(site: Any, tmp_path: Path) -> None:
    model = real_dir(tmp_path / "model")
    result = run_proof(acceptance_options(site(), tmp_path / "out", model="real", model_dir=model), lambda m: None)
    assert result["deterministic"] and all("--enable-deterministic-inference" in s["argv"] for s in result["servers"])
    older = run_proof(
        acceptance_options(site(deterministic=False), tmp_path / "out2", model="real", model_dir=model), lambda m: None
    )
    assert not older["deterministic"] and not any(
        "--enable-deterministic-inference" in s["argv"] for s in older["servers"]
    )
    # Negative controls: dummy weights leave it off unless asked; "on" where the release lacks it is refused.
    dummy = run_proof(acceptance_options(site(), tmp_path / "out3"), lambda m: None)
    assert not dummy["deterministic"] and not any(
        "--enable-deterministic-inference" in s["argv"] for s in dummy["servers"]
    )
    asked = run_proof(acceptance_options(site(), tmp_path / "out4", deterministic="on"), lambda m: None)
    assert all("--enable-deterministic-inference" in s["argv"] for s in asked["servers"])
    import pytest

    from patcher.proof.errors import ProofUsageError

    with pytest.raises(
        ProofUsageError, match="--deterministic on: SGLang 0.5.12 has no --enable-deterministic-inference"
    ):
        run_proof(acceptance_options(site(deterministic=False), tmp_path / "out5", deterministic="on"), lambda m: None)
    assert not (tmp_path / "out5").exists()


def test_a_model_dir_that_prepare_did_not_make_is_a_usage_error(site: Any, tmp_path: Path) -> None:
    import pytest

    from patcher.proof.errors import ProofUsageError

    (tmp_path / "empty").mkdir()
    with pytest.raises(ProofUsageError, match="not made by `dynspec real prepare`"):
        run_proof(
            acceptance_options(site(), tmp_path / "out", model="real", model_dir=tmp_path / "empty"), lambda m: None
        )
    with pytest.raises(ProofUsageError, match="--model real needs --model-dir"):
        run_proof(acceptance_options(site(), tmp_path / "out2", model="real"), lambda m: None)


def test_reports_name_real_weights_where_they_ran_and_the_dummy_shape_elsewhere(site: Any, tmp_path: Path) -> None:
    """Session 18's throughput on SmolLM2 said "8b shape": the shape names dummy weights only."""
    model = real_dir(tmp_path / "model")
    opts = acceptance_options(site(), tmp_path / "out", model="real", model_dir=model, min_envelope_ratio=0.0)
    opts = dataclasses.replace(opts, checks=("throughput",), throughput_levels=(1, 8), throughput_new_tokens=8)
    result = run_proof(opts, lambda m: None)
    assert result["throughput"][
        "shape"
    ] == "real" and "throughput: tok/s (real weights, 8 new tokens" in reports.summary(result)
    dummy = run_proof(dataclasses.replace(opts, model="dummy", model_dir=None, out=tmp_path / "out2"), lambda m: None)
    assert dummy["throughput"]["shape"] == "8b" and "(8b shape, " in reports.summary(dummy)  # the control


def test_throughput_with_the_drafts_own_acceptance_on_real_weights(site: Any, tmp_path: Path) -> None:
    """``--simulate-acc-len off``: no SGLANG_SIMULATE_ACC_LEN, and the acceptance length per level
    in the report and the summary (issue 15 asks it of always-on at C = 1 and 32)."""
    model = real_dir(tmp_path / "model")
    opts = acceptance_options(site(), tmp_path / "out", model="real", model_dir=model, min_envelope_ratio=0.0)
    opts = dataclasses.replace(
        opts, checks=("throughput",), throughput_levels=(1, 8), throughput_new_tokens=8, simulate_acc_len=None
    )
    result = run_proof(opts, lambda m: None)
    tput = result["throughput"]
    assert tput["simulate_acc_len"] is None and all(s["name"].endswith("-own") for s in result["servers"])
    assert not any("SGLANG_SIMULATE_ACC_LEN" in s["env"] for s in result["servers"])
    assert tput["accept_length"]["always_on"] == [1.0, 1.0] and tput["accept_length"]["base"] == [
        None,
        None,
    ]  # the fake: 1 unsimulated
    summary = reports.summary(result)
    assert "the drafts' own acceptance)" in summary and "    always-on: C=1 1.00, C=8 1.00" in summary
    # The control: simulated, as before, and no acceptance lines.
    simulated = run_proof(dataclasses.replace(opts, simulate_acc_len=3.0, out=tmp_path / "out2"), lambda m: None)
    assert all(s["env"]["SGLANG_SIMULATE_ACC_LEN"] == "3" for s in simulated["servers"])
    assert "acceptance length, accepted + 1" not in reports.summary(simulated)


def test_the_drafts_own_acceptance_needs_real_weights(site: Any, tmp_path: Path) -> None:
    import pytest

    from patcher.proof.command import AcceptanceLength
    from patcher.proof.errors import ProofUsageError

    opts = dataclasses.replace(
        acceptance_options(site(), tmp_path / "out"), checks=("throughput",), simulate_acc_len=None
    )
    with pytest.raises(ProofUsageError, match="--simulate-acc-len off needs --model real"):
        run_proof(opts, lambda m: None)
    assert not (tmp_path / "out").exists()
    length = AcceptanceLength()
    assert (length.convert("off", None, None), length.convert("2.5", None, None)) == (None, 2.5)
    with pytest.raises(Exception, match="at least 1"):
        length.convert("0.5", None, None)
