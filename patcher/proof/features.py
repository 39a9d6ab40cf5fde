"""What users send through the fallback (issue 17): sampling, logprobs and penalties.

Each check sends the same requests to a plain server (``base``; on v1 on v1's non-overlap
scheduler, ``run.plain_reference``), an always-on speculative one (``always_on``) and a dynspec
server, in two phases: at a batch size where dynspec speculates (``on``) and one where it has
switched off (``off``). In each phase dynspec is judged against the
static server of its mode (``REFERENCE``): while on it must serve what always-on speculation serves
(SGLang's verify samples and penalizes by rules of its own, and on real weights rounds near ties
apart), while off what plain decode serves. Greedy checks compare request by request; sampling
compares distributions. Each has a control that must fail, so that a check that cannot see a
difference fails instead of passing:

* ``sampling``: the last of a few sampled tokens per request (its prompt, its token) must be
  indistinguishable from base's by a G-test (p > ``sampling.ALPHA``); base sampling the same
  requests at ``CONTROL_TEMPERATURE`` must be distinguishable. While off, dynspec also samples with
  base's seeds (``SAME_SEEDS``): under deterministic inference a draw is a function of seed,
  position and logits, so the requests whose tokens part from base's are reported (not judged),
  beside how many part with dynspec's own seeds, which shows the comparison can tell.
* ``logprobs``: with ``return_logprob`` and top logprobs, dynspec's greedy tokens equal base's and
  every logprob is within ``LOGPROB_ATOL`` + ``LOGPROB_RTOL`` x |base's| while off (the issue's
  target; while on the same comparison with always-on is reported, not judged); the control compares
  base's logprobs with the next position's, which the tolerance must tell apart for at least half
  of the requests.
* ``penalties``: frequency and presence penalties under greedy decoding give base's tokens; the
  control is base without penalties, which must give other tokens.
* ``grammar``: requests constrained by a JSON schema, greedy, each ending at its EOS: dynspec's
  tokens are base's and every output parses and validates; the control is base without the schema,
  whose outputs must not all validate (else the load cannot tell whether the schema held). While
  off, unconstrained ballast in the same wave keeps the batch off until they have all ended.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from patcher.proof import sampling as stats
from patcher.proof.client import Reply, Request

CHECKS = ("sampling", "logprobs", "penalties", "grammar")
ROLES = ("base", "always_on", "dynspec", "control")  # control: base, with the check's control requests
SAME_SEEDS = "dynspec_with_base_seeds"  # dynspec's sampling requests of the phase off, with base's seeds
REFERENCE = {"on": "always_on", "off": "base"}  # what dynspec must serve in each phase
# Why a check needs --model real. Dummy weights' logits are nearly flat: another temperature samples
# alike and neighbouring positions' logprobs are alike, so those controls are blind there (0.5.17,
# session 28: p = 1 and 8 of 8); and the dummy models have no tokenizer, which a grammar is compiled for.
REAL_WEIGHTS_ONLY = {
    "sampling": "dummy weights' logits are nearly flat, so another temperature samples alike",
    "logprobs": "dummy weights' logits are nearly flat, so every position's logprobs are alike",
    "grammar": "the dummy models have no tokenizer to compile a grammar for",
}
PHASES = ("on", "off")  # dynspec speculating, dynspec switched off

SAMPLING_PARAMS: Mapping[str, Any] = {"temperature": 1.0, "top_p": 0.9, "top_k": 50}
CONTROL_TEMPERATURE = 0.7
SAMPLING_PROMPTS = 4
SAMPLING_PER_PROMPT = 300  # 1200 requests a phase and server: a ~10 % shift of a token's mass shows
SAMPLING_NEW_TOKENS = 4  # the last is judged: sampled by the third decode step after the prefill
# Prompt numbers apart from the other checks' (0 .. 127), so no request hits their prefix cache.
SAMPLING_FIRST_PROMPT = 1000
KEY_STRIDE = 1 << 24  # a (prompt, token) pair as one category: prompt x stride + token (vocabularies < 16M)

# Bounded by its enums and booleans, so that a greedy output fits GRAMMAR_NEW_TOKENS whatever the model.
GRAMMAR_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "size": {"enum": ["small", "large"]},
        "ok": {"type": "boolean"},
    },
    "required": ["color", "size", "ok"],
    "additionalProperties": False,
}
GRAMMAR_NEW_TOKENS = 64  # at most: a constrained request ends at its EOS (ignore_eos off)
GRAMMAR_BALLAST_FIRST_PROMPT = 2000  # the ballast's prompts, apart from every check's
LOGPROB_FIELDS: Mapping[str, Any] = {"return_logprob": True, "top_logprobs_num": 5}
PENALTY_PARAMS: Mapping[str, Any] = {"frequency_penalty": 0.5, "presence_penalty": 0.3}
NO_PENALTIES: Mapping[str, Any] = dict.fromkeys(PENALTY_PARAMS, 0.0)  # the control: the same request, unpenalized
FEATURE_NEW_TOKENS = 32
# bf16 keeps 8 bits of mantissa: logits of a few units round by ~0.02, and a log-softmax over them
# by about as much; twice that, plus a relative part for the long tail's large magnitudes.
LOGPROB_ATOL = 0.05
LOGPROB_RTOL = 2**-7


def phase_sizes(on_at_most: int, off_above: int, max_running: int) -> dict[str, int]:
    """Each phase's batch size: the largest at which dynspec speculates, and one well above the
    threshold (twice it, at least 8 more), within the servers' running-request limit."""
    return {"on": on_at_most, "off": min(max(2 * off_above, off_above + 8), max_running)}


