"""The judges of issue 17's checks (sampling, logprobs, penalties) on replies made here."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from patcher.proof import features
from patcher.proof.client import Reply


def test_the_phases_are_a_batch_surely_on_and_one_well_above_the_threshold():
    assert features.phase_sizes(8, 8, 128) == {"on": 8, "off": 16}
    assert features.phase_sizes(4, 32, 128) == {"on": 4, "off": 64}
    assert features.phase_sizes(100, 100, 128) == {"on": 100, "off": 128}  # within the running limit


def test_sampling_requests_interleave_their_prompts_with_seeds_of_their_role():
    requests = features.sampling_requests("control")
    assert len(requests) == features.SAMPLING_PROMPTS * features.SAMPLING_PER_PROMPT
    first = features.SAMPLING_FIRST_PROMPT
    assert [r.index for r in requests[:5]] == [first, first + 1, first + 2, first + 3, first]
    assert {r.sampling["temperature"] for r in requests} == {features.CONTROL_TEMPERATURE}
    assert {r.sampling["temperature"] for r in features.sampling_requests("dynspec")} == {1.0}
    assert requests[0].sampling["top_k"] == 50 and requests[0].new_tokens == features.SAMPLING_NEW_TOKENS
    # a seed each (deterministic inference seeds every request alike), and no two roles share one
    seeds = {role: {r.sampling["sampling_seed"] for r in features.sampling_requests(role)} for role in features.ROLES}
    assert all(len(s) == len(requests) for s in seeds.values())
    assert not seeds["base"] & seeds["dynspec"] and not seeds["base"] & seeds["control"]
    borrowed = features.sampling_requests("dynspec", seeds_of="base")
    assert [r.sampling for r in borrowed] == [r.sampling for r in features.sampling_requests("base")]


def sampled(rng: random.Random, temperature: float) -> list[Reply]:
    """One reply per sampling request, its last token drawn from fixed logits at ``temperature``."""
    weights = [math.exp((3.0 - 0.15 * j) / temperature) for j in range(40)]
    return [
        Reply(r.index, 200, [7, 7, 7, 100 + rng.choices(range(40), weights)[0]], {}, 0.1)
        for r in features.sampling_requests("base")
    ]


def sampling_phases(dynspec_temperature: float, control_temperature: float) -> dict[str, dict[str, list[Reply]]]:
    rng = random.Random(17)
    return {
        phase: {
            "base": sampled(rng, 1.0),
            "always_on": sampled(rng, 1.0),
            "dynspec": sampled(rng, dynspec_temperature),
            "control": sampled(rng, control_temperature),
        }
        for phase in features.PHASES
    }


SIZES = {"on": 8, "off": 16}


def test_sampling_passes_a_server_that_samples_as_its_reference_and_fails_one_that_does_not():
    same = features.judge_sampling(sampling_phases(1.0, 0.7), SIZES)
    assert same["passed"], same["problems"]
    assert same["phases"]["off"]["dynspec"]["samples"] == [1200, 1200]
    assert (same["phases"]["on"]["reference"], same["phases"]["off"]["reference"]) == ("always_on", "base")
    assert same["phases"]["off"]["control"]["p_value"] < 0.01 and "upstream" in same["phases"]["on"]
    skewed = features.judge_sampling(sampling_phases(0.7, 0.7), SIZES)
    assert not skewed["passed"]
    assert skewed["problems"][0].startswith("on: dynspec's tokens are distributed unlike always_on's")
    assert skewed["problems"][1].startswith("off: dynspec's tokens are distributed unlike base's")


def test_draws_with_base_seeds_are_compared_request_by_request_and_reported():
    """The phase off's draws with base's seeds: those apart from base's counted, beside how many of
    the draws with dynspec's own seeds part (the comparison can tell); reported, not judged."""
    phases = sampling_phases(1.0, 0.7)
    base = phases["off"]["base"]
    moved = [Reply(r.index, 200, [*r.output_ids[:-1], r.output_ids[-1] + 1], {}, 0.1) for r in base[:3]]
    phases["off"][features.SAME_SEEDS] = moved + base[3:]
    judged = features.judge_sampling(phases, SIZES)
    assert judged["passed"] and "same_seeds" not in judged["phases"]["on"]
    entry = judged["phases"]["off"]["same_seeds"]
    assert (entry["requests"], entry["apart"]) == (1200, 3) and entry["own_seeds_apart"] > 1000
    assert judged["detail"].endswith("with base's seeds 3 of 1200 apart")
    failed = Reply(0, 0, [], {}, 0.1, error="connection reset")
    phases["off"][features.SAME_SEEDS] = [failed, *base[1:]]
    assert features.judge_sampling(phases, SIZES)["phases"]["off"]["same_seeds"] == {
        "requests": 1199,
        "apart": 0,
        "own_seeds_requests": 1200,
        "own_seeds_apart": entry["own_seeds_apart"],
    }
    # and one of dynspec's own draws failing leaves the control's count, not one more apart
    phases["off"][features.SAME_SEEDS] = base
    first = phases["off"]["dynspec"][0]
    phases["off"]["dynspec"] = [failed, *phases["off"]["dynspec"][1:]]
    own = features.judge_sampling(phases, SIZES)["phases"]["off"]["same_seeds"]
    was_apart = first.output_ids != base[0].output_ids
    assert (own["own_seeds_requests"], own["own_seeds_apart"]) == (1199, entry["own_seeds_apart"] - was_apart)


