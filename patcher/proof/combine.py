"""``dynspec proof --combine``: one ``auto_threshold`` verdict from device calls that each ran part
of the sweep.

A whole sweep is nine servers (base, always-on, auto and six fixed N); an H100 holds three 8B ones
at a time and a device call about six, so the sweep runs in parts, each with its own base,
always-on and auto. Servers are compared only within their call. A part passes at an acceptance
when its auto is within ``max_ratio`` of every fixed N it ran and not slower than both static
servers, so parts that all pass put auto within ``max_ratio`` of the best N of the whole sweep.
The combined numbers are medians over the parts (an N run in two parts: the median of both), under
the issue's report keys; ``auto_over_best_fixed`` is the same-call ratio of the part that ran the
best N.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from patcher.proof.report import Report

# What every part must share to be one sweep: the same release, path, card and runtime, and the same
# load measured the same way. The weights (a dummy shape with simulated acceptances, or a real model
# at its own, labelled "real") need only be the same among the parts of one acceptance: the issue's
# report holds both kinds.
SAME_RUN = ("sglang_version", "path", "gpu", "dynspec_applied", "dynspec_revisions", "attention_backend")
SAME_LOAD = ("schedule", "repeats", "max_ratio")
SAME_WEIGHTS = ("model", "model_sha256")


class CombineError(ValueError):
    """Parts that cannot be one sweep; the message names the part and what differs."""


def combine(parts: Sequence[tuple[str, Report]], sweep: Sequence[int]) -> Report:
    """The report of ``parts`` (each a name and its report) as one run of ``sweep``: the shared run
    fields, ``combined_from`` and an ``auto_threshold`` entry judged over all of them."""
    if len(parts) < 2:
        raise CombineError("--combine needs the reports of two or more parts of one sweep")
    (first_name, first), *rest = parts
    for name, part in parts:
        _check_shape(name, part)
    for name, part in rest:
        for key in SAME_RUN:
            if part.get(key) != first.get(key):
                raise CombineError(f"{name}: {key} {part.get(key)!r} differs from {first_name}'s {first.get(key)!r}")
        for key in SAME_LOAD:
            ours, theirs = part["auto_threshold"].get(key), first["auto_threshold"].get(key)
            if ours != theirs:
                raise CombineError(f"{name}: auto_threshold {key} {ours!r} differs from {first_name}'s {theirs!r}")
    weights: dict[str, tuple[str, dict[str, Any]]] = {}  # by acceptance: the first part's name and weights
    for name, part in parts:
        ours = {key: part.get(key) for key in SAME_WEIGHTS}
        ours["shape"] = part["auto_threshold"].get("shape")
        for label in part["auto_threshold"]["by_acceptance"]:
            seen, theirs = weights.setdefault(label, (name, ours))
            for key, value in ours.items():
                if value != theirs[key]:
                    raise CombineError(
                        f"{name}: acceptance {label}'s {key} {value!r} differs from {seen}'s {theirs[key]!r}"
                    )
    entry = combine_entries([(name, part["auto_threshold"]) for name, part in parts], sweep)
    entry["weights"] = {label: w for label, (_, w) in weights.items()}
    out: Report = {key: first.get(key) for key in SAME_RUN}
    kinds = list(entry["weights"].values())
    if all(w == kinds[0] for w in kinds):  # one model throughout: named as a part names it
        out.update({key: first.get(key) for key in SAME_WEIGHTS})
        entry["shape"] = kinds[0]["shape"]
    out.update(
        dynspec_flags=first.get("dynspec_flags"),  # the dynspec server's flags, which auto's and each N's override
        combined_from=[name for name, _ in parts],
        checks=["auto_threshold"],
        auto_threshold=entry,
    )
    out["passed"] = entry["passed"]
    return out


def _check_shape(name: str, part: Report) -> None:
    """Refuse what mixed.judge_auto did not write: no entry, or rows without their numbers."""
    entry = part.get("auto_threshold")
    if not isinstance(entry, Mapping) or not isinstance(entry.get("by_acceptance"), Mapping):
        raise CombineError(f"{name}: no auto_threshold entry (a report of --checks auto_threshold)")
    if not isinstance(entry.get("max_ratio"), (int, float)):
        raise CombineError(f"{name}: auto_threshold has no max_ratio")
    for label, row in entry["by_acceptance"].items():
        numbers = [row.get(k) for k in ("auto_s", "base_s", "always_on_s")] if isinstance(row, Mapping) else []
        fixed = row.get("fixed_s") if isinstance(row, Mapping) else None
        if not isinstance(fixed, Mapping) or not all(
            v is None or isinstance(v, (int, float)) for v in [*numbers, *fixed.values()]
        ):
            raise CombineError(f"{name}: acceptance {label}'s row is not judge_auto's (numbers or fixed_s missing)")


def combine_entries(entries: Sequence[tuple[str, Mapping[str, Any]]], sweep: Sequence[int]) -> dict[str, Any]:
    """The combined ``auto_threshold`` entry of ``entries`` (each a part's name and entry, as
    mixed.judge_auto made it); every N of ``sweep`` must have run in some part."""
    first = entries[0][1]
    problems = [f"{name}: {p}" for name, entry in entries for p in entry.get("problems", [])]
    labels = list(dict.fromkeys(label for _, entry in entries for label in entry["by_acceptance"]))
    by_acceptance = {}
    for label in labels:
        rows = [(name, entry["by_acceptance"][label]) for name, entry in entries if label in entry["by_acceptance"]]
        by_acceptance[label] = _acceptance(label, rows, sweep, first["max_ratio"], problems)
    ran = sorted({int(n) for _, e in entries for row in e["by_acceptance"].values() for n in row["fixed_s"]})
    return {
        "passed": not problems,
        "by_acceptance": by_acceptance,
        "sweep": ran,
        "required_sweep": list(sweep),
        "max_ratio": first["max_ratio"],
        "repeats": first.get("repeats"),
        "schedule": first.get("schedule"),
        "problems": problems,
        "detail": "; ".join(
            f"acceptance {a}: auto {e['auto_s']:.2f} s, best N={e['best_fixed_n']} {e['best_fixed_s']:.2f} s "
            f"({e['auto_over_best_fixed']:.3f}x, {len(e['parts'])} parts)"
            for a, e in by_acceptance.items()
            if e.get("auto_over_best_fixed") is not None
        )
        or "incomplete",
    }


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def _acceptance(
    label: str,
    rows: Sequence[tuple[str, Mapping[str, Any]]],
    sweep: Sequence[int],
    max_ratio: float,
    problems: list[str],
) -> dict[str, Any]:
    """One acceptance over the parts that ran it; appends what fails to ``problems``."""
    parts = []
    fixed: dict[int, list[float]] = {}
    for name, row in rows:
        for n, seconds in row["fixed_s"].items():
            if seconds is not None:
                fixed.setdefault(int(n), []).append(seconds)
        ratio = row.get("auto_over_best_fixed")
        auto, base, always_on = row.get("auto_s"), row.get("base_s"), row.get("always_on_s")
        if ratio is None or auto is None or base is None or always_on is None:
            problems.append(f"acceptance {label}: {name} has no complete comparison")
        else:
            if ratio > max_ratio:
                problems.append(
                    f"acceptance {label}: {name}'s auto is {ratio:.3f}x its best fixed N (N={row['best_fixed_n']}; "
                    f"at most {max_ratio:g}x)"
                )
            if auto > base and auto > always_on:
                problems.append(f"acceptance {label}: {name}'s auto is slower than base and always-on")
        settled = (row.get("auto_decisions") or {}).get("last_estimated")
        parts.append(
            {
                "source": name,
                "sweep": sorted(int(n) for n in row["fixed_s"]),
                **{k: row.get(k) for k in ("auto_s", "best_fixed_n", "best_fixed_s", "auto_over_best_fixed")},
                **{k: row.get(k) for k in ("base_s", "always_on_s", "faster_than_both")},
                "settled": settled,
            }
        )
    missing = [n for n in sweep if n not in fixed]
    if missing:
        problems.append(f"acceptance {label}: N={', '.join(map(str, missing))} ran in no part")
    medians = {n: _median(v) for n, v in sorted(fixed.items())}
    entry: dict[str, Any] = {
        "auto_s": _median([row.get("auto_s") for _, row in rows]),
        "base_s": _median([row.get("base_s") for _, row in rows]),
        "always_on_s": _median([row.get("always_on_s") for _, row in rows]),
        "oracle_s": _median([row.get("oracle_s") for _, row in rows]),
        "fixed_s": {str(n): s for n, s in medians.items()},
    }
    if medians:
        best = min(medians, key=lambda n: (medians[n], n))
        # the same-call ratio: each part that ran the best N, its auto against that N (the worst of them)
        same_call = [
            row["auto_s"] / row["fixed_s"][str(best)]
            for _, row in rows
            if row.get("auto_s") is not None and row["fixed_s"].get(str(best))
        ]
        entry.update(
            best_fixed_n=best,
            best_fixed_s=medians[best],
            auto_over_best_fixed=round(max(same_call), 4) if same_call else None,
        )
    auto, oracle = entry["auto_s"], entry["oracle_s"]
    entry["auto_over_oracle"] = round(auto / oracle, 4) if auto is not None and oracle else None
    entry["faster_than_both"] = all(p["faster_than_both"] is True for p in parts)
    entry["parts"] = parts
    return entry
