"""What users send through the fallback (issue 17): sampling, logprobs and penalties.

Each check sends the same requests to a plain server (``base``) and a dynspec server, in two
phases: at a batch size where dynspec speculates (``on``) and one where it has switched off
(``off``). Greedy checks compare request by request; sampling compares distributions. Each has a
control that must fail, so that a check that cannot see a difference fails instead of passing:

* ``sampling``: the last of a few sampled tokens per request (its prompt, its token) must be
  indistinguishable from base's by a G-test (p > ``sampling.ALPHA``); base sampling the same
  requests at ``CONTROL_TEMPERATURE`` must be distinguishable.
* ``logprobs``: with ``return_logprob`` and top logprobs, dynspec's greedy tokens equal base's and
  every logprob is within ``LOGPROB_ATOL`` + ``LOGPROB_RTOL`` x |base's|; the control compares base's
  logprobs with the next position's, which the tolerance must tell apart.
* ``penalties``: frequency and presence penalties under greedy decoding give base's tokens; the
  control is base without penalties, which must give other tokens.
* ``grammar``: requests constrained by a JSON schema, greedy, each ending at its EOS: dynspec's
  tokens are base's and every output parses and validates; the control is base without the schema,
  whose outputs must not all validate (else the load cannot tell whether the schema held).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from patcher.proof import sampling as stats
from patcher.proof.client import Reply, Request

CHECKS = ("sampling", "logprobs", "penalties", "grammar")
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


def sampling_requests(temperature: float, per_prompt: int = SAMPLING_PER_PROMPT) -> list[Request]:
    """``per_prompt`` requests of each of ``SAMPLING_PROMPTS`` prompts, interleaved, request k with
    ``sampling_seed`` k: under deterministic inference (on with --model real) SGLang seeds every request
    alike (42) and samples by seed and position, so that otherwise a prompt's requests would all draw
    the same tokens; without it the seed is not used."""
    params = {**SAMPLING_PARAMS, "temperature": temperature}
    return [
        Request(
            SAMPLING_FIRST_PROMPT + k % SAMPLING_PROMPTS, SAMPLING_NEW_TOKENS, sampling={**params, "sampling_seed": k}
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


def grammar_requests(count: int, *, constrained: bool = True) -> list[Request]:
    """``count`` greedy requests ending at their EOS, constrained by ``GRAMMAR_SCHEMA`` (the control: not)."""
    sampling: dict[str, Any] = {"ignore_eos": False}
    if constrained:
        sampling["json_schema"] = json.dumps(GRAMMAR_SCHEMA)
    return [Request(i, GRAMMAR_NEW_TOKENS, sampling=sampling) for i in range(count)]


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
    """``replies[phase]`` holds ``base`` and ``dynspec`` under the schema and ``control`` (base
    without it): every output valid, dynspec's tokens base's, and not every control output valid."""
    problems: list[str] = []
    phases: dict[str, Any] = {}
    for phase in PHASES:
        got = replies.get(phase, {})
        base, dynspec, control = (list(got.get(k, ())) for k in ("base", "dynspec", "control"))
        if not base or not len(base) == len(dynspec) == len(control):
            problems.append(f"{phase}: {len(base)} base, {len(dynspec)} dynspec and {len(control)} control replies")
            continue
        for name, rs in (("base", base), ("dynspec", dynspec), ("control", control)):
            problems += failures(rs, f"{phase} {name}")
        invalid = {
            name: [(r.index, problem) for r in rs if (problem := schema_problem(r.text)) is not None]
            for name, rs in (("base", base), ("dynspec", dynspec), ("control", control))
        }
        differ = [b.index for b, d in zip(base, dynspec) if b.output_ids != d.output_ids]
        phases[phase] = {
            "batch": sizes[phase],
            "valid": {name: len(base) - len(bad) for name, bad in invalid.items()},
            "differ": len(differ),
        }
        for name in ("base", "dynspec"):
            if invalid[name]:
                index, problem = invalid[name][0]
                problems.append(
                    f"{phase}: {len(invalid[name])} {name} outputs break the schema, e.g. prompt {index}: {problem}"
                )
        if differ:
            problems.append(
                f"{phase}: {len(differ)} of {len(base)} requests gave other tokens than base, e.g. prompt {differ[0]}"
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
            f"{p} (batch {e['batch']}): {e['valid']['dynspec']} valid, {e['differ']} differ" for p, e in phases.items()
        ),
    }


def last_tokens(replies: Sequence[Reply]) -> Counter[int]:
    """How often each (prompt, last token) came, as categories for the G-test."""
    return Counter(r.index * KEY_STRIDE + r.output_ids[-1] for r in replies if r.error is None and r.output_ids)


def failures(replies: Sequence[Reply], label: str) -> list[str]:
    failed = [r for r in replies if r.error is not None]
    return [f"{label}: {len(failed)} of {len(replies)} requests failed, e.g. {failed[0].error}"] if failed else []


def judge_sampling(samples: Mapping[str, Mapping[str, Sequence[Reply]]], sizes: Mapping[str, int]) -> dict[str, Any]:
    """``samples[phase]`` holds ``base``, ``dynspec`` and ``control`` (base at the control's
    temperature) replies. Passes when in every phase dynspec is indistinguishable from base and
    the control is not."""
    problems: list[str] = []
    phases: dict[str, Any] = {}
    for phase in PHASES:
        got = samples.get(phase, {})
        missing = [k for k in ("base", "dynspec", "control") if not got.get(k)]
        if missing:
            problems.append(f"{phase}: no {', '.join(missing)} sample")
            continue
        for name in ("base", "dynspec", "control"):
            problems += failures(got[name], f"{phase} {name}")
        base = last_tokens(got["base"])
        dynspec = stats.homogeneity(base, last_tokens(got["dynspec"]))
        control = stats.homogeneity(base, last_tokens(got["control"]))
        phases[phase] = {"batch": sizes[phase], "dynspec": dynspec.entry(), "control": control.entry()}
        if not stats.indistinguishable(dynspec):
            problems.append(
                f"{phase}: dynspec's tokens are distributed unlike base's (G-test p = {dynspec.p_value:.2g} "
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
            f"{p} (batch {e['batch']}): p = {e['dynspec']['p_value']:.3g}, control p = {e['control']['p_value']:.2g}"
            for p, e in phases.items()
        ),
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
    """``replies[phase]`` holds ``base`` and ``dynspec``'s greedy replies with logprobs, request
    by request. The control (base against itself one position on) must be apart."""
    problems: list[str] = []
    phases: dict[str, Any] = {}
    for phase in PHASES:
        got = replies.get(phase, {})
        base, dynspec = list(got.get("base", ())), list(got.get("dynspec", ()))
        if not base or len(base) != len(dynspec):
            problems.append(f"{phase}: {len(base)} base and {len(dynspec)} dynspec replies")
            continue
        problems += failures(base, f"{phase} base") + failures(dynspec, f"{phase} dynspec")
        compared, worst, found = 0, 0.0, list[str]()
        for b, d in zip(base, dynspec):
            n, w, p = compare_logprobs(b, d)
            compared, worst, found = compared + n, max(worst, w), found + p
        control = [compare_logprobs(b, b, shift=1)[2] for b in base]
        teeth = sum(bool(p) for p in control)
        phases[phase] = {
            "batch": sizes[phase],
            "compared": compared,
            "max_abs_diff": round(worst, 5),
            "control_apart": f"{teeth} of {len(base)} requests",
        }
        problems += [f"{phase}: {p}" for p in found[:5]]
        if teeth < len(base):
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
            f"{p} (batch {e['batch']}): {e['compared']} logprobs, largest difference {e['max_abs_diff']}"
            for p, e in phases.items()
        ),
    }


def judge_penalties(replies: Mapping[str, Mapping[str, Sequence[Reply]]], sizes: Mapping[str, int]) -> dict[str, Any]:
    """``replies[phase]`` holds ``base`` and ``dynspec`` with penalties and ``control`` (base
    without): dynspec's tokens must be base's, and the control's other than base's."""
    problems: list[str] = []
    phases: dict[str, Any] = {}
    for phase in PHASES:
        got = replies.get(phase, {})
        base, dynspec, control = (list(got.get(k, ())) for k in ("base", "dynspec", "control"))
        if not base or not len(base) == len(dynspec) == len(control):
            problems.append(f"{phase}: {len(base)} base, {len(dynspec)} dynspec and {len(control)} control replies")
            continue
        for name, rs in (("base", base), ("dynspec", dynspec), ("control", control)):
            problems += failures(rs, f"{phase} {name}")
        differ = [b.index for b, d in zip(base, dynspec) if b.output_ids != d.output_ids]
        changed = sum(b.output_ids != c.output_ids for b, c in zip(base, control))
        phases[phase] = {"batch": sizes[phase], "differ": len(differ), "control_changed": changed}
        if differ:
            problems.append(
                f"{phase}: {len(differ)} of {len(base)} requests gave other tokens than base, e.g. prompt {differ[0]}"
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
            f"{p} (batch {e['batch']}): {e['differ']} differ, penalties changed {e['control_changed']}"
            for p, e in phases.items()
        ),
    }
