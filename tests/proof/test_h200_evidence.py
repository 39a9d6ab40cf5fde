"""The session-4 H200 numbers in docs/proof, recomputed from the recordings and logs committed there.

If the comparison or the per-step analysis changes, these say whether the published numbers still
follow from the evidence.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from patcher.proof import exactkv, steps

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


def recordings() -> dict[str, exactkv.Recording]:
    files = members(KV / "logs.tar.gz", "drafts-dynspec.jsonl", "drafts-dynspec-full.jsonl", "drafts-dynspec-skip.jsonl")
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
    base = members(FULL / "throughput" / "logs.tar.gz", "base-sim.log")["base-sim.log"]
    full = members(FULL / "throughput" / "logs.tar.gz", "dynspec-sim.log")["dynspec-sim.log"]
    kv = members(KV.parent / "0.5.17-v2-s4-kv-throughput" / "logs.tar.gz", "dynspec-sim.log")["dynspec-sim.log"]
    ratios = steps.per_step({"base": base, "full": full, "kv": kv}, "base", [64, 128])
    assert {c: r["median"] for c, r in ratios["full"].items()} == {"64": 0.863, "128": 0.867}
    assert {c: r["median"] for c, r in ratios["kv"].items()} == {"64": 0.91, "128": 0.97}
