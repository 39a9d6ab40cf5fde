"""What one decode step costs, from the servers' own ``Decode batch`` log lines.

A level's end-to-end tok/s mixes prefill, the iterations before a switch and the decode steps
themselves. To compare a fallback step with a plain decode step, SGLang's periodic log line is
the better instrument: every ``decode_log_interval`` iterations (40 unless set) it logs the
running requests, the tokens in the KV cache and the generation speed over the interval::

    Decode batch, #running-req: 64, #token: 8032, ..., gen throughput (token/s): 9703.35, ...

A line is *steady* when the line before it in the same log had the same number of running
requests and the token count grew by exactly ``running x interval``: nothing was admitted,
nothing finished, and every iteration added one token per request. That leaves out intervals
with a prefill in them and speculating intervals (which add more than one token per request),
so what is compared is plain decode against fallback (or zero-step) decode, at the same batch
size and about the same KV size.

``speculating=True`` reads the other half: a speculating interval is steady when the running
requests stayed and the token count grew by ``running x interval x`` the line's acceptance length
(above 1; within its two-decimal rounding), so every iteration verified. Its speed per step is the
line's tok/s over that acceptance length, which compares dynspec's speculating steps with
always-on's even where their acceptances differ (session 39: on FlashInfer dynspec's R(64) at
N = 96, where it speculated, read 0.94 one server after another, and its steps were the question).

``per_run`` keeps each run apart: a ``Prefill batch`` line starts one (a level's requests are
admitted, then decode), and a run's speed is the median of its steady intervals. Session 19 found a
small model's fallback runs bimodal that way (0.75 or 0.965 of base's, set at admission), which one
median over all runs hides.

``admissions`` reads every interval, steady or not, with the ``Prefill batch`` lines logged since
the line before: how many prefills a server ran per thousand tokens it generated, and its speed in
the intervals with a prefill against those without. Session 48 found that on real weights a
speculating server admits a closed loop's requests one by one (their accepted drafts differ, so
they finish apart) where a plain or fallback one admits them in waves: about six times the prefills
per token, each an eager prefill of a host-bound model. ``refills`` gives that count in each large
phase's band by mode, for every server of an auto sweep's report, and ``fallback_steps`` each
server's steady step without speculation at each large phase's concurrency.

``outside_steady`` sets each timed run's end-to-end time against the time its tokens would have
taken at that run's steady speed: what the run spent on admission, its first and last iterations
and the client, which no steady interval shows. Session 21 found R(C) under 0.97 at 64 and 128 on
0.5.12 with the steady steps at 0.98 - 0.99 of base's; this puts the rest in milliseconds per run.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

PREFILL_LINE = "Prefill batch"
DECODE_LINE = re.compile(r"Decode batch[.,] #running-req: (\d+), #token: (\d+),.*gen throughput \(token/s\): ([0-9.]+)")
ACCEPT_LEN = re.compile(r"accept len: ([0-9.]+)")
LOG_INTERVAL = re.compile(r"decode_log_interval=(\d+)")
DEFAULT_LOG_INTERVAL = 40  # SGLang's default --decode-log-interval


@dataclass(frozen=True)
class Step:
    running: int  # requests in the batch
    tokens: int  # tokens in the KV cache at the end of the interval
    tok_s: float  # generation speed over the interval
    accept: float = 1.0  # tokens a request gained per iteration (1 unless read as speculating)

    @property
    def steps_s(self) -> float:
        """The speed of the step itself: tok/s over the tokens a request gained per iteration."""
        return self.tok_s / self.accept


def log_interval(text: str) -> int:
    """The server's ``decode_log_interval``, from the ``server_args=`` line it logs at start."""
    m = LOG_INTERVAL.search(text)
    return int(m.group(1)) if m else DEFAULT_LOG_INTERVAL


def decode_lines(text: str) -> Iterator[tuple[int, str, re.Match[str]]]:
    """Each ``Decode batch`` line of a log with its match, after the number of ``Prefill batch``
    lines since the decode line before it."""
    prefills = 0
    for line in text.splitlines():
        if PREFILL_LINE in line:
            prefills += 1
            continue
        m = DECODE_LINE.search(line)
        if m:
            yield prefills, line, m
            prefills = 0


def steady_steps(text: str, speculating: bool = False) -> list[Step]:
    """The steady intervals of one server log (see the module docstring)."""
    return [step for _, step in steady_by_run(text, speculating)]


