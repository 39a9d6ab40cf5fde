"""`dynspec matrix` on real SGLang releases: cells, failures, the baseline, reports, the README table."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import git
import libcst as cst
import pytest

from patcher import anchors, releases
from patcher import matrix as m
from patcher.errors import ExitCode, UsageError
from patcher.patch import CstPatch
from patcher.registry import Recipe, load_recipe
from patches.server_args_dynspec_check import ServerArgsDynspecCheck
from tests.conftest import RELEASES, ROOT, snapshot

FEW = ["0.5.12", "0.5.13", "0.5.23"]
SERVER_ARGS_PATCHES = {  # the server-flag patches and the startup check, on the three releases above
    "0.5.12": {"server_args_dynspec_flags_legacy": "ok", "server_args_dynspec_flags": "n/a", "spec_fields_dynspec_flags": "n/a", "server_args_dynspec_check": "ok"},
    "0.5.13": {"server_args_dynspec_flags_legacy": "ok", "server_args_dynspec_flags": "n/a", "spec_fields_dynspec_flags": "n/a", "server_args_dynspec_check": "ok"},
    "0.5.23": {"server_args_dynspec_flags_legacy": "n/a", "server_args_dynspec_flags": "n/a", "spec_fields_dynspec_flags": "ok", "server_args_dynspec_check": "ok"},
}  # fmt: skip


def dynspec_matrix(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """The real command in a subprocess: exit code and streams as a user sees them."""
    entry = "from patcher.matrix.command import matrix; matrix(prog_name='dynspec matrix')"
    return subprocess.run(
        [sys.executable, "-c", entry, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT)},
        timeout=600,
    )


def states(result: m.Matrix) -> dict[str, dict[str, str]]:
    return {r.version: {p: c.state.value for p, c in r.cells.items()} for r in result.results}


# -- real releases, the shipped recipe ------------------------------------------------------------


@pytest.fixture(scope="module")
def few() -> m.Matrix:
    return m.run_matrix(load_recipe("default"), FEW, m.PyPISource(), jobs=2)


def test_real_releases_get_the_expected_cells(few: m.Matrix) -> None:
    got = states(few)
    for version, expected in SERVER_ARGS_PATCHES.items():
        assert {p: got[version][p] for p in expected} == expected
    recipe = load_recipe("default")
    for result in few.results:
        assert result.error is None
        for patch in recipe.patches:
            cell = result.cells[patch.id]
            assert cell.state is (m.State.OK if patch.applies_to(result.version) else m.State.NOT_APPLICABLE), cell
            if cell.state is m.State.OK:
                assert cell.detail.startswith("+") or cell.detail.startswith("new file"), cell.detail
                assert patch.TARGET in cell.detail
    assert few.failures() == []
    assert m.exit_code(few, []) is ExitCode.OK


def test_the_check_leaves_the_cached_release_untouched(few: m.Matrix) -> None:
    recipe = load_recipe("default")
    tree = releases.unpacked("0.5.12", m.members_for(recipe))
    before = snapshot(tree)
    m.check_release("0.5.12", recipe, m.PyPISource())
    assert snapshot(tree) == before


def test_each_patch_on_its_own_agrees_with_the_whole_recipe(tmp_path: Path) -> None:
    """The fallback path (patch by patch) and the fast path (the recipe through Session) give one answer."""
    recipe = load_recipe("default")
    for version in ("0.5.12", "0.5.23"):
        whole = m.round_trip(
            recipe, releases.copy_tree(version, m.members_for(recipe), tmp_path / version / "a"), version
        )
        each = m.patch_by_patch(
            recipe, releases.copy_tree(version, m.members_for(recipe), tmp_path / version / "b"), version
        )
        assert whole == each


# -- failures, with patches written here ---------------------------------------------------------


class MarkedFunction(CstPatch):
    """A well-behaved patch: a module-level function in a block that opens with its marker."""

    REVISION = 3
    TARGET = "srt/server_args.py"
    SGLANG = ">=0.5"
    SUMMARY = "adds a function"
    ANCHORS = {"ServerArgs.check_server_args": anchors.method("ServerArgs", "check_server_args")}
    APPLIED = anchors.module_function("_matrix_marked")

    def transform(self, module: cst.Module) -> cst.Module:
        new = self.parse_statements(module, "def _matrix_marked():\n    return 1\n", blank_lines_before=2)
        return module.with_changes(body=[*module.body, *new])


class MissingAnchor(MarkedFunction):
    """Needs a field no release has."""

    ANCHORS = {"ServerArgs.dynspec_no_such_field": anchors.class_field("ServerArgs", "dynspec_no_such_field")}
    APPLIED = anchors.module_function("_never_added")


class UnmarkedFunction(MarkedFunction):
    """Adds a function with no marker: not recognisably dynspec's."""

    APPLIED = anchors.module_function("_matrix_unmarked")

    def transform(self, module: cst.Module) -> cst.Module:
        new = cst.parse_module("def _matrix_unmarked():\n    return 2\n", config=module.config_for_parsing).body
        return module.with_changes(body=[*module.body, *new])


