"""Read an SGLang server log: dynspec's switch lines, long garbage collections, and anything that
looks like an error.

The runtime patch logs one line per switch, ``dynspec: speculation OFF at batch size B (off above
N, on at or below M)`` or ``... ON ...``, with the thresholds in force when it switched (with
``auto`` they move); SGLang prefixes its own ``[date time TPn]``.
SGLang's log format carries no level name, so errors are found by their text: a traceback, an
``...Error`` or ``ERROR`` word, CUDA/NCCL failures, the scheduler's "sigquit from a child"
message, an out-of-memory or leak report, or a ``/generate`` that uvicorn logged as 4xx/5xx
(other endpoints may answer 4xx on purpose: ``/flush_cache`` while busy, ``/health`` at start).

Offsets are byte offsets into the log file, so a check can look only at the part of a log
written while it ran (a server that starts logs harmless import warnings; one being stopped
logs its shutdown).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# The thresholds in parentheses are optional: the runtime's first revisions did not log them.
TRANSITION = re.compile(
    r"dynspec: speculation (OFF|ON) at batch size (\d+)(?: \(off above (\d+), on at or below (\d+)\))?"
)
TRACEBACK = "Traceback (most recent call last)"
# SGLang's line for a garbage collection longer than --gc-warning-threshold-secs (as 0.5.12 and 0.5.17 write it)
LONG_GC = re.compile(r"LONG GARBAGE COLLECTION DETECTED \| Generation (\d+) \| Duration: ([\d.]+)s")
ERROR_PATTERNS = (
    re.compile(r"\b\w*Error\b"),  # RuntimeError, AssertionError, "Error:", ...
    re.compile(r"\bERROR\b"),
    re.compile(r"\bException\b|\bhit an exception\b"),
    re.compile(r"CUDA error|illegal memory access|device-side assert|CUBLAS_STATUS_|NCCL error", re.I),
    re.compile(r"out of memory|\bOOM\b", re.I),
    re.compile(r"sigquit|SIGQUIT|child failed", re.I),
    re.compile(r"leak detected", re.I),
    re.compile(r"Segmentation fault|core dumped|Aborted", re.I),
    re.compile(r'"POST /generate[ ?][^"]*" [45]\d\d\b'),  # uvicorn access log: a failed /generate
)
# Lines that match a pattern above but are not errors. Kept short on purpose.
BENIGN = (
    re.compile(r"Ignore import error when loading"),
    re.compile(r"\bserver_args=ServerArgs\("),  # every flag's name, custom_sigquit_handler among them
)


@dataclass(frozen=True)
class Transition:
    direction: str  # "OFF" or "ON"
    batch_size: int
    line: int  # 1-based line number in the log file
    off_above: int | None = None  # the thresholds the line says were in force; None if it does not say
    on_at_most: int | None = None

    @classmethod
    def of(cls, m: re.Match[str], line: int) -> Transition:
        off, on = m.group(3), m.group(4)
        return cls(
            m.group(1), int(m.group(2)), line, None if off is None else int(off), None if on is None else int(on)
        )

    def against_its_thresholds(self) -> str | None:
        """What is wrong with a switch its own thresholds do not allow (OFF at a batch size at or
        below the off-above size, ON above the on-at-most size); None if it agrees or names none."""
        if self.direction == "OFF" and self.off_above is not None and self.batch_size <= self.off_above:
            return f"line {self.line}: OFF at batch size {self.batch_size}, not above {self.off_above}"
        if self.direction == "ON" and self.on_at_most is not None and self.batch_size > self.on_at_most:
            return f"line {self.line}: ON at batch size {self.batch_size}, above {self.on_at_most}"
        return None


@dataclass(frozen=True)
class Collection:
    """A garbage collection SGLang logged as longer than its threshold: a stall of the process that made it."""

    line: int
    generation: int
    seconds: float

    def entry(self) -> dict[str, int | float]:
        return {"line": self.line, "generation": self.generation, "seconds": self.seconds}


@dataclass(frozen=True)
class LogError:
    line: int
    text: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.text}"


class SwitchCounts:
    """How many of ``transitions`` switched speculation off and on."""

    transitions: list[Transition]

    @property
    def off(self) -> int:
        return sum(t.direction == "OFF" for t in self.transitions)

    @property
    def on(self) -> int:
        return sum(t.direction == "ON" for t in self.transitions)


@dataclass
class Scan(SwitchCounts):
    transitions: list[Transition] = field(default_factory=list)
    errors: list[LogError] = field(default_factory=list)
    collections: list[Collection] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.transitions)


def is_error(line: str) -> bool:
    if TRANSITION.search(line) or any(b.search(line) for b in BENIGN):
        return False
    return TRACEBACK in line or any(p.search(line) for p in ERROR_PATTERNS)


def scan(text: str, first_line: int = 1) -> Scan:
    """Transitions, errors and long collections in ``text``, whose first line is line ``first_line`` of its file.

    A traceback counts once, reported as its first line joined to its exception line.
    """
    result = Scan()
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        number = first_line + i
        m = TRANSITION.search(line)
        if m:
            result.transitions.append(Transition.of(m, number))
        gc = LONG_GC.search(line)
        if gc:
            result.collections.append(Collection(number, int(gc.group(1)), float(gc.group(2))))
        if TRACEBACK in line:
            j = i + 1
            while j < len(lines) and (not lines[j].strip() or lines[j][:1].isspace()):
                j += 1
            last = lines[j].strip() if j < len(lines) else "(log ends inside the traceback)"
            result.errors.append(LogError(number, f"{line.strip()} ... {last}"))
            i = j + 1
            continue
        if is_error(line):
            result.errors.append(LogError(number, line.strip()[:300]))
        i += 1
    return result


def size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def read_window(path: Path, start: int = 0, end: int | None = None) -> tuple[str, int]:
    """The text of ``path`` from byte ``start`` to ``end``, and the line number ``start`` is on."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return "", 1
    end = len(data) if end is None else min(end, len(data))
    start = min(start, end)
    return data[start:end].decode("utf-8", "replace"), data.count(b"\n", 0, start) + 1


