"""The baseline: a recorded matrix, ``matrix.json`` at the repository root.

Results are compared with it: a ``fail`` cell, or any cell whose state differs from the baseline, is
a regression.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packaging.version import Version

from patcher.errors import ExitCode, UsageError
from patcher.matrix.model import Change, Matrix, ReleaseResult, span

SCHEMA = 1
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BASELINE = REPO_ROOT / "matrix.json"


def default_baseline() -> Path | None:
    """matrix.json of the dynspec checkout this runs from; an installed dynspec has none."""
    return REPO_ROOT / "matrix.json" if (REPO_ROOT / "pyproject.toml").is_file() else None


def to_data(matrix: Matrix) -> dict[str, Any]:
    """The matrix as JSON data: the shape of ``matrix.json`` (no times, so it is reproducible)."""
    return {
        "schema": SCHEMA,
        "recipe": matrix.recipe.name,
        "source": matrix.source,
        "patches": [
            {
                "id": p.id,
                "revision": p.REVISION,
                "target": p.TARGET,
                "sglang": p.SGLANG,
                "upstream": p.UPSTREAM,
                "summary": p.SUMMARY,
            }
            for p in matrix.recipe.patches
        ],
        "releases": [_release_data(r) for r in matrix.results],
    }


def _release_data(result: ReleaseResult) -> dict[str, Any]:
    if result.error is not None:
        return {"version": result.version, "error": result.error}
    return {
        "version": result.version,
        "cells": {patch: {"state": cell.state.value, "detail": cell.detail} for patch, cell in result.cells.items()},
    }


def load_baseline(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise UsageError(f"baseline {path} is not readable JSON: {error}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("releases"), list):
        raise UsageError(f"baseline {path} is not a dynspec matrix (schema {SCHEMA})")
    return data


def compare(matrix: Matrix, baseline: dict[str, Any] | None) -> list[Change]:
    """Every cell of a release that the baseline records whose state is not the recorded one.

    Releases the baseline does not have are new, not changed; only their ``fail`` cells count.
    """
    if not baseline:
        return []
    recorded = {r["version"]: r for r in baseline["releases"]}
    changes: list[Change] = []
    for result in matrix.results:
        row = recorded.get(result.version)
        if row is None:
            continue
        if result.error is not None or "error" in row:
            was = "error" if "error" in row else "cells"
            now = "error" if result.error is not None else "cells"
            if was != now:
                changes.append(Change(result.version, "*", was, now))
            continue
        for patch, cell in result.cells.items():
            was = row["cells"].get(patch, {}).get("state", "absent")
            if was != cell.state.value:
                changes.append(Change(result.version, patch, was, cell.state.value))
    return changes


def change_ranges(matrix: Matrix, changes: Sequence[Change]) -> list[tuple[str, str, str, str]]:
    """Changes merged over consecutive releases: (releases, patch, was, now), e.g. a new patch in one row."""
    order = {r.version: i for i, r in enumerate(matrix.results)}
    groups: list[tuple[list[str], str, str, str]] = []
    open_groups: dict[tuple[str, str, str], tuple[list[str], str, str, str]] = {}
    for change in sorted(changes, key=lambda c: order.get(c.version, -1)):
        key = (change.patch, change.was, change.now)
        group = open_groups.get(key)
        if group and order.get(group[0][-1], -2) + 1 == order.get(change.version):
            group[0].append(change.version)
            continue
        group = ([change.version], *key)
        open_groups[key] = group
        groups.append(group)
    return [(span(versions), patch, was, now) for versions, patch, was, now in groups]


def new_releases(matrix: Matrix, baseline: dict[str, Any] | None) -> list[str]:
    recorded = {r["version"] for r in (baseline or {}).get("releases", [])}
    return [r.version for r in matrix.results if r.version not in recorded]


def exit_code(matrix: Matrix, changes: Sequence[Change]) -> ExitCode:
    """1 (``CHANGES``) for a ``fail`` cell (always inside the patch's range) or a change; else 0."""
    return ExitCode.CHANGES if matrix.failures() or changes else ExitCode.OK


def updated_baseline(matrix: Matrix, baseline: dict[str, Any] | None) -> dict[str, Any]:
    """The baseline with this run's releases replaced or added; other recorded releases are kept."""
    data = to_data(matrix)
    if baseline and baseline.get("recipe") not in (None, matrix.recipe.name):
        raise UsageError(f"the baseline is for recipe {baseline['recipe']!r}, this run is {matrix.recipe.name!r}")
    rows = {r["version"]: r for r in (baseline or {}).get("releases", [])}
    rows.update({r["version"]: r for r in data["releases"]})
    data["releases"] = [rows[v] for v in sorted(rows, key=Version)]
    return data


def dump(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
