"""Real SGLang releases from PyPI, downloaded once into a cache and unpacked as small trees.

Only the files dynspec reads are extracted (version files and every patch target), so a tree of
any release is a few hundred kilobytes and quick to copy into a test's temp dir.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

# The files of a release a tree needs beyond the patch targets.
BASE_MEMBERS = ("sglang/__init__.py", "sglang/version.py", "sglang/_version.py")
PLATFORM = [
    "--python-version", "3.11", "--implementation", "cp",
    "--abi", "cp311", "--abi", "abi3", "--abi", "none",
    "--platform", "manylinux_2_34_x86_64", "--platform", "any",
]  # fmt: skip


def cache_dir() -> Path:
    """``$DYNSPEC_CACHE``, else ``$XDG_CACHE_HOME/dynspec``, else ``~/.cache/dynspec``."""
    if os.environ.get("DYNSPEC_CACHE"):
        return Path(os.environ["DYNSPEC_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dynspec"


def cached_wheel(version: str) -> Path | None:
    """The release's wheel if it is in the cache already."""
    return cached_pypi_wheel(f"sglang-{version}-*.whl")


def wheel(version: str) -> Path:
    """The release's wheel, downloaded with pip into the cache the first time."""
    return pypi_wheel("sglang", version, f"sglang-{version}-*.whl", PLATFORM)


def cached_pypi_wheel(pattern: str) -> Path | None:
    """A wheel in ``<cache>/wheels`` whose name matches ``pattern``, if one is there."""
    found = sorted((cache_dir() / "wheels").glob(pattern))
    return found[0] if found else None


def pypi_wheel(package: str, version: str, pattern: str, pip_options: Iterable[str] = ()) -> Path:
    """``package==version``'s wheel (named like ``pattern``), downloaded with pip into
    ``<cache>/wheels`` the first time; RuntimeError with pip's last word if it cannot be."""
    found = cached_pypi_wheel(pattern)
    if found is not None:
        return found
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheels) as scratch:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
            *pip_options,
            "-d",
            scratch,
            f"{package}=={version}",
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        got = sorted(Path(scratch).glob(pattern))
        if done.returncode != 0 or not got:
            why = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "pip found no wheel")
            raise RuntimeError(f"could not download {package} {version} from PyPI ({why.strip()})")
        target = wheels / got[0].name
        os.replace(got[0], target)
        return target


def unpacked(version: str, members: Iterable[str]) -> Path:
    """A cached tree of ``version`` holding ``members`` (paths under ``sglang/``); returns its root.

    The root holds ``sglang/``, like a site-packages dir. A tree only grows: asking for members it
    lacks extracts them together with those it holds, so callers asking for different sets do not
    take turns replacing each other's tree.
    """
    root = cache_dir() / "trees" / version
    wanted = {*BASE_MEMBERS, *(f"sglang/{m}" for m in members)}
    done_marker = root / ".members"
    held = set(done_marker.read_text().split()) if done_marker.exists() else set()
    if wanted <= held:
        return root
    wanted |= held
    root.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel(version)) as archive:
        names = set(archive.namelist())
        staging = Path(tempfile.mkdtemp(dir=root.parent))
        try:
            for name in sorted(wanted & names):
                archive.extract(name, staging)
            (staging / ".members").write_text("\n".join(sorted(wanted)))
            shutil.rmtree(root, ignore_errors=True)
            os.replace(staging, root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return root


def copy_tree(version: str, members: Iterable[str], dest: Path) -> Path:
    """Copy a release's tree to ``dest`` (created); returns the ``sglang`` package dir there."""
    source = unpacked(version, members)
    shutil.copytree(source / "sglang", dest / "sglang")
    return dest / "sglang"