class EditsALine(MarkedFunction):
    """Changes an original line of SGLang."""

    APPLIED = anchors.class_field("ServerArgs", "dynspec_renamed")

    def transform(self, module: cst.Module) -> cst.Module:
        code = module.code.replace(
            "class ServerArgs:", "class ServerArgs:\n    dynspec_renamed: int = 0  # dynspec: x", 1
        )
        code = code.replace("    def check_server_args(self):", "    def check_server_args(self):  # edited", 1)
        return cst.parse_module(code)


class AlreadyThere(MarkedFunction):
    """Its applied-matcher matches SGLang's own file: upstream, or a matcher that is too loose."""

    APPLIED = anchors.method("ServerArgs", "check_server_args")


class AlreadyThereUpstream(AlreadyThere):
    UPSTREAM = ">=0.5"


class DeclaredUpstream(MarkedFunction):
    SGLANG = "<0.5"
    UPSTREAM = ">=0.5"


class OutOfRange(MarkedFunction):
    SGLANG = "<0.1"


class Crashes(MarkedFunction):
    APPLIED = anchors.module_function("_never_added")

    def transform(self, module: cst.Module) -> cst.Module:
        raise RuntimeError("this release surprised the transform")


TEST_RECIPE = Recipe(
    "matrix-test",
    "",
    ">=0",
    (
        ServerArgsDynspecCheck,
        MissingAnchor,
        MarkedFunction,
        UnmarkedFunction,
        EditsALine,
        AlreadyThere,
        AlreadyThereUpstream,
        DeclaredUpstream,
        OutOfRange,
        Crashes,
    ),
)


@pytest.fixture(scope="module")
def failing() -> m.Matrix:
    return m.run_matrix(TEST_RECIPE, ["0.5.12", "0.5.23"], m.PyPISource(), jobs=2)


def test_each_failure_is_a_cell_naming_its_cause(failing: m.Matrix) -> None:
    for result in failing.results:
        cells = result.cells
        assert cells["server_args_dynspec_check"].state is m.State.OK, "one drifted patch does not hide the others"
        assert cells["MarkedFunction"] == m.Cell(m.State.OK, "+5 lines at 1 place in srt/server_args.py")
        assert cells["MissingAnchor"] == m.Cell(
            m.State.FAIL, "anchor 'ServerArgs.dynspec_no_such_field' not found in srt/server_args.py"
        )
        unmarked = cells["UnmarkedFunction"]
        assert unmarked.state is m.State.FAIL
        assert "outside any block that opens with '# dynspec: UnmarkedFunction r3'" in unmarked.detail
        edited = cells["EditsALine"]
        assert edited.state is m.State.FAIL and "would change original line" in edited.detail
        line = int(edited.detail.split("original line ")[1].split(";")[0])
        original = (
            releases.unpacked(result.version, m.members_for(TEST_RECIPE)) / "sglang/srt/server_args.py"
        ).read_text()
        assert original.splitlines()[line - 1] == "    def check_server_args(self):", "the first changed line"
        assert cells["AlreadyThere"].state is m.State.FAIL
        assert "already matches the patch's applied-matcher" in cells["AlreadyThere"].detail
        assert cells["AlreadyThereUpstream"].state is m.State.UPSTREAM
        assert cells["DeclaredUpstream"] == m.Cell(m.State.UPSTREAM, f"SGLang {result.version} has it (UPSTREAM >=0.5)")
        assert cells["OutOfRange"] == m.Cell(m.State.NOT_APPLICABLE, "for SGLang <0.1")
        assert cells["Crashes"] == m.Cell(
            m.State.FAIL, "the transform raised RuntimeError: this release surprised the transform"
        )
    assert m.exit_code(failing, []) is ExitCode.CHANGES
    assert len(failing.failures()) == 2 * 5


