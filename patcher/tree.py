"""The local engine's view of the SGLang tree the user pointed at, and the version to plan for.

Finding the package and reading its versions are ``patcher.treefacts``' rules (the servers run the
same module); here they become dynspec's errors, and ``git describe`` and ``--sglang-version`` join in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from patcher import treefacts
from patcher.errors import NotAnSGLangTree, Refused, UsageError


@dataclass(frozen=True)
class SGLangTree:
    root: Path  # what the user gave, resolved; diff paths are relative to this (or to git's top)
    package_dir: Path  # the ``sglang`` package dir: targets and the state dir live here
    version: str | None
    sources: dict[str, str] = field(default_factory=dict)  # where each version reading came from

    def describe_version(self) -> str:
        return self.version or "unknown"


def locate(spec: str) -> SGLangTree:
    """Resolve ``--sglang`` to an SGLang tree, or raise a one-line error naming the problem."""
    try:
        found = treefacts.locate(spec)
    except treefacts.NotATree as error:
        raise NotAnSGLangTree(error.path, error.why) from None
    except treefacts.NothingImportable as error:
        raise UsageError(str(error)) from None
    sources = treefacts.read_versions(found.package_dir)
    return SGLangTree(Path(found.root), Path(found.package_dir), treefacts.pick_version(sources), sources)


def disagreement(sources: dict[str, str]) -> str | None:
    """A sentence when the version sources disagree, naming each, else None."""
    if len(set(sources.values())) <= 1:
        return None
    return "version sources disagree: " + ", ".join(f"{k} says {v}" for k, v in sources.items())


def version_from_describe(described: str) -> str:
    """``v0.5.12-3-gabc123`` → ``0.5.12``: the release the checkout is at or after."""
    return re.sub(r"-\d+-g[0-9a-f]+$", "", described).lstrip("v")


@dataclass
class Chosen:
    version: str
    notes: list[str]  # version sources that disagree; an override
    override: str | None  # the note when --sglang-version is not what the tree says it is


def choose_version(sources: dict[str, str], given: str | None, described: str | None, where: str) -> Chosen:
    """The version to plan for: ``--sglang-version``, else the tree's files, else ``git describe``."""
    sources = dict(sources)
    if described:
        sources["git describe"] = version_from_describe(described)
    notes = []
    clash = disagreement(sources)
    if clash:
        notes.append(clash)
    detected = treefacts.pick_version(sources) or sources.get("git describe")
    version = given or detected
    if version is None:
        raise Refused(f"cannot tell the SGLang version of {where}; pass --sglang-version")
    override = None
    if given and detected and given != detected:
        override = f"the tree says it is SGLang {detected}; --sglang-version {given} overrides that"
        notes.append(override)
    return Chosen(version, notes, override)
