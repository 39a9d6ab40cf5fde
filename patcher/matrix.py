"""The release matrix: every patch of a recipe on every SGLang release, as plain data.

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

Results are compared with a recorded baseline (``matrix.json`` at the repository root): a ``fail``
cell, or any cell whose state differs from the baseline, is a regression. Nothing here imports click
or rich; the command line is ``patcher.matrix_cli``.
"""

from __future__ import annotations

import difflib
import enum
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from patcher import releases
from patcher.errors import DynspecError, ExitCode, Refused, UsageError
from patcher.patch import NewFilePatch, Patch
from patcher.registry import Recipe, all_patches

SCHEMA = 1
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BASELINE = REPO_ROOT / "matrix.json"


def default_baseline() -> Path | None:
    """matrix.json of the dynspec checkout this runs from; an installed dynspec has none."""
    return REPO_ROOT / "matrix.json" if (REPO_ROOT / "pyproject.toml").is_file() else None

README_BEGIN = "<!-- matrix:begin -->"
README_END = "<!-- matrix:end -->"


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


# -- where releases come from ---------------------------------------------------------------------


class SourceError(Exception):
    """This release's files cannot be had (no wheel, no tag); the release gets an error row."""


@dataclass(frozen=True)
class PyPISource:
    """Releases of the ``sglang`` project on PyPI, through pip (so pip's own index settings apply)."""

    def describe(self) -> str:
        return "pypi"

    def versions(self) -> list[str]:
        command = [sys.executable, "-m", "pip", "index", "versions", "sglang", "--disable-pip-version-check"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise Refused(f"could not list SGLang releases on PyPI: {error}") from None
        match = re.search(r"^Available versions:\s*(.+)$", done.stdout, re.M)
        if done.returncode != 0 or match is None:
            why = (done.stderr.strip().splitlines() or ["pip index versions sglang printed no versions"])[-1]
            raise Refused(f"could not list SGLang releases on PyPI: {why}")
        return [v.strip() for v in match.group(1).split(",") if v.strip()]

    def materialize(self, version: str, members: Sequence[str], dest: Path) -> Path:
        try:
            return releases.copy_tree(version, members, dest)
        except RuntimeError as error:  # pip found no wheel for this release
            raise SourceError(f"no wheel: {error}") from None


@dataclass(frozen=True)
class GitSource:
    """Releases as the tags of a git clone of SGLang (``v0.5.12`` or ``0.5.12``)."""

    repo: str  # a local git dir (work tree or bare)
    origin: str  # what the user passed: a path or a URL
    tags: tuple[tuple[str, str], ...] = ()  # (version, tag name), filled by ``open_git``

    def describe(self) -> str:
        return f"git {self.origin}"

    def versions(self) -> list[str]:
        return [version for version, _ in self.tags]

    def materialize(self, version: str, members: Sequence[str], dest: Path) -> Path:
        from patcher import checkout  # GitPython costs 0.1 s to import; only a git source pays it

        tag = dict(self.tags).get(version)
        if tag is None:
            raise SourceError(f"no tag for {version} in {self.origin}")
        prefix = "python/sglang" if checkout.has_dir(self.repo, tag, "python/sglang/srt") else "sglang"
        wanted = {f"{prefix}/{m.split('/', 1)[1]}": m.split("/", 1)[1] for m in {*releases.BASE_MEMBERS, *(f"sglang/{m}" for m in members)}}
        package = dest / "sglang"
        for path, data in checkout.files_at(self.repo, tag, wanted).items():
            target = package / wanted[path]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        if not (package / "srt" / "server_args.py").is_file():
            raise SourceError(f"tag {tag} of {self.origin} has no {prefix}/srt/server_args.py")
        return package


def open_git(path_or_url: str) -> GitSource:
    """A local clone as is, or a URL cloned (bare, once) into the cache and fetched on later runs."""
    from patcher import checkout

    try:
        git_dir, tag_names = checkout.open_repository(path_or_url, releases.cache_dir())
    except checkout.GitSourceError as error:
        raise (UsageError if error.usage else Refused)(str(error)) from None
    tags: dict[str, str] = {}
    for name in tag_names:
        version = _tag_version(name)
        if version is not None:
            tags.setdefault(version, name)
    ordered = tuple(sorted(tags.items(), key=lambda item: Version(item[0])))
    return GitSource(repo=git_dir, origin=path_or_url, tags=ordered)


def _tag_version(name: str) -> str | None:
    """``v0.5.12`` or ``0.5.12`` → ``0.5.12``; any other tag → None."""
    text = name[1:] if name.startswith("v") else name
    try:
        return str(Version(text)) if text[:1].isdigit() else None
    except InvalidVersion:
        return None


# -- which releases ------------------------------------------------------------------------------


def parse_releases(text: str) -> list[str] | SpecifierSet:
    """``--releases``: a list of versions (``0.5.12,0.5.13``) or a PEP 440 specifier (``>=0.5.4``)."""
    tokens = [t for t in re.split(r"[,\s]+", text.strip()) if t]
    if tokens and all(t[:1].isdigit() for t in tokens):
        try:
            return [str(Version(t)) for t in tokens]
        except InvalidVersion as error:
            raise UsageError(f"--releases {text!r}: {error}") from None
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise UsageError(
            f"--releases {text!r} is neither a list of versions (0.5.12,0.5.13) nor a specifier (>=0.5.4)"
        ) from None


def select(
    available: Callable[[], list[str]],
    releases_option: str | None,
    new: bool,
    baseline: dict[str, Any] | None,
) -> list[str]:
    """The releases to check, oldest first.

    Default: the baseline's releases. ``--releases``: those versions, or the available releases the
    specifier admits. ``--new``: of those, only releases newer than the newest in the baseline.
    """
    recorded = [r["version"] for r in (baseline or {}).get("releases", [])]
    if releases_option is not None:
        wanted = parse_releases(releases_option)
        chosen = list(wanted.filter(available())) if isinstance(wanted, SpecifierSet) else wanted
    elif new:
        chosen = available()
    elif recorded:
        chosen = recorded
    else:
        raise UsageError("no baseline to take the releases from; pass --releases (e.g. '>=0.4.10.post2')")
    if new:
        if not recorded:
            raise UsageError("--new compares with the baseline's newest release, and there is no baseline")
        newest = max(Version(v) for v in recorded)
        chosen = [v for v in chosen if Version(v) > newest and not Version(v).is_prerelease]
    return sorted(set(chosen), key=Version)


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


# -- the baseline ----------------------------------------------------------------------------------


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
    return [(_span(versions), patch, was, now) for versions, patch, was, now in groups]


def _span(versions: Sequence[str]) -> str:
    return versions[0] if len(versions) == 1 else f"{versions[0]} – {versions[-1]} ({len(versions)} releases)"


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


# -- reports -------------------------------------------------------------------------------------


def report(matrix: Matrix, baseline_path: Path | None, baseline: dict[str, Any] | None, seconds: float) -> dict[str, Any]:
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


# -- the README table ------------------------------------------------------------------------------


def readme_section(baseline: dict[str, Any]) -> str:
    """The generated part of README's "Supported releases": consecutive releases with equal rows merged."""
    patches = [p["id"] for p in baseline["patches"]]
    rows = baseline["releases"]
    lines = [
        README_BEGIN,
        "<!-- generated from matrix.json by `make docs`; edit matrix.json (`dynspec matrix --update-baseline`), not this -->",
        "",
        "| SGLang | " + " | ".join(f"`{p}`" for p in patches) + " |",
        "|---|" + "---|" * len(patches),
    ]
    groups: list[tuple[list[str], list[str]]] = []
    for row in rows:
        if "error" in row:
            states = [row["error"].split(":")[0]] * len(patches)
        else:
            states = [glyph(row["cells"].get(p, {}).get("state", "absent")) for p in patches]
        if groups and groups[-1][1] == states:
            groups[-1][0].append(row["version"])
        else:
            groups.append(([row["version"]], states))
    for versions, states in groups:
        lines.append(f"| {_span(versions)} | " + " | ".join(states) + " |")
    lines += ["", "| patch | SGLang | target | what it adds |", "|---|---|---|---|"]
    for p in baseline["patches"]:
        summary = p["summary"].replace("|", "\\|")
        lines.append(f"| `{p['id']}` r{p['revision']} | `{p['sglang']}` | `{p['target']}` | {summary} |")
    versions = [r["version"] for r in rows]
    lines += [
        "",
        f"{len(versions)} releases checked: {', '.join(versions)}.",
        README_END,
    ]
    return "\n".join(lines)


def render_readme(readme: str, baseline: dict[str, Any]) -> str:
    """``readme`` with the text between the matrix markers replaced by ``readme_section``."""
    begin, end = readme.find(README_BEGIN), readme.find(README_END)
    if begin < 0 or end < begin:
        raise UsageError(f"README has no {README_BEGIN} … {README_END} block")
    return readme[:begin] + readme_section(baseline) + readme[end + len(README_END) :]


def write_readme(readme_path: Path, baseline: dict[str, Any]) -> bool:
    """Regenerate the README table; True if the file changed."""
    old = readme_path.read_text(encoding="utf-8")
    new = render_readme(old, baseline)
    if new != old:
        readme_path.write_text(new, encoding="utf-8")
    return new != old