def test_a_crashing_transform_alone_is_a_failing_cell_not_a_crash() -> None:
    recipe = Recipe("crash", "", ">=0", (ServerArgsDynspecCheck, Crashes))
    result = m.check_release("0.5.23", recipe, m.PyPISource())
    assert result.cells["Crashes"].state is m.State.FAIL
    assert "RuntimeError: this release surprised the transform" in result.cells["Crashes"].detail
    assert result.cells["server_args_dynspec_check"].state is m.State.OK


def test_marker_blocks_are_found_where_the_matcher_could_misplace_them() -> None:
    marked = MarkedFunction.marker()
    before = "a\n)\nb\n"
    split = f"a\n{marked}\nx(\n)\n)\nb\n"  # the inserted ")" equals the original line after it
    assert m.blocks_by_patch([MarkedFunction], "t.py", before, split) == (
        None,
        {"MarkedFunction": "+3 lines at 1 place in t.py"},
    )
    blank_inside = f"X\n\n{marked}\ndef f():\n\n    pass\n\nY\n"
    assert m.blocks_by_patch([MarkedFunction], "t.py", "X\n\nY\n", blank_inside)[0] is None
    problem, _ = m.blocks_by_patch([MarkedFunction], "t.py", before, "a\nx(\n)\n)\nb\n")
    assert problem == f"line 2 of the patched t.py is outside any block that opens with {marked!r}"
    problem, _ = m.blocks_by_patch([MarkedFunction, MissingAnchor], "t.py", before, split)
    assert problem == "MissingAnchor added no block of its own to t.py"
    problem, _ = m.blocks_by_patch([MarkedFunction], "t.py", before, f"a\n{marked}\nb\n")
    assert problem == "original line 2 of t.py is changed"


# -- the baseline -----------------------------------------------------------------------------------


def test_a_changed_cell_against_the_baseline_is_a_regression(few: m.Matrix) -> None:
    baseline = m.to_data(few)
    assert m.compare(few, baseline) == []
    baseline["releases"][0]["cells"]["server_args_dynspec_flags_legacy"]["state"] = "n/a"
    del baseline["releases"][1]  # 0.5.13 is then a new release: not a change
    changes = m.compare(few, baseline)
    assert changes == [m.Change("0.5.12", "server_args_dynspec_flags_legacy", "n/a", "ok")]
    assert m.exit_code(few, changes) is ExitCode.CHANGES
    assert m.new_releases(few, baseline) == ["0.5.13"]