# Each role's first sampling_seed: under deterministic inference (on with --model real) SGLang seeds
# every request alike (42) and samples by seed and position, so a prompt's requests would all draw the
# same tokens; and two roles drawing with the same seeds would not be independent samples.
SEED_BASE = {role: i * 1_000_000 for i, role in enumerate(ROLES)}


def out_of_mode(phase: str, before: str, switches: Sequence[str]) -> str | None:
    """Why dynspec was not in ``phase``'s mode throughout a load, from its state before it (``ON`` /
    ``OFF``) and the switches it logged during it; None if it was. Off: one switch off at the load's
    first wave is its way in."""
    want = "ON" if phase == "on" else "OFF"
    away = [d for d in switches if d != want]
    after = switches[-1] if switches else before
    if away or len(switches) > 1:
        return f"dynspec switched {'off' if want == 'ON' else 'back on'} during a load of the phase {phase} ({' '.join(switches)})"
    if after != want:
        return f"dynspec never switched {'off' if want == 'OFF' else 'on'} for the phase {phase} (no switch logged)"
    return None


def sampling_requests(role: str, per_prompt: int = SAMPLING_PER_PROMPT, seeds_of: str | None = None) -> list[Request]:
    """``per_prompt`` requests of each of ``SAMPLING_PROMPTS`` prompts, interleaved, at the control's
    temperature for ``control``, each with a ``sampling_seed`` of its own (without deterministic
    inference SGLang does not use it): the role's, or ``seeds_of``'s."""
    temperature = CONTROL_TEMPERATURE if role == "control" else SAMPLING_PARAMS["temperature"]
    params = {**SAMPLING_PARAMS, "temperature": temperature}
    first_seed = SEED_BASE[seeds_of or role]
    return [
        Request(
            SAMPLING_FIRST_PROMPT + k % SAMPLING_PROMPTS,
            SAMPLING_NEW_TOKENS,
            sampling={**params, "sampling_seed": first_seed + k},
        )
        for k in range(SAMPLING_PROMPTS * per_prompt)
    ]


def greedy_requests(count: int, *, logprobs: bool = False, penalties: bool | None = None) -> list[Request]:
    """``count`` greedy requests (prompts 0 ..), sent as one batch so both servers decode them alike;
    ``penalties`` True: penalized, False: the penalties given as 0 (the control), None: not given."""
    sampling = {} if penalties is None else PENALTY_PARAMS if penalties else NO_PENALTIES
    return [
        Request(i, FEATURE_NEW_TOKENS, sampling=sampling, fields=LOGPROB_FIELDS if logprobs else {})
        for i in range(count)
    ]


