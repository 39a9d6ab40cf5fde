"""
Add the dynspec flags to ``ServerArgs`` as annotated fields (SGLang 0.5.14 to 0.5.19).

Here SGLang derives each ``--flag`` from the ``A[...]`` field itself, so there is no
``add_argument`` to write (one would clash). From 0.5.17 every field carries ``NS("spec")``; the
patch copies whatever its neighbour field carries.
"""

from __future__ import annotations

import libcst as cst

from patcher.anchors import (
    Anchor,
    annotation_head,
    body_of,
    class_field,
    find_class,
    insert_after,
    is_field,
    replace_class,
    subscript_calls,
    with_body,
)
from patcher.patch import CstPatch
from patches._flags import FLAGS, NEIGHBOUR, annotated_fields


def annotated_neighbour(class_name: str) -> Anchor:
    """``NEIGHBOUR`` declared as ``A[...]``: pins the layout this patch writes."""

    def find(module: cst.Module) -> bool:
        classdef = find_class(module, class_name)
        return classdef is not None and any(is_field(s, NEIGHBOUR) and annotation_head(s) == "A" for s in body_of(classdef))

    return Anchor(find)


def insert_annotated_fields(patch: CstPatch, module: cst.Module, class_name: str) -> cst.Module:
    classdef = find_class(module, class_name)
    assert classdef is not None
    neighbour = next(s for s in body_of(classdef) if is_field(s, NEIGHBOUR))
    fields = patch.parse_statements(module, annotated_fields("spec" if "NS" in subscript_calls(neighbour) else None))
    return replace_class(
        module,
        class_name,
        lambda c: with_body(c, insert_after(body_of(c), lambda s: is_field(s, NEIGHBOUR), fields)),
    )


class ServerArgsDynspecFlags(CstPatch):
    REVISION = 2
    TARGET = "srt/server_args.py"
    SGLANG = ">=0.5.14,<0.5.20"
    SUMMARY = "--speculative-disable-batch-size and friends: annotated ServerArgs fields"
    ANCHORS = {f"ServerArgs.{NEIGHBOUR}: A[...]": annotated_neighbour("ServerArgs")}
    APPLIED = class_field("ServerArgs", FLAGS[0].field)

    def transform(self, module: cst.Module) -> cst.Module:
        return insert_annotated_fields(self, module, "ServerArgs")
