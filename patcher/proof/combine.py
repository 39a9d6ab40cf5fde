"""``dynspec proof --combine``: one ``auto_threshold`` verdict from device calls that each ran part
of the sweep.

A whole sweep is nine servers (base, always-on, auto and six fixed N); an H100 holds three 8B ones
at a time and a device call about six, so the sweep runs in parts, each with its own base,
always-on and auto. Servers are compared only within their call (two starts of one server differ
by about 2 %: session 45). A part passes at an acceptance when its auto is within ``max_ratio`` of
every fixed N it ran and not slower than both static servers, so parts that all pass put auto
within ``max_ratio`` of the best N of the whole sweep. Each part's verdict is recomputed from its
times, not read from it. The best N is the one with the lowest median over the parts that ran it;
the combined row is the call that compared auto with it (where several did, the one where auto
fared worst), so its times and ratios come from one call. Medians over the parts stand beside.
"""

from __future__ import annotations

import math
import shlex
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from patcher.proof.mixed import best_fixed, slower_than_both, unmeasured
from patcher.proof.report import Report

# What every part must share to be one sweep: the same release, path, card, runtime and server
# settings, and the same load measured the same way. The weights (a dummy shape with simulated
# acceptances, or a real model at its own, labelled "real") and the servers' extra flags need only
# be the same among the parts of one acceptance: the report holds both kinds.
SAME_RUN = (
    "sglang_version",
    "path",
    "gpu",
    "dynspec_applied",
    "dynspec_revisions",
    "dynspec_env",
    "attention_backend",
    "tp",
    "deterministic",
    "switch_min_steps",
)
# The auto server's switch-on bound, as the part's command gave it (None: auto's floor). Not the
# report's ``enable_threshold``: without the option that is --threshold's, which no server of the
# sweep runs with (kv-auto passes 32, real-auto 8).
ENABLE_OPTION = "--enable-threshold"
SAME_LOAD = ("schedule", "repeats")
SAME_WEIGHTS = ("model", "model_sha256")
ROW_TIMES = ("auto_s", "base_s", "always_on_s", "oracle_s")


class CombineError(ValueError):
    """Parts that cannot be one sweep; the message names the part and what is wrong."""


def combine(parts: Sequence[tuple[str, Report]], sweep: Sequence[int], max_ratio: float) -> Report:
    """The report of ``parts`` (each a name and its report) as one run of ``sweep``, judged at
    ``max_ratio``: the shared run fields, ``combined_from`` and an ``auto_threshold`` entry."""
    if len(parts) < 2:
        raise CombineError("--combine needs the reports of two or more parts of one sweep")
    for name, part in parts:
        _check_part(name, part)
    (first_name, first), *rest = parts
    words = {name: command_words(name, part) for name, part in parts}
    enable = option_value(words[first_name], ENABLE_OPTION)
    if enable is not None and not (enable.isascii() and enable.isdigit() and int(enable) >= 1):
        raise CombineError(f"{first_name}: {ENABLE_OPTION} {enable!r} is not a batch size")
    started: dict[Any, str] = {first.get("started"): first_name}
    for name, part in rest:
        for key in SAME_RUN:
            if part.get(key) != first.get(key):
                raise CombineError(f"{name}: {key} {part.get(key)!r} differs from {first_name}'s {first.get(key)!r}")
        if (bound := option_value(words[name], ENABLE_OPTION)) != enable:
            raise CombineError(f"{name}: {ENABLE_OPTION} {bound!r} differs from {first_name}'s {enable!r}")
        for key in SAME_LOAD:
            ours, theirs = part["auto_threshold"].get(key), first["auto_threshold"].get(key)
            if ours != theirs:
                raise CombineError(f"{name}: auto_threshold {key} {ours!r} differs from {first_name}'s {theirs!r}")
        if part.get("started") is not None and part.get("started") in started:
            raise CombineError(f"{name}: the same run as {started[part['started']]} (started {part['started']})")
        started[part.get("started")] = name
    weights: dict[str, tuple[str, dict[str, Any]]] = {}  # by acceptance: the first part's name and weights
    for name, part in parts:
        ours = {key: part.get(key) for key in SAME_WEIGHTS}
        ours.update(shape=part["auto_threshold"].get("shape"), server_flags=server_flags(words[name]))
        for label in part["auto_threshold"]["by_acceptance"]:
            seen, theirs = weights.setdefault(label, (name, ours))
            for key, value in ours.items():
                if value != theirs[key]:
                    raise CombineError(
                        f"{name}: acceptance {label}'s {key} {value!r} differs from {seen}'s {theirs[key]!r}"
                    )
    entry = combine_entries([(name, part["auto_threshold"]) for name, part in parts], sweep, max_ratio)
    entry["weights"] = {label: w for label, (_, w) in weights.items()}
    out: Report = {key: first.get(key) for key in SAME_RUN}
    out["enable_threshold"] = None if enable is None else int(enable)
    kinds = list(entry["weights"].values())
    if all(w == kinds[0] for w in kinds):  # one model throughout: named as a part names it
        out.update({key: first.get(key) for key in SAME_WEIGHTS})
        entry["shape"] = kinds[0]["shape"]
    out.update(combined_from=[name for name, _ in parts], checks=["auto_threshold"], auto_threshold=entry)
    out["passed"] = entry["passed"]
    return out


