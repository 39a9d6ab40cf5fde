"""Where the SGLang package is, how it is laid out, which release it says it is, and what its git
checkout says about it.

Standard library only, Python >= 3.9: `dynspec remote` and `dynspec bundle` ship this module to
servers (as ``dynspec_treefacts``, next to ``dynspec_txn``), and `dynspec proof` reads the SGLang
under test with it. Nothing here imports or runs code from the tree: versions are read as text, and
git runs with every program the tree's config could name switched off (``SAFE_GIT_CONFIG``).

``--sglang`` names a directory in one of the ``LAYOUTS`` (a checkout root, its ``python/`` dir or a
site dir, the package dir itself) or is ``auto``: the ``sglang`` this Python would import.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ == "patcher":
    from patcher import txn
else:  # on a server: shipped next to this module
    import dynspec_txn as txn  # type: ignore[import-not-found, no-redef]  # exists only there

# Where the package dir sits below the directory named, shallowest first: a directory that is itself
# the package is never taken for one nested inside it.
LAYOUTS = (("package dir", ""), ("python/", "sglang"), ("checkout", "python/sglang"))
EXPECTED = "expected python/sglang/srt (checkout), sglang/srt (python/) or srt/ (package dir)"
AUTO = "auto"  # the layout of ``--sglang auto``
SERVER_ARGS = "srt/server_args.py"  # every release has it; patched or not
NOTHING_IMPORTABLE = "--sglang auto: no 'sglang' package is importable by this Python"

VERSION_FILES = ("_version.py", "version.py")  # in the package dir; the first that states one wins
READ_LIMIT = 1 << 20  # version files and METADATA are small; never read a huge file, never block on a FIFO
_VERSION_ASSIGN = re.compile(r"""^__version__\s*=\s*(?:\w+\s*=\s*)*['"]([^'"]+)['"]""", re.M)
_METADATA_VERSION = re.compile(r"^Version:\s*(\S+)", re.M)


class NotATree(Exception):
    """``path`` holds no SGLang package; ``why`` says what is missing."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path} is not an SGLang tree: {why}")
        self.path, self.why = path, why


class NothingImportable(Exception):
    """``--sglang auto`` on a Python that has no ``sglang`` to import."""

    def __init__(self) -> None:
        super().__init__(NOTHING_IMPORTABLE)


@dataclass(frozen=True)
class Located:
    root: str  # what was named, resolved (for auto: the package dir)
    package_dir: str  # the ``sglang`` package dir: it holds srt/
    layout: str  # a name from LAYOUTS, or AUTO


def locate(spec: str) -> Located:
    """Resolve ``--sglang``: a directory (see LAYOUTS) or ``auto``; raises NotATree or NothingImportable."""
    if spec == AUTO:
        package_dir = package_among(importable_locations())
        return Located(package_dir, package_dir, AUTO)
    return locate_path(spec)


def locate_path(spec: str) -> Located:
    """The package dir in the directory ``spec``, by LAYOUTS; ``auto`` is a directory name here."""
    try:
        root = str(Path(spec).expanduser().resolve())
    except (OSError, RuntimeError) as error:  # RuntimeError: a link loop (Python < 3.13)
        raise NotATree(spec, f"cannot resolve it ({error})") from None
    if not os.path.exists(root):
        raise NotATree(spec, "no such directory")
    if not os.path.isdir(root):
        raise NotATree(spec, "not a directory")
    for layout, below in LAYOUTS:
        candidate = os.path.join(root, below) if below else root
        if os.path.isdir(os.path.join(candidate, "srt")) and os.path.exists(os.path.join(candidate, "__init__.py")):
            check_package(candidate)
            return Located(root, candidate, layout)
    raise NotATree(spec, EXPECTED)


def check_package(package_dir: str) -> None:
    """Raise NotATree, naming the package dir, unless srt/server_args.py is a regular file."""
    server_args = os.path.join(package_dir, SERVER_ARGS)
    if not os.path.isfile(server_args):
        why = "is not a regular file" if os.path.lexists(server_args) else "is missing"
        raise NotATree(package_dir, f"srt/server_args.py {why}")


def importable_locations() -> list[str]:
    """Where this Python would import ``sglang`` from (found, not imported)."""
    try:
        found = importlib.util.find_spec("sglang")
    except ValueError:  # an ``sglang`` already in sys.modules without a spec
        return []
    return list(found.submodule_search_locations or []) if found else []


def package_among(locations: Iterable[str]) -> str:
    """The package dir an import of ``sglang.srt`` finds among a spec's search locations (several
    only for a namespace package): the first that holds srt/server_args.py, resolved. Raises
    NothingImportable for none, else NotATree naming the first."""
    first = None
    for location in locations:
        package_dir = os.path.realpath(location)
        try:
            check_package(package_dir)
            return package_dir
        except NotATree as error:
            first = first or error
    if first is None:
        raise NothingImportable()
    raise first


# -- versions ----------------------------------------------------------------------------------


