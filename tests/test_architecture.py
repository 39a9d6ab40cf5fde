"""The house's rooms and the one direction of its imports (ARCHITECTURE.md), read from the code.

Every module of ``patcher/`` and ``patches/`` belongs to one room; an import of dynspec's own code
is allowed only along the arrows below. Imports of the standard library and of third-party
packages are not judged here (the shipped modules' "standard library only" is: the remote tests
import them on a bare interpreter, the settings test reads its imports).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import ROOT

TOOLS = ("matrix", "remote", "proof", "real")
# Shipped to servers beside dynspec_applier and run there by a bare python: they import each other only.
SHIPPED = ("patcher/txn.py", "patcher/treefacts.py")
PATCH_API = ("patcher/patch.py", "patcher/anchors.py", "patcher/errors.py")
FRONT_DOOR = ("patcher/cli.py", "patcher/__main__.py")

# room -> the rooms it may import from (its own always)
ALLOWED: dict[str, set[str]] = {
    "runtime": set(),  # runs inside SGLang: dynspec's other code is not there
    "shipped": set(),
    "patch API": set(),
    "series": {"patch API", "runtime"},  # runtime: constants of the shipped modules, read as Python
    "engine": {"patch API", "shipped", "series package"},  # the series as a whole, never one patch
    "front door": {"engine", "patch API", "shipped", "series package", *(f"tool {t}" for t in TOOLS)},
    **{f"tool {t}": {"engine", "patch API", "shipped", "series package"} for t in TOOLS},
}


def room_of(path: str) -> str:
    """The room of a repo-relative path of a module (or package ``__init__``) of dynspec."""
    if path.startswith("patches/runtime/"):
        return "runtime"
    if path == "patches/__init__.py":
        return "series package"
    if path.startswith("patches/"):
        return "series"
    for tool in TOOLS:
        if path.startswith(f"patcher/{tool}/") or path == f"patcher/{tool}.py":
            return f"tool {tool}"
    if path in SHIPPED:
        return "shipped"
    if path in PATCH_API:
        return "patch API"
    if path in FRONT_DOOR:
        return "front door"
    return "engine"


def module_path(module: str) -> str | None:
    """The repo-relative file of a dotted module of dynspec, None for anything else."""
    if module.split(".")[0] not in ("patcher", "patches"):
        return None
    base = ROOT / Path(*module.split("."))
    if (base / "__init__.py").exists():
        return str((base / "__init__.py").relative_to(ROOT))
    if base.with_suffix(".py").exists():
        return str(base.with_suffix(".py").relative_to(ROOT))
    return None


def imported_modules(source: str, module: str) -> Iterator[str]:
    """Every module ``source`` (the text of ``module``) imports, relative imports resolved;
    ``from package import name`` imports ``package.name`` where that is a module, else ``package``."""
    package = module if module.endswith("__init__") else module.rpartition(".")[0]
    package = package.removesuffix(".__init__")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                yield f"{base}.{alias.name}" if module_path(f"{base}.{alias.name}") else base


def wrong_imports(path: str, source: str) -> list[str]:
    """The imports of the module at ``path`` that go where its room may not."""
    room = room_of(path)
    module = path.removesuffix(".py").replace("/", ".")
    wrong = []
    for imported in imported_modules(source, module):
        target = module_path(imported)
        if target is None or target == path:
            continue
        other = room_of(target)
        if other != room and other not in ALLOWED[room]:
            wrong.append(f"{path} ({room}) imports {imported} ({other})")
    return sorted(set(wrong))


def dynspec_modules() -> list[Path]:
    return sorted([*(ROOT / "patcher").rglob("*.py"), *(ROOT / "patches").rglob("*.py")])


def test_every_import_of_dynspec_code_runs_down_the_house() -> None:
    wrong = [
        w for p in dynspec_modules() for w in wrong_imports(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8"))
    ]
    assert wrong == []


def test_the_tools_import_no_other_tool_and_the_engine_no_tool() -> None:
    for room, allowed in ALLOWED.items():
        if room != "front door":
            assert not {r for r in allowed if r.startswith("tool ")}, room


def test_a_wrong_import_is_named() -> None:
    """The controls: an import up, across the tools, into one patch, or out of the runtime is found."""
    assert wrong_imports("patcher/engine.py", "from patcher.matrix import run_matrix\n") == [
        "patcher/engine.py (engine) imports patcher.matrix (tool matrix)"
    ]
    assert wrong_imports("patcher/proof/run.py", "from patcher import session\n") == []  # the engine: allowed
    assert wrong_imports("patcher/proof/run.py", "import patcher.matrix.model\n") == [
        "patcher/proof/run.py (tool proof) imports patcher.matrix.model (tool matrix)"
    ]
    assert wrong_imports("patcher/registry.py", "from patches import speculative_dynspec_v2\n") == [
        "patcher/registry.py (engine) imports patches.speculative_dynspec_v2 (series)"
    ]
    assert wrong_imports(
        "patches/speculative_dynspec_v2.py", "def f():\n    from patcher.session import Session\n"
    ) == ["patches/speculative_dynspec_v2.py (series) imports patcher.session (engine)"]
    assert wrong_imports("patches/runtime/dynspec_v2.py", "from ..registry import x\nfrom patcher import engine\n") == [
        "patches/runtime/dynspec_v2.py (runtime) imports patcher.engine (engine)"
    ]
    assert wrong_imports("patcher/txn.py", "from patcher.errors import UsageError\n") == [
        "patcher/txn.py (shipped) imports patcher.errors (patch API)"
    ]
    # relative imports resolve: the runtime's own sibling is its room
    assert wrong_imports("patches/runtime/dynspec_v2.py", "from .dynspec_settings import FLAG\n") == []


def test_every_module_has_a_room_and_architecture_md_names_them() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    rooms = {room_of(str(p.relative_to(ROOT))) for p in dynspec_modules()}
    assert rooms == set(ALLOWED) | {"series package"}
    for room in ALLOWED:
        assert f"**{room}**" in text, room
