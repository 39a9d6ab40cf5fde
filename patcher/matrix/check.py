"""One release's static round trip, and many releases checked in worker processes.

For one release the check runs on the release's real files, copied into a temp tree, through the
engine and the ``Session`` that ``dynspec apply`` uses. Each patch gets one cell:

``ok``        the static round trip passes: its anchors are found, it adds only blocks that open
              with its marker (``# dynspec: <id> r<rev>``) and changes no original line, the file
              compiles, a second apply is a no-op, ``status`` says applied, and ``revert`` restores
              every byte;
``n/a``       the release is outside the patch's ``SGLANG`` range;
``upstream``  the release is in the patch's ``UPSTREAM`` range: SGLang provides it;
``fail``      inside the range, something above does not hold; the detail names the missing anchor,
              the first original line changed or the first line that is not dynspec's. An
              applied-matcher that already matches the release's own file fails too, unless the
              release is declared ``UPSTREAM``.

A release whose files cannot be had (no wheel on PyPI, no such tag) gets no cells and an ``error``.
"""

from __future__ import annotations

import difflib
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Protocol

from packaging.version import Version

from patcher.errors import DynspecError
from patcher.matrix.model import Cell, Matrix, ReleaseResult, State
from patcher.matrix.sources import GitSource, PyPISource, SourceError
from patcher.patch import NewFilePatch, Patch
from patcher.registry import Recipe, all_patches

# -- one release ---------------------------------------------------------------------------------


def members_for(recipe: Recipe) -> list[str]:
    """The files a release tree needs: every target of the recipe and of the shipped patches.

    The shipped patches' targets are included so that the download cache holds one tree per release
    for the matrix and the tests alike.
    """
    return sorted({p.TARGET for p in recipe.patches} | {p.TARGET for p in all_patches().values()})


def check_release(version: str, recipe: Recipe, source: PyPISource | GitSource) -> ReleaseResult:
    """The static round trip of every patch of ``recipe`` on ``version``'s real files, in a temp tree.

    The whole recipe goes through ``Session`` first, as ``dynspec apply`` runs it. Only if anything
    fails does each patch run on its own, on a fresh copy, to tell which patch fails and why.
    """
    start = time.perf_counter()
    members = members_for(recipe)
    with tempfile.TemporaryDirectory(prefix=f"dynspec-matrix-{version}-") as scratch:
        try:
            package = source.materialize(version, members, Path(scratch) / "recipe")
        except SourceError as error:
            return ReleaseResult(version, {}, error=str(error), seconds=time.perf_counter() - start)
        cells = round_trip(recipe, package, version)
        if cells is None:
            cells = patch_by_patch(recipe, source.materialize(version, members, Path(scratch) / "each"), version)
    return ReleaseResult(version, cells, seconds=time.perf_counter() - start)


def _outside(recipe: Recipe, version: str) -> tuple[dict[str, Cell], list[type[Patch]]]:
    """Cells of the patches outside their range on ``version``, and the patches inside it."""
    cells: dict[str, Cell] = {}
    inside: list[type[Patch]] = []
    for patch in recipe.patches:
        if patch.applies_to(version):
            inside.append(patch)
        elif patch.provided_upstream(version):
            cells[patch.id] = Cell(State.UPSTREAM, f"SGLang {version} has it (UPSTREAM {patch.UPSTREAM})")
        else:
            cells[patch.id] = Cell(State.NOT_APPLICABLE, f"for SGLang {patch.SGLANG}")
    return cells, inside


def round_trip(recipe: Recipe, package: Path, version: str) -> dict[str, Cell] | None:
    """Every patch of ``recipe`` on the package dir ``package`` at once; None if anything fails."""
    cells, inside = _outside(recipe, version)
    if inside:
        found, problems = _through_session(recipe, tuple(inside), package, version)
        if problems or set(found) != {p.id for p in inside}:
            return None
        cells.update(found)
    return {p.id: cells[p.id] for p in recipe.patches}


def patch_by_patch(recipe: Recipe, package: Path, version: str) -> dict[str, Cell]:
    """Each patch on its own, in recipe order, on the text its predecessors left; then ``Session``.

    A patch that fails is recorded and left out, so one drifted anchor does not hide the others;
    the patches that pass then go through apply, apply again, status and revert together.
    """
    from patcher import engine

    cells, inside = _outside(recipe, version)
    passed: list[type[Patch]] = []
    for target, chain in engine.targets_in_order(inside).items():
        path = package / target
        try:
            text = path.read_text(encoding="utf-8") if path.is_file() else None
        except UnicodeDecodeError:
            cells.update({patch.id: Cell(State.FAIL, f"{target} is not UTF-8 text") for patch in chain})
            continue
        module = None
        for patch in chain:
            state, detail, new, new_module = _one_patch(patch, target, text, module, version)
            cells[patch.id] = Cell(state, detail)
            if new != text:
                text, module = new, new_module
                passed.append(patch)
    if passed:
        found, problems = _through_session(recipe, tuple(passed), package, version)
        for patch in passed:
            problem = problems.get(patch.TARGET) or problems.get("*")
            if problem:
                cells[patch.id] = Cell(State.FAIL, problem)
            elif patch.id not in found:
                cells[patch.id] = Cell(State.FAIL, f"apply did not patch {patch.TARGET}")
    return {p.id: cells[p.id] for p in recipe.patches}


