"""The only module that imports git: what a git checkout says about an SGLang tree."""

from __future__ import annotations

import re
from pathlib import Path

import git


def _repo(path: Path) -> git.Repo | None:
    try:
        return git.Repo(path, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return None


def toplevel(path: Path) -> Path | None:
    """The work tree root of the git checkout holding ``path``, if any."""
    repo = _repo(path)
    return Path(repo.working_tree_dir).resolve() if repo is not None and repo.working_tree_dir else None


def describe(package_dir: Path) -> str | None:
    """``git describe --tags`` for a checkout that tracks the package, else None."""
    repo = _repo(package_dir)
    if repo is None or repo.working_tree_dir is None:
        return None
    try:
        rel = package_dir.resolve().relative_to(Path(repo.working_tree_dir).resolve())
        if not repo.git.ls_files("--", str(rel / "srt" / "server_args.py")):
            return None  # e.g. site-packages that happens to sit inside some other repository
        return str(repo.git.describe("--tags"))
    except (git.GitCommandError, ValueError):
        return None


def version_from_describe(described: str) -> str:
    """``v0.5.12-3-gabc123`` → ``0.5.12``: the release the checkout is at or after."""
    return re.sub(r"-\d+-g[0-9a-f]+$", "", described).lstrip("v")


def is_dirty(path: Path) -> bool:
    repo = _repo(path)
    return bool(repo is not None and repo.is_dirty(untracked_files=True))
