"""``dynspec matrix``: every patch on many SGLang releases, compared with the recorded baseline.

Parsing and output only; the checks are the rest of ``patcher.matrix``. ``python -m patcher.matrix``
(``make docs``) regenerates README's "Supported releases" table from ``matrix.json``. The only module
of the package that imports click.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from patcher.errors import DynspecError, ExitCode, UsageError

if TYPE_CHECKING:
    from patcher.matrix.model import Change, Matrix, ReleaseResult
    from patcher.render import MatrixProgress

EXIT_CODES = """\b
Exit codes:
  0    every cell is ✓, n/a or upstream, and none differs from the baseline
  1    regression: a ✗ (always inside the patch's declared range), or a cell
       whose state differs from the baseline (--update-baseline accepts
       changes, not ✗)
  2    usage: bad --releases, --new without a baseline, --git not a repository
  4    the release list could not be read (PyPI or the git remote unreachable)
  123  internal error: a bug in dynspec
"""


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES)
@click.option(
    "--releases",
    "releases_option",
    metavar="SPEC|LIST",
    help="A PEP 440 specifier ('>=0.5.4') over the source's releases, or versions ('0.5.12,0.5.13'). "
    "Default: the releases recorded in the baseline.",
)
@click.option("--new", is_flag=True, help="Only releases newer than the newest one in the baseline.")
@click.option(
    "--git",
    "git_source",
    metavar="PATH|URL",
    help="Take releases from the tags (v0.5.12) of this SGLang clone instead of PyPI; a URL is cloned into the cache.",
)
@click.option("--recipe", default="default", show_default=True, help="Patch series from recipes/.")
@click.option(
    "--baseline",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The recorded matrix to compare with.  [default: matrix.json of the dynspec checkout this runs from; "
    "an installed dynspec has none]",
)
@click.option(
    "--update-baseline",
    is_flag=True,
    help="Record this run in the baseline (other recorded releases are kept) and regenerate README's table.",
)
@click.option(
    "--json",
    "json_to",
    metavar="[PATH]",
    is_flag=False,
    flag_value="-",
    default=None,
    help="Write the report as JSON to PATH, or to stdout (instead of the table) when no PATH is given.",
)
@click.option(
    "--junit-xml", type=click.Path(dir_okay=False, path_type=Path), help="Write a JUnit XML report to this file."
)
@click.option(
    "--jobs", "-j", type=click.IntRange(min=1), default=None, help="Releases checked at once.  [default: CPU count]"
)
@click.option("--list-releases", is_flag=True, help="Print the selected releases as a JSON list and exit (for CI).")
def matrix(
    releases_option: str | None,
    new: bool,
    git_source: str | None,
    recipe: str,
    baseline: Path | None,
    update_baseline: bool,
    json_to: str | None,
    junit_xml: Path | None,
    jobs: int | None,
    list_releases: bool,
) -> None:
    """Check every patch on many SGLang releases: ✓, n/a, upstream or ✗ per release and patch.

    For each release the real files (wheel from PyPI, cached; or a git tag) are copied to a temp
    dir and the whole static round trip runs: anchors found, only dynspec's marked blocks added,
    compiles, re-apply no-op, status, revert byte-exact. Releases run in parallel.

    Typical use: `dynspec matrix --new` the day a release appears; `dynspec matrix` to re-check
    the recorded releases; `dynspec matrix --releases 0.5.24 --update-baseline` to record one.
    """
    try:
        code = _matrix(
            releases_option, new, git_source, recipe, baseline, update_baseline, json_to, junit_xml, jobs, list_releases
        )
    except DynspecError as error:
        from patcher import render

        render.error(str(error))
        code = error.exit_code
    if code:
        sys.exit(int(code))


def _matrix(
    releases_option: str | None,
    new: bool,
    git_source: str | None,
    recipe_name: str,
    baseline_path: Path | None,
    update_baseline: bool,
    json_to: str | None,
    junit_xml: Path | None,
    jobs: int | None,
    list_releases: bool,
) -> ExitCode:
    from patcher import matrix as m
    from patcher import render
    from patcher.registry import load_recipe

    recipe = load_recipe(recipe_name)
    baseline_path = baseline_path or m.default_baseline()
    if baseline_path is None and update_baseline:
        raise UsageError("--update-baseline needs --baseline PATH: an installed dynspec has no matrix.json of its own")
    if baseline_path is None and releases_option is None:
        raise UsageError(
            "an installed dynspec has no baseline: pass --baseline PATH (the matrix.json of a dynspec checkout) "
            "or --releases"
        )
    baseline = m.load_baseline(baseline_path) if baseline_path else None
    if update_baseline and baseline and baseline.get("recipe") != recipe.name:
        raise UsageError(f"{baseline_path} records recipe {baseline.get('recipe')!r}, not {recipe.name!r}")
    source = m.open_git(git_source) if git_source else m.PyPISource()
    versions = m.select(source.versions, releases_option, new, baseline)
    if list_releases:
        render.as_json(versions)
        return ExitCode.OK
    if not versions:
        render.say(f"no SGLang release to check ({_why_none(new, baseline)})")

    start = time.perf_counter()
    progress = render.MatrixProgress()
    try:
        result = m.run_matrix(recipe, versions, source, jobs, _Observer(progress))
    finally:
        progress.stop()
    seconds = time.perf_counter() - start

    changes = m.compare(result, baseline)
    code = m.exit_code(result, changes)
    if update_baseline:
        assert baseline_path is not None
        data = m.updated_baseline(result, baseline)
        baseline_path.write_text(m.dump(data), encoding="utf-8")
        render.say(f"recorded {len(result.results)} release(s) in {baseline_path}")
        readme = baseline_path.parent / "README.md"
        has_table = readme.exists() and m.README_BEGIN in readme.read_text(encoding="utf-8")
        if has_table and m.write_readme(readme, data):
            render.say(f"regenerated the supported-releases table in {readme}")
        changes = []
        code = m.exit_code(result, changes)
        baseline = data

    report = m.report(result, baseline_path, baseline, seconds)
    if json_to == "-":
        render.as_json(report)
    else:
        if json_to:
            Path(json_to).write_text(m.dump(report), encoding="utf-8")
        _table(result, changes)
    if junit_xml:
        junit_xml.write_text(m.junit_xml(result, changes), encoding="utf-8")
    render.say(_summary(result, changes, baseline_path, baseline, seconds))
    return code


class _Observer:
    """Adapts ``run_matrix``'s progress calls to the progress display."""

    def __init__(self, progress: MatrixProgress) -> None:
        self.progress = progress

    def started(self, versions: Sequence[str]) -> None:
        self.progress.start(len(versions))

    def finished(self, result: ReleaseResult) -> None:
        self.progress.advance(_release_line(result))


def _release_line(result: ReleaseResult) -> str:
    from patcher import matrix as m

    if result.error is not None:
        return f"SGLang {result.version}: {result.error}"
    states = [cell.state for cell in result.cells.values()]
    summary = ", ".join(f"{states.count(state)} {m.GLYPH[state]}" for state in m.State if state in states)
    return f"SGLang {result.version}: {summary} ({result.seconds:.1f} s)"


def _table(result: Matrix, changes: Sequence[Change]) -> None:
    from patcher import matrix as m
    from patcher import render

    changed = {(c.version, c.patch): c for c in changes}
    if not result.results:
        return
    rows = []
    for release in result.results:
        row = [(release.version, "version")]
        if release.error is not None:
            change = changed.get((release.version, "*"))
            kind = "changed" if change else "error"
            row += [(release.error.split(":")[0], kind)] * len(result.patch_ids)
        else:
            for patch in result.patch_ids:
                cell = release.cells[patch]
                text, kind = m.GLYPH[cell.state], cell.state.value
                change = changed.get((release.version, patch))
                if change:
                    text, kind = f"{text} (was {m.glyph(change.was)})", "changed"
                row.append((text, kind))
        rows.append(row)
    render.matrix_table(
        f"recipe {result.recipe.name} on {len(rows)} SGLang release(s), {result.source}",
        ["SGLang", *result.patch_ids],
        rows,
    )
    failures = result.failures()
    if failures:
        render.table("✗", ["SGLang", "patch", "why"], [[v, p, c.detail] for v, p, c in failures])
    if changes:
        render.table(
            "changed against the baseline",
            ["SGLang", "patch", "baseline", "now"],
            [[span, patch, m.glyph(was), m.glyph(now)] for span, patch, was, now in m.change_ranges(result, changes)],
        )


def _summary(
    result: Matrix,
    changes: Sequence[Change],
    baseline_path: Path | None,
    baseline: dict[str, Any] | None,
    seconds: float,
) -> str:
    from patcher import matrix as m

    counts = result.counts()
    cells = ", ".join(f"{counts[s]} {m.GLYPH[s]}" for s in m.State)
    errors = sum(1 for r in result.results if r.error is not None)
    text = f"{len(result.results)} release(s) × {len(result.patch_ids)} patch(es): {cells}"
    if errors:
        text += f"; {errors} release(s) not checked"
    if baseline is None or baseline_path is None:
        text += f"; no baseline at {baseline_path}" if baseline_path else "; no baseline"
    elif changes:
        text += f"; {len(changes)} change(s) against {baseline_path.name}"
    else:
        fresh = m.new_releases(result, baseline)
        text += f"; no change against {baseline_path.name}" + (f" ({len(fresh)} new release(s))" if fresh else "")
    return f"{text}; {seconds:.1f} s"


def _why_none(new: bool, baseline: dict[str, Any] | None) -> str:
    if new and baseline:
        from packaging.version import Version

        newest = max((r["version"] for r in baseline["releases"]), key=Version)
        return f"none newer than {newest}, the newest in the baseline"
    return "the selection is empty"


@click.command(name="matrix-docs", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--baseline", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None)
@click.option("--readme", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None)
@click.option("--check", is_flag=True, help="Exit 1 if the README is out of date instead of writing it.")
def matrix_docs(baseline: Path | None, readme: Path | None, check: bool) -> None:
    """Regenerate README's supported-releases table from the baseline (`make docs`)."""
    from patcher import matrix as m
    from patcher import render

    baseline = baseline or m.DEFAULT_BASELINE
    readme = readme or baseline.parent / "README.md"
    try:
        data = m.load_baseline(baseline)
        if data is None:
            raise UsageError(f"no baseline at {baseline}")
        old = readme.read_text(encoding="utf-8")
        new = m.render_readme(old, data)
    except DynspecError as error:
        render.error(str(error))
        sys.exit(int(error.exit_code))
    if new == old:
        render.say(f"{readme} is up to date with {baseline.name}")
        return
    if check:
        render.error(f"{readme} is out of date with {baseline.name}; run `make docs`")
        sys.exit(int(ExitCode.CHANGES))
    readme.write_text(new, encoding="utf-8")
    render.say(f"regenerated the supported-releases table in {readme}")