def _one_patch(
    patch: type[Patch], target: str, text: str | None, module: Any, version: str
) -> tuple[State, str, str | None, Any]:
    """One patch on the text before it: (state, detail, text after, tree after)."""
    from patcher import engine
    from patcher.errors import AnchorNotFound

    try:
        new, steps, new_module = engine.patch_file([patch], target, text, version, module)
        if steps[0].outcome is engine.Outcome.ALREADY:
            return (*_already(patch, target, version), text, module)
        assert new is not None
        engine.check_result([patch], target, text, new, version, new_module)
        problem, details = blocks_by_patch([patch], target, text, new)
    except AnchorNotFound as error:
        return State.FAIL, f"anchor {error.anchor!r} not found in {target}", text, module
    except DynspecError as error:
        return State.FAIL, str(error), text, module
    except Exception as error:  # noqa: BLE001 - a patch that crashes on this release is a failing cell
        return State.FAIL, f"the transform raised {type(error).__name__}: {error}", text, module
    if problem:
        return State.FAIL, problem, text, module
    return (*_patched(patch, version, details[patch.id]), new, new_module)


def _already(patch: type[Patch], target: str, version: str) -> tuple[State, str]:
    """The release's own file already matches the patch's applied-matcher."""
    if patch.provided_upstream(version):
        return State.UPSTREAM, f"SGLang {version} has it (UPSTREAM {patch.UPSTREAM})"
    return (
        State.FAIL,
        f"{target} of the release already matches the patch's applied-matcher: declare UPSTREAM if "
        "SGLang provides it, else the matcher is too loose",
    )


def _patched(patch: type[Patch], version: str, detail: str) -> tuple[State, str]:
    if patch.provided_upstream(version):
        return State.UPSTREAM, f"SGLang {version} has it (UPSTREAM {patch.UPSTREAM}); the patch still applies: {detail}"
    return State.OK, detail


def blocks_by_patch(
    patches: Sequence[type[Patch]], target: str, before: str | None, after: str
) -> tuple[str | None, dict[str, str]]:
    """Check that ``after`` is ``before`` plus blocks that each open with one of ``patches``' markers.

    ``patches`` are those that changed the file. Returns (the problem, or None; per patch id, what
    it added). Each patch must open at least one block. A new file is one block of its patch. Blank
    lines before a marker belong to its block, and where an inserted run could sit higher or lower
    (its edge line equals the neighbouring original line) any such position counts.
    """
    new_lines = after.splitlines()
    if before is None:
        return None, {p.id: f"new file {target}, {len(new_lines)} lines" for p in patches}
    if not all(p.INSERT_ONLY and not issubclass(p, NewFilePatch) for p in patches):
        unmarked = [p.id for p in patches if p.marker() not in after]
        if unmarked:
            return f"{target} has no {unmarked[0]} marker after the patch", {}
        return None, {p.id: f"rewrites {target} (not insert-only)" for p in patches}
    runs = _insert_runs(before.splitlines(), new_lines)
    if runs is None:
        from patcher.engine import first_changed_line

        return f"original line {first_changed_line(before, after)} of {target} is changed", {}
    owned: dict[str, list[tuple[int, int]]] = {p.id: [] for p in patches}
    blocks: list[list[Any]] = []  # [start, end, owner] in the patched file, in order
    for start, end in runs:
        owner = next((p for p in patches if _opens_with(new_lines, start, end, p.marker())), None)
        if owner is not None:
            blocks.append([start, end, owner])
            continue
        size = end - start
        previous = blocks[-1] if blocks else None
        # The original lines between the previous block and this run may match just as well right
        # after this run: then both are one block (the matcher split it on a repeated line).
        if previous is not None and new_lines[previous[1] : start] == new_lines[previous[1] + size : end]:
            previous[1] += size
            continue
        markers = " or ".join(repr(p.marker()) for p in patches)
        return f"line {start + 1} of the patched {target} is outside any block that opens with {markers}", {}
    for start, end, owner in blocks:
        owned[owner.id].append((start, end))
    details: dict[str, str] = {}
    for patch_id, spans in owned.items():
        if not spans:
            return f"{patch_id} added no block of its own to {target}", {}
        lines = sum(end - start for start, end in spans)
        details[patch_id] = f"+{lines} lines at {len(spans)} {'place' if len(spans) == 1 else 'places'} in {target}"
    return None, details


