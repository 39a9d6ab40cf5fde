"""The session-4 and session-5 H200 numbers in docs/proof, recomputed from the recordings and logs committed there.

If the comparison or the per-step analysis changes, these say whether the published numbers still
follow from the evidence.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import re
import statistics
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from patcher.proof import acceptance, combine, exactkv, features, logscan, metrics, steps
from patcher.proof.acceptance import proposals_apart
from patcher.proof.command import DEFAULTS
from patcher.proof.mixed import swings
from patcher.proof.pools import (
    EIGHT_B_PLAIN_MIB,
    EIGHT_B_SLOT_KIB,
    EIGHT_B_SPECULATIVE_MIB,
    eight_b_pool_tokens,
    shared_gpu_8b_servers,
)
from patcher.proof.report import envelope_ratio, switch_point
from patcher.proof.run import ORDER_GROUPS, ProofOptions, eight_b_slots_needed
from patches.runtime import dynspec_auto
from patches.runtime import dynspec_v2 as v2

PROOF = Path(__file__).resolve().parents[2] / "docs" / "proof"
KV = PROOF / "0.5.17-v2-s4-kv"
FULL = PROOF / "0.5.17-v2-s4-full"


def members(archive: Path, *names: str) -> dict[str, str]:
    with tarfile.open(archive) as tar:
        by_name = {Path(m.name).name: m for m in tar.getmembers()}
        out = {}
        for name in names:
            f = tar.extractfile(by_name[name])
            assert f is not None
            out[name] = io.TextIOWrapper(f, encoding="utf-8", errors="replace").read()
        return out


def report_of(evidence: Path, env: dict[str, str], revisions: dict[str, int]) -> dict:
    """A run's report, once it names the dynspec environment and the revisions the run is said to have had."""
    report = json.loads((evidence / "report.json").read_text())
    assert report["dynspec_env"] == env
    assert {k: report["dynspec_revisions"][k] for k in revisions} == revisions
    return report


def recordings() -> dict[str, exactkv.Recording]:
    files = members(
        KV / "logs.tar.xz", "drafts-dynspec.jsonl", "drafts-dynspec-full.jsonl", "drafts-dynspec-skip.jsonl"
    )
    return {
        "kv": exactkv.parse(files["drafts-dynspec.jsonl"].splitlines()),
        "full": exactkv.parse(files["drafts-dynspec-full.jsonl"].splitlines()),
        "skip": exactkv.parse(files["drafts-dynspec-skip.jsonl"].splitlines()),
    }


def test_the_kv_only_extend_drafted_what_the_full_extend_drafted() -> None:
    recs = recordings()
    digests = {name: ["same"] for name in recs}
    entry = exactkv.judge(recs, digests, 100, [])
    assert entry["passed"] and entry["problems"] == []
    assert (entry["compared_requests"], entry["compared_steps"], entry["mismatches"]) == (16, 1074, 0)
    assert (entry["control_differs"], entry["control_compared_steps"], entry["control_mismatches"]) == (True, 1088, 32)
    published = json.loads((KV / "report.json").read_text())["exact_kv"]
    assert {k: published[k] for k in ("passed", "compared_requests", "compared_steps", "control_differs")} == {
        k: entry[k] for k in ("passed", "compared_requests", "compared_steps", "control_differs")
    }


def test_the_control_recording_fails_in_the_place_of_the_kv_one() -> None:
    """Negative control: the same judge, given skip's recording as the candidate, finds the holes."""
    recs = recordings()
    entry = exactkv.judge({"kv": recs["skip"], "full": recs["full"], "skip": recs["skip"]}, {}, 100, [])
    assert not entry["passed"] and entry["mismatches"] == 32


def test_the_per_step_ratios_of_both_extends() -> None:
    base = members(FULL / "throughput" / "logs.tar.xz", "base-sim.log")["base-sim.log"]
    full = members(FULL / "throughput" / "logs.tar.xz", "dynspec-sim.log")["dynspec-sim.log"]
    kv = members(KV.parent / "0.5.17-v2-s4-kv-throughput" / "logs.tar.xz", "dynspec-sim.log")["dynspec-sim.log"]
    ratios = steps.per_step({"base": base, "full": full, "kv": kv}, "base", [64, 128])
    assert {c: r["median"] for c, r in ratios["full"].items()} == {"64": 0.863, "128": 0.867}
    assert {c: r["median"] for c, r in ratios["kv"].items()} == {"64": 0.91, "128": 0.97}


# -- session 5 (runtime r5 / v2 module r8 at 3f71e57): the KV-only extend from a CUDA graph -------

S5 = {  # evidence dir: (compared requests, steps, control steps, control mismatches)
    "0.5.17-v2-s5-kv-graph": (16, 1050, 1050, 32),  # kv-graph, the twin graph captured
    "0.5.12-v2-s5-kv": (16, 1074, 1076, 27),  # v2 0.5.4 - 0.5.13 have no one-token graph: eager
}


@pytest.mark.parametrize("evidence", sorted(S5))
def test_session_5_kv_only_extends_drafted_what_the_full_extend_drafted(evidence: str) -> None:
    files = members(
        PROOF / evidence / "logs.tar.xz", *(f"drafts-{s}.jsonl" for s in ("dynspec", "dynspec-full", "dynspec-skip"))
    )
    recs = {
        name: exactkv.parse(files[f"drafts-{server}.jsonl"].splitlines())
        for name, server in (("kv", "dynspec"), ("full", "dynspec-full"), ("skip", "dynspec-skip"))
    }
    entry = exactkv.judge(recs, {name: ["same"] for name in recs}, 100, [])
    requests, compared, control_compared, control_mismatches = S5[evidence]
    assert entry["passed"] and (entry["compared_requests"], entry["compared_steps"], entry["mismatches"]) == (
        requests,
        compared,
        0,
    )
    assert (entry["control_compared_steps"], entry["control_mismatches"]) == (control_compared, control_mismatches)
    published = json.loads((PROOF / evidence / "report.json").read_text())["exact_kv"]
    assert {k: published[k] for k in ("passed", "compared_requests", "compared_steps", "control_differs")} == {
        k: entry[k] for k in ("passed", "compared_requests", "compared_steps", "control_differs")
    }
    # Negative control: skip's recording in the candidate's place fails the same judge.
    assert not exactkv.judge({"kv": recs["skip"], "full": recs["full"], "skip": recs["skip"]}, {}, 100, [])["passed"]


def test_session_5_the_graph_was_what_ran() -> None:
    report = json.loads((PROOF / "0.5.17-v2-s5-kv-graph" / "report.json").read_text())
    assert report["exact_kv"]["kv_only_extend"] == "from a CUDA graph"
    tput = members(PROOF / "0.5.17-v2-s5-kv-graph-throughput" / "logs.tar.xz", "dynspec-sim.log")["dynspec-sim.log"]
    assert "dynspec: KV-only draft-extend CUDA graph captured" in tput


def test_session_5_per_step_ratio_of_the_kv_only_graph() -> None:
    logs = members(PROOF / "0.5.17-v2-s5-kv-graph-throughput" / "logs.tar.xz", "base-sim.log", "dynspec-sim.log")
    ratios = steps.per_step({"base": logs["base-sim.log"], "graph": logs["dynspec-sim.log"]}, "base", [64, 128])
    assert {c: r["median"] for c, r in ratios["graph"].items()} == {"64": 0.961, "128": 0.973}
    published = json.loads((PROOF / "0.5.17-v2-s5-kv-graph-throughput" / "report.json").read_text())["mixed_load"]
    assert (published["passed"], published["dynspec_over_oracle"]) == (False, 1.0422)
    assert published["seconds"]["dynspec"] < min(published["seconds"]["base"], published["seconds"]["always_on"])


# -- session 6 (runtime r6 / v2 module r10 at ba1511b, DYNSPEC_DRAFT_KV=kv-direct) ------------------

S6 = PROOF / "0.5.17-v2-s6-kv-direct"
S6_TPUT = PROOF / "0.5.17-v2-s6-kv-direct-throughput"
S6_32K = PROOF / "0.5.17-v2-s6-kv-direct-32k"


def test_session_6_the_direct_write_drafted_what_the_full_extend_drafted() -> None:
    files = members(S6 / "logs.tar.xz", *(f"drafts-{s}.jsonl" for s in ("dynspec", "dynspec-full", "dynspec-skip")))
    recs = {
        name: exactkv.parse(files[f"drafts-{server}.jsonl"].splitlines())
        for name, server in (("kv", "dynspec"), ("full", "dynspec-full"), ("skip", "dynspec-skip"))
    }
    entry = exactkv.judge(recs, {name: ["same"] for name in recs}, 100, [])
    assert entry["passed"] and (entry["compared_requests"], entry["compared_steps"], entry["mismatches"]) == (
        16,
        1052,
        0,
    )
    assert (entry["control_compared_steps"], entry["control_mismatches"]) == (1052, 32)
    assert not exactkv.judge({"kv": recs["skip"], "full": recs["full"], "skip": recs["skip"]}, {}, 100, [])["passed"]
    report = json.loads((S6 / "report.json").read_text())
    assert report["exact_kv"]["kv_only_extend"] == "from a CUDA graph, replayed directly"


@pytest.mark.parametrize("evidence", [S6_TPUT, S6_32K], ids=["128k-draft-vocabulary", "32k-draft-vocabulary"])
def test_session_6_the_direct_write_ran_and_its_per_step_ratio(evidence: Path) -> None:
    logs = members(evidence / "logs.tar.xz", "base-sim.log", "dynspec-sim.log")
    assert "(from a CUDA graph, replayed directly)" in logs["dynspec-sim.log"]
    assert "kv-direct left a batch" not in logs["dynspec-sim.log"]  # every fallback batch went direct
    ratios = steps.per_step({"base": logs["base-sim.log"], "direct": logs["dynspec-sim.log"]}, "base", [64, 128])
    expected = {S6_TPUT: {"64": 0.971, "128": 0.99}, S6_32K: {"64": 0.973, "128": 0.99}}[evidence]
    assert {c: r["median"] for c, r in ratios["direct"].items()} == expected
    published = json.loads((evidence / "report.json").read_text())["throughput"]["per_step"]["dynspec"]
    assert {c: r["median"] for c, r in published.items()} == expected


def test_session_6_mixed_load_passes_within_the_margin() -> None:
    published = json.loads((S6_TPUT / "report.json").read_text())["mixed_load"]
    assert (published["passed"], published["dynspec_over_oracle"]) == (True, 1.0196)
    seconds = published["seconds"]
    assert seconds["dynspec"] < min(seconds["base"], seconds["always_on"])
    assert seconds["dynspec"] <= 1.03 * published["oracle_seconds"]


# -- session 7 (runtime r10 / v2 module r14 at d4efb72, `auto`; scripts/h200-runs.sh diag and prof) ----

S7_DIAG_17 = PROOF / "0.5.17-v2-s7-diag"
S7_DIAG_12 = PROOF / "0.5.12-v2-s7-diag"


def gz_logs(directory: Path) -> dict[str, str]:
    return {p.name[: -len(".log.gz")]: gzip.open(p, "rt", errors="replace").read() for p in directory.glob("*.log.gz")}


def ratio_against_itself(log: str, level: int = 64) -> float:
    """A server's per-step ratio at ``level`` against its own log: 1 for the negative controls."""
    return float(steps.per_step({"base": log, "same": log}, "base", [level])["same"][str(level)]["median"])


def published_per_step(
    evidence: Path, tput: dict, published: dict, control: str = "base-sim.log", *others: str
) -> tuple[dict[str, str], dict]:
    """dynspec's per-step ratios against base at 64 and 128 requests, read again from the run's logs, are
    the report's and the published (median, pairs); the control log against itself reads 1 (negative
    control). The logs (base's, dynspec's and ``others``) and the ratios."""
    logs = members(evidence / "logs.tar.xz", "base-sim.log", *others, "dynspec-sim.log")
    ratios = steps.per_step({"base": logs["base-sim.log"], "dynspec": logs["dynspec-sim.log"]}, "base", [64, 128])
    assert tput["per_step"] == ratios
    assert {c: (r["median"], r["pairs"]) for c, r in ratios["dynspec"].items()} == published
    assert ratio_against_itself(logs[control], min(map(int, published))) == 1.0  # negative control
    return logs, ratios


@pytest.mark.parametrize(
    ("evidence", "expected"),
    [
        (S7_DIAG_17, {"dyn-sim": (0.975, 0.987), "dyn-nosim": (0.972, 0.976), "skip-nosim": (0.978, 0.983)}),
        (S7_DIAG_12, {"direct": (0.974, 0.975)}),
    ],
    ids=["0.5.17", "0.5.12"],
)
def test_session_7_per_step_ratios_at_64_and_100_follow_from_the_logs(
    evidence: Path, expected: dict[str, tuple[float, float]]
) -> None:
    logs = gz_logs(evidence)
    at_100 = steps.per_step(logs, "base", [64, 100])
    assert {name: (r["64"]["median"], r["100"]["median"]) for name, r in at_100.items()} == expected
    ratios = steps.per_step(logs, "base", [64, 128])
    assert json.loads((evidence / "per_step.json").read_text()) == ratios
    # The kit client holds at most 100 requests in flight (aiohttp's connector limit): no step at 128.
    assert all("128" not in r for r in ratios.values())
    # Negative control: a server whose steps are the base's own has ratio 1, not the published one.
    assert ratio_against_itself(logs["base"]) == 1.0


def test_session_7_the_write_under_test_was_the_direct_one() -> None:
    for evidence, names in ((S7_DIAG_17, ("dyn-sim", "dyn-nosim")), (S7_DIAG_12, ("direct",))):
        logs = gz_logs(evidence)
        for name in names:
            assert "(from a CUDA graph, replayed directly)" in logs[name], name
            assert "kv-direct left a batch" not in logs[name], name
    assert "draft extend while off (negative control)" in gz_logs(S7_DIAG_17)["skip-nosim"]
    assert "v2 fallback ready" in gz_logs(S7_DIAG_12)["direct"]  # 0.5.12: dynspec's own fallback


# -- session 8 (v2 module r15 at 03f32ee: the lean zero-step verify; runtime r10) ---------------------

S8_DIAG_17 = PROOF / "0.5.17-v2-s8-lean-diag"
S8_KV = {"0.5.17": PROOF / "0.5.17-v2-s8-kv-direct", "0.5.12": PROOF / "0.5.12-v2-s8-kv-direct"}


def diag_logs_with_medians(evidence: Path, published: dict[str, tuple[float, float]]) -> dict[str, str]:
    """A ``diag`` call's server logs, once its per-step ratios at 64 and 100, recomputed from them,
    are its per_step.json and have the published medians."""
    logs = gz_logs(evidence)
    ratios = steps.per_step(logs, "base", [64, 100])
    assert json.loads((evidence / "per_step.json").read_text()) == ratios
    assert {name: (r["64"]["median"], r["100"]["median"]) for name, r in ratios.items()} == published
    return logs


def test_session_8_per_step_ratios_with_and_without_the_lean_verify_follow_from_the_logs() -> None:
    published = {"lean-sim": (0.968, 0.984), "stock-sim": (0.966, 0.97), "lean-nosim": (0.975, 0.978)}
    logs = diag_logs_with_medians(S8_DIAG_17, published)
    # Which verify ran: the lean one announced itself and took batches; DYNSPEC_LEAN_VERIFY=0 kept the stock one.
    for name in ("lean-sim", "lean-nosim"):
        assert "the lean zero-step verify took its first batch" in logs[name], name
    assert "zero-step verify samples greedy batches" not in logs["stock-sim"]
    assert all("(from a CUDA graph, replayed directly)" in logs[n] for n in published)
    # Negative control: the stock server measured against itself is 1, not its published ratio.
    assert ratio_against_itself(logs["stock-sim"]) == 1.0


def kv_proof_recordings(evidence: Path) -> tuple[dict[str, exactkv.Recording], dict[str, str]]:
    """A kv-proof's three recordings (the write under test, the full extend, the no-write control)
    by role, and the archive's files they came with (recordings and server logs)."""
    names = ("dynspec", "dynspec-full", "dynspec-skip")
    files = members(evidence / "logs.tar.xz", *(f"drafts-{s}.jsonl" for s in names), *(f"{s}.log" for s in names))
    recs = {k: exactkv.parse(files[f"drafts-{s}.jsonl"].splitlines()) for k, s in zip(("kv", "full", "skip"), names)}
    return recs, files


COUNTS = ("compared_requests", "compared_steps", "control_differs")


def passed_kv_proof(evidence: Path) -> tuple[dict, dict[str, str], dict]:
    """A passing kv-proof's report, archive files and exact_kv counts, once its exact_kv verdict,
    recomputed from the recordings, passes with the published counts, equivalence and >= 100
    crossings passed, and the control's recording as the candidate fails (negative control)."""
    recs, files = kv_proof_recordings(evidence)
    entry = exactkv.judge(recs, {name: ["same"] for name in recs}, 100, [])
    report = json.loads((evidence / "report.json").read_text())
    published = report["exact_kv"]
    assert entry["passed"] and published["passed"]
    assert {k: published[k] for k in COUNTS} == {k: entry[k] for k in COUNTS}
    assert report["equivalence"]["passed"] and report["crossings"]["passed"] and report["crossings"]["count"] >= 100
    assert not exactkv.judge({**recs, "kv": recs["skip"]}, {n: ["same"] for n in recs}, 100, [])["passed"]
    return report, files, {k: entry[k] for k in COUNTS}


@pytest.mark.parametrize("version", sorted(S8_KV))
def test_session_8_exact_kv_of_the_direct_write_follows_from_the_recordings(version: str) -> None:
    report, files, _ = passed_kv_proof(S8_KV[version])
    assert report["exact_kv"]["kv_only_extend"] == "from a CUDA graph, replayed directly"
    # The reference is the fallback as it was: full extend and (0.5.14+) the stock verify.
    env = {s["name"]: s["env"] for s in report["servers"]}
    assert env["dynspec"]["DYNSPEC_DRAFT_KV"] == "kv-direct" and env["dynspec-full"]["DYNSPEC_LEAN_VERIFY"] == "0"
    if version == "0.5.17":
        assert "the lean zero-step verify took its first batch" in files["dynspec.log"]
        assert "zero-step verify samples greedy batches" not in files["dynspec-full.log"]


# -- session 9 (v2 module r16 at b0dd79c: cached stand-ins, DYNSPEC_KV_BATCH; runtime r10) -----------

S9_DIAG_17 = PROOF / "0.5.17-v2-s9-kv-batch-diag"
S9_KV = PROOF / "0.5.17-v2-s9-kv-direct"  # DYNSPEC_KV_BATCH unset: one iteration per replay
S9_KV_BATCH8 = PROOF / "0.5.17-v2-s9-kv-batch8"  # DYNSPEC_KV_BATCH=8: exact_kv failed


def test_session_9_batched_kv_writes_per_step_ratios_follow_from_the_logs() -> None:
    published = {"batch4": (0.978, 0.993), "auto": (0.969, 0.986), "batch8": (0.979, 0.996)}
    logs = diag_logs_with_medians(S9_DIAG_17, published)
    # What each server ran: the batched ones said how many iterations a replay writes, auto did not batch.
    assert "writes the draft KV of up to 4 fallback iterations" in logs["batch4"]
    assert "writes the draft KV of up to 8 fallback iterations" in logs["batch8"]
    assert "fallback iterations per replay" not in logs["auto"]
    assert all("(from a CUDA graph, replayed directly)" in logs[n] for n in published)
    # Negative control: the base against itself is 1, not a published ratio.
    assert ratio_against_itself(logs["base"]) == 1.0


def test_session_9_r16_without_batching_kept_the_draft_kv_exact() -> None:
    report, files, counts = passed_kv_proof(S9_KV)
    assert report["dynspec_env"] == {}
    assert counts == {"compared_requests": 16, "compared_steps": 1082, "control_differs": True}
    assert "fallback iterations per replay" not in files["dynspec.log"]


def test_session_9_eight_iterations_per_replay_changed_two_proposals() -> None:
    """The failure stays on record: the same judge, on the same recordings, finds the same two."""
    recs, files = kv_proof_recordings(S9_KV_BATCH8)
    entry = exactkv.judge(recs, {name: ["same"] for name in recs}, 100, [])
    report = json.loads((S9_KV_BATCH8 / "report.json").read_text())
    assert report["dynspec_env"] == {"DYNSPEC_KV_BATCH": "8"}
    assert "writes the draft KV of up to 8 fallback iterations" in files["dynspec.log"]
    assert not entry["passed"] and not report["exact_kv"]["passed"]
    assert entry["mismatches"] == report["exact_kv"]["mismatches"] == 2
    assert report["equivalence"]["passed"] and report["crossings"]["passed"]
    # Control: the full extend's recording in the place of the batched one passes.
    assert exactkv.judge({**recs, "kv": recs["full"]}, {n: ["same"] for n in recs}, 100, [])["passed"]


# -- session 10 (runtime r11 / v2 module r17 at 393d631: the start-up rounding check; DYNSPEC_KV_BATCH=4) ----

S10_KV = PROOF / "0.5.17-v2-s10-kv-batch4"
S10_TPUT = PROOF / "0.5.17-v2-s10-kv-batch4-throughput"
S10_REVISIONS = {
    "speculative_dynspec_runtime": 11,
    "speculative_dynspec_v2": 17,
    "eagle_worker_v2_dynspec_zero_step": 2,
}


def startup_rounding_groups(log: str) -> str:
    """The groups the start-up rounding check logged (``1-6:0 | 7:1 | ...``)."""
    marker = "that round alike, checked at start-up: "
    line = next(line for line in log.splitlines() if marker in line)
    return line.split(marker, 1)[1].rstrip(")")


def logged_rounding(groups: str, log: str, kind: type[v2.DirectKVWrite] = v2.DirectKVWrite) -> v2.DirectKVWrite:
    """A DirectKVWrite (or ``kind``) holding only the captured sizes of the ready line and the logged
    numbers (4 rows per graph request), on which the runtime's own rules run unchanged."""
    sizes = json.loads(re.search(r"CUDA graphs for batch sizes (\[[0-9, ]+\])", log).group(1))
    number = {}
    for run in groups.split(" | "):
        span, n = run.split(":")
        first, _, last = span.partition("-")
        for size in sizes:
            if int(first) <= size <= int(last or first):
                number[size] = int(n)
    direct = kind.__new__(kind)  # no twin graph: only what the rules read
    direct.sizes, direct.width, direct.rounding = sizes, 4, [number[size] for size in sizes]
    return direct


def test_session_10_the_checked_batched_write_kept_the_draft_kv_exact() -> None:
    report, files, counts = passed_kv_proof(S10_KV)
    assert report["dynspec_env"] == {"DYNSPEC_KV_BATCH": "4"}
    assert {k: report["dynspec_revisions"][k] for k in S10_REVISIONS} == S10_REVISIONS
    assert counts == {"compared_requests": 16, "compared_steps": 1026, "control_differs": True}
    assert "writes the draft KV of up to 4 fallback iterations" in files["dynspec.log"]
    groups = startup_rounding_groups(files["dynspec.log"])
    assert groups == "1-6:0 | 7:1 | 8-12:0 | 14-28:1 | 30:2 | 32:3 | 40:4 | 44-48:2 | 52:3 | 56-128:2"
    # Where this load could batch at all: off batches of 9 - 12 requests (two iterations), not 13 - 18.
    direct = logged_rounding(groups, files["dynspec.log"])
    assert [r for r in range(9, 19) if direct.same_rounding_rows(r) >= 2 * r] == [9, 10, 11, 12]


def test_session_10_the_rounding_check_left_batching_no_room_at_the_throughput_loads() -> None:
    """At the 8B shape the graph of 64 requests rounds alone and 128's graph with nothing above it,
    so 4 iterations per replay wrote one iteration per replay there: the per-step ratio is auto's."""
    logs = members(S10_TPUT / "logs.tar.xz", "base-sim.log", "dynspec-sim.log")
    groups = startup_rounding_groups(logs["dynspec-sim.log"])
    assert groups == (
        "1-2:0 | 3:1 | 4:2 | 5:1 | 6:2 | 7:1 | 8-14:2 | 16:0 | 18:1 | 20:2 | 22:1 | 24:2 | 26-44:1 | 48:3 | 52-72:1 | 80-128:3"
    )
    # The runtime's own rule on the logged numbers: no fallback batch (33 - 128 requests) has room for two.
    direct = logged_rounding(groups, logs["dynspec-sim.log"])
    assert [r for r in range(33, 129) if direct.same_rounding_rows(r) >= 2 * r] == []
    assert direct.same_rounding_rows(64) == 64 and direct.same_rounding_rows(128) == 176
    assert direct.same_rounding_rows(4) == 8  # control: at 4 requests two iterations would fit
    ratios = steps.per_step({"base": logs["base-sim.log"], "dynspec": logs["dynspec-sim.log"]}, "base", [64, 128])
    report = json.loads((S10_TPUT / "report.json").read_text())
    assert report["throughput"]["per_step"] == ratios
    assert {c: r["median"] for c, r in ratios["dynspec"].items()} == {"64": 0.975, "128": 0.992}
    # Negative control: the base against itself is 1, not the published ratio.
    assert ratio_against_itself(logs["base-sim.log"]) == 1.0


def test_session_10_throughput_and_mixed_load_pass() -> None:
    report = json.loads((S10_TPUT / "report.json").read_text())
    assert {k: report["dynspec_revisions"][k] for k in S10_REVISIONS} == S10_REVISIONS
    tput = report["throughput"]
    envelope = [d / max(b, a) for d, b, a in zip(tput["dynspec"], tput["base"], tput["always_on"])]
    assert [round(r, 4) for r in envelope] == tput["envelope_ratio"]
    assert min(envelope) >= 0.97 and tput["passed"]
    mixed = report["mixed_load"]
    seconds = mixed["seconds"]
    assert seconds == {k: sorted(v)[1] for k, v in mixed["samples"].items()}  # medians of 3
    assert seconds["dynspec"] < min(seconds["base"], seconds["always_on"])
    assert mixed["passed"] and seconds["dynspec"] <= 1.03 * mixed["oracle_seconds"]
    # Negative control: the same judgement on always-on's time fails the margin.
    assert not seconds["always_on"] <= 1.03 * mixed["oracle_seconds"]


# -- session 11 (runtime r11 / v2 module r17 at 7269b14, DYNSPEC_DRAFT_KV=kv-direct) ---------------------

S11_KV_13 = PROOF / "0.5.13-v2-s11-kv-direct"
S11_KV_V1 = PROOF / "0.5.12-v1-s11-kv-direct"
S11_TPUT_12 = PROOF / "0.5.12-v2-s11-kv-direct-throughput"
S11_REVISIONS = {"speculative_dynspec_runtime": 11, "speculative_dynspec_v2": 17}


def test_session_11_the_own_fallbacks_direct_write_kept_the_draft_kv_exact_on_0_5_13() -> None:
    report, files, counts = passed_kv_proof(S11_KV_13)
    assert report["dynspec_env"] == {"DYNSPEC_DRAFT_KV": "kv-direct"}
    assert {k: report["dynspec_revisions"][k] for k in S11_REVISIONS} == S11_REVISIONS
    assert counts == {"compared_requests": 16, "compared_steps": 1058, "control_differs": True}
    assert "v2 fallback ready" in files["dynspec.log"]  # 0.5.13: dynspec's own fallback, not the zero-step state
    assert report["exact_kv"]["kv_only_extend"] == "from a CUDA graph, replayed directly"
    assert "kv-direct left a batch" not in files["dynspec.log"]


def test_session_11_v1s_direct_write_changed_exactly_the_proposals_the_control_changed() -> None:
    """v1 (0.5.12): 3 of 1038 proposals differ from the full extend's, at the positions where the
    no-write control differs too, and nowhere else: on v1 this load's control has almost no teeth."""
    recs, files = kv_proof_recordings(S11_KV_V1)
    report = v1_kv_direct_report(S11_KV_V1, S11_REVISIONS)
    assert report["equivalence"]["passed"] and report["crossings"]["passed"] and report["crossings"]["count"] >= 100
    entry = exactkv.judge(recs, {name: ["same"] for name in recs}, 100, [])
    assert not entry["passed"] and not report["exact_kv"]["passed"]
    assert (entry["mismatches"], entry["control_mismatches"], entry["compared_steps"]) == (3, 3, 1038)
    where = {(m["rid"], m["pos"]) for m in exactkv.compare(recs["full"], recs["kv"]).mismatches}
    assert where == {(m["rid"], m["pos"]) for m in exactkv.compare(recs["full"], recs["skip"]).mismatches}
    assert where == {("dynspec-record-1-join-200033", p) for p in (154, 156, 158)}
    assert "(from a CUDA graph, replayed directly)" in files["dynspec.log"]
    assert "kv-direct left a batch" not in files["dynspec.log"]
    # Negative control: on 0.5.13 the same comparison leaves the write under test no mismatch
    # where the control has 32, so "the write's mismatches are the control's" is not a given.
    recs_13, _ = kv_proof_recordings(S11_KV_13)
    assert not exactkv.compare(recs_13["full"], recs_13["kv"]).mismatches
    assert len(exactkv.compare(recs_13["full"], recs_13["skip"]).mismatches) == 32


def test_session_11_the_own_fallbacks_throughput_and_mixed_load_on_0_5_12() -> None:
    report = report_of(S11_TPUT_12, {"DYNSPEC_DRAFT_KV": "kv-direct"}, S11_REVISIONS)
    tput = report["throughput"]
    medians = {k: [sorted(s)[1] for s in tput["samples"][k]] for k in ("base", "always_on", "dynspec")}
    assert medians == {k: tput[k] for k in medians}
    envelope = [d / max(b, a) for d, b, a in zip(tput["dynspec"], tput["base"], tput["always_on"])]
    assert [round(r, 2) for r in envelope] == [1.01, 1.04, 0.99, 0.99, 0.94, 0.97]  # the issue's 0.97: missed at 64
    logs = members(S11_TPUT_12 / "logs.tar.xz", "base-sim.log", "dynspec-sim.log")
    ratios = steps.per_step({"base": logs["base-sim.log"], "dynspec": logs["dynspec-sim.log"]}, "base", [64, 128])
    assert tput["per_step"] == ratios
    assert {c: r["median"] for c, r in ratios["dynspec"].items()} == {"64": 0.973, "128": 0.991}
    assert ratio_against_itself(logs["base-sim.log"]) == 1.0  # negative control
    mixed = report["mixed_load"]
    seconds = mixed["seconds"]
    assert seconds == {k: sorted(v)[1] for k, v in mixed["samples"].items()}  # medians of 3
    assert seconds["dynspec"] < min(seconds["base"], seconds["always_on"])  # faster than either static server
    assert not mixed["passed"] and round(seconds["dynspec"] / mixed["oracle_seconds"], 3) == 1.040


def test_session_11_v1s_new_rule_on_the_rounding_groups_session_10_measured() -> None:
    """r18's StockGraphDirectWrite on the graphs session 10's start-up check numbered (0.5.17's twin:
    the same runner and GEMM shapes; 0.5.12's own groups have not been logged): on the small shape,
    exact_kv's off batches of 16 - 18 requests packed into graphs 4 - 5, which round apart from the
    stock graphs 16 - 18, and now replay graph 7; on the 8B shape 64 requests replay graph 18 and 128
    graph 48, about the packed graphs' 16 and 32."""
    logs = {"small": members(S10_KV / "logs.tar.xz", "dynspec.log")["dynspec.log"]}
    logs["8b"] = members(S10_TPUT / "logs.tar.xz", "dynspec-sim.log")["dynspec-sim.log"]
    rules = {
        shape: logged_rounding(startup_rounding_groups(log), log, v2.StockGraphDirectWrite)
        for shape, log in logs.items()
    }
    chosen = {
        shape: {n: rule.sizes[rule.stock_alike(n)] for n in (16, 17, 18, 64, 128)} for shape, rule in rules.items()
    }
    assert chosen == {"small": {16: 7, 17: 7, 18: 7, 64: 30, 128: 44}, "8b": {16: 16, 17: 5, 18: 5, 64: 18, 128: 48}}
    small = rules["small"]
    assert all(small.rounding[small.stock_alike(n)] == small.rounding[small.stock_index(n)] for n in range(1, 129))
    # Negative control: r17's packing put those off batches into graphs that round apart from the stock ones.
    assert all(small.rounding[small._graph_for(n)] != small.rounding[small.stock_index(n)] for n in (16, 17, 18))


# -- session 12 (runtime r12 / v2 module r18 at 83455c4, DYNSPEC_DRAFT_KV=kv-direct) ---------------------

S12_KV_V1 = PROOF / "0.5.12-v1-s12-stock-graph-write"
S12_TPUT_V1 = PROOF / "0.5.12-v1-s12-kv-direct-throughput"
S12_TPUT_12 = PROOF / "0.5.12-v2-s12-every-iteration-throughput"
S12_REVISIONS = {"speculative_dynspec_runtime": 12, "speculative_dynspec_v2": 18}


def session_12_report(evidence: Path) -> dict:
    return report_of(evidence, {"DYNSPEC_DRAFT_KV": "kv-direct"}, S12_REVISIONS)


def test_session_12_v1s_stock_graph_write_differs_only_where_the_timelines_parted() -> None:
    """v1 (0.5.12), r18's StockGraphDirectWrite, 5 waves: 19 of 1866 proposals differ from the full
    extend's and 26 of the control's, and every one of both lies where the request had already run
    some iteration in another step or batch size than on the full-extend server (the joiners arrive
    by the clock). So this run neither convicts nor clears the write."""
    report = session_12_report(S12_KV_V1)
    assert report["path"] == "v1" and report["crossings"]["passed"] and report["crossings"]["count"] >= 100
    recs, files = kv_proof_recordings(S12_KV_V1)
    entry = exactkv.judge(recs, {name: ["same"] for name in recs}, 100, [])
    assert not entry["passed"] and not report["exact_kv"]["passed"]
    assert (entry["mismatches"], entry["compared_steps"], entry["control_mismatches"]) == (19, 1866, 26)
    assert (entry["mismatches_same_history"], entry["control_mismatches_same_history"]) == (0, 0)
    assert {m["rid"] for m in exactkv.compare(recs["full"], recs["kv"]).mismatches} == {
        "dynspec-record-1-join-200033",  # resumed at 75 here, at 82 on the full-extend server
        "dynspec-record-3-long-200055",  # fell back in batches of 16 here where the other had 18
    }
    assert exactkv.same_history(recs["full"], recs["kv"], "dynspec-record-1-join-200033", 74)
    assert not exactkv.same_history(recs["full"], recs["kv"], "dynspec-record-1-join-200033", 75)
    # Negative control: the classification is not vacuous; some compared positions share their history.
    alike = [
        (rid, p)
        for rid, first in recs["full"].first_off.items()
        for p in recs["kv"].drafts.get(rid, {}).keys() & recs["full"].drafts.get(rid, {}).keys()
        if p > first and exactkv.same_history(recs["full"], recs["kv"], rid, p)
    ]
    assert len(alike) == 252
    assert "replays, for n requests, the smallest KV-only graph that rounds as the stock" in files["dynspec.log"]
    assert "kv-direct left a batch" not in files["dynspec.log"]


def logged_tok_s(proof_txt: str, server: str) -> dict[int, float]:
    return {
        int(c): float(t)
        for c, t in re.findall(rf"{server} C=(\d+): \d+ tokens in [\d.]+ s = ([\d.]+) tok/s", proof_txt)
    }


def test_session_12_v1s_fallback_step_is_three_quarters_of_a_plain_one() -> None:
    """v1 throughput (stopped by the call's limit during the fourth server, so the report holds no
    throughput entry): at 64 and 128 requests a fallback iteration ran at 0.78 / 0.74 of a plain
    decode step without overlap, as in session 2 before any KV-only write: v1 loses elsewhere."""
    report = session_12_report(S12_TPUT_V1)
    assert report["path"] == "v1" and "throughput" not in report
    text = (S12_TPUT_V1 / "proof.txt").read_text()
    tok_s = {s: logged_tok_s(text, s) for s in ("dynspec-sim", "always-on-sim", "base-no-overlap-sim")}
    assert tok_s["dynspec-sim"] == {1: 324.0, 4: 1220.0, 16: 3980.0, 32: 6362.0, 64: 7047.0, 128: 10821.0}
    best = [max(tok_s["always-on-sim"][c], tok_s["base-no-overlap-sim"][c]) for c in (1, 4, 16, 32, 64, 128)]
    envelope = [round(tok_s["dynspec-sim"][c] / b, 2) for c, b in zip((1, 4, 16, 32, 64, 128), best)]
    assert envelope == [0.94, 0.95, 1.04, 1.05, 0.76, 0.76]
    logs = members(S12_TPUT_V1 / "logs.tar.xz", "base-no-overlap-sim.log", "dynspec-sim.log")
    ratios = steps.per_step(
        {"base": logs["base-no-overlap-sim.log"], "dynspec": logs["dynspec-sim.log"]}, "base", [64, 128]
    )
    assert {c: r["median"] for c, r in ratios["dynspec"].items()} == {"64": 0.779, "128": 0.736}
    assert ratio_against_itself(logs["base-no-overlap-sim.log"]) == 1.0  # negative control


def test_session_12_the_own_fallback_logged_every_iteration() -> None:
    """0.5.12 v2 with --decode-log-interval 1 on every server: the steady iterations at 64 requests
    run at 0.97 of base's, as the 40-iteration intervals said; mixed_load 1.041 x the oracle."""
    report = session_12_report(S12_TPUT_12)
    tput = report["throughput"]
    envelope = [d / max(b, a) for d, b, a in zip(tput["dynspec"], tput["base"], tput["always_on"])]
    assert [round(r, 2) for r in envelope] == [0.98, 0.9, 0.96, 0.96, 0.95, 0.95]
    logs = members(S12_TPUT_12 / "logs.tar.xz", "base-sim.log", "dynspec-sim.log")
    assert "--decode-log-interval 1" in (S12_TPUT_12 / "proof.txt").read_text()
    ratios = steps.per_step({"base": logs["base-sim.log"], "dynspec": logs["dynspec-sim.log"]}, "base", [64, 128])
    assert {c: tput["per_step"]["dynspec"][c] for c in ("64", "128")} == ratios["dynspec"]
    assert {c: r["median"] for c, r in ratios["dynspec"].items()} == {"64": 0.973, "128": 0.994}
    assert ratio_against_itself(logs["base-sim.log"]) == 1.0  # negative control
    mixed = report["mixed_load"]
    assert not mixed["passed"] and round(mixed["seconds"]["dynspec"] / mixed["oracle_seconds"], 3) == 1.041
    assert mixed["seconds"]["dynspec"] < min(mixed["seconds"]["base"], mixed["seconds"]["always_on"])


# -- session 13 (runtime r13 / v2 module r19 at 5723dd0, DYNSPEC_DRAFT_KV=kv-direct) ---------------------

S13_BITS_V1 = PROOF / "0.5.12-v1-s13-kv-bits"
S13_PROFILE_V1 = PROOF / "0.5.12-v1-s13-fallback-profile"
S13_REVISIONS = {"speculative_dynspec_runtime": 13, "speculative_dynspec_v2": 19}


def test_session_13_v1s_stock_graph_write_is_bit_exact(tmp_path: Path) -> None:
    """v1 (0.5.12), --exact-kv-bits: in every one of 315 fallback iterations the full-extend server
    also wrote the rows directly and kept them; 0 of 5424 rows differ from the stock extend's bits,
    while the same rows packed into another graph differ in 4302 of 5396. Proposals differ at 36 of
    1794 positions, every one after the request's timeline parted (none where histories agree, of
    252 such positions), so the check passes on the bits."""
    report = report_of(S13_BITS_V1, {"DYNSPEC_DRAFT_KV": "kv-direct"}, S13_REVISIONS)
    assert report["path"] == "v1" and report["crossings"]["passed"] and report["crossings"]["count"] >= 100
    files = members(S13_BITS_V1 / "logs.tar.xz", "bits-dynspec-full.jsonl")
    (tmp_path / "bits.jsonl").write_text(files["bits-dynspec-full.jsonl"])
    bits = exactkv.read_bits(tmp_path / "bits.jsonl")
    assert bits is not None
    assert bits.entry() == report["exact_kv"]["bits"]
    assert (bits.iterations, bits.rows, bits.differing, bits.control_rows, bits.control_differing) == (
        315,
        5424,
        0,
        5396,
        4302,
    )
    recs, _ = kv_proof_recordings(S13_BITS_V1)
    entry = exactkv.judge(recs, report["exact_kv"]["digests"], 100, [], bits)
    assert entry["passed"] and report["exact_kv"]["passed"]
    assert (entry["mismatches_same_history"], entry["compared_steps_same_history"]) == (0, 252)
    # Negative control: the same proposals without the bits fail (the timelines parted), and bits
    # with one differing row fail too.
    assert not exactkv.judge(recs, report["exact_kv"]["digests"], 100, [])["passed"]
    bits.differing = 1
    assert not exactkv.judge(recs, report["exact_kv"]["digests"], 100, [], bits)["passed"]


def profile_totals(text: str) -> dict[str, float]:
    span = re.search(r"per step: span (\d+) us, busy (\d+) us, idle (\d+) us", text)
    calls = {name: float(n) for n, name in re.findall(r"^\s+[\d.]+ us x\s+([\d.]+)\s+(\w+)$", text, re.M)}
    assert span is not None
    return {
        "span": float(span[1]),
        "busy": float(span[2]),
        "launches": calls.get("cudaLaunchKernel", 0.0),
        "copies": calls.get("cudaMemcpyAsync", 0.0),
    }


def test_session_13_v1s_fallback_step_loses_its_time_on_the_host() -> None:
    """A torch profile of 64 requests, v1 (non-overlap) plain decode against a v1 fallback step: the
    GPU is busy alike (6.14 vs 6.21 ms a step), but the fallback step launches 51 kernels and makes
    11.6 host copies where a plain step makes 11 and 2, and its span is 11.2 ms against 8.4: the
    verify path's host work, which a lean fallback step would drop."""
    base = profile_totals((S13_PROFILE_V1 / "base-gpu.txt").read_text())
    dyn = profile_totals((S13_PROFILE_V1 / "dyn-gpu.txt").read_text())
    assert abs(dyn["busy"] / base["busy"] - 1) < 0.02
    assert dyn["span"] / base["span"] > 1.3
    assert (round(base["launches"]), round(dyn["launches"])) == (11, 51)
    assert (round(base["copies"]), round(dyn["copies"])) == (2, 12)
    # Negative control: the plain step's host leaves the GPU idle far less.
    assert base["span"] / base["busy"] < 1.4 < dyn["span"] / dyn["busy"]


# -- session 13, runtime r14 (v2 module r19) at 907f979: v1's lean fallback step ----------------------

S13_LEAN_PROOF = PROOF / "0.5.12-v1-s13-lean-proof"
S13_LEAN_TPUT = PROOF / "0.5.12-v1-s13-lean-throughput"
S13_LEAN_PROFILE = PROOF / "0.5.12-v1-s13-lean-profile"
S13_LEAN_REVISIONS = {"speculative_dynspec_runtime": 14, "speculative_dynspec_v2": 19}


def v1_kv_direct_report(evidence: Path, revisions: dict[str, int]) -> dict:
    """A v1 run's report with DYNSPEC_DRAFT_KV=kv-direct, once it names ``revisions``."""
    report = report_of(evidence, {"DYNSPEC_DRAFT_KV": "kv-direct"}, revisions)
    assert report["path"] == "v1"
    return report


def lean_report(evidence: Path) -> dict:
    return v1_kv_direct_report(evidence, S13_LEAN_REVISIONS)


def test_session_13_the_lean_step_serves_stock_tokens_across_100_crossings() -> None:
    """v1 (0.5.12) with the lean fallback step: greedy outputs token-identical to stock at 1 - 48
    requests and after the ramp, 100 crossings with 3250 requests answered; its start-up says it
    runs. exact_kv has no verdict: 20 of 1894 proposals differ, none where the request's timeline
    matched the full extend's, and none did match (the lean server runs faster, so the joiners
    arrive elsewhere), while the control differs at 32 positions where timelines matched."""
    report = lean_report(S13_LEAN_PROOF)
    assert report["equivalence"]["passed"] and report["crossings"]["passed"] and report["crossings"]["count"] == 100
    recs, files = kv_proof_recordings(S13_LEAN_PROOF)
    assert "runs as a plain decode step" in files["dynspec.log"]
    assert "runs as a plain decode step" not in files["dynspec-full.log"]  # the reference runs the stock verify
    entry = exactkv.judge(recs, report["exact_kv"]["digests"], 100, [])
    assert not entry["passed"] and not report["exact_kv"]["passed"]
    assert (entry["mismatches"], entry["compared_steps"], entry["mismatches_same_history"]) == (20, 1894, 0)
    assert (entry["compared_steps_same_history"], entry["control_mismatches_same_history"]) == (0, 32)
    assert entry["detail"].startswith("20 of 1894 proposals of 28 requests differ from the full extend's")


def test_session_13_the_lean_step_brings_v1_to_a_plain_step() -> None:
    """v1 throughput at 16 / 64 / 128 requests (TPUT_LEVELS): R against the better of non-overlap
    plain decode and always-on 0.99 / 0.97 / 1.11 (session 12, stock verify: 1.04 / 0.76 / 0.76);
    a fallback step 0.959 / 1.087 of a non-overlap plain step (0.779 / 0.736 before)."""
    report = lean_report(S13_LEAN_TPUT)
    tput = report["throughput"]
    assert tput["passed"] and tput["judged_against"] == "base_no_overlap" and tput["levels"] == [16, 64, 128]
    assert [round(r, 2) for r in tput["envelope_ratio_no_overlap"]] == [0.99, 0.97, 1.11]
    best = [max(b, a) for b, a in zip(tput["base_no_overlap"], tput["always_on"])]
    assert [round(d / b, 4) for d, b in zip(tput["dynspec"], best)] == tput["envelope_ratio_no_overlap"]
    logs = members(S13_LEAN_TPUT / "logs.tar.xz", "base-no-overlap-sim.log", "dynspec-sim.log")
    ratios = steps.per_step(
        {"base": logs["base-no-overlap-sim.log"], "dynspec": logs["dynspec-sim.log"]}, "base", [64, 128]
    )
    assert {c: r["median"] for c, r in ratios["dynspec"].items()} == {"64": 0.959, "128": 1.087}
    assert ratios["dynspec"] == tput["per_step_no_overlap"]["dynspec"]
    assert ratio_against_itself(logs["base-no-overlap-sim.log"]) == 1.0  # negative control


def test_session_13_the_lean_step_launches_and_copies_about_what_a_plain_step_does() -> None:
    """The same profile as the stock-verify one (64 requests, v1): 20 kernel launches and 6 host
    copies a step (51 and 12 before; plain decode 11 and 2), a span of 8.9 ms against plain
    decode's 8.4 (11.2 before), the GPU as busy."""
    lean = profile_totals((S13_LEAN_PROFILE / "dyn-gpu.txt").read_text())
    stock_verify = profile_totals((S13_PROFILE_V1 / "dyn-gpu.txt").read_text())
    plain = profile_totals((S13_PROFILE_V1 / "base-gpu.txt").read_text())
    assert (round(lean["launches"]), round(lean["copies"])) == (20, 6)
    assert round(plain["span"] / lean["span"], 2) == 0.94 and round(plain["span"] / stock_verify["span"], 2) == 0.75
    assert abs(lean["busy"] / plain["busy"] - 1) < 0.02


S13_R15_DIAG = PROOF / "0.5.12-v1-s13-r15-diag"


def test_session_13_r15s_lean_step_per_step_in_a_short_diag() -> None:
    """r15 (e451714: r14 plus the cached signature and the lean bit check, off here), v1, in the
    session's last 220 s: base and dynspec both without overlap, two client runs at 64 and 100
    requests: a fallback step 0.984 (64) and 0.948 (100) of a plain one, from 10 steady pairs each:
    too few to tell r15 from r14's 0.959 at 64."""
    logs = {}
    for name in ("base", "dyn-sim"):
        with gzip.open(S13_R15_DIAG / f"{name}.log.gz", "rt", errors="replace") as f:
            logs[name] = f.read()
        assert "disable_overlap_schedule=True" in logs[name]
    assert "runs as a plain decode step" in logs["dyn-sim"] and "dynspec:" not in logs["base"]
    ratios = steps.per_step(logs, "base", [64, 100])
    assert ratios == json.loads((S13_R15_DIAG / "per_step.json").read_text())
    assert {c: (r["median"], r["pairs"]) for c, r in ratios["dyn-sim"].items()} == {
        "64": (0.984, 10),
        "100": (0.948, 10),
    }
    assert ratio_against_itself(logs["base"]) == 1.0  # negative control


def admission_windows(log: str, concurrency: int) -> list[float]:
    """Per run at ``concurrency`` (every decode at that batch size), the milliseconds of its first
    ``Decode batch`` line with --decode-log-interval 1: the run's prefills and its first decode step."""
    windows, first, seen = [], None, False
    for line in log.splitlines():
        if "Prefill batch" in line and "#running-req: 0," in line:
            if first is not None and seen:
                windows.append(first)
            first, seen = None, True
            continue
        m = re.search(
            r"Decode batch, #running-req: (\d+),.*?(?:accept len: ([\d.]+),.*?)?gen throughput \(token/s\): ([\d.]+)",
            line,
        )
        if m and seen and first is None:
            first = int(m[1]) * float(m[2] or 1) / float(m[3]) * 1000 if int(m[1]) == concurrency else -1.0
    if first is not None and seen:
        windows.append(first)
    return [w for w in windows if w >= 0]


def test_session_12_the_own_fallbacks_admission_loss_is_the_speculative_servers_prefill() -> None:
    """Re-read in session 13: the ~30 ms per run at 64 requests that session 12 could not place sit in
    each run's admission window (its prefills and first decode step), and always-on pays it too: the
    speculative server's prefill (the draft model's prefill extend), not the fallback. Medians over the
    runs whose decode steps all held 64 (and 128) requests."""
    logs = members(S12_TPUT_12 / "logs.tar.xz", "base-sim.log", "always-on-sim.log", "dynspec-sim.log")
    medians = {
        name: [round(statistics.median(admission_windows(logs[f"{name}.log"], c))) for c in (64, 128)]
        for name in ("base-sim", "always-on-sim", "dynspec-sim")
    }
    assert medians == {"base-sim": [102, 173], "always-on-sim": [130, 213], "dynspec-sim": [132, 245]}
    # Negative control: a window read at a concurrency no run held is empty.
    assert admission_windows(logs["base-sim.log"], 96) == []


# -- session 14, runtime r15 / v2 module r20 at c13361c (DYNSPEC_DRAFT_KV=kv-direct) -------------------

S14_PROOF = PROOF / "0.5.12-v1-s14-r15-proof"
S14_BITS = PROOF / "0.5.12-v1-s14-r15-lean-bits"
S14_MIXED = PROOF / "0.5.12-v1-s14-r15-mixed"
S14_REVISIONS = {"speculative_dynspec_runtime": 15, "speculative_dynspec_v2": 20}


def r15_report(evidence: Path) -> dict:
    return v1_kv_direct_report(evidence, S14_REVISIONS)


def test_session_14_r15s_lean_step_serves_stock_tokens_across_100_crossings() -> None:
    """r15 on v1 (0.5.12): greedy outputs token-identical to stock at 1 - 48 requests and after the
    ramp, 100 crossings with 3250 requests answered, the lean step running. The proposals alone give
    no exact_kv verdict again: 12 of 1872 differ, none of the 252 where the request's timeline
    matched the full extend's, but the control too differs only where timelines parted (32 of
    1870), so it has no teeth there. The bit check below gives the verdict."""
    report = r15_report(S14_PROOF)
    assert report["equivalence"]["passed"] and report["crossings"]["passed"]
    assert (report["crossings"]["count"], report["crossings"]["requests"]) == (100, 3250)
    recs, files = kv_proof_recordings(S14_PROOF)
    assert "runs as a plain decode step" in files["dynspec.log"] and "replayed directly" in files["dynspec.log"]
    entry = exactkv.judge(recs, report["exact_kv"]["digests"], 100, [])
    assert not entry["passed"] and not report["exact_kv"]["passed"]
    assert (entry["mismatches"], entry["compared_steps"], entry["mismatches_same_history"]) == (12, 1872, 0)
    assert (
        entry["compared_steps_same_history"],
        entry["control_mismatches"],
        entry["control_mismatches_same_history"],
    ) == (252, 32, 0)


def test_session_14_the_lean_steps_draft_kv_is_bit_exact(tmp_path: Path) -> None:
    """--exact-kv-bits-on tested: in each of 1875 fallback iterations the lean server (r15, the KV
    written directly) also ran the stock extend and compared: 0 of 101352 rows differ from its bits,
    while the same rows packed into another graph differ in 82318 of 100484. Its proposals differ at
    54 of 1896 positions, every one after the request's timeline parted (0 of 252 where histories
    agree), so exact_kv passes on the bits for the lean step."""
    report = r15_report(S14_BITS)
    assert report["crossings"]["passed"] and report["crossings"]["count"] >= 100
    files = members(S14_BITS / "logs.tar.xz", "bits-dynspec.jsonl", "dynspec.log")
    assert "runs as a plain decode step" in files["dynspec.log"]
    (tmp_path / "bits.jsonl").write_text(files["bits-dynspec.jsonl"])
    bits = exactkv.read_bits(tmp_path / "bits.jsonl")
    assert bits is not None and {**bits.entry(), "server": "tested"} == report["exact_kv"]["bits"]
    assert (bits.iterations, bits.rows, bits.differing, bits.control_rows, bits.control_differing) == (
        1875,
        101352,
        0,
        100484,
        82318,
    )
    recs, _ = kv_proof_recordings(S14_BITS)
    entry = exactkv.judge(recs, report["exact_kv"]["digests"], 100, [], bits)
    assert entry["passed"] and report["exact_kv"]["passed"]
    assert (entry["mismatches"], entry["mismatches_same_history"], entry["compared_steps_same_history"]) == (54, 0, 252)
    # Negative controls: without the bits the timelines' differences fail; one differing row fails.
    assert not exactkv.judge(recs, report["exact_kv"]["digests"], 100, [])["passed"]
    bits.differing = 1
    assert not exactkv.judge(recs, report["exact_kv"]["digests"], 100, [], bits)["passed"]


def test_session_14_v1s_mixed_load_beats_both_static_servers() -> None:
    """v1's mixed load (medians of 3): dynspec 12.10 s, always-on 13.66, plain decode 12.94 with the
    overlap scheduler and 15.67 without. Against v1's own reference (non-overlap plain decode) it is
    0.970x the per-phase oracle and passes; against the overlap scheduler's plain decode, which v1
    cannot match at 64 and 128 requests, 1.082x and the check fails (session 3, stock verify: slower
    than always-on)."""
    mixed = r15_report(S14_MIXED)["mixed_load"]
    seconds = mixed["seconds"]
    assert seconds == {k: sorted(v)[1] for k, v in mixed["samples"].items()}  # medians of 3
    assert seconds == {"base": 12.943, "always_on": 13.665, "dynspec": 12.1}
    assert not mixed["passed"] and mixed["dynspec_over_oracle"] == 1.082
    assert round(sum(p["oracle_s"] for p in mixed["phases"]), 3) == mixed["oracle_seconds"]
    assert seconds["dynspec"] < min(seconds["base"], seconds["always_on"])
    no_overlap = mixed["no_overlap"]
    assert no_overlap["passed"] and no_overlap["dynspec_over_oracle"] == 0.9699
    assert no_overlap["seconds"]["base"] == 15.673
    # Negative control: always-on, judged as the candidate, is neither within 3 % nor faster than base.
    assert seconds["always_on"] > max(1.03 * mixed["oracle_seconds"], seconds["base"])


def test_session_14_v1s_speculative_steps_ran_faster_on_dynspec_than_on_always_on() -> None:
    """Noticed, not explained: with speculation on at 1, 4 and 16 requests, the dynspec server's decode
    lines show 11 - 12 % more tokens/s than the always-on server's (medians of its every-40-step
    lines), and its low phases are as much faster end to end. Both run the stock speculative step."""
    logs = members(S14_MIXED / "logs.tar.xz", "always-on-sim.log", "dynspec-sim.log")

    def median_rate(log: str, c: int) -> float:
        rates = re.findall(rf"#running-req: {c},.*?gen throughput \(token/s\): ([\d.]+)", log)
        return statistics.median(float(r) for r in rates)

    ratios = [
        round(median_rate(logs["dynspec-sim.log"], c) / median_rate(logs["always-on-sim.log"], c), 2)
        for c in (1, 4, 16)
    ]
    assert ratios == [1.11, 1.09, 1.12]
    assert median_rate(logs["always-on-sim.log"], 1) / median_rate(logs["always-on-sim.log"], 1) == 1.0  # control
    # Session 13's throughput run, the same lines at 16 requests: alike (4052 vs 4001), so always-on ran slow here.
    s13 = members(S13_LEAN_TPUT / "logs.tar.xz", "always-on-sim.log", "dynspec-sim.log")
    assert [round(median_rate(s13[f"{n}-sim.log"], 16)) for n in ("dynspec", "always-on")] == [4052, 4001]
    assert round(median_rate(logs["always-on-sim.log"], 16)) == 3444


S14_PREFILL_KV = PROOF / "0.5.12-v2-s14-prefill-kv"


def prefills_by_state(log: str) -> dict[str, int]:
    """Requests admitted (``#new-seq`` of each ``Prefill batch`` line) while the log's last switch
    line said speculation was ON or OFF."""
    state, admitted = "ON", {"ON": 0, "OFF": 0}
    for line in log.splitlines():
        if "dynspec: speculation OFF" in line or "dynspec: speculation ON" in line:
            state = "OFF" if "speculation OFF" in line else "ON"
        elif m := re.search(r"Prefill batch, #new-seq: (\d+)", line):
            admitted[state] += int(m[1])
    return admitted


def test_session_14_the_kv_only_prefill_keeps_the_draft_kv_exact() -> None:
    """v2 (0.5.12, own fallback) with the opt-in DYNSPEC_PREFILL_KV=1 on the tested server: 880
    requests were admitted while speculation was off, their prefill writing only the draft KV; every
    one of 1876 proposals after a fallback span equals the full extend's (the control differs at 58),
    output digests agree, 100 crossings with 3251 requests answered. Its speed was not measured."""
    report = report_of(S14_PREFILL_KV, {"DYNSPEC_PREFILL_KV": "1"}, S14_REVISIONS)
    assert report["path"] == "v2"
    assert report["crossings"]["passed"] and report["crossings"]["count"] == 100
    recs, files = kv_proof_recordings(S14_PREFILL_KV)
    assert "DYNSPEC_PREFILL_KV=1: while off, a prefill's draft extend writes only the draft KV" in files["dynspec.log"]
    assert "DYNSPEC_PREFILL_KV" not in files["dynspec-full.log"]  # the reference prefills in full
    assert prefills_by_state(files["dynspec.log"]) == {"ON": 2462, "OFF": 880}
    entry = exactkv.judge(recs, report["exact_kv"]["digests"], 100, [])
    assert entry["passed"] and report["exact_kv"]["passed"]
    assert (entry["mismatches"], entry["compared_steps"], entry["control_mismatches"]) == (0, 1876, 58)
    # Negative control: the skip server's recording as the candidate fails.
    assert not exactkv.judge({**recs, "kv": recs["skip"]}, {}, 100, [])["passed"]


# -- session 15, runtime r16 / v2 module r21 at 84d8de2 (branch s14-admission), SGLang 0.5.12 -----------

S15_AB = PROOF / "0.5.12-v2-s15-r16-mixed-ab"
S15_PARALLEL = PROOF / "0.5.12-v2-s15-r16-prefill-kv-parallel"
S15_TPUT = PROOF / "0.5.12-v2-s15-r16-prefill-kv-tput"
S15_PROOF = PROOF / "0.5.12-v2-s15-r16-prefill-kv-proof"
S15_V1 = PROOF / "0.5.12-v1-s15-r16-proof-bits"
S15_V1_STOPPED = PROOF / "0.5.12-v1-s15-r16-ready-check-stopped"
S15_REVISIONS = {"speculative_dynspec_runtime": 16, "speculative_dynspec_v2": 21}
PREFILL_KV = {"DYNSPEC_PREFILL_KV": "1"}


def s15_report(evidence: Path, env: dict[str, str]) -> dict:
    return report_of(evidence, env, S15_REVISIONS)


def test_session_15_the_kv_only_prefill_brings_the_own_fallbacks_mixed_load_to_the_oracle() -> None:
    """The A/B in one call (fresh machine, medians of 3): r16 without the KV-only prefill 10.84 s,
    1.102x the per-phase oracle (session 12: 1.041x); with DYNSPEC_PREFILL_KV=1 9.77 s, 0.993x. The
    phases at 64 and 128 requests (admission) gain 0.10 - 0.20 s each; the low phases gain too (0.75
    vs 0.65 s at 1), where both speculate with the stock step: the first server of the fresh machine
    ran its speculative phases slower, so 0.901x overstates what the setting alone saves."""
    mixed = s15_report(S15_AB, {"DYNSPEC_DRAFT_KV": "kv-direct"})["mixed_load"]
    assert mixed["seconds"] == {k: sorted(v)[1] for k, v in mixed["samples"].items()}
    assert mixed["seconds"] == {"base": 13.056, "always_on": 11.094, "dynspec": 10.842}
    assert not mixed["passed"] and mixed["dynspec_over_oracle"] == 1.1021
    variant = mixed["variants"]["prefill-kv"]
    assert variant["env"] == {**PREFILL_KV, "DYNSPEC_DRAFT_KV": "kv-direct"}
    assert variant["seconds"] == sorted(variant["samples"])[1] == 9.771
    assert variant["passed"] and variant["dynspec_over_oracle"] == 0.9932
    assert round(variant["seconds"] / mixed["oracle_seconds"], 4) == variant["dynspec_over_oracle"]
    dynspec_phases = [p["dynspec_s"] for p in mixed["phases"]]
    gains = [round(d - v, 2) for d, v in zip(dynspec_phases, variant["phases_s"])]
    assert [p["C"] for p in mixed["phases"]] == [1, 4, 16, 64, 128, 64, 16, 4, 1]
    assert gains == [0.1, 0.17, 0.09, 0.1, 0.2, 0.1, 0.08, 0.09, 0.11]
    # Negative control: always-on, judged as the candidate, is not within 3 % of the oracle.
    assert mixed["seconds"]["always_on"] > 1.03 * mixed["oracle_seconds"]


def test_session_15_the_kv_only_prefills_throughput_and_mixed_load() -> None:
    """kv-tput with DYNSPEC_PREFILL_KV=1 (warm machine): mixed_load passes, 10.17 s against the
    oracle's 10.10 (1.006x), faster than always-on (11.38) and base (12.95); throughput misses the
    0.97 envelope at 64 requests only (0.956) and the per-step ratio there is 0.971 (45 pairs; the
    issue asks 0.98)."""
    report = s15_report(S15_TPUT, {"DYNSPEC_DRAFT_KV": "kv-direct", **PREFILL_KV})
    mixed = report["mixed_load"]
    assert mixed["seconds"] == {k: sorted(v)[1] for k, v in mixed["samples"].items()}
    assert mixed["passed"] and mixed["dynspec_over_oracle"] == 1.0062
    assert mixed["seconds"]["dynspec"] < min(mixed["seconds"]["base"], mixed["seconds"]["always_on"])
    tput = report["throughput"]
    envelope = [d / max(b, a) for d, b, a in zip(tput["dynspec"], tput["base"], tput["always_on"])]
    assert [round(r, 2) for r in envelope] == [1.04, 1.0, 1.05, 1.02, 0.96, 1.0]
    assert not tput["passed"]
    published_per_step(S15_TPUT, tput, {"64": (0.971, 45), "128": (0.984, 28)})


@pytest.mark.parametrize("evidence", [S15_PROOF, S15_PARALLEL], ids=["proof", "parallel-starts"])
def test_session_15_the_kv_only_prefill_keeps_outputs_and_the_draft_kv_exact(evidence: Path) -> None:
    """DYNSPEC_PREFILL_KV=1 with the admission switch (r16): every proposal after a fallback span
    equals the full extend's (1908 and 1932; the control differs at 58), 100 crossings, and (the
    full proof) greedy outputs token-identical to stock at 1 - 48 requests and after the ramp. The
    second ran with --parallel-starts 3: its three servers were up after 59 - 61 s, the call took 96 s."""
    report = json.loads((evidence / "report.json").read_text())
    assert report["dynspec_env"]["DYNSPEC_PREFILL_KV"] == "1"
    recs, files = kv_proof_recordings(evidence)
    assert "a prefill's draft extend writes only the draft KV" in files["dynspec.log"]
    assert "DYNSPEC_PREFILL_KV" not in files["dynspec-full.log"]
    admitted = prefills_by_state(files["dynspec.log"])
    assert admitted["OFF"] > 800 and admitted["ON"] > 0
    entry = exactkv.judge(recs, report["exact_kv"]["digests"], 100, [])
    assert entry["passed"] and report["exact_kv"]["passed"] and report["crossings"]["count"] == 100
    expected = {S15_PROOF: 1908, S15_PARALLEL: 1932}[evidence]
    assert (entry["mismatches"], entry["compared_steps"], entry["control_mismatches"]) == (0, expected, 58)
    assert not exactkv.judge({**recs, "kv": recs["skip"]}, {}, 100, [])["passed"]  # negative control
    if evidence is S15_PROOF:
        assert report["equivalence"]["passed"]
    else:
        assert "--parallel-starts 3" in report["command"]
        assert [s["start_seconds"] for s in report["servers"]] == [59.1, 60.1, 61.2]


def prefill_sizes(log: str, warmups: int = 3, requests: int = 88) -> list[int]:
    """``#new-seq`` of the prefills of exact_kv's load (5 waves, 88 requests), after the warm-ups."""
    sizes = [int(n) for n in re.findall(r"Prefill batch, #new-seq: (\d+)", log)][warmups:]
    taken, total = [], 0
    for n in sizes:
        if total >= requests:
            break
        taken.append(n)
        total += n
    return taken


def test_session_15_v1s_bits_are_exact_and_its_proposals_part_at_a_prefill() -> None:
    """v1 (r16, the lean step): equivalence passes and 100 crossings; in all 2063 fallback iterations
    the direct write left the stock extend's K/V bits (0 of 109280 rows differ; the packed control
    89891 of 109252). exact_kv still failed: 9 proposals differ where the request's recorded decode
    history matched, all in one request at one near tie (1123 / 499). What the history did not see:
    the load sent each request alone, and the servers prefilled the same waves in other groups
    (1 + 15 against 2 + 14), so prompts' K/V and hidden states came from graphs of other sizes.
    Waves are now sent one call each (patcher.proof.client.run_batches)."""
    report = v1_kv_direct_report(S15_V1, S15_REVISIONS)
    assert report["equivalence"]["passed"] and report["crossings"]["count"] == 100
    assert not report["exact_kv"]["passed"]
    bits = report["exact_kv"]["bits"]
    assert bits["passed"] and (bits["iterations"], bits["rows"], bits["rows_differing"]) == (2063, 109280, 0)
    recs, files = kv_proof_recordings(S15_V1)
    entry = exactkv.judge(recs, report["exact_kv"]["digests"], 100, [])
    assert (entry["mismatches"], entry["mismatches_same_history"], entry["compared_steps_same_history"]) == (
        33,
        9,
        1066,
    )
    same = exactkv.compare(recs["full"], recs["kv"]).mismatches
    same = [m for m in same if m["same_history"]]
    assert {m["rid"] for m in same} == {"dynspec-record-3-long-200055"}
    assert {t for m in same for t in m["reference"] + m["other"]} == {1123, 499}
    sizes = {name: prefill_sizes(files[f"{name}.log"]) for name in ("dynspec", "dynspec-full")}
    assert sizes["dynspec"][:2] == [1, 15] and sizes["dynspec-full"][:2] == [2, 14]
    assert sum(sizes["dynspec"]) == sum(sizes["dynspec-full"]) == 88  # the same requests, grouped otherwise
    # Negative control: a server's prefills against its own are alike.
    assert prefill_sizes(files["dynspec.log"]) == sizes["dynspec"]


def test_session_15_the_stopped_v1_call_read_the_negative_controls_ready_line() -> None:
    """With --parallel-starts the three kv-proof servers start together, and scripts/h200-runs.sh's
    EXPECT_READY read the last ready line of dynspec*.log: the skip control's, up first, so it stopped
    the run before the server under test had said what it runs (the next call, without EXPECT_READY,
    shows it ran the direct write). It now reads the tested server's log only."""
    report = json.loads((S15_V1_STOPPED / "report.json").read_text())
    assert not report["complete"]
    assert "STOPPING: the ready line lacks 'replayed directly'" in (S15_V1_STOPPED / "call-output.txt").read_text()
    logs = members(S15_V1_STOPPED / "logs.tar.xz", "dynspec.log", "dynspec-skip.log")
    ready = {
        n: [line for line in logs[f"{n}.log"].splitlines() if "dynspec:" in line and " ready in " in line]
        for n in ("dynspec", "dynspec-skip")
    }
    assert ready["dynspec"] == []  # the server under test was still capturing its graphs
    assert "negative control" in ready["dynspec-skip"][-1] and "replayed directly" not in ready["dynspec-skip"][-1]
    script = (Path(__file__).resolve().parents[2] / "scripts" / "h200-runs.sh").read_text()
    assert '"$1"/dynspec.log "$1"/dynspec-sim.log' in script and '"$1"/dynspec*.log' not in script


# -- session 16: r16 / r23 (the KV-only prefill by default), waves in one call, first real weights --

S16_V2 = PROOF / "0.5.12-v2-s16-r23-proof"
S16_V1 = PROOF / "0.5.12-v1-s16-r23-proof-bits"
S16_TPUT = PROOF / "0.5.12-v2-s16-r23-tput"
S16_REAL = PROOF / "real-0.5.12-v2-s16-r23-proof"
S16_ACCEPT = PROOF / "real-0.5.12-v2-s16-r23-accept"
S16_HEAD = PROOF / "real-s16-head-train"
S16_REVISIONS = {"speculative_dynspec_runtime": 16, "speculative_dynspec_v2": 23}


def s16_report(evidence: Path) -> dict:
    return report_of(
        evidence, {"DYNSPEC_DRAFT_KV": "kv-direct"}, S16_REVISIONS
    )  # r22's KV-only prefill with no setting


def test_session_16_r23s_defaults_keep_outputs_and_the_draft_kv_exact_on_v2() -> None:
    """r23 with no DYNSPEC_PREFILL_KV: the KV-only prefill is the default and admission switches off
    first (3416 of 3479 prefills while off); 1902 proposals equal the full extend's (control 58)."""
    report = s16_report(S16_V2)
    _, files, counts = passed_kv_proof(S16_V2)
    assert counts == {"compared_requests": 28, "compared_steps": 1902, "control_differs": True}
    assert report["exact_kv"]["control_mismatches"] == 58
    assert "a prefill's draft extend writes only the draft KV" in files["dynspec.log"]
    assert prefills_by_state(files["dynspec.log"]) == {"ON": 63, "OFF": 3416}


def test_session_16_waves_sent_in_one_call_are_prefilled_alike_and_v1s_proposals_are_exact() -> None:
    """Session 15's v1 failure came from the same waves prefilled in other groups (1 + 15 against
    2 + 14). With each wave one /generate call, every server prefills 16, 16, 2, 16, 2, ... and all
    1896 proposals equal the full extend's; the bits stay exact (0 of 109044 rows; control 89870)."""
    report = s16_report(S16_V1)
    _, files, counts = passed_kv_proof(S16_V1)
    assert counts == {"compared_requests": 28, "compared_steps": 1896, "control_differs": True}
    bits = report["exact_kv"]["bits"]
    assert bits["passed"] and (bits["rows"], bits["rows_differing"], bits["control_rows_differing"]) == (
        109044,
        0,
        89870,
    )
    sizes = {name: prefill_sizes(files[f"{name}.log"]) for name in ("dynspec", "dynspec-full", "dynspec-skip")}
    assert sizes["dynspec"] == sizes["dynspec-full"] == sizes["dynspec-skip"] == [16, 16, 2, 16, 2, 16, 2, 16, 2]
    # Negative control: session 15's servers did not prefill alike.
    _, old = kv_proof_recordings(S15_V1)
    assert prefill_sizes(old["dynspec.log"]) != prefill_sizes(old["dynspec-full.log"])


def test_session_16_r23s_throughput_and_mixed_load_at_three_levels() -> None:
    """kv-tput with TPUT_LEVELS=16,64,128 (warm machine, after the real-weight calls): R(C) 1.03 /
    0.94 / 0.99, per step 0.971 at 64 (45 pairs) as in session 15, 0.988 at 128; mixed_load 10.62 s
    = 1.035x the oracle: FAIL by 0.5 %, where session 15 measured 1.006 with the same code path
    (DYNSPEC_PREFILL_KV=1 then): the run-to-run spread of the mixed load is as large as the margin."""
    report = s16_report(S16_TPUT)
    tput, mixed = report["throughput"], report["mixed_load"]
    assert tput["levels"] == [16, 64, 128] and [round(r, 2) for r in tput["envelope_ratio"]] == [1.03, 0.94, 0.99]
    assert not tput["passed"] and tput["problems"] == ["R(C) below 0.97 at C=64: 0.9421"]
    published_per_step(S16_TPUT, tput, {"64": (0.971, 45), "128": (0.988, 33)})
    assert mixed["seconds"] == {k: sorted(v)[1] for k, v in mixed["samples"].items()}
    assert mixed["seconds"] == {"base": 13.287, "always_on": 11.782, "dynspec": 10.621}
    assert not mixed["passed"] and mixed["dynspec_over_oracle"] == 1.0352
    assert mixed["seconds"]["dynspec"] < min(mixed["seconds"]["base"], mixed["seconds"]["always_on"])


def test_session_16_real_weights_without_deterministic_inference_round_apart_by_batch() -> None:
    """The first real-weight equivalence (SmolLM2-135M + the GPU-trained head, no deterministic
    inference): identical at C = 1; always-on differs from base in 2 of 4 outputs at C = 4 and in
    most at 48; dynspec, off throughout the 48-request level, differs from base in 25 of 48 and
    from itself a minute later (after the ramp). Batch-dependent rounding, not dynspec's draft KV:
    the proof now runs real weights with SGLang's --enable-deterministic-inference and asks base twice."""
    report = json.loads((S16_REAL / "report.json").read_text())
    assert report["model"].startswith("SmolLM2-135M-Instruct") and "deterministic" not in report
    eq = report["equivalence"]
    assert not eq["passed"] and report["crossings"]["passed"] and report["crossings"]["count"] == 100
    rows = {row["C"]: row for row in eq["per_level"]}
    assert rows[1]["identical"] and rows[1]["base"] == rows[1]["dynspec"] == rows[1]["always_on"]
    assert rows[48]["dynspec_state"] == "OFF / OFF" and rows[48]["dynspec"] != rows[48]["dynspec_after_ramp"]
    assert rows[48]["dynspec"] != rows[48]["base"]
    at_48 = [m for m in eq["mismatches"] if m["C"] == 48 and m["server"] == "dynspec"]
    assert len(at_48) == 25 and all(m["against"] == "base" for m in at_48)
    assert sum(1 for m in eq["modes_differ"] if m["C"] == 4) == 2
    assert "base_repeat" not in eq  # the control came after this run


def test_session_16_starting_the_head_from_the_targets_lm_head_gained_nothing_on_the_cpu() -> None:
    """The CPU recipe twice on the same cached samples (320 prompts, 8 epochs): --lm-head random 1.526
    held out (2.636 trained), --lm-head target 1.524 (2.713), so Recipe.lm_head stays "random". The
    target run also measured stale_kv: zeroing the draft K/V of 32 / 64 / 96 continuation positions
    changed its acceptance after the span by +0.2 / +0.06 / -0.3 %: this head does not read them."""
    ab = PROOF / "real-s16-cpu-lm-head-ab"
    runs = {name: json.loads((ab / f"{name}.json").read_text()) for name in ("random", "target")}
    assert {n: r["recipe"]["lm_head"] for n, r in runs.items()} == {"random": "random", "target": "target"}
    assert {n: r["acceptance"]["accept_length"] for n, r in runs.items()} == {"random": 1.526, "target": 1.524}
    assert {n: r["acceptance"]["train_accept_length"] for n, r in runs.items()} == {"random": 2.636, "target": 2.713}
    stale = runs["target"]["acceptance"]["stale_kv"]
    assert {span: row["ratio"] for span, row in stale.items()} == {"32": 1.002, "64": 1.0006, "96": 0.9967}
    assert all(round(row["stale"] / row["exact"], 4) == row["ratio"] for row in stale.values())


def test_session_16_self_written_queries_lifted_the_cpu_heads_held_out_acceptance() -> None:
    """The CPU recipe with --self-prompts 320 (320 queries SmolLM2 wrote itself, all kept, beside the
    same 320 real prompts): 1.556 held out against 1.526 without (WritingBench 1.448 against 1.407),
    and less over-fit (2.471 trained against 2.636). stale_kv again ~1.00."""
    ab = PROOF / "real-s16-cpu-lm-head-ab"
    base = json.loads((ab / "random.json").read_text())
    run = json.loads((PROOF / "real-s16-cpu-self-prompts" / "self-320.json").read_text())
    assert run["recipe"]["self_prompts"] == 320 and base["recipe"].get("self_prompts", 0) == 0
    assert {k: v for k, v in run["recipe"].items() if k != "self_prompts"} == {
        **base["recipe"],
        "self_prompt_tokens": 96,
    }  # the same recipe otherwise
    assert "320 self-written queries kept of 320" in (PROOF / "real-s16-cpu-self-prompts" / "self-320.log").read_text()
    acc = run["acceptance"]
    assert (acc["accept_length"], acc["train_accept_length"]) == (1.556, 2.471)
    assert acc["accept_length"] > base["acceptance"]["accept_length"] == 1.526
    assert acc["by_set"]["writingbench"] == 1.448 > base["acceptance"]["by_set"]["writingbench"]
    assert acc["accept_length"] < 1.8  # the issue's bar: still not met on the CPU recipe


def test_session_16_the_gpu_head_accepts_1_71_held_out_and_overfits() -> None:
    """real-train on the H200 (CUDA recipe: 590 prompts x 4 continuations of 256 tokens, 8 epochs,
    lm_head from scratch): 1.708 on the 115 held-out prompts (code 2.05, writing 1.66), 2.689 on
    training prompts: below the issue's 1.8, and overfit. Generation 92.5 s, training 33.0 s."""
    report = json.loads((S16_HEAD / "report.json").read_text())
    acc = report["acceptance"]
    assert (acc["accept_length"], acc["train_accept_length"], acc["prompts"]) == (1.708, 2.689, 115)
    assert acc["by_set"] == {"humaneval": 2.051, "writingbench": 1.66}
    assert acc["accept_length"] < 1.8  # the issue's bar: not met
    assert "lm_head" not in report["recipe"]  # the recipe before lm_head started from the target's
    assert report["timings_s"]["train"] == 33.0 and report["training"]["positions"] == 975572


def test_session_16_acceptance_on_real_weights_the_control_did_not_drop() -> None:
    """The acceptance check ran (4 servers, --parallel-starts 4): resumed 1.715 against always-on's
    1.713 (1.001x), full 1.692, the skip control 1.700 = 0.993x: a stale draft KV cost this head and
    load under 1 %, so the check cannot tell a stale KV from an exact one and fails, as it must.
    Its greedy outputs also differed between kv and full (no deterministic inference)."""
    acc = json.loads((S16_ACCEPT / "report.json").read_text())["acceptance"]
    assert not acc["passed"]
    assert (acc["always_on"], acc["dynspec_resumed"], acc["full_resumed"], acc["skip_resumed"]) == (
        1.7129,
        1.715,
        1.6924,
        1.7003,
    )
    assert acc["skip_over_always_on"] == 0.9926 and acc["requests"] == 16
    assert acc["problems"][1].endswith("no drop, so this load cannot see a stale draft KV")  # the rule of then
    assert (
        acc["digests"]["kv"][1:] != acc["digests"]["full"][1:] and acc["digests"]["kv"][0] == acc["digests"]["full"][0]
    )
    # Recomputed from the recordings with today's rule (session 18): resumed against full on the same
    # requests, against always-on within the spread of its requests; the control's drop reported.
    names = {"kv": "dynspec", "full": "dynspec-full", "skip": "dynspec-skip", "never_off": "always-on-recorded"}
    files = members(S16_ACCEPT / "logs.tar.xz", *(f"drafts-{n}.jsonl" for n in names.values()))
    traces = {k: acceptance.parse(files[f"drafts-{n}.jsonl"].splitlines()) for k, n in names.items()}
    entry = acceptance.judge(traces, 50, [])
    assert {k: entry[k] for k in ("always_on", "dynspec_resumed", "full_resumed", "skip_resumed", "requests")} == {
        k: acc[k] for k in ("always_on", "dynspec_resumed", "full_resumed", "skip_resumed", "requests")
    }
    assert entry["passed"] and entry["control_drops"] is False
    assert not acceptance.judge({**traces, "kv": traces["skip"], "never_off": traces["kv"]}, 50, [], min_ratio=1.01)[
        "passed"
    ]  # negative control


# -- session 17: the profile of the own fallback's step; v2 module r24 (its own stream, the lean sample) --

S17_PROFILE = PROOF / "0.5.12-v2-s17-r23-profile"
S17_DIAG = PROOF / "0.5.12-v2-s17-r24-stream-diag"
S17_V2 = PROOF / "0.5.12-v2-s17-r24-proof"
S17_TPUT = PROOF / "0.5.12-v2-s17-r24-tput64"
S17_REVISIONS = {"speculative_dynspec_runtime": 16, "speculative_dynspec_v2": 24}
STREAM_LINE = "kv-direct writes the draft KV on a stream of its own"
LEAN_LINE = "the lean one-node verify took its first batch"


def gpu_rows(table: str) -> list[tuple[float, float, str]]:
    """trace_sum's "GPU work" section: (microseconds per step, launches per step, kernel name) per line."""
    section = table.split("-- GPU work", 1)[1].split("\n--", 1)[0]
    return [
        (float(us), float(n), name)
        for us, n, name in re.findall(r"^\s+([\d.]+) us x\s+([\d.]+)\s+(.*)$", section, re.M)
    ]


def gpu_work(table: str) -> dict[str, float]:
    """trace_sum's "GPU work" section: microseconds per step by kernel name."""
    return {name: us for us, _, name in gpu_rows(table)}


def per_step_span(table: str) -> tuple[float, float, float]:
    span, busy, idle = re.search(r"per step: span (\d+) us, busy (\d+) us, idle (\d+) us", table).groups()  # type: ignore[union-attr]
    return float(span), float(busy), float(idle)


def test_session_17_the_profile_puts_the_own_fallbacks_extra_step_time_in_gpu_work_not_in_idle_gaps() -> None:
    """Base and r23's fallback at 64 requests (30 steps, GPU only): the same idle per step (402 / 403
    us) and 232 us more busy, of which 109 us attention over a longer context (the dynspec profile
    started at ~29.7k tokens, base at ~26.4k) and 117 us other work: the draft's two GEMMs (fc and
    QKV, 55 us) and small kernels (copies, fills, the one-node tree's sample). Idle time the draft
    write could use, not host work, is where the step can gain."""
    base, dyn = ((S17_PROFILE / f"{n}-gpu.txt").read_text() for n in ("base", "dyn"))
    (b_span, b_busy, b_idle), (d_span, d_busy, d_idle) = per_step_span(base), per_step_span(dyn)
    assert (b_idle, d_idle) == (402, 403) and d_busy - b_busy == 232 and (b_span, d_span) == (6732, 6965)
    b, d = gpu_work(base), gpu_work(dyn)
    attention = [k for k in d if k.startswith("_fwd_")]

    def extra(over: dict[str, float], of: dict[str, float]) -> float:
        return sum(of.get(k, 0) - over.get(k, 0) for k in set(over) | set(of) if k not in attention)

    assert 110 < extra(b, d) < 120
    assert extra(d, b) < 0  # negative control: the other way round, base has less
    gemms = [k for k in d if k.startswith("nvjet_sm90_tst_96x64") or k.startswith("nvjet_sm90_tst_64x64")]
    assert 50 < sum(d[k] - b[k] for k in gemms) < 60
    assert sum(d[k] - b[k] for k in attention) > 100


def s17_report(evidence: Path) -> dict:
    return report_of(evidence, {"DYNSPEC_DRAFT_KV": "kv-direct", "DYNSPEC_KV_STREAM": "1"}, S17_REVISIONS)


def test_session_17_the_write_on_its_own_stream_and_the_lean_sample_keep_outputs_and_the_draft_kv_exact() -> None:
    report = s17_report(S17_V2)
    _, files, counts = passed_kv_proof(S17_V2)
    assert counts == {"compared_requests": 28, "compared_steps": 1938, "control_differs": True}
    assert STREAM_LINE in files["dynspec.log"] and LEAN_LINE in files["dynspec.log"]
    # The reference writes the full extend and samples stock: no direct write, so no stream of its own.
    assert STREAM_LINE not in files["dynspec-full.log"] and "one-node verify samples" not in files["dynspec-full.log"]
    assert report["exact_kv"]["control_mismatches"] == 58


def test_session_17_in_one_call_the_stream_and_the_lean_sample_gain_a_point_per_step() -> None:
    """diag at 64 / 100 requests: r23's path (LEAN off, no stream) 0.980 / 0.991 of a plain step,
    r24's defaults-to-be 0.990 / 0.999; a second plain server (base-2) 1.000 / 0.999 (the drift)."""
    logs = {
        p.name[: -len(".log.gz")]: gzip.decompress(p.read_bytes()).decode(errors="replace")
        for p in S17_DIAG.glob("*.log.gz")
    }
    ratios = steps.per_step(logs, "base", [64, 100])
    medians = {name: (r["64"]["median"], r["100"]["median"]) for name, r in ratios.items()}
    assert medians == {"old": (0.98, 0.991), "new": (0.99, 0.999), "base-2": (1.0, 0.999)}
    assert STREAM_LINE in logs["new"] and LEAN_LINE in logs["new"]
    assert STREAM_LINE not in logs["old"] and LEAN_LINE not in logs["old"]
    assert ratio_against_itself(logs["base"]) == 1.0  # negative control


def test_session_17_throughput_at_64_requests() -> None:
    """Only C = 64 ran (the last 250 s of device time): R 0.959 (base 10359, always-on 9040,
    dynspec 9934 tok/s), per step 0.979 over 20 pairs (sessions 15 and 16: 0.971 over 45)."""
    report = s17_report(S17_TPUT)
    tput = report["throughput"]
    assert tput["levels"] == [64] and tput["envelope_ratio"] == [0.9589] and not tput["passed"]
    logs = members(S17_TPUT / "logs.tar.xz", "base-sim.log", "dynspec-sim.log")
    ratios = steps.per_step({"base": logs["base-sim.log"], "dynspec": logs["dynspec-sim.log"]}, "base", [64])
    assert tput["per_step"] == ratios and (ratios["dynspec"]["64"]["median"], ratios["dynspec"]["64"]["pairs"]) == (
        0.979,
        20,
    )
    assert ratio_against_itself(logs["base-sim.log"]) == 1.0  # negative control


def test_session_17_a_draft_vocabulary_twice_as_large_gained_nothing_on_the_cpu() -> None:
    """The session-16 self-prompts recipe on the same cached samples with --draft-vocab 8192: held-out
    labels inside the draft vocabulary rise from 89 % to 93 %, acceptance does not (1.557 against
    1.556; trained 2.472 against 2.471), so Recipe.draft_vocab stays 4096."""
    run = json.loads((PROOF / "real-s17-cpu-draft-vocab" / "self-320-dv8192.json").read_text())
    before = json.loads((PROOF / "real-s16-cpu-self-prompts" / "self-320.json").read_text())
    assert {k: v for k, v in run["recipe"].items() if k != "draft_vocab"} == {
        k: v for k, v in before["recipe"].items() if k != "draft_vocab"
    }  # the same recipe otherwise
    assert (run["recipe"]["draft_vocab"], before["recipe"]["draft_vocab"]) == (8192, 4096)
    log = (PROOF / "real-s17-cpu-draft-vocab" / "self-320-dv8192.log").read_text()
    assert (
        "640 prompts' continuations from /root/.cache/dynspec/real/samples/8c6ea709a52c1109.pt" in log
    )  # the same samples
    got, had = run["acceptance"], before["acceptance"]
    assert (got["accept_length"], got["train_accept_length"]) == (1.557, 2.472)
    assert abs(got["accept_length"] - had["accept_length"]) <= 0.001  # no gain
    # Negative control: the same comparison sees session 16's gain from the self-written queries.
    without = json.loads((PROOF / "real-s16-cpu-lm-head-ab" / "random.json").read_text())["acceptance"]
    assert abs(had["accept_length"] - without["accept_length"]) > 0.001


# -- session 18: r28 on 0.5.12 v2 (stream and lean sample by default); real weights, GPU-trained head --

S18_REVISIONS = {"speculative_dynspec_runtime": 16, "speculative_dynspec_v2": 28}
S18_V2 = PROOF / "0.5.12-v2-s18-r28-proof"
S18_TPUT = PROOF / "0.5.12-v2-s18-r28-tput"
S18_HEAD = PROOF / "real-s18-head-train"
S18_REAL = PROOF / "real-0.5.12-v2-s18-r28-proof"
S18_ACCEPT = PROOF / "real-0.5.12-v2-s18-r28-accept"
S18_REAL_TPUT = PROOF / "real-0.5.12-v2-s18-r28-tput-sim"
ACCEPT_SERVERS = {"kv": "dynspec", "full": "dynspec-full", "skip": "dynspec-skip", "never_off": "always-on-recorded"}


def s18_report(evidence: Path, env: dict[str, str]) -> dict:
    return report_of(evidence, env, S18_REVISIONS)


def test_session_18_r28_keeps_outputs_and_the_draft_kv_exact_with_the_stream_by_default() -> None:
    s18_report(S18_V2, {"DYNSPEC_DRAFT_KV": "kv-direct"})  # no DYNSPEC_KV_STREAM: on by default since r25
    report, files, counts = passed_kv_proof(S18_V2)
    assert counts == {"compared_requests": 28, "compared_steps": 1896, "control_differs": True}
    assert report["exact_kv"]["control_mismatches"] == 58 and report["crossings"]["count"] == 100
    assert STREAM_LINE in files["dynspec.log"] and LEAN_LINE in files["dynspec.log"]
    assert STREAM_LINE not in files["dynspec-full.log"]


def test_session_18_the_mixed_load_with_the_stream_is_within_3_percent_of_the_oracle() -> None:
    """kv-tput at 16 / 64 / 128: R 0.968 / 0.967 / 0.987 (fails the 0.97 bar at 16 and 64), per step
    0.981 at 64 (47 pairs) and 0.998 at 128; mixed_load 11.03 s against the per-phase oracle's 10.72
    (1.030x, passes), base 13.45 s, always-on 12.58 s: faster than both static servers by 12 - 18 %."""
    report = s18_report(S18_TPUT, {"DYNSPEC_DRAFT_KV": "kv-direct"})
    tput, mixed = report["throughput"], report["mixed_load"]
    assert tput["levels"] == [16, 64, 128] and tput["envelope_ratio"] == [0.9683, 0.9671, 0.9868] and not tput["passed"]
    published_per_step(S18_TPUT, tput, {"64": (0.981, 47), "128": (0.998, 32)})
    assert mixed["passed"] and mixed["dynspec_over_oracle"] == 1.0295 and mixed["max_ratio"] == 1.03
    assert mixed["seconds"] == {"base": 13.448, "always_on": 12.584, "dynspec": 11.033}
    assert mixed["seconds"]["dynspec"] < min(mixed["seconds"]["base"], mixed["seconds"]["always_on"])


def test_session_18_the_gpu_head_from_2000_self_written_queries_accepts_1_80_and_reads_its_kv() -> None:
    """real-train --self-prompts 2000 --continuations 2 on the H200 (5178 continuations, 8 epochs, 362 s
    with the real-b step): 1.798 held out (code 2.022, writing 1.764), 2.682 on training prompts,
    against session 16's 1.708: 0.002 short of the issue's 1.8. Zeroing 32 / 64 / 96 positions of its
    draft K/V now costs it 0.3 / 2.3 / 3.3 % (session 16's CPU head: none), so a stale KV shows."""
    report = json.loads((S18_HEAD / "report.json").read_text())
    acc, recipe = report["acceptance"], report["recipe"]
    assert (recipe["self_prompts"], recipe["continuations"], recipe["device"], recipe["seed"]) == (2000, 2, "cuda", 15)
    assert (acc["accept_length"], acc["train_accept_length"], acc["prompts"]) == (1.798, 2.682, 115)
    assert acc["by_set"] == {"humaneval": 2.022, "writingbench": 1.764}
    assert acc["accept_length"] < 1.8 < acc["accept_length"] + 0.01  # the bar: missed by a hair
    assert {span: row["ratio"] for span, row in acc["stale_kv"].items()} == {"32": 0.9967, "64": 0.9771, "96": 0.9672}
    old = json.loads((S16_HEAD / "report.json").read_text())["acceptance"]
    assert acc["accept_length"] - old["accept_length"] == pytest.approx(0.09, abs=1e-9)
    config = json.loads((S18_HEAD / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 4096


def real_weights_follow_their_mode(report: dict) -> dict[str, list[str]]:
    """A real-weight kv-proof's equivalence digests, once deterministic inference was on, base gave its
    tokens twice, always-on parted from base in 31 outputs, and dynspec gave base's tokens where it
    was off (C = 16, 48) and always-on's where it speculated (C = 4), over 100 crossings."""
    eq = report["equivalence"]
    assert report["deterministic"] and eq["passed"] and eq["base_repeatable"] and eq["mismatch_count"] == 0
    assert eq["modes_differ_count"] == 31 and report["crossings"]["passed"] and report["crossings"]["count"] == 100
    digests = eq["digests"]
    assert digests["dynspec"][2:] == digests["base"][2:] != digests["always_on"][2:]  # off at C = 16, 48
    assert digests["dynspec"][1] == digests["always_on"][1] != digests["base"][1]  # speculating at C = 4
    return digests


def test_session_18_real_weights_with_deterministic_inference_give_base_tokens_where_dynspec_is_off() -> None:
    """SmolLM2-135M and its head, deterministic inference on, the runtime's defaults (r28 on the own
    fallback: the eager KV-only write): base gave the same tokens twice, dynspec gave base's tokens
    wherever it was off and always-on's where it speculated; always-on differs from base in 31
    outputs (its verify rounds apart from a decode step)."""
    real_weights_follow_their_mode(s18_report(S18_REAL, {}))
    log = members(S18_REAL / "logs.tar.xz", "dynspec.log")["dynspec.log"]
    assert "draft KV only while off (eagerly)" in log and STREAM_LINE not in log


def accept_traces(evidence: Path) -> dict[str, acceptance.Trace]:
    """An acceptance run's recordings, keyed as ``acceptance.judge`` reads them."""
    files = members(evidence / "logs.tar.xz", *(f"drafts-{n}.jsonl" for n in ACCEPT_SERVERS.values()))
    return {k: acceptance.parse(files[f"drafts-{n}.jsonl"].splitlines()) for k, n in ACCEPT_SERVERS.items()}


def test_session_18_acceptance_after_resume_equals_the_full_extends_and_the_control_drops() -> None:
    """The acceptance check on the GPU head (kv-direct, 5 waves, 28 requests resumed): resumed 1.975,
    full 1.976, skip 1.911, always-on 2.023. The run failed on the rule of then (0.99 x always-on, and
    kv's outputs equal to full's); recomputed with today's (session 18): resumed / full 0.9995 (95 %
    interval 0.9945 - 1.0036), resumed / always-on 0.976 (0.910 - 1.040: always-on's text parts from
    the others'), the control / full 0.967 (0.938 - 0.989): a stale draft KV shows, an exact one does
    not. kv's drafts differ from full's at 37 of 1825 positions, none of 249 where the request's
    timeline matched (the control: 16)."""
    published = s18_report(S18_ACCEPT, {})["acceptance"]
    assert (
        not published["passed"]
        and published["problems"][1] == "resumed acceptance 1.975 is below 0.99 x always-on's 2.023"
    )
    assert published["digests"]["kv"][:4] == published["digests"]["full"][:4] != published["digests"]["never_off"][:4]
    entry = acceptance.judge(accept_traces(S18_ACCEPT), 50, [])
    assert {k: entry[k] for k in ("always_on", "dynspec_resumed", "full_resumed", "skip_resumed", "requests")} == {
        k: published[k] for k in ("always_on", "dynspec_resumed", "full_resumed", "skip_resumed", "requests")
    }
    assert entry["passed"] and entry["control_drops"] is True
    assert entry["resumed_over_full"] == {"ratio": 0.9995, "ci95": [0.9945, 1.0036]}
    assert entry["resumed_over_always_on"] == {"ratio": 0.9763, "ci95": [0.9104, 1.0401]}
    assert entry["skip_over_full"] == {"ratio": 0.967, "ci95": [0.9378, 0.9887]}
    # Negative control: the control's recording as the server under test fails.
    traces = accept_traces(S18_ACCEPT)
    assert acceptance.judge({**traces, "kv": traces["skip"]}, 50, [])["problems"] == [
        "resumed acceptance is 0.9652 x the full extend's on the same requests, below 0.99 (1.908 against 1.976 over each server's own)"
    ]
    files = members(
        S18_ACCEPT / "logs.tar.xz", *(f"drafts-{n}.jsonl" for n in ("dynspec", "dynspec-full", "dynspec-skip"))
    )
    recs = {k: exactkv.parse(files[f"drafts-{ACCEPT_SERVERS[k]}.jsonl"].splitlines()) for k in ("kv", "full", "skip")}
    summary, problem = proposals_apart(recs)
    assert problem is None and summary == {
        "compared_steps": 1825, "mismatches": 37, "compared_steps_same_history": 249,
        "mismatches_same_history": 0, "control_mismatches_same_history": 16,
    }  # fmt: skip
    assert proposals_apart({**recs, "kv": recs["skip"]})[1] is not None  # negative control


def test_session_18_on_the_small_real_model_the_eager_default_cost_a_fifth_of_a_step() -> None:
    """The last 100 s of device time: throughput at C = 1 and 32 on SmolLM2-135M (simulated acceptance
    3; its report's "8b" shape label was wrong, fixed since) with the runtime's then default on the own
    fallback, the eager KV-only write: per step 0.804 of base's at 32 (21 pairs), R 0.86; always-on
    equalled base there (10015 / 10035 tok/s). A tiny model's step leaves the eager write's host
    work nowhere to hide; r32 makes kv-direct the default where the release feeds it."""
    report = s18_report(S18_REAL_TPUT, {})
    tput = report["throughput"]
    assert report["model"].startswith("SmolLM2-135M-Instruct") and tput["levels"] == [1, 32]
    assert tput["envelope_ratio"] == [1.0794, 0.8614] and (tput["base"][1], tput["always_on"][1]) == (10034.7, 10014.7)
    logs = members(S18_REAL_TPUT / "logs.tar.xz", "base-sim.log", "dynspec-sim.log")
    ratios = steps.per_step({"base": logs["base-sim.log"], "dynspec": logs["dynspec-sim.log"]}, "base", [32])
    assert tput["per_step"] == ratios and (ratios["dynspec"]["32"]["median"], ratios["dynspec"]["32"]["pairs"]) == (
        0.804,
        21,
    )
    assert "draft KV only while off (eagerly)" in logs["dynspec-sim.log"]


# -- session 19: r19 / r32 (auto is kv-direct on the own fallback) on 0.5.12 v2, v1 and 0.5.17 --

S19_REVISIONS = {"speculative_dynspec_runtime": 19, "speculative_dynspec_v2": 32}
S19_KV = {"0.5.12": PROOF / "0.5.12-v2-s19-r32-proof", "0.5.17": PROOF / "0.5.17-v2-s19-r32-proof"}
S19_REAL = {"0.5.12-v1": PROOF / "real-0.5.12-v1-s19-r32-proof", "0.5.17": PROOF / "real-0.5.17-v2-s19-r32-proof"}
S19_ACCEPT = {"0.5.12": PROOF / "real-0.5.12-v2-s19-r32-accept", "0.5.17": PROOF / "real-0.5.17-v2-s19-r32-accept"}
S19_REAL_TPUT = {"0.5.12": PROOF / "real-0.5.12-v2-s19-r32-tput", "0.5.17": PROOF / "real-0.5.17-v2-s19-r32-tput"}
DIRECT_READY = "draft KV only while off (from a CUDA graph, replayed directly)"


def s19_report(evidence: Path) -> dict:
    # Nothing set in the caller's environment; the harness still sets DYNSPEC_DRAFT_KV=kv-direct on
    # kv-proof's dynspec server and on acceptance's server under test (their ``servers`` say so).
    return report_of(evidence, {}, S19_REVISIONS)


@pytest.mark.parametrize(
    ("version", "counts", "control"),
    [("0.5.12", (1926, 58), 1928), ("0.5.17", (1912, 32), 1902)],
    ids=["0.5.12-v2", "0.5.17"],
)
def test_session_19_r32_keeps_outputs_and_the_draft_kv_exact(
    version: str, counts: tuple[int, int], control: int
) -> None:
    """kv-proof on the runtime of main (fresh machine for 0.5.12, 3 servers at a time): equivalence at
    C = 1, 4, 16, 48, 100 crossings and every proposal after an off period equal to the full extend's."""
    report = s19_report(S19_KV[version])
    _, files, found = passed_kv_proof(S19_KV[version])
    assert found == {"compared_requests": 28, "compared_steps": counts[0], "control_differs": True}
    assert (report["exact_kv"]["control_mismatches"], report["exact_kv"]["control_compared_steps"]) == (
        counts[1],
        control,
    )
    assert report["exact_kv"]["kv_only_extend"] == "from a CUDA graph, replayed directly"
    assert DIRECT_READY in files["dynspec.log"] and DIRECT_READY not in files["dynspec-full.log"]  # negative control
    assert (STREAM_LINE in files["dynspec.log"]) == (version == "0.5.12")  # the stream is opt-in on 0.5.14+


def test_session_19_auto_is_kv_direct_on_the_own_fallback_and_writes_beside_the_worker() -> None:
    """The real-weight throughput run set no DYNSPEC_DRAFT_KV: r32's ``auto`` on 0.5.12 v2 chose the
    directly fed graph and its stream (r28's ``auto``, session 18: the eager write)."""
    servers = {s["name"]: s["env"] for s in s19_report(S19_REAL_TPUT["0.5.12"])["servers"]}
    assert "DYNSPEC_DRAFT_KV" not in servers["dynspec-own"]
    log = members(S19_REAL_TPUT["0.5.12"] / "logs.tar.xz", "dynspec-own.log")["dynspec-own.log"]
    assert DIRECT_READY in log and STREAM_LINE in log
    old = members(S18_REAL_TPUT / "logs.tar.xz", "dynspec-sim.log")["dynspec-sim.log"]
    assert DIRECT_READY not in old and STREAM_LINE not in old  # negative control: r28's default


@pytest.mark.parametrize("release", sorted(S19_REAL))
def test_session_19_real_weights_give_base_tokens_where_dynspec_is_off(release: str) -> None:
    """SmolLM2-135M and the session-18 head (carried, not retrained), deterministic inference, the
    runtime's defaults: on v1 0.5.12 and on 0.5.17 base repeated itself, dynspec gave base's tokens
    wherever it was off and always-on's where it speculated, over 100 crossings; always-on parts from
    base in the same 31 outputs on both (its verify rounds apart from a decode step)."""
    digests = real_weights_follow_their_mode(s19_report(S19_REAL[release]))
    assert (
        digests == json.loads((S18_REAL / "report.json").read_text())["equivalence"]["digests"]
    )  # the same tokens as 0.5.12 v2


@pytest.mark.parametrize(
    ("release", "resumed", "skip", "control_drops"),
    [
        ("0.5.12", {"ratio": 0.9939, "ci95": [0.9846, 0.9997]}, {"ratio": 0.969, "ci95": [0.9398, 0.99]}, True),
        ("0.5.17", {"ratio": 0.9966, "ci95": [0.9898, 1.0027]}, {"ratio": 0.9761, "ci95": [0.9442, 1.0049]}, False),
    ],
)
def test_session_19_kv_direct_resumes_at_the_full_extends_acceptance(
    release: str, resumed: dict, skip: dict, control_drops: bool
) -> None:
    """The acceptance check with kv-direct (r32) on real weights, 28 requests resumed: 0.5.12 v2
    resumed 1.966, full 1.978, skip 1.917, always-on 2.024; 0.5.17 1.961 / 1.968 / 1.921 / 2.017.
    The paired ratio to full is above the 0.99 bar on both; on 0.5.12 its interval just misses 1
    (0.985 - 0.9997), on 0.5.17 it holds 1. No draft differs from full's where the request's timeline
    matched (0 of 249; the control 16). The control dropped 3.1 % on 0.5.12 and 2.4 % on 0.5.17, whose
    interval reaches 1.005: reported, not claimed."""
    published = s19_report(S19_ACCEPT[release])["acceptance"]
    traces = accept_traces(S19_ACCEPT[release])
    entry = acceptance.judge(traces, 50, [])
    keys = (
        "always_on",
        "dynspec_resumed",
        "full_resumed",
        "skip_resumed",
        "requests",
        "resumed_over_full",
        "skip_over_full",
        "control_drops",
    )
    assert {k: entry[k] for k in keys} == {k: published[k] for k in keys}
    assert published["passed"] and entry["passed"] and entry["requests"] == 28
    assert (entry["resumed_over_full"], entry["skip_over_full"], entry["control_drops"]) == (
        resumed,
        skip,
        control_drops,
    )
    assert (
        published["proposals"]["mismatches_same_history"] == 0
        and published["proposals"]["control_mismatches_same_history"] == 16
    )
    assert not acceptance.judge({**traces, "kv": traces["skip"]}, 50, [])["passed"]  # negative control


def logged_accept_lengths(log: str, running: int) -> list[float]:
    """The ``accept len`` of every ``Decode batch`` line logged at ``running`` requests."""
    return [float(m.group(1)) for m in re.finditer(rf"#running-req: {running}, .*?accept len: ([0-9.]+)", log)]


@pytest.mark.parametrize("release", sorted(S19_REAL_TPUT))
def test_session_19_the_head_accepts_above_1_8_at_1_and_32_requests(release: str) -> None:
    """Always-on, no simulation, the held-out prompts: 2.75 accepted + 1 per verify at C = 1 (one
    prompt, three runs) and 1.87 at C = 32 (32 prompts), on both releases; the issue's bar is 1.8.
    The servers' own log lines agree (their median within 0.1), and dynspec, off at 32, verified
    nothing there (1.00: the negative control)."""
    report = s19_report(S19_REAL_TPUT[release])
    tput = report["throughput"]
    assert report["model"].startswith("SmolLM2-135M-Instruct") and tput["simulate_acc_len"] is None
    assert tput["levels"] == [1, 32] and tput["accept_length"]["always_on"] == [2.75, 1.87]
    assert tput["accept_length"]["dynspec"] == [2.75, 1.0]
    logs = members(S19_REAL_TPUT[release] / "logs.tar.xz", "always-on-own.log", "dynspec-own.log")
    logged = statistics.median(logged_accept_lengths(logs["always-on-own.log"], 32))
    assert abs(logged - 1.87) < 0.1 and min(tput["accept_length"]["always_on"]) > 1.8
    off = logged_accept_lengths(logs["dynspec-own.log"], 32)
    assert statistics.median(off) == 1.0 and max(off) < 1.2  # a first line may still hold the ramp's ON steps


def test_session_19_on_the_small_real_model_a_direct_fallback_step_runs_at_0_86_0_89_of_a_plain_one() -> None:
    """Throughput on SmolLM2-135M with the head's own acceptance (threshold 8, so C = 32 runs off):
    per step 0.888 (0.5.12 v2, 22 pairs) and 0.860 (0.5.17) of base's; session 18's eager write on
    0.5.12 v2 gave 0.804 (simulated acceptance, off at 32 alike); per log interval it ranges 0.66 -
    0.99: a 3 ms step is host-bound and noisy.
    R at 32 is 0.88 / 0.81: the product's bar is not met on a model this small. At C = 1 (speculating)
    R 0.91 / 1.10 over three runs each: noise about equal acceptance (2.75 both)."""
    expected = {"0.5.12": ((0.888, 22), [0.9055, 0.8819]), "0.5.17": ((0.86, 22), [1.1043, 0.8112])}
    for release, (step, envelope) in expected.items():
        tput = s19_report(S19_REAL_TPUT[release])["throughput"]
        logs = members(S19_REAL_TPUT[release] / "logs.tar.xz", "base-own.log", "dynspec-own.log")
        ratios = steps.per_step({"base": logs["base-own.log"], "dynspec": logs["dynspec-own.log"]}, "base", [32])
        assert (
            tput["per_step"] == ratios and (ratios["dynspec"]["32"]["median"], ratios["dynspec"]["32"]["pairs"]) == step
        )
        assert tput["envelope_ratio"] == envelope and not tput["passed"]
        pairs = ratios["dynspec"]["32"]
        assert pairs["min"] >= 0.66 and pairs["max"] <= 0.99
        itself = steps.per_step({"base": logs["base-own.log"], "same": logs["base-own.log"]}, "base", [32])
        assert itself["same"]["32"]["median"] == 1.0  # negative control


def test_session_19_the_real_runs_served_session_18s_head() -> None:
    """The weights session 19's real-b call reported (copied into real-s19-prepare.json) are the GGUF
    of the prepare step and the head session 18 trained; its reports predate ``model_sha256``."""
    prepared = json.loads((PROOF / "real-s19-prepare.json").read_text())
    trained = (S18_HEAD / "model.safetensors.sha256").read_text().split()[0]
    assert prepared["head_sha256"] == trained and len(prepared["gguf_sha256"]) == 64
    assert (
        prepared["head_sha256"] != prepared["gguf_sha256"]
    )  # negative control: the equality above tells two digests apart
    assert all("model_sha256" not in s19_report(p) for p in S19_REAL.values())


# -- session 20: r19 / r32 (unchanged since session 19) on the 8B shape: throughput and mixed_load; 0.5.13's kv-proof --

S20_TPUT = {
    "0.5.12-v2": PROOF / "0.5.12-v2-s20-r32-tput",
    "0.5.17": PROOF / "0.5.17-v2-s20-r32-tput",
    "0.5.12-v1": PROOF / "0.5.12-v1-s20-r32-tput",
}
S20_KV_13 = PROOF / "0.5.13-v2-s20-r32-proof"
SPECULATIVE_LINE = re.compile(
    r"Decode batch, #running-req: (\d+), .*?accept len: ([\d.]+), .*?gen throughput \(token/s\): ([\d.]+)"
)


def s20_report(evidence: Path) -> dict:
    return report_of(evidence, {}, S19_REVISIONS)  # nothing set in the caller's environment: auto is kv-direct


def steady_speculative_speeds(log: str, running: int) -> list[float]:
    """The logged speed of every ``Decode batch`` line at ``running`` requests that verified (accept len
    3, the simulated acceptance) right after another line at the same batch size: the speculative
    steady state, which ``steps.steady_steps`` (one token per request per iteration) leaves out."""
    speeds, previous = [], None
    for line in log.splitlines():
        match = SPECULATIVE_LINE.search(line)
        if match is None:
            previous = None
            continue
        size = int(match.group(1))
        if size == previous == running and float(match.group(2)) == 3.0:
            speeds.append(float(match.group(3)))
        previous = size
    return speeds


@pytest.mark.parametrize(
    ("release", "envelope", "per_step", "mixed"),
    [
        (
            "0.5.12-v2",
            [1.076, 1.0933, 1.0767, 1.028, 0.9732, 0.9557],
            {"64": (0.983, 45), "128": (0.993, 31)},
            (False, 1.0317),
        ),
        (
            "0.5.17",
            [0.9743, 0.962, 0.998, 0.9893, 0.9457, 0.9935],
            {"64": (0.978, 46), "128": (0.983, 31)},
            (True, 1.0124),
        ),
    ],
)
def test_session_20_on_v2_a_fallback_step_costs_a_plain_one_and_end_to_end_misses_the_bar(
    release: str, envelope: list[float], per_step: dict, mixed: tuple[bool, float]
) -> None:
    """kv-tput at all six levels (3 servers started at once, each measured alone, median of 3): per step
    0.98 - 0.99 of base at 64 and 128 on both (the issue's 0.98: met); R(C) misses 0.97 at 128 on
    0.5.12 v2 and at 4 and 64 on 0.5.17; mixed_load 1.032x the oracle on 0.5.12 v2 (over 1.03 by
    0.2 points), 1.012x on 0.5.17; faster than both static servers on both."""
    report = s20_report(S20_TPUT[release])
    tput, load = report["throughput"], report["mixed_load"]
    assert tput["levels"] == [1, 4, 16, 32, 64, 128] and tput["envelope_ratio"] == envelope and not tput["passed"]
    logs, _ = published_per_step(S20_TPUT[release], tput, per_step)
    assert (load["passed"], load["dynspec_over_oracle"]) == mixed
    assert load["seconds"]["dynspec"] < min(load["seconds"]["base"], load["seconds"]["always_on"])
    assert "DYNSPEC_DRAFT_KV" not in {k for s in report["servers"] for k in s["env"]}
    assert DIRECT_READY in logs["dynspec-sim.log"]


def test_session_20_the_end_to_end_gap_lies_outside_the_steady_steps() -> None:
    """Where R misses the bar, the steady state does not. On 0.5.12 v2 at 128 requests each run's
    median steady speed is base's (18453 - 19145 against 18678 - 18991 tok/s) while the end-to-end
    median is 0.956 of base's (one sample of three at 13434 tok/s); on 0.5.17 at 1 and 4 requests,
    both speculating, the steady speculative speed is always-on's within 1 % while end to end dynspec
    is 2.6 % and 3.8 % slower, in every sample: the loss is in admission, the first and last
    iterations of a request, not in the speculative step."""
    runs = s20_report(S20_TPUT["0.5.12-v2"])["throughput"]["per_run"]
    dyn, base = statistics.median(runs["dynspec"]["128"][1:]), statistics.median(runs["base"]["128"][1:])
    assert abs(dyn / base - 1) < 0.01
    report = s20_report(S20_TPUT["0.5.17"])
    logs = members(S20_TPUT["0.5.17"] / "logs.tar.xz", "always-on-sim.log", "dynspec-sim.log", "base-sim.log")
    samples = report["throughput"]["samples"]
    for index, running in ((0, 1), (1, 4)):
        on = statistics.median(steady_speculative_speeds(logs["always-on-sim.log"], running))
        mine = statistics.median(steady_speculative_speeds(logs["dynspec-sim.log"], running))
        assert abs(mine / on - 1) < 0.01
        assert max(samples["dynspec"][index]) < min(samples["always_on"][index])
    assert steady_speculative_speeds(logs["base-sim.log"], 1) == []  # negative control: base never verifies


def test_session_20_v1s_fallback_step_is_under_0_97_of_plain_decode_without_overlap() -> None:
    """v1 (--disable-overlap-schedule) at 16 / 64 / 128: R against max(no-overlap base, always-on)
    1.14 / 0.89 / 0.90 (0.71 / 0.71 against plain decode with overlap); per step against the no-overlap base 0.90 / 0.935 (issue: 0.97), against
    plain decode with overlap 0.70 / 0.72. Session 13's r14 / r15 gave 0.959 and 0.984 at 64. Against
    session 13's run the host-bound servers lost steady speed and the overlapped one did not: plain
    decode without overlap, started and measured alone, 7 %; dynspec v1, beside two idle servers, 12 %."""
    report = s20_report(S20_TPUT["0.5.12-v1"])
    tput = report["throughput"]
    assert tput["judged_against"] == "base_no_overlap" and not tput["passed"]
    assert tput["envelope_ratio_no_overlap"] == [1.1434, 0.8943, 0.9012] and tput["envelope_ratio"] == [
        1.1434,
        0.7107,
        0.7057,
    ]
    logs = members(S20_TPUT["0.5.12-v1"] / "logs.tar.xz", "base-no-overlap-sim.log", "dynspec-sim.log")
    ratios = steps.per_step(
        {"plain": logs["base-no-overlap-sim.log"], "dynspec": logs["dynspec-sim.log"]}, "plain", [64, 128]
    )
    assert tput["per_step_no_overlap"] == {"dynspec": ratios["dynspec"]}
    assert {c: r["median"] for c, r in ratios["dynspec"].items()} == {"64": 0.9, "128": 0.935}
    assert ratio_against_itself(logs["base-no-overlap-sim.log"]) == 1.0  # negative control
    now = report["throughput"]["per_run"]
    then = steps.per_run(
        members(S13_LEAN_TPUT / "logs.tar.xz", "base-sim.log", "base-no-overlap-sim.log", "dynspec-sim.log"), [64]
    )
    change = {
        server: statistics.median(now[server]["64"][1:]) / statistics.median(then[f"{name}-sim.log"]["64"][1:])
        for server, name in (("base", "base"), ("base_no_overlap", "base-no-overlap"), ("dynspec", "dynspec"))
    }
    assert abs(change["base"] - 1) < 0.01 and change["base_no_overlap"] < 0.95 and change["dynspec"] < 0.9
    text = (S20_TPUT["0.5.12-v1"] / "proof.txt").read_text()
    assert text.index("stopped base-sim") < text.index("starting base-no-overlap-sim")  # it ran alone
    assert text.index("starting base-sim") < text.index("stopped dynspec-sim")  # dynspec did not


def test_session_20_r32_keeps_outputs_and_the_draft_kv_exact_on_0_5_13() -> None:
    """kv-proof on 0.5.13 (the own fallback with 0.5.13's on_publish): first run since r11 (session 11)."""
    report = s20_report(S20_KV_13)
    _, files, found = passed_kv_proof(S20_KV_13)
    assert found == {"compared_requests": 28, "compared_steps": 1870, "control_differs": True}
    assert (report["exact_kv"]["control_mismatches"], report["crossings"]["count"]) == (32, 100)
    assert DIRECT_READY in files["dynspec.log"] and STREAM_LINE in files["dynspec.log"]
    assert DIRECT_READY not in files["dynspec-full.log"]  # negative control


def prefill_graphs(log: str) -> tuple[int, int]:
    """(prefill lines replayed from a CUDA graph, prefill lines run eagerly)."""
    lines = [line for line in log.splitlines() if "Prefill batch" in line]
    graphed = sum("cuda graph: True" in line for line in lines)
    return graphed, len(lines) - graphed


def test_session_20_on_0_5_12_speculative_servers_prefill_eagerly_and_plain_decode_from_graphs() -> None:
    """Every admission costs a speculative server on 0.5.12 more than plain decode: base prefills in
    piecewise CUDA graphs, always-on and dynspec (on or off) eagerly, since 0.5.12's piecewise runner
    refuses a batch that captures hidden states for the draft. On 0.5.17 the speculative servers
    prefill from graphs too. Part of why R at 128 (one burst of 128 admissions a run) sits under 0.97
    on 0.5.12 while the steady steps are base's; not measured apart."""
    logs = members(S20_TPUT["0.5.12-v2"] / "logs.tar.xz", "base-sim.log", "always-on-sim.log", "dynspec-sim.log")
    counts = {name: prefill_graphs(log) for name, log in logs.items()}
    assert counts["base-sim.log"] == (219, 0)
    assert counts["always-on-sim.log"][0] == counts["dynspec-sim.log"][0] == 0
    assert min(counts["always-on-sim.log"][1], counts["dynspec-sim.log"][1]) > 150
    later = members(S20_TPUT["0.5.17"] / "logs.tar.xz", "always-on-sim.log", "dynspec-sim.log")
    assert all(graphed > 200 and eager <= 1 for graphed, eager in map(prefill_graphs, later.values()))  # the control


# -- session 21: r19 / r32 (unchanged since session 19); 0.5.12's target prefill from its piecewise graphs --

PREFILL_GRAPH = {"DYNSPEC_PREFILL_GRAPH": "1"}
PREFILL_GRAPH_LINE = "dynspec: the target's prefill replays its piecewise CUDA graphs"
S21_GRAPH_KV = PROOF / "0.5.12-v2-s21-r32-prefill-graph-proof"
S21_GRAPH_TPUT = PROOF / "0.5.12-v2-s21-r32-prefill-graph-tput"
S21_TPUT_17 = PROOF / "0.5.17-v2-s21-r32-tput"
S21_ITER_17 = PROOF / "0.5.17-v2-s21-r32-iter"
S21_REAL = PROOF / "real-0.5.12-v2-s21-r32-proof"
QUICK_HEAD_SHA256 = "2070657de0d0387f226184f5a5828c70f482e081b3eca9e733ff07a3ee44b918"


def test_session_21_dynspec_prefills_from_piecewise_graphs_with_outputs_and_draft_kv_unchanged() -> None:
    """DYNSPEC_PREFILL_GRAPH=1 on 0.5.12 v2 (fresh machine, 5 servers 3 at a time): every dynspec
    server says so at start-up and replays its prefills from the piecewise graphs, as base does and
    always-on does not; equivalence at C = 1, 4, 16, 48 and exact_kv (1128 proposals of 16 requests,
    the control differs at 27) pass with it."""
    report = report_of(S21_GRAPH_KV, PREFILL_GRAPH, S19_REVISIONS)
    assert report["dynspec_revisions"]["piecewise_graph_dynspec_prefill"] == 2
    assert report["equivalence"]["passed"] and report["checks"] == ["equivalence", "exact_kv"]
    recs, files = kv_proof_recordings(S21_GRAPH_KV)
    entry = exactkv.judge(recs, {name: ["same"] for name in recs}, 100, [])
    assert entry["passed"] and {k: entry[k] for k in COUNTS} == {k: report["exact_kv"][k] for k in COUNTS}
    assert (entry["compared_requests"], entry["compared_steps"], entry["control_mismatches"]) == (16, 1128, 27)
    assert not exactkv.judge({**recs, "kv": recs["skip"]}, {n: ["same"] for n in recs}, 100, [])[
        "passed"
    ]  # negative control
    logs = members(
        S21_GRAPH_KV / "logs.tar.xz", "base.log", "always-on.log", "dynspec.log", "dynspec-full.log", "dynspec-skip.log"
    )
    counts = {name: prefill_graphs(log) for name, log in logs.items()}
    assert counts == {
        "base.log": (7, 0),
        "always-on.log": (0, 7),
        "dynspec.log": (12, 0),
        "dynspec-full.log": (8, 0),
        "dynspec-skip.log": (8, 0),
    }
    assert [name for name, log in logs.items() if PREFILL_GRAPH_LINE in log] == [
        "dynspec.log",
        "dynspec-full.log",
        "dynspec-skip.log",
    ]


def test_session_21_prefill_graphs_bring_0_5_12s_mixed_load_to_the_oracle() -> None:
    """kv-tput on 0.5.12 v2 with DYNSPEC_PREFILL_GRAPH=1, the servers taking turns (interleaved),
    mixed load median of 5: dynspec 10.61 s against an oracle of 10.62 s (0.9995x; session 20
    without it: 1.032x); per step 0.982 / 0.991 at 64 / 128; R(C) still under 0.97 at 64 and 128
    (0.961 / 0.966), where dynspec is off and judged against base."""
    report = report_of(S21_GRAPH_TPUT, PREFILL_GRAPH, S19_REVISIONS)
    tput, load = report["throughput"], report["mixed_load"]
    assert tput["envelope_ratio"] == [1.0018, 1.0837, 1.0183, 0.9754, 0.9607, 0.9662] and not tput["passed"]
    assert tput["order"].startswith("interleaved") and load["order"].startswith("interleaved")
    logs, _ = published_per_step(
        S21_GRAPH_TPUT, tput, {"64": (0.982, 63), "128": (0.991, 40)}, "base-sim.log", "always-on-sim.log"
    )
    assert (load["passed"], load["dynspec_over_oracle"], load["repeats"]) == (True, 0.9995, 5)
    assert load["seconds"] == {k: statistics.median(v) for k, v in load["samples"].items()}
    assert load["seconds"]["dynspec"] < min(load["seconds"]["base"], load["seconds"]["always_on"])
    counts = {name: prefill_graphs(log) for name, log in logs.items()}
    assert counts == {"base-sim.log": (318, 0), "always-on-sim.log": (0, 260), "dynspec-sim.log": (295, 0)}
    before = s20_report(S20_TPUT["0.5.12-v2"])["mixed_load"]
    assert not before["passed"] and before["dynspec_over_oracle"] > 1.03  # the same check failed without it


def test_session_21_0_5_17_passes_r_at_every_level_and_misses_the_mixed_load() -> None:
    """kv-tput on 0.5.17, interleaved, mixed load median of 5: R(C) >= 0.97 at all six levels for the
    first time (min 0.978), per step 0.974 / 0.988 at 64 / 128 (the issue's 0.98 missed at 64), the
    mixed load 1.048x the oracle (session 20: 1.012x): dynspec's passes spread 9.60 - 10.17 s, and
    its phase at 128 requests 2.01 - 2.51 s, where base's spread 1.97 - 2.51."""
    report = s20_report(S21_TPUT_17)
    tput, load = report["throughput"], report["mixed_load"]
    assert tput["passed"] and min(tput["envelope_ratio"]) == 0.9783 and len(tput["levels"]) == 6
    published_per_step(S21_TPUT_17, tput, {"64": (0.974, 63), "128": (0.988, 39)})
    assert (load["passed"], load["dynspec_over_oracle"]) == (False, 1.0476)
    assert (min(load["samples"]["dynspec"]), max(load["samples"]["dynspec"])) == (9.601, 10.173)
    text = (S21_TPUT_17 / "proof.txt").read_text()
    at_128 = {
        name: [
            float(line.split("(phases ")[1].split()[4]) for line in text.splitlines() if f"{name} mixed load:" in line
        ]
        for name in ("dynspec-sim", "base-sim")
    }
    assert (min(at_128["dynspec-sim"]), max(at_128["dynspec-sim"])) == (2.01, 2.51)
    assert (min(at_128["base-sim"]), max(at_128["base-sim"])) == (1.97, 2.51)
    assert not s20_report(S20_TPUT["0.5.17"])["throughput"]["passed"]  # the same check failed in session 20


ITERATION_LINE = re.compile(
    r"Decode batch, #running-req: (\d+), .*?(?:accept len: ([\d.]+), .*?)?gen throughput \(token/s\): ([\d.]+)"
)


def iteration_ms(log: str, running: int) -> list[float]:
    """Each logged decode iteration's duration at ``running`` requests, from a log written with
    --decode-log-interval 1: the tokens of that iteration over the speed it logged."""
    out = []
    for line in log.splitlines():
        match = ITERATION_LINE.search(line)
        if match and int(match.group(1)) == running:
            out.append(running * float(match.group(2) or 1) / float(match.group(3)) * 1000)
    return out


def test_session_21_one_logged_iteration_at_a_time_the_0_5_17_fallback_costs_0_1_to_0_2_ms_more() -> None:
    """The mixed load again with every iteration logged, cut by the end of the device budget before
    any pass total was printed: per iteration (median) dynspec 5.762 ms against base's 5.594 at 64
    requests (0.971) and 6.476 against 6.374 at 128 (0.984); at 1, 4 and 16 requests, speculating,
    dynspec and always-on take the same time within 0.5 %."""
    report = json.loads((S21_ITER_17 / "report.json").read_text())
    assert report["complete"] is False and report["checks"] == ["mixed_load"] and report["dynspec_env"] == {}
    logs = members(S21_ITER_17 / "logs.tar.xz", "base-sim.log", "dynspec-sim.log", "always-on-sim.log")
    median = {
        (name, c): statistics.median(iteration_ms(log, c)) for name, log in logs.items() for c in (1, 4, 16, 64, 128)
    }
    assert round(median["base-sim.log", 64], 3) == 5.594 and round(median["dynspec-sim.log", 64], 3) == 5.762
    assert round(median["base-sim.log", 128], 3) == 6.374 and round(median["dynspec-sim.log", 128], 3) == 6.476
    for c in (1, 4, 16):
        assert abs(median["dynspec-sim.log", c] / median["always-on-sim.log", c] - 1) < 0.005
        assert (
            median["base-sim.log", c] < 0.8 * median["dynspec-sim.log", c]
        )  # negative control: a plain step is shorter
    assert "--decode-log-interval 1" in (S21_ITER_17 / "proof.txt").read_text()


def test_session_21_real_weights_give_base_tokens_where_dynspec_is_off_on_0_5_12_v2() -> None:
    """r32 on real weights on 0.5.12 v2 (the last path without it), with the quick CPU head
    (sha256 2070657d..., held-out acceptance 1.31: enough for equivalence, not for acceptance) and
    the runtime's defaults: base repeated itself, dynspec gave base's tokens where off and
    always-on's where it speculated, over 100 crossings; the same tokens as session 18's head gave."""
    report = s20_report(S21_REAL)
    assert report["model_sha256"]["head"] == QUICK_HEAD_SHA256
    digests = real_weights_follow_their_mode(report)
    assert digests == json.loads((S18_REAL / "report.json").read_text())["equivalence"]["digests"]
    log = members(S21_REAL / "logs.tar.xz", "dynspec.log")["dynspec.log"]
    assert DIRECT_READY in log and STREAM_LINE in log and PREFILL_GRAPH_LINE not in log


# -- session 22: r19 / r32 on the GPU (v2 module r33 since: the stream on by default on 0.5.14+) --

S22_STREAM_KV = PROOF / "0.5.17-v2-s22-r32-stream-proof"
S22_STREAM_TPUT = PROOF / "0.5.17-v2-s22-r32-stream-tput"
S22_KV_12 = {"v2": PROOF / "0.5.12-v2-s22-r32-r3-proof", "v1": PROOF / "0.5.12-v1-s22-r32-r3-proof"}
S22_V1_EAGER = PROOF / "0.5.12-v1-s22-r32-nograph-exactkv"
S22_ADMISSION = PROOF / "0.5.12-v2-s22-admission-profile"
STREAM_ON = {"DYNSPEC_KV_STREAM": "1"}
KV_PROOF_LOGS = ("base.log", "always-on.log", "dynspec.log", "dynspec-full.log", "dynspec-skip.log")


def test_session_22_the_stream_on_0_5_17_keeps_outputs_and_the_draft_kv_exact() -> None:
    """DYNSPEC_KV_STREAM=1 on 0.5.17 (fresh machine, 3 servers at a time): the dynspec server wrote
    the draft KV on a stream of its own, and equivalence, 100 crossings and exact_kv (1078 / 1078,
    the control differs at 32) pass with it."""
    report = report_of(S22_STREAM_KV, STREAM_ON, S19_REVISIONS)
    _, files, found = passed_kv_proof(S22_STREAM_KV)
    assert found == {"compared_requests": 16, "compared_steps": 1078, "control_differs": True}
    assert report["exact_kv"]["control_mismatches"] == 32
    assert STREAM_LINE in files["dynspec.log"]
    assert STREAM_LINE not in files["dynspec-full.log"]  # negative control: the full extend writes nothing directly


def test_session_22_with_the_stream_0_5_17_passes_the_mixed_load_and_misses_r_at_64_by_a_quarter_point() -> None:
    """kv-tput on 0.5.17 with the stream, interleaved, mixed load median of 5: per step 0.976 / 0.997
    at 64 / 128 (session 21 without: 0.974 / 0.988), mixed load 1.027x the oracle (session 21:
    1.048x), R(C) 0.9676 at 64 (session 21: 0.98): one level's median of 3 moves by more than
    the stream gains."""
    report = report_of(S22_STREAM_TPUT, STREAM_ON, S19_REVISIONS)
    tput, load = report["throughput"], report["mixed_load"]
    assert tput["envelope_ratio"] == [0.9912, 0.9752, 0.9934, 0.9902, 0.9676, 0.9811] and not tput["passed"]
    logs, ratios = published_per_step(S22_STREAM_TPUT, tput, {"64": (0.976, 64), "128": (0.997, 39)})
    before = s20_report(S21_TPUT_17)["throughput"]["per_step"]["dynspec"]
    assert ratios["dynspec"]["128"]["median"] - before["128"]["median"] > 0.005
    assert (load["passed"], load["dynspec_over_oracle"], load["repeats"]) == (True, 1.0274, 5)
    assert load["seconds"] == {k: statistics.median(v) for k, v in load["samples"].items()}
    assert load["seconds"]["dynspec"] < min(load["seconds"]["base"], load["seconds"]["always_on"])
    assert (
        STREAM_LINE in logs["dynspec-sim.log"]
        and STREAM_LINE not in members(S21_TPUT_17 / "logs.tar.xz", "dynspec-sim.log")["dynspec-sim.log"]
    )


def test_session_22_0_5_12_v2_with_the_prefill_graphs_by_default_keeps_outputs_and_the_draft_kv_exact() -> None:
    """Patch r3 (the prefill graphs on, nothing set): equivalence, 100 crossings and exact_kv (1086 /
    1086, the control differs at 27) on 0.5.12 v2; every dynspec prefill from a graph, always-on's
    eager."""
    report = report_of(S22_KV_12["v2"], {}, S19_REVISIONS)
    assert report["dynspec_revisions"]["piecewise_graph_dynspec_prefill"] == 3
    _, files, found = passed_kv_proof(S22_KV_12["v2"])
    assert found == {"compared_requests": 16, "compared_steps": 1086, "control_differs": True}
    logs = members(S22_KV_12["v2"] / "logs.tar.xz", *KV_PROOF_LOGS)
    assert {n: prefill_graphs(log) for n, log in logs.items()} == {
        "base.log": (7, 0), "always-on.log": (0, 7), "dynspec.log": (273, 0), "dynspec-full.log": (8, 0), "dynspec-skip.log": (8, 0),
    }  # fmt: skip
    assert [n for n, log in logs.items() if PREFILL_GRAPH_LINE in log] == [
        "dynspec.log",
        "dynspec-full.log",
        "dynspec-skip.log",
    ]


def test_session_22_v1_prefills_from_graphs_and_crosses_but_three_cycles_leave_the_control_no_teeth() -> None:
    """0.5.12 v1, patch r3: equivalence and 100 crossings pass and every dynspec prefill ran from a
    graph. exact_kv fails as it must when its control cannot fail: the no-write control proposed
    what the full extend did at all 1082 positions, and so it did again with the graphs off (1072).
    The load had 3 cycles (the default then); v1's runs with 5 always saw the control differ (26 - 58,
    sessions 12 - 16), so 5 is the default since. The write under test equalled the full extend everywhere."""
    for evidence, env, compared in ((S22_KV_12["v1"], {}, 1082), (S22_V1_EAGER, {"DYNSPEC_PREFILL_GRAPH": "0"}, 1072)):
        report = report_of(evidence, env, S19_REVISIONS)
        recs, files = kv_proof_recordings(evidence)
        entry = exactkv.judge(recs, {name: ["same"] for name in recs}, 100, [])
        assert not entry["passed"] and not report["exact_kv"]["passed"]
        assert (entry["control_mismatches"], entry["control_compared_steps"], entry["mismatches"]) == (0, compared, 0)
        assert report["exact_kv"]["load"]["cycles"] == 3
    v1 = json.loads((S22_KV_12["v1"] / "report.json").read_text())
    assert v1["equivalence"]["passed"] and v1["crossings"]["passed"] and v1["crossings"]["count"] >= 100
    logs = members(S22_KV_12["v1"] / "logs.tar.xz", "dynspec.log", "always-on.log")
    assert prefill_graphs(logs["dynspec.log"]) == (253, 0) and prefill_graphs(logs["always-on.log"]) == (0, 7)
    assert prefill_graphs(members(S22_V1_EAGER / "logs.tar.xz", "dynspec.log")["dynspec.log"]) == (0, 8)
    earlier = json.loads((PROOF / "0.5.12-v1-s16-r23-proof-bits" / "report.json").read_text())["exact_kv"]
    assert (earlier["load"]["cycles"], earlier["control_mismatches"]) == (5, 32)
    assert DEFAULTS.exact_kv_cycles == 5


def test_session_22_at_admission_the_own_fallbacks_extra_time_is_mostly_idle_gpu() -> None:
    """PROF_AT=admission on 0.5.12 v2 (40 steps from before 64 requests arrive, GPU only, under the
    profiler): dynspec's steps span 1041 us more than base's, 887 us of it idle, 600 us of that in
    gaps of 100 us or more; its host made 3.5 graph launches, 42.6 kernel launches and 30 event
    queries a step against base's 4.2, 25.2 and 2.1. The 40 steps cover different parts of the two
    bursts (base ran 3.2 extend-attention kernels a step, dynspec 1.6), so no line is matched."""
    base, dyn = ((S22_ADMISSION / f"{n}-gpu.txt").read_text() for n in ("base", "dyn"))
    (b_span, _, b_idle), (d_span, _, d_idle) = per_step_span(base), per_step_span(dyn)
    assert (d_span - b_span, d_idle - b_idle) == (1041, 887)

    def long_gaps(table: str) -> float:
        return float(re.search(r">=100us (\d+)", table).group(1))  # type: ignore[union-attr]

    assert long_gaps(dyn) - long_gaps(base) == 600
    assert long_gaps(base) < 0.4 * b_idle  # negative control: base's idle is mostly short gaps


# -- session 24 (no GPU): mixed_load's verdict ratio and the oracle's own statistic, from committed reports --

# report directory: (the verdict's ratio, dynspec's sum of per-phase medians over the oracle), as docs/proof says
MIXED_BY_PHASE = {
    "0.5.17-v2-s22-r32-stream-tput": (1.027, 1.005),
    "0.5.17-v2-s21-r32-tput": (1.048, 1.039),
    "0.5.17-v2-s20-r32-tput": (1.012, 1.001),
    "0.5.17-v2-s10-kv-batch4-throughput": (1.027, 1.021),
    "0.5.17-v2-s6-kv-direct-throughput": (1.020, 0.997),
    "0.5.17-v2-s5-kv-graph-throughput": (1.042, 1.040),
    "0.5.12-v2-s25-r22-lean-tput": (1.025, 1.010),
    "0.5.12-v2-s21-r32-prefill-graph-tput": (1.000, 0.998),
    "0.5.12-v2-s20-r32-tput": (1.032, 1.025),
    "0.5.12-v2-s18-r28-tput": (1.030, 1.016),
    "0.5.12-v2-s16-r23-tput": (1.035, 1.019),
    "0.5.12-v2-s15-r16-prefill-kv-tput": (1.006, 0.995),
    "0.5.12-v2-s12-every-iteration-throughput": (1.041, 1.032),
    "0.5.12-v2-s11-kv-direct-throughput": (1.040, 1.044),
    "0.5.12-v1-s14-r15-mixed": (1.082, 1.070),
}


def by_phase(mixed: dict) -> float:
    return sum(row["dynspec_s"] for row in mixed["phases"]) / mixed["oracle_seconds"]


@pytest.mark.parametrize("name", sorted(MIXED_BY_PHASE))
def test_session_24_mixed_load_read_by_phase_as_the_oracle_is(name: str) -> None:
    """The oracle is a sum of per-phase medians; so is the by-phase reading of dynspec, recomputed
    from each committed report's phases (the verdict's ratio divides its median pass total)."""
    mixed = json.loads((PROOF / name / "report.json").read_text())["mixed_load"]
    verdict, phased = MIXED_BY_PHASE[name]
    assert round(mixed["seconds"]["dynspec"] / mixed["oracle_seconds"], 4) == mixed["dynspec_over_oracle"]
    assert mixed["dynspec_over_oracle"] == pytest.approx(verdict, abs=5e-4)  # as the docs round it
    assert round(by_phase(mixed), 3) == phased
    assert mixed["oracle_seconds"] == pytest.approx(sum(row["oracle_s"] for row in mixed["phases"]), abs=0.002)
    # The control: the same reading with one phase a tenth of a second slower moves the third decimal.
    slower = {
        **mixed,
        "phases": [{**mixed["phases"][0], "dynspec_s": mixed["phases"][0]["dynspec_s"] + 0.1}, *mixed["phases"][1:]],
    }
    assert round(by_phase(slower), 3) != phased


# -- session 24 (runtime r22 / v2 module r39 at 9a5acee): v1's exact_kv with the write ahead of the sync --

S24_REVISIONS = {"speculative_dynspec_runtime": 22, "speculative_dynspec_v2": 39}
S24_V1_EXACT = PROOF / "0.5.12-v1-s24-r22-exactkv"


def test_session_24_v1s_lean_step_writing_ahead_of_its_sync_leaves_the_full_extends_draft_kv() -> None:
    """KV_CHECKS=exact_kv on 0.5.12 v1, 5 cycles (fresh machine, 3 servers at a time): the server under
    test ran the lean step with its write queued before the sync ("before it" in its start-up line),
    and its 1988 proposals after a fallback span equal the full extend's; the no-write control
    differs at 32 of 1980 (so the check has teeth, unlike session 22's 3-cycle load)."""
    report = report_of(S24_V1_EXACT, {}, S24_REVISIONS)
    recs, files = kv_proof_recordings(S24_V1_EXACT)
    entry = exactkv.judge(recs, {name: ["same"] for name in recs}, 100, [])
    assert entry["passed"] and report["exact_kv"]["passed"] and report["exact_kv"]["load"]["cycles"] == 5
    assert {k: entry[k] for k in COUNTS} == {"compared_requests": 28, "compared_steps": 1988, "control_differs": True}
    assert (entry["control_mismatches"], entry["control_compared_steps"]) == (32, 1980)
    assert not exactkv.judge({**recs, "kv": recs["skip"]}, {n: ["same"] for n in recs}, 100, [])[
        "passed"
    ]  # the control as the candidate
    ran = "runs as a plain decode step (the target's argmax, one host sync, the draft KV written directly, before it)"
    assert ran in files["dynspec.log"] and ran not in files["dynspec-full.log"]
    env = {s["name"]: s["env"] for s in report["servers"]}
    assert env["dynspec-full"]["DYNSPEC_LEAN_VERIFY"] == "0" and "DYNSPEC_WRITE_AHEAD" not in env["dynspec"]


S24_DIAG = {"a": PROOF / "0.5.12-v1-s24-r22-ahead-diag-a", "b": PROOF / "0.5.12-v1-s24-r22-ahead-diag-b"}
AHEAD_SAID = "the draft KV written directly, before it)"
AFTER_SAID = "the draft KV written directly, after it, DYNSPEC_WRITE_AHEAD=0)"


@pytest.mark.parametrize(
    ("call", "published"),
    [
        ("a", {"ahead": (0.952, 0.94), "after": (0.955, 0.941), "ahead-2": (1.034, 1.064)}),
        ("b", {"after": (0.896, 0.977), "ahead": (0.988, 0.996), "base-2": (1.012, 1.028)}),
    ],
)
def test_session_24_v1s_step_with_the_write_ahead_of_its_sync_and_after_it(call: str, published: dict) -> None:
    """`diag` on 0.5.12 v1 (every server without overlap), per step against the no-overlap base at
    64 / 100 requests: call a on a fresh machine (base, ahead, after, ahead-2), call b right after
    on the warm one, the A/B reversed (base, after, ahead, base-2). Each dynspec server said which
    it ran. The control: a server's log against itself reads 1."""
    logs = diag_logs_with_medians(S24_DIAG[call], published)
    for name in published:
        if name.startswith("ahead"):
            assert AHEAD_SAID in logs[name] and AFTER_SAID not in logs[name], name
        elif name == "after":
            assert AFTER_SAID in logs[name] and AHEAD_SAID not in logs[name]
        else:
            assert "plain decode step" not in logs[name]  # a second plain-decode reference
    assert ratio_against_itself(logs["after"]) == 1.0
    if call == "b":  # against the second base, measured last
        again = steps.per_step(logs, "base-2", [64, 100])
        assert json.loads((S24_DIAG["b"] / "per_step_base-2.json").read_text()) == again
        assert {n: (again[n]["64"]["median"], again[n]["100"]["median"]) for n in ("ahead", "after")} == {
            "ahead": (0.967, 0.968),
            "after": (0.887, 0.95),
        }


# -- session 25 (runtime r22 / v2 module r39 at c38f108): 0.5.12's lean v2 step on a GPU; v1 end to end --

S25_LEAN = {"proof": PROOF / "0.5.12-v2-s25-r22-lean-proof", "tput": PROOF / "0.5.12-v2-s25-r22-lean-tput"}
S25_V1 = {"proof": PROOF / "0.5.12-v1-s25-r22-proof", "tput": PROOF / "0.5.12-v1-s25-r22-tput"}
LEAN_ON = {"DYNSPEC_LEAN_STEP": "1"}
LEAN_V2_SAID = "a fallback iteration of a greedy batch runs as a plain decode step (DYNSPEC_LEAN_STEP=1"
LEAN_V2_TOOK = "the lean fallback step took its first batch"
LEAN_PREFILL_TOOK = "the lean KV-only prefill took its first wave"


def test_session_25_the_lean_v2_step_keeps_outputs_and_the_draft_kv_exact_on_0_5_12() -> None:
    """DYNSPEC_LEAN_STEP=1 on 0.5.12 v2 (warm machine, 3 servers at a time): the server under test ran
    the lean step and the lean KV-only prefill, and equivalence, 100 crossings and exact_kv (1834 /
    1834, the control differs at 58) pass; the full-extend reference said the step does not apply."""
    report = report_of(S25_LEAN["proof"], LEAN_ON, S24_REVISIONS)
    _, files, found = passed_kv_proof(S25_LEAN["proof"])
    assert found == {"compared_requests": 28, "compared_steps": 1834, "control_differs": True}
    assert (report["exact_kv"]["control_mismatches"], report["crossings"]["count"]) == (58, 100)
    assert all(said in files["dynspec.log"] for said in (LEAN_V2_SAID, LEAN_V2_TOOK, LEAN_PREFILL_TOOK))
    assert LEAN_V2_TOOK not in files["dynspec-full.log"]  # negative control: the reference ran the stock branch
    assert "kv-direct does not write this server's draft KV" in files["dynspec-full.log"]


def test_session_25_with_the_lean_v2_step_r_passes_at_64_and_misses_at_128_by_one_runs_admission() -> None:
    """kv-tput on 0.5.12 v2 with DYNSPEC_LEAN_STEP=1 (fresh machine, interleaved, mixed load median
    of 5): R 0.975 / 0.961 at 64 / 128 (session 21 without the lean step: 0.961 / 0.966), per step
    0.980 / 0.999 (0.982 / 0.991); mixed load PASS 1.025x. At 128 one of dynspec's three runs spent
    711 ms outside its steady steps (the others 306 and 191; base 255, 136, 252)."""
    report = report_of(S25_LEAN["tput"], LEAN_ON, S24_REVISIONS)
    tput, load = report["throughput"], report["mixed_load"]
    assert tput["envelope_ratio"] == [1.0064, 1.0329, 1.0189, 1.0617, 0.9753, 0.9613] and not tput["passed"]
    logs, _ = published_per_step(S25_LEAN["tput"], tput, {"64": (0.98, 60), "128": (0.999, 38)}, "dynspec-sim.log")
    assert tput["outside_steady_ms"]["dynspec"]["128"] == [306, 191, 711]
    assert (load["passed"], load["dynspec_over_oracle"], load["repeats"]) == (True, 1.0248, 5)
    assert load["seconds"] == {k: statistics.median(v) for k, v in load["samples"].items()}
    assert LEAN_V2_TOOK in logs["dynspec-sim.log"] and LEAN_V2_TOOK not in logs["base-sim.log"]
    before = json.loads((PROOF / "0.5.12-v2-s21-r32-prefill-graph-tput" / "report.json").read_text())["throughput"]
    assert before["envelope_ratio"][4] < 0.97 <= tput["envelope_ratio"][4]


def test_session_25_v1_on_r22_keeps_outputs_and_crosses() -> None:
    """KV_CHECKS=equivalence,crossings on 0.5.12 v1 (r22, its exact_kv ran in session 24): the lean
    step wrote the draft KV ahead of its sync, and both checks pass."""
    report = report_of(S25_V1["proof"], {}, S24_REVISIONS)
    assert report["equivalence"]["passed"] and report["crossings"]["passed"] and report["crossings"]["count"] == 100
    logs = members(S25_V1["proof"] / "logs.tar.xz", "dynspec.log", "base.log")
    assert AHEAD_SAID in logs["dynspec.log"] and AHEAD_SAID not in logs["base.log"]


def test_session_25_v1s_fallback_step_is_a_plain_step_without_overlap_end_to_end() -> None:
    """v1's kv-tput at 64 / 128 on r22 (dynspec measured beside two idle servers, the no-overlap base
    alone after them): R against max(no-overlap base, always-on) 1.00 / 1.06, per step against the
    no-overlap base 1.008 / 1.063 (session 20 on r19: 0.89 / 0.90 and 0.90 / 0.935)."""
    report = report_of(S25_V1["tput"], {}, S24_REVISIONS)
    tput = report["throughput"]
    assert tput["passed"] and tput["judged_against"] == "base_no_overlap" and tput["levels"] == [64, 128]
    assert tput["envelope_ratio_no_overlap"] == [1.0015, 1.058]
    best = [max(b, a) for b, a in zip(tput["base_no_overlap"], tput["always_on"])]
    assert [round(d / b, 4) for d, b in zip(tput["dynspec"], best)] == tput["envelope_ratio_no_overlap"]
    logs = members(S25_V1["tput"] / "logs.tar.xz", "base-no-overlap-sim.log", "dynspec-sim.log")
    ratios = steps.per_step(
        {"plain": logs["base-no-overlap-sim.log"], "dynspec": logs["dynspec-sim.log"]}, "plain", [64, 128]
    )
    assert tput["per_step_no_overlap"] == {"dynspec": ratios["dynspec"]}
    assert {c: r["median"] for c, r in ratios["dynspec"].items()} == {"64": 1.008, "128": 1.063}
    assert ratio_against_itself(logs["base-no-overlap-sim.log"]) == 1.0  # negative control
    then = s20_report(S20_TPUT["0.5.12-v1"])["throughput"]["per_step_no_overlap"]["dynspec"]
    assert all(then[c]["median"] < 0.97 <= ratios["dynspec"][c]["median"] for c in ("64", "128"))


def phases_over_oracle(evidence: Path, above: bool) -> float:
    """dynspec's summed phase medians over the oracle's, for the phases above the threshold (32) or below it."""
    rows = [
        r for r in json.loads((evidence / "report.json").read_text())["mixed_load"]["phases"] if (r["C"] > 32) == above
    ]
    return round(sum(r["dynspec_s"] for r in rows) / sum(r["oracle_s"] for r in rows), 3)


def test_session_25_the_lean_steps_mixed_load_differs_from_session_21s_below_the_threshold() -> None:
    """Mixed load 1.025x (lean step) against session 21's 1.000x (without): above the threshold, where
    the lean step runs, both read 1.047x / 1.043x their phases' oracle; below it, where both servers
    speculate with the same code, 0.973x against 0.951x."""
    before = PROOF / "0.5.12-v2-s21-r32-prefill-graph-tput"
    assert (phases_over_oracle(S25_LEAN["tput"], True), phases_over_oracle(before, True)) == (1.047, 1.043)
    assert (phases_over_oracle(S25_LEAN["tput"], False), phases_over_oracle(before, False)) == (0.973, 0.951)
    assert phases_over_oracle(S25_LEAN["tput"], True) != phases_over_oracle(
        S25_LEAN["tput"], False
    )  # the split matters


S7_PROFILE_17 = PROOF / "0.5.17-v2-s7-profile"


def small_kernels(table: str) -> tuple[float, float]:
    """(us per step, launches per step) of the kernels under 5 us a launch in trace_sum's GPU work."""
    small = [(us, n) for us, n, _ in gpu_rows(table) if us / n < 5]
    return round(sum(us for us, _ in small), 1), round(sum(n for _, n in small), 1)


def test_session_25_reading_session_7s_0_5_17_profile_the_extra_step_is_gpu_work() -> None:
    """0.5.17's only GPU profile (session 7, r10 / r14, 64 requests, GPU only): in the call whose GPU
    never waited on the host (idle 342 us a step against base's 350) dynspec's step was 176 us more
    busy, the size of the 0.17 ms the iteration logs of session 21 found. Of it, about 76 us are 49
    more small kernels a step (under 5 us each) and one more launch of each of the target's two
    GEMM kernels the draft's KV-only layer shares (fc and QKV). So the gap is GPU work, which a
    stream beside the next forward cannot hide when the GPU has no gap to put it in."""
    base, call1, call2 = (
        (S7_PROFILE_17 / f"{n}.txt").read_text() for n in ("base-gpu", "dyn-gpu-call1", "dyn-gpu-call2")
    )
    (_, b_busy, b_idle), (_, d_busy, d_idle) = per_step_span(base), per_step_span(call2)
    assert (d_busy - b_busy, b_idle, d_idle) == (176, 350, 342)
    assert per_step_span(call1)[1] - b_busy == 85 and per_step_span(call1)[2] > 1000  # that call waited on the host
    (b_us, b_n), (d_us, d_n) = small_kernels(base), small_kernels(call2)
    assert (round(d_us - b_us, 1), round(d_n - b_n, 1)) == (76.0, 49.0)
    assert 0 < d_us - b_us < d_busy - b_busy  # the small kernels are part of the extra, not all of it

    def launches(table: str, prefix: str) -> float:
        return next(n for _, n, name in gpu_rows(table) if name.startswith(prefix))

    for gemm in ("nvjet_sm90_tst_96x64", "nvjet_sm90_tst_64x64"):
        assert (launches(base, gemm), launches(call2, gemm)) == (32.0, 33.0)
    assert launches(call2, "nvjet_sm90_tst_256x64") == 32.0  # the target's own GEMM: no extra launch


# -- session 26 (runtime r22 / v2 module r40 at 6707982): 0.5.17 and 0.5.13 on the final runtime --

S26_REVISIONS = {"speculative_dynspec_runtime": 22, "speculative_dynspec_v2": 40}
S26_17 = {n: PROOF / f"0.5.17-v2-s26-r22-{n}" for n in ("proof", "tput", "profile")}
S26_13 = PROOF / "0.5.13-v2-s26-r22-proof"
STREAM_SAID = "kv-direct writes the draft KV on a stream of its own"


@pytest.mark.parametrize(
    ("evidence", "compared_steps", "graph_prefills"),
    [(S26_17["proof"], 1828, False), (S26_13, 1856, True)],
    ids=["0.5.17", "0.5.13"],
)
def test_session_26_the_final_runtime_keeps_outputs_and_the_draft_kv_exact(
    evidence: Path, compared_steps: int, graph_prefills: bool
) -> None:
    """kv-proof on r22 / r40 with nothing set (3 servers at a time): equivalence, 100 crossings and
    exact_kv pass on 0.5.17 (zero-step state) and 0.5.13 (own fallback), the no-write control
    differing at 32 steps on each; the server under test wrote the draft KV on its own stream, the
    full-extend reference did not. 0.5.13 replayed its target prefill graphs (piecewise patch)."""
    report = report_of(evidence, {}, S26_REVISIONS)
    _, files, found = passed_kv_proof(evidence)
    assert found == {"compared_requests": 28, "compared_steps": compared_steps, "control_differs": True}
    assert (report["exact_kv"]["control_mismatches"], report["crossings"]["count"]) == (32, 100)
    assert STREAM_SAID in files["dynspec.log"] and STREAM_SAID not in files["dynspec-full.log"]
    said = "the target's prefill replays its piecewise CUDA graphs"
    assert (said in files["dynspec.log"]) is graph_prefills


def test_session_26_0_5_17s_fallback_step_reads_0_98_of_plain_decode_and_r_misses_by_a_third_of_a_point() -> None:
    """kv-tput on 0.5.17 (warm machine, interleaved, mixed load median of 5): per step 0.983 / 0.992
    at 64 / 128 (61 / 38 pairs; sessions 20 - 22 read 0.974 - 0.978 at 64); R 0.9667 / 0.9671. At 64
    the runs' steady speeds (0.982 of base's) and time outside them (185 ms median against 160)
    model R as 0.969, and the steady speeds alone as 0.984; mixed load PASS 1.008x (1.005x by phase)."""
    report = report_of(S26_17["tput"], {}, S26_REVISIONS)
    tput, load = report["throughput"], report["mixed_load"]
    assert tput["envelope_ratio"] == [0.995, 0.9921, 0.9948, 0.9851, 0.9667, 0.9671] and not tput["passed"]
    published_per_step(S26_17["tput"], tput, {"64": (0.983, 61), "128": (0.992, 38)}, "dynspec-sim.log")
    # R at 64 from its two parts: 16384 tokens at each server's median steady speed, plus its median time outside it.
    outside = {s: statistics.median(tput["outside_steady_ms"][s]["64"]) / 1000 for s in ("base", "dynspec")}
    steady = {s: statistics.median(tput["per_run"][s]["64"][1:]) for s in ("base", "dynspec")}  # the warm-up first
    modelled = {s: 64 * 256 / (64 * 256 / steady[s] + outside[s]) for s in ("base", "dynspec")}
    assert round(modelled["dynspec"] / modelled["base"], 3) == 0.969 and (outside["dynspec"], outside["base"]) == (
        0.185,
        0.16,
    )
    assert round(steady["dynspec"] / steady["base"], 3) == 0.982
    steady_only = 64 * 256 / (64 * 256 / steady["dynspec"] + outside["base"])  # the control: base's time outside
    assert round(steady_only / modelled["base"], 3) == 0.984
    assert (load["passed"], load["dynspec_over_oracle"], load["dynspec_over_oracle_by_phase"], load["repeats"]) == (
        True,
        1.008,
        1.0054,
        5,
    )
    assert load["seconds"] == {k: statistics.median(v) for k, v in load["samples"].items()}


def profiled_at_tokens(log: str) -> int:
    """The KV size (#token) of the last decode log line before the first profile started."""
    before = log.split("Profiling starts", 1)[0]
    return int(re.findall(r"Decode batch, #running-req: 64, #token: (\d+)", before)[-1])


def test_session_26_0_5_17s_profile_the_fallback_step_is_its_two_gemms_and_small_kernels() -> None:
    """0.5.17 at 64 requests, base then dynspec (30 steps, GPU only), idle per step 295 / 377 us:
    dynspec's step has one more launch of each GEMM kernel the KV-only draft layer shares with the
    target (fc and QKV, 64 us), and 33 more launches of small kernels (under 5 us each, 59 us: the
    draft layer's norms, rope and KV store, and the step's copies, fills and index kernels); its attention took
    103 us more because its profile began ~3100 tokens of KV later (30816 against 27680), not from
    more work per token."""
    base, dyn = ((S26_17["profile"] / f"{n}-gpu.txt").read_text() for n in ("base", "dyn"))
    (_, b_busy, b_idle), (_, d_busy, d_idle) = per_step_span(base), per_step_span(dyn)
    assert (d_busy - b_busy, b_idle, d_idle) == (211, 295, 377)
    b, d = gpu_work(base), gpu_work(dyn)
    gemms = [k for k in d if k.startswith(("nvjet_sm90_tst_96x64", "nvjet_sm90_tst_64x64"))]
    assert round(sum(d[k] - b[k] for k in gemms), 1) == 63.8
    launches = {name: n for _, n, name in gpu_rows(dyn)}
    assert [launches[k] for k in gemms] == [33.0, 33.0] and all(n == 32.0 for _, n, k in gpu_rows(base) if k in gemms)
    # Small by the larger launch of the two: a copy kernel runs 8.8 us a launch in base, 4.8 in dynspec.
    rows = {side: {k: (us, n) for us, n, k in gpu_rows(t)} for side, t in (("base", base), ("dyn", dyn))}
    small = [
        k
        for k in set(rows["base"]) | set(rows["dyn"])
        if max(us / n for us, n in (r[k] for r in rows.values() if k in r)) < 5
    ]
    more = {k: [rows["dyn"].get(k, (0, 0))[i] - rows["base"].get(k, (0, 0))[i] for i in (0, 1)] for k in small}
    assert (round(sum(us for us, _ in more.values()), 1), round(sum(n for _, n in more.values()), 1)) == (58.9, 33.0)
    assert (
        small_kernels(dyn)[0] - small_kernels(base)[0] > 80
    )  # negative control: by each table's own launches, the copy counts once
    attention = "_fwd_grouped_kernel_stage1"
    logs = {n: gzip.decompress((S26_17["profile"] / f"{n}.log.gz").read_bytes()).decode() for n in ("base", "dyn")}
    at = {n: profiled_at_tokens(log) for n, log in logs.items()}
    assert at == {"base": 27680, "dyn": 30816}
    # Per KV token the attention costs dynspec no more: its 6 % more time is under its 11 % more KV.
    assert d[attention] / b[attention] < at["dyn"] / at["base"]
    assert round(d[attention] - b[attention], 1) == 102.9


# -- session 28 (runtime r27 / v2 module r43 / settings r1 at 5ef4a65, an H100): 0.5.17 kv-proof and refusals --

S28_REVISIONS = {
    "speculative_dynspec_runtime": 27,
    "speculative_dynspec_v2": 43,
    "speculative_dynspec_settings": 1,
}
S28_17 = {n: PROOF / f"0.5.17-v2-s28-{n}" for n in ("r27-proof", "refusals-found")}


def passed_kv_proof_with_metrics(evidence: Path, revisions: dict[str, int], gpu: str, steps: int) -> dict[str, str]:
    """The archive files of a passing kv-proof on ``gpu`` whose exact_kv compared ``steps`` steps of
    28 requests (the control apart) and whose three counters moved by the 100 switches the log
    said during the ramp; the controls: the same counters against a log that said one switch more
    or one fewer."""
    report = report_of(evidence, {}, revisions)
    assert report["gpu"] == gpu
    _, files, found = passed_kv_proof(evidence)
    assert found == {"compared_requests": 28, "compared_steps": steps, "control_differs": True}
    counted_100_switches(report)
    return files


def counted_100_switches(report: dict) -> None:
    """The three counters moved by the 100 switches the log said during the ramp; the controls: the
    same counters against a log that said one switch more or one fewer."""
    m = report["metrics"]
    assert m["passed"] and metrics.judge(m["before"], m["after"], 100)["passed"]
    assert not metrics.judge(m["before"], m["after"], 101)["passed"]
    assert not metrics.judge(m["before"], m["after"], 99)["passed"]


def test_session_28_0_5_17_on_an_h100_keeps_outputs_the_draft_kv_and_its_counters_exact() -> None:
    """kv-proof (3 starts at a time) on an H100 80GB: equivalence, 100 crossings and exact_kv pass
    (1902 steps of 28 requests, the control 32 apart), and the three counters moved by what the log
    said during the ramp: 100 switches logged, 100 counted."""
    files = passed_kv_proof_with_metrics(S28_17["r27-proof"], S28_REVISIONS, "NVIDIA H100 80GB HBM3", 1902)
    assert STREAM_SAID in files["dynspec.log"]


def test_session_28_0_5_17_served_two_combinations_the_check_was_to_refuse() -> None:
    """The refusals check's first GPU run: 4 of 6 refused with one line and exit 2, no traceback.
    graph-size started and captured graphs (the check read cuda_graph_max_bs; 0.5.14+ keeps the
    flag in cuda_graph_max_bs_decode; settings r2 reads both), and dp-attention went on to load
    weights (SGLang turned DP attention off with one DP rank; the case now asks for two)."""
    report = report_of(S28_17["refusals-found"], {}, S28_REVISIONS)
    rows = {row["name"]: row for row in report["refusals"]["cases"]}
    assert not report["refusals"]["passed"]
    assert {n for n, r in rows.items() if not r["problems"]} == {"topk", "max-running", "bad-value", "adaptive"}
    assert all(rows[n]["exit_code"] == 2 for n in ("topk", "max-running", "bad-value", "adaptive"))
    assert rows["graph-size"]["exit_code"] is None and rows["dp-attention"]["line"] is None
    logs = members(S28_17["refusals-found"] / "logs.tar.xz", "refusal-graph-size.log", "refusal-dp-attention.log")
    args = {n: re.search(r"server_args=ServerArgs\((.*)", log).group(1) for n, log in logs.items()}  # type: ignore[union-attr]
    assert "cuda_graph_max_bs_decode=16," in args["refusal-graph-size.log"]
    assert " cuda_graph_max_bs=" not in args["refusal-graph-size.log"]  # no field of the old name
    assert (
        "dp_size=1," in args["refusal-dp-attention.log"]
        and "enable_dp_attention=False," in args["refusal-dp-attention.log"]
    )
    assert "dynspec: zero-step state ready" in logs["refusal-graph-size.log"]


S28_CALL = PROOF / "0.5.17-v2-s28-r27-refusals-features" / "call-output.txt"
S28_ADMISSION = PROOF / "0.5.17-v2-s28-r27-admission-profile"


def test_session_28_settings_r2_refused_all_six_and_penalties_held_on_0_5_17() -> None:
    """After settings r2 (the _decode names) and the two-rank DP case: 6 of 6 refused. Issue 17's
    first GPU run, dummy weights: penalties pass both ways (8 of 8 changed by them at 8 requests,
    1 of 16 at 16); the sampling and logprobs controls saw nothing (flat dummy logits): both checks
    need real weights. Only the call's output survived (8 files come back; the profile's came first)."""
    lines = {line.split()[0]: line for line in S28_CALL.read_text().splitlines() if not line.startswith("#")}
    assert "speculative_dynspec_settings r2" in lines["dynspec"]
    assert lines["refusals"].split()[1:4] == ["PASS", "6", "of"]
    assert "PASS" in lines["penalties"] and "penalties changed 8" in lines["penalties"]
    assert "indistinguishable from base (p = 1)" in lines["sampling"]
    assert "within tolerance for 8 of 8" in lines["logprobs"]
    assert "FAIL" in lines["sampling"] and "FAIL" in lines["logprobs"]  # the control: not every line passes


def test_session_28_at_a_64_request_burst_0_5_17s_dynspec_steps_wait_on_the_host() -> None:
    """PROF_AT=admission on 0.5.17 (40 steps from before 64 requests arrive, GPU only, H100): dynspec's
    steps span 1411 us more than base's, 1196 us of it idle GPU (913 us in gaps of 100 us or more) and
    214 us GPU work; so at admission the host, not the draft's KV write, holds the GPU back. The
    profiles with Python stacks name receiving the burst (process_input_requests: 9.9 against 5.1 ms,
    inflated by the tracer) among the longest gaps."""
    base, dyn = ((S28_ADMISSION / f"{n}-gpu.txt").read_text() for n in ("base", "dyn"))
    (b_span, b_busy, b_idle), (d_span, d_busy, d_idle) = per_step_span(base), per_step_span(dyn)
    assert (d_span - b_span, d_idle - b_idle, d_busy - b_busy) == (1411, 1196, 214)

    def long_gaps(table: str) -> float:
        return float(re.search(r">=100us (\d+)", table).group(1))  # type: ignore[union-attr]

    assert long_gaps(dyn) - long_gaps(base) == 913
    assert long_gaps(base) < 0.5 * b_idle  # the control: base's idle is not mostly long gaps
    stacks = {n: (S28_ADMISSION / f"{n}-all.txt").read_text() for n in ("base", "dyn")}
    received = {
        n: float(re.search(r"(\d+) us  sglang/srt/managers/scheduler.py\(\d+\): process_input_requests", t).group(1))  # type: ignore[union-attr]
        for n, t in stacks.items()
    }
    assert received == {"base": 5115.0, "dyn": 9887.0}


# -- session 29 (runtime r28 / v2 module r47 at ecac0ff, an H200): 0.5.17 kv-proof and FlashInfer --

S29_REVISIONS = {"speculative_dynspec_runtime": 28, "speculative_dynspec_v2": 47, "speculative_dynspec_settings": 2}
S29_17 = {n: PROOF / f"0.5.17-v2-s29-r28-{n}" for n in ("proof", "flashinfer")}
DRAWS_SAID = "the lean zero-step verify draws sampled batches with the target's sampler"


def test_session_29_0_5_17_on_the_sampled_draws_runtime_keeps_outputs_the_draft_kv_and_its_counters_exact() -> None:
    """kv-proof on r28 / r47 (the sampled draw on, greedy loads): equivalence, 100 crossings, exact_kv
    (1926 steps of 28 requests, the control 32 apart) and the counters by the 100 switches logged;
    the server said it draws sampled batches with the target's sampler, and the reference, run with
    the stock verify (DYNSPEC_LEAN_VERIFY=0), said nothing of it."""
    files = passed_kv_proof_with_metrics(S29_17["proof"], S29_REVISIONS, "NVIDIA H200", 1926)
    assert DRAWS_SAID in files["dynspec.log"] and DRAWS_SAID not in files["dynspec-full.log"]


def test_session_29_0_5_17_on_flashinfer_gives_stock_tokens_across_100_crossings() -> None:
    """backends (issue 17): every server on FlashInfer attention: equivalence at 1, 4, 16, 48 and 100
    crossings; the direct write, run on Triton only, said it replays through the stock extend."""
    report = report_of(S29_17["flashinfer"], {}, S29_REVISIONS)
    assert report["attention_backend"] == "flashinfer" and report["backends"]["passed"]
    assert report["equivalence"]["passed"] and report["crossings"]["count"] == 100
    (log,) = members(S29_17["flashinfer"] / "logs.tar.xz", "dynspec.log").values()
    assert "the direct write has run with TritonAttnBackend only, not FlashInferAttnBackend" in log
    assert DRAWS_SAID in log
    # the control: the Triton run of the same call said nothing of FlashInfer
    (triton,) = members(S29_17["proof"] / "logs.tar.xz", "dynspec.log").values()
    assert "FlashInferAttnBackend" not in triton


# -- session 31 (runtime r29 / v2 module r48 / settings r2 at 8b76682, an H100): issue 19's re-runs, 18, 17 --

S31_REVISIONS = {"speculative_dynspec_runtime": 29, "speculative_dynspec_v2": 48, "speculative_dynspec_settings": 2}
S31_GPU = "NVIDIA H100 80GB HBM3"
S31_CROSSED = {
    "0.5.11-v2": PROOF / "0.5.11-v2-s31-r29-proof",
    "0.5.12-v2": PROOF / "0.5.12-v2-s31-r29-proof",
    "0.5.12-v1": PROOF / "0.5.12-v1-s31-r29-proof",
    "0.5.14-v2": PROOF / "0.5.14-v2-s31-r29-proof",
}
S31_REFUSED = {"0.5.12-v2": PROOF / "0.5.12-v2-s31-r29-refusals", "0.5.14-v2": PROOF / "0.5.14-v2-s31-r29-refusals"}
S31_ADAPTIVE_OFF = PROOF / "0.5.11-v2-s31-r29-refusals-adaptive-off"
S31_17 = PROOF / "0.5.17-v2-s31-r29-proof"
S31_REAL = PROOF / "real-0.5.17-v2-s31-r29-features"


def test_session_31_0_5_17_on_r29_keeps_outputs_the_draft_kv_and_its_counters_exact() -> None:
    """kv-proof on r29 / r48 (3 starts at a time): equivalence, 100 crossings, exact_kv (1848 steps
    of 28 requests, the no-write control 32 apart) and the counters by the 100 switches logged."""
    files = passed_kv_proof_with_metrics(S31_17, S31_REVISIONS, S31_GPU, 1848)
    assert report_of(S31_17, {}, S31_REVISIONS)["exact_kv"]["control_mismatches"] == 32
    assert DRAWS_SAID in files["dynspec.log"] and STREAM_SAID in files["dynspec.log"]


@pytest.mark.parametrize("run", sorted(S31_CROSSED))
def test_session_31_r29_gives_stock_tokens_and_counts_100_crossings(run: str) -> None:
    """equivalence, crossings and metrics (no exact_kv: KV_CHECKS) on 0.5.11 v2, 0.5.12 v1 and v2
    (issue 19's re-runs) and 0.5.14 v2: every level's digest is base's in all four columns, 100
    switches (50 each way) with every request answered, and the counters moved by exactly the
    100 switches logged (the controls: 99 and 101 do not pass)."""
    evidence = S31_CROSSED[run]
    report = report_of(evidence, {}, S31_REVISIONS)
    assert (report["sglang_version"], report["path"], report["gpu"]) == (*run.split("-"), S31_GPU)
    assert report["checks"] == ["equivalence", "crossings", "metrics"] and report["passed"]
    digests = report["equivalence"]["digests"]
    assert len(set(digests["base"])) == 4  # the control: the levels' outputs differ from one another
    assert all(digests[column] == digests["base"] for column in ("always_on", "dynspec", "dynspec_after_ramp"))
    crossings = report["crossings"]
    assert (crossings["count"], crossings["off"], crossings["on"]) == (100, 50, 50)
    assert crossings["ok_requests"] == crossings["requests"] == 3250
    counted_100_switches(report)


def refused_all(report: dict, cases: int) -> list[dict]:
    """refusals: ``cases`` servers, each exiting 2 at ServerArgs' check with one line naming its
    combination and no traceback; the rows."""
    rows = report["refusals"]["cases"]
    assert report["refusals"]["passed"] and len(rows) == cases
    assert all(row["exit_code"] == 2 and not row["problems"] for row in rows)
    assert all(row["line"].startswith(f"error: {row['says']}") for row in rows)
    return rows


@pytest.mark.parametrize(("run", "cases"), [("0.5.12-v2", 7), ("0.5.14-v2", 6)])
def test_session_31_every_combination_is_refused_with_its_line_and_exit_2(run: str, cases: int) -> None:
    """refusals (issue 18): each case a server of its own, all exiting 2 at ServerArgs' check with
    one line naming the combination and no traceback; 0.5.12 has one case more (auto needs 0.5.14)."""
    rows = refused_all(report_of(S31_REFUSED[run], {}, S31_REVISIONS), cases)
    assert ("auto" in {row["name"] for row in rows}) is (run == "0.5.12-v2")


def test_session_31_0_5_11_turns_adaptive_off_on_v2_before_dynspecs_check_sees_it() -> None:
    """The refusals check on 0.5.11 v2 asked for a refusal of --speculative-adaptive: the server
    started and served, since 0.5.11 turns adaptive off itself under the overlap scheduler (its log
    says why) before dynspec's check runs. The other six were refused; the harness no longer asks
    for that case there (detect.adaptive_v1_only). Its 'traceback' is a missing optional module."""
    report = report_of(S31_ADAPTIVE_OFF, {}, S31_REVISIONS)
    rows = {row["name"]: row for row in report["refusals"]["cases"]}
    assert not report["refusals"]["passed"]
    assert {n for n, r in rows.items() if r["exit_code"] == 2 and not r["problems"]} == set(rows) - {"adaptive"}
    assert rows["adaptive"]["exit_code"] is None
    assert rows["adaptive"]["problems"][0] == "still running after 58 s: it did not refuse to start"
    (log,) = members(S31_ADAPTIVE_OFF / "logs.tar.xz", "refusal-adaptive.log").values()
    assert "speculative_adaptive disabled: the overlap scheduler (spec v2) is enabled" in log
    assert "No module named 'openai_harmony'" in log and "dynspec: v2 fallback ready" in log


def test_session_31_real_weights_sample_log_and_penalise_as_their_reference_and_grammar_met_its_tail() -> None:
    """real-features on 0.5.17 (SmolLM2-135M + the quick head): sampling (G-test p 0.148 on, 0.081
    off; the control 5e-40), logprobs (largest difference 0.0 off) and penalties (0 differ) pass.
    grammar's outputs all fit the schema and equal the reference's, but its phase off failed: the
    constrained requests end at their EOS one by one, the batch fell to 6 and dynspec rightly
    switched back on. The harness now sends ballast that outlasts them (features.grammar_ballast)."""
    report = report_of(S31_REAL, {}, S31_REVISIONS)
    assert report["model"].startswith("SmolLM2-135M-Instruct") and report["gpu"] == S31_GPU
    assert all(report[c]["passed"] for c in ("sampling", "logprobs", "penalties"))
    sampled = report["sampling"]["phases"]
    assert [round(sampled[p]["dynspec"]["p_value"], 3) for p in ("on", "off")] == [0.148, 0.081]
    assert all(sampled[p]["control"]["p_value"] < 1e-30 for p in ("on", "off"))
    assert report["logprobs"]["phases"]["off"]["max_abs_diff"] == 0.0
    grammar = report["grammar"]
    assert grammar["problems"] == ["off: dynspec switched back on during a load of the phase off (ON)"]
    assert all(grammar["phases"][p]["differ"] == 0 for p in ("on", "off"))
    assert grammar["phases"]["off"]["valid"] == {"base": 16, "always_on": 16, "dynspec": 16, "control": 0}
    (log,) = members(S31_REAL / "logs.tar.xz", "dynspec-features.log").values()
    switches = re.findall(r"dynspec: speculation (ON|OFF) at batch size (\d+)", log)
    assert switches[-1] == ("ON", "6")  # in the last load, grammar's phase off


def test_session_31_0_5_11s_dynspec_server_prefills_from_piecewise_graphs_and_always_on_eagerly() -> None:
    """The piecewise prefill patch's first run on 0.5.11: all 274 of the dynspec server's prefills
    replayed a CUDA graph; the always-on server (the control, stock speculation) ran all 7 eagerly."""
    logs = members(S31_CROSSED["0.5.11-v2"] / "logs.tar.xz", "dynspec.log", "always-on.log")
    assert prefill_graphs(logs["dynspec.log"]) == (274, 0)
    assert prefill_graphs(logs["always-on.log"]) == (0, 7)
    assert "the target's prefill replays its piecewise CUDA graphs" in logs["dynspec.log"]


S31_POOLED = ("0.5.17-v2-s21-r32-tput", "0.5.17-v2-s22-r32-stream-tput", "0.5.17-v2-s26-r22-tput")


def per_run_envelope(evidence: str, level: int) -> list[float]:
    """R of each interleaved run at ``level``: dynspec's run against the better static server's run of the same pass."""
    tp = json.loads((PROOF / evidence / "report.json").read_text())["throughput"]
    i = tp["levels"].index(level)
    runs = zip(tp["samples"]["dynspec"][i], tp["samples"]["base"][i], tp["samples"]["always_on"][i])
    return [d / max(b, a) for d, b, a in runs]


@pytest.mark.parametrize(("level", "median", "mean", "below"), [(64, 0.967, 0.971, 5), (128, 0.967, 0.974, 5)])
def test_session_31_pooled_over_three_sessions_r_on_0_5_17_sits_on_its_bar(
    level: int, median: float, mean: float, below: int
) -> None:
    """A reading, on the CPU, of the nine interleaved runs of sessions 21, 22 and 26 on 0.5.17's
    zero-step path (r19 / r32 and r22 / r40): per run, R spreads over 6 points, and its median and
    mean sit within half a point of 0.97, so a median of three passes or fails by the draw (session
    21 passed, 22 and 26 did not). A shift of half a point would move the centre above the bar;
    noise alone will not."""
    runs = [r for evidence in S31_POOLED for r in per_run_envelope(evidence, level)]
    assert len(runs) == 9
    assert (round(statistics.median(runs), 3), round(statistics.mean(runs), 3)) == (median, mean)
    assert sum(r < 0.97 for r in runs) == below
    assert max(runs) - min(runs) > 0.04  # the control: the runs do spread, unlike their medians


# -- session 32 (runtime r29 / v2 module r48 / settings r2 at c8b1b3e, an H100): issue 18's full kv-proofs --

S32_PROOF = {
    "0.5.11-v2": (PROOF / "0.5.11-v2-s32-r29-proof", 1874, 58, 6),
    "0.5.13-v2": (PROOF / "0.5.13-v2-s32-r29-proof", 1864, 32, 7),
    "0.5.14-v2": (PROOF / "0.5.14-v2-s32-r29-proof", 1900, 32, 6),
}
S32_11_V1 = PROOF / "0.5.11-v1-s32-r29-proof"
S32_15 = PROOF / "0.5.15-v2-s32-r29-no-cutlass"
S32_17_TPUT = PROOF / "0.5.17-v2-s32-r29-tput-oom"


# session 33's two (0.5.15 with kit part c, 0.5.16's first run), the same command and runtime
S33_PROOF = {
    "0.5.15-v2": (PROOF / "0.5.15-v2-s33-r29-proof", 1908, 32, 6),
    "0.5.16-v2": (PROOF / "0.5.16-v2-s33-r29-proof", 1856, 32, 6),
}
# session 34's: 0.5.12 v2 and v1, exact_kv on r29 for the first time (sessions 31's ran without it)
S34_PROOF = {
    "0.5.12-v2": (PROOF / "0.5.12-v2-s34-r29-proof", 1982, 58, 7),
    "0.5.12-v1": (PROOF / "0.5.12-v1-s34-r29-proof", 1988, 32, 7),
}
FULL_PROOFS = {**S32_PROOF, **S33_PROOF, **S34_PROOF}


@pytest.mark.parametrize("run", sorted(FULL_PROOFS))
def test_sessions_32_to_34_one_command_proves_a_release_whole(run: str) -> None:
    """kv-proof's five checks in one report (issue 18's one command per release) on 0.5.11 v2,
    0.5.13 v2 and 0.5.14 (session 32), 0.5.15 and 0.5.16 (session 33), 0.5.12 v2 and v1 (session
    34; 0.5.12 has auto's refusal besides, auto needing 0.5.14): equivalence, 100 crossings,
    exact_kv (28 requests, recomputed from the recordings, the no-write control apart), the counters
    by the 100 switches logged, and every refusal (0.5.11 v2 has no adaptive case: it turns adaptive
    off itself; 0.5.14+ none for auto's version bound)."""
    evidence, steps, control, cases = FULL_PROOFS[run]
    passed_kv_proof_with_metrics(evidence, S31_REVISIONS, S31_GPU, steps)
    report = report_of(evidence, {}, S31_REVISIONS)
    assert (report["sglang_version"], report["path"]) == tuple(run.split("-"))
    assert report["checks"] == ["equivalence", "crossings", "exact_kv", "refusals", "metrics"] and report["passed"]
    assert report["exact_kv"]["control_mismatches"] == control
    refused_all(report, cases)


def test_session_32_0_5_11_v1_passes_all_but_exact_kv_which_cannot_judge_a_parted_timeline() -> None:
    """0.5.11 v1 (kv-graph: its draft extend takes no EagleDraftExtendInput, so no direct write and no
    bit check): equivalence, 100 crossings, metrics and 7 refusals pass; exact_kv fails by the rule
    it ran with: 1 of 1926 proposals differs (a third draft token), after that request's timeline had
    parted from the reference's; none of the 252 compared where the timelines matched differ, but
    the control too differs only where they parted, so those 252 have no teeth: no verdict, as on
    0.5.12 v1 before its bit check (sessions 12 - 13)."""
    report = report_of(S32_11_V1, {}, S31_REVISIONS)
    assert (report["sglang_version"], report["path"], report["gpu"]) == ("0.5.11", "v1", S31_GPU)
    assert all(report[c]["passed"] for c in ("equivalence", "crossings", "metrics"))
    counted_100_switches(report)
    refused_all(report, 7)
    recs, files = kv_proof_recordings(S32_11_V1)
    entry = exactkv.judge(recs, {name: ["same"] for name in recs}, 100, [])
    assert not entry["passed"] and not report["exact_kv"]["passed"]
    assert (entry["compared_steps"], entry["mismatches"], entry["mismatches_same_history"]) == (1926, 1, 0)
    assert (entry["compared_steps_same_history"], entry["control_mismatches_same_history"]) == (252, 0)
    (wrong,) = entry["mismatch_examples"]
    assert (wrong["reference"], wrong["other"], wrong["same_history"]) == ([2243] * 3, [2243, 2243, 3840], False)
    # the control: the recording against itself has nothing to differ
    assert exactkv.judge({**recs, "kv": recs["full"]}, {n: ["same"] for n in recs}, 100, [])["passed"]
    assert "kv-direct is kv-graph" in files["dynspec.log"]


def test_session_32_0_5_15s_kit_lacks_the_cutlass_dsl_its_eagle_worker_imports() -> None:
    """0.5.15's first start: the three dynspec servers died capturing the draft's CUDA graphs, where
    the stock EAGLE worker imports the DSA backend, whose package imports nvidia-cutlass-dsl on
    0.5.15 (0.5.16 defers it): the kit lacks it (a 74 MB wheel). The six refusals, which exit before
    any graph, passed."""
    report = report_of(S32_15, {}, S31_REVISIONS)
    assert report["sglang_version"] == "0.5.15" and not report["equivalence"]["passed"]
    refused_all(report, 6)
    logs = members(S32_15 / "logs.tar.xz", "dynspec.log", "dynspec-full.log", "refusal-topk.log")
    for name in ("dynspec.log", "dynspec-full.log"):
        assert "from sglang.srt.layers.attention.dsa_backend import" in logs[name]
        assert "ModuleNotFoundError: No module named 'cutlass'" in logs[name]
    assert "cutlass" not in logs["refusal-topk.log"]  # the control: a refusal never gets that far


def test_session_32_three_8b_servers_overfill_an_h100_and_now_get_pools_it_holds() -> None:
    """kv-tput 0.5.17 with --parallel-starts 3 on an H100 80GB: two servers held 32.1 and 34.3 GiB
    (with 131072-slot pools, 16 GiB of target K/V), the third found 12 GiB for its weights and died
    (exit -9): no throughput, no mixed_load. The harness now sizes the three pools from the GPU's
    memory, and its estimate of what a server holds besides its pool covers what these two held."""
    report = report_of(S32_17_TPUT, {}, S31_REVISIONS)
    assert "--parallel-starts 3" in report["command"] and not report["throughput"]["passed"]
    argv = report["servers"][0]["argv"]
    assert argv[argv.index("--max-total-tokens") + 1] == "131072"
    (log,) = members(S32_17_TPUT / "logs.tar.xz", "always-on-sim.log").values()
    held = re.search(r"capacity of ([\d.]+) GiB .* Process \d+ has ([\d.]+) GiB .* Process \d+ has ([\d.]+) GiB", log)
    assert held is not None
    capacity, first, second = (float(x) for x in held.groups())
    assert (capacity, first, second) == (79.18, 32.09, 34.3)
    old_pool_mib = 131072 * EIGHT_B_SLOT_KIB // 1024
    assert max(first, second) * 1024 - old_pool_mib < EIGHT_B_SPECULATIVE_MIB  # the estimate covers what they held
    # base and two speculating servers with their new pools in what torch saw of the card, a reserve left over
    pool = eight_b_pool_tokens(81559, 2, plain=1)
    held = 2 * EIGHT_B_SPECULATIVE_MIB + EIGHT_B_PLAIN_MIB
    assert pool == 40960 and held + 3 * pool * EIGHT_B_SLOT_KIB // 1024 < capacity * 1024
    assert held + 3 * old_pool_mib > capacity * 1024  # the control: the old pools did not fit


# -- session 33 (runtime r29 / v2 module r48 / settings r2, unchanged since c8b1b3e; runs at be10828, an H100) --

S33_11_V1 = PROOF / "0.5.11-v1-s33-r29-exactkv-deterministic"
S33_17_TPUT = PROOF / "0.5.17-v2-s33-r29-tput"


def test_session_33_0_5_15_starts_with_the_cutlass_dsl_its_kit_now_carries() -> None:
    """0.5.15's servers, which died in session 32 importing ``cutlass``, started with kit part c on
    PYTHONPATH and served all five checks (the parametrized test above); none of their logs names a
    missing module, where session 32's did (the control)."""
    for evidence, missing in ((S33_PROOF["0.5.15-v2"][0], False), (S32_15, True)):
        logs = members(evidence / "logs.tar.xz", "dynspec.log", "dynspec-full.log")
        assert any("No module named 'cutlass'" in log for log in logs.values()) is missing


def test_session_33_0_5_11_v1s_exact_kv_passes_with_batch_invariant_kernels() -> None:
    """0.5.11 v1 (kv-graph) with --enable-deterministic-inference on every server: all 1840
    proposals of 28 requests after a fallback span equal the full extend's, the no-write control
    differs at 32 of 1828; recomputed from the recordings. Session 32's run of the same load without
    it had 1 of 1926 differ after that request's timeline parted (no verdict): with batch-invariant
    kernels a parted timeline's batches no longer change a request's numbers."""
    report = report_of(S33_11_V1, {}, S31_REVISIONS)
    assert (report["sglang_version"], report["path"], report["gpu"]) == ("0.5.11", "v1", S31_GPU)
    assert report["checks"] == ["exact_kv"] and report["passed"] and report["deterministic"]
    assert all("--enable-deterministic-inference" in s["argv"] for s in report["servers"])
    assert not report_of(S32_11_V1, {}, S31_REVISIONS)["deterministic"]
    recs, files = kv_proof_recordings(S33_11_V1)
    entry = exactkv.judge(recs, {name: ["same"] for name in recs}, 100, [])
    assert entry["passed"] and {k: entry[k] for k in COUNTS} == {k: report["exact_kv"][k] for k in COUNTS}
    assert (entry["compared_requests"], entry["compared_steps"], entry["mismatches"]) == (28, 1840, 0)
    assert (entry["control_compared_steps"], entry["control_mismatches"]) == (1828, 32)
    # the negative control: the no-write recording as the candidate fails
    assert not exactkv.judge({**recs, "kv": recs["skip"]}, {n: ["same"] for n in recs}, 100, [])["passed"]
    assert "kv-direct is kv-graph" in files["dynspec.log"]


def falls_back_below_the_h100s_switch_point(
    evidence: Path, tput: dict, per_step: dict[str, tuple[float, int]], envelope: list[float]
) -> Callable[[int], int]:
    """A throughput check at threshold 32 on an H100: the fallback step as published, R(C) as given and
    failing, because always-on beat base at 64 in every run (so 32 falls back too early there);
    the control: base beat always-on at 128 in every run. Returns the level index."""
    published_per_step(evidence, tput, per_step, "dynspec-sim.log")
    assert tput["envelope_ratio"] == envelope and not tput["passed"]
    samples, at = tput["samples"], tput["levels"].index
    assert all(a > b for a, b in zip(samples["always_on"][at(64)], samples["base"][at(64)]))
    assert all(b > a for a, b in zip(samples["always_on"][at(128)], samples["base"][at(128)]))
    return at


def test_session_33_0_5_17_on_an_h100_falls_back_at_0_98_but_its_crossover_lies_above_64() -> None:
    """kv-tput on 0.5.17 (an H100; three 8B servers with the 44032-slot pools sized in session 32,
    every start-up line read back; interleaved; mixed load median of 3). The fallback step reads
    0.981 / 0.983 of plain decode at 64 / 128 (47 / 32 pairs; the issue's bar 0.98). R fails at 64
    (0.927) because on this GPU speculation beats plain decode at 64 in every run (an H200's
    crossover lay between 32 and 64), so threshold 32 falls back where it should not; dynspec against
    base at 64 is 0.979. At 128 R is 0.962. The mixed load fails (1.077x) for the same two reasons:
    its 64-phases cost 0.54 s above always-on's, its 128-phase 0.15 s above base's."""
    report = report_of(S33_17_TPUT, {}, S31_REVISIONS)
    assert (report["gpu"], report["gpu_memory_mib"], report["threshold"]) == (S31_GPU, 81559, 32)
    assert [s["kv_pool_tokens"] for s in report["servers"]] == [44032] * 3
    tput, load = report["throughput"], report["mixed_load"]
    at = falls_back_below_the_h100s_switch_point(
        S33_17_TPUT, tput, {"64": (0.981, 47), "128": (0.983, 32)}, [0.9994, 0.9896, 1.0111, 1.005, 0.9273, 0.9624]
    )
    assert round(tput["dynspec"][at(64)] / tput["base"][at(64)], 3) == 0.979
    assert (load["passed"], load["dynspec_over_oracle"], load["repeats"]) == (False, 1.0766, 3)
    assert load["seconds"] == {k: statistics.median(v) for k, v in load["samples"].items()}
    phases = load["phases"]
    above = {p["C"]: 0.0 for p in phases}
    for p in phases:
        above[p["C"]] += p["dynspec_s"] - p["oracle_s"]
    assert (round(above[64], 2), round(above[128], 2)) == (0.54, 0.15)
    # an estimate, not a run: the 64-phases at always-on's medians put the sum at 1.021x the oracle
    sums = load["phase_median_sums"]["dynspec"]
    assert round(sum(p["dynspec_s"] for p in phases), 3) == sums
    at_64_on = sums - sum(p["dynspec_s"] - p["always_on_s"] for p in phases if p["C"] == 64)
    assert (round(at_64_on, 2), round(at_64_on / load["oracle_seconds"], 3)) == (11.83, 1.021)
    assert all(p["faster_static"] == ("base" if p["C"] == 128 else "always_on") for p in phases)


# -- session 34 (runtime r29 / v2 module r48 / settings r2 / auto r6, unchanged since c8b1b3e; runs at 6c7d4ac, an H100) --

S34_17_AUTO = PROOF / "0.5.17-v2-s34-r29-auto-acc3"
S34_17_AUTO_PROOF = PROOF / "0.5.17-v2-s34-r29-auto-proof"
S34_12_TPUT = PROOF / "0.5.12-v2-s34-r29-tput"
S34_12_MIXED_96 = PROOF / "0.5.12-v2-s34-r29-mixed-n96"


def test_session_34_auto_beats_every_server_it_ran_beside_and_settles_where_the_replay_said() -> None:
    """auto_threshold on 0.5.17 at simulated acceptance 3 (an H100; median of 2): auto 11.69 s, below
    always-on (12.17), N = 32 (12.02) and base (16.65). Its log's last estimated decision speculates
    at 127 requests and below, its ceiling (these servers run at most 128), where the CPU replay of
    the H100's step costs put it (session 33): it timed speculation faster at 64 and never timed 128. The check failed: N = 64's server ran out of memory starting beside
    N = 32 and 96, so the sweep is incomplete (the next test)."""
    report = report_of(S34_17_AUTO, {}, S31_REVISIONS)
    assert (report["gpu"], report["sglang_version"], report["passed"]) == (S31_GPU, "0.5.17", False)
    entry = report["auto_threshold"]
    row = entry["by_acceptance"]["3"]
    assert entry["sweep"] == [32, 64, 96] and entry["repeats"] == 2
    assert (row["auto_s"], row["always_on_s"], row["base_s"]) == (11.691, 12.166, 16.654)
    assert row["fixed_s"] == {"32": 12.022, "64": None, "96": None} and row["best_fixed_n"] == 32
    assert row["auto_s"] < min(row["always_on_s"], row["best_fixed_s"], row["base_s"])
    assert round(row["always_on_s"] / row["auto_s"], 3) == 1.041
    settled = {"disable_above": 127, "enable_at_or_below": 127, "reason": "estimated", "acceptance": 3.0}
    assert row["auto_decisions"] == {"count": 14, "estimated": 10, "last": settled, "last_estimated": settled}
    assert entry["problems"][-1] == "acceptance 3: no complete pass on N=64, N=96"
    (log,) = members(S34_17_AUTO / "logs.tar.xz", "dynspec-auto-acc3.log").values()
    ratios = [float(x) for x in re.findall(r"\(estimated;[^)]* 64: ([\d.]+)\)", log)]
    assert (len(ratios), min(ratios), max(ratios)) == (8, 1.07, 1.21)  # speculation faster at 64, every estimate
    assert not re.search(r"by batch size [^)]*\b128: ", log)  # 128 never timed: the ceiling decides there


def test_session_34_three_speculating_servers_overfill_an_h100_at_44032() -> None:
    """auto_threshold's second group, three speculating 8B servers with 44032-slot pools (sized for
    base beside two), held 26.22, 26.43 and 26.46 GiB when the third ran out capturing its graphs:
    20.7 - 20.9 GiB each besides its pool. A group's pools count its speculating members: three get
    24576 slots (session 34 gave them 32768, which overfilled the card too: session 35's test); the
    control: the pools they had do not fit."""
    report = report_of(S34_17_AUTO, {}, S31_REVISIONS)
    pools = {s["name"]: s.get("kv_pool_tokens") for s in report["servers"]}
    assert pools == {
        "base-auto": 44032, "always-on-acc3": 44032, "dynspec-auto-acc3": 44032,
        "dynspec-n32-acc3": 44032, "dynspec-n64-acc3": None, "dynspec-n96-acc3": 44032,
    }  # fmt: skip
    (log,) = members(S34_17_AUTO / "logs.tar.xz", "dynspec-n64-acc3.log").values()
    held = re.search(
        r"capacity of ([\d.]+) GiB .* this process has ([\d.]+) GiB .* Process \d+ has ([\d.]+) GiB "
        r".* Process \d+ has ([\d.]+) GiB",
        log,
    )
    assert held is not None and "torch.OutOfMemoryError: CUDA out of memory" in log
    # the report named the start-up dump first (its custom_sigquit_handler); the scan now names the OOM
    assert "server_args=ServerArgs(" in report["auto_threshold"]["problems"][1]
    assert logscan.scan(log).errors[0].text.startswith("[2026-12-06 08:17:23] OutOfMemoryError: CUDA out of memory.")
    capacity, *each = (float(x) for x in held.groups())
    assert (capacity, each) == (79.18, [26.22, 26.43, 26.46])
    old_pool_mib = 44032 * EIGHT_B_SLOT_KIB // 1024
    assert all(gib * 1024 - old_pool_mib < EIGHT_B_SPECULATIVE_MIB for gib in each)  # the estimate covers them
    pool = eight_b_pool_tokens(81559, 3)
    assert (
        pool == 24576
        and 3 * (max(each) * 1024 - old_pool_mib + pool * EIGHT_B_SLOT_KIB // 1024) < (capacity - 1) * 1024
    )
    assert 3 * (EIGHT_B_SPECULATIVE_MIB + old_pool_mib) > capacity * 1024  # the control: the old pools did not fit
    assert eight_b_pool_tokens(81559, 2, plain=1) >= 39808  # base and two speculating still hold kv-tput's loads


def test_session_34_auto_crosses_and_keeps_outputs_on_0_5_17() -> None:
    """auto-proof on 0.5.17 (an H100): with --speculative-disable-batch-size auto, outputs
    token-identical to base and always-on at 1, 4, 16, 48, 128, and 100 switches (5805 requests)."""
    report = report_of(S34_17_AUTO_PROOF, {}, S31_REVISIONS)
    assert (report["gpu"], report["threshold"], report["checks"]) == (S31_GPU, "auto", ["equivalence", "crossings"])
    assert report["passed"] and report["equivalence"]["passed"] and report["crossings"]["passed"]
    assert report["crossings"]["detail"].startswith("100 switches (50 OFF, 50 ON) in 90 waves, 5805/5805 requests OK")
    dyn = next(s for s in report["servers"] if s["name"] == "dynspec")
    assert dyn["argv"][dyn["argv"].index("--speculative-disable-batch-size") + 1] == "auto"


def test_session_34_0_5_12_v2_falls_back_at_0_98_and_its_mixed_load_meets_its_oracle_with_n_96() -> None:
    """The own fallback (0.5.12 v2) on an H100, threshold 32 as the issue's R asks: per step 0.983 / 0.987
    at 64 / 128 (48 / 32 pairs), R 1.02 / 1.01 / 1.01 / 1.01 / 0.94 / 0.98: it fails at 64 only,
    where always-on beat base in every run (the H100's switch point lies above 64, session 33), and
    the mixed load at 1.049x its oracle. In a second call with --threshold 96, the mixed load passes:
    11.90 s, 1.000x the oracle, 5 % below always-on and 28 % below base."""
    report = report_of(S34_12_TPUT, {}, S31_REVISIONS)
    assert (report["gpu"], report["sglang_version"], report["path"], report["threshold"]) == (
        S31_GPU,
        "0.5.12",
        "v2",
        32,
    )
    tput, load = report["throughput"], report["mixed_load"]
    falls_back_below_the_h100s_switch_point(
        S34_12_TPUT, tput, {"64": (0.983, 48), "128": (0.987, 32)}, [1.0244, 1.0063, 1.0108, 1.008, 0.9431, 0.9773]
    )
    assert (load["passed"], load["dynspec_over_oracle"]) == (False, 1.0488)
    at_96 = report_of(S34_12_MIXED_96, {}, S31_REVISIONS)
    assert (at_96["threshold"], at_96["checks"]) == (96, ["mixed_load"])
    load = at_96["mixed_load"]
    assert (load["passed"], load["dynspec_over_oracle"], load["repeats"]) == (True, 0.9998, 3)
    assert load["seconds"] == {"base": 16.576, "always_on": 12.568, "dynspec": 11.898}
    assert load["seconds"] == {k: statistics.median(v) for k, v in load["samples"].items()}
    assert all(d < min(a, b) for d, a, b in zip(*(load["samples"][k] for k in ("dynspec", "always_on", "base"))))


def test_the_throughput_reports_place_n_by_the_gpu() -> None:
    """The switch point read from each report's own medians: on the H200 of session 26 always-on was
    faster up to 32 and plain decode from 64 (the ratio crossing 1 near 58, where the CPU replay of
    its step costs put auto, 61); on the H100 of sessions 33 and 34 up to 64, from 128, near 75 and
    72: N = 96 there, as session 34's mixed load used, lies in the H100's range and not the H200's."""
    where = {}
    for evidence, revisions in (
        (S26_17["tput"], S26_REVISIONS),
        (S33_17_TPUT, S31_REVISIONS),
        (S34_12_TPUT, S31_REVISIONS),
    ):
        tput = report_of(evidence, {}, revisions)["throughput"]
        where[evidence.name] = switch_point(tput["levels"], tput["base"], tput["always_on"])
    found = {name: tuple(w.values()) for name, w in where.items() if w is not None}
    assert found == {
        S26_17["tput"].name: (32, 64, 58),
        S33_17_TPUT.name: (64, 128, 75),
        S34_12_TPUT.name: (64, 128, 72),
    }
    assert 64 < 96 < 128 and not 32 < 96 < 64  # the control: 96 is an H100's N, not an H200's


# -- session 35 (runtime r29 / v2 module r48 / settings r2 / auto r6, unchanged since c8b1b3e; runs at fe3add6, an H100) --

S35_17_TPUT_96 = PROOF / "0.5.17-v2-s35-r29-tput-n96"
S35_12_TPUT_96 = PROOF / "0.5.12-v2-s35-r29-tput-n96"
S35_17_AUTO_2 = PROOF / "0.5.17-v2-s35-r29-auto-acc2"
S35_17_FLASHINFER = PROOF / "0.5.17-v2-s35-r29-flashinfer-tput"


def oom_held(log: str) -> tuple[float, list[float]]:
    """From the first CUDA out-of-memory line of ``log``: the card's capacity and what each process held
    (GiB), the one that ran out among them."""
    line = next(line for line in log.splitlines() if "CUDA out of memory" in line)
    capacity = re.search(r"total capacity of ([\d.]+) GiB", line)
    assert capacity is not None
    return float(capacity.group(1)), [float(x) for x in re.findall(r"has ([\d.]+) GiB memory in use", line)]


def test_session_35_at_an_h100s_n_the_own_fallback_passes_r_everywhere_and_meets_its_oracle() -> None:
    """kv-tput on 0.5.12 v2 with --threshold 96, the H100's switch point (session 34): R(C) 1.01 / 1.00 /
    1.02 / 1.01 / 0.99 / 0.99, every level at or above the issue's 0.97; per step 0.983 at 128 (30
    pairs); the mixed load 12.54 s, 1.005x its oracle, 5 % below always-on and 24 % below base. The
    control: the same release at N = 32 (session 34) failed at 64, where an H100 still speculates faster."""
    report = report_of(S35_12_TPUT_96, {}, S31_REVISIONS)
    assert (report["gpu"], report["sglang_version"], report["path"], report["threshold"]) == (
        S31_GPU,
        "0.5.12",
        "v2",
        96,
    )
    assert report["passed"] and report["checks"] == ["throughput", "mixed_load"]
    assert [s["kv_pool_tokens"] for s in report["servers"]] == [40960] * 3
    tput, load = report["throughput"], report["mixed_load"]
    published_per_step(S35_12_TPUT_96, tput, {"128": (0.983, 30)})
    assert tput["passed"] and tput["envelope_ratio"] == [1.0076, 0.9996, 1.0234, 1.0128, 0.9912, 0.9874]
    assert min(tput["envelope_ratio"]) >= tput["min_envelope_ratio"] == 0.97
    assert report_of(S34_12_TPUT, {}, S31_REVISIONS)["throughput"]["envelope_ratio"][4] == 0.9431
    assert (load["passed"], load["dynspec_over_oracle"], load["repeats"]) == (True, 1.0046, 3)
    assert load["seconds"] == {"base": 16.397, "always_on": 13.234, "dynspec": 12.54}
    assert load["seconds"] == {k: statistics.median(v) for k, v in load["samples"].items()}


def test_session_35_0_5_17_at_an_h100s_n_meets_its_oracle_and_misses_r_at_128_outside_the_steady_steps() -> None:
    """kv-tput on 0.5.17 with --threshold 96 (an H100): the mixed load passes, 11.49 s = 1.008x its
    oracle, 4.9 % below always-on and 29 % below base; R(64) is 1.004 where N = 32 gave 0.927
    (session 33, the control). R fails at 128 only: 0.969 (bar 0.97), while its steady steps run at
    0.987 of base's (31 pairs): the rest is outside them, where dynspec's timed runs spent 225 ms
    beyond their tokens at their own steady speed (median of 3) and base's 152."""
    report = report_of(S35_17_TPUT_96, {}, S31_REVISIONS)
    assert (report["gpu"], report["sglang_version"], report["threshold"], report["passed"]) == (
        S31_GPU,
        "0.5.17",
        96,
        False,
    )
    tput, load = report["throughput"], report["mixed_load"]
    published_per_step(S35_17_TPUT_96, tput, {"128": (0.987, 31)})
    assert tput["envelope_ratio"] == [1.009, 0.9872, 1.0116, 0.9914, 1.0044, 0.969]
    failing = [c for c, r in zip(tput["levels"], tput["envelope_ratio"]) if r < tput["min_envelope_ratio"]]
    assert failing == [128] and not tput["passed"]
    assert report_of(S33_17_TPUT, {}, S31_REVISIONS)["throughput"]["envelope_ratio"][4] == 0.9273
    outside = tput["outside_steady_ms"]
    assert (statistics.median(outside["dynspec"]["128"]), statistics.median(outside["base"]["128"])) == (225, 152)
    assert (load["passed"], load["dynspec_over_oracle"], load["repeats"]) == (True, 1.0075, 3)
    assert load["seconds"] == {"base": 16.295, "always_on": 12.078, "dynspec": 11.49}
    assert all(d < min(a, b) for d, a, b in zip(*(load["samples"][k] for k in ("dynspec", "always_on", "base"))))


def test_session_35_auto_at_acceptance_2_finds_its_switch_point_below_the_ceiling() -> None:
    """auto_threshold on 0.5.17 at simulated acceptance 2 (an H100; median of 2): auto's last estimated
    decision speculates at 24 and below and falls back above 34 (its ceiling is 127), where session
    33's CPU replay of the H100's step costs put it (about 35); at acceptance 3 (session 34, the
    control) it settled at its ceiling. auto 14.55 s: 1.027x N = 16 (14.17), 1.026x the oracle
    (14.19), below base (16.36) and always-on (17.52, slower than plain decode at this acceptance).
    The check failed as incomplete: N = 32 and 96 ran out of memory (the next test)."""
    report = report_of(S35_17_AUTO_2, {}, S31_REVISIONS)
    assert (report["gpu"], report["sglang_version"], report["passed"]) == (S31_GPU, "0.5.17", False)
    entry = report["auto_threshold"]
    row = entry["by_acceptance"]["2"]
    assert (entry["sweep"], entry["repeats"], entry["detail"]) == ([16, 32, 96], 2, "incomplete")
    assert (row["auto_s"], row["base_s"], row["always_on_s"], row["oracle_s"]) == (14.553, 16.359, 17.523, 14.19)
    assert row["fixed_s"] == {"16": 14.169, "32": None, "96": None} and row["best_fixed_n"] == 16
    assert round(row["auto_s"] / row["best_fixed_s"], 3) == 1.027 <= entry["max_ratio"]
    assert row["auto_over_oracle"] == 1.0256 and row["auto_s"] < min(row["base_s"], row["always_on_s"])
    settled = {"disable_above": 34, "enable_at_or_below": 24, "reason": "estimated", "acceptance": 2.0}
    assert row["auto_decisions"]["last_estimated"] == settled and row["auto_decisions"]["count"] == 38
    at_3 = report_of(S34_17_AUTO, {}, S31_REVISIONS)["auto_threshold"]["by_acceptance"]["3"]
    assert at_3["auto_decisions"]["last_estimated"]["disable_above"] == 127  # the control: its ceiling
    assert entry["problems"][-1] == "acceptance 2: no complete pass on N=32, N=96"


def test_session_35_three_speculating_servers_overfill_an_h100_at_32768_too() -> None:
    """auto_threshold's second group, three speculating servers with 32768-slot pools (session 34's
    sizing), held 26.96, 26.88 and 25.30 GiB when N = 32 and 96 ran out at their first request: up to
    22.8 GiB besides a pool, above the 22 the harness assumed. It now assumes 23: three get 24576
    slots, which hold auto's mixed load; the control: at 23, the pools they had do not fit."""
    report = report_of(S35_17_AUTO_2, {}, S31_REVISIONS)
    pools = {s["name"]: s.get("kv_pool_tokens") for s in report["servers"]}
    assert (pools["dynspec-n16-acc2"], pools["dynspec-n32-acc2"], pools["dynspec-n96-acc2"]) == (32768, None, None)
    (log,) = members(S35_17_AUTO_2 / "logs.tar.xz", "dynspec-n32-acc2.log").values()
    capacity, held = oom_held(log)
    assert (capacity, held) == (79.18, [26.96, 26.88, 25.3])
    old_pool_mib = 32768 * EIGHT_B_SLOT_KIB // 1024
    assert 22 * 1024 < max(held) * 1024 - old_pool_mib < EIGHT_B_SPECULATIVE_MIB  # above the old 22, within 23
    pool = eight_b_pool_tokens(81559, 3)
    assert pool == 24576 >= eight_b_slots_needed(ProofOptions(out=Path("unused"), checks=("auto_threshold",)))
    assert 3 * (max(held) * 1024 - old_pool_mib + pool * EIGHT_B_SLOT_KIB // 1024) < (capacity - 0.5) * 1024
    assert 3 * (EIGHT_B_SPECULATIVE_MIB + old_pool_mib) > capacity * 1024  # the control


def test_session_35_flashinfer_overfills_an_h100_where_triton_fits() -> None:
    """kv-tput on FlashInfer (0.5.17, an H100): base and two speculating servers with 40960-slot pools,
    which fit on Triton in the same session (the control: all three served), overfilled the card:
    dynspec ran out capturing its draft-extend graphs holding 28.79 GiB, beside 27.27 and 23.07. No
    per-step number. The harness now adds FlashInfer's share: it starts two 8B servers side by side
    there (--parallel-starts 3 is refused at once), three on Triton."""
    report = report_of(S35_17_FLASHINFER, {}, S31_REVISIONS)
    assert report["attention_backend"] == "flashinfer" and not report["passed"]
    assert all("--attention-backend" in s["argv"] and "flashinfer" in s["argv"] for s in report["servers"])
    (log,) = members(S35_17_FLASHINFER / "logs.tar.xz", "dynspec-sim.log").values()
    assert "Capture cuda graph failed: CUDA out of memory" in log
    capacity, held = oom_held(log)
    assert (capacity, held) == (79.18, [27.27, 28.79, 23.07])
    assert [s["kv_pool_tokens"] for s in report_of(S35_17_TPUT_96, {}, S31_REVISIONS)["servers"]] == [40960] * 3
    need = eight_b_slots_needed(ProofOptions(out=Path("unused"), checks=("throughput",)))
    assert eight_b_pool_tokens(81559, 2, 1, "flashinfer") < need <= eight_b_pool_tokens(81559, 2, 1) == 40960
    assert shared_gpu_8b_servers(81559, need, "flashinfer") == 2


def outside_steady_extra(evidence: Path, env: dict[str, str] | None = None) -> float:
    """The median time a timed run at 128 spent beyond its tokens at its own steady speed, dynspec's less base's (ms)."""
    outside = report_of(evidence, env or {}, S31_REVISIONS)["throughput"]["outside_steady_ms"]
    dynspec: list[int] = outside["dynspec"]["128"]
    base: list[int] = outside["base"]["128"]
    return statistics.median(dynspec) - statistics.median(base)


def test_at_128_the_zero_step_paths_outside_cost_stood_above_the_own_fallbacks_until_session_36() -> None:
    """dynspec's time beyond its tokens at 128, less base's: 0.5.17 (zero-step, the stock draft prefill
    while off) +43 and +73 ms in sessions 33 and 35; 0.5.12 v2 (own fallback, the KV-only prefill while
    off) +21 and +3 ms in sessions 34 and 35, every 0.5.17 run above every 0.5.12 one. Session 36's
    0.5.17 run, +9, lies among 0.5.12's: the two sessions' gap was not the release's."""
    zero_step = [outside_steady_extra(e) for e in (S33_17_TPUT, S35_17_TPUT_96)]
    own_fallback = [outside_steady_extra(e) for e in (S34_12_TPUT, S35_12_TPUT_96)]
    assert (zero_step, own_fallback) == ([43, 73], [21, 3])
    assert min(zero_step) > max(own_fallback)  # what sessions 33 - 35 read as the release's
    assert min(own_fallback) < outside_steady_extra(S36_17_TPUT_128) == 9 < max(own_fallback)


# -- session 36 (runtime r29 / v2 module r48 / settings r2 / auto r6, unchanged since c8b1b3e; runs at b8c672f, an H100) --

S36_12_PREFILL_KV = {"0": PROOF / "0.5.12-v2-s36-r29-prefill-kv-0", "1": PROOF / "0.5.12-v2-s36-r29-prefill-kv-1"}
S36_17_TPUT_128 = PROOF / "0.5.17-v2-s36-r29-tput-128"
S36_17_AUTO_2 = {
    "8,32,48": PROOF / "0.5.17-v2-s36-r29-auto-acc2-n8-32-48",
    "64,96": PROOF / "0.5.17-v2-s36-r29-auto-acc2-n64-96",
}
KV_ONLY_PREFILL_SAID = "dynspec: while off, a prefill's draft extend writes only the draft KV"


def test_session_36_the_kv_only_prefill_is_not_what_0_5_17_lacked_at_128() -> None:
    """The A/B of session 35's plan, one call on 0.5.12 v2 at --threshold 96, throughput at 128 only,
    the KV-only prefill off (DYNSPEC_PREFILL_KV=0), then on: R(128) 0.978 and 0.983, per step 0.988
    and 0.989 (20 pairs each), dynspec's time beyond its tokens +6 and +8 ms over base's. Turning the
    prefill off did not raise it to the +43 - 73 ms of 0.5.17 in sessions 33 and 35, so its port to
    the zero-step path (docs/design/zero-step-kv-prefill.md) was not built. The control: the server
    with it on said so and took its first wave KV-only; the one with it off said neither."""
    measured = {}
    for value, evidence in S36_12_PREFILL_KV.items():
        report = report_of(evidence, {"DYNSPEC_PREFILL_KV": value}, S31_REVISIONS)
        assert (report["gpu"], report["sglang_version"], report["path"], report["threshold"]) == (
            S31_GPU,
            "0.5.12",
            "v2",
            96,
        )
        tput = report["throughput"]
        assert report["passed"] and tput["levels"] == [128]
        _, ratios = published_per_step(evidence, tput, {"128": ({"0": 0.988, "1": 0.989}[value], 20)})
        (log,) = members(evidence / "logs.tar.xz", "dynspec-sim.log").values()
        said = (KV_ONLY_PREFILL_SAID in log, "the lean KV-only prefill took its first wave" in log)
        measured[value] = (
            tput["envelope_ratio"][0],
            outside_steady_extra(evidence, {"DYNSPEC_PREFILL_KV": value}),
            said,
        )
    assert measured == {"0": (0.978, 6, (False, False)), "1": (0.9828, 8, (True, True))}
    # both below 0.5.17's +43 and +73 of sessions 33 and 35


def test_session_36_0_5_17_passes_r_at_128_where_session_35_missed_it() -> None:
    """kv-tput on 0.5.17 at --threshold 96, 128 only (an H100, the same warm machine after the auto
    sweep): R(128) 0.984 (0.969 in session 35, the control: it failed there), per step 0.988 (19 pairs),
    dynspec's time beyond its tokens +9 ms over base's (a single 363 ms run of dynspec's and a 449 ms
    one of base's, medians 151 and 142). The two sessions' R at 128 straddle the bar."""
    report = report_of(S36_17_TPUT_128, {}, S31_REVISIONS)
    assert (report["gpu"], report["sglang_version"], report["threshold"], report["passed"]) == (
        S31_GPU,
        "0.5.17",
        96,
        True,
    )
    tput = report["throughput"]
    published_per_step(S36_17_TPUT_128, tput, {"128": (0.988, 19)})
    assert tput["envelope_ratio"] == [0.9843] and tput["envelope_ratio"][0] >= tput["min_envelope_ratio"] == 0.97
    assert tput["outside_steady_ms"] == {"dynspec": {"128": [151, 363, 124]}, "base": {"128": [120, 142, 449]}}
    earlier = report_of(S35_17_TPUT_96, {}, S31_REVISIONS)["throughput"]
    assert earlier["envelope_ratio"][-1] == 0.969 < earlier["min_envelope_ratio"]


def test_session_36_auto_at_acceptance_2_is_within_3_percent_of_every_fixed_n() -> None:
    """auto_threshold on 0.5.17 at simulated acceptance 2 (an H100; median of 2), in two calls with
    their own base, always-on and auto: N = 8, 32, 48 (auto 14.38 s, best N = 48 14.39, 0.999x) and
    N = 64, 96 (auto 14.42, best N = 96 15.15, 0.952x); with session 35's N = 16 (14.17, auto 14.55
    there) all six N of the issue are measured. Auto's median over the three calls, 14.42, is 1.018x
    the best of all six (N = 16) and below both static servers in every call; it settled at 37 / 26
    and 40 / 28 (34 / 24 in session 35). The control: a server fixed at N = 8 would miss the 3 %.
    N = 64 and 96 timed their prefills from the prefix cache (the next test): their times flatter them."""
    rows = {}
    for sweep, evidence in S36_17_AUTO_2.items():
        report = report_of(evidence, {}, S31_REVISIONS)
        assert (report["gpu"], report["sglang_version"], report["passed"]) == (S31_GPU, "0.5.17", True)
        entry = report["auto_threshold"]
        assert ",".join(map(str, entry["sweep"])) == sweep and entry["problems"] == [] and entry["repeats"] == 2
        row = entry["by_acceptance"]["2"]
        assert row["faster_than_both"] and row["auto_s"] < min(row["base_s"], row["always_on_s"])
        assert row["auto_s"] == round(statistics.median(row["samples"]["auto"]), 3)
        rows[sweep] = row
    assert {s: (r["auto_s"], r["best_fixed_n"], r["auto_over_best_fixed"]) for s, r in rows.items()} == {
        "8,32,48": (14.382, 48, 0.9993),
        "64,96": (14.417, 96, 0.9515),
    }
    settled = {
        s: (
            r["auto_decisions"]["last_estimated"]["disable_above"],
            r["auto_decisions"]["last_estimated"]["enable_at_or_below"],
        )
        for s, r in rows.items()
    }
    assert settled == {"8,32,48": (37, 26), "64,96": (40, 28)}
    at_16 = report_of(S35_17_AUTO_2, {}, S31_REVISIONS)["auto_threshold"]["by_acceptance"]["2"]
    fixed = {int(n): s for r in (*rows.values(), at_16) for n, s in r["fixed_s"].items() if s is not None}
    assert sorted(fixed) == [8, 16, 32, 48, 64, 96]
    best = min(fixed.values())
    auto = statistics.median([at_16["auto_s"], *(r["auto_s"] for r in rows.values())])
    assert (fixed[16], auto, round(auto / best, 3)) == (best, 14.417, 1.018)
    assert auto / best <= 1.03 < fixed[8] / best  # the control: N = 8 as the switch point misses the 3 %


def test_session_36_n64_and_n96_timed_their_prefills_from_the_prefix_cache() -> None:
    """Why N = 64 and 96 beat plain decode in the 128 phase (2.36 s against 2.415) though they fall back
    there as auto does (2.50): started two side by side they got 129024-slot pools, which outlast a
    pass of the load (about 100k tokens), and every pass sent the last one's prompts, so their prefills
    found 44652 prompt tokens cached; every other server, at 24576 or 40960, none. Since then each pass
    sends new prompts (mixed.Schedule.requests). Auto was faster than both anyway; the controls: the
    three of the other call, at 24576, cached nothing, and neither did auto beside N = 64 / 96."""
    report = report_of(S36_17_AUTO_2["64,96"], {}, S31_REVISIONS)
    pools = {s["name"]: s["kv_pool_tokens"] for s in report["servers"]}
    logs = members(S36_17_AUTO_2["64,96"] / "logs.tar.xz", *(f"{name}.log" for name in pools))
    cached = {name: logscan.cached_prompt_tokens(logs[f"{name}.log"]) for name in pools}
    assert {name: (pools[name], cached[name]) for name in pools} == {
        "base-auto": (40960, 0),
        "always-on-acc2": (40960, 0),
        "dynspec-auto-acc2": (40960, 0),
        "dynspec-n64-acc2": (129024, 44652),
        "dynspec-n96-acc2": (129024, 44652),
    }
    phases = report["auto_threshold"]["by_acceptance"]["2"]["phase_medians"]
    assert phases["64"][4] < phases["base"][4] < phases["auto"][4]  # the 128 phase
    other = S36_17_AUTO_2["8,32,48"]
    names = [s["name"] for s in report_of(other, {}, S31_REVISIONS)["servers"]]
    assert all(
        logscan.cached_prompt_tokens(log) == 0
        for log in members(other / "logs.tar.xz", *(f"{n}.log" for n in names)).values()
    )
    assert report["auto_threshold"]["schedule"].get("prompts_per_pass") is None  # the old load: one prompt set


# -- session 37 (runtime r29 / v2 module r48, unchanged; runs at b08652f, an H100) ------------------------

S37_17_TPUT = PROOF / "0.5.17-v2-s37-r29-tput"
S37_12_V1_TPUT = PROOF / "0.5.12-v1-s37-r29-tput"
S37_12_V1_MIXED = PROOF / "0.5.12-v1-s37-r29-mixed"


def medians(samples: dict[str, list[list[float]]], mode: str) -> list[float]:
    """Each level's median run, the lower middle of an even count (client.median_run)."""
    return [statistics.median_low(level) for level in samples[mode]]


def run_of(report: dict) -> tuple:
    """What ran, on which card, and the verdict: the GPU, SGLang's version, the path, the threshold, passed."""
    return (report["gpu"], report["sglang_version"], report["path"], report["threshold"], report["passed"])


def r_of_medians(tp: dict, base: str = "base") -> list[float | None]:
    """R(C) recomputed from each level's median run, against max(``base``, always-on)."""
    return envelope_ratio(*(medians(tp["samples"], m) for m in (base, "always_on", "dynspec")))


def v1_per_step(evidence: Path, tp: dict, control_level: int) -> tuple[dict[str, str], dict]:
    """v1's fallback step against the non-overlapping plain step, read again from the run's logs: the
    report's ``per_step_no_overlap``; the base's log against itself reads 1 (negative control). The
    logs (dynspec's and that base's) and dynspec's ratios by level."""
    logs = members(evidence / "logs.tar.xz", "dynspec-sim.log", "base-no-overlap-sim.log")
    per_step = steps.per_step(
        {"dynspec": logs["dynspec-sim.log"], "base_no_overlap": logs["base-no-overlap-sim.log"]},
        "base_no_overlap",
        tp["levels"],
    )
    assert per_step == tp["per_step_no_overlap"]
    assert ratio_against_itself(logs["base-no-overlap-sim.log"], control_level) == 1.0
    return logs, per_step["dynspec"]


def test_session_37_0_5_17_keeps_up_with_the_better_static_server_at_every_level_in_one_call() -> None:
    """Issue 13 item 3 on 0.5.17, for the first time in one call: kv-tput at --threshold 96 with four
    timed runs a level, the three servers taking turns (an H100): R(C) 1.00 / 1.01 / 1.00 / 1.01 / 0.98
    / 0.98 at C = 1, 4, 16, 32, 64, 128, every one at or above 0.97, recomputed from the runs' medians;
    per step 0.988 at 128 (28 pairs); the mixed load (new prompts each pass, none cached) 11.55 s
    against an oracle of 11.53, below always-on (12.26) and plain decode (16.23). The control: session
    35's call, the same command with three runs, missed at 128 (0.969)."""
    report = report_of(S37_17_TPUT, {}, S31_REVISIONS)
    assert run_of(report) == (S31_GPU, "0.5.17", "v2", 96, True)
    tp = report["throughput"]
    assert tp["levels"] == [1, 4, 16, 32, 64, 128] and tp["repeats"] == 4 and tp["order"].startswith("interleaved")
    assert all(len(level) == 4 for runs in tp["samples"].values() for level in runs)
    recomputed = r_of_medians(tp)
    assert tp["envelope_ratio"] == recomputed == [1.0, 1.0072, 0.9962, 1.0076, 0.9828, 0.9813]
    assert min(recomputed) >= tp["min_envelope_ratio"] == 0.97
    published_per_step(S37_17_TPUT, tp, {"128": (0.988, 28)})
    ml = report["mixed_load"]
    assert ml["passed"] and ml["seconds"] == {"base": 16.231, "always_on": 12.261, "dynspec": 11.545}
    assert (ml["oracle_seconds"], ml["dynspec_over_oracle"]) == (11.531, 1.0012)
    assert ml["schedule"]["prompts_per_pass"] == 596
    assert [s["mixed_cached_prompt_tokens"] for s in report["servers"]] == [0, 0, 0]
    earlier = report_of(S35_17_TPUT_96, {}, S31_REVISIONS)["throughput"]
    assert earlier["repeats"] == 3 and earlier["envelope_ratio"][-1] < earlier["min_envelope_ratio"]


def test_session_37_v1_steps_at_the_bar_and_r_at_128_below_it_one_server_after_another() -> None:
    """Issue 13 items 2 and 3 for v1 on r29 (0.5.12, --disable-overlap-schedule, --threshold 96, four
    servers one after another, an H100): against max(plain decode without overlap, always-on) R(C)
    1.02 / 0.98 / 1.04 / 1.00 / 1.00 / 0.96, missing 0.97 at 128; the fallback step 0.970 of a
    non-overlapping plain step (21 pairs, 0.927 - 1.105: servers measured minutes apart). The miss: one
    run of dynspec's (9537 tok/s, 1013 ms beyond its tokens against 182 / 186) is the one in which
    the batch reached 95 before its first decode step, so speculation turned on at 95 and off again
    at 128, its first speculative steps above 64 requests; the other two (11726, 12050) against base's
    11525 / 12189 / 12440, whose later runs ran faster. Steady speeds, run by run, within 1 %."""
    report = report_of(S37_12_V1_TPUT, {}, S31_REVISIONS)
    assert run_of(report) == (S31_GPU, "0.5.12", "v1", 96, False)
    tp = report["throughput"]
    assert tp["order"] == "one server after another" and tp["judged_against"] == "base_no_overlap"
    no_overlap = r_of_medians(tp, "base_no_overlap")
    assert tp["envelope_ratio_no_overlap"] == no_overlap == [1.0166, 0.9818, 1.042, 0.9966, 0.9988, 0.962]
    assert [c for c, r in zip(tp["levels"], no_overlap) if r is not None and r < 0.97] == [128]
    assert tp["problems"] == ["R(C) against max(non-overlap base, always-on) below 0.97 at C=128: 0.962"]
    logs, per_step = v1_per_step(S37_12_V1_TPUT, tp, 128)
    assert per_step["128"] == {"pairs": 21, "min": 0.927, "median": 0.97, "max": 1.105}
    # the slow run, and the one time speculation turned on above 64 in the whole call
    assert tp["outside_steady_ms"]["dynspec"]["128"] == [182, 186, 1013]
    assert tp["samples"]["dynspec"][-1] == [11726.0, 12049.6, 9536.8]
    switches = [(t.direction, t.batch_size) for t in logscan.scan(logs["dynspec-sim.log"]).transitions]
    assert switches == [("OFF", 128), ("ON", 95), ("OFF", 128), ("ON", 33)]
    steady = {m: statistics.median(tp["per_run"][m]["128"][1:]) for m in ("dynspec", "base_no_overlap")}
    assert steady == {"dynspec": 12933, "base_no_overlap": 13051}
    assert 0.99 < steady["dynspec"] / steady["base_no_overlap"] < 1


def test_session_37_v1_mixed_load_is_faster_than_both_static_servers() -> None:
    """Issue 13 item 4 for v1 on r29 (reported; 0.5.12, --threshold 96, medians of 3, one server after
    another): dynspec 13.46 s against always-on 14.69 and plain decode 16.41 (overlapping) / 19.80 (not):
    1.024 x the oracle of the overlapping base's phases, 0.957 x that of the non-overlapping one.
    No server's passes found a prompt in the cache, the non-overlapping base's 131072-slot pool too
    (the control that the new prompts each pass are what keeps it so: session 36's test)."""
    report = report_of(S37_12_V1_MIXED, {}, S31_REVISIONS)
    assert (report["gpu"], report["sglang_version"], report["path"], report["passed"]) == (
        S31_GPU,
        "0.5.12",
        "v1",
        True,
    )
    ml = report["mixed_load"]
    assert ml["seconds"] == {"base": 16.413, "always_on": 14.686, "dynspec": 13.456}
    assert ml["seconds"]["dynspec"] == statistics.median(ml["samples"]["dynspec"])
    assert (ml["oracle_seconds"], ml["dynspec_over_oracle"]) == (13.137, 1.0243)
    other = ml["no_overlap"]
    assert (other["seconds"]["base"], other["oracle_seconds"], other["dynspec_over_oracle"]) == (19.802, 14.059, 0.9571)
    pools = {s["name"]: (s["kv_pool_tokens"], s["mixed_cached_prompt_tokens"]) for s in report["servers"]}
    assert pools == {
        "dynspec-sim": (40960, 0),
        "always-on-sim": (40960, 0),
        "base-sim": (40960, 0),
        "base-no-overlap-sim": (131072, 0),
    }
    assert report["servers"][0]["switches"] == {"off": 5, "on": 5}


S38_12_V1_TPUT = PROOF / "0.5.12-v1-s38-r29-tput"
S38_12_V1_TPUT_32 = PROOF / "0.5.12-v1-s38-r29-tput-n32"
S38_17_TPUT_32K = PROOF / "0.5.17-v2-s38-r29-tput-32k"
S38_17_FLASHINFER = PROOF / "0.5.17-v2-s38-r29-flashinfer-tput"
S38_17_FLASHINFER_DIAG = PROOF / "0.5.17-v2-s38-r29-flashinfer-diag"
V1_LOGS = ("dynspec-sim.log", "always-on-sim.log", "base-no-overlap-sim.log", "base-sim.log")


def collections_by_server(evidence: Path) -> dict[str, list[tuple[int, float, int]]]:
    """Per server log: each long collection SGLang's HTTP process logged, as (generation, seconds, the
    runs at 128 with steady steps before it: 3 puts it in the admission of the last timed run)."""
    out = {}
    for name, text in members(evidence / "logs.tar.xz", *V1_LOGS).items():
        lines = text.splitlines()
        out[name] = [
            (
                c.generation,
                c.seconds,
                len(steps.per_run({"x": "\n".join(lines[: c.line - 1])}, [128]).get("x", {}).get("128", [])),
            )
            for c in logscan.scan(text).collections
        ]
    return out


def v1_taking_turns(
    evidence: Path, revisions: dict[str, int], card_and_verdict: tuple[str, bool], published: list[float]
) -> tuple[dict, dict, dict]:
    """A v1 kv-tput at threshold 96 with the three compared taking turns: its report, throughput entry
    and dynspec's per-step ratios against the non-overlapping base (read again from the logs), once
    R against that base, recomputed from the runs' medians, is the ``published`` one."""
    report = report_of(evidence, {}, revisions)
    gpu, passed = card_and_verdict
    assert run_of(report) == (gpu, "0.5.12", "v1", 96, passed)
    tp = report["throughput"]
    assert tp["order"].startswith("interleaved: dynspec-sim, always-on-sim, base-no-overlap-sim took turns")
    assert tp["envelope_ratio_no_overlap"] == r_of_medians(tp, "base_no_overlap") == published
    return report, tp, v1_per_step(evidence, tp, 128)[1]


def test_session_38_v1_taking_turns_misses_r_at_128_by_one_collection_in_the_http_process() -> None:
    """Issue 13 item 3 for v1 with the compared three taking turns (0.5.12, --threshold 96, an H100,
    every server with SGLang's --gc-warning-threshold-secs 0.05): R(C) against max(plain decode without
    overlap, always-on) 1.01 / 1.01 / 1.05 / 1.00 / 1.01 / 0.955, missing at 128 again; the step 0.960
    (20 pairs, 0.893 - 1.072). Every server logged one generation-2 collection of 0.44 - 0.46 s (765k
    objects: the start-up's) in its HTTP process, and dynspec's and the non-overlapping base's fell in
    the admission of their third timed run at 128: the slow runs, 616 and 528 ms beyond their tokens
    against 211 - 263. So session 37's slow first switch back on was a collection, not a compile."""
    report, tp, per_step = v1_taking_turns(
        S38_12_V1_TPUT, S31_REVISIONS, (S31_GPU, False), [1.0146, 1.0103, 1.0451, 1.0024, 1.0134, 0.9554]
    )
    assert per_step["128"] == {"pairs": 20, "min": 0.893, "median": 0.96, "max": 1.072}
    found = collections_by_server(S38_12_V1_TPUT)
    assert {name: [(g, round(s, 2)) for g, s, _ in c] for name, c in found.items()} == {
        "dynspec-sim.log": [(2, 0.46)],
        "always-on-sim.log": [(2, 0.46)],
        "base-no-overlap-sim.log": [(2, 0.44)],
        "base-sim.log": [(2, 0.45)],
    }
    # the warm-up and two timed runs at 128 before it: in the third timed run's admission
    assert [found[n][0][2] for n in ("dynspec-sim.log", "base-no-overlap-sim.log")] == [3, 3]
    outside = tp["outside_steady_ms"]
    assert (outside["dynspec"]["128"], outside["base_no_overlap"]["128"]) == ([211, 243, 616], [204, 263, 528])
    assert all(runs[2] > max(runs[:2]) + 250 for runs in (outside["dynspec"]["128"], outside["base_no_overlap"]["128"]))


def test_session_38_v1_falls_back_at_0_977_and_0_978_of_a_non_overlapping_step() -> None:
    """Issue 13 item 2 for v1 at both levels (0.5.12, --threshold 32 so that 64 falls back, the three
    taking turns, an H100): the fallback step 0.977 at 64 (21 pairs) and 0.978 at 128 (21 pairs) of the
    non-overlapping plain step. R at 64 misses (0.94) as the plan expected: always-on is faster there on
    an H100. R(128) 0.98. dynspec's one long collection fell in its third timed run at 128 again (723 ms
    beyond its tokens against 183 / 221); no other server logged one in this shorter call."""
    report = report_of(S38_12_V1_TPUT_32, {}, S31_REVISIONS)
    assert (report["gpu"], report["path"], report["threshold"], report["passed"]) == (S31_GPU, "v1", 32, False)
    tp = report["throughput"]
    assert tp["levels"] == [64, 128]
    no_overlap = r_of_medians(tp, "base_no_overlap")
    assert tp["envelope_ratio_no_overlap"] == no_overlap == [0.9402, 0.9826]
    assert medians(tp["samples"], "always_on")[0] > medians(tp["samples"], "base_no_overlap")[0]
    _, per_step = v1_per_step(S38_12_V1_TPUT_32, tp, 64)
    assert {c: (r["median"], r["pairs"]) for c, r in per_step.items()} == {"64": (0.977, 21), "128": (0.978, 21)}
    found = collections_by_server(S38_12_V1_TPUT_32)
    assert [(n, len(c)) for n, c in found.items() if c] == [("dynspec-sim.log", 1)]
    assert found["dynspec-sim.log"][0][2] == 3 and tp["outside_steady_ms"]["dynspec"]["128"] == [183, 221, 723]


def test_session_38_a_32k_draft_vocabulary_keeps_up_on_r29() -> None:
    """Issue 13 item 5 on r29 (0.5.17, the 8B target with a 32k-vocabulary EAGLE-3 draft, --threshold 96,
    the three taking turns, an H100): R(C) 0.99 / 1.00 / 0.97 at C = 1, 64, 128; per step 0.987 at 128
    (24 pairs); the mixed load 10.92 s against an oracle of 10.73 (1.018 x), below always-on (11.28) and
    plain decode (16.16), no prompt cached."""
    report = report_of(S38_17_TPUT_32K, {}, S31_REVISIONS)
    assert (report["gpu"], report["sglang_version"], report["threshold"], report["passed"]) == (
        S31_GPU,
        "0.5.17",
        96,
        True,
    )
    tp = report["throughput"]
    assert tp["shape"] == "8b-32k" and tp["levels"] == [1, 64, 128] and tp["order"].startswith("interleaved")
    recomputed = r_of_medians(tp)
    assert tp["envelope_ratio"] == recomputed == [0.9865, 0.999, 0.9718]
    assert min(recomputed) >= tp["min_envelope_ratio"]
    published_per_step(S38_17_TPUT_32K, tp, {"128": (0.987, 24)})
    ml = report["mixed_load"]
    assert ml["passed"] and ml["seconds"] == {"base": 16.158, "always_on": 11.283, "dynspec": 10.919}
    assert (ml["oracle_seconds"], ml["dynspec_over_oracle"]) == (10.727, 1.0179)
    assert [s["mixed_cached_prompt_tokens"] for s in report["servers"]] == [0, 0, 0]


def test_session_38_on_flashinfer_the_one_token_verify_costs_nearly_two_plain_steps() -> None:
    """Issue 17's `backends` step cost, measured for the first time (0.5.17, every server on FlashInfer,
    --threshold 32, an H100): dynspec's fallback step is 0.57 / 0.55 of a plain step at 64 / 128 (29 /
    26 pairs), so R(C) 0.38 / 0.49 and the mixed load 1.55 x its oracle, slower than plain decode. The
    draft KV is not the cost: the diag's server with the full draft extend (DYNSPEC_DRAFT_KV=full)
    runs at 0.53, the KV-only one at 0.54 (5 pairs each). What is: `auto` keeps the one-token verify
    on the backend's verify path unless the backend is one its decode kernel was proven on (Triton
    only), and FlashInfer's verify replay plans a paged prefill on the host each step. Also: on
    FlashInfer always-on was faster than plain decode at 64 and 128 both (no switch point up to 128)."""
    report = report_of(S38_17_FLASHINFER, {}, S31_REVISIONS)
    assert (report["gpu"], report["attention_backend"], report["threshold"], report["passed"]) == (
        S31_GPU,
        "flashinfer",
        32,
        False,
    )
    tp = report["throughput"]
    assert tp["envelope_ratio"] == [0.3835, 0.4857]
    published_per_step(S38_17_FLASHINFER, tp, {"64": (0.569, 29), "128": (0.546, 26)})
    on, base = medians(tp["samples"], "always_on"), medians(tp["samples"], "base")
    assert all(a > b for a, b in zip(on, base))
    assert report["mixed_load"]["dynspec_over_oracle"] == 1.5504
    # the diag: plain decode, the KV-only fallback and the full one, each alone, at 64
    logs = {
        p.name.removesuffix(".log.gz"): gzip.decompress(p.read_bytes()).decode()
        for p in S38_17_FLASHINFER_DIAG.glob("*.log.gz")
    }
    ratios = steps.per_step(logs, "base", [64])
    assert ratios == json.loads((S38_17_FLASHINFER_DIAG / "per_step.json").read_text())
    assert {n: (r["64"]["median"], r["64"]["pairs"]) for n, r in ratios.items()} == {
        "full-sim": (0.532, 5),
        "dyn-sim": (0.539, 5),
    }
    assert ratio_against_itself(logs["base"], 64) == 1.0  # negative control
    assert all("attention_backend='flashinfer'" in log for log in logs.values())  # SGLang's server_args line
    # why: r29's auto ran the decode kernel on Triton only (DECODE_PROVEN_BACKENDS), and its start-up line
    # did not say which; since r30 FlashInfer decodes too and the line names the choice
    ready = [line for line in logs["dyn-sim"].splitlines() if "zero-step state ready" in line]
    assert len(ready) == 1 and "one-token verify through" not in ready[0]


# -- session 39 (runtime r30 / v2 module r50 at 959eb9a, an H200): FlashInfer's one-token verify through
# its decode kernel and its draft KV written directly; Triton's kv-proof again on the new revisions ------

S39_REVISIONS = {"speculative_dynspec_runtime": 30, "speculative_dynspec_v2": 50, "speculative_dynspec_settings": 2}
S39_GPU = "NVIDIA H200"
S39_17_FLASHINFER_PROOF = PROOF / "0.5.17-v2-s39-r30-flashinfer-proof"
S39_17_PROOF = PROOF / "0.5.17-v2-s39-r30-proof"
S39_17_FLASHINFER_TPUT = {
    32: PROOF / "0.5.17-v2-s39-r30-flashinfer-tput-n32",
    96: PROOF / "0.5.17-v2-s39-r30-flashinfer-tput-n96",
}
FLASHINFER_DECODES = "one-token verify through FlashInferAttnBackend's decode kernel"


def test_session_39_on_flashinfer_the_fallback_is_exact_and_writes_the_draft_kv_directly() -> None:
    """Issue 17's `backends` on 0.5.17 with r30 / r50: equivalence, 100 crossings and exact_kv (1894 of
    1894 proposals; the no-write control differs at 32), every server on FlashInfer. What ran is read
    from dynspec's own log: the decode kernel for the one-token verify (r30) and the direct write
    (r50), where session 38's r29 / r48 ran the verify path and the stock-prepared extend."""
    report_of(S39_17_FLASHINFER_PROOF, {}, S39_REVISIONS)
    report, files, counts = passed_kv_proof(S39_17_FLASHINFER_PROOF)
    assert (report["gpu"], report["attention_backend"]) == (S39_GPU, "flashinfer")
    assert counts == {"compared_requests": 28, "compared_steps": 1894, "control_differs": True}
    assert report["backends"]["passed"] and report["backends"]["crossings"] == 100
    assert report["exact_kv"]["kv_only_extend"] == "from a CUDA graph, replayed directly"
    for name in ("dynspec", "dynspec-full", "dynspec-skip"):
        assert "attention_backend='flashinfer'" in files[f"{name}.log"]
    ready = [line for line in files["dynspec.log"].splitlines() if "zero-step state ready" in line]
    assert len(ready) == 1 and FLASHINFER_DECODES in ready[0]
    assert "the direct write" not in files["dynspec.log"]  # no refusal of the backend
    # control: session 38's dynspec on FlashInfer (r29 / r48) refused the direct write and said so
    before = members(S38_17_FLASHINFER / "logs.tar.xz", "dynspec-sim.log")["dynspec-sim.log"]
    assert "the direct write has run with TritonAttnBackend only, not FlashInferAttnBackend" in before


def test_session_39_triton_keeps_its_kv_proof_on_r30_and_r50() -> None:
    """The default backend on the revisions that changed FlashInfer's: equivalence, 100 crossings,
    exact_kv 1920 / 1920 (control differs at 32), refusals 6 / 6, metrics; the ready line names Triton's
    decode kernel."""
    report_of(S39_17_PROOF, {}, S39_REVISIONS)
    report, files, counts = passed_kv_proof(S39_17_PROOF)
    assert (report["gpu"], report["attention_backend"], report["passed"]) == (S39_GPU, "triton", True)
    assert counts == {"compared_requests": 28, "compared_steps": 1920, "control_differs": True}
    assert report["refusals"]["passed"] and report["metrics"]["passed"]
    ready = [line for line in files["dynspec.log"].splitlines() if "zero-step state ready" in line]
    assert len(ready) == 1 and "one-token verify through TritonAttnBackend's decode kernel" in ready[0]


def test_session_39_on_flashinfer_a_fallback_step_costs_about_a_plain_one() -> None:
    """The fix of session 38's finding: at --threshold 32 dynspec's fallback step is 0.976 / 0.991 of
    plain decode's at 64 / 128 (28 / 25 pairs; r29: 0.569 / 0.546 on an H100). R(64) is 0.77 and the
    mixed load 1.035 x its oracle because on FlashInfer speculation stays faster up to about 121
    requests on an H200: N = 32 is the wrong switch point there, not a slow fallback. At N = 96 the
    mixed load is 1.005 x its oracle, and 0.01 s slower than always-on, which is itself within 0.4 %
    of the oracle on this load: nothing there for a switch to win."""
    at_32 = report_of(S39_17_FLASHINFER_TPUT[32], {}, S39_REVISIONS)
    at_96 = report_of(S39_17_FLASHINFER_TPUT[96], {}, S39_REVISIONS)
    assert [(r["gpu"], r["attention_backend"], r["threshold"]) for r in (at_32, at_96)] == [
        (S39_GPU, "flashinfer", 32),
        (S39_GPU, "flashinfer", 96),
    ]
    tp = at_32["throughput"]
    published_per_step(S39_17_FLASHINFER_TPUT[32], tp, {"64": (0.976, 28), "128": (0.991, 25)})
    assert tp["envelope_ratio"] == [0.7663, 0.9855] == r_of_medians(tp)
    assert tp["switch_point"]["crossover_estimate"] == 121
    mixed = at_32["mixed_load"]
    assert (mixed["dynspec_over_oracle"], mixed["passed"]) == (1.0348, False)
    sixty_four = [p for p in mixed["phases"] if p["C"] == 64]
    assert len(sixty_four) == 2 and all(p["dynspec_s"] > p["always_on_s"] * 1.2 for p in sixty_four)
    tp96 = at_96["throughput"]
    assert tp96["per_step"]["dynspec"]["128"]["median"] == 0.991 and "64" not in tp96["per_step"]["dynspec"]
    assert tp96["envelope_ratio"] == [0.9398, 0.9772] == r_of_medians(tp96)
    mixed = at_96["mixed_load"]
    assert (mixed["dynspec_over_oracle"], mixed["passed"]) == (1.0046, False)
    assert mixed["problems"] == ["dynspec is not faster than always_on (9.29 s): 9.30 s"]
    assert mixed["seconds"]["always_on"] / mixed["oracle_seconds"] < 1.004


def test_session_39_dynspecs_speculating_steps_against_always_ons_triton_and_flashinfer() -> None:
    """Where dynspec speculates (C <= N), its steps against always-on's (`per_step_speculating`, read
    from the logs after the runs): on Triton (session 37, 0.5.17, N = 96, taking turns) 0.999 - 1.000
    at every level to 64; on FlashInfer (session 39, N = 96, one after another) 0.987 at 64 over 4
    pairs (0.942 - 1.009), where R(64) read 0.94: most of that gap is outside the steady steps (the
    admissions), and 4 pairs settle nothing. The control: always-on's log against itself reads 1."""

    def speculating(evidence: Path, levels: list[int]) -> tuple[dict, dict[str, str]]:
        logs = members(evidence / "logs.tar.xz", "dynspec-sim.log", "always-on-sim.log")
        pair = {"always_on": logs["always-on-sim.log"], "dynspec": logs["dynspec-sim.log"]}
        control = {"always_on": logs["always-on-sim.log"], "same": logs["always-on-sim.log"]}
        assert all(
            r["median"] == 1.0 for r in steps.per_step(control, "always_on", levels, speculating=True)["same"].values()
        )
        return steps.per_step(pair, "always_on", levels, speculating=True)["dynspec"], logs

    triton, _ = speculating(S37_17_TPUT, [1, 4, 16, 32, 64])
    assert {c: r["median"] for c, r in triton.items()} == {"1": 0.999, "4": 1.0, "16": 1.0, "32": 0.999, "64": 1.0}
    flashinfer, _ = speculating(S39_17_FLASHINFER_TPUT[96], [64])
    assert flashinfer == {"64": {"pairs": 4, "min": 0.942, "median": 0.987, "max": 1.009}}


# -- session 40 (runtime r30 / v2 module r50 at d927541, an H100): issue 13's Triton evidence on r30,
# v1 with every server's collector frozen after its warm-up ---------------------------------------------

S40_GPU = S31_GPU
S40_12_V1_TPUT = PROOF / "0.5.12-v1-s40-r30-tput"
S40_17_TPUT = PROOF / "0.5.17-v2-s40-r30-tput"
S40_CROSSED = {
    "0.5.12-v2": (PROOF / "0.5.12-v2-s40-r30-proof", 1986),
    "0.5.12-v1": (PROOF / "0.5.12-v1-s40-r30-proof", 1982),
    "0.5.13-v2": (PROOF / "0.5.13-v2-s40-r30-proof", 1934),
}
S40_REFUSED = ("0.5.12-v2", "0.5.12-v1", "0.5.13-v2")
TRITON_DECODES = "one-token verify through TritonAttnBackend's decode kernel"


def no_long_collections(report: dict) -> None:
    """--freeze-gc ran, and no server's HTTP process logged a collection over the report's bound."""
    assert "--freeze-gc" in report["command"]
    assert [(s["name"], s["long_gc"]) for s in report["servers"]] == [(s["name"], []) for s in report["servers"]]


def test_session_40_v1_with_its_collector_frozen_keeps_up_at_every_level() -> None:
    """Issue 13 items 2 and 3 for v1 on r30 (0.5.12, --disable-overlap-schedule, --threshold 96, the
    three taking turns, --freeze-gc, an H100): R(C) against max(plain decode without overlap,
    always-on) 1.01 / 1.01 / 1.00 / 1.00 / 1.01 / 1.00, every level at or above 0.97; the fallback step
    0.987 of a non-overlapping plain step at 128 (22 pairs). No server logged a long collection. The
    control: session 38's same command without --freeze-gc, whose servers each logged one and whose
    R(128) missed (0.955)."""
    report, tp, per_step = v1_taking_turns(
        S40_12_V1_TPUT, S39_REVISIONS, (S40_GPU, True), [1.0104, 1.0134, 0.9973, 0.9993, 1.0121, 0.9983]
    )
    assert min(tp["envelope_ratio_no_overlap"]) >= tp["min_envelope_ratio"] == 0.97 and tp["problems"] == []
    assert per_step == {"128": {"pairs": 22, "min": 0.946, "median": 0.987, "max": 1.035}}
    no_long_collections(report)
    assert not any(collections_by_server(S40_12_V1_TPUT).values())
    before = report_of(S38_12_V1_TPUT, {}, S31_REVISIONS)
    assert "--freeze-gc" not in before["command"] and all(collections_by_server(S38_12_V1_TPUT).values())
    assert before["throughput"]["envelope_ratio_no_overlap"][-1] < 0.97


def r30_at_every_level(evidence: Path, release: str, r: list[float], step_128: tuple[float, int]) -> dict:
    """A v2 kv-tput run on r30 / r50 at threshold 96, an H100, taking turns: R(C) at the six levels
    recomputed from the runs' medians, each at or above 0.97, and the step at 128 from the logs. Its report."""
    report = report_of(evidence, {}, S39_REVISIONS)
    assert run_of(report) == (S31_GPU, release, "v2", 96, True)
    tp = report["throughput"]
    assert tp["levels"] == [1, 4, 16, 32, 64, 128] and tp["order"].startswith("interleaved")
    recomputed = r_of_medians(tp)
    assert tp["envelope_ratio"] == recomputed == r
    assert min(recomputed) >= tp["min_envelope_ratio"] == 0.97
    published_per_step(evidence, tp, {"128": step_128})
    return report


def test_session_40_0_5_17_on_r30_keeps_up_at_every_level_and_beats_both_static_servers_mixed() -> None:
    """Issue 13 items 2 - 4 on 0.5.17 with r30 / r50 (--threshold 96, taking turns, --freeze-gc, an
    H100): R(C) 1.00 / 1.00 / 1.00 / 0.99 / 1.03 / 0.98, recomputed from the runs' medians; the fallback
    step 0.986 of plain decode's at 128 (32 pairs; at 64 dynspec speculates at this N); its speculating
    steps 0.997 - 0.999 of always-on's; the mixed load 11.54 s against an oracle of 11.46 (1.007 x),
    below always-on (12.10) and plain decode (16.61), no prompt cached, no long collection."""
    report = r30_at_every_level(S40_17_TPUT, "0.5.17", [1.0009, 0.999, 1.0037, 0.9928, 1.0259, 0.977], (0.986, 32))
    speculating = report["throughput"]["per_step_speculating"]["dynspec"]
    assert sorted(speculating) == ["1", "16", "32", "4", "64"]
    assert all(0.997 <= r["median"] <= 0.999 for r in speculating.values())
    ml = report["mixed_load"]
    assert ml["passed"] and ml["seconds"] == {"base": 16.605, "always_on": 12.101, "dynspec": 11.535}
    assert (ml["oracle_seconds"], ml["dynspec_over_oracle"]) == (11.458, 1.0067)
    assert ml["seconds"]["dynspec"] < min(ml["seconds"]["base"], ml["seconds"]["always_on"])
    assert [s["mixed_cached_prompt_tokens"] for s in report["servers"]] == [0, 0, 0]
    no_long_collections(report)


@pytest.mark.parametrize("run", sorted(S40_CROSSED))
def test_session_40_every_path_of_issue_13_keeps_its_draft_kv_exact_on_r30(run: str) -> None:
    """Issue 13 item 1 on r30 / r50 (0.5.17's ran in session 39): equivalence, 100 crossings and
    exact_kv, recomputed from the recordings with the no-write control, on 0.5.12 v2 and v1 and
    0.5.13; the KV-only graph replayed directly and the one-token verify on Triton's decode kernel."""
    evidence, compared = S40_CROSSED[run]
    report = report_of(evidence, {}, S39_REVISIONS)
    assert (report["sglang_version"], report["path"], report["gpu"]) == (*run.split("-"), S40_GPU)
    assert report["checks"] == ["equivalence", "crossings", "exact_kv"] and report["passed"]
    _, files, counts = passed_kv_proof(evidence)
    assert counts == {"compared_requests": 28, "compared_steps": compared, "control_differs": True}
    assert report["exact_kv"]["kv_only_extend"] == "from a CUDA graph, replayed directly"
    ready = [line for line in files["dynspec.log"].splitlines() if "fallback ready in" in line]
    assert len(ready) == 1 and TRITON_DECODES in ready[0]


@pytest.mark.parametrize("run", S40_REFUSED)
def test_session_40_refusals_on_r30(run: str) -> None:
    """refusals on r30: 7 of 7 cases refused at start-up with one line and no traceback, on 0.5.12 v2 and
    v1 and 0.5.13 (auto's refusal is the seventh: it needs 0.5.14)."""
    report = report_of(PROOF / f"{run}-s40-r30-refusals", {}, S39_REVISIONS)
    assert (report["sglang_version"], report["path"], report["gpu"]) == (*run.split("-"), S40_GPU)
    rows = refused_all(report, 7)
    assert "auto" in {row["name"] for row in rows}


# -- session 43 (runtime r30 / v2 module r50 at 53047e7 - 3878063; no file under patches/ changed since
# d927541; an H100): issue 13's last 0.5.12 v2 throughput on r30, and the step at 64 ----------------------

S43_12_TPUT = PROOF / "0.5.12-v2-s43-r30-tput"
S43_STEP64 = {"0.5.12": PROOF / "0.5.12-v2-s43-r30-step64", "0.5.17": PROOF / "0.5.17-v2-s43-r30-step64"}


def test_session_43_0_5_12_v2_on_r30_keeps_up_at_every_level_and_beats_both_static_servers_mixed() -> None:
    """Issue 13 items 2 - 4 for 0.5.12 v2 on r30 / r50 (--threshold 96, taking turns, --freeze-gc, an
    H100): R(C) 1.02 / 1.02 / 1.01 / 1.01 / 1.01 / 0.97, recomputed from the runs' medians, each at or
    above 0.97; the fallback step 0.984 of plain decode's at 128 (32 pairs); the mixed load 11.84 s
    against an oracle of 11.76 (1.006 x), below always-on (12.49) and plain decode (16.49), no prompt
    cached, no long collection."""
    report = r30_at_every_level(S43_12_TPUT, "0.5.12", [1.0235, 1.0155, 1.0097, 1.0077, 1.0105, 0.9745], (0.984, 32))
    ml = report["mixed_load"]
    assert ml["passed"] and ml["seconds"] == {"base": 16.49, "always_on": 12.49, "dynspec": 11.837}
    assert (ml["oracle_seconds"], ml["dynspec_over_oracle"]) == (11.763, 1.0063) and ml["dynspec_over_oracle"] <= 1.03
    assert ml["seconds"]["dynspec"] < min(ml["seconds"]["base"], ml["seconds"]["always_on"])
    assert [s["mixed_cached_prompt_tokens"] for s in report["servers"]] == [0, 0, 0]
    no_long_collections(report)


@pytest.mark.parametrize(
    ("release", "published", "r_at_64"),
    [
        ("0.5.12", {"64": (0.983, 20), "128": (0.987, 21)}, 0.9446),
        ("0.5.17", {"64": (0.981, 20), "128": (0.986, 21)}, 0.9125),
    ],
)
def test_session_43_the_fallback_step_at_64_and_128_on_r30(release: str, published: dict, r_at_64: float) -> None:
    """Issue 13 item 2 at 64 on r30 (the H100's N = 96 leaves 64 speculating, so these runs take N = 32,
    both levels falling back): dynspec's step against plain decode's 0.983 / 0.987 on 0.5.12 v2 and
    0.981 / 0.986 on 0.5.17, every median at or above the bar of 0.98, read again from the logs. R(64)
    fails there, as it must on this card at N = 32 (always-on is the faster at 64): the check was run
    for the step, and its verdict is recorded, not hidden. 0.5.17's is the one-part kit's first start."""
    evidence = S43_STEP64[release]
    report = report_of(evidence, {}, S39_REVISIONS)
    assert run_of(report) == (S31_GPU, release, "v2", 32, False)
    tp = report["throughput"]
    assert tp["levels"] == [64, 128] and tp["envelope_ratio"][0] == r_at_64 < 0.97
    assert tp["problems"] == [f"R(C) below 0.97 at C=64: {r_at_64}"]
    _, ratios = published_per_step(evidence, tp, published)
    assert all(r["median"] >= 0.98 for r in ratios["dynspec"].values())
    no_long_collections(report)


# -- session 44 (runtime r30 / v2 module r50 at 2476018; an H100): issue 17's features on real weights on
# 0.5.17, 0.5.12 v2 and v1, and FlashInfer on 0.5.12 v2 -----------------------------------------------------

S44_FEATURES = {
    "0.5.17-v2": PROOF / "real-0.5.17-v2-s44-r30-features",
    "0.5.12-v2": PROOF / "real-0.5.12-v2-s44-r30-features",
    "0.5.12-v1": PROOF / "real-0.5.12-v1-s44-r30-features",
}
S44_V1_OVERLAP_BASE = PROOF / "real-0.5.12-v1-s44-r30-features-overlap-base"
S44_V1_PENALTIES = PROOF / "real-0.5.12-v1-s44-r30-penalties-v1-base"
S44_12_FLASHINFER = PROOF / "0.5.12-v2-s44-r30-flashinfer-proof"
S44_HEAD = "8379af65cf1b9cea0376735722c3f457426a3f93bdf906652cc25a9f528f5008"  # REAL_HEAD=quick's
FEATURE_CHECKS = ("sampling", "logprobs", "penalties", "grammar")
OVERLAP_OFF = "--disable-overlap-schedule"


def real_features(evidence: Path, run: str) -> dict:
    """A real-features report on SmolLM2-135M and session 44's head, on r30 / r50, with deterministic
    inference: what ran, each server's argv and whether it overlapped."""
    report = report_of(evidence, {}, S39_REVISIONS)
    assert (report["sglang_version"], report["path"], report["gpu"]) == (*run.split("-"), S31_GPU)
    assert report["model"].startswith("SmolLM2-135M-Instruct") and report["model_sha256"]["head"] == S44_HEAD
    assert all("--enable-deterministic-inference" in s["argv"] for s in report["servers"])
    return report


@pytest.mark.parametrize("run", sorted(S44_FEATURES))
def test_session_44_every_feature_passes_through_the_fallback_on_real_weights(run: str) -> None:
    """Issue 17 on r30: sampling (a G-test over 1200 draws a phase, p > 0.01, the control at
    temperature 0.7 far below), logprobs (3072 off, largest difference 0.0), penalties (no request
    apart, the control changing 7 and 10) and grammar (every output valid and the reference's, 16
    ballast keeping the phase off above the threshold) pass on 0.5.17 and 0.5.12 v2, and on v1 against
    plain decode on v1's own scheduler (every server --disable-overlap-schedule)."""
    report = real_features(S44_FEATURES[run], run)
    assert report["passed"] and all(report[c]["passed"] for c in FEATURE_CHECKS)
    sampled = report["sampling"]["phases"]
    for phase in ("on", "off"):
        assert sampled[phase]["dynspec"]["samples"] == [1200, 1200]
        assert sampled[phase]["dynspec"]["p_value"] > 0.01 > 1e-30 > sampled[phase]["control"]["p_value"]
    assert report["logprobs"]["phases"]["off"]["compared"] == 3072
    assert report["logprobs"]["phases"]["off"]["max_abs_diff"] == 0.0
    assert report["logprobs"]["phases"]["off"]["control_apart"] == "16 of 16 requests"
    penalties = report["penalties"]["phases"]
    assert [(penalties[p]["differ"], penalties[p]["control_changed"]) for p in ("on", "off")] == [(0, 7), (0, 10)]
    grammar = report["grammar"]["phases"]
    assert grammar["off"]["ballast"] == 16 and grammar["off"]["differ"] == grammar["on"]["differ"] == 0
    assert grammar["off"]["valid"] == {"base": 16, "always_on": 16, "dynspec": 16, "control": 0}
    overlapping = {s["name"]: OVERLAP_OFF not in s["argv"] for s in report["servers"]}
    assert overlapping == dict.fromkeys(("base-features", "always-on-features", "dynspec-features"), run != "0.5.12-v1")
    (log,) = members(S44_FEATURES[run] / "logs.tar.xz", "dynspec-features.log").values()
    assert "draws sampled batches with the target's sampler" in log


def test_session_44_v1_judged_against_the_overlapping_base_parts_on_penalties_alone() -> None:
    """0.5.12 v1 with the harness of 2476018: base on the overlap scheduler, dynspec and always-on on
    v1's. Sampling, logprobs and grammar pass; penalties fail the phase off by one request of 16, which
    the next call, every server without overlap, did not (SGLang's overlap scheduler counts a
    penalty's token a step late: 0.5.12's prepare_for_decode). The harness now judges v1 so."""
    report = real_features(S44_V1_OVERLAP_BASE, "0.5.12-v1")
    assert [c for c in FEATURE_CHECKS if not report[c]["passed"]] == ["penalties"]
    assert report["penalties"]["problems"] == ["off: 1 of 16 requests gave other tokens than base, e.g. prompt 5"]
    assert report["penalties"]["phases"]["on"]["differ"] == 0
    overlaps = {s["name"]: OVERLAP_OFF not in s["argv"] for s in report["servers"]}
    assert overlaps == {"base-features": True, "always-on-features": False, "dynspec-features": False}
    again = real_features(S44_V1_PENALTIES, "0.5.12-v1")
    assert again["checks"] == ["penalties"] and again["passed"]
    assert [again["penalties"]["phases"][p]["differ"] for p in ("on", "off")] == [0, 0]
    assert all(OVERLAP_OFF in s["argv"] for s in again["servers"])


def test_session_44_the_phase_offs_draws_repeat_on_every_path() -> None:
    """Deterministic inference makes a seeded draw a function of seed, position and logits, and each
    role samples with seeds of its own (features.SEED_BASE): dynspec's phase off against base's gives
    the same G statistic on 0.5.17, 0.5.12 v2 and v1 (and in session 31). The control: always-on's
    draws are the verify's, which differ by release (0.5.12's are not seeded), and so do their p-values."""
    assert len({features.SEED_BASE[role] for role in ("base", "dynspec")}) == 2
    stats = [real_features(S44_FEATURES[run], run)["sampling"]["phases"]["off"] for run in sorted(S44_FEATURES)]
    earlier = report_of(S31_REAL, {}, S31_REVISIONS)["sampling"]["phases"]["off"]
    assert {s["dynspec"]["statistic"] for s in [*stats, earlier]} == {55.392}
    assert len({s["upstream"]["p_value"] for s in stats}) == 3


def test_session_44_0_5_12_v2_on_flashinfer_is_exact_with_its_draft_kv_written_eagerly() -> None:
    """Issue 17's backends on 0.5.12 v2 (r30 / r50): every server on FlashInfer, equivalence, 100
    crossings and exact_kv 1882 / 1882 (the no-write control 58 apart), recomputed. 0.5.12 captures
    no draft-extend graph on FlashInfer, so kv-direct, asked for, ran the KV-only extend eagerly and
    the stock decode branch (said by the ready line, not why: noted for the next runtime revision)."""
    report = report_of(S44_12_FLASHINFER, {}, S39_REVISIONS)
    assert (report["sglang_version"], report["path"], report["gpu"], report["attention_backend"]) == (
        "0.5.12",
        "v2",
        S31_GPU,
        "flashinfer",
    )
    _, files, counts = passed_kv_proof(S44_12_FLASHINFER)
    assert counts == {"compared_requests": 28, "compared_steps": 1882, "control_differs": True}
    assert report["exact_kv"]["control_mismatches"] == 58 and report["exact_kv"]["kv_only_extend"] == "eagerly"
    assert report["backends"]["passed"] and report["backends"]["crossings"] == 100
    ready = [line for line in files["dynspec.log"].splitlines() if "fallback ready in" in line]
    assert len(ready) == 1 and "FlashInferAttnBackend's decode kernel" in ready[0]
    assert "draft KV only while off (eagerly)" in ready[0]
    assert "KV-only draft-extend CUDA graph captured" not in files["dynspec.log"]
    assert "kv-direct does not write this server's draft KV" in files["dynspec.log"]


# -- session 45 (runtime r30 / v2 module r50 / auto r6, the patched files of 2476018; runs at f23dfbb, an
# H100): issue 16's auto on r30 at acceptance 4 (the whole sweep, two calls) and 3 (N = 8, 16, 32) ---------

S45_17_AUTO = {
    ("4", "8,16,32"): PROOF / "0.5.17-v2-s45-r30-auto-acc4-n8-16-32",
    ("4", "48,64,96"): PROOF / "0.5.17-v2-s45-r30-auto-acc4-n48-64-96",
    ("3", "8,16,32"): PROOF / "0.5.17-v2-s45-r30-auto-acc3-n8-16-32",
}
S45_17_AUTO_4 = PROOF / "0.5.17-v2-s45-r30-auto-acc4-combined"
AUTO_R6 = {**S39_REVISIONS, "speculative_dynspec_auto": 6}
# session 46's parts (below) beside session 45's: every kv-auto call on r30, by (acceptance, sweep)
S46_17_AUTO = {
    ("3", "48,64,96"): PROOF / "0.5.17-v2-s46-r30-auto-acc3-n48-64-96",
    ("2", "8,16,32"): PROOF / "0.5.17-v2-s46-r30-auto-acc2-n8-16-32",
}
R30_AUTO_PARTS = {**S45_17_AUTO, **S46_17_AUTO}


def auto_part(acceptance: str, sweep: str) -> dict:
    """One kv-auto call on r30: what ran (0.5.17 v2 on an H100, the sweep asked, two passes a server, the
    collectors frozen, nothing cached), its row at ``acceptance``, its totals the medians of its passes."""
    report = report_of(R30_AUTO_PARTS[acceptance, sweep], {}, AUTO_R6)
    assert run_of(report) == (S31_GPU, "0.5.17", "v2", 32, True)
    entry = report["auto_threshold"]
    assert ",".join(map(str, entry["sweep"])) == sweep and entry["problems"] == [] and entry["repeats"] == 2
    no_long_collections(report)
    assert all(s["mixed_cached_prompt_tokens"] == 0 for s in report["servers"])
    totals_are_medians(entry["by_acceptance"][acceptance])
    return report


def totals_are_medians(row: dict) -> None:
    """Every server's total in an auto_threshold row is the median of its passes."""
    for name, samples in row["samples"].items():
        total = row["auto_s"] if name == "auto" else row["fixed_s"].get(name, row.get(f"{name}_s"))
        assert abs(total - statistics.median(samples)) <= 0.001, name  # the samples are rounded too


def joined_row(acceptance: str, committed: Path) -> dict:
    """``dynspec proof --combine`` of both r30 parts at ``acceptance`` (run in docs/proof), once it
    passes and equals the committed report: its row."""
    parts = [
        (f"{R30_AUTO_PARTS[acceptance, s].name}/report.json", report_of(R30_AUTO_PARTS[acceptance, s], {}, AUTO_R6))
        for s in ("8,16,32", "48,64,96")
    ]
    joined = combine.combine(parts, DEFAULTS.auto_sweep, DEFAULTS.max_auto_ratio)
    assert joined == json.loads((committed / "report.json").read_text()) and joined["passed"]
    return joined["auto_threshold"]["by_acceptance"][acceptance]


def test_session_45_auto_at_acceptance_4_is_within_3_percent_of_the_best_of_six_fixed_n() -> None:
    """auto_threshold at simulated acceptance 4 on r30, in two calls with their own base, always-on
    and auto: N = 8, 16, 32 (auto 9.51 s, best N = 32 10.93, 0.870x) and N = 48, 64, 96 (auto 9.70,
    best N = 64 9.50, 1.021x). Joined by `dynspec proof --combine` (the committed report is what it
    writes from the two): best of all six N = 64, auto 1.021x it in the same call, faster than plain
    decode (16.7 s) in both, and 0.6 % / 2.9 % behind always-on (9.45 / 9.43), which at acceptance 4
    wins even the 128 phase on an H100 where auto's ceiling (127) falls back. The control: a switch
    point of 32, the best of the first call, would be 15 % behind."""
    rows = {sweep: auto_part("4", sweep)["auto_threshold"]["by_acceptance"]["4"] for _, sweep in list(S45_17_AUTO)[:2]}
    assert {s: (r["auto_s"], r["best_fixed_n"], r["auto_over_best_fixed"]) for s, r in rows.items()} == {
        "8,16,32": (9.51, 32, 0.8703),
        "48,64,96": (9.7, 64, 1.0211),
    }
    assert all(r["auto_s"] < r["base_s"] and r["always_on_s"] < r["auto_s"] for r in rows.values())
    row = joined_row("4", S45_17_AUTO_4)
    assert (row["best_fixed_n"], row["best_fixed_s"], row["auto_over_best_fixed"]) == (64, 9.5, 1.0211)
    assert row["auto_over_best_fixed"] <= 1.03 < row["fixed_s"]["32"] / row["best_fixed_s"]  # the control
    # every phase at 128 (the fifth): always-on beats plain decode there at acceptance 4; auto, at its
    # ceiling, falls back as every fixed N does
    for r in rows.values():
        phases = r["phase_medians"]
        assert phases["always_on"][4] < phases["base"][4] <= phases["auto"][4]
        assert r["auto_decisions"]["last_estimated"]["disable_above"] == 127


def test_session_45_auto_at_acceptance_3_beats_n_8_16_32_and_both_static_servers() -> None:
    """Half of acceptance 3's sweep on r30: auto 11.64 s, N = 32 12.19 (0.955x), always-on 12.21, plain
    decode 16.66; 1.004x the per-phase oracle. Auto speculated up to 127 and fell back at 128, where
    always-on is 24 % slower than plain decode at acceptance 3 (3.09 s against 2.48): the control to
    acceptance 4's 128 phase above, where always-on wins, so the best fixed N differs between the two."""
    report = auto_part("3", "8,16,32")
    row = report["auto_threshold"]["by_acceptance"]["3"]
    assert (row["auto_s"], row["best_fixed_n"], row["best_fixed_s"], row["auto_over_oracle"]) == (
        11.641,
        32,
        12.186,
        1.0036,
    )
    assert row["faster_than_both"]
    phases = row["phase_medians"]
    assert phases["base"][4] < phases["auto"][4] < phases["always_on"][4]
    assert (phases["always_on"][4], phases["base"][4]) == (3.088, 2.481)
    said = row["auto_decisions"]
    assert (said["count"], said["estimated"]) == (6, 3) and said["last_estimated"]["disable_above"] == 127


# -- session 46 (the same revisions and patched files; runs at bdfbaef, an H100): acceptance 3's other
# half, joined with session 45's, acceptance 2's N = 8, 16, 32, and auto-proof on r30 --------------------

S46_17_AUTO_3 = PROOF / "0.5.17-v2-s46-r30-auto-acc3-combined"
S46_17_AUTO_PROOF = PROOF / "0.5.17-v2-s46-r30-auto-proof"


def test_session_46_auto_at_acceptance_3_is_within_3_percent_of_the_best_of_six_fixed_n() -> None:
    """auto_threshold at simulated acceptance 3 on r30: N = 48, 64, 96 in session 46 (auto 11.56 s,
    best N = 96 11.54, 1.002x; always-on 12.29, plain decode 16.41; 0.995x the per-phase oracle),
    joined by `dynspec proof --combine` with session 45's N = 8, 16, 32 (auto 11.64, N = 32 12.19).
    Best of all six: N = 96, auto 1.002x it in the same call and faster than both static servers in
    both calls. This time auto settled on falling back above 94 (session 45: above 127); at the load's
    sizes (1, 4, 16, 64, 128) both speculate at 64 and fall back at 128, as N = 96 does. The control:
    N = 32, the best of session 45's call, is 5.6 % behind the best of all six."""
    report = auto_part("3", "48,64,96")
    row = report["auto_threshold"]["by_acceptance"]["3"]
    assert (row["auto_s"], row["best_fixed_n"], row["best_fixed_s"], row["auto_over_best_fixed"]) == (
        11.559,
        96,
        11.535,
        1.0021,
    )
    assert row["faster_than_both"] and row["auto_s"] < min(row["base_s"], row["always_on_s"])
    assert row["auto_over_oracle"] == 0.9951
    settled = row["auto_decisions"]["last_estimated"]
    assert (settled["disable_above"], settled["enable_at_or_below"]) == (94, 65)
    phases = row["phase_medians"]  # the 64 phase (fourth) speculating, the 128 phase (fifth) falling back
    assert phases["auto"][3] < phases["base"][3] and phases["auto"][4] < phases["always_on"][4]
    row = joined_row("3", S46_17_AUTO_3)
    assert (row["best_fixed_n"], row["best_fixed_s"], row["auto_over_best_fixed"]) == (96, 11.535, 1.0021)
    assert row["auto_over_best_fixed"] <= 1.03 < row["fixed_s"]["32"] / row["best_fixed_s"]  # the control


class AutoLine(NamedTuple):
    """One ``dynspec auto:`` line of an auto server's log."""

    time: str  # HH:MM:SS
    disable_above: int
    reason: str  # "estimated", "probe: ...", or why it cannot decide yet
    acceptance: float | None
    gains: dict[int, float]  # speculative / fallback tokens/s by bucket, in the line's order


AUTO_LINE = re.compile(
    r"\[\S+ (\S+)\] dynspec auto: off above (\d+), on at or below \d+ \(([^;]*); acceptance ([0-9.]+|unknown); "
    r"speculative / fallback tokens/s by batch size ([^)]*)\)"
)


def auto_lines(log: str) -> list[AutoLine]:
    """Every ``dynspec auto:`` line of ``log``, in order."""
    return [
        AutoLine(
            time,
            int(off),
            reason,
            None if acc == "unknown" else float(acc),
            {int(b): float(g) for b, g in (p.split(": ") for p in gains.split(", ") if ": " in p)},
        )
        for time, off, reason, acc, gains in AUTO_LINE.findall(log)
    ]


def gains_at_128(evidence: Path) -> list[float]:
    """The speculative / fallback tokens/s that an auto server's decision lines give for the bucket of
    113 - 128 requests, in their order."""
    (log,) = members(evidence / "logs.tar.xz", "dynspec-auto-acc3.log").values()
    return [line.gains[128] for line in auto_lines(log) if 128 in line.gains]


def test_session_46_auto_timed_both_modes_at_128_where_session_45s_did_not() -> None:
    """Why two starts of one configuration settled apart at acceptance 3 (94 in session 46, 127 in 45):
    session 46's auto came to time both modes at 113 - 128 requests, where speculation gave 0.81 -
    0.88 of the fallback's tokens/s, and put its switch between 64 and 128 from then on; session 45's
    never had that bucket (the control), so its estimates said speculate up to the ceiling."""
    at_128 = gains_at_128(R30_AUTO_PARTS["3", "48,64,96"])
    assert len(at_128) == 38 and (min(at_128), max(at_128)) == (0.81, 0.88)
    assert gains_at_128(R30_AUTO_PARTS["3", "8,16,32"]) == []


def test_session_46_auto_at_acceptance_2_falls_back_from_64_and_beats_n_8_16_32_and_both_static_servers() -> None:
    """Half of acceptance 2's sweep on r30: auto 14.38 s, N = 32 14.37 (1.001x), N = 16 14.37, N = 8
    15.02; always-on 17.35, plain decode 16.28. Auto settled on falling back above 38 by its own
    timings, so at the load's 64 it falls back, where at acceptance 3 it speculates: the best fixed N
    differs between the two, as the issue asks. The control: N = 8 is 4.5 % behind."""
    report = auto_part("2", "8,16,32")
    row = report["auto_threshold"]["by_acceptance"]["2"]
    assert (row["auto_s"], row["best_fixed_n"], row["best_fixed_s"], row["auto_over_best_fixed"]) == (
        14.378,
        32,
        14.37,
        1.0006,
    )
    assert row["faster_than_both"] and row["auto_s"] < row["base_s"] < row["always_on_s"]
    assert row["auto_over_best_fixed"] <= 1.03 < row["fixed_s"]["8"] / row["best_fixed_s"]  # the control
    settled = row["auto_decisions"]["last_estimated"]
    assert (settled["disable_above"], settled["enable_at_or_below"], settled["acceptance"]) == (38, 25, 2.0)
    phases = row["phase_medians"]  # at 64 (the fourth phase) always-on loses to plain decode at acceptance 2
    assert phases["base"][3] < phases["always_on"][3] and phases["auto"][3] < phases["always_on"][3]
    at_3 = auto_part("3", "48,64,96")["auto_threshold"]["by_acceptance"]["3"]["phase_medians"]
    assert at_3["always_on"][3] < at_3["base"][3]  # and wins there at acceptance 3


def test_session_46_auto_crosses_and_keeps_outputs_on_r30() -> None:
    """auto-proof on r30 (0.5.17, an H100): with --speculative-disable-batch-size auto, outputs
    token-identical to base and always-on at 1, 4, 16, 48, 128 and after the ramp, and 100 switches
    (5934 requests, none failed), each judged against the thresholds auto's log line named then."""
    report = report_of(S46_17_AUTO_PROOF, {}, AUTO_R6)
    assert run_of(report) == (S31_GPU, "0.5.17", "v2", "auto", True)
    assert report["checks"] == ["equivalence", "crossings"] and report["equivalence"]["passed"]
    digests = report["equivalence"]["digests"]
    assert len({tuple(d) for d in digests.values()}) == 1 and len(set(digests["base"])) == 5  # the control
    states = " ".join(level["dynspec_state"] for level in report["equivalence"]["per_level"])
    assert "ON" in states.replace("OFF", "") and "OFF" in states  # both modes served the compared requests
    crossings = report["crossings"]
    assert (crossings["count"], crossings["off"], crossings["on"], crossings["requests"]) == (100, 50, 50, 5934)
    assert crossings["failed_requests"] == 0 and crossings["against_thresholds"] == []
    assert [1, 1] in crossings["thresholds_logged"] and len(crossings["thresholds_logged"]) == 5
    dyn = next(s for s in report["servers"] if s["name"] == "dynspec")
    assert dyn["argv"][dyn["argv"].index("--speculative-disable-batch-size") + 1] == "auto"


# -- session 47 (the same revisions and patched files; runs at b0f666d, an H100): issue 16 on real
# weights, SmolLM2-135M with a head trained in the same session: the sweep in two calls, the first
# interrupted at the call's limit after N = 48; joined, auto fails ------------------------------------

S47_HEAD = PROOF / "real-s47-head-train"
S47_REAL_AUTO = {
    "a": PROOF / "real-0.5.17-v2-s47-r30-auto-a",  # base, always-on, auto, N = 8, 16, 32, 48 (64 and 96 cut off)
    "b": PROOF / "real-0.5.17-v2-s47-r30-auto-b",  # base, always-on, auto, N = 48, 64, 96
}
S47_REAL_AUTO_JOINED = PROOF / "real-0.5.17-v2-s47-r30-auto-combined"
# every real-auto call on r30 with session 47's head: session 48 ran N = 8, 16, 32 again, three passes a server
REAL_AUTO = {
    **S47_REAL_AUTO,
    "s48": PROOF / "real-0.5.17-v2-s48-r30-auto-a",
    # session 50: N = 8, 16, 32 with prefill CUDA graphs; then the same with output lengths that differ by request
    "s50": PROOF / "real-0.5.17-v2-s50-r30-auto-prefill-graphs",
    "s50-lengths": PROOF / "real-0.5.17-v2-s50-r30-auto-varied-lengths",
    # session 51 (a slower host than 50's): auto and N = 8, 16, 32 up at once, taking turns at every pass
    "s51": PROOF / "real-0.5.17-v2-s51-r30-auto-interleaved",
}
# session 51's first call: all nine servers up at once, taking turns; killed at the call's 590 s while
# the servers stopped, before the report was written: its passes are in the proof's stream only
S51_NINE_AT_ONCE = PROOF / "real-0.5.17-v2-s51-r30-auto-nine-at-once"


def real_auto_row(call: str) -> dict:
    """One real-auto call on r30: what ran (0.5.17 v2 on an H100, the real model with session 47's head,
    production kernels, the collectors frozen), its row, its totals the medians of its passes (two a
    server in session 47, three in 48). The held-out prompts repeat within a pass, alike on every server."""
    report = report_of(REAL_AUTO[call], {}, AUTO_R6)
    assert report["gpu"] == S31_GPU and report["sglang_version"] == "0.5.17" and report["deterministic"] is False
    head = (S47_HEAD / "model.safetensors.sha256").read_text().split()[0]
    assert report["model_sha256"]["head"] == head
    no_long_collections(report)
    cached = [s["mixed_cached_prompt_tokens"] for s in report["servers"] if s.get("mixed_cached_prompt_tokens")]
    assert max(cached) / min(cached) < 1.01
    row = report["auto_threshold"]["by_acceptance"]["real"]
    totals_are_medians(row)
    return row


def test_session_47_head_accepts_1_74_held_out() -> None:
    """The head real-train made on the H100 (the session-16 recipe, 185 s with the conversion): 1.737
    accepted + 1 per verify on the 115 held-out prompts the mixed load sends, 2.734 on its training
    prompts; session 16's run of the recipe gave 1.708."""
    said = json.loads((S47_HEAD / "report.json").read_text())["acceptance"]
    assert (said["accept_length"], said["train_accept_length"], said["prompts"]) == (1.737, 2.734, 115)


def test_session_47_auto_fails_on_real_weights_and_plain_decode_beats_every_speculative_server() -> None:
    """Issue 16's real-weights item on r30: FAIL. In the first call auto took 10.52 s against N = 32's
    8.03 (1.311x; the bar is 1.03x); in the second 9.56 against N = 48's 10.46 (0.913x). Joined by
    `dynspec proof --combine`, the best of the six N is N = 32 and auto fails. Above all, plain
    decode (5.71 / 5.61 s) beat every server that can speculate, by 1.4x or more: on this host-bound
    135M model speculation loses even at one request (phase 1: 0.57 s always-on against 0.41), and
    the fallback step costs more than a plain decode step (at 128: N = 8's 1.83 s against 1.15).
    The controls: the second call alone passes, and the joined report fails only by the first call's
    auto."""
    a, b = real_auto_row("a"), real_auto_row("b")
    assert (a["auto_s"], a["best_fixed_n"], a["best_fixed_s"], a["base_s"]) == (10.522, 32, 8.025, 5.712)
    assert (b["auto_s"], b["best_fixed_n"], b["best_fixed_s"], b["auto_over_best_fixed"]) == (9.556, 48, 10.462, 0.9134)
    for row in (a, b):
        speculative = [row["auto_s"], row["always_on_s"], *(s for s in row["fixed_s"].values() if s is not None)]
        assert min(speculative) / row["base_s"] > 1.4
        assert row["always_on_s"] > row["auto_s"]  # auto is never slower than both static servers
    phases = a["phase_medians"]
    assert phases["base"][0] < phases["always_on"][0] and phases["base"][4] < phases["8"][4]
    joined = combine.combine(
        [(f"{S47_REAL_AUTO[c].name}/report.json", report_of(S47_REAL_AUTO[c], {}, AUTO_R6)) for c in "ab"],
        DEFAULTS.auto_sweep,
        DEFAULTS.max_auto_ratio,
    )
    assert joined == json.loads((S47_REAL_AUTO_JOINED / "report.json").read_text()) and not joined["passed"]
    row = joined["auto_threshold"]["by_acceptance"]["real"]
    assert (row["best_fixed_n"], row["auto_over_best_fixed"]) == (32, 1.3112)
    # call a's own lines for N = 64, 96, cut off, are left to the join, which has them from call b
    assert joined["auto_threshold"]["problems"] == [
        f"acceptance real: {S47_REAL_AUTO['a'].name}/report.json's auto is 1.311x its best fixed N (N=32; at most 1.03x)"
    ]
    assert report_of(S47_REAL_AUTO["b"], {}, AUTO_R6)["passed"]  # the control


def settled_lines(call: str) -> list[tuple[int, float, list[tuple[int, float]]]]:
    """An auto server's estimated decisions, in order: the switch-off bound, the acceptance, the gains."""
    (log,) = members(REAL_AUTO[call] / "logs.tar.xz", "dynspec-auto-real.log").values()
    return [
        (line.disable_above, line.acceptance, list(line.gains.items()))
        for line in auto_lines(log)
        if line.reason == "estimated" and line.acceptance is not None
    ]


def test_session_47_auto_swung_between_its_floor_and_its_ceiling_on_real_weights() -> None:
    """Why auto lost on real weights: its settled switch point swung between always off above 1 and
    never off (127), 6 times in the first call and 3 in the second, in 81 and 61 estimates. Real text's
    acceptance per verify varies (the logged EMA ran 1.34 - 2.88 and 1.20 - 3.06; the simulated runs'
    stay put), and the host-bound model's timings gave gains that rise with the batch size (below 1 at
    a smaller size, above 1 at a larger), where the linear crossing jumps from the floor to the ceiling."""
    for call, (estimates, flips, low, high) in {"a": (81, 6, 1.34, 2.88), "b": (61, 3, 1.2, 3.06)}.items():
        lines = settled_lines(call)
        extremes = [1 if off <= 1 else 127 for off, _, _ in lines if off <= 1 or off >= 127]
        assert len(lines) == estimates and sum(x != y for x, y in zip(extremes, extremes[1:])) == flips
        assert (min(a for _, a, _ in lines), max(a for _, a, _ in lines)) == (low, high)
        rising = [g for _, _, g in lines if any(x < 1 < y for i, (_, x) in enumerate(g) for _, y in g[i + 1 :])]
        assert rising, call


def logs_of(evidence: Path) -> dict[str, str]:
    """Every server log of a run, by server name."""
    with tarfile.open(evidence / "logs.tar.xz") as tar:
        names = [Path(m.name).stem for m in tar.getmembers() if m.name.endswith(".log")]
    return {
        Path(log).stem: text for log, text in members(evidence / "logs.tar.xz", *(f"{n}.log" for n in names)).items()
    }


def test_session_47_a_135m_models_fallback_step_costs_half_again_a_plain_step() -> None:
    """Why every dynspec server lost to plain decode on real weights, from the servers' own steady
    Decode batch lines: at 64 requests each fixed-N server's fallback step ran at 0.52 - 0.61 of a
    plain decode step's speed (medians; a plain step of SmolLM2-135M takes about 2 ms, so the
    fallback adds about 1.3 - 1.9 ms of mostly host work). The control: in session 46's 8B-shape call
    on the same runtime and card the same reading gives 0.98."""
    for call, servers in {
        "a": ("dynspec-n8-real", "dynspec-n16-real", "dynspec-n32-real", "dynspec-n48-real"),
        "b": ("dynspec-n48-real",),
    }.items():
        ratios = steps.per_step(logs_of(S47_REAL_AUTO[call]), "base-auto", [64])
        assert all(ratios[s]["64"]["pairs"] >= 20 and 0.5 < ratios[s]["64"]["median"] < 0.62 for s in servers), call
    eight_b = steps.per_step(logs_of(R30_AUTO_PARTS["2", "8,16,32"]), "base-auto", [64])
    assert all(0.97 < eight_b[f"dynspec-n{n}-acc2"]["64"]["median"] < 0.99 for n in (8, 16, 32))


def test_session_47_a_steady_acceptance_halves_autos_jumps_on_the_recorded_estimates() -> None:
    """A replay of each real auto server's logged estimates through auto's own rule (``_from_gains``):
    with each bucket's logged speculative / fallback ratio times one steady acceptance (the median the
    lines logged) in place of the EMA's, the settled bound moves by more than 2x 11 and 9 times, against
    26 and 20 as logged (the control). The timing estimates still drift (call 6 from 127 to about 88,
    26, then 1), so a steadier acceptance is half of the cure, not all of it
    (docs/design/auto-real-weights.md)."""
    rule = dynspec_auto.AutoThreshold(1, 127)
    for call, (logged_jumps, steady_jumps) in {"a": (26, 11), "b": (20, 9)}.items():
        lines = settled_lines(call)
        steady = statistics.median(acc for _, acc, _ in lines)
        replayed = [
            rule._from_gains([(b, g / acc * steady) for b, g in gains]).disable_above for _, acc, gains in lines
        ]
        # the rule reads the logged (rounded) gains as auto did: within 2 requests but where a gain
        # logged as 1.00 sat on the other side of 1, once a call
        apart = [(off, rule._from_gains(gains).disable_above) for off, _, gains in lines]
        assert sum(abs(ours - theirs) > 2 for ours, theirs in apart) == 1
        assert (swings([off for off, _, _ in lines]), swings(replayed)) == (logged_jumps, steady_jumps)


# Session 48 (2026-12-07, an H100, r30 / dynspec_auto r6, the tree at 9123cb5): acceptance 2's N = 48, 64,
# 96 (the call stopped before N = 96, which a second call ran alone), and real-auto's N = 8, 16, 32 again.
S48_ACC2 = {
    "48,64": PROOF / "0.5.17-v2-s48-r30-auto-acc2-n48-64",
    "96": PROOF / "0.5.17-v2-s48-r30-auto-acc2-n96",
}
S48_ACC2_JOINED = PROOF / "0.5.17-v2-s48-r30-auto-acc2-combined"


def test_session_48_auto_at_acceptance_2_is_within_3_percent_of_the_best_of_six_fixed_n() -> None:
    """Acceptance 2's sweep on r30, in three calls: session 46's N = 8, 16, 32, session 48's N = 48, 64
    (the call's limit stopped it before N = 96) and N = 96 alone. Joined: best of all six N = 32 (14.37
    s), auto 1.001x it in the same call; auto 1.003x N = 48 (14.78) and 0.939x N = 96 (15.62) in the
    others, faster than plain decode and always-on in every call. The controls: the stopped call's own
    report fails (it measured no N = 96), the join without the N = 96 call fails for want of it, and
    N = 64 is 9 % behind the best."""
    stopped = report_of(S48_ACC2["48,64"], {}, AUTO_R6)
    assert run_of(stopped) == (S31_GPU, "0.5.17", "v2", 32, False)
    assert stopped["auto_threshold"]["problems"] == [
        "interrupted after 5 of 6 servers were measured",
        "acceptance 2: no complete pass on N=96",
    ]
    alone = report_of(S48_ACC2["96"], {}, AUTO_R6)
    assert run_of(alone) == (S31_GPU, "0.5.17", "v2", 32, True)
    for report in (stopped, alone):
        row = report["auto_threshold"]["by_acceptance"]["2"]
        totals_are_medians(row)
        assert row["auto_s"] < min(row["base_s"], row["always_on_s"])
    parts = [
        ("0.5.17-v2-s46-r30-auto-acc2-n8-16-32/report.json", report_of(R30_AUTO_PARTS["2", "8,16,32"], {}, AUTO_R6)),
        *((f"{S48_ACC2[k].name}/report.json", r) for k, r in (("48,64", stopped), ("96", alone))),
    ]
    joined = combine.combine(parts, DEFAULTS.auto_sweep, DEFAULTS.max_auto_ratio)
    assert joined == json.loads((S48_ACC2_JOINED / "report.json").read_text()) and joined["passed"]
    row = joined["auto_threshold"]["by_acceptance"]["2"]
    assert (row["best_fixed_n"], row["best_fixed_s"], row["auto_over_best_fixed"]) == (32, 14.37, 1.0006)
    assert [p["auto_over_best_fixed"] for p in row["parts"]] == [1.0006, 1.0028, 0.9386]
    assert row["fixed_s"]["64"] / row["best_fixed_s"] > 1.09  # the control
    without = combine.combine(parts[:2], DEFAULTS.auto_sweep, DEFAULTS.max_auto_ratio)
    assert without["auto_threshold"]["problems"] == ["acceptance 2: N=96 ran in no part"]


def test_session_48_auto_on_real_weights_fails_again_with_three_passes() -> None:
    """real-auto's N = 8, 16, 32 again, three passes a server: auto 7.71 s against N = 8's 6.36
    (1.213x; session 47's call: 1.311x N = 32), plain decode 4.58 s, always-on 9.93. Auto settled
    at never off (127) with the acceptance at 1.98, and its estimates moved the bound by more than
    2x 36 times in 80. The passes spread less than session 47's (each server within 20 %)."""
    row = real_auto_row("s48")
    assert (row["auto_s"], row["best_fixed_n"], row["best_fixed_s"], row["auto_over_best_fixed"]) == (
        7.712,
        8,
        6.36,
        1.2126,
    )
    assert (row["base_s"], row["always_on_s"]) == (4.579, 9.928) and len(row["samples"]["auto"]) == 3
    decisions = row["auto_decisions"]
    assert (decisions["estimated"], decisions["swings"], decisions["last_estimated"]["disable_above"]) == (80, 36, 127)
    assert all(max(p) / min(p) < 1.21 for p in row["samples"].values())
    speculative = [row["auto_s"], row["always_on_s"], *row["fixed_s"].values()]
    assert min(speculative) / row["base_s"] > 1.38  # plain decode still beats every speculative server


def test_session_48_a_speculating_server_admits_a_closed_loops_requests_one_by_one_on_real_weights() -> None:
    """Why auto's step timings miss speculation's cost on real weights: at 56 - 64 running requests
    every speculating server ran 2.5 - 2.6 prefills per 1000 generated tokens, every falling-back and
    plain one 0.34 - 0.44, about six times fewer. Real text's accepted drafts differ by request, so a
    wave of the closed loop finishes apart and its places are refilled one prefill at a time; each is
    an eager prefill of a host-bound model, and auto, which times decode steps between prefills only,
    never sees it. A speculating server's intervals without a prefill ran 20 - 23 k tok/s at 64 where
    the falling-back ones ran 17 - 27 k: the steps themselves are close. The control: on the 8B shape
    with simulated acceptance (every request accepts alike) always-on's rate is plain decode's."""
    servers = {  # per call: the servers that speculate at 64, those that fall back there, and base
        "a": (("always-on-real",), ("dynspec-n8-real", "dynspec-n16-real", "dynspec-n32-real", "dynspec-n48-real")),
        "b": (("always-on-real", "dynspec-n64-real", "dynspec-n96-real"), ("dynspec-n48-real",)),
        "s48": (("always-on-real",), ("dynspec-n8-real", "dynspec-n16-real", "dynspec-n32-real")),
    }
    speculated = {}  # by call and server: the speculating intervals' reading
    for call, (speculating, falling_back) in servers.items():
        logs = logs_of(REAL_AUTO[call])
        spec = {name: steps.admissions(logs[name], 56, 64, speculating=True) for name in speculating}
        off = [steps.admissions(logs[name], 56, 64, speculating=False) for name in (*falling_back, "base-auto")]
        rates = [r["prefills_per_1000_tokens"] for r in spec.values()], [r["prefills_per_1000_tokens"] for r in off]
        assert all(2.4 < x < 2.7 for x in rates[0]) and all(0.3 < x < 0.45 for x in rates[1]), call
        assert min(rates[0]) / max(rates[1]) > 5, call
        speculated[call] = spec
    assert [speculated["b"][n]["tok_s_without"] for n in ("dynspec-n64-real", "dynspec-n96-real")] == [23353, 20092]
    control = logs_of(R30_AUTO_PARTS["2", "8,16,32"])
    always_on = steps.admissions(control["always-on-acc2"], 56, 64, speculating=True)
    base = steps.admissions(control["base-auto"], 56, 64, speculating=False)
    assert always_on["prefills_per_1000_tokens"] / base["prefills_per_1000_tokens"] < 1  # 0.52 against 0.57


# Session 50 (2026-12-07, an H100, r30 / dynspec_auto r6, the tree at 270027e): real-auto's N = 8, 16, 32
# again, every server with prefill CUDA graphs (--cuda-graph-bs-prefill), then the same with output lengths
# drawn from 32 - 224 tokens by prompt.


def prefill_ms(log: str, low: int, high: int, robust: bool = False) -> float:
    """What one more prefill adds to a speculating interval with ``low`` to ``high`` running requests:
    the least-squares slope of the intervals' times (their tokens over their speed) on the prefills
    logged in them, or with ``robust`` the median of the slopes between every two of them. A rough
    model (the least-squares slope's standard error is a third to a half of it): an interval with any
    prefill also carries a fixed cost."""
    chosen = [i for i in steps.intervals(log) if low <= i.running <= high and i.speculating and i.tok_s > 0]
    n = steps.log_interval(log)
    points = [(i.prefills, 1000 * n * i.running * i.accept / i.tok_s) for i in chosen]
    if robust:
        pairs = itertools.combinations(points, 2)
        return statistics.median((y2 - y1) / (x2 - x1) for (x1, y1), (x2, y2) in pairs if x2 != x1)
    return statistics.linear_regression([x for x, _ in points], [y for _, y in points]).slope


def graphed_prefills(log: str) -> tuple[int, int]:
    """A server's ``Prefill batch`` lines run from a CUDA graph, and those run eagerly."""
    lines = [line for line in log.splitlines() if steps.PREFILL_LINE in line]
    graphed = sum("cuda graph: True" in line for line in lines)
    return graphed, len(lines) - graphed


def fallback_step_ms(log: str, running: int) -> float:
    """The median steady step of a server at ``running`` requests without speculation, in ms, as
    the auto_threshold report reads it (``steps.fallback_steps``)."""
    return steps.fallback_steps(log, (running,))[str(running)]


def test_session_50_with_prefill_graphs_auto_still_fails_on_real_weights_falling_back_like_n_8() -> None:
    """With prefill CUDA graphs on every server (session 48's ran without them), always-on's refills
    ran from graphs (710 of 720 prefill lines; none in session 48, the control), a one-request
    prefill cost 7.7 - 9.6 ms by the least-squares slope where it cost 13.3 - 16.4 eager, always-on
    went from 9.93 s to 7.47 and plain decode from 4.58 to 4.06. Auto: 7.29 s against N = 16's 6.38
    (**1.142x**; the bar is 1.03x), the third failure on real weights. But auto fell back in nearly
    every interval above 32 requests, as N = 8 and N = 16 do there (1 of 25 speculating at 65 - 128, 5
    of 52 at 33 - 64), and in 32 of 46 at 9 - 16, where N = 8 falls back and N = 16 speculates: its last
    estimate (never off, acceptance 2.24) came at the end, on a spike."""
    row = real_auto_row("s50")
    assert (row["auto_s"], row["best_fixed_n"], row["best_fixed_s"], row["auto_over_best_fixed"]) == (
        7.287,
        16,
        6.383,
        1.1416,
    )
    assert (row["base_s"], row["always_on_s"], row["fixed_s"]) == (4.061, 7.47, {"8": 6.402, "16": 6.383, "32": 8.72})
    speculative = [row["auto_s"], row["always_on_s"], *row["fixed_s"].values()]
    assert min(speculative) / row["base_s"] > 1.5  # plain decode still beats every speculative server
    auto = logs_of(REAL_AUTO["s50"])["dynspec-auto-real"]
    modes = {
        band: [i.speculating for i in steps.intervals(auto) if lo <= i.running <= hi]
        for band, (lo, hi) in {"9-16": (9, 16), "33-64": (33, 64), "65-128": (65, 128)}.items()
    }
    counted = {band: (sum(m), len(m)) for band, m in modes.items()}
    assert counted == {"9-16": (14, 46), "33-64": (5, 52), "65-128": (1, 25)}
    # at 2 - 4 requests auto fell back in 11 of 38 intervals, N = 16 in none (its estimates at times said off above 1)
    small = {
        n: [i.speculating for i in steps.intervals(logs_of(REAL_AUTO["s50"])[n]) if 2 <= i.running <= 4]
        for n in ("dynspec-auto-real", "dynspec-n16-real")
    }
    assert {n: (sum(m), len(m)) for n, m in small.items()} == {
        "dynspec-auto-real": (27, 38),
        "dynspec-n16-real": (35, 35),
    }
    always_on = logs_of(REAL_AUTO["s50"])["always-on-real"]
    assert all(i.speculating for i in steps.intervals(always_on) if i.running > 32)  # the control
    for call, graphed in (("s50", (710, 10)), ("s48", (0, 698))):
        assert graphed_prefills(logs_of(REAL_AUTO[call])["always-on-real"]) == graphed, call
    bands = ((9, 16), (33, 64), (65, 128))
    graphs = [prefill_ms(always_on, lo, hi) for lo, hi in bands]
    eager = [prefill_ms(logs_of(REAL_AUTO["s48"])["always-on-real"], lo, hi) for lo, hi in bands]
    assert [round(ms, 1) for ms in graphs] == [9.6, 7.7, 7.7]
    assert [round(ms, 1) for ms in eager] == [14.8, 16.4, 13.3]  # session 49's reading
    assert all(g < e for g, e in zip(graphs, eager))
    robust = {
        call: [
            round(prefill_ms(logs_of(REAL_AUTO[call])["always-on-real"], lo, hi, robust=True), 1) for lo, hi in bands
        ]
        for call in ("s50", "s48")
    }
    assert robust == {"s50": [11.5, 10.9, 12.2], "s48": [22.7, 22.2, 22.4]}


def test_session_50_one_fallback_step_runs_up_to_30_percent_apart_between_servers_on_a_135m_model() -> None:
    """Why one server process per configuration cannot judge 3 % on this model: the fallback step,
    the same code in every dynspec server at 64 and 128 requests, ran at median speeds up to 30 %
    apart between the servers of one call (session 50: N = 8 2.38 ms at 64, N = 32 3.10; sessions
    47 - 48: 11 - 21 %), and auto's own server was the fastest of them in one call (session 47's
    second), the slowest in another (48) and in between in two. The control: on the 8B shape (session
    46, acceptance 2) the same servers' steps lie within 1.3 %."""
    spreads, auto_ranks = {}, {}
    for call in ("a", "b", "s48", "s50"):
        logs = logs_of(REAL_AUTO[call])
        servers = [n for n in logs if n.startswith("dynspec-")]
        read = {n: steps.fallback_steps(logs[n], (64,)) for n in servers}
        at_64 = {n: r["64"] for n, r in read.items() if "64" in r}
        spreads[call] = round(max(at_64.values()) / min(at_64.values()), 2)
        auto_ranks[call] = (sorted(at_64.values()).index(at_64["dynspec-auto-real"]), len(at_64))
    assert spreads == {"a": 1.2, "b": 1.19, "s48": 1.11, "s50": 1.3}
    assert auto_ranks == {"a": (2, 5), "b": (0, 2), "s48": (3, 4), "s50": (2, 4)}
    s50 = logs_of(REAL_AUTO["s50"])
    assert [round(fallback_step_ms(s50[f"dynspec-n{n}-real"], 128), 2) for n in (8, 16, 32)] == [2.88, 2.94, 3.73]
    eight_b = logs_of(R30_AUTO_PARTS["2", "8,16,32"])
    for running in (64, 128):
        ms = [fallback_step_ms(eight_b[n], running) for n in eight_b if n.startswith("dynspec-")]
        assert max(ms) / min(ms) < 1.015, running


def test_session_50_a_speculating_server_still_refills_a_closed_loop_six_times_as_often() -> None:
    """At 49 - 64 running requests always-on ran 2.7 prefills per 1000 generated tokens, the fixed N
    falling back there 0.38 - 0.51, plain decode 0.475, as in session 48 with eager prefills. Plain
    decode's steps, in intervals without a prefill, ran 45 k tok/s against the fallback's 20.6 - 26.8 k:
    on this model "off" is not plain decode (session 47). The control: below the switch, where every
    one of them speculates, their refill rates are alike."""
    logs = logs_of(REAL_AUTO["s50"])
    spec = steps.admissions(logs["always-on-real"], 49, 64, speculating=True)
    off = [steps.admissions(logs[f"dynspec-n{n}-real"], 49, 64, speculating=False) for n in (8, 16, 32)]
    base = steps.admissions(logs["base-auto"], 49, 64, speculating=False)
    assert spec is not None and base is not None and all(r is not None for r in off)
    assert spec["prefills_per_1000_tokens"] == 2.712
    assert all(0.38 <= r["prefills_per_1000_tokens"] <= 0.51 for r in off)  # type: ignore[index]
    assert sorted(r["tok_s_without"] for r in off) == [20585, 25509, 26835]  # type: ignore[index]
    assert base["tok_s_without"] == 45139 and base["prefills_per_1000_tokens"] == 0.475
    below = [
        steps.admissions(logs[n], 9, 16, speculating=True)
        for n in ("always-on-real", "dynspec-n16-real", "dynspec-n32-real")
    ]
    assert all(3.9 < r["prefills_per_1000_tokens"] < 4.3 for r in below)  # type: ignore[index]


def test_session_50_with_output_lengths_that_differ_auto_passes_on_real_weights() -> None:
    """The same servers and prompts with each output 32 - 224 tokens (drawn by prompt, alike for every
    server): auto **PASS**, 12.47 s against N = 32's 12.93 (0.965x), plain decode 12.40, the per-phase
    oracle 12.41; every fixed N trailed plain decode by 4 - 25 %. Every server now refills the loop a
    prefill at a time: plain decode at 65 - 128 ran 2.90 prefills per 1000 tokens where it ran 0.41 with
    every output 128 tokens (the waves gone), and its one-token refills ran eagerly (705 of 1000 prefill
    lines; 0.5.17 replays a prefill graph only where padding at most doubles the tokens, and the
    smallest size captured was 4) where the speculating servers' ran from graphs. It is one
    process a configuration, as above, so it passes inside the spread that failed the other call. The
    control: the same servers with every output 128 tokens fail."""
    row = real_auto_row("s50-lengths")
    report = report_of(REAL_AUTO["s50-lengths"], {}, AUTO_R6)
    assert report["passed"] and report["auto_threshold"]["schedule"]["new_tokens"] == 32
    assert report["auto_threshold"]["schedule"]["new_tokens_max"] == 224
    assert (row["auto_s"], row["best_fixed_n"], row["best_fixed_s"], row["auto_over_best_fixed"]) == (
        12.47,
        32,
        12.925,
        0.9648,
    )
    assert (row["base_s"], row["always_on_s"], row["oracle_s"]) == (12.402, 14.936, 12.408)
    assert row["auto_s"] / row["base_s"] < 1.01 and all(s / row["base_s"] > 1.04 for s in row["fixed_s"].values())
    fixed_lengths = real_auto_row("s50")["prefills_per_1000_tokens"]["base"]["65-128"]["not_speculating"]
    assert (fixed_lengths, row["prefills_per_1000_tokens"]["base"]["65-128"]["not_speculating"]) == (0.413, 2.896)
    logs = logs_of(REAL_AUTO["s50-lengths"])
    assert graphed_prefills(logs["base-auto"]) == (295, 705)
    assert graphed_prefills(logs["always-on-real"]) == (866, 6)
    assert not report_of(REAL_AUTO["s50"], {}, AUTO_R6)["passed"]  # the control


# -- session 51 (the same revisions and patched files; runs at b89b5f3, an H100 on a slower host than
# session 50's): the fixed-length sweep with the servers taking turns at every pass -----------------


def stream_passes(evidence: Path) -> dict[str, list[tuple[float, list[float]]]]:
    """Each server's timed passes, from the proof's stream (call-output.txt): the total and the phases
    of each of its mixed-load lines (the stream does not print the warm-up's)."""
    passes: dict[str, list[tuple[float, list[float]]]] = {}
    text = (evidence / "call-output.txt").read_text()
    for name, total, phases in re.findall(r"\[proof\]   (\S+) mixed load: ([\d.]+) s \(phases ([\d. ]+)\)", text):
        passes.setdefault(name, []).append((float(total), [float(x) for x in phases.split()]))
    return passes


def stream_totals(evidence: Path) -> dict[str, list[float]]:
    """``stream_passes``' totals alone."""
    return {name: [total for total, _ in passes] for name, passes in stream_passes(evidence).items()}


def test_session_51_with_the_servers_taking_turns_auto_still_fails_on_real_weights() -> None:
    """Auto and N = 8, 16, 32 up at once, taking turns at every pass (the order rotated), then
    always-on and base: auto 9.80 s against N = 8's 7.88 (**1.244x**; the bar is 1.03x), the fourth
    failure on real weights with every output 128 tokens, and round by round (each round's passes back
    to back) 1.24, 1.21 and 1.12x: not the order (session 50's later servers ran slower). This host
    was slower than session 50's: plain decode 5.92 s against 4.06, always-on 11.79 against 7.47.
    The first call, all nine up at once, was killed at the call's limit while its servers stopped,
    before the report was written; from its stream the medians give 1.134x (auto 9.28, N = 8 8.18),
    but round by round 0.97, 1.21 and 0.95x: there auto tied N = 8 in two rounds of three."""
    row = real_auto_row("s51")
    report = report_of(REAL_AUTO["s51"], {}, AUTO_R6)
    assert (row["auto_s"], row["best_fixed_n"], row["best_fixed_s"], row["auto_over_best_fixed"]) == (
        9.801,
        8,
        7.88,
        1.2438,
    )
    assert (row["base_s"], row["always_on_s"], row["fixed_s"]) == (5.917, 11.789, {"8": 7.88, "16": 8.122, "32": 9.993})
    assert report["auto_threshold"]["order"] == ORDER_GROUPS + (
        "dynspec-auto-real, dynspec-n8-real, dynspec-n16-real, dynspec-n32-real; always-on-real, base-auto"
    )
    assert "--parallel-starts 4" in report["command"] and not report["passed"]
    nine = stream_totals(S51_NINE_AT_ONCE)
    assert len(nine) == 9 and all(len(p) == 3 for p in nine.values())
    medians = {name.removesuffix("-real"): statistics.median(p) for name, p in nine.items()}
    best = min(v for k, v in medians.items() if k.startswith("dynspec-n"))
    assert (medians["dynspec-auto"], best, medians["dynspec-n8"]) == (9.28, 8.18, 8.18)
    assert round(medians["dynspec-auto"] / best, 3) == 1.134 and medians["base-auto"] == 6.30
    rounds = [round(a / n, 2) for a, n in zip(nine["dynspec-auto-real"], nine["dynspec-n8-real"])]
    assert rounds == [0.97, 1.21, 0.95]
    together = [round(a / n, 2) for a, n in zip(row["samples"]["auto"], row["samples"]["8"])]
    assert together == [1.24, 1.21, 1.12]
    assert "auto_threshold" not in json.loads((S51_NINE_AT_ONCE / "report.json").read_text())  # killed first
    # the control: in the call that wrote its report, the stream's passes are the report's samples
    streamed = stream_totals(REAL_AUTO["s51"])
    names = {"dynspec-auto-real": "auto", "always-on-real": "always_on", "base-auto": "base"}
    names.update({f"dynspec-n{n}-real": str(n) for n in (8, 16, 32)})
    assert {names[n]: p for n, p in streamed.items()} == {
        k: [round(x, 2) for x in v] for k, v in row["samples"].items()
    }


def auto_gains(log: str, bucket: int) -> list[tuple[str, float]]:
    """(time, gain) of each ``dynspec auto:`` line that gives a gain at ``bucket``."""
    return [(line.time, line.gains[bucket]) for line in auto_lines(log) if bucket in line.gains]


def test_session_51_auto_speculated_where_its_own_log_shows_speculation_losing() -> None:
    """Where auto lost, call 6: summed by phase its medians trail N = 8's by 1.39 s (+0.94 s in the 64
    requests after 128, +0.92 over six other phases, -0.46 at 128). In its first pass (the median) it
    lost 1.92 s, +0.67 at 16 requests, where it speculated while N = 8 falls back, and +0.37 at 64 on
    the way up, where both fell back. In passes 2 and 3 it also speculated at 64 after 128: a probe of
    speculation there (01:22:34) moved its gain at 64 from 0.05 - 0.19 to mostly 1.0 or more (31 of 33
    lines, 0.82 - 1.88, median 1.17; at 16 median 1.28). Its own log says speculation lost in both
    places: over all its intervals (their tokens over their time) 6691 against 13421 tokens/s at 49 -
    64 requests, 3134 against 5375 at 13 - 16, and always-on made 0.54 - 0.65 of N = 8's and 16's
    fallback tokens/s at 49 - 64. Speculating refilled 2.57 prefills per 1000 tokens against 0.485:
    part of the gap, not all of it (the intervals without a prefill, few: at 13 - 16 auto's
    speculating ones ran at 0.90 of its falling-back ones)."""
    row = real_auto_row("s51")
    phases = row["phase_medians"]
    gaps = [round(a - n, 2) for a, n in zip(phases["auto"], phases["8"])]
    assert gaps[5] == 0.94 and gaps[4] == -0.46 and round(sum(gaps), 2) == 1.39
    firsts = {name: passes[0][1] for name, passes in stream_passes(REAL_AUTO["s51"]).items()}  # each's first pass
    pass_1 = [round(a - n, 2) for a, n in zip(firsts["dynspec-auto-real"], firsts["dynspec-n8-real"])]
    assert round(sum(pass_1), 2) == 1.92 and (pass_1[2], pass_1[3]) == (0.67, 0.37)
    logs = logs_of(REAL_AUTO["s51"])
    auto = logs["dynspec-auto-real"]
    probes = re.findall(r"\[\S+ (\S+)\] dynspec auto: [^(]*\(probe: speculation at 64;", auto)
    assert probes == ["01:22:34"]
    gains = auto_gains(auto, 64)
    before = [g for t, g in gains if t < "01:22:34"]
    after = [g for t, g in gains if t >= "01:22:34"][1:]  # the probe's own line still gives the old 0.10
    assert (min(before), max(before)) == (0.05, 0.19) and (min(after), max(after)) == (0.82, 1.88)
    assert (sum(g >= 1 for g in after), len(after), statistics.median(after)) == (31, 33, 1.17)
    # speculating throughout an interval at 49 - 64 (accept > 1.5) came after the probe only
    lines = re.findall(r"\[\S+ (\S+)\] Decode batch, #running-req: (\d+),.*?accept len: ([\d.]+)", auto)
    assert min(t for t, n, a in lines if 49 <= int(n) <= 64 and float(a) > 1.5) == "01:22:34"
    spec, off = steps.admissions(auto, 49, 64, True), steps.admissions(auto, 49, 64, False)
    assert spec is not None and off is not None
    assert (spec["tok_s"], off["tok_s"]) == (6691, 13421)
    assert (spec["prefills_per_1000_tokens"], off["prefills_per_1000_tokens"]) == (2.571, 0.485)
    small_spec, small_off = steps.admissions(auto, 13, 16, True), steps.admissions(auto, 13, 16, False)
    assert small_spec is not None and small_off is not None
    assert (small_spec["tok_s_without"], small_off["tok_s_without"]) == (6027, 6731)
    assert (small_spec["tok_s"], small_off["tok_s"]) == (3134, 5375)
    at_16 = [g for t, g in auto_gains(auto, 16) if t >= "01:22:34"][1:]
    assert (sum(g >= 1 for g in at_16), len(at_16), statistics.median(at_16)) == (30, 33, 1.28)
    always_on = steps.admissions(logs["always-on-real"], 49, 64, True)
    fallback = [steps.admissions(logs[f"dynspec-n{n}-real"], 49, 64, False) for n in (8, 16)]
    assert always_on is not None and all(f is not None for f in fallback)
    assert always_on["tok_s_without"] / fallback[1]["tok_s_without"] > 0.93  # type: ignore[index]
    ratios = [always_on["tok_s"] / f["tok_s"] for f in fallback]  # type: ignore[index]
    assert [round(r, 2) for r in ratios] == [0.65, 0.54]