def test_sampling_without_a_control_that_differs_has_no_teeth():
    entry = features.judge_sampling(sampling_phases(1.0, 1.0), SIZES)
    assert not entry["passed"]
    assert all("cannot see a skew" in p for p in entry["problems"]) and len(entry["problems"]) == 2


def test_sampling_names_missing_samples_and_failed_requests_without_raising():
    phases = sampling_phases(1.0, 0.7)
    del phases["on"]["control"]
    phases["off"]["dynspec"][0] = Reply(1000, 500, [], {}, 0.1, "HTTP 500")
    problems = features.judge_sampling(phases, SIZES)["problems"]
    assert problems == ["on: no sampled tokens from control", "off dynspec: 1 of 1200 requests failed, e.g. HTTP 500"]
    phases["off"]["always_on"] = [Reply(1000, 500, [], {}, 0.1, "HTTP 500")]  # every reply failed: no tokens
    assert "off: no sampled tokens from always_on" in features.judge_sampling(phases, SIZES)["problems"]


def test_a_phase_is_in_its_mode_unless_dynspec_switched_the_wrong_way_or_never():
    assert features.out_of_mode("on", "ON", []) is None and features.out_of_mode("off", "ON", ["OFF"]) is None
    assert features.out_of_mode("off", "OFF", []) is None  # off since the load before
    assert features.out_of_mode("on", "ON", ["OFF", "ON"]).startswith("dynspec switched off during a load")  # type: ignore[union-attr]
    assert features.out_of_mode("off", "OFF", ["ON", "OFF"]).startswith("dynspec switched back on")  # type: ignore[union-attr]
    assert features.out_of_mode("off", "ON", []) == "dynspec never switched off for the phase off (no switch logged)"


def with_logprobs(index: int, tokens: Sequence[int], offset: float = 0.0, top: bool = True) -> Reply:
    """Greedy reply whose position i has logprob -(i + 1) / 4 (+ offset), and a top-2 list."""
    meta = {"output_token_logprobs": [[-(i + 1) / 4 + offset, t, None] for i, t in enumerate(tokens)]}
    if top:
        meta["output_top_logprobs"] = [
            [[-(i + 1) / 4 + offset, t, None], [-(i + 1) / 4 - 1 + offset, t + 1, None]] for i, t in enumerate(tokens)
        ]
    return Reply(index, 200, list(tokens), meta, 0.1)