def command_words(name: str, part: Report) -> list[str]:
    """The part's ``dynspec proof`` command line, split as the shell would."""
    if not isinstance(part.get("command"), str):  # what each part's servers were given is read from it
        raise CombineError(f"{name}: no dynspec proof command line (a combined report is not a part)")
    try:
        return shlex.split(part["command"])
    except ValueError as error:
        raise CombineError(f"{name}: its command line does not parse ({error})") from error


def option_value(words: Sequence[str], option: str) -> str | None:
    """The value ``option`` was last given in ``words``; None where it was not."""
    values = [words[i + 1] for i, w in enumerate(words[:-1]) if w == option]
    return values[-1] if values else None


def server_flags(words: Sequence[str]) -> dict[str, Any]:
    """What a part's command gave every server beyond the proof's own flags: --extra-args (split)
    and whether --freeze-gc froze their collectors."""
    extra = option_value(words, "--extra-args")
    return {"extra_args": shlex.split(extra) if extra else [], "freeze_gc": "--freeze-gc" in words}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_part(name: str, part: Any) -> None:
    """Refuse what mixed.judge_auto did not write, by name: a traceback here would hide which file."""
    if isinstance(part, Mapping) and "combined_from" in part:
        raise CombineError(f"{name}: a combined report, not a part: give the parts it was made from")
    entry = part.get("auto_threshold") if isinstance(part, Mapping) else None
    if not isinstance(entry, Mapping) or not isinstance(entry.get("by_acceptance"), Mapping):
        raise CombineError(f"{name}: no auto_threshold entry (a report of --checks auto_threshold)")
    problems = entry.get("problems", [])
    if not isinstance(problems, list) or not all(isinstance(p, str) for p in problems):
        raise CombineError(f"{name}: auto_threshold's problems are not a list of lines")
    for label, row in entry["by_acceptance"].items():
        bad = f"{name}: acceptance {label}'s row is not judge_auto's"
        if not isinstance(row, Mapping) or not isinstance(row.get("fixed_s"), Mapping):
            raise CombineError(f"{bad} (no fixed_s)")
        for key in ROW_TIMES:
            if row.get(key) is not None and not _number(row[key]):
                raise CombineError(f"{bad} ({key} {row[key]!r} is not a time)")
        for n, seconds in row["fixed_s"].items():
            if not (isinstance(n, str) and n.isdigit() and int(n) > 0) or not (seconds is None or _number(seconds)):
                raise CombineError(f"{bad} (fixed_s {n!r}: {seconds!r})")
        said = row.get("auto_decisions")
        if said is not None and not (
            isinstance(said, Mapping) and isinstance(said.get("last_estimated"), (Mapping, type(None)))
        ):
            raise CombineError(f"{bad} (auto_decisions {said!r})")


def combine_entries(
    entries: Sequence[tuple[str, Mapping[str, Any]]], sweep: Sequence[int], max_ratio: float
) -> dict[str, Any]:
    """The combined ``auto_threshold`` entry of ``entries`` (each a part's name and entry, as
    mixed.judge_auto made it); every N of ``sweep`` must have run in some part. A part's problems
    carry over, except those that only say it left servers unmeasured: what the join needs of them
    is checked here (an interrupted call's N that another part ran counts, session 48)."""
    first = entries[0][1]
    problems = [f"{name}: {p}" for name, entry in entries for p in entry.get("problems", []) if not unmeasured(p)]
    labels = list(dict.fromkeys(label for _, entry in entries for label in entry["by_acceptance"]))
    by_acceptance = {}
    for label in labels:
        rows = [(name, entry["by_acceptance"][label]) for name, entry in entries if label in entry["by_acceptance"]]
        by_acceptance[label] = _acceptance(label, rows, sweep, max_ratio, problems)
    ran = sorted({int(n) for _, e in entries for row in e["by_acceptance"].values() for n in row["fixed_s"]})
    return {
        "passed": not problems,
        "by_acceptance": by_acceptance,
        "sweep": ran,
        "required_sweep": list(sweep),
        "max_ratio": max_ratio,
        "repeats": first.get("repeats"),
        "schedule": first.get("schedule"),
        "problems": problems,
        "detail": "; ".join(
            f"acceptance {a}: auto {e['auto_s']:.2f} s, best N={e['best_fixed_n']} {e['best_fixed_s']:.2f} s "
            f"({e['auto_over_best_fixed']:.3f}x in one call of {len(e['parts'])} parts)"
            for a, e in by_acceptance.items()
            if e.get("auto_over_best_fixed") is not None
        )
        or "incomplete",
    }


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return round(numerator / denominator, 4) if numerator is not None and denominator else None