def grammar_requests(count: int, *, constrained: bool = True, ballast: int = 0) -> list[Request]:
    """``count`` greedy requests ending at their EOS, constrained by ``GRAMMAR_SCHEMA`` (the control:
    not), then ``ballast`` plain ones of ``GRAMMAR_NEW_TOKENS`` that ignore their EOS, to be sent as
    one wave: the ballast outlasts every constrained request (``grammar_ballast``)."""
    sampling: dict[str, Any] = {"ignore_eos": False}
    if constrained:
        sampling["json_schema"] = json.dumps(GRAMMAR_SCHEMA)
    judged = [Request(i, GRAMMAR_NEW_TOKENS, sampling=sampling) for i in range(count)]
    return judged + [Request(GRAMMAR_BALLAST_FIRST_PROMPT + i, GRAMMAR_NEW_TOKENS) for i in range(ballast)]


def grammar_ballast(phase: str, size: int) -> int:
    """How many ballast requests ride with a phase's grammar wave of ``size``. Off: as many, so the
    batch stays above the threshold until the last constrained request has ended. Without them the
    requests, ending at their EOS one by one, shrink the batch to the threshold while some still
    decode, and dynspec rightly switches back on (0.5.17 on real weights, session 31). On: none,
    a shrinking batch stays on. The wave must be admitted whole (``grammar_wave_problem``), and the
    constrained requests with it: their grammar compiled in the phase on, a cache hit, so none
    waits in SGLang's grammar queue while the ballast decodes."""
    return size if phase == "off" else 0


def grammar_wave_problem(sizes: Mapping[str, int], max_running: int) -> str | None:
    """Why a server cannot admit a phase's grammar wave in one go (ballast queued behind the batch
    would decode alone at its tail and switch dynspec back on); None if it can."""
    for phase in PHASES:
        wave = sizes[phase] + grammar_ballast(phase, sizes[phase])
        if wave > max_running:
            return (
                f"grammar's phase {phase} sends {wave} requests at once ({sizes[phase]} and as much ballast), "
                f"more than the {max_running} a server runs: lower the threshold"
            )
    return None


def schema_problem(text: str | None) -> str | None:
    """Why ``text`` is not an instance of ``GRAMMAR_SCHEMA``; None if it is."""
    if text is None:
        return "no text (the server ran without its tokenizer)"
    try:
        value = json.loads(text)
    except ValueError:
        return f"not JSON: {text[:60]!r}"
    properties = GRAMMAR_SCHEMA["properties"]
    if not isinstance(value, dict) or set(value) != set(GRAMMAR_SCHEMA["required"]):
        return f"not an object with exactly {', '.join(GRAMMAR_SCHEMA['required'])}: {text[:60]!r}"
    for key, rule in properties.items():
        allowed = value[key] in rule["enum"] if "enum" in rule else isinstance(value[key], bool)
        if not allowed:
            return f"{key} = {value[key]!r} breaks the schema"
    return None


def judge_grammar(replies: Mapping[str, Mapping[str, Sequence[Reply]]], sizes: Mapping[str, int]) -> dict[str, Any]:
    """``replies[phase]`` holds each role's replies, the static ones and dynspec under the schema and
    ``control`` (base without it): every output valid, dynspec's tokens its phase's reference's, and
    not every control output valid."""
    problems: list[str] = []
    phases: dict[str, Any] = {}
    for phase in PHASES:
        got, reference = replies.get(phase, {}), REFERENCE[phase]
        comparable, found = every_role(phase, got)
        problems += found
        if not comparable:
            continue
        invalid = {
            role: [(r.index, why) for r in got[role] if (why := schema_problem(r.text)) is not None] for role in ROLES
        }
        differ = apart(got[reference], got["dynspec"])
        phases[phase] = {
            "batch": sizes[phase],
            "ballast": grammar_ballast(phase, sizes[phase]),  # in the same wave, not judged
            "reference": reference,
            "valid": {role: len(got[role]) - len(invalid[role]) for role in ROLES},
            "differ": len(differ),
        }
        for role in ("base", "always_on", "dynspec"):
            if invalid[role]:
                index, why = invalid[role][0]
                problems.append(
                    f"{phase}: {len(invalid[role])} {role} outputs break the schema, e.g. prompt {index}: {why}"
                )
        if differ:
            problems.append(
                f"{phase}: {len(differ)} of {len(got[reference])} requests gave other tokens than {reference}, e.g. prompt {differ[0]}"
            )
        if not invalid["control"]:
            problems.append(
                f"{phase}: every unconstrained output fits the schema too (control): this load cannot see it"
            )
    return {
        "passed": not problems,
        "schema": dict(GRAMMAR_SCHEMA),
        "new_tokens": GRAMMAR_NEW_TOKENS,
        "phases": phases,
        "problems": problems,
        "detail": "; ".join(
            f"{p} (batch {e['batch']}{f' + {b} ballast' if (b := e['ballast']) else ''}): "
            f"{e['valid']['dynspec']} valid, {e['differ']} differ from {e['reference']}"
            for p, e in phases.items()
        ),
    }


