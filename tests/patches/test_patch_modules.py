"""No patch imports another: what patches share lives in ``patcher.anchors`` or a shared ``patches/_*.py``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import patches
from patcher.registry import all_patches

PATCHES = Path(next(iter(patches.__path__)))


def patch_modules_imported(source: str) -> set[str]:
    """The patch modules (by id) that ``source``, a module of ``patches/``, imports."""
    ids = set(all_patches())
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            package = "patches" if node.level else ""  # a relative import stays in patches/
            module = ".".join(part for part in (package, node.module or "") if part)
            names = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if len(parts) > 1 and parts[0] == "patches" and parts[1] in ids:
                imported.add(parts[1])
    return imported


@pytest.mark.parametrize("path", sorted(PATCHES.glob("*.py")), ids=lambda path: path.name)
def test_no_patch_module_imports_another(path: Path) -> None:
    assert patch_modules_imported(path.read_text(encoding="utf-8")) == set()


def test_imports_of_patch_modules_are_found() -> None:
    source = """\
from patches.eagle_worker_v2_dynspec_fallback import WORKER
import patches.server_args_dynspec_flags
from patches import spec_fields_dynspec_flags
from . import speculative_dynspec_v2
from .piecewise_graph_dynspec_prefill import DECLARE
from patches._flags import FLAGS
from patches._eagle_worker_v2 import ENTRY
from patches.runtime import dynspec_v2
from patcher.anchors import calls

def late():
    from patches.speculative_dynspec_runtime import SpeculativeDynspecRuntime
"""
    assert patch_modules_imported(source) == {
        "eagle_worker_v2_dynspec_fallback",
        "server_args_dynspec_flags",
        "spec_fields_dynspec_flags",
        "speculative_dynspec_v2",
        "piecewise_graph_dynspec_prefill",
        "speculative_dynspec_runtime",
    }
