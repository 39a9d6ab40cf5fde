"""Equivalence where SGLang's own two modes disagree (``equivalence.matches_its_mode``).

On real weights the verify's kernels and the decode's can round a near tie apart, so always-on may
give another greedy output than base. There dynspec is held to the server of the mode it ran the
level in; where always-on gave base's output, to base's.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from patcher.proof import exactkv
from patcher.proof.acceptance import outputs_differ, proposals_apart
from patcher.proof.client import LevelResult, Reply
from patcher.proof.equivalence import BASE_REPEAT, level_mode, matches_its_mode
from patcher.proof.exactkv import FALL_BACK, RESUME, RID_PREFIX, SPECULATE
from patcher.proof.logscan import Transition
from patcher.proof.report import summary
from patcher.proof.run import Proof, ProofOptions

A = f"{RID_PREFIX}0-long-1"

BASE, OTHER, THIRD = [1, 2, 3], [1, 2, 4], [1, 5, 6]


@pytest.mark.parametrize(
    ("tokens", "always_on", "state", "matches"),
    [
        (BASE, BASE, "ON", True),
        (OTHER, BASE, "ON", False),  # always-on gave base's: dynspec must too
        (OTHER, None, "ON", False),  # no always-on to compare with
        (OTHER, OTHER, "ON", True),  # speculating, it gave always-on's
        (OTHER, OTHER, "OFF", False),  # falling back, it must give base's
        (OTHER, OTHER, "OFF->ON", True),  # crossed: either
        (THIRD, OTHER, "OFF->ON", False),  # neither
        (THIRD, OTHER, "ON", False),
        (BASE, OTHER, "ON", False),  # speculating, it gave base's where always-on differs
        (BASE, OTHER, "OFF", True),
    ],
)
def test_a_dynspec_output_is_judged_by_its_mode_where_the_modes_differ(
    tokens: list[int], always_on: list[int] | None, state: str, matches: bool
) -> None:
    assert matches_its_mode(tokens, BASE, always_on, state) is matches


def level(outputs: dict[int, list[int]]) -> LevelResult:
    return LevelResult(len(outputs), 3, 1.0, [Reply(i, 200, t, {}, 1.0) for i, t in outputs.items()])


def judge(
    dynspec: dict[int, list[int]],
    switched_off: bool,
    *,
    real: bool = True,
    switch_at: int = 12,
    base_repeat: dict[int, list[int]] | None = None,
) -> dict:
    """One level of two prompts at C = 16 (above a threshold of 8, or below one of 32): prompt 1 is
    where always-on's output differs from base's. Speculation goes off at batch size ``switch_at``
    (16: at the level's first decode; 12: within it, once requests finished)."""
    threshold = 8 if switched_off else 32
    opts = ProofOptions(
        out=Path("."), threshold=threshold, levels=(16,), new_tokens=3, model_dir=Path("real") if real else None
    )
    runs = {
        "base": [(level({0: BASE, 1: BASE}), [])],
        "always_on": [(level({0: BASE, 1: OTHER}), [])],
        "dynspec": [(level(dynspec), [Transition("OFF", switch_at, 1)] if switched_off else [])],
    }
    if base_repeat is not None:
        runs[BASE_REPEAT] = [(level(base_repeat), [])]
    me = SimpleNamespace(opts=opts, ramp_final_state="ON", deterministic=True)
    return Proof.judge_equivalence(me, runs, ["base", "always_on", "dynspec"], "small", [])  # type: ignore[arg-type]


def test_where_the_modes_differ_a_speculating_dynspec_is_held_to_always_on() -> None:
    entry = judge({0: BASE, 1: OTHER}, switched_off=False)
    assert entry["passed"] and entry["mismatch_count"] == 0
    assert entry["modes_differ_count"] == 1 and entry["modes_differ"][0] == {"C": 16, "prompt": 1, "first_diff": 2}
    assert "always-on differs from base in 1 output(s)" in entry["detail"]


def test_on_dummy_weights_always_on_must_give_bases_outputs() -> None:
    """The rule is for real weights: dummy weights never showed SGLang's modes apart, so there an
    always-on output other than base's fails, as does a dynspec that follows it."""
    entry = judge({0: BASE, 1: OTHER}, switched_off=False, real=False)
    assert not entry["passed"] and entry["modes_differ_count"] == 0
    assert sorted((m["server"], m["prompt"]) for m in entry["mismatches"]) == [("always_on", 1), ("dynspec", 1)]


def test_a_switch_at_the_levels_first_decode_judges_it_by_the_mode_after() -> None:
    assert judge({0: BASE, 1: BASE}, switched_off=True, switch_at=16)["passed"]  # OFF: base's
    entry = judge({0: BASE, 1: OTHER}, switched_off=True, switch_at=16)  # ON->OFF at once: not either
    assert not entry["passed"] and entry["mismatches"][0]["against"] == "base"


def test_where_the_modes_differ_a_level_that_crossed_may_match_either() -> None:
    assert judge({0: BASE, 1: OTHER}, switched_off=True)["passed"]  # ON->OFF within the level
    assert judge({0: BASE, 1: BASE}, switched_off=True)["passed"]


@pytest.mark.parametrize(
    ("dynspec", "switched_off", "prompt"),
    [
        ({0: OTHER, 1: OTHER}, False, 0),  # prompt 0: always-on gave base's, dynspec did not
        ({0: BASE, 1: BASE}, False, 1),  # speculating, it gave base's where always-on differs
        ({0: BASE, 1: THIRD}, True, 1),  # crossed, and matches neither
    ],
    ids=["modes-agree", "wrong-mode", "neither"],
)
def test_the_negative_controls_fail(dynspec: dict[int, list[int]], switched_off: bool, prompt: int) -> None:
    entry = judge(dynspec, switched_off)
    assert not entry["passed"] and [m["prompt"] for m in entry["mismatches"]] == [prompt]
    assert "output(s) differ from" in entry["problems"][0]


def test_on_real_weights_outputs_are_not_judged_the_drafts_where_timelines_match_are() -> None:
    digests = {"kv": ["a"], "full": ["d"], "skip": ["b"], "never-off": ["c"]}
    assert outputs_differ(digests, real=True) is None
    assert outputs_differ(digests, real=False) == (
        "greedy outputs of the load differ between the servers: {'kv': ['a'], 'full': ['d'], 'skip': ['b'], 'never-off': ['c']}"
    )

    def recording(drafts: list[list[int]], batch: int = 1) -> exactkv.Recording:
        """A request that falls back at 10 and speculates at 12, 13, 14, in batches of ``batch``."""
        rids = [A] + [f"{RID_PREFIX}0-long-{n}" for n in range(2, batch + 1)]
        steps = [(FALL_BACK, 10, None), (RESUME, 11, None)] + [(SPECULATE, 12 + i, d) for i, d in enumerate(drafts)]
        lines = []
        for step, pos, draft in steps:
            line: dict[str, Any] = {"step": step, "rid": rids, "pos": [pos] * len(rids)}
            if draft is not None:
                line["draft"] = [draft] * len(rids)
            lines.append(json.dumps(line))
        return exactkv.parse(lines)

    good = {"kv": recording([[1], [2], [3]]), "full": recording([[1], [2], [3]]), "skip": recording([[1], [5], [3]])}
    counted, problem = proposals_apart(good)
    assert (
        problem is None
        and counted["compared_steps_same_history"] == 3
        and counted["control_mismatches_same_history"] == 1
    )
    # Drafts apart where the timelines parted (other batch sizes) are not held against the write ...
    parted, problem = proposals_apart({**good, "kv": recording([[1], [9], [3]], batch=2)})
    assert problem is None and parted["mismatches"] == 1 and parted["compared_steps_same_history"] == 0
    # ... where they match, they fail (negative control: the control's recording as the candidate).
    _, problem = proposals_apart({**good, "kv": good["skip"]})
    assert problem == "1 of 3 drafts differ from the full extend's where the request's timeline matched"


def test_a_levels_mode() -> None:
    first_decode, within = [Transition("OFF", 16, 1)], [Transition("OFF", 12, 1)]
    assert level_mode(first_decode, 16, "ON->OFF", "OFF") == "OFF"
    assert level_mode(within, 16, "ON->OFF", "OFF") == "ON->OFF"  # the control
    assert level_mode([], 16, "ON", "ON") == "ON"


def test_a_base_that_repeats_itself_leaves_the_verdict_to_dynspec() -> None:
    entry = judge({0: BASE, 1: OTHER}, switched_off=False, base_repeat={0: BASE, 1: BASE})
    assert entry["passed"] and entry["base_repeatable"] and len(entry["base_repeat"]) == 1


def test_a_base_that_does_not_repeat_itself_fails_the_comparison() -> None:
    """Session 16 on real weights without deterministic inference: dynspec, off throughout a level
    of 48, gave other tokens than base, and than itself a minute later. Base's second pass is the
    control that says whether anything can be held to base's tokens."""
    entry = judge({0: BASE, 1: OTHER}, switched_off=False, base_repeat={0: BASE, 1: THIRD})
    assert not entry["passed"] and entry["base_repeatable"] is False
    assert entry["problems"][0].startswith("base gave other tokens on a second pass (1 output(s) at C=16, 1 in all)")
    assert "(deterministic inference on)" in entry["problems"][0]
    assert "base_repeat" not in judge({0: BASE, 1: OTHER}, switched_off=False)  # dummy runs: no second pass
    text = summary({"equivalence": {**entry, "per_level": [{"C": 16}]}, "deterministic": True})
    assert "base, asked again: gave other tokens" in text and "deterministic inference: on" in text
