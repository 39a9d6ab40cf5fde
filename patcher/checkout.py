"""The only module that imports GitPython: SGLang's own clones for `dynspec matrix --git`.

What a checkout says about a tree being patched (its top, ``git describe``) is asked by
``treefacts.git_facts`` instead, with every program git could run from that tree's config off.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

import git

from patcher.treefacts import SAFE_GIT_CONFIG


def _safe(repo: git.Repo) -> git.Repo:
    """The same switches as every other git dynspec runs: nothing the clone's config names is run."""
    repo.git.set_persistent_git_options(c=list(SAFE_GIT_CONFIG))
    return repo


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
            repo = _safe(git.Repo(local, search_parent_directories=False))
        else:
            clone = cache / "git" / hashlib.sha256(path_or_url.encode()).hexdigest()[:16]
            if clone.exists():
                repo = _safe(git.Repo(clone))
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
    tree = _safe(git.Repo(git_dir)).commit(revision).tree
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
        _safe(git.Repo(git_dir)).commit(revision).tree / path
        return True
    except KeyError:
        return False
