"""Find the patches in ``patches/`` and the ordered series in ``recipes/*.toml``."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from dataclasses import dataclass
from functools import cache
from importlib import resources

from packaging.specifiers import SpecifierSet

from patcher.errors import Refused, UsageError
from patcher.patch import CstPatch, NewFilePatch, Patch, version_in

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

    def supports(self, version: str) -> bool:
        """The series is verified on SGLang ``version``."""
        return version_in(self.sglang, version)

    def refuse_unsupported(self, version: str, force: bool) -> str | None:
        """Refuse (exit 4) a release the series is not verified on, unless ``force``; then the note
        to show. None when the release is supported."""
        if self.supports(version):
            return None
        message = f"SGLang {version} is not a release recipe {self.name!r} supports ({self.sglang})"
        if not force:
            raise Refused(f"{message}; --force tries anyway")
        return f"{message}; going ahead because of --force"


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
    patches = tuple(known[p] for p in data["patches"])
    check_requirements(name, patches)
    return Recipe(
        name=name,
        description=data.get("description", ""),
        sglang=data["sglang"],
        patches=patches,
    )


def check_requirements(name: str, patches: tuple[type[Patch], ...]) -> None:
    """Refuse a recipe in which a patch comes before, or without, a patch it ``REQUIRES``.

    A requirement binds only on releases where both patches apply. Their ranges are bounds (``>=``,
    ``<``, ``<=``): if they meet, they meet at the higher lower bound, or at "0" if neither has one.
    """
    by_id = {**all_patches(), **{patch.id: patch for patch in patches}}
    place = {patch.id: number for number, patch in enumerate(patches, 1)}
    for number, patch in enumerate(patches, 1):
        for required_id in patch.REQUIRES:
            required = by_id.get(required_id)
            if required is None:
                raise RuntimeError(f"recipe {name!r}: {patch.id} requires {required_id}, which is no patch")
            named = {"0", *(spec.version for p in (patch, required) for spec in SpecifierSet(p.SGLANG))}
            if not any(patch.applies_to(v) and required.applies_to(v) for v in named):
                continue
            stands = place.get(required_id)
            if stands is None or stands > number:
                where = "is not in the recipe" if stands is None else f"stands at patch {stands}"
                raise RuntimeError(
                    f"recipe {name!r}: {patch.id} (patch {number}) requires {required_id} before it, which {where}"
                )
