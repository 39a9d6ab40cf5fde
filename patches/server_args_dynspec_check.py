"""
Validate the dynspec flags when the server starts, in ``ServerArgs.check_server_args`` (every
SGLang release has it, and the engine calls it once all defaults are resolved).

A threshold that can never trigger, or a combination the fallback does not support, fails the
launch with a message that names the flag and the fix, instead of a crash at the first crossing.
What is refused lives in the shipped ``dynspec_settings`` module, with the runtimes' reading of
the same flags; the inserted function only calls it.
"""

from __future__ import annotations

import libcst as cst

from patcher.anchors import (
    body_of,
    find_class,
    imports_name,
    is_docstring,
    method,
    module_function,
    replace_method,
    with_body,
)
from patcher.patch import CstPatch
from patches._flags import FLAG_PATCHES

CHECK = "_dynspec_check_server_args"

CHECK_FUNCTION = '''\
def _dynspec_check_server_args(args):
    """Refuse dynspec flag values and combinations the fallback cannot serve, naming the fix."""
    from sglang.srt.speculative.dynspec_settings import check_server_args

    check_server_args(args)
'''


class ServerArgsDynspecCheck(CstPatch):
    REVISION = 5
    TARGET = "srt/server_args.py"
    SGLANG = ">=0.4.10.post2"
    SUMMARY = "validate the dynspec flags at startup (ServerArgs.check_server_args)"
    REQUIRES = (*FLAG_PATCHES, "speculative_dynspec_settings")  # reads the flags; calls dynspec_settings
    ANCHORS = {"ServerArgs.check_server_args": method("ServerArgs", "check_server_args")}
    APPLIED = module_function(CHECK)

    def transform(self, module: cst.Module) -> cst.Module:
        # From 0.5.20 resolved values live behind resolving_view(); before, on ServerArgs itself.
        argument = "resolving_view(self)" if imports_name("resolving_view").found(module) else "self"
        call = self.parse_statements(module, f"{CHECK}({argument})\n")
        function = self.parse_statements(module, CHECK_FUNCTION, blank_lines_before=2)

        def add_call(check: cst.FunctionDef) -> cst.FunctionDef:
            body = list(body_of(check))
            at = 1 if body and is_docstring(body[0]) else 0
            return with_body(check, [*body[:at], *call, *body[at:]])

        # The class the anchor found: a second ``class ServerArgs`` later in the file is left alone.
        server_args = find_class(module, "ServerArgs")
        body: list[cst.BaseStatement] = []
        for statement in module.body:
            if statement is server_args:
                body.append(replace_method(statement, "check_server_args", add_call))
                body.extend(function)
            else:
                body.append(statement)
        return module.with_changes(body=body)