def apart(reference: Sequence[Reply], dynspec: Sequence[Reply]) -> list[int]:
    """The prompts whose dynspec tokens are not the reference's, request by request."""
    return [r.index for r, d in zip(reference, dynspec) if r.output_ids != d.output_ids]


def last_tokens(replies: Sequence[Reply]) -> Counter[int]:
    """How often each (prompt, last token) came, as categories for the G-test."""
    return Counter(r.index * KEY_STRIDE + r.output_ids[-1] for r in replies if r.error is None and r.output_ids)


def every_role(phase: str, got: Mapping[str, Sequence[Reply]]) -> tuple[bool, list[str]]:
    """Whether a phase's replies can be compared request by request (every role there, with as many
    replies as the others), and its problems: that, or each role's failed requests."""
    missing = [role for role in ROLES if not got.get(role)]
    if missing or len({len(got[role]) for role in ROLES}) != 1:
        return False, [f"{phase}: replies missing or of other counts ({', '.join(missing) or 'counts differ'})"]
    return True, [p for role in ROLES for p in failures(got[role], f"{phase} {role}")]


def failures(replies: Sequence[Reply], label: str) -> list[str]:
    failed = [r for r in replies if r.error is not None]
    return [f"{label}: {len(failed)} of {len(replies)} requests failed, e.g. {failed[0].error}"] if failed else []


def judge_sampling(samples: Mapping[str, Mapping[str, Sequence[Reply]]], sizes: Mapping[str, int]) -> dict[str, Any]:
    """``samples[phase]`` holds each role's replies (``control``: base at the control's temperature).
    Passes when in every phase dynspec is indistinguishable from its reference and the control from
    base is not; always-on against base is reported (``upstream``), not judged."""
    problems: list[str] = []
    phases: dict[str, Any] = {}
    for phase in PHASES:
        got, reference = samples.get(phase, {}), REFERENCE[phase]
        for role in ROLES:
            problems += failures(got.get(role, ()), f"{phase} {role}")
        counts = {role: last_tokens(got.get(role, ())) for role in ROLES}
        empty = [role for role in ROLES if not counts[role]]
        if empty:
            problems.append(f"{phase}: no sampled tokens from {', '.join(empty)}")
            continue
        dynspec = stats.homogeneity(counts[reference], counts["dynspec"])
        control = stats.homogeneity(counts["base"], counts["control"])
        upstream = stats.homogeneity(counts["base"], counts["always_on"])
        phases[phase] = {
            "batch": sizes[phase],
            "reference": reference,
            "dynspec": dynspec.entry(),
            "control": control.entry(),
            "upstream": upstream.entry(),
        }
        if got.get(SAME_SEEDS):
            phases[phase]["same_seeds"] = same_seeds(got["base"], got["dynspec"], got[SAME_SEEDS])
        if not stats.indistinguishable(dynspec):
            problems.append(
                f"{phase}: dynspec's tokens are distributed unlike {reference}'s (G-test p = {dynspec.p_value:.2g} "
                f"<= {stats.ALPHA})"
            )
        if stats.indistinguishable(control):
            problems.append(
                f"{phase}: the control (base at temperature {CONTROL_TEMPERATURE}) is indistinguishable from "
                f"base (p = {control.p_value:.2g}): this sample cannot see a skew"
            )
    return {
        "passed": not problems,
        "params": dict(SAMPLING_PARAMS),
        "control_temperature": CONTROL_TEMPERATURE,
        "prompts": SAMPLING_PROMPTS,
        "per_prompt": max((len(g.get("base", ())) for g in samples.values()), default=0) // SAMPLING_PROMPTS,
        "new_tokens": SAMPLING_NEW_TOKENS,
        "alpha": stats.ALPHA,
        "phases": phases,
        "problems": problems,
        "detail": "; ".join(
            f"{p} (batch {e['batch']}, against {e['reference']}): p = {e['dynspec']['p_value']:.3g}, "
            f"control p = {e['control']['p_value']:.2g}"
            + (f", with base's seeds {s['apart']} of {s['requests']} apart" if (s := e.get("same_seeds")) else "")
            for p, e in phases.items()
        ),
    }


