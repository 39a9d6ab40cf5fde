"""The equivalence check's rule: which stock output one of dynspec's may equal, level by level.

Greedy dynspec must give base's tokens. Where SGLang's own two modes disagree (on real weights a
near tie can round apart in the verify's and the decode's kernels), it may give the output of the
mode it ran the level in, read from the switches its log shows in that level.
"""

from __future__ import annotations

from collections.abc import Sequence

from patcher.proof.client import LevelResult
from patcher.proof.logscan import Transition


def first_difference(tokens: Sequence[int], want: Sequence[int]) -> int:
    return next((k for k, (a, b) in enumerate(zip(tokens, want)) if a != b), min(len(tokens), len(want)))


BASE_REPEAT = "base_repeat"  # base's second pass over the levels (real weights)


def unrepeated(
    levels: Sequence[int],
    first: Sequence[tuple[LevelResult, list[Transition]]],
    second: Sequence[tuple[LevelResult, list[Transition]]] | None,
) -> list[tuple[int, int]]:
    """(C, outputs that differ) for each level where base's second pass gave other tokens than its first."""
    out = []
    for c, (a, _), (b, _) in zip(levels, first, second or []):
        count = sum(1 for prompt, tokens in b.outputs.items() if a.outputs.get(prompt, tokens) != tokens)
        if count:
            out.append((c, count))
    return out


def references(base: list[int], always_on: list[int] | None, state: str) -> list[tuple[str, list[int]]]:
    """The outputs one dynspec output may equal, by server. Where always-on gave base's output (or
    did not run): base's. Where SGLang's own two modes disagree (on real weights a near tie can
    round apart in the verify's and the decode's kernels): the output of the server of the mode it
    ran the level in (``state``: ``ON``, ``OFF``, or both, e.g. ``OFF->ON``), either for a level
    that crossed."""
    if always_on is None or always_on == base or state == "OFF":
        return [("base", base)]
    if state == "ON":
        return [("always_on", always_on)]
    return [("always_on", always_on), ("base", base)]


def matches_its_mode(tokens: list[int], base: list[int], always_on: list[int] | None, state: str) -> bool:
    """Equivalence of one dynspec output (``references``)."""
    return any(tokens == output for _, output in references(base, always_on, state))


def level_mode(transitions: Sequence[Transition], c: int, happened: str, after: str) -> str:
    """The mode a level ran in, for ``matches_its_mode``: ``happened`` (e.g. ``ON->OFF``), or the
    state after it where every switch came at the level's first decode (a level is sent in one
    call, so a batch of ``c`` requests switches before any token but the prefill's)."""
    if transitions and all(t.batch_size == c for t in transitions):
        return after
    return happened


def level_states(transitions: Sequence[Transition], before: str) -> tuple[str, str]:
    """(what happened during a level, the state after it), from the switches logged in it."""
    if not transitions:
        return before, before
    seq = [before] + [t.direction for t in transitions]
    return "->".join(seq), transitions[-1].direction
