"""``sglang.srt.speculative`` as a patched tree has it, for the runtime modules' tests without SGLang."""

from __future__ import annotations

import sys
import types

import pytest

from patches.runtime import dynspec_auto, dynspec_runtime


def install_patched_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty ``sglang``, ``sglang.srt`` and ``sglang.srt.speculative`` packages holding the real
    ``dynspec_runtime`` and ``dynspec_auto``, which the runtime modules import inside functions."""
    for name in ("sglang", "sglang.srt", "sglang.srt.speculative"):
        package = types.ModuleType(name)
        package.__path__ = []
        monkeypatch.setitem(sys.modules, name, package)
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.dynspec_runtime", dynspec_runtime)
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.dynspec_auto", dynspec_auto)
