"""
Add ``speculative/dynspec_v2.py`` to the tree: the spec-v2 half of the dynspec fallback (the
one-token fallback of 0.5.4-0.5.13, the zero-step policy of 0.5.14+), which the hooks in
``eagle_worker_v2.py`` call into. It builds on ``dynspec_runtime`` (``speculative_dynspec_runtime``).
"""

from __future__ import annotations

from patcher.patch import NewFilePatch


class SpeculativeDynspecV2(NewFilePatch):
    REVISION = 50
    TARGET = "srt/speculative/dynspec_v2.py"
    SGLANG = ">=0.5.4"
    # The modules dynspec_v2 imports.
    REQUIRES = ("speculative_dynspec_settings", "speculative_dynspec_runtime", "speculative_dynspec_auto")
    SUMMARY = "dynspec v2 module: one-token fallback (0.5.4-0.5.13), zero-step policy (0.5.14+)"
