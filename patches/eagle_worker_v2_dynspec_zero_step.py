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

Two insertions, a no-op unless ``--speculative-disable-batch-size`` is set:

* ``_dynspec = None`` on ``EAGLEWorkerV2``;
* the end of ``__init__`` installs ``dynspec_v2.ZeroStepPolicy`` as ``self.adaptive_controller``
  (``dynspec_v2.attach_zero_step_policy``). The worker's unchanged code does the rest: its
  ``init_cuda_graphs`` builds the zero-step state through the policy, and the
  ``activate_step_by_batch`` call at the top of every decode iteration lets the policy switch
  between the configured steps and 0.
"""

from __future__ import annotations

import libcst as cst

from patcher.anchors import Anchor, is_assignment_to, method, method_statement, replace_class, with_body
from patcher.patch import CstPatch
from patches.eagle_worker_v2_dynspec_fallback import (
    ENTRY,
    STATE,
    WORKER,
    attach_in_init,
    calls,
    has_class_attribute,
    method_of,
)


def _entry_consults_the_controller(module: cst.Module) -> bool:
    """Each decode iteration calls ``activate_step_by_batch`` and, at 0 steps, the trivial verify."""
    function = method_of(module, WORKER, ENTRY)
    return function is not None and calls(function, "activate_step_by_batch") and calls(function, "_build_trivial_verify_input")


def _init_cuda_graphs_builds_states(module: cst.Module) -> bool:
    function = method_of(module, WORKER, "init_cuda_graphs")
    return function is not None and calls(function, "register") and calls(function, "init_states")


class EagleWorkerV2DynspecZeroStep(CstPatch):
    REVISION = 1
    TARGET = "srt/speculative/eagle_worker_v2.py"
    SGLANG = ">=0.5.14"
    SUMMARY = "v2 EAGLEWorkerV2: SGLang's zero-step state, switched by batch size with hysteresis"
    ANCHORS = {
        f"{WORKER}.__init__ sets self.adaptive_controller": method_statement(
            WORKER, "__init__", lambda s: is_assignment_to(s, "self.adaptive_controller")
        ),
        f"{WORKER}.{ENTRY} calls activate_step_by_batch and _build_trivial_verify_input": Anchor(
            _entry_consults_the_controller
        ),
        f"{WORKER}.init_cuda_graphs registers states and calls init_states": Anchor(_init_cuda_graphs_builds_states),
        f"{WORKER}.activate_step_by_batch": method(WORKER, "activate_step_by_batch"),
        f"{WORKER}.on_verify_complete_cpu": method(WORKER, "on_verify_complete_cpu"),
        f"{WORKER}.build_adaptive_runtime_state": method(WORKER, "build_adaptive_runtime_state"),
        f"{WORKER}.apply_runtime_state": method(WORKER, "apply_runtime_state"),
    }
    APPLIED = has_class_attribute(WORKER, STATE)

    def transform(self, module: cst.Module) -> cst.Module:
        def edit(worker: cst.ClassDef) -> cst.ClassDef:
            return with_body(worker, attach_in_init(self, module, worker, "attach_zero_step_policy"))

        return replace_class(module, WORKER, edit)
