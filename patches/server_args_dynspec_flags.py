"""
Add the dynspec flags to ``ServerArgs`` as annotated fields (SGLang 0.5.14 to 0.5.19).

Here SGLang derives each ``--flag`` from the ``A[...]`` field itself, so there is no
``add_argument`` to write (one would clash). From 0.5.17 every field carries ``NS("spec")``; the
patch copies whatever its neighbour field carries.
"""

from __future__ import annotations

import libcst as cst

from patcher.anchors import class_field
from patcher.patch import CstPatch
from patches._flags import FLAGS, NEIGHBOUR, annotated_neighbour, insert_annotated_fields


class ServerArgsDynspecFlags(CstPatch):
    REVISION = 2
    TARGET = "srt/server_args.py"
    SGLANG = ">=0.5.14,<0.5.20"
    SUMMARY = "--speculative-disable-batch-size and friends: annotated ServerArgs fields"
    ANCHORS = {f"ServerArgs.{NEIGHBOUR}: A[...]": annotated_neighbour("ServerArgs")}
    APPLIED = class_field("ServerArgs", FLAGS[0].field)

    def transform(self, module: cst.Module) -> cst.Module:
        return insert_annotated_fields(self, module, "ServerArgs")
