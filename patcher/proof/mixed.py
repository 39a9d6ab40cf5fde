"""The ``mixed_load`` check: a load whose concurrency rises and falls, as a day of traffic does.

Each phase keeps ``C`` requests in flight (a closed loop) until ``per_phase * C`` have been
answered; phases follow each other without a pause. Every server gets the same phases with the
same prompts (numbered from ``FIRST_PROMPT`` on, in order: the "seed" is that numbering), and
each pass new ones: the warm-up sends prompt set 0 and timed pass j set j, on every server, warmed
up or not. A pass that repeated an earlier one's prompts would find them in the prefix cache of a
server whose KV pool outlasts a pass (session 36: two dummy 8B servers started side by side get
129024 slots where three get 24576 – 40960; a pass fills about 100k), and time its prefills as
nearly free where the others pay them. (A real model's prepared prompts, fewer than a pass, repeat
within and across passes; its servers all get one pool size, so each finds the same cached.) The
oracle is, phase by phase, the faster of speculation off (base) and always on: what a perfect
switch made per phase would take. The check passes when dynspec's total time is at most
``max_ratio`` times the oracle's and below both static servers'.
"""

from __future__ import annotations

import itertools
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from patcher.proof.client import Client, LevelResult, Request, run_requests, take_turns
from patcher.proof.logscan import AutoDecision

FIRST_PROMPT = 300_000
# An auto sweep's lines for servers it did not measure: a call stopped before them, or none of a
# server's passes complete. ``--combine`` leaves them out of a part (``unmeasured``), since it checks
# itself that every N ran in some part and that each part compared auto with base and always-on.
INTERRUPTED = "interrupted after {} of {} servers were measured"
NO_COMPLETE_PASS = "no complete pass on "
DEFAULT_PHASES = (1, 4, 16, 64, 128, 64, 16, 4, 1)


@dataclass(frozen=True)
class Schedule:
    phases: tuple[int, ...]
    per_phase: int  # requests per phase = per_phase * C
    new_tokens: int
    # With it, each request's output length is drawn from new_tokens .. this by its prompt, alike on
    # every server: outputs that end apart, as real traffic's do, where equal ones end a wave together.
    new_tokens_max: int | None = None

    def tokens_of(self, index: int) -> int:
        """The output length of the request with prompt ``index``."""
        if self.new_tokens_max is None:
            return self.new_tokens
        return random.Random(index).randint(self.new_tokens, self.new_tokens_max)

    @property
    def prompts_per_pass(self) -> int:
        return self.per_phase * sum(self.phases)

    def requests(self, pass_index: int = 0) -> list[list[Request]]:
        """Pass ``pass_index``'s requests, phase by phase (prompts no other pass of the schedule sends)."""
        out, index = [], FIRST_PROMPT + pass_index * self.prompts_per_pass
        for c in self.phases:
            out.append([Request(index + k, self.tokens_of(index + k)) for k in range(self.per_phase * c)])
            index += self.per_phase * c
        return out

    def describe(self) -> dict[str, Any]:
        described = {
            "phases": list(self.phases),
            "requests_per_phase": [self.per_phase * c for c in self.phases],
            "new_tokens": self.new_tokens,
            "first_prompt": FIRST_PROMPT,
            "prompts_per_pass": self.prompts_per_pass,  # warm-up 0, timed pass j: first_prompt + j * this on
            "closed_loop": True,
        }
        if self.new_tokens_max is not None:
            described["new_tokens_max"] = self.new_tokens_max
        return described


@dataclass
class Run:
    """One pass of the schedule on one server: each phase's result."""

    phases: list[LevelResult]

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)

    @property
    def failures(self) -> list[str]:
        return [f"phase {i} (C={p.concurrency}): {f}" for i, p in enumerate(self.phases) for f in p.failures]


def run_once(client: Client, schedule: Schedule, pass_index: int = 0) -> Run:
    return Run([run_requests(client, reqs, c) for c, reqs in zip(schedule.phases, schedule.requests(pass_index))])


def measure(client: Client, schedule: Schedule, repeats: int, warmup: bool) -> list[Run]:
    """``repeats`` timed passes, after an untimed one if asked; stops at the first failing pass."""
    return measure_together({"": client}, schedule, repeats, warmup)[""]


