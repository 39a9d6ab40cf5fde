"""The matrix as data: a cell per release and patch, a release's result, a change against the baseline."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from patcher.registry import Recipe


class State(enum.Enum):
    OK = "ok"
    NOT_APPLICABLE = "n/a"
    UPSTREAM = "upstream"
    FAIL = "fail"


GLYPH = {State.OK: "✓", State.NOT_APPLICABLE: "n/a", State.UPSTREAM: "upstream", State.FAIL: "✗"}


@dataclass(frozen=True)
class Cell:
    state: State
    detail: str = ""


@dataclass
class ReleaseResult:
    version: str
    cells: dict[str, Cell]  # patch id -> cell, in recipe order; empty when ``error`` is set
    error: str | None = None  # the release could not be checked: "no wheel ...", "no tag ..."
    seconds: float = 0.0


@dataclass(frozen=True)
class Change:
    """A cell whose state is not the one recorded in the baseline."""

    version: str
    patch: str
    was: str  # a State value or "absent" (no such cell recorded); for a whole release, "cells" or "error"
    now: str

    def describe(self) -> str:
        return f"SGLang {self.version} {self.patch}: {glyph(self.was)} in the baseline, {glyph(self.now)} now"


@dataclass
class Matrix:
    recipe: Recipe
    source: str  # "pypi" or "git <path or url>"
    results: list[ReleaseResult] = field(default_factory=list)  # oldest release first

    @property
    def patch_ids(self) -> list[str]:
        return [p.id for p in self.recipe.patches]

    def failures(self) -> list[tuple[str, str, Cell]]:
        return [
            (r.version, patch, cell)
            for r in self.results
            for patch, cell in r.cells.items()
            if cell.state is State.FAIL
        ]

    def counts(self) -> dict[State, int]:
        counts = dict.fromkeys(State, 0)
        for r in self.results:
            for cell in r.cells.values():
                counts[cell.state] += 1
        return counts


def glyph(state: str) -> str:
    try:
        return GLYPH[State(state)]
    except ValueError:
        return state


def span(versions: Sequence[str]) -> str:
    """``0.5.12``, or ``0.5.12 – 0.5.14 (3 releases)``: consecutive releases named as one row."""
    return versions[0] if len(versions) == 1 else f"{versions[0]} – {versions[-1]} ({len(versions)} releases)"