def read_versions(package_dir: str) -> dict[str, str]:
    """Every place that states the version, by its name: the version files, then sglang-*.dist-info
    next to the package dir. Read as text, never imported."""
    sources: dict[str, str] = {}
    for name in VERSION_FILES:
        found = version_in_source(txn.read_bytes(os.path.join(package_dir, name), limit=READ_LIMIT))
        if found:
            sources[name] = found
    parent = os.path.dirname(package_dir)
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        names = []
    for name in names:
        if name.startswith("sglang-") and name.endswith(".dist-info"):
            found = version_in_metadata(txn.read_bytes(os.path.join(parent, name, "METADATA"), limit=READ_LIMIT))
            if found:
                sources[name] = found
    return sources


def read_version(package_dir: str) -> str | None:
    """The version the package states, by ``pick_version``'s order; None if none does."""
    return pick_version(read_versions(package_dir))


def pick_version(sources: dict[str, str]) -> str | None:
    """The package's own files win over dist-info (``git describe`` is the caller's last resort)."""
    for name in VERSION_FILES:
        if name in sources:
            return sources[name]
    return next((value for name, value in sources.items() if name.endswith(".dist-info")), None)


def version_in_source(data: bytes | None) -> str | None:
    """``__version__`` of a version file: ``__version__ = [version = ]'x'``, else any module-level
    assignment of a string to it (the AST is parsed, never executed)."""
    try:
        text = "" if data is None else data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    match = _VERSION_ASSIGN.search(text)
    if match:
        return match.group(1)
    try:
        body = ast.parse(text).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    for node in body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        named = any(isinstance(t, ast.Name) and t.id == "__version__" for t in targets)
        if named and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return node.value.value
    return None


def version_in_metadata(data: bytes | None) -> str | None:
    """The ``Version:`` header of a dist-info METADATA (headers end at the first blank line)."""
    if data is None:
        return None
    headers = data.decode("utf-8", errors="replace").replace("\r\n", "\n").split("\n\n", 1)[0]
    match = _METADATA_VERSION.search(headers)
    return match.group(1) if match else None


# -- git: what a checkout says about the tree ----------------------------------------------------

# git runs programs that a repository's own config names (core.fsmonitor on any command that reads
# the index, hooks, pagers, diff drivers). The tree being patched is not trusted, so each of those is
# switched off on the command line, which outranks every config file, and read-only commands are
# kept from rewriting the index. git's own safe.directory check still refuses a repository owned by
# someone else; then dynspec simply has no git facts.
SAFE_GIT_CONFIG = (
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",
    "core.pager=cat",
    "core.untrackedCache=false",
    "diff.external=",
)
_GIT_ENV_DROPPED = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_EXTERNAL_DIFF", "GIT_CONFIG_PARAMETERS")


def safe_git_argv(*args: str) -> list[str]:
    argv = ["git"]
    for setting in SAFE_GIT_CONFIG:
        argv += ["-c", setting]
    return [*argv, *args]


def safe_git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _GIT_ENV_DROPPED}
    env.update(GIT_OPTIONAL_LOCKS="0", GIT_TERMINAL_PROMPT="0", GIT_PAGER="cat", PAGER="cat")
    return env


def _run_git(package_dir: str, *args: str, text: bool = False) -> subprocess.CompletedProcess[Any] | None:
    """git in the package dir with nothing it could run switched on; None where it failed or could not run."""
    try:
        done = subprocess.run(
            safe_git_argv("-C", package_dir, *args),
            capture_output=True,
            text=text,
            timeout=20,
            stdin=subprocess.DEVNULL,
            env=safe_git_env(),
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done if done.returncode == 0 else None


def _git(package_dir: str, *args: str) -> str | None:
    done = _run_git(package_dir, *args, text=True)
    return None if done is None else done.stdout.strip()


def git_head_file(package_dir: str, rel: str) -> bytes | None:
    """The bytes of ``rel`` (relative to the package dir) in the checkout's HEAD, None if untracked."""
    done = _run_git(package_dir, "cat-file", "blob", f"HEAD:./{rel}")
    return None if done is None else done.stdout


def git_facts(package_dir: str) -> dict[str, str | None]:
    """The work tree top, whether it tracks the package, and ``git describe --tags``, if any.

    A local ``Session`` and the applier on a server both ask this, so a tree reads the same from both
    sides of `dynspec remote`.
    """
    facts: dict[str, str | None] = {"toplevel": None, "describe": None, "tracked": None}
    here = package_dir
    while True:
        if os.path.exists(os.path.join(here, ".git")):
            break
        parent = os.path.dirname(here)
        if parent == here:
            return facts  # not in a git work tree: never run git at all
        here = parent
    facts["toplevel"] = _git(package_dir, "rev-parse", "--show-toplevel")
    facts["tracked"] = _git(package_dir, "ls-files", "--", "srt/server_args.py") or None
    if facts["tracked"]:
        facts["describe"] = _git(package_dir, "describe", "--tags")
    return facts