def same_seeds(base: Sequence[Reply], own: Sequence[Reply], with_base_seeds: Sequence[Reply]) -> dict[str, Any]:
    """Request by request, how many of dynspec's draws with base's seeds part from base's, and (that
    the comparison can tell) how many of its draws with its own seeds do."""

    def answered(dynspec: Sequence[Reply]) -> tuple[list[Reply], list[Reply]]:
        pairs = [(b, d) for b, d in zip(base, dynspec) if b.error is None and d.error is None]
        return [b for b, _ in pairs], [d for _, d in pairs]

    # a failed request is left out of both counts: else it would count as apart in the control alone
    same, own_pairs = answered(with_base_seeds), answered(own)
    return {
        "requests": len(same[0]),
        "apart": len(apart(*same)),
        "own_seeds_requests": len(own_pairs[0]),
        "own_seeds_apart": len(apart(*own_pairs)),
    }


def token_logprobs(reply: Reply) -> list[tuple[float, int]] | None:
    """(logprob, token) of each emitted token, as ``output_token_logprobs`` gives them; None without."""
    rows = reply.meta.get("output_token_logprobs")
    if not isinstance(rows, list):
        return None
    return [(float(row[0]), int(row[1])) for row in rows]


def top_logprobs(reply: Reply) -> list[dict[int, float]] | None:
    """{token: logprob} of each position's top logprobs; None without."""
    rows = reply.meta.get("output_top_logprobs")
    if not isinstance(rows, list):
        return None
    return [{int(entry[1]): float(entry[0]) for entry in position or []} for position in rows]


def close(value: float, reference: float) -> bool:
    return abs(value - reference) <= LOGPROB_ATOL + LOGPROB_RTOL * abs(reference)


def compare_logprobs(base: Reply, other: Reply, shift: int = 0) -> tuple[int, float, list[str]]:
    """(logprobs compared, the largest difference, problems) of ``other`` against ``base``: tokens
    equal, each emitted token's logprob close, and each top-logprob entry that both list close
    (a near tie may swap the last entry in or out). ``shift`` compares base's position i with
    other's i + shift (the control)."""
    label = f"prompt {base.index}"
    if base.output_ids != other.output_ids:
        return (
            0,
            0.0,
            [f"{label}: tokens differ from base's at position {first_apart(base.output_ids, other.output_ids)}"],
        )
    mine, theirs = token_logprobs(base), token_logprobs(other)
    if mine is None or theirs is None or len(mine) != len(base.output_ids) or len(theirs) != len(mine):
        return 0, 0.0, [f"{label}: no logprob for every emitted token ({'base' if mine is None else 'dynspec'})"]
    pairs = [(mine[i][0], theirs[i + shift][0]) for i in range(len(mine) - shift)]
    top_b, top_o = top_logprobs(base), top_logprobs(other)
    if top_b is None or top_o is None:
        return 0, 0.0, [f"{label}: no top logprobs"]
    for i in range(len(top_b) - shift):
        shared = top_b[i].keys() & top_o[i + shift].keys()
        pairs += [(top_b[i][t], top_o[i + shift][t]) for t in sorted(shared)]
    worst = max((abs(mine_lp - other_lp) for mine_lp, other_lp in pairs), default=0.0)
    apart = sum(not close(other_lp, mine_lp) for mine_lp, other_lp in pairs)
    problems = [f"{label}: {apart} of {len(pairs)} logprobs apart by up to {worst:.3g}"] if apart else []
    return len(pairs), worst, problems


