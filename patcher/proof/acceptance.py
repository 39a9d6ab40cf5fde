"""The ``acceptance`` check: after speculation comes back on, does the draft accept as if it had never been off?

It reads the same recordings as ``exact_kv`` (``DYNSPEC_RECORD_DRAFTS``), from the same load, on
four dynspec servers: the fallback under test (``DYNSPEC_DRAFT_KV`` as the caller set it, else the
KV-only extend), the full extend (today's reference), skip (no extend while off: the negative
control) and one whose threshold is above anything the load reaches, so it never turns
speculation off: always on, with its drafts recorded (a stock always-on server records nothing).

A recorded speculative iteration carries each request's ``seq_lens`` entry; the next one of the
same request is that plus the tokens the verify accepted plus one. So over consecutive speculative
iterations, ``(last position - first position) / iterations`` is the acceptance length (accepted + 1
per verify) without reading a single draft token. Per request it is taken from the first
speculative iteration after the request's last fallback iteration on the server under test, on
every server over the same positions, so the four numbers cover the same text.

Passes when the server under test reaches ``min_ratio`` x always-on (the issue's rule). Whether
the control fell below that is reported (``control_drops``), not judged: session 16 found that a
one-layer EAGLE-3 head barely reads its own K/V over past positions (the target's captured hidden
states carry the context: offline, zeroing 32 - 96 positions of a span cost it under 0.5 %, and the
GPU control lost 0.7 %), so no load gives the control teeth with such a head. What keeps the draft
KV exact is proven by ``exact_kv`` on dummy weights; this check says whether acceptance after a
switch back on is what it would have been. Real weights and real prompts only: on dummy weights
every draft is rejected.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patcher.proof.exactkv import FALL_BACK, RESUME, RID_PREFIX, SPECULATE, recorded_lines

MIN_RATIO = 0.99
MIN_ALWAYS_ON = 1.1  # below this the drafts are all but rejected (dummy weights): nothing to compare
NEVER_OFF = "never_off"  # the always-on reference's variant name


@dataclass
class Trace:
    """Per request, in order: positions of speculative iterations and of fallback (or resume) ones."""

    speculate: dict[str, list[int]] = field(default_factory=dict)
    off: dict[str, list[int]] = field(default_factory=dict)
    bad_lines: int = 0


def parse(lines: Iterable[str], prefix: str = RID_PREFIX) -> Trace:
    """The positions of a ``DYNSPEC_RECORD_DRAFTS`` file (read as exact_kv reads it)."""
    trace = Trace()
    for read_line in recorded_lines(lines):
        if read_line is None:
            trace.bad_lines += 1
            continue
        step, rows = read_line
        for rid, pos, _ in rows:
            if not rid.startswith(prefix):
                continue
            if step == SPECULATE:
                trace.speculate.setdefault(rid, []).append(pos)
            elif step in (FALL_BACK, RESUME):
                trace.off.setdefault(rid, []).append(pos)
    return trace


def read(path: Path) -> Trace:
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            return parse(f)
    except FileNotFoundError:
        return Trace()


def resumed_from(trace: Trace) -> dict[str, int]:
    """Per request that went through a fallback span: the position from which it speculated again."""
    out = {}
    for rid, off in trace.off.items():
        last = max(off)
        after = [p for p in trace.speculate.get(rid, []) if p > last]
        if after:
            out[rid] = min(after)
    return out


@dataclass(frozen=True)
class Window:
    tokens: int = 0
    verifies: int = 0

    @property
    def length(self) -> float | None:
        return round(self.tokens / self.verifies, 4) if self.verifies else None


def window(trace: Trace, starts: Mapping[str, int]) -> Window:
    """Tokens and verifies over consecutive speculative iterations from ``starts[rid]`` on, past the
    request's own last fallback iteration in ``trace`` (a span of fallback in between would count its
    tokens as accepted)."""
    tokens = verifies = 0
    for rid, start in starts.items():
        last_off = max(trace.off.get(rid, [-1]))
        positions = sorted(p for p in trace.speculate.get(rid, []) if p >= start and p > last_off)
        if len(positions) >= 2:  # the last one has no successor: its accepted tokens are unknown
            tokens += positions[-1] - positions[0]
            verifies += len(positions) - 1
    return Window(tokens, verifies)


def judge(traces: Mapping[str, Trace], min_verifies: int, problems: list[str], min_ratio: float = MIN_RATIO) -> dict[str, Any]:
    """The report entry; ``traces`` are keyed ``kv`` (the server under test), ``full``, ``skip``, ``never_off``."""
    starts = resumed_from(traces["kv"]) if "kv" in traces else {}
    windows = {name: window(trace, starts) for name, trace in traces.items()}
    lengths = {name: w.length for name, w in windows.items()}
    always, resumed, skip = lengths.get(NEVER_OFF), lengths.get("kv"), lengths.get("skip")
    if not starts:
        problems.append("no recorded request speculated again after a fallback span")
    elif windows.get("kv", Window()).verifies < min_verifies:
        problems.append(f"only {windows['kv'].verifies} verifies after a switch back on, {min_verifies} needed")
    if always is None or resumed is None:
        problems.append("no acceptance measured on the always-on reference or on the server under test")
    else:
        if always < MIN_ALWAYS_ON:
            problems.append(
                f"always-on accepted {always:.3f} tokens per verify (below {MIN_ALWAYS_ON:g}): its drafts are "
                "rejected (dummy weights?), so there is no acceptance to keep"
            )
        if resumed < min_ratio * always:
            problems.append(f"resumed acceptance {resumed:.3f} is below {min_ratio:g} x always-on's {always:.3f}")
        if skip is None:
            problems.append("no acceptance measured on the control (no draft extend while off)")
    for name, trace in sorted(traces.items()):
        if trace.bad_lines:
            problems.append(f"{trace.bad_lines} unreadable line(s) in the {name} recording")
    drop = round(skip / always, 4) if skip is not None and always else None
    drops = drop is not None and drop < min_ratio
    control = "" if drop is None else (
        f"; control {skip} = {drop} x always-on"
        + ("" if drops else ": no drop, this head and load do not see a stale draft KV (exact_kv proves the KV)")
    )  # fmt: skip
    return {
        "passed": not problems,
        "always_on": always,
        "dynspec_resumed": resumed,
        "skip_resumed": skip,
        "full_resumed": lengths.get("full"),
        "requests": len(starts),
        "verifies": {name: w.verifies for name, w in sorted(windows.items())},
        "skip_over_always_on": drop,
        "control_drops": drops,
        "min_ratio": min_ratio,
        "problems": problems,
        "detail": f"resumed {resumed} vs always-on {always} over {len(starts)} requests{control}",
    }
