"""
Add ``speculative/dynspec_runtime.py`` to the tree: the version-independent half of the dynspec
fallback (switch controller, metrics, start-up refusals, the one-token target state and the
trivial verify input), which the worker hooks call into.

The module is dynspec's own code, shipped as package data in ``patches/runtime/``; keeping it a
whole file rather than inserted statements keeps the patched SGLang files small and readable.
"""

from __future__ import annotations

from patcher.patch import NewFilePatch


class SpeculativeDynspecRuntime(NewFilePatch):
    REVISION = 30
    TARGET = "srt/speculative/dynspec_runtime.py"
    SGLANG = ">=0.4.10.post2"
    # dynspec_v2, which it imports inside functions, requires it: the one way the two can be ordered.
    REQUIRES = ("speculative_dynspec_settings",)
    SUMMARY = "dynspec runtime module: switch controller, metrics, one-token fallback state, KV-only draft extend"
