"""The ``exact_kv`` check: is the draft model's KV after a fallback span what a full extend leaves?

Three dynspec servers get the same load, each recording its drafts (``DYNSPEC_RECORD_DRAFTS``):
the default (KV-only draft extend while off), ``DYNSPEC_DRAFT_KV=full`` (the stock extend in every
fallback iteration) and ``DYNSPEC_DRAFT_KV=skip`` (no extend while off: holes in the draft KV).
A draft proposal at a position depends only on the request's draft KV below it and the draft
state handed on, so with the same greedy tokens, equal KV means equal proposals at every
position, up to rounding: a graph of another batch size rounds apart, and a near tie can flip
(``timelines_part_at``). Each wave's requests are therefore sent in one call, so every server
prefills them together. The check passes when the default's proposals equal full's at every
position after each request's first fallback iteration, and skip's differ somewhere: a control
that does not differ shows the comparison cannot see the KV.

The load is ``cycles`` waves, each of ``long`` requests that outlive the wave and ``short`` ones
that push the batch above the threshold and finish early, so the long requests decode through a
fallback span and then speculate again; from the second wave on, ``joiners`` more long requests
arrive while speculation is off. Only requests named with ``RID_PREFIX`` are recorded.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TypeVar

from patcher.proof.client import Request

RID_PREFIX = "dynspec-record-"  # the runtime records requests whose rid starts with this
FIRST_PROMPT = 200_000  # away from the equivalence and ramp prompts
JOIN_DELAY = 0.1  # seconds after a wave starts at which its joiners are sent
SPECULATE = "speculate"  # DraftRecorder's step names
FALL_BACK, RESUME = "fall back", "resume"
MAX_LISTED = 20


@dataclass(frozen=True)
class Load:
    cycles: int
    long: int
    short: int
    joiners: int
    long_tokens: int
    short_tokens: int

    def waves(self) -> list[list[Request]]:
        """Each wave's requests; prompts and rids are the same for every server."""
        out = []
        index = FIRST_PROMPT
        for cycle in range(self.cycles):
            wave = []
            for kind, count, tokens, delay in (
                ("long", self.long, self.long_tokens, 0.0),
                ("short", self.short, self.short_tokens, 0.0),
                ("join", self.joiners if cycle else 0, self.long_tokens, JOIN_DELAY),
            ):
                for _ in range(count):
                    wave.append(Request(index, tokens, f"{RID_PREFIX}{cycle}-{kind}-{index}", delay))
                    index += 1
            out.append(wave)
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "cycles": self.cycles,
            "long": self.long,
            "short": self.short,
            "joiners": self.joiners,
            "long_tokens": self.long_tokens,
            "short_tokens": self.short_tokens,
            "join_delay_s": JOIN_DELAY,
            "first_prompt": FIRST_PROMPT,
        }


@dataclass
class Recording:
    """One server's recorded iterations, per request: the first fallback position, drafts by position."""

    first_off: dict[str, int] = field(default_factory=dict)
    drafts: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    # per request and position: the iteration's step and batch size, which pick the graphs that
    # wrote its target hidden states and draft K/V (two servers' timelines can part: see compare)
    history: dict[str, dict[int, tuple[str, int]]] = field(default_factory=dict)
    lines: int = 0
    bad_lines: int = 0


T = TypeVar("T")
Row = tuple[str, int, Optional[list[int]]]  # a request's rid, its position, its drafts (None: none recorded)


def recorded_lines(lines: Iterable[str]) -> Iterator[tuple[str, list[Row]] | None]:
    """A ``DYNSPEC_RECORD_DRAFTS`` file line by line, blank lines skipped: ``(step, rows)``, or None
    for a line that cannot be read whole (not JSON, a field missing, columns of different lengths,
    a value of the wrong type: nothing of it is read)."""
    for line in lines:
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            step, rids, positions = entry["step"], entry["rid"], entry["pos"]
            drafts = entry.get("draft")
            if len(rids) != len(positions) or (drafts is not None and len(drafts) != len(rids)):
                raise ValueError("columns of different lengths")
            rows = [
                (str(rid), int(pos), None if drafts is None else [int(t) for t in drafts[i]])
                for i, (rid, pos) in enumerate(zip(rids, positions))
            ]
        except (ValueError, TypeError, KeyError, OverflowError):  # drafts an object; Infinity, which json reads
            yield None
            continue
        yield step, rows


def rows_by_line(lines: Iterable[str], prefix: str) -> Iterator[tuple[str, int, list[Row]] | None]:
    """``recorded_lines`` as the checks read them: per line its step, its batch size (every row) and
    the rows of the requests named with ``prefix``; None for a line that cannot be read whole."""
    for read_line in recorded_lines(lines):
        if read_line is None:
            yield None
            continue
        step, rows = read_line
        yield step, len(rows), [row for row in rows if row[0].startswith(prefix)]


