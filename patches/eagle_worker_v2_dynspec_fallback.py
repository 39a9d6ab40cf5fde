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

import libcst as cst

from patcher.anchors import (
    Anchor,
    body_of,
    calls,
    class_attribute,
    imports_name,
    method,
    method_of,
    method_taking_an_argument,
    prepend_to,
    replace_class,
    with_body,
    with_class_attribute,
)
from patcher.patch import CstPatch
from patches._eagle_worker_v2 import CLASS_ATTRIBUTE, ENTRY, STATE, WORKER, attach_and_hook_entry

DRAFT_WORKER = "EagleDraftWorker"

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


def decode_block(function: cst.FunctionDef) -> cst.IndentedBlock | None:
    """The branch of the entry's top-level ``if``/``else`` that drafts (calls ``.draft(...)``)."""
    for statement in body_of(function):
        if isinstance(statement, cst.If) and isinstance(statement.orelse, cst.Else):
            for block in (statement.body, statement.orelse.body):
                if isinstance(block, cst.IndentedBlock) and calls(block, "draft"):
                    return block
    return None


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


class EagleWorkerV2DynspecFallback(CstPatch):
    REVISION = 2
    TARGET = "srt/speculative/eagle_worker_v2.py"
    SGLANG = ">=0.5.4,<0.5.14"
    REQUIRES = ("speculative_dynspec_v2",)  # the hooks call attach_fallback and its fallback
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
        f"{DRAFT_WORKER}.draft(self, batch)": method_taking_an_argument(DRAFT_WORKER, "draft"),
        f"{DRAFT_WORKER}._draft_extend_for_decode": method(DRAFT_WORKER, "_draft_extend_for_decode"),
        "import EagleVerifyInput": imports_name("EagleVerifyInput"),
    }
    APPLIED = class_attribute(WORKER, STATE)

    def transform(self, module: cst.Module) -> cst.Module:
        def edit_worker(worker: cst.ClassDef) -> cst.ClassDef:
            return attach_and_hook_entry(
                self, module, worker, "attach_fallback", lambda f: self._decode_hook(module, f)
            )

        def edit_draft_worker(draft_worker: cst.ClassDef) -> cst.ClassDef:
            body = []
            for statement in with_class_attribute(draft_worker, self.parse_statements(module, CLASS_ATTRIBUTE)):
                if isinstance(statement, cst.FunctionDef) and statement.name.value == "draft":
                    batch = statement.params.params[1].name.value
                    statement = prepend_to(
                        statement, self.parse_statements(module, DRAFT_HOOK.format(state=STATE, batch=batch))
                    )
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