def steady_by_run(text: str, speculating: bool = False) -> Iterator[tuple[int, Step]]:
    """The steady intervals of one server log, each with the number of its run: the count of
    ``Prefill batch`` lines before it. ``speculating``: the speculating ones instead."""
    interval = log_interval(text)
    run = 0
    previous: Step | None = None
    for prefills, line, m in decode_lines(text):
        run += prefills
        accept = ACCEPT_LEN.search(line) if speculating else None
        step = Step(int(m.group(1)), int(m.group(2)), float(m.group(3)), float(accept.group(1)) if accept else 1.0)
        if previous is not None and previous.running == step.running:
            one_each = step.running * interval  # the growth at one token a request an iteration
            grew = step.tokens - previous.tokens
            if speculating:  # the logged acceptance is rounded to 0.01: its product may miss by that much
                steady = step.accept > 1 and abs(grew - one_each * step.accept) <= one_each * 0.005 + 1
            else:
                steady = grew == one_each
            if steady:
                yield run, step
        previous = step


@dataclass(frozen=True)
class Interval:
    """One ``Decode batch`` line, steady or not, with the prefills logged since the line before."""

    running: int
    tok_s: float
    accept: float  # the line's acceptance length; 1 where it logs none
    prefills: int

    @property
    def speculating(self) -> bool:
        """Whether the interval verified drafts (a zero-step server's lines say ``accept len: 1.00``)."""
        return self.accept > 1


def intervals(text: str) -> list[Interval]:
    """Every decode interval of one server log."""
    out = []
    for prefills, line, m in decode_lines(text):
        accept = ACCEPT_LEN.search(line)
        out.append(Interval(int(m.group(1)), float(m.group(3)), float(accept.group(1)) if accept else 1.0, prefills))
    return out


def admissions(text: str, low: int, high: int, speculating: bool) -> dict[str, Any] | None:
    """The intervals of one mode with ``low`` to ``high`` running requests: how many, the prefills
    per 1000 generated tokens, the median speed of those with a prefill and of those without
    (None where there are none), and the speed over them all, their tokens over their time
    (``tok_s``: what the mode made there, refills included; an interval's tokens are counted as its
    line's running requests times the log interval times its acceptance, exact where the batch kept its
    size, an estimate where it changed between two lines). None where the mode has no interval
    there. An interval with a prefill may also hold the idle gap between two of the client's passes
    (a pass starts with one), so its speed says most where prefills are many, as while speculating
    on real weights."""
    chosen = [i for i in intervals(text) if low <= i.running <= high and i.speculating == speculating]
    if not chosen:
        return None
    interval = log_interval(text)
    made = [interval * i.running * i.accept for i in chosen]  # each interval's tokens
    tokens = sum(made)

    def median_tok_s(group: list[Interval]) -> float | None:
        return round(statistics.median(i.tok_s for i in group)) if group else None

    seconds = sum(m / i.tok_s for m, i in zip(made, chosen) if i.tok_s > 0)
    return {
        "intervals": len(chosen),
        "prefills_per_1000_tokens": round(1000 * sum(i.prefills for i in chosen) / tokens, 3),
        "tok_s": round(tokens / seconds) if seconds else None,
        "tok_s_with_prefills": median_tok_s([i for i in chosen if i.prefills]),
        "tok_s_without": median_tok_s([i for i in chosen if not i.prefills]),
    }


def large_phases(phases: Sequence[int]) -> list[int]:
    """The distinct concurrencies of a closed loop's ``phases`` that an auto sweep's readings compare:
    16 and up, since below 16 every fixed N of the sweep speculates."""
    return sorted({p for p in phases if p >= 16})


def refills(text: str, phases: Sequence[int]) -> dict[str, dict[str, float]]:
    """``admissions``' prefills per 1000 generated tokens, by mode (``speculating``, ``not_speculating``),
    in the band of running requests each large phase of a closed loop fills: for each distinct
    concurrency C of ``large_phases``, C / 2 + 1 to C ("33-64"). A band or mode the log has no
    interval of is left out."""
    out: dict[str, dict[str, float]] = {}
    for c in large_phases(phases):
        low = c // 2 + 1
        band = {}
        for mode, speculating in (("speculating", True), ("not_speculating", False)):
            reading = admissions(text, low, c, speculating)
            if reading is not None:
                band[mode] = reading["prefills_per_1000_tokens"]
        if band:
            out[f"{low}-{c}"] = band
    return out


def fallback_steps(text: str, phases: Sequence[int]) -> dict[str, float]:
    """The median steady step without speculation, in ms, at each concurrency C of ``large_phases``,
    where a closed loop's phase holds its batch at C ("64"); a level with fewer than three steady
    steps is left out. In an auto sweep every dynspec server runs the same fallback code there, so
    how far apart their steps lie is how far apart the servers' hosts ran: up to 30 % on a
    host-bound 135M target, within 1.3 % on the 8B shape (session 50)."""
    steady = steady_steps(text)
    out: dict[str, float] = {}
    for c in large_phases(phases):
        ms = [1000 * c / step.tok_s for step in steady if step.running == c and step.tok_s > 0]
        if len(ms) >= 3:
            out[str(c)] = round(statistics.median(ms), 3)
    return out