def logprob_phases(offset: float = 0.0, **dynspec: object) -> dict[str, dict[str, list[Reply]]]:
    tokens = [[10 + i, 20 + i, 30 + i, 40 + i] for i in range(3)]
    return {
        phase: {
            "base": [with_logprobs(i, t) for i, t in enumerate(tokens)],
            "always_on": [with_logprobs(i, t) for i, t in enumerate(tokens)],
            "dynspec": [with_logprobs(i, t, offset, **dynspec) for i, t in enumerate(tokens)],  # type: ignore[arg-type]
        }
        for phase in features.PHASES
    }


def test_logprobs_within_tolerance_pass_and_a_drift_fails():
    ok = features.judge_logprobs(logprob_phases(0.01), SIZES)
    assert ok["passed"], ok["problems"]
    assert ok["phases"]["off"]["compared"] == 3 * (4 + 8) and ok["phases"]["off"]["max_abs_diff"] == 0.01
    drift = features.judge_logprobs(logprob_phases(0.1), SIZES)
    assert not drift["passed"] and drift["problems"] == [
        f"off: prompt {i}: 12 of 12 logprobs apart by up to 0.1" for i in range(3)
    ]
    # while on, the same comparison with always-on is reported, not judged
    assert drift["phases"]["on"]["apart"] == 3 and not drift["phases"]["on"]["judged"]


def test_logprobs_name_missing_top_logprobs_and_other_tokens():
    missing = features.judge_logprobs(logprob_phases(top=False), SIZES)
    assert missing["problems"][0] == "off: prompt 0: no top logprobs"
    phases = logprob_phases()
    phases["off"]["dynspec"][1] = with_logprobs(1, [11, 21, 99, 41])
    assert features.judge_logprobs(phases, SIZES)["problems"] == [
        "off: prompt 1: tokens differ from base's at position 2"
    ]


def test_the_logprob_control_needs_positions_the_tolerance_tells_apart():
    flat = {
        phase: {
            role: [
                Reply(
                    0,
                    200,
                    [5, 6],
                    {
                        "output_token_logprobs": [[-1.0, 5, None], [-1.0, 6, None]],
                        "output_top_logprobs": [[[-1.0, 5, None]], [[-1.0, 6, None]]],
                    },
                    0.1,
                )
            ]
            for role in ("base", "always_on", "dynspec")
        }
        for phase in features.PHASES
    }
    entry = features.judge_logprobs(flat, SIZES)
    assert not entry["passed"] and "the tolerance cannot see a change" in entry["problems"][0]


def greedy(index: int, tokens: Sequence[int]) -> Reply:
    return Reply(index, 200, list(tokens), {}, 0.1)


def test_penalties_pass_on_base_tokens_and_fail_on_others_or_without_effect():
    def phases(dynspec_last: int, control_last: int) -> dict[str, dict[str, list[Reply]]]:
        return {
            phase: {
                "base": [greedy(0, [1, 2, 3])],
                "always_on": [greedy(0, [1, 2, 3])],
                "dynspec": [greedy(0, [1, 2, dynspec_last])],
                "control": [greedy(0, [1, 2, control_last])],
            }
            for phase in features.PHASES
        }

    assert features.judge_penalties(phases(3, 9), SIZES)["passed"]
    differ = features.judge_penalties(phases(4, 9), SIZES)
    assert differ["problems"] == [
        "on: 1 of 1 requests gave other tokens than always_on, e.g. prompt 0",
        "off: 1 of 1 requests gave other tokens than base, e.g. prompt 0",
    ]
    no_effect = features.judge_penalties(phases(3, 3), SIZES)
    assert no_effect["problems"][0].startswith("on: the penalties changed no request's tokens (control)")


def test_schema_problem_names_what_breaks_the_schema():
    assert features.schema_problem('{"color":"red","size":"small","ok":true}') is None
    assert features.schema_problem('{"color":"red","size":"small","ok":true') == (
        'not JSON: \'{"color":"red","size":"small","ok":true\''
    )
    assert features.schema_problem('{"color":"red","ok":true}').startswith("not an object with exactly color, size, ok")
    assert features.schema_problem('{"color":"pink","size":"small","ok":true}') == "color = 'pink' breaks the schema"
    assert features.schema_problem('{"color":"red","size":"small","ok":1}') == "ok = 1 breaks the schema"
    assert features.schema_problem(None) == "no text (the server ran without its tokenizer)"


