"""What a patch is. Subclass ``CstPatch`` or ``NewFilePatch`` in ``patches/<id>.py``.

A patch declares, as class attributes, everything the engine checks before anything is written:

``REVISION``  bumped whenever the output changes; an older revision on disk is upgraded in place.
``TARGET``    one file, relative to the ``sglang`` package dir (``srt/server_args.py``).
``SGLANG``    PEP 440 specifier of the releases it is for; outside it the patch is "n/a".
``SUMMARY``   one line for ``dynspec list``.
``ANCHORS``   (CstPatch) named anchors, every one must be found or nothing is written.
``APPLIED``   (CstPatch) recognises the patch's own output: a second apply is a no-op.
``UPSTREAM``  releases where SGLang itself provides it (status: "provided upstream", nothing written).
``UPSTREAM_NOTES``  (specifier, text) pairs: what SGLang provides nearby on those releases, shown by
              ``status`` so a user can tell what the patch adds to it.
``REQUIRES``  ids of the patches it builds on; a recipe must list them before it where both apply.

A ``NewFilePatch`` ships, unless it overrides ``content``, the module of its target's file name from
the ``runtime/`` package beside its own module (``patches/runtime/``, package data).

The id is the module name, so id and file can never disagree.
"""

from __future__ import annotations

from importlib import resources
from pathlib import PurePosixPath
from typing import ClassVar

import libcst as cst
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from patcher.anchors import Anchor, leading_lines


class Patch:
    id: ClassVar[str]
    REVISION: ClassVar[int]
    TARGET: ClassVar[str]
    SGLANG: ClassVar[str]
    SUMMARY: ClassVar[str]
    # Releases where SGLang itself provides what this patch adds (status says "provided upstream").
    UPSTREAM: ClassVar[str | None] = None
    # What SGLang itself offers near this feature, per release range, for status to show.
    UPSTREAM_NOTES: ClassVar[tuple[tuple[str, str], ...]] = ()
    # Original lines are only ever added to, never edited or removed; the engine checks it.
    INSERT_ONLY: ClassVar[bool] = True
    # What this patch's code calls, reads or anchors on comes from these; the registry checks the order.
    REQUIRES: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "id" not in cls.__dict__:
            # patches/<id>.py: the module name is the id. Patches defined elsewhere (tests) use the class name.
            is_shipped = cls.__module__.startswith("patches.")
            cls.id = cls.__module__.rpartition(".")[2] if is_shipped else cls.__name__

    @classmethod
    def applies_to(cls, version: str) -> bool:
        return version_in(cls.SGLANG, version)

    @classmethod
    def provided_upstream(cls, version: str) -> bool:
        return cls.UPSTREAM is not None and version_in(cls.UPSTREAM, version)

    @classmethod
    def upstream_note(cls, version: str) -> str | None:
        return next((text for spec, text in cls.UPSTREAM_NOTES if version_in(spec, version)), None)

    @classmethod
    def marker(cls) -> str:
        """The comment that opens every block this patch inserts."""
        return f"# dynspec: {cls.id} r{cls.REVISION}"


class CstPatch(Patch):
    """A libcst transform of an existing file."""

    ANCHORS: ClassVar[dict[str, Anchor]]
    APPLIED: ClassVar[Anchor]

    def transform(self, module: cst.Module) -> cst.Module:
        """Return the patched module. Called only when every anchor is found and APPLIED is not."""
        raise NotImplementedError

    def parse_statements(self, module: cst.Module, code: str, blank_lines_before: int = 0) -> list[cst.BaseStatement]:
        """Parse inserted code in the target's own style (indent, newlines), marker first.

        The statements may go into any block: blank lines carry no indentation of their own, so
        they never pick up the block's indent as trailing spaces.
        """
        source = "\n" * blank_lines_before + f"{self.marker()}\n{code}"
        parsed = cst.parse_module(source, config=module.config_for_parsing)
        statements = list(parsed.body) if not parsed.header else _with_header(parsed)
        return [_unindented_blank_lines(s) for s in statements]


def _unindented_blank_lines(statement: cst.BaseStatement) -> cst.BaseStatement:
    lines = [line.with_changes(indent=False) if line.comment is None else line for line in leading_lines(statement)]
    return statement.with_changes(leading_lines=lines)


class NewFilePatch(Patch):
    """A file dynspec adds to the tree (revert deletes it)."""

    def content(self) -> str:
        """The file's text, without the marker line the engine puts on top: by default the module of
        the target's name in the ``runtime/`` package beside the patch's module."""
        package = type(self).__module__.rpartition(".")[0]
        shipped = resources.files(package) / "runtime" / PurePosixPath(self.TARGET).name
        return shipped.read_text(encoding="utf-8")

    def text(self) -> str:
        return f"{self.marker()}\n{self.content()}"


def _with_header(parsed: cst.Module) -> list[cst.BaseStatement]:
    # A leading comment parses as the module header; move it onto the first statement.
    first, *rest = parsed.body
    lines = [*parsed.header, *first.leading_lines]
    return [first.with_changes(leading_lines=lines), *rest]


def version_in(spec: str, version: str) -> bool:
    """``version`` is one of the releases ``spec`` (a PEP 440 specifier set) names, pre-releases too;
    a version PEP 440 cannot read is in none."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        return False
    return SpecifierSet(spec).contains(parsed, prereleases=True)