def read_recording(path: Path, parse: Callable[[Iterable[str]], T], nothing: T) -> T:
    """``parse`` of the ``DYNSPEC_RECORD_DRAFTS`` file at ``path``; ``nothing`` where the server wrote none."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            return parse(f)
    except FileNotFoundError:
        return nothing


def parse(lines: Iterable[str], prefix: str = RID_PREFIX) -> Recording:
    """Read a ``DYNSPEC_RECORD_DRAFTS`` file; requests not named with ``prefix`` are ignored."""
    rec = Recording()
    for read_line in rows_by_line(lines, prefix):
        rec.lines += 1
        if read_line is None:
            rec.bad_lines += 1
            continue
        step, batch_size, rows = read_line
        for rid, pos, row in rows:
            rec.history.setdefault(rid, {})[pos] = (step, batch_size)
            if step in (FALL_BACK, RESUME):
                rec.first_off[rid] = min(pos, rec.first_off.get(rid, pos))
            elif step == SPECULATE and row is not None:
                rec.drafts.setdefault(rid, {})[pos] = row
    return rec


def read(path: Path) -> Recording:
    return read_recording(path, parse, Recording())


@dataclass
class Bits:
    """A server's ``DYNSPEC_CHECK_KV_BITS`` file (the full-extend reference's, or with ``--exact-kv-bits-on
    tested`` the tested server's): per fallback iteration, how many of its
    rows' K/V the direct write (``direct``) and its packed control (``packed``) left other than the
    full extend did."""

    iterations: int = 0
    rows: int = 0
    differing: int = 0  # rows the direct write left other than the full extend
    control_rows: int = 0
    control_differing: int = 0
    bad_lines: int = 0

    def entry(self) -> dict[str, Any]:
        return {
            "passed": self.iterations > 0 and self.differing == 0 and self.control_differing > 0 and not self.bad_lines,
            "iterations": self.iterations,
            "rows": self.rows,
            "rows_differing": self.differing,
            "control_rows": self.control_rows,
            "control_rows_differing": self.control_differing,
            "bad_lines": self.bad_lines,
        }


def read_bits(path: Path) -> Bits | None:
    """None where the server wrote no such file (the check was not asked for, or ran no iteration)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    bits = Bits()
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            rows, direct = int(entry["rows"]), int(entry["direct"])
            packed = entry.get("packed")
            if not 0 <= direct <= rows or (packed is not None and not 0 <= int(packed) <= rows):
                raise ValueError("a count outside the rows")
        except (ValueError, TypeError, KeyError, OverflowError):
            bits.bad_lines += 1
            continue
        bits.iterations += 1
        bits.rows += rows
        bits.differing += direct
        if packed is not None:
            bits.control_rows += rows
            bits.control_differing += int(packed)
    return bits


@dataclass
class Comparison:
    requests: int = 0  # requests that speculated again after a fallback span, in both recordings
    steps: int = 0  # (request, position) pairs compared
    steps_same_history: int = 0  # of those, pairs whose request ran every iteration alike on both servers
    mismatches: list[dict[str, Any]] = field(default_factory=list)

    @property
    def differs(self) -> bool:
        return bool(self.mismatches)

    @property
    def with_same_history(self) -> int:
        return sum(1 for m in self.mismatches if m["same_history"])


def compare(reference: Recording, other: Recording) -> Comparison:
    """Proposals of ``other`` against ``reference`` at the positions after each request's first
    fallback iteration (in the reference) that both recorded."""
    out = Comparison()
    for rid, first_off in sorted(reference.first_off.items()):
        ref, got = reference.drafts.get(rid, {}), other.drafts.get(rid, {})
        common = sorted(p for p in ref.keys() & got.keys() if p > first_off)
        if not common:
            continue
        out.requests += 1
        out.steps += len(common)
        parted = timelines_part_at(reference, other, rid)
        out.steps_same_history += sum(1 for p in common if p < parted)
        out.mismatches += [
            {"rid": rid, "pos": p, "reference": ref[p], "other": got[p], "same_history": p < parted}
            for p in common
            if ref[p] != got[p]
        ]
    return out


def timelines_part_at(reference: Recording, other: Recording, rid: str) -> float:
    """The first position at which ``rid`` ran in another step or at another batch size on the two
    servers (or was recorded on one only); infinity if never. Joiners arrive by the clock, so a
    faster server can take them a few positions later; where the timelines part, the K/V and hidden
    states of those positions come from other graphs, which may round apart, and a near tie later
    on can flip without any KV being wrong. A mismatch before that position cannot be explained so,
    provided the request was prefilled alike: prefills are not recorded (session 15's waves, sent
    request by request, were prefilled 1 + 15 on one server and 2 + 14 on another; they are now
    sent in one call)."""
    ref, got = reference.history.get(rid, {}), other.history.get(rid, {})
    return min((p for p in ref.keys() | got.keys() if ref.get(p) != got.get(p)), default=math.inf)


