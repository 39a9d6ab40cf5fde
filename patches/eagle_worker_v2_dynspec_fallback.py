"""
Hook the dynspec fallback into the spec-v2 worker (``speculative/eagle_worker_v2.py``:
``EAGLEWorkerV2`` and ``EagleDraftWorker``, the overlap scheduler's EAGLE workers) of SGLang
0.5.4 to 0.5.13, which have no zero-step mode of their own.

Five insertions, each a no-op unless ``--speculative-disable-batch-size`` is set:

* ``_dynspec = None`` on both classes, so every worker has the attribute the hooks test;
* the end of ``EAGLEWorkerV2.__init__`` builds the fallback (``dynspec_v2.attach_fallback``): a
  second target attention backend and TARGET_VERIFY CUDA graphs for one token per request;
* the top of the decode branch of ``forward_batch_generation`` (the branch that drafts: the
  ``if`` of 0.5.4-0.5.5, the ``else`` after) asks the controller, and when speculation is off
  runs the same method again with the one-token state swapped in; where the method takes
  0.5.13's ``on_publish`` callback, the fallback may first publish the next sequence lengths
  itself (``V2Fallback.publish_early``, opt-in with ``DYNSPEC_EARLY_FENCE=1``);
* the top of ``EagleDraftWorker.draft`` returns, in that re-run, a one-node tree rooted at the
  bonus token, so the stock ``verify`` and draft extend do the rest in each release's spelling.

What differs between releases (``allocate_lens`` in 0.5.4-0.5.5, ``ModelWorkerBatch`` versus
``ScheduleBatch`` and ``on_publish`` in 0.5.13, field renames, the scheduler's stride) is handled
in ``dynspec_v2`` by feature detection; the re-entry passes on whatever parameters the release's
``forward_batch_generation`` has.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import libcst as cst

from patcher.anchors import (
    Anchor,
    body_of,
    find_class,
    find_method,
    imports_name,
    is_assignment_to,
    is_docstring,
    leading_lines,
    method,
    replace_class,
    with_body,
)
from patcher.patch import CstPatch

WORKER = "EAGLEWorkerV2"
DRAFT_WORKER = "EagleDraftWorker"
ENTRY = "forward_batch_generation"
STATE = "_dynspec"

CLASS_ATTRIBUTE = f"{STATE} = None  # a dynspec_v2 object while --speculative-disable-batch-size is set\n"
ATTACH = """\
from sglang.srt.speculative.dynspec_v2 import {function}

self.{state} = {function}(self)
"""
DECODE_HOOK = """\
if self.{state} is not None and self.{state}.should_fall_back({batch}):
{early_publication}    return self.{state}.fall_back(self, lambda: self.{entry}({arguments}))
"""
# 0.5.13 hands the decode branch a callback that publishes the next sequence lengths after the
# verify; in a fallback iteration they are known before it, and the fallback may publish them then.
PUBLISH_CALLBACK = "on_publish"
EARLY_PUBLICATION = "    {callback} = self.{state}.publish_early({batch}, {callback})\n"
DRAFT_HOOK = """\
if self.{state} is not None and self.{state}.in_fallback:
    return self.{state}.trivial_verify_input({batch}, EagleVerifyInput)
"""


# -- finding things -----------------------------------------------------------------------------


class _CallFinder(cst.CSTVisitor):
    def __init__(self, attribute: str) -> None:
        self.attribute = attribute
        self.found = False

    def visit_Call(self, node: cst.Call) -> bool:
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == self.attribute:
            self.found = True
        return not self.found


def calls(node: cst.CSTNode, attribute: str) -> bool:
    """``node`` contains a call ``<anything>.<attribute>(...)``."""
    finder = _CallFinder(attribute)
    node.visit(finder)
    return finder.found


def decode_block(function: cst.FunctionDef) -> cst.IndentedBlock | None:
    """The branch of the entry's top-level ``if``/``else`` that drafts (calls ``.draft(...)``)."""
    for statement in body_of(function):
        if isinstance(statement, cst.If) and isinstance(statement.orelse, cst.Else):
            for block in (statement.body, statement.orelse.body):
                if isinstance(block, cst.IndentedBlock) and calls(block, "draft"):
                    return block
    return None


def method_of(module: cst.Module, class_name: str, method_name: str) -> cst.FunctionDef | None:
    classdef = find_class(module, class_name)
    return find_method(classdef, method_name) if classdef else None


def takes_batch(class_name: str, method_name: str) -> Anchor:
    """``class_name.method_name(self, batch, ...)``."""

    def find(module: cst.Module) -> bool:
        function = method_of(module, class_name, method_name)
        return function is not None and len(function.params.params) >= 2

    return Anchor(find)


def has_class_attribute(class_name: str, name: str) -> Anchor:
    def find(module: cst.Module) -> bool:
        classdef = find_class(module, class_name)
        return classdef is not None and any(is_assignment_to(s, name) for s in body_of(classdef))

    return Anchor(find)


def _has_decode_branch(module: cst.Module) -> bool:
    function = method_of(module, WORKER, ENTRY)
    return function is not None and len(function.params.params) >= 2 and decode_block(function) is not None