def measure_together(
    clients: Mapping[str, Client], schedule: Schedule, repeats: int, warmup: bool
) -> dict[str, list[Run]]:
    """``measure`` on several servers that are up at once, taking turns (``take_turns``: every pass
    goes to each server in turn, the order rotated each pass). The warm-up sends prompt set 0 and
    timed pass j set j: a server measured without a warm-up (throughput warmed it) times the same
    prompts as one measured with it. A second call on the same server would send set 0 again."""

    def passes(client: Client) -> Callable[[], Run]:
        numbers = itertools.count(0 if warmup else 1)
        return lambda: run_once(client, schedule, next(numbers))

    return take_turns({name: passes(client) for name, client in clients.items()}, warmup=warmup, repeats=repeats)


def complete_passes(name: str, passes: Sequence[Run], phases: int, problems: list[str]) -> list[Run]:
    """The passes that ran every phase without a failure; each pass's first failures go to ``problems``."""
    for run in passes:
        problems += [f"{name}: {f}" for f in run.failures[:3]]
    return [r for r in passes if not r.failures and len(r.phases) == phases]


def phase_medians(good: Sequence[Run], phases: int) -> list[float]:
    """Per phase, the median of ``good`` passes' times."""
    return [round(statistics.median(r.phases[i].seconds for r in good), 3) for i in range(phases)]


def oracle_phases(base: Sequence[float], always_on: Sequence[float]) -> list[float]:
    """The oracle, which no pass runs: phase by phase, the faster static server's median."""
    return [min(b, a) for b, a in zip(base, always_on)]


def judge(
    schedule: Schedule,
    runs: Mapping[str, Sequence[Run]],
    max_ratio: float,
    problems: list[str],
) -> dict[str, Any]:
    """The report entry; ``runs`` is keyed ``base``, ``always_on``, ``dynspec``. Per phase and in
    total, a server's time is the median over its passes; the verdict reads the totals.

    The oracle, which no pass runs, is a sum of per-phase medians, and so is each server's
    ``phase_median_sums`` entry, reported beside the verdict for a like-for-like reading
    (``dynspec_over_oracle_by_phase``): a pass whose one phase ran slow counts whole in a median
    of totals and not at all in a sum of medians."""
    n = len(schedule.phases)
    phase_s: dict[str, list[float]] = {}
    total_s: dict[str, float] = {}
    samples: dict[str, list[float]] = {}
    for name, passes in runs.items():
        good = complete_passes(name, passes, n, problems)
        if not good:
            continue
        phase_s[name] = phase_medians(good, n)
        total_s[name] = round(statistics.median(r.seconds for r in good), 3)
        samples[name] = [round(r.seconds, 3) for r in good]
    missing = [m for m in ("base", "always_on", "dynspec") if m not in total_s]
    if missing:
        problems.append(f"no complete pass of the load on {', '.join(missing)}")
    oracle = None
    phases: list[dict[str, Any]] = []
    if "base" in phase_s and "always_on" in phase_s:
        best = oracle_phases(phase_s["base"], phase_s["always_on"])
        oracle = round(sum(best), 3)
        for i, c in enumerate(schedule.phases):
            row: dict[str, Any] = {"C": c, "requests": schedule.per_phase * c, "oracle_s": best[i]}
            row.update({f"{name}_s": s[i] for name, s in phase_s.items()})
            row["faster_static"] = "base" if phase_s["base"][i] <= phase_s["always_on"][i] else "always_on"
            phases.append(row)
    dyn = total_s.get("dynspec")
    ratio = round(dyn / oracle, 4) if dyn is not None and oracle else None
    phase_sums = {name: round(sum(s), 3) for name, s in phase_s.items()}
    by_phase = round(phase_sums["dynspec"] / oracle, 4) if "dynspec" in phase_sums and oracle else None
    if dyn is not None and ratio is not None and not missing:
        if ratio > max_ratio:
            problems.append(
                f"dynspec took {dyn:.2f} s, {ratio:.3f}x the oracle's {oracle:.2f} s (at most {max_ratio:g}x)"
            )
        slower = [m for m in ("base", "always_on") if dyn >= total_s[m]]
        if slower:
            problems.append(
                "dynspec is not faster than "
                + " and ".join(f"{m} ({total_s[m]:.2f} s)" for m in slower)
                + f": {dyn:.2f} s"
            )
    return {
        "passed": not problems,
        "seconds": {m: total_s.get(m) for m in ("base", "always_on", "dynspec")},
        "oracle_seconds": oracle,
        "dynspec_over_oracle": ratio,
        "phase_median_sums": phase_sums,
        "dynspec_over_oracle_by_phase": by_phase,
        "max_ratio": max_ratio,
        "phases": phases,
        "samples": samples,
        "schedule": schedule.describe(),
        "problems": problems,
        "detail": (
            f"dynspec {dyn:.2f} s, oracle {oracle:.2f} s ({ratio:.3f}x), base {total_s['base']:.2f} s, "
            f"always-on {total_s['always_on']:.2f} s"
            if ratio is not None and not missing
            else "incomplete"
        ),
    }


