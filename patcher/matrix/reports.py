"""The run as reports: ``--json`` (the matrix, what it means against the baseline, the exit code) and JUnit XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from patcher.matrix.baseline import compare, exit_code, new_releases, to_data
from patcher.matrix.model import GLYPH, Change, Matrix, State


def report(
    matrix: Matrix, baseline_path: Path | None, baseline: dict[str, Any] | None, seconds: float
) -> dict[str, Any]:
    """``--json``: the matrix plus what it means against the baseline and the exit code."""
    changes = compare(matrix, baseline)
    data = to_data(matrix)
    data["baseline"] = {
        "path": str(baseline_path) if baseline_path else None,
        "changes": [vars(c) for c in changes],
        "new_releases": new_releases(matrix, baseline),
    }
    data["failures"] = [{"version": v, "patch": p, "detail": c.detail} for v, p, c in matrix.failures()]
    data["exit_code"] = int(exit_code(matrix, changes))
    data["seconds"] = round(seconds, 2)
    for row, result in zip(data["releases"], matrix.results):
        row["seconds"] = round(result.seconds, 2)
    return data


def junit_xml(matrix: Matrix, changes: Sequence[Change]) -> str:
    """One testsuite per release, one testcase per patch: ✗ and changes fail, n/a and upstream skip."""
    changed = {(c.version, c.patch): c for c in changes}
    suites = ET.Element("testsuites", name="dynspec matrix")
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    for result in matrix.results:
        suite = ET.SubElement(suites, "testsuite", name=f"sglang {result.version}", time=f"{result.seconds:.3f}")
        counts = dict.fromkeys(totals, 0)
        classname = f"sglang-{result.version}"
        if result.error is not None:
            case = ET.SubElement(suite, "testcase", classname=classname, name="release files", time="0")
            release_change = changed.get((result.version, "*"))
            if release_change:
                ET.SubElement(case, "failure", message=release_change.describe()).text = result.error
                counts["failures"] += 1
            else:
                ET.SubElement(case, "skipped", message=result.error)
                counts["skipped"] += 1
            counts["tests"] += 1
        for patch, cell in result.cells.items():
            case = ET.SubElement(suite, "testcase", classname=classname, name=patch, time="0")
            counts["tests"] += 1
            change = changed.get((result.version, patch))
            problems = [f"{GLYPH[cell.state]} {cell.detail}".strip()] if cell.state is State.FAIL else []
            if change:
                problems.append(f"changed against the baseline: {change.describe()}")
            if problems:
                ET.SubElement(case, "failure", message=problems[0]).text = "\n".join(problems)
                counts["failures"] += 1
            elif cell.state in (State.NOT_APPLICABLE, State.UPSTREAM):
                ET.SubElement(case, "skipped", message=f"{cell.state.value}: {cell.detail}")
                counts["skipped"] += 1
            else:
                ET.SubElement(case, "system-out").text = cell.detail
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
    for key, value in totals.items():
        suites.set(key, str(value))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
