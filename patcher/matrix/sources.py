"""Where a release's files come from (a wheel on PyPI, or a tag of a git clone), and which releases to check."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from patcher import releases
from patcher.errors import Refused, UsageError

# -- where releases come from ---------------------------------------------------------------------


class SourceError(Exception):
    """This release's files cannot be had (no wheel, no tag); the release gets an error row."""


@dataclass(frozen=True)
class PyPISource:
    """Releases of the ``sglang`` project on PyPI, through pip (so pip's own index settings apply)."""

    def describe(self) -> str:
        return "pypi"

    def versions(self) -> list[str]:
        command = [sys.executable, "-m", "pip", "index", "versions", "sglang", "--disable-pip-version-check"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise Refused(f"could not list SGLang releases on PyPI: {error}") from None
        match = re.search(r"^Available versions:\s*(.+)$", done.stdout, re.M)
        if done.returncode != 0 or match is None:
            why = (done.stderr.strip().splitlines() or ["pip index versions sglang printed no versions"])[-1]
            raise Refused(f"could not list SGLang releases on PyPI: {why}")
        return [v.strip() for v in match.group(1).split(",") if v.strip()]

    def materialize(self, version: str, members: Sequence[str], dest: Path) -> Path:
        try:
            return releases.copy_tree(version, members, dest)
        except RuntimeError as error:  # pip found no wheel for this release
            raise SourceError(f"no wheel: {error}") from None


@dataclass(frozen=True)
class GitSource:
    """Releases as the tags of a git clone of SGLang (``v0.5.12`` or ``0.5.12``)."""

    repo: str  # a local git dir (work tree or bare)
    origin: str  # what the user passed: a path or a URL
    tags: tuple[tuple[str, str], ...] = ()  # (version, tag name), filled by ``open_git``

    def describe(self) -> str:
        return f"git {self.origin}"

    def versions(self) -> list[str]:
        return [version for version, _ in self.tags]

    def materialize(self, version: str, members: Sequence[str], dest: Path) -> Path:
        from patcher import checkout  # GitPython costs 0.1 s to import; only a git source pays it

        tag = dict(self.tags).get(version)
        if tag is None:
            raise SourceError(f"no tag for {version} in {self.origin}")
        prefix = "python/sglang" if checkout.has_dir(self.repo, tag, "python/sglang/srt") else "sglang"
        wanted = {
            f"{prefix}/{m.split('/', 1)[1]}": m.split("/", 1)[1]
            for m in {*releases.BASE_MEMBERS, *(f"sglang/{m}" for m in members)}
        }
        package = dest / "sglang"
        for path, data in checkout.files_at(self.repo, tag, wanted).items():
            target = package / wanted[path]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        if not (package / "srt" / "server_args.py").is_file():
            raise SourceError(f"tag {tag} of {self.origin} has no {prefix}/srt/server_args.py")
        return package


def open_git(path_or_url: str) -> GitSource:
    """A local clone as is, or a URL cloned (bare, once) into the cache and fetched on later runs."""
    from patcher import checkout

    try:
        git_dir, tag_names = checkout.open_repository(path_or_url, releases.cache_dir())
    except checkout.GitSourceError as error:
        raise (UsageError if error.usage else Refused)(str(error)) from None
    tags: dict[str, str] = {}
    for name in tag_names:
        version = _tag_version(name)
        if version is not None:
            tags.setdefault(version, name)
    ordered = tuple(sorted(tags.items(), key=lambda item: Version(item[0])))
    return GitSource(repo=git_dir, origin=path_or_url, tags=ordered)


def _tag_version(name: str) -> str | None:
    """``v0.5.12`` or ``0.5.12`` → ``0.5.12``; any other tag → None."""
    text = name[1:] if name.startswith("v") else name
    try:
        return str(Version(text)) if text[:1].isdigit() else None
    except InvalidVersion:
        return None


# -- which releases ------------------------------------------------------------------------------


def parse_releases(text: str) -> list[str] | SpecifierSet:
    """``--releases``: a list of versions (``0.5.12,0.5.13``) or a PEP 440 specifier (``>=0.5.4``)."""
    tokens = [t for t in re.split(r"[,\s]+", text.strip()) if t]
    if tokens and all(t[:1].isdigit() for t in tokens):
        try:
            return [str(Version(t)) for t in tokens]
        except InvalidVersion as error:
            raise UsageError(f"--releases {text!r}: {error}") from None
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise UsageError(
            f"--releases {text!r} is neither a list of versions (0.5.12,0.5.13) nor a specifier (>=0.5.4)"
        ) from None


def select(
    available: Callable[[], list[str]],
    releases_option: str | None,
    new: bool,
    baseline: dict[str, Any] | None,
) -> list[str]:
    """The releases to check, oldest first.

    Default: the baseline's releases. ``--releases``: those versions, or the available releases the
    specifier admits. ``--new``: of those, only releases newer than the newest in the baseline.
    """
    recorded = [r["version"] for r in (baseline or {}).get("releases", [])]
    if releases_option is not None:
        wanted = parse_releases(releases_option)
        chosen = list(wanted.filter(available())) if isinstance(wanted, SpecifierSet) else wanted
    elif new:
        chosen = available()
    elif recorded:
        chosen = recorded
    else:
        raise UsageError("no baseline to take the releases from; pass --releases (e.g. '>=0.4.10.post2')")
    if new:
        if not recorded:
            raise UsageError("--new compares with the baseline's newest release, and there is no baseline")
        newest = max(Version(v) for v in recorded)
        chosen = [v for v in chosen if Version(v) > newest and not Version(v).is_prerelease]
    return sorted(set(chosen), key=Version)
