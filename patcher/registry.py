"""Find the patches in ``patches/`` and the ordered series in ``recipes/*.toml``."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from dataclasses import dataclass
from functools import cache
from importlib import resources

from patcher.errors import UsageError
from patcher.patch import CstPatch, NewFilePatch, Patch

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on the GPU servers' older Pythons
    import tomli as tomllib


@cache
def all_patches() -> dict[str, type[Patch]]:
    """Every patch class in the ``patches`` package, by id (its module name)."""
    import patches

    found: dict[str, type[Patch]] = {}
    for info in pkgutil.iter_modules(patches.__path__):
        if info.ispkg or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"patches.{info.name}")
        classes = [
            value
            for value in vars(module).values()
            if isinstance(value, type)
            and issubclass(value, Patch)
            and value not in (Patch, CstPatch, NewFilePatch)
            and value.__module__ == module.__name__
        ]
        if len(classes) != 1:
            raise RuntimeError(f"patches/{info.name}.py must define exactly one patch class, found {len(classes)}")
        found[info.name] = classes[0]
    return found


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    sglang: str  # the releases this series is verified on; others need --force
    patches: tuple[type[Patch], ...]


def recipe_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("recipes").iterdir() if p.name.endswith(".toml"))


@cache
def load_recipe(name: str) -> Recipe:
    path = resources.files("recipes") / f"{name}.toml"
    if not path.is_file():
        raise UsageError(f"no recipe named {name!r}; known: {', '.join(recipe_names())}")
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    known = all_patches()
    missing = [p for p in data["patches"] if p not in known]
    if missing:
        raise RuntimeError(f"recipe {name!r} names unknown patches: {', '.join(missing)}")
    return Recipe(
        name=name,
        description=data.get("description", ""),
        sglang=data["sglang"],
        patches=tuple(known[p] for p in data["patches"]),
    )
