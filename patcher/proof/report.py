"""The JSON report of a proof run, its pass/fail verdict and the one-screen summary.

Keys other tools may rely on (kept stable): ``sglang_version``, ``path`` ("v1" or "v2"),
``gpu``, ``command``, ``dynspec_applied``, ``dynspec_revisions`` {patch id: the revision its
markers in the tree name}, ``passed``, ``equivalence`` {``passed``,
``levels``}, ``crossings`` {``count``, ``errors``}, ``exact_kv`` {``passed``,
``compared_requests``, ``compared_steps``, ``control_differs``}, ``throughput`` {``levels``,
``base``, ``always_on``, ``dynspec``, ``envelope_ratio``} with lists aligned with ``levels``, and
``per_step`` {server mode: {level: {``pairs``, ``min``, ``median``, ``max``}}} (``per_step_speculating``:
the same for dynspec's speculating steps against always-on's) and ``per_run`` {server
mode: {level: [each run's median steady tok/s]}} and ``outside_steady_ms`` {server mode: {level: [each
timed run's milliseconds beyond its tokens at its steady speed]}} (``steps``),
``mixed_load`` {``passed``, ``seconds`` {``base``, ``always_on``, ``dynspec``},
``oracle_seconds``, ``phases``, ``phase_median_sums`` and ``dynspec_over_oracle_by_phase`` (the oracle's
statistic for every server, reported, not judged), and with ``--mixed-variant`` ``variants`` {name: {``env``,
``seconds``, ``over_dynspec``, ``dynspec_over_oracle``}}}, ``acceptance`` {``passed``, ``always_on``, ``dynspec_resumed``,
``skip_resumed``, ``full_resumed``, ``requests``, ``resumed_over_full``, ``resumed_over_always_on``, ``skip_over_full``
({``ratio``, ``ci95``}), ``control_drops``, with real weights ``proposals``}, ``model`` (``dummy``, or the real model's name) and ``model_sha256`` (real weights: {``gguf``, ``head``}, the
SHA-256 of the weights that ran; else null), ``model_paths`` (weights of `dynspec real own`: {``target``, ``head``},
the dirs that ran; else null), ``sampling``, ``logprobs``, ``penalties`` and ``grammar`` (issue 17) {``passed``,
``phases`` {``on``, ``off``: each with ``batch``; sampling's ``dynspec`` and ``control`` G-tests, logprobs'
``compared`` and ``max_abs_diff``, penalties' ``differ`` and ``control_changed``, grammar's ``valid`` and
``differ``}}, ``backends`` {``passed``, ``attention_backend``, ``equivalence``, ``crossings``}, ``attention_backend``. A check that was not run is absent and named in ``skipped``
with the reason; without dynspec applied, ``throughput.dynspec`` and
``throughput.envelope_ratio`` are null.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from patcher.proof.steps import describe, describe_outside, describe_runs

CHECKS = (
    "equivalence",
    "crossings",
    "exact_kv",
    "acceptance",
    "throughput",
    "mixed_load",
    "auto_threshold",
    "refusals",
    "metrics",
    "sampling",
    "logprobs",
    "penalties",
    "grammar",
    "backends",
)
REPORT_NAME = "report.json"
SUMMARY_NAME = "summary.txt"
PLOT_NAME = "throughput.png"

Report = dict[str, Any]


# A mixed-load server's entry: the prompt tokens its prefills found cached during its passes. Each
# pass sends new prompts (mixed.Schedule.requests), so on the dummy 8B servers it is 0; a server
# whose count stands apart timed prefills the others paid for (session 36's N = 64 / 96).
MIXED_CACHED = "mixed_cached_prompt_tokens"
# A server's entry, where its release logs them: the garbage collections longer than
# launch.GC_WARNING_SECS that SGLang's HTTP process (the tokenizer manager, the only one that
# watches them) made while the server served. Each holds back requests arriving and answers
# leaving, not the GPU's steps: session 38's ~0.45 s generation-2 collection, one per server,
# cost a run what it did where it fell inside the run's admission.
LONG_GC = "long_gc"
LONG_GC_OVER = "long_gc_over_secs"  # the threshold it was logged over (the caller's flag wins)


def weights(shape: str | None) -> str:
    """A report's shape as the summary names it: "8b shape", or "real weights"."""
    return "real weights" if shape == "real" else f"{shape} shape"


