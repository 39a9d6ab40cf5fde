"""
Add the dynspec flags to ``ServerArgs`` as annotated fields (SGLang 0.5.14 to 0.5.19).

Here SGLang derives each ``--flag`` from the ``A[...]`` field itself, so there is no
``add_argument`` to write (one would clash). From 0.5.17 every field carries ``NS("spec")``; the
patch copies whatever its neighbour field carries.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from patcher.anchors import Anchor, body_of, class_field, find_class, insert_after, is_field, replace_class, with_body
from patcher.patch import CstPatch
from patches._flags import FLAGS, NEIGHBOUR, annotated_fields

IS_ANNOTATED_NEIGHBOUR = m.SimpleStatementLine(
    body=[m.AnnAssign(target=m.Name(NEIGHBOUR), annotation=m.Annotation(m.Subscript(value=m.Name("A"))))]
)
HAS_NS_SPEC = m.SimpleStatementLine(
    body=[
        m.AnnAssign(
            annotation=m.Annotation(
                m.Subscript(slice=[m.ZeroOrMore(), m.SubscriptElement(m.Index(m.Call(func=m.Name("NS")))), m.ZeroOrMore()])
            )
        )
    ]
)


def annotated_neighbour(class_name: str) -> Anchor:
    """``NEIGHBOUR`` declared as ``A[...]``: pins the layout this patch writes."""

    def find(module: cst.Module) -> bool:
        classdef = find_class(module, class_name)
        return classdef is not None and any(m.matches(s, IS_ANNOTATED_NEIGHBOUR) for s in body_of(classdef))

    return Anchor(find)


def insert_annotated_fields(patch: CstPatch, module: cst.Module, class_name: str) -> cst.Module:
    classdef = find_class(module, class_name)
    assert classdef is not None
    neighbour = next(s for s in body_of(classdef) if is_field(s, NEIGHBOUR))
    fields = patch.parse_statements(module, annotated_fields("spec" if m.matches(neighbour, HAS_NS_SPEC) else None))
    return replace_class(
        module,
        class_name,
        lambda c: with_body(c, insert_after(body_of(c), lambda s: is_field(s, NEIGHBOUR), fields)),  # type: ignore[arg-type,return-value]
    )


class ServerArgsDynspecFlags(CstPatch):
    REVISION = 1
    TARGET = "srt/server_args.py"
    SGLANG = ">=0.5.14,<0.5.20"
    SUMMARY = "--speculative-disable-batch-size and friends: annotated ServerArgs fields"
    ANCHORS = {f"ServerArgs.{NEIGHBOUR}: A[...]": annotated_neighbour("ServerArgs")}
    APPLIED = class_field("ServerArgs", FLAGS[0].field)

    def transform(self, module: cst.Module) -> cst.Module:
        return insert_annotated_fields(self, module, "ServerArgs")
