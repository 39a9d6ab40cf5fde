"""
Hook the dynspec fallback into the v1 ``EAGLEWorker`` (``speculative/eagle_worker.py``, the
worker SGLang uses with the overlap schedule off; 0.4.10.post2 to 0.5.12, gone in 0.5.13).

Four insertions, each a no-op unless ``--speculative-disable-batch-size`` is set:

* ``EAGLEWorker._dynspec = None``, so every worker has the attribute the hooks test;
* the end of ``__init__`` builds the fallback (``dynspec_runtime.attach_dynspec``): a second
  target attention backend and TARGET_VERIFY CUDA graphs for one token per request;
* the top of the decode branch of the entry point (``forward_batch_speculative_generation`` up
  to 0.5.2, ``forward_batch_generation`` after) asks the controller, and when speculation is off
  runs the same branch again with the one-token state swapped in;
* the top of ``draft`` returns, in that re-run, a one-node tree rooted at the bonus token, so the
  stock ``verify`` and draft-extend do the rest, in every release's own spelling.

What differs between releases (field renames, result types, runner signatures) is handled in
``dynspec_runtime`` by feature detection, so one transform serves every release.
"""

from __future__ import annotations

import libcst as cst

from patcher.anchors import (
    Anchor,
    append_to,
    body_of,
    class_attribute,
    find_class,
    find_method,
    imports_name,
    method,
    method_taking_an_argument,
    prepend_to,
    replace_class,
    with_body,
)
from patcher.patch import CstPatch

WORKER = "EAGLEWorker"
ENTRY_POINTS = ("forward_batch_speculative_generation", "forward_batch_generation")  # old name first
STATE = "_dynspec"

CLASS_ATTRIBUTE = f"{STATE} = None  # a dynspec_runtime.DynspecFallback when the flag is set\n"
ATTACH = f"""\
from sglang.srt.speculative.dynspec_runtime import attach_dynspec

self.{STATE} = attach_dynspec(self)
"""
DECODE_HOOK = """\
if self.{state} is not None and self.{state}.should_fall_back({batch}):
    return self.{state}.fall_back(self, {batch}, self.{entry})
"""
DRAFT_HOOK = """\
if self.{state} is not None and self.{state}.in_fallback:
    return self.{state}.trivial_verify_input(self, {batch}, EagleVerifyInput)
"""


def entry_point(worker: cst.ClassDef) -> cst.FunctionDef | None:
    for name in ENTRY_POINTS:
        found = find_method(worker, name)
        if found is not None:
            return found
    return None


def decode_branch(function: cst.FunctionDef) -> cst.If | None:
    """The ``if <extend>: ... else: <decode>`` that every release's entry point opens with."""
    for statement in body_of(function):
        if isinstance(statement, cst.If) and isinstance(statement.orelse, cst.Else):
            return statement
    return None


def second_parameter(function: cst.FunctionDef) -> str:
    return function.params.params[1].name.value


def _has_decode_branch(module: cst.Module) -> bool:
    worker = find_class(module, WORKER)
    function = entry_point(worker) if worker else None
    return function is not None and len(function.params.params) >= 2 and decode_branch(function) is not None


class EagleWorkerDynspecFallback(CstPatch):
    REVISION = 1
    TARGET = "srt/speculative/eagle_worker.py"
    SGLANG = ">=0.4.10.post2,<0.5.13"
    REQUIRES = ("speculative_dynspec_runtime",)  # the hooks call attach_dynspec and its fallback
    SUMMARY = "v1 EAGLEWorker: verify one token per request, no draft, while the batch is large"
    UPSTREAM_NOTES = (
        (
            ">=0.5.11",
            "upstream has --speculative-adaptive (step counts by acceptance) but no zero-step mode; "
            "dynspec's own fallback",
        ),
    )
    ANCHORS = {
        f"{WORKER}.__init__": method(WORKER, "__init__"),
        f"{WORKER}.forward_batch_generation: if/else (decode branch)": Anchor(_has_decode_branch),
        f"{WORKER}.draft(self, batch)": method_taking_an_argument(WORKER, "draft"),
        "import EagleVerifyInput": imports_name("EagleVerifyInput"),
    }
    APPLIED = class_attribute(WORKER, STATE)

    def transform(self, module: cst.Module) -> cst.Module:
        def edit(worker: cst.ClassDef) -> cst.ClassDef:
            body: list[cst.BaseStatement] = []
            for statement in body_of(worker):
                if isinstance(statement, cst.FunctionDef):
                    name = statement.name.value
                    if name == "__init__":
                        body.extend(self.parse_statements(module, CLASS_ATTRIBUTE))
                        statement = append_to(statement, self.parse_statements(module, ATTACH, blank_lines_before=1))
                    elif name == "draft":
                        statement = self._draft_hook(module, statement)
                    elif name == entry_name:
                        statement = self._decode_hook(module, statement)
                body.append(statement)
            return with_body(worker, body)

        worker = find_class(module, WORKER)
        entry = entry_point(worker) if worker else None
        assert entry is not None
        entry_name = entry.name.value
        return replace_class(module, WORKER, edit)

    def _draft_hook(self, module: cst.Module, draft: cst.FunctionDef) -> cst.FunctionDef:
        hook = self.parse_statements(module, DRAFT_HOOK.format(state=STATE, batch=second_parameter(draft)))
        return prepend_to(draft, hook)

    def _decode_hook(self, module: cst.Module, entry: cst.FunctionDef) -> cst.FunctionDef:
        code = DECODE_HOOK.format(state=STATE, batch=second_parameter(entry), entry=entry.name.value)
        hook = self.parse_statements(module, code)
        branch = decode_branch(entry)
        assert branch is not None and isinstance(branch.orelse, cst.Else)
        block = cst.ensure_type(branch.orelse.body, cst.IndentedBlock)
        orelse = branch.orelse.with_changes(body=block.with_changes(body=[*hook, *block.body]))
        body = [branch.with_changes(orelse=orelse) if s is branch else s for s in body_of(entry)]
        return with_body(entry, body)
