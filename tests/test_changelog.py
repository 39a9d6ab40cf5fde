"""CHANGELOG.md has a line ``- `<patch id>` r<k>: ...`` for every revision 1..REVISION of every patch."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from patcher.registry import all_patches

CHANGELOG = Path(__file__).resolve().parent.parent / "CHANGELOG.md"
LINE = re.compile(r"^- `(?P<id>[A-Za-z0-9_]+)` r(?P<revision>[1-9][0-9]*): \S", re.MULTILINE)


def revision_lines(text: str) -> list[tuple[str, int]]:
    """(patch id, revision) of each revision line, in the order they stand."""
    return [(m["id"], int(m["revision"])) for m in LINE.finditer(text)]


def missing(text: str, revisions: dict[str, int]) -> list[str]:
    """``<id> r<k>`` for each revision 1..N of each patch that has no line in ``text``."""
    present = set(revision_lines(text))
    return [
        f"{patch} r{k}"
        for patch, last in sorted(revisions.items())
        for k in range(1, last + 1)
        if (patch, k) not in present
    ]


def current_revisions() -> dict[str, int]:
    return {patch_id: patch.REVISION for patch_id, patch in all_patches().items()}


@pytest.fixture(scope="module")
def changelog() -> str:
    return CHANGELOG.read_text(encoding="utf-8")


def test_every_revision_of_every_patch_has_a_line(changelog: str) -> None:
    assert missing(changelog, current_revisions()) == []


def test_no_revision_has_two_lines(changelog: str) -> None:
    twice = [f"{patch} r{k}" for (patch, k), n in Counter(revision_lines(changelog)).items() if n > 1]
    assert twice == []


def test_a_removed_line_is_reported(changelog: str) -> None:
    """Negative control: without any one revision's line, the check names exactly that revision."""
    revisions = current_revisions()
    before = missing(changelog, revisions)
    lines = changelog.splitlines(keepends=True)
    removed = 0
    for i, line in enumerate(lines):
        found = revision_lines(line)
        if not found or not 1 <= found[0][1] <= revisions.get(found[0][0], 0):
            continue
        patch, k = found[0]
        without = "".join(lines[:i] + lines[i + 1 :])
        assert set(missing(without, revisions)) - set(before) == {f"{patch} r{k}"}, line
        removed += 1
    assert removed == sum(revisions.values()) - len(before)


def test_a_new_revision_without_a_line_is_reported(changelog: str) -> None:
    """Negative control: a patch bumped past its last line is missing that revision."""
    revisions = current_revisions()
    before = missing(changelog, revisions)
    patch = "speculative_dynspec_runtime"
    bumped = {**revisions, patch: revisions[patch] + 1}
    assert set(missing(changelog, bumped)) - set(before) == {f"{patch} r{bumped[patch]}"}


@pytest.mark.parametrize(
    "text",
    [
        "- `p` r12: a later revision is not r1\n",  # r1 must not match r12's prefix
        "- `p_legacy` r1: another patch whose id starts with p\n",
        "- `p` r1 the colon is missing\n",
        "- `p` r1:\n",  # nothing said
        "  - `p` r1: indented\n",
        "* `p` r1: another bullet\n",
        "- p r1: no backticks\n",
    ],
)
def test_lines_not_in_the_form_do_not_count(text: str) -> None:
    assert missing(text, {"p": 1}) == ["p r1"]


def test_a_line_in_the_form_counts() -> None:
    assert missing("## 2026-12-05\n\n### Added\n\n- `p` r1: what changed (abc1234)\n", {"p": 1}) == []
