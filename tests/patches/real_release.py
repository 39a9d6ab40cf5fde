"""A real release's files as the patch tests read them, and what every worker and runner patch's
test asks of it on one."""

from __future__ import annotations

import ast
from pathlib import Path

import libcst

from patcher import releases
from patcher.engine import apply_text
from patcher.patch import CstPatch, Patch


def release_file(version: str, members: list[str], member: str) -> Path:
    """Where ``member`` is in the release's cached tree of ``members`` (one tree per list), if it has it."""
    return releases.unpacked(version, members) / "sglang" / member


def release_source(version: str, members: list[str], member: str) -> str:
    """The text of ``member``, which the release must have, from its cached tree of ``members``."""
    path = release_file(version, members, member)
    assert path.exists(), f"{version} has no {member}"
    return path.read_text()


def target_source(patch: type[Patch], version: str) -> str:
    """The release's own text of the file ``patch`` targets."""
    return release_source(version, [patch.TARGET], patch.TARGET)


def inserted_lines(patch: type[CstPatch], version: str) -> list[str]:
    """The lines, stripped, that ``patch`` adds to the release's own file."""
    before = target_source(patch, version)
    after = apply_text([patch], before, version, patch.TARGET)
    original = set(before.splitlines())
    return [line.strip() for line in after.splitlines() if line not in original]


def classes(source: str) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)}


def methods(classdef: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in classdef.body if isinstance(n, ast.FunctionDef)}


def is_guarded(statement: ast.stmt) -> bool:
    """``if self._dynspec is not None and ...: [on_publish = ...] return ...``: a worker hook that is a
    no-op while the flag is unset (v2's publishes first where its entry takes ``on_publish``)."""
    return (
        isinstance(statement, ast.If)
        and ast.unparse(statement.test).startswith("self._dynspec is not None and ")
        and isinstance(statement.body[-1], ast.Return)
        and all(ast.unparse(s).startswith("on_publish = self._dynspec.publish_early(") for s in statement.body[:-1])
        and not statement.orelse
    )


def patched_release(patch: type[CstPatch], before: str, version: str, markers: int) -> str:
    """``patch`` applied to a release's own ``before``: not there yet, applied through the engine
    (its anchors found, the result compiling, lines only added), idempotent, and leaving
    ``markers`` markers; returns the patched text."""
    assert not patch.APPLIED.found(libcst.parse_module(before))
    after = apply_text([patch], before, version, patch.TARGET)
    assert apply_text([patch], after, version, patch.TARGET) == after
    assert after.count(patch.marker()) == markers
    return after
