"""
Let the target's prefill replay its piecewise CUDA graphs in a dynspec server (SGLang 0.5.11 to
0.5.13, ``model_executor/piecewise_cuda_graph_runner.py``); ``DYNSPEC_PREFILL_GRAPH=0`` turns it off.

Those releases capture the target's piecewise graphs in speculative servers too, but declare them
for no hidden states (``capture_hidden_mode`` NULL), and ``can_run`` refuses a batch that asks for
another mode. Every EAGLE target prefill asks for all of them (FULL: the draft's prefill reads
them), so a speculative server prefills eagerly where plain decode replays graphs: session 20
counted 0 of 190 prefills on graphs against plain decode's 219 of 219 (0.5.12). dynspec paid that
on every admission, also while off, since its KV-only draft prefill reads those states.

The runner already serves ``--enable-return-hidden-states`` by declaring FULL for graphs captured
alike; this declares FULL the same way for the target of a server with
``--speculative-disable-batch-size``. One insertion, after that flag's own ``if`` in
``PiecewiseCudaGraphRunner.__init__``, and the function it calls; a no-op without the flag.
On the H200 (session 21, 0.5.12 v2): outputs and draft KV unchanged, every dynspec prefill from a
graph, mixed load 1.032x -> 1.000x the oracle. Not yet run on 0.5.11, 0.5.13 or v1.
"""

from __future__ import annotations

import libcst as cst

from patcher.anchors import (
    Anchor,
    body_of,
    dotted_name,
    find_class,
    imports_name,
    insert_after,
    insert_before,
    is_assignment_to,
    method_of,
    method_statement,
    module_function,
    replace_class,
    replace_method,
    with_body,
)
from patcher.patch import CstPatch
from patches._flags import FLAG_PATCHES

RUNNER = "PiecewiseCudaGraphRunner"
MODE = "self.capture_hidden_mode"
DECLARE = "_dynspec_prefill_hidden_mode"
ENV = "DYNSPEC_PREFILL_GRAPH"

DECLARE_FUNCTION = f'''\
def {DECLARE}(model_runner, mode):
    """dynspec ({ENV}=0 turns it off): in a server with --speculative-disable-batch-size
    the target declares its piecewise graphs FULL, the hidden states every EAGLE target prefill
    captures for its draft, so that its prefills replay them instead of running eagerly (can_run
    refuses another mode), as --enable-return-hidden-states declares FULL for graphs alike."""
    import logging

    if getattr(model_runner.server_args, "speculative_disable_batch_size", None) is None:
        return mode
    from sglang.srt.speculative.dynspec_v2 import on_off_setting

    if not on_off_setting("{ENV}", True):
        return mode
    if model_runner.is_draft_worker or not model_runner.spec_algorithm.is_eagle():
        return mode
    logging.getLogger(__name__).info(
        "dynspec: the target's prefill replays its piecewise CUDA graphs, declared for all hidden states ({ENV}=0 turns it off)"
    )
    return CaptureHiddenMode.FULL
'''
CALL = f"{MODE} = {DECLARE}(model_runner, {MODE})\n"


def _is_return_hidden_states_branch(statement: cst.CSTNode) -> bool:
    """``if model_runner.server_args.enable_return_hidden_states: self.capture_hidden_mode = ...``."""
    return (
        isinstance(statement, cst.If)
        and dotted_name(statement.test) == "model_runner.server_args.enable_return_hidden_states"
        and any(is_assignment_to(s, MODE) for s in _if_body(statement))
    )


def _if_body(statement: cst.If) -> list[cst.BaseStatement]:
    block = statement.body
    return list(block.body) if isinstance(block, cst.IndentedBlock) else []


def _can_run_compares_the_mode(module: cst.Module) -> bool:
    """``can_run`` refuses a batch whose ``capture_hidden_mode`` is not the runner's."""
    can_run = method_of(module, RUNNER, "can_run")
    if can_run is None:
        return False

    class Finder(cst.CSTVisitor):
        found = False

        def visit_Comparison(self, node: cst.Comparison) -> None:
            names = {dotted_name(node.left), *(dotted_name(c.comparator) for c in node.comparisons)}
            if MODE in names and any(n and n.endswith(".capture_hidden_mode") and n != MODE for n in names):
                self.found = True

    finder = Finder()
    can_run.visit(finder)
    return finder.found


class PiecewiseGraphDynspecPrefill(CstPatch):
    REVISION = 3
    TARGET = "srt/model_executor/piecewise_cuda_graph_runner.py"
    SGLANG = ">=0.5.11,<=0.5.13"
    REQUIRES = (*FLAG_PATCHES, "speculative_dynspec_v2")  # reads the flag, calls dynspec_v2.on_off_setting
    SUMMARY = "the target's prefill replays its piecewise graphs (DYNSPEC_PREFILL_GRAPH=0: off)"
    ANCHORS = {
        f"{RUNNER}.__init__ declares FULL for --enable-return-hidden-states": method_statement(
            RUNNER, "__init__", _is_return_hidden_states_branch
        ),
        f"{RUNNER}.can_run compares the batch's capture_hidden_mode": Anchor(_can_run_compares_the_mode),
        "CaptureHiddenMode is imported": imports_name("CaptureHiddenMode"),
    }
    APPLIED = module_function(DECLARE)

    def transform(self, module: cst.Module) -> cst.Module:
        call = self.parse_statements(module, CALL)
        function = self.parse_statements(module, DECLARE_FUNCTION, blank_lines_before=2)

        def edit_init(init: cst.FunctionDef) -> cst.FunctionDef:
            return with_body(init, insert_after(body_of(init), _is_return_hidden_states_branch, call))

        def edit_runner(runner: cst.ClassDef) -> cst.ClassDef:
            return replace_method(runner, "__init__", edit_init)

        patched = replace_class(module, RUNNER, edit_runner)
        runner = find_class(patched, RUNNER)
        return patched.with_changes(body=insert_before(patched.body, lambda statement: statement is runner, function))