def first_apart(a: Sequence[int], b: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def judge_logprobs(replies: Mapping[str, Mapping[str, Sequence[Reply]]], sizes: Mapping[str, int]) -> dict[str, Any]:
    """``replies[phase]`` holds each static role's and dynspec's greedy replies with logprobs. Off,
    dynspec's must be base's within the tolerance (judged); on, its comparison with always-on is
    reported. The control (base against itself one position on) must be apart."""
    problems: list[str] = []
    phases: dict[str, Any] = {}
    for phase in PHASES:
        got, reference = replies.get(phase, {}), REFERENCE[phase]
        ref, dynspec, base = (list(got.get(role, ())) for role in (reference, "dynspec", "base"))
        if not ref or len(ref) != len(dynspec) or not base:
            problems.append(f"{phase}: {len(ref)} {reference} and {len(dynspec)} dynspec replies")
            continue
        compared, worst, found = 0, 0.0, list[str]()
        for r, d in zip(ref, dynspec):
            n, w, p = compare_logprobs(r, d)
            compared, worst, found = compared + n, max(worst, w), found + p
        control = [compare_logprobs(b, b, shift=1)[2] for b in base]
        teeth = sum(bool(p) for p in control)
        judged = phase == "off"
        phases[phase] = {
            "batch": sizes[phase],
            "reference": reference,
            "judged": judged,
            "compared": compared,
            "max_abs_diff": round(worst, 5),
            "apart": len(found),
            "control_apart": f"{teeth} of {len(base)} requests",
        }
        if not judged:
            continue
        problems += failures(ref, f"{phase} {reference}") + failures(dynspec, f"{phase} dynspec")
        problems += [f"{phase}: {p}" for p in found[:5]]
        # Half, not all: on real weights a request of confident tokens has logprobs near 0 everywhere.
        if 2 * teeth < len(base):
            problems.append(
                f"{phase}: the control (each logprob against the next position's) is within tolerance for "
                f"{len(base) - teeth} of {len(base)} requests: the tolerance cannot see a change"
            )
    return {
        "passed": not problems,
        "fields": dict(LOGPROB_FIELDS),
        "atol": LOGPROB_ATOL,
        "rtol": LOGPROB_RTOL,
        "new_tokens": FEATURE_NEW_TOKENS,
        "phases": phases,
        "problems": problems,
        "detail": "; ".join(
            f"{p} (batch {e['batch']}, against {e['reference']}{'' if e['judged'] else ', not judged'}): "
            f"{e['compared']} logprobs, largest difference {e['max_abs_diff']}"
            for p, e in phases.items()
        ),
    }


def judge_penalties(replies: Mapping[str, Mapping[str, Sequence[Reply]]], sizes: Mapping[str, int]) -> dict[str, Any]:
    """``replies[phase]`` holds each static role's and dynspec's penalized replies and ``control``
    (base with the penalties at 0): dynspec's tokens must be its reference's, and the control's other
    than base's. While on, SGLang's verify penalizes by its own rule (not the tokens accepted earlier
    in the same step), so the reference is always-on there."""
    problems: list[str] = []
    phases: dict[str, Any] = {}
    for phase in PHASES:
        got, reference = replies.get(phase, {}), REFERENCE[phase]
        comparable, found = every_role(phase, got)
        problems += found
        if not comparable:
            continue
        differ = apart(got[reference], got["dynspec"])
        changed = len(apart(got["base"], got["control"]))
        phases[phase] = {
            "batch": sizes[phase],
            "reference": reference,
            "differ": len(differ),
            "control_changed": changed,
        }
        if differ:
            problems.append(
                f"{phase}: {len(differ)} of {len(got[reference])} requests gave other tokens than {reference}, "
                f"e.g. prompt {differ[0]}"
            )
        if not changed:
            problems.append(f"{phase}: the penalties changed no request's tokens (control): this load cannot see them")
    return {
        "passed": not problems,
        "params": dict(PENALTY_PARAMS),
        "new_tokens": FEATURE_NEW_TOKENS,
        "phases": phases,
        "problems": problems,
        "detail": "; ".join(
            f"{p} (batch {e['batch']}, against {e['reference']}): {e['differ']} differ, penalties changed "
            f"{e['control_changed']}"
            for p, e in phases.items()
        ),
    }
