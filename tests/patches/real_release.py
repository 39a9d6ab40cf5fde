"""What every worker and runner patch's test asks of it on a real release's file."""

from __future__ import annotations

import libcst

from patcher.engine import apply_text
from patcher.patch import CstPatch


def patched_release(patch: type[CstPatch], before: str, version: str, markers: int) -> str:
    """``patch`` applied to a release's own ``before``: not there yet, applied through the engine
    (its anchors found, the result compiling, lines only added), idempotent, and leaving
    ``markers`` markers; returns the patched text."""
    assert not patch.APPLIED.found(libcst.parse_module(before))
    after = apply_text([patch], before, version, patch.TARGET)
    assert apply_text([patch], after, version, patch.TARGET) == after
    assert after.count(patch.marker()) == markers
    return after
