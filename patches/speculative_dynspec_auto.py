"""
Add ``speculative/dynspec_auto.py`` to the tree: ``--speculative-disable-batch-size auto``, the
switch point a server finds from its own step timings and acceptance (0.5.14+; the flag's value is
read by ``dynspec_settings``). Standard library only.
"""

from __future__ import annotations

from patcher.patch import NewFilePatch


class SpeculativeDynspecAuto(NewFilePatch):
    REVISION = 6
    TARGET = "srt/speculative/dynspec_auto.py"
    SGLANG = ">=0.4.10.post2"
    SUMMARY = "dynspec auto module: the switch point a server finds itself (0.5.14+)"
