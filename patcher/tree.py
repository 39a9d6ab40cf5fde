"""Find the SGLang package inside what the user pointed at, and tell its version.

Accepted: a git checkout root (``python/sglang/srt``), its ``python/`` dir, an installed package dir
(``site-packages/sglang``), or ``auto`` for the ``sglang`` the current Python would import. Nothing
here imports or runs code from the tree: versions are read from the files as text.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from patcher import txn
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
    if spec == "auto":
        found = importlib.util.find_spec("sglang")
        if found is None or not found.submodule_search_locations:
            raise UsageError("--sglang auto: no 'sglang' package is importable by this Python")
        package_dir = Path(next(iter(found.submodule_search_locations))).resolve()
        root = package_dir
    else:
        try:
            root = Path(spec).expanduser().resolve()
        except (OSError, RuntimeError) as error:  # RuntimeError: a link loop (Python < 3.13)
            raise NotAnSGLangTree(spec, f"cannot resolve it ({error})") from None
        if not root.exists():
            raise NotAnSGLangTree(spec, "no such directory")
        if not root.is_dir():
            raise NotAnSGLangTree(spec, "not a directory")
        candidates = [root / "python" / "sglang", root / "sglang", root]
        located = next((c for c in candidates if (c / "srt").is_dir() and (c / "__init__.py").exists()), None)
        if located is None:
            raise NotAnSGLangTree(
                spec, "expected python/sglang/srt (checkout), sglang/srt (python/) or srt/ (package dir)"
            )
        package_dir = located
    server_args = package_dir / "srt" / "server_args.py"
    if not server_args.is_file():
        why = "is not a regular file" if os.path.lexists(server_args) else "is missing"
        raise NotAnSGLangTree(str(package_dir), f"srt/server_args.py {why}")
    sources = read_versions(package_dir)
    return SGLangTree(root=root, package_dir=package_dir, version=pick_version(sources), sources=sources)


_VERSION_ASSIGN = re.compile(r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", re.M)


def _version_from_file(path: Path) -> str | None:
    data = txn.read_bytes(str(path), limit=1 << 20)  # never blocks on a FIFO, never reads a huge file
    try:
        text = "" if data is None else data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    match = _VERSION_ASSIGN.search(text)
    if match:
        return match.group(1)
    try:  # fall back to the AST for unusual spellings; never executed
        for node in ast.parse(text).body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Constant)
                and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
            ):
                return str(node.value.value)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return None


def read_versions(package_dir: Path) -> dict[str, str]:
    """Every place that states a version, without importing anything."""
    sources: dict[str, str] = {}
    for name in ("_version.py", "version.py"):
        found = _version_from_file(package_dir / name)
        if found:
            sources[name] = found
    for dist_info in sorted(package_dir.parent.glob("sglang-*.dist-info")):
        metadata = txn.read_bytes(str(dist_info / "METADATA"))
        if metadata is not None:
            match = re.search(r"^Version:\s*(\S+)", metadata.decode("utf-8", errors="replace"), re.M)
            if match:
                sources[dist_info.name] = match.group(1)
    return sources


def pick_version(sources: dict[str, str]) -> str | None:
    """The package's own files win over dist-info; ``git describe`` is added by the caller."""
    for key in ("_version.py", "version.py"):
        if key in sources:
            return sources[key]
    for key, value in sources.items():
        if key.endswith(".dist-info"):
            return value
    return None


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
    detected = pick_version(sources) or sources.get("git describe")
    version = given or detected
    if version is None:
        raise Refused(f"cannot tell the SGLang version of {where}; pass --sglang-version")
    override = None
    if given and detected and given != detected:
        override = f"the tree says it is SGLang {detected}; --sglang-version {given} overrides that"
        notes.append(override)
    return Chosen(version, notes, override)
