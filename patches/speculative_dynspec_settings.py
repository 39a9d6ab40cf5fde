"""
Add ``speculative/dynspec_settings.py`` to the tree: the one reading of dynspec's three flags and
the one list of what they refuse, which the start-up check and both runtimes call. Standard
library only.
"""

from __future__ import annotations

from patcher.patch import NewFilePatch


class SpeculativeDynspecSettings(NewFilePatch):
    REVISION = 2
    TARGET = "srt/speculative/dynspec_settings.py"
    SGLANG = ">=0.4.10.post2"
    SUMMARY = "dynspec settings module: the flags' reading, the start-up check and the refusals"
