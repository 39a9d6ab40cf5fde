"""The only module that imports git: what a git checkout says about an SGLang tree."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
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


class GitSourceError(Exception):
    """A repository given to ``dynspec matrix --git`` cannot be read; ``usage`` tells whose fault."""

    def __init__(self, message: str, usage: bool) -> None:
        super().__init__(message)
        self.usage = usage


def open_repository(path_or_url: str, cache: Path) -> tuple[str, list[str]]:
    """A local clone as is, or a URL cloned (bare, once) under ``cache`` and fetched on later runs.

    Returns the git dir and every tag name.
    """
    is_url = "://" in path_or_url or re.match(r"^[\w.-]+@[\w.-]+:", path_or_url) is not None
    local = Path(path_or_url).expanduser()
    if not is_url and not local.is_dir():
        raise GitSourceError(f"--git {path_or_url}: no such directory", usage=True)
    try:
        if not is_url:
            repo = git.Repo(local, search_parent_directories=False)
        else:
            clone = cache / "git" / hashlib.sha256(path_or_url.encode()).hexdigest()[:16]
            if clone.exists():
                repo = git.Repo(clone)
                repo.git.fetch("--tags", "--force", "origin")
            else:
                clone.parent.mkdir(parents=True, exist_ok=True)
                repo = git.Repo.clone_from(path_or_url, clone, bare=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise GitSourceError(f"--git {path_or_url}: not a git repository", usage=True) from None
    except git.GitCommandError as error:
        why = str(error.stderr).strip().removeprefix("stderr:").strip(" '\n") or str(error)
        raise GitSourceError(f"--git {path_or_url}: git failed: {why}", usage=False) from None
    return str(repo.git_dir), [tag.name for tag in repo.tags]


def files_at(git_dir: str, revision: str, paths: Iterable[str]) -> dict[str, bytes]:
    """The bytes of each of ``paths`` that exists as a file at ``revision``."""
    tree = git.Repo(git_dir).commit(revision).tree
    found: dict[str, bytes] = {}
    for path in paths:
        try:
            item = tree / path
        except KeyError:
            continue
        if item.type == "blob":
            found[path] = item.data_stream.read()
    return found


def has_dir(git_dir: str, revision: str, path: str) -> bool:
    try:
        git.Repo(git_dir).commit(revision).tree / path
        return True
    except KeyError:
        return False
