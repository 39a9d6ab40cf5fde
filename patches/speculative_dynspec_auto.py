"""
Add ``speculative/dynspec_auto.py`` to the tree: ``--speculative-disable-batch-size auto`` (the
switch point a server finds from its own step timings and acceptance) and the one reading of that
flag's value, which the start-up check and both runtimes call. Standard library only.
"""

from __future__ import annotations

from importlib import resources

from patcher.patch import NewFilePatch


class SpeculativeDynspecAuto(NewFilePatch):
    REVISION = 5
    TARGET = "srt/speculative/dynspec_auto.py"
    SGLANG = ">=0.4.10.post2"
    SUMMARY = "dynspec auto module: the flag's reading, the auto switch point (0.5.14+)"

    def content(self) -> str:
        return (resources.files("patches") / "runtime" / "dynspec_auto.py").read_text(encoding="utf-8")