def envelope_ratio(
    base: Sequence[float | None], always_on: Sequence[float | None], dynspec: Sequence[float | None]
) -> list[float | None]:
    """R(C) = dynspec / max(base, always-on) at each level; None where a value is missing."""
    if not len(base) == len(always_on) == len(dynspec):
        raise ValueError("throughput lists of different lengths")
    out: list[float | None] = []
    for b, a, d in zip(base, always_on, dynspec):
        best = max((x for x in (b, a) if x is not None), default=None)
        out.append(None if d is None or not best else round(d / best, 4))
    return out


def switch_point(
    levels: Sequence[int], base: Sequence[float | None], always_on: Sequence[float | None]
) -> dict[str, int | None] | None:
    """Where speculation stops paying, read from measured tok/s (README "Choosing N"): the largest
    level up to which always-on was faster at every level, the next level (plain decode faster
    there), and between them the batch size where always-on / base crosses 1, linear in the ratio:
    an estimate of N. None where no level was measured or one lacks a number."""
    if not levels or any(b is None or a is None or not b for b, a in zip(base, always_on)):
        return None
    ratios = [a / b for b, a in zip(base, always_on) if a is not None and b]
    faster = 0
    while faster < len(levels) and ratios[faster] > 1:
        faster += 1
    up_to = levels[faster - 1] if faster else None
    plain_from = levels[faster] if faster < len(levels) else None
    estimate = None
    if up_to is not None and plain_from is not None:
        above, below = ratios[faster - 1] - 1, 1 - ratios[faster]
        estimate = int(up_to + (plain_from - up_to) * above / (above + below))
    return {"speculation_faster_up_to": up_to, "plain_faster_from": plain_from, "crossover_estimate": estimate}


def over(numerator: Sequence[float | None], denominator: Sequence[float | None]) -> list[float | None]:
    """numerator / denominator at each level, e.g. dynspec / upstream adaptive; None where missing."""
    if len(numerator) != len(denominator):
        raise ValueError("throughput lists of different lengths")
    return [None if n is None or not d else round(n / d, 4) for n, d in zip(numerator, denominator)]


def verdict(report: Report) -> bool:
    """True when at least one check ran and every check that ran passed."""
    ran = [report[c] for c in CHECKS if c in report]
    return bool(ran) and all(c.get("passed") is True for c in ran)


def exit_code(report: Report) -> int:
    return 0 if verdict(report) else 1


def write(report: Report, out: Path) -> Path:
    """Write ``report.json`` atomically (a partial report survives a killed run)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / REPORT_NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return path


def load(path: Path) -> Report:
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a dynspec proof report")
    return data


def _refill_lines(by_server: Mapping[str, Mapping[str, Mapping[str, float]]] | None, indent: str) -> list[str]:
    """An auto sweep's prefills per 1000 tokens (``steps.refills`` by server), a line per band of
    running requests: the servers that speculated there, then those that did not."""
    by_server = by_server or {}
    lines = []
    for band in sorted({b for bands in by_server.values() for b in bands}, key=lambda b: int(b.split("-")[1])):
        said = []
        for mode in ("speculating", "not_speculating"):
            rates = [
                f"{name} {bands[band][mode]:.2f}" for name, bands in by_server.items() if mode in bands.get(band, {})
            ]
            if rates:
                said.append(f"{mode.replace('_', ' ')} {', '.join(rates)}")
        lines.append(f"{indent}prefills per 1000 tokens at {band} running: {'; '.join(said)}")
    return lines


def _fallback_lines(e: Mapping[str, Any], indent: str) -> list[str]:
    """An auto sweep's steady steps without speculation (``steps.fallback_steps`` by server), a line
    per concurrency: the dynspec servers' (the same code) with how far apart they lie, then plain
    decode's."""
    by_server: Mapping[str, Mapping[str, float]] = e.get("fallback_step_ms") or {}
    spreads: Mapping[str, float] = e.get("fallback_step_spread") or {}
    lines = []
    for level in sorted({lv for levels in by_server.values() for lv in levels}, key=int):
        dynspec = [f"{name} {ms[level]:.2f}" for name, ms in by_server.items() if name != "base" and level in ms]
        said = [", ".join(dynspec)] if dynspec else []
        if level in spreads:
            said[-1] += f" (the same code, up to {spreads[level]:.2f}x apart)"
        plain = by_server.get("base", {}).get(level)
        if plain is not None:
            said.append(f"plain decode {plain:.2f}")
        lines.append(f"{indent}steady step without speculation at {level} running, ms: {'; '.join(said)}")
    return lines


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _check_line(name: str, report: Report) -> str:
    if name not in report:
        reason = report.get("skipped", {}).get(name, "not asked for")
        return f"{name:<12} {'skip':<6} {reason}"
    check = report[name]
    result = "PASS" if check.get("passed") else "FAIL"
    detail = "; ".join(check.get("problems", [])[:2]) or check.get("detail", "")
    return f"{name:<12} {result:<6} {detail}"[:110]