def texted(index: int, text: str) -> Reply:
    return Reply(index, 200, [ord(c) for c in text], {}, 0.1, None, text)


def test_grammar_needs_valid_outputs_base_tokens_and_a_control_that_breaks_the_schema():
    good = '{"color":"red","size":"small","ok":true}'

    def phases(dynspec: str, control: str) -> dict[str, dict[str, list[Reply]]]:
        return {
            p: {
                "base": [texted(0, good)],
                "always_on": [texted(0, good)],
                "dynspec": [texted(0, dynspec)],
                "control": [texted(0, control)],
            }
            for p in features.PHASES
        }

    assert features.judge_grammar(phases(good, "12 34"), SIZES)["passed"]
    broken = features.judge_grammar(phases(good[:-1], "12 34"), SIZES)["problems"]
    assert broken[0].startswith("on: 1 dynspec outputs break the schema, e.g. prompt 0: not JSON")
    assert broken[1] == "on: 1 of 1 requests gave other tokens than always_on, e.g. prompt 0"
    blind = features.judge_grammar(phases(good, good), SIZES)["problems"]
    assert blind[0].startswith("on: every unconstrained output fits the schema too (control)")


def test_a_grammar_wave_off_carries_as_much_ballast_last_unconstrained_and_to_its_length():
    assert features.grammar_ballast("on", 8) == 0 and features.grammar_ballast("off", 16) == 16
    wave = features.grammar_requests(3, ballast=2)
    assert [r.index for r in wave[:3]] == [0, 1, 2] and all("json_schema" in r.sampling for r in wave[:3])
    ballast = wave[3:]
    assert [r.index for r in ballast] == [features.GRAMMAR_BALLAST_FIRST_PROMPT + i for i in range(2)]
    # greedy's ignore_eos stays: each runs GRAMMAR_NEW_TOKENS, at least as long as any constrained request
    assert all(r.sampling == {} and r.new_tokens == features.GRAMMAR_NEW_TOKENS for r in ballast)
    assert features.grammar_requests(3, constrained=False) == [
        features.Request(i, features.GRAMMAR_NEW_TOKENS, sampling={"ignore_eos": False}) for i in range(3)
    ]


def test_a_grammar_wave_must_fit_the_servers_running_requests():
    assert features.grammar_wave_problem(features.phase_sizes(8, 8, 128), 128) is None
    assert features.grammar_wave_problem(features.phase_sizes(32, 32, 128), 128) is None  # 64 + 64
    problem = features.grammar_wave_problem(features.phase_sizes(33, 33, 128), 128)
    assert problem == (
        "grammar's phase off sends 132 requests at once (66 and as much ballast), "
        "more than the 128 a server runs: lower the threshold"
    )


def test_the_logprob_control_passes_with_half_the_requests_apart():
    """On real weights a request of confident tokens has logprobs near 0 at every position."""
    confident = {
        "output_token_logprobs": [[-0.001, 5, None], [-0.002, 6, None]],
        "output_top_logprobs": [[[-0.001, 5, None]], [[-0.002, 6, None]]],
    }
    phases = logprob_phases()
    for phase in features.PHASES:
        for role in ("base", "always_on", "dynspec"):
            phases[phase][role] = [*phases[phase][role][:2], Reply(2, 200, [5, 6], confident, 0.1)]
    assert features.judge_logprobs(phases, SIZES)["passed"]  # 2 of 3 apart
    for phase in features.PHASES:
        for role in ("base", "always_on", "dynspec"):
            phases[phase][role] = [phases[phase][role][0], *[Reply(i, 200, [5, 6], confident, 0.1) for i in (1, 2)]]
    assert not features.judge_logprobs(phases, SIZES)["passed"]  # the control: 1 of 3