def _insert_runs(old: list[str], new: list[str]) -> list[tuple[int, int]] | None:
    """Runs of ``new`` that are not in ``old``, or None if ``old`` is not kept whole and in order."""
    for autojunk in (True, False):  # the fast heuristic first; the exact match where it is unsure
        opcodes = difflib.SequenceMatcher(None, old, new, autojunk=autojunk).get_opcodes()
        if all(op in ("equal", "insert") for op, *_ in opcodes):
            return [(j1, j2) for op, _, _, j1, j2 in opcodes if op == "insert"]
    return None


def _opens_with(lines: list[str], start: int, end: int, marker: str) -> bool:
    size = end - start
    low = start
    while low > 0 and lines[low - 1] == lines[low - 1 + size]:
        low -= 1
    high = start
    while high + size < len(lines) and lines[high] == lines[high + size]:
        high += 1
    for first in range(low, high + 1):
        opening = next((line for line in lines[first : first + size] if line.strip()), None)
        if opening is not None and opening.strip() == marker:
            return True
    return False


def _through_session(
    recipe: Recipe, patches: tuple[type[Patch], ...], package: Path, version: str
) -> tuple[dict[str, Cell], dict[str, str]]:
    """apply, apply again, status and revert through ``Session``, as the CLI runs them.

    Returns a cell per patch that apply patched, and the problems by target ("*": not one target).
    """
    from patcher.engine import Outcome, Status
    from patcher.session import Session

    series = Recipe(recipe.name, recipe.description, recipe.sglang, patches)
    before = _snapshot(package)

    def session() -> Session:
        return Session.open(str(package), series, force=True, sglang_version=version)

    cells: dict[str, Cell] = {}
    problems: dict[str, str] = {}
    try:
        plan = session().apply()
        for f in plan.files:
            for step in f.steps:
                if step.outcome is Outcome.ALREADY:
                    state, detail = _already(step.patch, f.target, version)
                    cells[step.patch.id] = Cell(state, detail)
                    if state is State.FAIL:
                        problems[f.target] = detail
            patched = [s.patch for s in f.steps if s.outcome is Outcome.PATCHED]
            if patched and f.new is not None:
                problem, details = blocks_by_patch(patched, f.target, f.pristine, f.new)
                if problem:
                    problems[f.target] = problem
                for patch in patched:
                    cells[patch.id] = Cell(*_patched(patch, version, details.get(patch.id, "")))
        for f in session().apply().pending:
            problems.setdefault(f.target, f"a second apply would write {f.target} again")
        for s in session().status():
            if s.status not in (Status.APPLIED, Status.UPSTREAM) and s.patch.id in cells:
                problems.setdefault(s.patch.TARGET, f"status after apply: {s.status.value} {s.detail}".rstrip())
        session().revert()
    except DynspecError as error:
        named = [p.TARGET for p in patches if p.TARGET in str(error)]
        for target in named or ["*"]:
            problems.setdefault(target, f"round trip: {error}")
        return cells, problems
    except Exception as error:  # noqa: BLE001 - a transform that crashes on this release fails its cells
        problems["*"] = f"the round trip raised {type(error).__name__}: {error}"
        return cells, problems
    after = _snapshot(package)
    for name in sorted(set(before) | set(after)):
        if before.get(name) != after.get(name):
            target = name if any(name == p.TARGET for p in patches) else "*"
            problems.setdefault(target, f"revert left {name} different from the release")
    return cells, problems


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# -- many releases -------------------------------------------------------------------------------


class Observer(Protocol):
    """Told when the releases are queued and as each one finishes (for a progress display)."""

    def started(self, versions: Sequence[str]) -> None: ...

    def finished(self, result: ReleaseResult) -> None: ...


def run_matrix(
    recipe: Recipe,
    versions: Sequence[str],
    source: PyPISource | GitSource,
    jobs: int | None = None,
    observer: Observer | None = None,
) -> Matrix:
    """Check every release in ``versions``, ``jobs`` at a time in worker processes."""
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(versions) or 1))
    results: list[ReleaseResult] = []
    if jobs == 1:
        if observer:
            observer.started(versions)
        for version in versions:
            results.append(check_release(version, recipe, source))
            if observer:
                observer.finished(results[-1])
    else:
        # fork: the workers start with the engine and the patches already imported.
        context = multiprocessing.get_context("fork") if sys.platform == "linux" else None
        with ProcessPoolExecutor(jobs, mp_context=context) as pool:
            # Every worker is forked on the first submit, before the observer starts any thread.
            futures = [pool.submit(check_release, version, recipe, source) for version in versions]
            if observer:
                observer.started(versions)
            for future in as_completed(futures):
                results.append(future.result())
                if observer:
                    observer.finished(results[-1])
    results.sort(key=lambda r: Version(r.version))
    return Matrix(recipe, source.describe(), results)
