"""The release matrix: every patch of a recipe on every SGLang release, as plain data.

Each patch gets one cell per release: ``ok``, ``n/a``, ``upstream`` or ``fail`` (``check`` says what
each means). Results are compared with a recorded baseline (``matrix.json`` at the repository root).
The modules, each importing only those listed before it:

``model``     the cells, one release's result, a change against the baseline, the matrix;
``sources``   where a release's files come from (PyPI, or the tags of a git clone) and which releases;
``check``     one release's static round trip, and many releases in worker processes;
``baseline``  ``matrix.json``: the data, reading it, comparing a run with it, recording a run;
``reports``   ``--json`` and JUnit XML;
``readme``    README's "Supported releases" table, from the baseline;
``command``   ``dynspec matrix`` and ``python -m patcher.matrix`` (``make docs``).

Nothing here imports click or rich but ``command``. This module hands on the others' public names,
each module imported when one of its names is first used: ``dynspec`` imports ``command`` at every
start, and that imports this package, not the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from patcher.faces import lazy_names

if TYPE_CHECKING:
    from patcher.matrix.baseline import (
        DEFAULT_BASELINE,
        REPO_ROOT,
        SCHEMA,
        change_ranges,
        compare,
        default_baseline,
        dump,
        exit_code,
        load_baseline,
        new_releases,
        to_data,
        updated_baseline,
    )
    from patcher.matrix.check import (
        Observer,
        blocks_by_patch,
        check_release,
        members_for,
        patch_by_patch,
        round_trip,
        run_matrix,
    )
    from patcher.matrix.model import GLYPH, Cell, Change, Matrix, ReleaseResult, State, glyph
    from patcher.matrix.readme import README_BEGIN, README_END, readme_section, render_readme, write_readme
    from patcher.matrix.reports import junit_xml, report
    from patcher.matrix.sources import GitSource, PyPISource, SourceError, open_git, parse_releases, select

__all__ = [
    "DEFAULT_BASELINE",
    "GLYPH",
    "README_BEGIN",
    "README_END",
    "REPO_ROOT",
    "SCHEMA",
    "Cell",
    "Change",
    "GitSource",
    "Matrix",
    "Observer",
    "PyPISource",
    "ReleaseResult",
    "SourceError",
    "State",
    "blocks_by_patch",
    "change_ranges",
    "check_release",
    "compare",
    "default_baseline",
    "dump",
    "exit_code",
    "glyph",
    "junit_xml",
    "load_baseline",
    "members_for",
    "new_releases",
    "open_git",
    "parse_releases",
    "patch_by_patch",
    "readme_section",
    "render_readme",
    "report",
    "round_trip",
    "run_matrix",
    "select",
    "to_data",
    "updated_baseline",
    "write_readme",
]

_MODULES = ("model", "sources", "check", "baseline", "reports", "readme")  # from the bottom up


if not TYPE_CHECKING:  # mypy reads the imports above instead, so it still knows each name and its type
    __getattr__ = lazy_names(__name__, _MODULES, __all__)