def same_history(reference: Recording, other: Recording, rid: str, pos: int) -> bool:
    """Did ``rid`` run every iteration up to ``pos`` alike on both servers (``timelines_part_at``)?"""
    return pos < timelines_part_at(reference, other, rid)


def judge(
    recordings: Mapping[str, Recording],
    digests: Mapping[str, Sequence[str]],
    min_steps: int,
    problems: list[str],
    bits: Bits | None = None,
) -> dict[str, Any]:
    """The report entry: ``recordings`` and ``digests`` (per wave) are keyed ``kv``, ``full``, ``skip``.

    With ``bits`` (the full-extend server compared the direct write's K/V with its own, bit for
    bit, in every fallback iteration) those must be exact, and their control must differ; then a
    proposal that differs only after the request's timeline parted from the reference's is the
    timeline's, not the write's, and does not fail the check, provided at least ``min_steps``
    proposals were compared where the timelines had not parted. Without them every mismatch fails it."""
    kv = compare(recordings["full"], recordings["kv"]) if {"full", "kv"} <= recordings.keys() else Comparison()
    control = compare(recordings["full"], recordings["skip"]) if {"full", "skip"} <= recordings.keys() else Comparison()
    if len({tuple(d) for d in digests.values()}) > 1:
        problems.append(f"greedy outputs of the load differ between the servers: {dict(digests)}")
    if kv.steps < min_steps:
        problems.append(f"only {kv.steps} proposals compared after a fallback span, {min_steps} needed")
    bits_entry = bits.entry() if bits is not None else None
    if bits_entry is not None and not bits_entry["passed"]:
        problems.append(f"bits: {describe_bits(bits_entry)}")
    # Only where enough proposals were compared like for like, and none of those differs.
    explained = (
        bits_entry is not None
        and bits_entry["passed"]
        and kv.with_same_history == 0
        and kv.steps_same_history >= min_steps
    )
    if kv.differs and not explained:
        first = kv.mismatches[0]
        problems.append(
            f"{len(kv.mismatches)} of {kv.steps} proposals differ from the full extend's ({kv.with_same_history} "
            f"where the request's timeline matched the full extend's), first: {first['rid']} "
            f"at position {first['pos']}: {first['other']} instead of {first['reference']}"
        )
    if not control.differs:
        problems.append(
            f"the control (no draft extend while off) proposed the same as the full extend at all {control.steps} "
            "positions compared: this load cannot tell a stale draft KV from an exact one "
            "(a longer load, more --exact-kv-cycles, gives the control more chances to differ)"
        )
    for name, rec in sorted(recordings.items()):
        if rec.bad_lines:
            problems.append(f"{rec.bad_lines} unreadable line(s) in the {name} recording")
    return {
        "passed": not problems,
        "compared_requests": kv.requests,
        "compared_steps": kv.steps,
        "control_differs": control.differs,
        "mismatches": len(kv.mismatches),
        "mismatches_same_history": kv.with_same_history,
        "compared_steps_same_history": kv.steps_same_history,
        "mismatch_examples": kv.mismatches[:MAX_LISTED],
        "control_compared_requests": control.requests,
        "control_compared_steps": control.steps,
        "control_mismatches": len(control.mismatches),
        "control_mismatches_same_history": control.with_same_history,
        "recorded_lines": {name: rec.lines for name, rec in sorted(recordings.items())},
        "digests": {name: list(d) for name, d in sorted(digests.items())},
        "bits": bits_entry,
        "problems": problems,
        "detail": (
            (
                f"{len(kv.mismatches)} of {kv.steps} proposals of {kv.requests} requests differ, all after the request's "
                "timeline parted from the full extend's"
                if explained
                else f"{len(kv.mismatches)} of {kv.steps} proposals of {kv.requests} requests differ from the full extend's"
                if kv.differs
                else f"{kv.steps} proposals of {kv.requests} requests after a fallback span equal the full extend's"
            )
            + f"; the control differs at {len(control.mismatches)} of {control.steps}"
            + (f"; bits: {describe_bits(bits_entry)}" if bits_entry is not None else "")
        ),
    }


def describe_bits(entry: dict[str, Any]) -> str:
    text = (
        f"the direct write left {entry['rows_differing']} of {entry['rows']} rows other than the full extend in "
        f"{entry['iterations']} iterations, its packed control {entry['control_rows_differing']} of {entry['control_rows']}"
    )
    return text + (f"; {entry['bad_lines']} unreadable line(s)" if entry["bad_lines"] else "")
