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
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from patcher.proof import sampling as stats
from patcher.proof.client import Reply, Request

CHECKS = ("sampling", "logprobs", "penalties")
# Dummy weights' logits are nearly flat: another temperature samples alike and neighbouring positions'
# logprobs are alike, so these two checks' controls are blind there (0.5.17, session 28: p = 1 and 8 of 8).
REAL_WEIGHTS_ONLY = ("sampling", "logprobs")
PHASES = ("on", "off")  # dynspec speculating, dynspec switched off

SAMPLING_PARAMS: Mapping[str, Any] = {"temperature": 1.0, "top_p": 0.9, "top_k": 50}
CONTROL_TEMPERATURE = 0.7
SAMPLING_PROMPTS = 4
SAMPLING_PER_PROMPT = 300  # 1200 requests a phase and server: a ~10 % shift of a token's mass shows
SAMPLING_NEW_TOKENS = 4  # the last is judged: sampled by the third decode step after the prefill
# Prompt numbers apart from the other checks' (0 .. 127), so no request hits their prefix cache.
SAMPLING_FIRST_PROMPT = 1000
KEY_STRIDE = 1 << 24  # a (prompt, token) pair as one category: prompt x stride + token (vocabularies < 16M)

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
    """``per_prompt`` requests of each of ``SAMPLING_PROMPTS`` prompts, interleaved."""
    params = {**SAMPLING_PARAMS, "temperature": temperature}
    return [
        Request(SAMPLING_FIRST_PROMPT + k % SAMPLING_PROMPTS, SAMPLING_NEW_TOKENS, sampling=params)
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
