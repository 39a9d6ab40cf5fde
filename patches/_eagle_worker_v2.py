"""SGLang's spec-v2 EAGLE worker (``speculative/eagle_worker_v2.py``) as the two patches that hook it
see it: its names, and how dynspec attaches to it. The fallback (0.5.4-0.5.13) and the zero-step
policy (0.5.14+) share them, so that a rename here is one rename for both.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from patcher.anchors import append_to, with_body, with_class_attribute
from patcher.patch import CstPatch

WORKER = "EAGLEWorkerV2"
ENTRY = "forward_batch_generation"
STATE = "_dynspec"

CLASS_ATTRIBUTE = f"{STATE} = None  # a dynspec_v2 object while --speculative-disable-batch-size is set\n"
ATTACH = """\
from sglang.srt.speculative.dynspec_v2 import {function}

self.{state} = {function}(self)
"""


def attach_in_init(
    patch: CstPatch, module: cst.Module, worker: cst.ClassDef, function_name: str
) -> list[cst.BaseStatement]:
    """``_dynspec = None`` first in the class body, and ``self._dynspec = <function>(self)`` at the end of ``__init__``."""
    attribute = patch.parse_statements(module, CLASS_ATTRIBUTE)
    attach = patch.parse_statements(module, ATTACH.format(function=function_name, state=STATE), blank_lines_before=1)
    body = []
    for statement in with_class_attribute(worker, attribute):
        if isinstance(statement, cst.FunctionDef) and statement.name.value == "__init__":
            statement = append_to(statement, attach)
        body.append(statement)
    return body


def attach_and_hook_entry(
    patch: CstPatch,
    module: cst.Module,
    worker: cst.ClassDef,
    function_name: str,
    hook_entry: Callable[[cst.FunctionDef], cst.FunctionDef],
) -> cst.ClassDef:
    """The worker with dynspec attached in ``__init__`` and its decode entry point edited by ``hook_entry``."""
    body = []
    for statement in attach_in_init(patch, module, worker, function_name):
        if isinstance(statement, cst.FunctionDef) and statement.name.value == ENTRY:
            statement = hook_entry(statement)
        body.append(statement)
    return with_body(worker, body)