def test_the_command_fails_on_a_change_and_update_baseline_records_it(tmp_path: Path) -> None:
    baseline = tmp_path / "matrix.json"
    done = dynspec_matrix("--releases", "0.5.23", "--baseline", str(baseline), "--update-baseline")
    assert done.returncode == 0, done.stderr
    recorded = json.loads(baseline.read_text())
    assert [r["version"] for r in recorded["releases"]] == ["0.5.23"]
    assert recorded["releases"][0]["cells"]["server_args_dynspec_check"]["state"] == "ok"

    recorded["releases"][0]["cells"]["server_args_dynspec_check"]["state"] = "fail"
    baseline.write_text(json.dumps(recorded))
    done = dynspec_matrix("--baseline", str(baseline), "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["exit_code"] == 1
    assert report["baseline"]["changes"] == [
        {"version": "0.5.23", "patch": "server_args_dynspec_check", "was": "fail", "now": "ok"}
    ]
    assert "SGLang 0.5.23:" in done.stderr, "one progress line per release when stderr is not a terminal"

    assert dynspec_matrix("--baseline", str(baseline), "--update-baseline").returncode == 0
    done = dynspec_matrix("--baseline", str(baseline))
    assert done.returncode == 0, done.stderr
    assert "no change against matrix.json" in done.stderr


def test_new_takes_only_releases_newer_than_the_baseline(tmp_path: Path) -> None:
    baseline = tmp_path / "matrix.json"
    baseline.write_text(
        m.dump(
            {"schema": m.SCHEMA, "recipe": "default", "patches": [], "releases": [{"version": "0.5.21", "cells": {}}]}
        )
    )
    done = dynspec_matrix("--new", "--list-releases", "--baseline", str(baseline))
    assert done.returncode == 0, done.stderr
    newer = json.loads(done.stdout)
    assert newer[:2] == ["0.5.22", "0.5.23"], "every PyPI release after 0.5.21, oldest first"
    done = dynspec_matrix("--new", "--list-releases", "--baseline", str(tmp_path / "none.json"))
    assert done.returncode == 2 and "--new compares with the baseline" in done.stderr


def test_a_release_without_a_wheel_is_reported_not_checked(tmp_path: Path) -> None:
    result = m.run_matrix(load_recipe("default"), ["0.0.0"], m.PyPISource(), jobs=1)
    assert result.results[0].cells == {}
    assert result.results[0].error.startswith("no wheel: could not download sglang 0.0.0")
    assert m.exit_code(result, m.compare(result, None)) is ExitCode.OK
    recorded = {"schema": m.SCHEMA, "releases": [{"version": "0.0.0", "cells": {"x": {"state": "ok"}}}]}
    assert m.compare(result, recorded) == [m.Change("0.0.0", "*", "cells", "error")]


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    done = dynspec_matrix("--releases", "bogus")
    assert done.returncode == 2 and "neither a list of versions" in done.stderr
    done = dynspec_matrix("--git", str(tmp_path / "nowhere"))
    assert done.returncode == 2 and "no such directory" in done.stderr
    done = dynspec_matrix("--git", str(tmp_path))
    assert done.returncode == 2 and "not a git repository" in done.stderr


def test_releases_option_takes_a_list_or_a_specifier() -> None:
    available = ["0.5.9", "0.5.10", "0.5.10.post1", "0.5.11", "0.6.0rc1"]
    assert m.select(lambda: available, "0.5.10, 0.5.9", False, None) == ["0.5.9", "0.5.10"]
    assert m.select(lambda: available, ">=0.5.10,<0.5.11", False, None) == ["0.5.10", "0.5.10.post1"]
    baseline = {"releases": [{"version": "0.5.10"}]}
    assert m.select(lambda: available, None, False, baseline) == ["0.5.10"]
    assert m.select(lambda: available, None, True, baseline) == ["0.5.10.post1", "0.5.11"]
    with pytest.raises(UsageError):
        m.select(lambda: available, None, False, None)


def test_pypi_lists_the_sglang_releases() -> None:
    versions = m.PyPISource().versions()
    assert set(RELEASES) <= set(versions)


# -- reports ------------------------------------------------------------------------------------------


def test_json_and_junit_reports_are_valid(tmp_path: Path) -> None:
    done = dynspec_matrix(
        "--releases", "0.5.12,0.5.23", "--baseline", str(tmp_path / "none.json"),
        "--json", str(tmp_path / "r.json"), "--junit-xml", str(tmp_path / "r.xml"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "server_args_dynspec_check" in done.stdout, "the table still goes to stdout"
    report = json.loads((tmp_path / "r.json").read_text())
    assert [r["version"] for r in report["releases"]] == ["0.5.12", "0.5.23"]
    assert report["exit_code"] == 0 and report["failures"] == []
    patches = [p["id"] for p in report["patches"]]
    assert all(set(r["cells"]) == set(patches) for r in report["releases"])

    suites = ET.parse(tmp_path / "r.xml").getroot()
    assert suites.tag == "testsuites"
    assert int(suites.get("tests")) == 2 * len(patches)
    assert suites.get("failures") == "0" and suites.get("errors") == "0"
    na = sum(1 for r in report["releases"] for c in r["cells"].values() if c["state"] == "n/a")
    assert int(suites.get("skipped")) == na
    assert [s.get("name") for s in suites] == ["sglang 0.5.12", "sglang 0.5.23"]


def test_junit_marks_every_failure_with_its_cause(failing: m.Matrix) -> None:
    changes = [m.Change("0.5.12", "MarkedFunction", "n/a", "ok")]
    suites = ET.fromstring(m.junit_xml(failing, changes))
    assert suites.get("tests") == str(2 * len(TEST_RECIPE.patches))
    assert suites.get("failures") == str(2 * 5 + 1)
    assert suites.get("skipped") == str(2 * 3)
    case = suites.find("testsuite[@name='sglang 0.5.12']/testcase[@name='MissingAnchor']")
    assert case is not None
    assert "anchor 'ServerArgs.dynspec_no_such_field' not found" in case.find("failure").get("message")
    changed = suites.find("testsuite[@name='sglang 0.5.12']/testcase[@name='MarkedFunction']/failure")
    assert changed is not None and "changed against the baseline" in changed.get("message")


def test_json_on_stdout_is_the_whole_report(tmp_path: Path) -> None:
    done = dynspec_matrix("--releases", "0.5.23", "--baseline", str(tmp_path / "none.json"), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["releases"][0]["version"] == "0.5.23" and report["source"] == "pypi"
    assert report["baseline"] == {"path": str(tmp_path / "none.json"), "changes": [], "new_releases": ["0.5.23"]}
    assert "no baseline at" in done.stderr


# -- a git clone's tags ----------------------------------------------------------------------------


def test_git_tags_give_the_same_cells_as_pypi(tmp_path: Path, few: m.Matrix) -> None:
    clone = tmp_path / "sglang"
    repo = git.Repo.init(clone)
    recipe = load_recipe("default")
    for version in FEW:
        shutil.rmtree(clone / "python", ignore_errors=True)
        releases.copy_tree(version, m.members_for(recipe), clone / "python")
        repo.git.add("-A")
        repo.index.commit(f"SGLang {version}")
        repo.create_tag(f"v{version}")
    repo.create_tag("gateway-v1.0")  # not a release: ignored
    source = m.open_git(str(clone))
    assert source.versions() == FEW
    result = m.run_matrix(recipe, FEW, source, jobs=2)
    assert states(result) == states(few)
    assert result.source == f"git {clone}"

    done = dynspec_matrix("--git", str(clone), "--releases", ">=0.5.13", "--list-releases")
    assert json.loads(done.stdout) == ["0.5.13", "0.5.23"]


# -- the recorded baseline and the README ---------------------------------------------------------


def test_matrix_json_covers_the_recipe_and_every_release() -> None:
    """matrix.json is current: rerun `dynspec matrix --update-baseline` (and commit) when this fails."""
    baseline = m.load_baseline(m.DEFAULT_BASELINE)
    assert baseline is not None
    recipe = load_recipe(baseline["recipe"])
    assert [(p["id"], p["revision"]) for p in baseline["patches"]] == [(p.id, p.REVISION) for p in recipe.patches]
    assert [r["version"] for r in baseline["releases"]] == RELEASES
    for row in baseline["releases"]:
        for patch in recipe.patches:
            state = row["cells"][patch.id]["state"]
            assert state != "fail", (row["version"], patch.id)
            assert (state == "n/a") == (
                not patch.applies_to(row["version"]) and not patch.provided_upstream(row["version"])
            )


@pytest.mark.releases
def test_matrix_json_is_what_every_release_gives_today() -> None:
    """`dynspec matrix` with no option exits 0 on main: the baseline is the truth."""
    baseline = m.load_baseline(m.DEFAULT_BASELINE)
    result = m.run_matrix(load_recipe(baseline["recipe"]), RELEASES, m.PyPISource())
    assert result.failures() == []
    assert m.compare(result, baseline) == []


def test_readme_table_is_generated_from_matrix_json() -> None:
    """README's supported-releases table is current: run `make docs` when this fails."""
    baseline = m.load_baseline(m.DEFAULT_BASELINE)
    readme = (ROOT / "README.md").read_text()
    assert m.render_readme(readme, baseline) == readme, "README.md is out of date with matrix.json: run `make docs`"
    section = readme[readme.index(m.README_BEGIN) : readme.index(m.README_END)]
    for patch in baseline["patches"]:
        assert f"`{patch['id']}`" in section
    for row in baseline["releases"]:
        assert row["version"] in section


def test_make_docs_rewrites_a_stale_table(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{m.README_BEGIN}\nstale\n{m.README_END}\n\nafter\n")
    entry = [sys.executable, "-m", "patcher.matrix", "--baseline", str(m.DEFAULT_BASELINE), "--readme", str(readme)]
    check = subprocess.run([*entry, "--check"], capture_output=True, text=True, cwd=ROOT)
    assert check.returncode == 1 and "out of date" in check.stderr
    assert subprocess.run(entry, capture_output=True, text=True, cwd=ROOT).returncode == 0
    text = readme.read_text()
    assert "stale" not in text and text.endswith(f"{m.README_END}\n\nafter\n")
    assert "| SGLang |" in text
    assert subprocess.run([*entry, "--check"], capture_output=True, text=True, cwd=ROOT).returncode == 0


def test_an_installed_dynspec_asks_for_the_baseline_instead_of_looking_in_site_packages(tmp_path: Path) -> None:
    """`pip install .` puts no matrix.json anywhere: the command says what to pass, writes nothing."""
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(site), "NO_COLOR": "1"}
    entry = [sys.executable, "-c", "from patcher.matrix.command import matrix; matrix(prog_name='dynspec matrix')"]
    for args, message in (
        ((), "an installed dynspec has no baseline: pass --baseline PATH"),
        (("--releases", "0.5.12", "--update-baseline"), "--update-baseline needs --baseline PATH"),
    ):
        done = subprocess.run([*entry, *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
        assert done.returncode == 2, done.stderr
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not list(site.glob("matrix.json")) and not (site / "README.md").exists()
    with_baseline = subprocess.run(
        [*entry, "--baseline", str(ROOT / "matrix.json"), "--releases", "0.5.12", "--json"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert with_baseline.returncode == 0, with_baseline.stderr
    assert json.loads(with_baseline.stdout)["baseline"]["path"] == str(ROOT / "matrix.json")


# -- the package --------------------------------------------------------------------------------------

PACKAGE = ROOT / "patcher" / "matrix"
FLOORS = ["model", "sources", "check", "baseline", "reports", "readme", "command", "__main__"]  # bottom up


def test_each_module_imports_only_those_below_it() -> None:
    """model at the bottom, command at the top: no import runs back up, so there is no cycle."""
    assert sorted(p.stem for p in PACKAGE.glob("*.py")) == sorted([*FLOORS, "__init__"])
    for floor, module in enumerate(FLOORS):
        used = set(re.findall(r"^\s*from patcher\.matrix\.(\w+) import", (PACKAGE / f"{module}.py").read_text(), re.M))
        assert used <= set(FLOORS[:floor]), module


def test_only_the_command_module_imports_click() -> None:
    importers = sorted(
        p.name for p in PACKAGE.glob("*.py") if re.search(r"^\s*(import click|from click)", p.read_text(), re.M)
    )
    assert importers == ["command.py"]


def test_the_package_hands_on_its_modules_names_imported_on_first_use() -> None:
    """`dynspec` registers the command at every start; that imports the package, not the engine."""
    code = (
        "import sys\n"
        "import patcher.matrix.command\n"
        "print([m for m in ('libcst', 'packaging', 'patcher.registry', 'patcher.matrix.model') if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    assert all(hasattr(m, name) for name in m.__all__)
    assert m.run_matrix.__module__ == "patcher.matrix.check" and m.GLYPH is m.model.GLYPH
    assert not hasattr(m, "Path")  # the modules' own imports are not handed on