def _acceptance(
    label: str,
    rows: Sequence[tuple[str, Mapping[str, Any]]],
    sweep: Sequence[int],
    max_ratio: float,
    problems: list[str],
) -> dict[str, Any]:
    """One acceptance over the parts that ran it; appends what fails to ``problems``."""
    parts = []
    for name, row in rows:
        fixed = {int(n): s for n, s in row["fixed_s"].items() if s is not None}
        auto, base, always_on = (row.get(k) for k in ("auto_s", "base_s", "always_on_s"))
        best = best_fixed(fixed) if fixed else None
        part: dict[str, Any] = {"source": name, "sweep": sorted(int(n) for n in row["fixed_s"]), "fixed": fixed}
        if best is None or auto is None or base is None or always_on is None:
            problems.append(f"acceptance {label}: {name} has no complete comparison")
        else:
            ratio = auto / fixed[best]
            if ratio > max_ratio:
                problems.append(
                    f"acceptance {label}: {name}'s auto is {ratio:.3f}x its best fixed N (N={best}; "
                    f"at most {max_ratio:g}x)"
                )
            if slower_than_both(auto, base, always_on):
                problems.append(f"acceptance {label}: {name}'s auto is slower than base and always-on")
            part.update(best_fixed_n=best, best_fixed_s=fixed[best], auto_over_best_fixed=round(ratio, 4))
            part["faster_than_both"] = auto < min(base, always_on)
        part.update({k: row.get(k) for k in ROW_TIMES})
        decisions = row.get("auto_decisions") or {}
        part["settled"] = decisions.get("last_estimated")
        if "swings" in decisions:  # parts from session 47 on: how often auto's estimates moved N by > 2x
            part["swings"] = decisions["swings"]
        for reading in ("prefills_per_1000_tokens", "fallback_step_ms", "fallback_step_spread"):
            if reading in row:  # parts from session 49 (the refills) and 50 on (the steps)
                part[reading] = row[reading]
        parts.append(part)
    ran: dict[int, list[float]] = {}
    for part in parts:
        for n, seconds in part["fixed"].items():
            ran.setdefault(n, []).append(seconds)
    missing = [n for n in sweep if n not in ran]
    if missing:
        problems.append(f"acceptance {label}: N={', '.join(map(str, missing))} ran in no part")
    medians = {n: round(statistics.median(s), 3) for n, s in sorted(ran.items())}
    entry: dict[str, Any] = dict.fromkeys((*ROW_TIMES, "best_fixed_n", "best_fixed_s", "auto_over_best_fixed"))
    entry.update(fixed_s={str(n): s for n, s in medians.items()}, compared_in=None)
    if medians:
        best = best_fixed(medians)
        judged = [p for p in parts if best in p["fixed"] and p.get("auto_s") is not None]
        if judged:
            row = max(judged, key=lambda p: p["auto_s"] / p["fixed"][best])
            entry.update({k: row[k] for k in ROW_TIMES}, compared_in=row["source"])
            entry.update(best_fixed_n=best, best_fixed_s=row["fixed"][best])
            entry["auto_over_best_fixed"] = _ratio(row["auto_s"], row["fixed"][best])
    entry["auto_over_oracle"] = _ratio(entry["auto_s"], entry["oracle_s"])
    entry["faster_than_both"] = bool(parts) and all(p.get("faster_than_both") is True for p in parts)
    for key in ("auto_s", "base_s", "always_on_s"):  # beside the one call's: the medians over every part
        known = [p[key] for p in parts if p.get(key) is not None]
        entry[f"{key}_median"] = round(statistics.median(known), 3) if known else None
    for part in parts:
        part["fixed"] = {str(n): s for n, s in part["fixed"].items()}
    entry["parts"] = parts
    return entry
