"""
Add the dynspec flags to the ``spec`` namespace (SGLang >= 0.5.20), where server arguments are
split into ``arg_groups/fields/*.py`` structs and the CLI is generated from the annotations.
"""

from __future__ import annotations

import libcst as cst

from patcher.anchors import class_field
from patcher.patch import CstPatch
from patches._flags import FLAGS, NEIGHBOUR, annotated_neighbour, insert_annotated_fields


class SpecFieldsDynspecFlags(CstPatch):
    REVISION = 2
    TARGET = "srt/arg_groups/fields/spec.py"
    SGLANG = ">=0.5.20"
    SUMMARY = "--speculative-disable-batch-size and friends: fields of the Spec namespace"
    ANCHORS = {f"Spec.{NEIGHBOUR}: A[...]": annotated_neighbour("Spec")}
    APPLIED = class_field("Spec", FLAGS[0].field)

    def transform(self, module: cst.Module) -> cst.Module:
        return insert_annotated_fields(self, module, "Spec")