def scan_file(path: Path, start: int = 0, end: int | None = None) -> Scan:
    text, first_line = read_window(path, start, end)
    return scan(text, first_line)


CACHED_TOKENS = re.compile(r"Prefill batch.*#cached-token: (\d+)")  # SGLang's prefill line, what the prefix cache held


def cached_prompt_tokens(text: str) -> int:
    """The prompt tokens the prefills in ``text`` found in the prefix cache instead of computing."""
    return sum(int(n) for n in CACHED_TOKENS.findall(text))


KV_POOL = re.compile(r"max_total_num_tokens=(\d+)")  # SGLang's start-up line with the KV pool it made


def kv_pool_tokens(text: str) -> int | None:
    """The KV pool (slots) a server's start-up log says it made, the last such line; None if none."""
    found = KV_POOL.findall(text)
    return int(found[-1]) if found else None


# dynspec_auto's Decision.describe(): each threshold change of --speculative-disable-batch-size auto
AUTO_DECISION = re.compile(
    r"dynspec auto: off above (\d+), on at or below (\d+) \(([^;]*); acceptance ([0-9.]+|unknown);"
)


@dataclass(frozen=True)
class AutoDecision:
    disable_above: int
    enable_at_or_below: int
    reason: str  # "estimated", "probe ...", or why the estimates cannot decide yet
    acceptance: float | None  # the EMA it decided with; None while no verify has been timed


def auto_decisions(text: str) -> list[AutoDecision]:
    """The ``dynspec auto:`` lines of ``text``, in order."""
    return [
        AutoDecision(int(off), int(on), reason, None if accept == "unknown" else float(accept))
        for off, on, reason, accept in AUTO_DECISION.findall(text)
    ]


def tail(path: Path, lines: int = 30) -> str:
    text, _ = read_window(path)
    return "\n".join(text.splitlines()[-lines:])


def last_line(path: Path) -> str:
    """The last non-empty line of the log, for progress messages."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, size(path) - 4096))
            chunk = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    rows = [r for r in chunk.splitlines() if r.strip()]
    return rows[-1].strip()[:160] if rows else ""


class LogFollower(SwitchCounts):
    """Counts switch lines as a server writes them, reading only whole new lines at each poll."""

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self.offset = offset
        self.transitions: list[Transition] = []
        self._line = read_window(path, offset, offset)[1]  # the line number at offset

    def poll(self) -> list[Transition]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        if not complete:
            return []
        self.offset += len(complete)
        text = complete.decode("utf-8", "replace")
        new = [
            Transition.of(m, self._line + n)
            for n, line in enumerate(text.splitlines())
            if (m := TRANSITION.search(line))
        ]
        self._line += text.count("\n")
        self.transitions.extend(new)
        return new