def best_fixed(fixed: Mapping[int, float]) -> int:
    """The fixed N with the least time (the smaller N on a tie): what auto is held against."""
    return min(fixed, key=lambda n: (fixed[n], n))


def slower_than_both(auto: float, base: float, always_on: float) -> bool:
    """auto_threshold's other rule: auto may trail one static server, never both."""
    return auto > base and auto > always_on


def spread(step_ms: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """By concurrency, max / min of the dynspec servers' steps (auto's and each fixed N's; base and
    always-on run other code), where two or more have one."""
    dynspec = [levels for name, levels in step_ms.items() if name not in ("base", "always_on")]
    out = {}
    for level in sorted({lv for levels in dynspec for lv in levels}, key=int):
        ms = [levels[level] for levels in dynspec if level in levels]
        if len(ms) >= 2:
            out[level] = round(max(ms) / min(ms), 3)
    return out


def judge_auto(
    runs: Mapping[str, Sequence[Run]],
    schedule: Schedule,
    acceptances: Sequence[str],
    sweep: Sequence[int],
    max_ratio: float,
    decisions: Mapping[str, Sequence[AutoDecision]] | None = None,
    refills: Mapping[str, Mapping[str, Any]] | None = None,
    fallback_steps: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[str, Any]:
    """The ``auto_threshold`` report entry. ``runs`` is keyed ``base`` (one server: it does not
    speculate, so acceptance does not touch it) and, per acceptance label ``a`` (a simulated
    acceptance as ``3``, or ``real``), ``always_on@a``, ``auto@a`` and ``n@a`` for each fixed N of ``sweep``. At each acceptance auto's median total
    must be at most ``max_ratio`` x the best fixed N's, and not slower than both static servers.
    Reported beside, not judged: whether it beat both (``faster_than_both``), how it stands to the
    per-phase oracle of base and always-on (``oracle_s``, ``auto_over_oracle``: mixed_load's), and
    where auto put N (``auto_decisions``, from its server's log, by acceptance label), which says why,
    and each server's complete passes (``samples``) and phase medians (``phase_medians``), which say
    where auto gained or lost against the others; with ``refills`` (``steps.refills`` of each server's
    log, keyed as ``runs``), each server's prefills per 1000 tokens by mode in the large phases
    (``prefills_per_1000_tokens``), which say whether speculation refilled the loop a prefill at a
    time (session 48, real weights); with ``fallback_steps`` (``steps.fallback_steps``, keyed alike),
    each server's steady step without speculation by concurrency (``fallback_step_ms``) and, where two
    or more dynspec servers have one, how far apart theirs lie (``fallback_step_spread``, max / min):
    the same code, so the spread is the servers' hosts, the floor under any comparison of their
    totals (session 50: 1.30 on real weights)."""
    n = len(schedule.phases)
    problems: list[str] = []
    phase_s: dict[str, list[float]] = {}
    pass_s: dict[str, list[float]] = {}

    def total(key: str) -> float | None:
        good = complete_passes(key, runs.get(key, []), n, problems)
        if not good:
            return None
        phase_s[key] = phase_medians(good, n)
        pass_s[key] = [round(r.seconds, 3) for r in good]
        return round(statistics.median(r.seconds for r in good), 3)

    base = total("base")
    by_acceptance: dict[str, dict[str, Any]] = {}
    for label in acceptances:
        fixed = {size: total(f"{size}@{label}") for size in sweep}
        auto, always_on = total(f"auto@{label}"), total(f"always_on@{label}")
        measured = {size: s for size, s in fixed.items() if s is not None}
        missing = [k for k, v in (("auto", auto), ("always-on", always_on), ("base", base)) if v is None]
        missing += [f"N={size}" for size, s in fixed.items() if s is None]
        entry: dict[str, Any] = {
            "auto_s": auto,
            "base_s": base,
            "always_on_s": always_on,
            "fixed_s": {str(k): v for k, v in fixed.items()},
        }
        if measured:
            best_n = best_fixed(measured)
            entry.update(best_fixed_n=best_n, best_fixed_s=measured[best_n])
        if "base" in phase_s and f"always_on@{label}" in phase_s:
            oracle = round(sum(oracle_phases(phase_s["base"], phase_s[f"always_on@{label}"])), 3)
            entry.update(
                oracle_s=oracle, auto_over_oracle=round(auto / oracle, 4) if auto is not None and oracle else None
            )
        if missing:
            problems.append(f"acceptance {label}: {NO_COMPLETE_PASS}{', '.join(missing)}")
        elif auto is not None and base is not None and always_on is not None:
            ratio = round(auto / entry["best_fixed_s"], 4)
            entry.update(auto_over_best_fixed=ratio, faster_than_both=auto < min(base, always_on))
            if ratio > max_ratio:
                problems.append(
                    f"acceptance {label}: auto took {auto:.2f} s, {ratio:.3f}x the best fixed N's "
                    f"(N={entry['best_fixed_n']}, {entry['best_fixed_s']:.2f} s; at most {max_ratio:g}x)"
                )
            if slower_than_both(auto, base, always_on):
                problems.append(
                    f"acceptance {label}: auto ({auto:.2f} s) is slower than base ({base:.2f}) and always-on ({always_on:.2f})"
                )
        if decisions is not None:
            entry["auto_decisions"] = decided(decisions.get(label, ()))
        names = {"base": "base", f"always_on@{label}": "always_on", f"auto@{label}": "auto"}
        names.update({f"{size}@{label}": str(size) for size in sweep})
        entry["samples"] = {name: pass_s[key] for key, name in names.items() if key in pass_s}
        entry["phase_medians"] = {name: phase_s[key] for key, name in names.items() if key in phase_s}
        if refills is not None:
            entry["prefills_per_1000_tokens"] = {name: refills[key] for key, name in names.items() if key in refills}
        if fallback_steps is not None:
            entry["fallback_step_ms"] = {
                name: dict(fallback_steps[key]) for key, name in names.items() if key in fallback_steps
            }
            entry["fallback_step_spread"] = spread(entry["fallback_step_ms"])
        by_acceptance[label] = entry
    return {
        "passed": not problems,
        "by_acceptance": by_acceptance,
        "sweep": list(sweep),
        "max_ratio": max_ratio,
        "schedule": schedule.describe(),
        "problems": problems,
        "detail": "; ".join(
            f"acceptance {a}: auto {e['auto_s']:.2f} s, best N={e['best_fixed_n']} {e['best_fixed_s']:.2f} s ({e['auto_over_best_fixed']:.3f}x)"
            for a, e in by_acceptance.items()
            if "auto_over_best_fixed" in e
        )
        or "incomplete",
    }


def unmeasured(problem: str) -> bool:
    """Whether an auto sweep's problem line only says that servers went unmeasured."""
    said = problem.partition(": ")[2] if problem.startswith("acceptance ") else problem
    return said.startswith(NO_COMPLETE_PASS) or said.startswith(INTERRUPTED.split("{", 1)[0])


def decided(decisions: Sequence[AutoDecision]) -> dict[str, Any]:
    """How often auto changed its thresholds, and the last change, and the last one made from its
    estimates (not a probe): where it settled (None where it never estimated); ``swings``: how often
    its estimates moved the switch-off bound by more than 2 x (session 47: 26 in 81 on real weights)."""

    estimated = [d for d in decisions if d.reason == "estimated"]
    return {
        "count": len(decisions),
        "estimated": len(estimated),
        "swings": swings([d.disable_above for d in estimated]),
        "last": asdict(decisions[-1]) if decisions else None,
        "last_estimated": asdict(estimated[-1]) if estimated else None,
    }


def swings(bounds: Sequence[int]) -> int:
    """How often a sequence of switch-off bounds moves by more than a factor of two from one to the next."""
    return sum(max(a, b) > 2 * min(a, b) for a, b in zip(bounds, bounds[1:]))