def forwarding_arguments(function: cst.FunctionDef) -> str:
    """The arguments that call ``function`` again with its own parameters (``self`` excluded)."""
    params = function.params
    positional = [*params.posonly_params, *params.params][1:]
    arguments = [positional[0].name.value] if positional else []
    arguments += [f"{p.name.value}={p.name.value}" for p in positional[1:]]
    if isinstance(params.star_arg, cst.Param):
        arguments.append(f"*{params.star_arg.name.value}")
    arguments += [f"{p.name.value}={p.name.value}" for p in params.kwonly_params]
    if params.star_kwarg is not None:
        arguments.append(f"**{params.star_kwarg.name.value}")
    return ", ".join(arguments)


# -- editing ------------------------------------------------------------------------------------


def append_to(function: cst.FunctionDef, statements: Sequence[cst.BaseStatement]) -> cst.FunctionDef:
    return with_body(function, [*body_of(function), *statements])


def prepend_to(function: cst.FunctionDef, statements: Sequence[cst.BaseStatement]) -> cst.FunctionDef:
    """Insert at the top of the body, after the docstring."""
    body = list(body_of(function))
    at = 1 if body and is_docstring(body[0]) else 0
    return with_body(function, [*body[:at], *statements, *body[at:]])


def with_class_attribute(classdef: cst.ClassDef, statements: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """The class body with ``statements`` first (after a docstring), a blank line after them."""
    body = list(body_of(classdef))
    at = 1 if body and is_docstring(body[0]) else 0
    rest = body[at:]
    if rest and not any(not line.comment for line in leading_lines(rest[0])):
        rest[0] = rest[0].with_changes(leading_lines=[cst.EmptyLine(indent=False), *leading_lines(rest[0])])
    return [*body[:at], *statements, *rest]


def attach_in_init(patch: CstPatch, module: cst.Module, worker: cst.ClassDef, function_name: str) -> list[cst.BaseStatement]:
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


class EagleWorkerV2DynspecFallback(CstPatch):
    REVISION = 2
    TARGET = "srt/speculative/eagle_worker_v2.py"
    SGLANG = ">=0.5.4,<0.5.14"
    SUMMARY = "v2 EAGLEWorkerV2: verify one token per request, no draft, while the batch is large"
    UPSTREAM_NOTES = (
        (
            ">=0.5.12,<0.5.14",
            "upstream has --speculative-adaptive (step counts by acceptance) but no zero-step mode; "
            "dynspec's own fallback",
        ),
    )
    ANCHORS = {
        f"{WORKER}.__init__": method(WORKER, "__init__"),
        f"{WORKER}.{ENTRY}: if/else, one branch calling .draft(...)": Anchor(_has_decode_branch),
        f"{WORKER}.verify": method(WORKER, "verify"),
        f"{DRAFT_WORKER}.__init__": method(DRAFT_WORKER, "__init__"),
        f"{DRAFT_WORKER}.draft(self, batch)": takes_batch(DRAFT_WORKER, "draft"),
        f"{DRAFT_WORKER}._draft_extend_for_decode": method(DRAFT_WORKER, "_draft_extend_for_decode"),
        "import EagleVerifyInput": imports_name("EagleVerifyInput"),
    }
    APPLIED = has_class_attribute(WORKER, STATE)

    def transform(self, module: cst.Module) -> cst.Module:
        def edit_worker(worker: cst.ClassDef) -> cst.ClassDef:
            return attach_and_hook_entry(self, module, worker, "attach_fallback", lambda f: self._decode_hook(module, f))

        def edit_draft_worker(draft_worker: cst.ClassDef) -> cst.ClassDef:
            body = []
            for statement in with_class_attribute(draft_worker, self.parse_statements(module, CLASS_ATTRIBUTE)):
                if isinstance(statement, cst.FunctionDef) and statement.name.value == "draft":
                    batch = statement.params.params[1].name.value
                    statement = prepend_to(statement, self.parse_statements(module, DRAFT_HOOK.format(state=STATE, batch=batch)))
                body.append(statement)
            return with_body(draft_worker, body)

        module = replace_class(module, DRAFT_WORKER, edit_draft_worker)
        return replace_class(module, WORKER, edit_worker)

    def _decode_hook(self, module: cst.Module, entry: cst.FunctionDef) -> cst.FunctionDef:
        batch = entry.params.params[1].name.value
        has_callback = any(p.name.value == PUBLISH_CALLBACK for p in entry.params.params)
        early_publication = (
            EARLY_PUBLICATION.format(callback=PUBLISH_CALLBACK, state=STATE, batch=batch) if has_callback else ""
        )
        code = DECODE_HOOK.format(
            state=STATE,
            batch=batch,
            early_publication=early_publication,
            entry=ENTRY,
            arguments=forwarding_arguments(entry),
        )
        hook = self.parse_statements(module, code)
        block = decode_block(entry)
        assert block is not None

        class Insert(cst.CSTTransformer):
            def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
                return updated.with_changes(body=[*hook, *updated.body]) if original is block else updated

        return entry.visit(Insert())  # type: ignore[return-value]