def paired_ratios(steps: Iterable[Step], base: Sequence[Step], running: int, interval: int) -> list[float]:
    """``steps`` / ``base`` speed per step at ``running`` requests, each step against the base step
    with the nearest KV size, if it is within half an interval's growth."""
    tolerance = running * interval / 2
    candidates = [b for b in base if b.running == running and b.tok_s > 0]
    ratios = []
    for step in steps:
        if step.running != running or not candidates:
            continue
        nearest = min(candidates, key=lambda b: abs(b.tokens - step.tokens))
        if abs(nearest.tokens - step.tokens) <= tolerance:
            ratios.append(step.steps_s / nearest.steps_s)
    return ratios


def per_step(
    logs: dict[str, str], base: str, levels: Sequence[int], speculating: bool = False
) -> dict[str, dict[str, Any]]:
    """For each server other than ``base`` that has any: at each level with steady intervals in both
    logs, how many pairs there were and the min / median / max of the speed ratio to ``base``
    (``speculating``: of the speculating intervals, per step)."""
    if base not in logs:
        return {}
    interval = log_interval(logs[base])
    base_steps = steady_steps(logs[base], speculating)
    out: dict[str, dict[str, Any]] = {}
    for name, text in logs.items():
        if name == base:
            continue
        steps = steady_steps(text, speculating)
        by_level = {}
        for c in levels:
            ratios = paired_ratios(steps, base_steps, c, interval)
            if ratios:
                by_level[str(c)] = {
                    "pairs": len(ratios),
                    "min": round(min(ratios), 3),
                    "median": round(statistics.median(ratios), 3),
                    "max": round(max(ratios), 3),
                }
        if by_level:
            out[name] = by_level
    return out


def per_run(logs: dict[str, str], levels: Sequence[int]) -> dict[str, dict[str, list[int]]]:
    """For each server: at each level, the median steady speed of every run that had steady
    intervals there, in the log's order (the warm-up first)."""
    out: dict[str, dict[str, list[int]]] = {}
    for name, text in logs.items():
        runs: dict[tuple[int, int], list[float]] = {}  # (running, run) -> its steady speeds
        for run, step in steady_by_run(text):
            runs.setdefault((step.running, run), []).append(step.tok_s)
        by_level = {
            str(c): [round(statistics.median(speeds)) for (running, _), speeds in runs.items() if running == c]
            for c in levels
        }
        if any(by_level.values()):
            out[name] = {c: speeds for c, speeds in by_level.items() if speeds}
    return out


def outside_steady(
    per_server: dict[str, dict[str, list[int]]],
    samples: dict[str, list[list[float]]],
    levels: Sequence[int],
    new_tokens: int,
    warmup: bool = True,
) -> dict[str, dict[str, list[int]]]:
    """For each server in both ``per_run`` and the throughput ``samples`` (each level's timed runs'
    end-to-end tok/s): at each level, per timed run, the milliseconds it took beyond its tokens at its
    own steady speed. Only where every run had steady intervals (``per_run`` holds the warm-up, if
    there was one, and then one speed per timed run), so that each speed is the same run's; a
    speculating level has none."""
    skip = 1 if warmup else 0
    out: dict[str, dict[str, list[int]]] = {}
    for name, by_level in per_server.items():
        runs = samples.get(name) or []
        found: dict[str, list[int]] = {}
        for index, c in enumerate(levels):
            speeds, timed = by_level.get(str(c), [])[skip:], runs[index] if index < len(runs) else []
            if not timed or len(speeds) != len(timed) or not all(t and v for t, v in zip(timed, speeds)):
                continue
            tokens = c * new_tokens
            found[str(c)] = [round((tokens / t - tokens / v) * 1000) for t, v in zip(timed, speeds)]
        if found:
            out[name] = found
    return out


def describe_outside(per_server: dict[str, dict[str, list[int]]]) -> list[str]:
    """One line per server, e.g. ``dynspec: C=64 125 161 173 ms``."""
    return [
        f"{name}: " + "; ".join(f"C={c} " + " ".join(str(v) for v in ms) + " ms" for c, ms in by_level.items())
        for name, by_level in per_server.items()
    ]


def describe_runs(per_server: dict[str, dict[str, list[int]]]) -> list[str]:
    """One line per server, e.g. ``dynspec: C=32 11892 9237 11903 9169``."""
    return [
        f"{name}: " + "; ".join(f"C={c} " + " ".join(f"{v:g}" for v in speeds) for c, speeds in by_level.items())
        for name, by_level in per_server.items()
    ]


def describe(per_server: dict[str, dict[str, Any]]) -> list[str]:
    """One summary line per server, e.g. ``dynspec: C=64 0.83-0.88 (median 0.86, 14 pairs)``."""

    def cell(level: str, r: dict[str, Any]) -> str:
        return f"C={level} {r['min']:.2f}-{r['max']:.2f} (median {r['median']:.2f}, {r['pairs']} pairs)"

    return [f"{name}: " + "; ".join(cell(c, r) for c, r in by_level.items()) for name, by_level in per_server.items()]
