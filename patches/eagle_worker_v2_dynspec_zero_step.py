"""
Drive SGLang's own zero-step mode with the dynspec flags, in the spec-v2 worker
(``speculative/eagle_worker_v2.py``, ``EAGLEWorkerV2``) of SGLang 0.5.14 onwards.

From 0.5.14 the worker can run an iteration with ``speculative_num_steps == 0``: it verifies a
one-node tree rooted at the bonus token (``_build_trivial_verify_input``) through a runtime state
built for one token per request (``build_adaptive_runtime_state``), then runs the draft extend.
Upstream only enters that mode through ``--speculative-adaptive``, which decides by an EMA of
acceptance within batch-size buckets: its threshold snaps to CUDA-graph batch sizes and has no
hysteresis or dwell on the batch-size axis. So the feature is not provided upstream and this
patch stays needed (``UPSTREAM`` is unset).

Three insertions, a no-op unless ``--speculative-disable-batch-size`` is set:

* ``_dynspec = None`` on ``EAGLEWorkerV2``;
* the end of ``__init__`` installs ``dynspec_v2.ZeroStepPolicy`` as ``self.adaptive_controller``
  (``dynspec_v2.attach_zero_step_policy``). The worker's unchanged code does the rest: its
  ``init_cuda_graphs`` builds the zero-step state through the policy, and the
  ``activate_step_by_batch`` call at the top of every decode iteration lets the policy switch
  between the configured steps and 0;
* just before the decode branch's ``self.verify(...)``, the policy may publish the next sequence
  lengths itself and take ``on_publish`` away from the stock publication after the verify: with
  zero steps they are ``seq_lens + 1``, known before the forward, and publishing them early lets
  the overlap scheduler prepare the next batch during the forward (``ZeroStepPolicy.publish_early``;
  ``DYNSPEC_EARLY_FENCE=0`` turns it off).
"""

from __future__ import annotations

import libcst as cst

from patcher.anchors import (
    Anchor,
    calls,
    class_attribute,
    dotted_name,
    is_assignment_to,
    method,
    method_of,
    method_statement,
    replace_class,
)
from patcher.patch import CstPatch
from patches._eagle_worker_v2 import ENTRY, STATE, WORKER, attach_and_hook_entry


def _entry_consults_the_controller(module: cst.Module) -> bool:
    """Each decode iteration calls ``activate_step_by_batch`` and, at 0 steps, the trivial verify."""
    function = method_of(module, WORKER, ENTRY)
    return (
        function is not None
        and calls(function, "activate_step_by_batch")
        and calls(function, "_build_trivial_verify_input")
    )


PUBLISH_HOOK = """\
if self.{state} is not None:
    {on_publish} = self.{state}.publish_early({batch}, {on_publish})
"""


def _is_verify_assignment(statement: cst.CSTNode) -> bool:
    """``<name> = self.verify(...)``."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    assign = statement.body[0]
    return (
        isinstance(assign, cst.Assign)
        and isinstance(assign.value, cst.Call)
        and dotted_name(assign.value.func) == "self.verify"
    )


class _VerifyBlockFinder(cst.CSTVisitor):
    """The block holding the entry's first ``<name> = self.verify(...)``."""

    def __init__(self) -> None:
        self.block: cst.IndentedBlock | None = None

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> bool:
        if self.block is None and any(_is_verify_assignment(s) for s in node.body):
            self.block = node
        return self.block is None


def _verify_block(function: cst.FunctionDef) -> cst.IndentedBlock | None:
    finder = _VerifyBlockFinder()
    function.visit(finder)
    return finder.block


def _publish_parameter(function: cst.FunctionDef) -> str | None:
    names = [p.name.value for p in (*function.params.params, *function.params.kwonly_params)]
    return "on_publish" if "on_publish" in names else None


def _entry_verifies_with_a_publish_callback(module: cst.Module) -> bool:
    function = method_of(module, WORKER, ENTRY)
    return function is not None and _publish_parameter(function) is not None and _verify_block(function) is not None


def _init_cuda_graphs_builds_states(module: cst.Module) -> bool:
    function = method_of(module, WORKER, "init_cuda_graphs")
    return function is not None and calls(function, "register") and calls(function, "init_states")


class EagleWorkerV2DynspecZeroStep(CstPatch):
    REVISION = 2
    TARGET = "srt/speculative/eagle_worker_v2.py"
    SGLANG = ">=0.5.14"
    REQUIRES = ("speculative_dynspec_v2",)  # the hooks call attach_zero_step_policy and its policy
    SUMMARY = "v2 EAGLEWorkerV2: SGLang's zero-step state, switched by batch size with hysteresis"
    UPSTREAM_NOTES = (
        (
            ">=0.5.14",
            "upstream has --speculative-adaptive with a zero-step mode (chosen by acceptance per "
            "batch-size bucket); dynspec drives that state by batch size with hysteresis",
        ),
    )
    ANCHORS = {
        f"{WORKER}.__init__ sets self.adaptive_controller": method_statement(
            WORKER, "__init__", lambda s: is_assignment_to(s, "self.adaptive_controller")
        ),
        f"{WORKER}.{ENTRY} calls activate_step_by_batch and _build_trivial_verify_input": Anchor(
            _entry_consults_the_controller
        ),
        f"{WORKER}.init_cuda_graphs registers states and calls init_states": Anchor(_init_cuda_graphs_builds_states),
        f"{WORKER}.{ENTRY}(..., on_publish) assigns self.verify(...)": Anchor(_entry_verifies_with_a_publish_callback),
        f"{WORKER}.activate_step_by_batch": method(WORKER, "activate_step_by_batch"),
        f"{WORKER}.on_verify_complete_cpu": method(WORKER, "on_verify_complete_cpu"),
        f"{WORKER}.build_adaptive_runtime_state": method(WORKER, "build_adaptive_runtime_state"),
        f"{WORKER}.apply_runtime_state": method(WORKER, "apply_runtime_state"),
    }
    APPLIED = class_attribute(WORKER, STATE)

    def transform(self, module: cst.Module) -> cst.Module:
        def hook(entry: cst.FunctionDef) -> cst.FunctionDef:
            return self._publish_hook(module, entry)

        def edit(worker: cst.ClassDef) -> cst.ClassDef:
            return attach_and_hook_entry(self, module, worker, "attach_zero_step_policy", hook)

        return replace_class(module, WORKER, edit)

    def _publish_hook(self, module: cst.Module, entry: cst.FunctionDef) -> cst.FunctionDef:
        on_publish = _publish_parameter(entry)
        block = _verify_block(entry)
        assert on_publish is not None and block is not None
        batch = entry.params.params[1].name.value
        hook = self.parse_statements(module, PUBLISH_HOOK.format(state=STATE, batch=batch, on_publish=on_publish))

        class Insert(cst.CSTTransformer):
            def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
                if original is not block:
                    return updated
                at = next(i for i, s in enumerate(updated.body) if _is_verify_assignment(s))
                return updated.with_changes(body=[*updated.body[:at], *hook, *updated.body[at:]])

        return entry.visit(Insert())  # type: ignore[return-value]
