"""patcher/remote/: its modules' floors, the one module with click, and nothing outside leaning on it.

Read from the sources (imports inside functions count too), so these run without ssh; each check
has a control that shows it finds the import it is there to find.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import patcher.remote as face
from tests.conftest import ROOT

PACKAGE = ROOT / "patcher" / "remote"
FLOORS = ["applier", "client", "bundle", "command"]  # bottom up
# Who may import patcher.remote: the package itself and the front door that registers its commands.
ALLOWED_OUTSIDE = ("patcher/cli.py",)


def imported(source: str) -> Iterator[str]:
    """Every dotted name an import of ``source`` brings in: ``from a import b`` gives ``a`` and ``a.b``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            yield node.module or ""
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def floors_used(source: str) -> set[str]:
    """The modules of patcher/remote/ that ``source`` imports."""
    return {name.split(".")[2] for name in imported(source) if name.startswith("patcher.remote.")} & set(FLOORS)


def climbs(module: str, source: str) -> set[str]:
    """What ``source``, as the module ``module`` of the package, imports from its own floor or above."""
    return floors_used(source) - set(FLOORS[: FLOORS.index(module)])


def imports_click(source: str) -> bool:
    return any(name.split(".")[0] == "click" for name in imported(source))


def imports_remote(source: str) -> bool:
    return any(name == "patcher.remote" or name.startswith("patcher.remote.") for name in imported(source))


def test_each_module_imports_only_those_below_it() -> None:
    """applier at the bottom (it imports none: it is shipped), command at the top: no import runs back up."""
    assert sorted(p.stem for p in PACKAGE.glob("*.py")) == sorted([*FLOORS, "__init__"])
    for module in FLOORS:
        assert climbs(module, (PACKAGE / f"{module}.py").read_text(encoding="utf-8")) == set(), module
    # the control: an import up, at the top of a module or inside a function, in either spelling
    assert climbs("client", "from patcher.remote.bundle import build\n") == {"bundle"}
    assert climbs("applier", "def f():\n    from patcher.remote import client\n") == {"client"}
    assert climbs("bundle", "import patcher.remote.command\n") == {"command"}
    assert climbs("command", "from patcher.remote import bundle, client\n") == set()


def test_only_the_command_module_imports_click() -> None:
    importers = sorted(p.name for p in PACKAGE.glob("*.py") if imports_click(p.read_text(encoding="utf-8")))
    assert importers == ["command.py"]
    assert imports_click("def f():\n    from click import echo\n")  # the control
    assert not imports_click("from patcher.options import diff_options\n")


def test_nothing_outside_the_package_but_the_front_door_imports_it() -> None:
    """The engine knows no tool: session, checkout and the rest take the tree's facts from treefacts and txn."""
    outside = [
        p
        for folder in ("patcher", "patches", "benchmarks", "scripts")
        for p in (ROOT / folder).rglob("*.py")
        if PACKAGE not in p.parents
    ]
    importers = sorted(str(p.relative_to(ROOT)) for p in outside if imports_remote(p.read_text(encoding="utf-8")))
    assert importers == list(ALLOWED_OUTSIDE)
    # the controls: each spelling of an import of the package or one of its modules is found
    for source in (
        "from patcher import remote\n",
        "import patcher.remote\n",
        "def f():\n    from patcher.remote.applier import MARK\n",
        "from patcher.remote import client\n",
    ):
        assert imports_remote(source), source
    assert not imports_remote("from patcher import render, treefacts\nimport patcher.remotely\n")


def test_the_face_hands_on_names_and_the_command_imports_no_engine() -> None:
    """`dynspec` registers the commands at every start: that imports click, not libcst or the engine."""
    code = "import sys, patcher.remote.command; print(sorted(m for m in sys.modules if m.startswith(('patcher', 'libcst'))))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(
        ["patcher", "patcher.faces", "patcher.options", "patcher.remote", "patcher.remote.command"]
    )
    from patcher.remote import bundle, client

    for name in face.__all__:
        assert getattr(face, name) is vars(client).get(name, vars(bundle).get(name)), name
    assert face.Ssh.__module__ == "patcher.remote.client" and face.build.__module__ == "patcher.remote.bundle"
    assert list(face.SHIPPED) == ["dynspec_txn", "dynspec_treefacts", "dynspec_applier"]  # the servers' names
    with pytest.raises(AttributeError):
        face.Path  # noqa: B018 - the modules' own imports are not handed on


def test_the_shipped_names_and_the_bundle_layout_are_the_servers(tmp_path: Path) -> None:
    """Servers see what they saw: the same module names, and a zipapp of the same members."""
    from patcher.remote import bundle

    sources = face.shipped_sources()
    assert sources["dynspec_applier"] == (PACKAGE / "applier.py").read_text(encoding="utf-8")
    assert sources["dynspec_treefacts"] == (ROOT / "patcher" / "treefacts.py").read_text(encoding="utf-8")
    data = bundle.archive({"files": {}})
    (tmp_path / "plan.pyz").write_bytes(data)
    with zipfile.ZipFile(tmp_path / "plan.pyz") as zf:
        names = zf.namelist()
    assert names == ["__main__.py", "dynspec_txn.py", "dynspec_treefacts.py", "dynspec_applier.py", "plan.json"]
