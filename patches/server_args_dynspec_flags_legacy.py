"""
Add the dynspec flags to ``ServerArgs`` where every flag is a plain dataclass field plus a
hand-written ``parser.add_argument`` (SGLang <= 0.5.13).

Both halves are needed: up to 0.5.12 ``from_cli_args`` reads every field back from the parsed
arguments, so a field without its flag fails at launch.
"""

from __future__ import annotations

import libcst as cst

from patcher.anchors import (
    body_of,
    class_field,
    insert_after,
    is_call_with_first_arg,
    is_field,
    method_statement,
    replace_class,
    replace_method,
    with_body,
)
from patcher.patch import CstPatch
from patches._flags import FLAGS, NEIGHBOUR, add_argument_calls, plain_fields

NEIGHBOUR_OPTION = "--" + NEIGHBOUR.replace("_", "-")


class ServerArgsDynspecFlagsLegacy(CstPatch):
    REVISION = 2
    TARGET = "srt/server_args.py"
    SGLANG = ">=0.4.10.post2,<0.5.14"
    SUMMARY = "--speculative-disable-batch-size and friends: dataclass fields + add_argument"
    ANCHORS = {
        f"ServerArgs.{NEIGHBOUR}": class_field("ServerArgs", NEIGHBOUR),
        f'ServerArgs.add_cli_args: add_argument("{NEIGHBOUR_OPTION}")': method_statement(
            "ServerArgs", "add_cli_args", lambda s: is_call_with_first_arg(s, NEIGHBOUR_OPTION)
        ),
    }
    APPLIED = class_field("ServerArgs", FLAGS[0].field)

    def transform(self, module: cst.Module) -> cst.Module:
        fields = self.parse_statements(module, plain_fields())
        calls = self.parse_statements(module, add_argument_calls())

        def add_flags(method: cst.FunctionDef) -> cst.FunctionDef:
            return with_body(
                method, insert_after(body_of(method), lambda s: is_call_with_first_arg(s, NEIGHBOUR_OPTION), calls)
            )

        def edit(classdef: cst.ClassDef) -> cst.ClassDef:
            classdef = with_body(classdef, insert_after(body_of(classdef), lambda s: is_field(s, NEIGHBOUR), fields))
            return replace_method(classdef, "add_cli_args", add_flags)

        return replace_class(module, "ServerArgs", edit)