def summary(report: Report) -> str:
    """A plain-text table that fits one screen."""
    lines = []
    applied = report.get("dynspec_applied")
    lines.append(
        f"dynspec proof: SGLang {report.get('sglang_version')}, path {report.get('path')}, GPU {report.get('gpu')}"
    )
    if applied:
        flags = report.get("dynspec_flags")
        lines.append(f"dynspec applied: yes ({flags})" if flags else "dynspec applied: yes")
        revisions = report.get("dynspec_revisions") or {}
        if revisions:
            lines.append("dynspec revisions: " + ", ".join(f"{name} r{rev}" for name, rev in revisions.items()))
    else:
        lines.append("dynspec applied: no (only speculation off vs always on)")
    digests, paths = report.get("model_sha256"), report.get("model_paths")
    if paths:  # the user's own weights: no digests taken, the dirs say what ran
        lines.append(f"model: {report.get('model')} (target {paths['target']}, head {paths['head']})")
    elif digests:
        named = ", ".join(f"{part} {digest[:12]}" for part, digest in digests.items() if digest)
        lines.append(f"model: {report.get('model')} (sha256: {named or 'not recorded'})")
    for part in report.get("combined_from", []):  # dynspec proof --combine: the parts judged as one
        lines.append(f"part: {part}")
    lines.append("")
    lines.append(f"{'check':<12} {'result':<6} detail")
    lines += [_check_line(name, report) for name in CHECKS]

    eq = report.get("equivalence")
    if eq and eq.get("per_level"):
        cols = [c for c in ("base", "always_on", "dynspec", "dynspec_after_ramp") if eq.get("digests", {}).get(c)]
        lines.append("")
        lines.append(f"equivalence: output digests ({weights(eq.get('shape'))}, {eq.get('new_tokens')} new tokens)")
        lines.append(f"{'C':>5}  " + "  ".join(f"{c.replace('_', '-'):<18}" for c in cols) + "  dynspec state")
        for row in eq["per_level"]:
            cells = []
            for c in cols:
                d = row.get(c) or "-"
                mark = "*" if row.get(c) and row.get("base") and d != row["base"] else " "
                cells.append(f"{d + mark:<18}")
            lines.append(f"{row['C']:>5}  " + "  ".join(cells) + f"  {row.get('dynspec_state', '')}")
        if "base_repeat" in eq:
            again = (
                "gave the same tokens"
                if eq.get("base_repeatable")
                else "gave other tokens: nothing can be held to base's"
            )
            lines.append(f"    base, asked again: {again} ({', '.join(d or '-' for d in eq['base_repeat'])})")
        if "deterministic" in report:
            lines.append(f"    deterministic inference: {'on' if report['deterministic'] else 'off'}")

    tp = report.get("throughput")
    if tp and tp.get("levels"):
        lines.append("")
        sim = tp.get("simulate_acc_len")
        lines.append(
            f"throughput: tok/s ({weights(tp.get('shape'))}, {tp.get('new_tokens')} new tokens, "
            + (f"SGLANG_SIMULATE_ACC_LEN={sim:g})" if sim is not None else "the drafts' own acceptance)")
        )
        if tp.get("order"):
            lines.append(f"    order: {tp['order']}")
        upstream = tp.get("upstream_adaptive")
        no_overlap = tp.get("base_no_overlap")
        head = f"{'C':>5}  {'base':>9}  {'always-on':>9}  {'dynspec':>9}  {'R(C)':>6}"
        head += f"  {'adaptive':>9}  {'dyn/ad':>6}" if upstream else ""
        lines.append(head + (f"  {'base-noov':>9}  {'R-noov':>6}" if no_overlap else ""))
        n = len(tp["levels"])
        dyn = tp.get("dynspec") or [None] * n
        ratio = tp.get("envelope_ratio") or [None] * n
        over_up = tp.get("dynspec_over_upstream") or [None] * n
        ratio_no_overlap = tp.get("envelope_ratio_no_overlap") or [None] * n
        for i, c in enumerate(tp["levels"]):
            line = (
                f"{c:>5}  {_fmt(tp['base'][i]):>9}  {_fmt(tp['always_on'][i]):>9}  "
                f"{_fmt(dyn[i]):>9}  {_fmt(ratio[i], 2):>6}"
            )
            line += f"  {_fmt(upstream[i]):>9}  {_fmt(over_up[i], 2):>6}" if upstream else ""
            lines.append(
                line + (f"  {_fmt(no_overlap[i]):>9}  {_fmt(ratio_no_overlap[i], 2):>6}" if no_overlap else "")
            )
        where = tp.get("switch_point")
        if where:
            up_to, plain_from, estimate = (
                where["speculation_faster_up_to"], where["plain_faster_from"], where["crossover_estimate"]
            )  # fmt: skip
            if up_to is None:
                said = f"plain decode was faster from C={plain_from} on: speculation does not pay here"
            elif plain_from is None:
                said = f"always-on was faster at every level, up to C={up_to}: N at least {up_to}"
            else:
                said = (
                    f"always-on faster up to C={up_to}, plain decode from C={plain_from}: N in {up_to} - "
                    f"{plain_from - 1}, near {estimate} (linear between the two)"
                )
            lines.append(f"    switch point on this GPU and load: {said}")
        accepted = tp.get("accept_length") or {}
        if sim is None and accepted:
            lines.append("")
            lines.append(
                "acceptance length, accepted + 1 per verify (completion tokens / verifies of each level's requests):"
            )
            for mode in ("always_on", "dynspec"):
                if any(v is not None for v in accepted.get(mode) or []):
                    pairs = ", ".join(f"C={c} {_fmt(v, 2)}" for c, v in zip(tp["levels"], accepted[mode]))
                    lines.append(f"    {mode.replace('_', '-')}: {pairs}")
        per_step = describe(tp.get("per_step") or {})
        if per_step:
            lines.append("")
            lines.append("per decode step, speed / base's at the same batch and KV size (steady log intervals):")
            lines += [f"    {line}" for line in per_step]
        speculating = describe(tp.get("per_step_speculating") or {})
        if speculating:
            lines.append(
                "per speculative step, speed / always-on's at the same batch and KV size (steady log intervals):"
            )
            lines += [f"    {line}" for line in speculating]
        per_run = describe_runs(tp.get("per_run") or {})
        if per_run:
            lines.append("per run, the median steady tok/s of each (the warm-up first):")
            lines += [f"    {line}" for line in per_run]
        outside = describe_outside(tp.get("outside_steady_ms") or {})
        if outside:
            lines.append(
                "per timed run, the time beyond its tokens at its own steady speed (admission, first and last steps):"
            )
            lines += [f"    {line}" for line in outside]

    ml = report.get("mixed_load")
    if ml and ml.get("phases"):
        lines.append("")
        sec = ml.get("seconds", {})
        lines.append(
            f"mixed load: total s, median of {ml.get('repeats')}: base {_fmt(sec.get('base'), 2)}, always-on "
            f"{_fmt(sec.get('always_on'), 2)}, dynspec {_fmt(sec.get('dynspec'), 2)}"
        )
        if ml.get("order"):
            lines.append(f"    order: {ml['order']}")
        lines.append(
            f"    per-phase oracle {_fmt(ml.get('oracle_seconds'), 2)} "
            f"(dynspec / oracle {_fmt(ml.get('dynspec_over_oracle'), 3)})"
        )
        sums = ml.get("phase_median_sums") or {}
        if ml.get("dynspec_over_oracle_by_phase") is not None:
            lines.append(
                f"    sums of phase medians: base {_fmt(sums.get('base'), 2)}, always-on {_fmt(sums.get('always_on'), 2)}, "
                f"dynspec {_fmt(sums.get('dynspec'), 2)} ({_fmt(ml.get('dynspec_over_oracle_by_phase'), 3)}x the oracle; not the verdict)"
            )
        lines.append(f"{'C':>5}  {'base':>7}  {'always-on':>9}  {'dynspec':>7}  {'oracle':>7}")
        for row in ml["phases"]:
            lines.append(
                f"{row['C']:>5}  {_fmt(row.get('base_s'), 2):>7}  {_fmt(row.get('always_on_s'), 2):>9}  "
                f"{_fmt(row.get('dynspec_s'), 2):>7}  {_fmt(row.get('oracle_s'), 2):>7}"
            )
        for variant, v in (ml.get("variants") or {}).items():
            env = " ".join(f"{k}={val}" for k, val in v.get("env", {}).items())
            lines.append(
                f"    variant {variant} ({env}): {_fmt(v.get('seconds'), 2)} s, "
                f"{_fmt(v.get('over_dynspec'), 3)}x dynspec's, {_fmt(v.get('dynspec_over_oracle'), 3)}x the oracle"
            )

    auto = report.get("auto_threshold")
    if auto and auto.get("by_acceptance"):
        lines.append("")
        lines.append(
            f"auto threshold: mixed-load total s, median of {auto.get('repeats')}; fixed N in {auto.get('sweep')}"
        )
        lines.append(
            f"{'accept':>6}  {'auto':>7}  {'best N':>6}  {'its s':>7}  {'auto/N':>6}  {'base':>7}  {'always-on':>9}"
            f"  {'oracle':>7}  {'auto/oracle':>11}"
        )
        for a, e in auto["by_acceptance"].items():
            lines.append(
                f"{a:>6}  {_fmt(e.get('auto_s'), 2):>7}  {e.get('best_fixed_n', '-')!s:>6}  {_fmt(e.get('best_fixed_s'), 2):>7}  "
                f"{_fmt(e.get('auto_over_best_fixed'), 3):>6}  {_fmt(e.get('base_s'), 2):>7}  {_fmt(e.get('always_on_s'), 2):>9}"
                f"  {_fmt(e.get('oracle_s'), 2):>7}  {_fmt(e.get('auto_over_oracle'), 3):>11}"
            )
        for a, e in auto["by_acceptance"].items():
            for part in e.get("parts", []):  # a combined report: each part's own comparison
                lines.append(
                    f"    acceptance {a}, part {part['source']}: N in {part['sweep']}, auto {_fmt(part.get('auto_s'), 2)} s, "
                    f"best N={part.get('best_fixed_n', '-')} {_fmt(part.get('best_fixed_s'), 2)} s "
                    f"({_fmt(part.get('auto_over_best_fixed'), 3)}x)"
                    + (f"; auto's estimates moved N by more than 2x {part['swings']} times" if "swings" in part else "")
                )
                lines += _refill_lines(part.get("prefills_per_1000_tokens"), "      ")
                lines += _fallback_lines(part, "      ")
            said = e.get("auto_decisions")
            if said is not None:
                last = said["last_estimated"]
                where = (
                    f"off above {last['disable_above']}, on at or below {last['enable_at_or_below']} "
                    f"(acceptance {_fmt(last['acceptance'], 2)})"
                    if last
                    else "none"
                )
                swung = f", its estimates moved N by more than 2x {said['swings']} times" if "swings" in said else ""
                lines.append(
                    f"    auto at acceptance {a}: {said['count']} threshold changes{swung}; its last estimate: {where}"
                )
            phases = e.get("phase_medians", {})
            best = str(e.get("best_fixed_n"))
            if "auto" in phases and best in phases:
                apart = " ".join(f"{x - y:+.2f}" for x, y in zip(phases["auto"], phases[best]))
                lines.append(f"    auto - N={best} by phase, s, in the schedule's order: {apart}")
            lines += _refill_lines(e.get("prefills_per_1000_tokens"), "    ")
            lines += _fallback_lines(e, "    ")

    cached = {s["name"]: s[MIXED_CACHED] for s in report.get("servers", []) if MIXED_CACHED in s}
    if any(cached.values()):
        lines.append("")
        lines.append(
            "prompt tokens the mixed-load passes found in the prefix cache, by server (new prompts each pass: 0 expected):"
        )
        lines.append("    " + ", ".join(f"{name} {n}" for name, n in cached.items()))

    collections = {s["name"]: s[LONG_GC] for s in report.get("servers", []) if LONG_GC in s}
    if any(collections.values()):
        lines.append("")
        lines.append(
            "long garbage collections of SGLang's HTTP process while serving, by server (each holds back "
            "requests arriving and answers leaving; --freeze-gc after the warm-up keeps them out):"
        )
        for name, found in collections.items():
            said = ", ".join(f"{c['seconds']:.2f} s (generation {c['generation']}, line {c['line']})" for c in found)
            lines.append(f"    {name}: {said or 'none'}")

    lines.append("")
    if "out" in report or "combined_from" not in report:
        lines.append(f"logs and report in {report.get('out', '.')}")
    verdict_ok = verdict(report)
    lines.append(f"RESULT: {'PASS' if verdict_ok else 'FAIL'} (exit {0 if verdict_ok else 1})")
    return "\n".join(lines) + "\n"
