"""
Validate the dynspec flags when the server starts, in ``ServerArgs.check_server_args`` (every
SGLang release has it, and the engine calls it once all defaults are resolved).

A threshold that can never trigger, or a combination the fallback does not support, fails the
launch with a message that names the flag and the fix, instead of a crash at the first crossing.
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

CHECK = "_dynspec_check_server_args"

CHECK_FUNCTION = '''\
def _dynspec_check_server_args(args):
    """Refuse dynspec flag values and combinations the fallback cannot serve, naming the fix."""
    from sglang.srt.speculative.dynspec_auto import (
        AUTO,
        auto_unavailable,
        parse_threshold,
        zero_step_mode_here,
    )

    disable = parse_threshold(
        getattr(args, "speculative_disable_batch_size", None),
        "--speculative-disable-batch-size",
    )
    if disable == AUTO and not zero_step_mode_here():
        raise auto_unavailable("on this release")
    enable = getattr(args, "speculative_enable_batch_size", None)
    min_steps = getattr(args, "speculative_switch_min_steps", 8)
    if disable is None:
        if enable is not None:
            raise ValueError(
                "--speculative-enable-batch-size needs --speculative-disable-batch-size"
            )
        return
    for flag, value in (
        ("--speculative-enable-batch-size", enable),
        ("--speculative-switch-min-steps", min_steps),
    ):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{flag} must be a positive integer, got {value!r}")
    if enable is not None and disable != AUTO and enable > disable:
        raise ValueError(
            f"--speculative-enable-batch-size ({enable}) must not exceed "
            f"--speculative-disable-batch-size ({disable})"
        )
    algorithm = (getattr(args, "speculative_algorithm", None) or "").upper()
    if algorithm not in ("EAGLE", "EAGLE3"):
        raise ValueError(
            "--speculative-disable-batch-size works with --speculative-algorithm EAGLE or "
            f"EAGLE3, not {algorithm or 'none'}"
        )
    unsupported = (
        ("--speculative-eagle-topk > 1", (getattr(args, "speculative_eagle_topk", 1) or 1) > 1),
        ("--enable-dp-attention", getattr(args, "enable_dp_attention", False)),
        ("--pp-size > 1", (getattr(args, "pp_size", 1) or 1) > 1),
        ("--enable-two-batch-overlap", getattr(args, "enable_two_batch_overlap", False)),
        ("--enable-pdmux", getattr(args, "enable_pdmux", False)),
        ("--enable-multi-layer-eagle", getattr(args, "enable_multi_layer_eagle", False)),
        ("--speculative-adaptive", getattr(args, "speculative_adaptive", False)),
    )
    for flag, present in unsupported:
        if present:
            raise ValueError(f"--speculative-disable-batch-size does not support {flag}")
    # With auto the floor (the enable size, if given) is the size that must leave room above it.
    if disable == AUTO:
        if enable is None:
            return
        threshold, named = enable, f"--speculative-enable-batch-size {enable} (auto's floor)"
    else:
        threshold, named = disable, f"--speculative-disable-batch-size {disable}"
    max_running = getattr(args, "max_running_requests", None)
    if max_running is not None and threshold >= max_running:
        raise ValueError(
            f"{named} can never trigger: at most "
            f"{max_running} requests run at once; lower it or raise --max-running-requests"
        )
    if not getattr(args, "disable_cuda_graph", False):
        graph_sizes = getattr(args, "cuda_graph_bs", None)
        largest = max(graph_sizes) if graph_sizes else getattr(args, "cuda_graph_max_bs", None)
        if largest is not None and threshold >= largest:
            raise ValueError(
                f"{named} is not below the largest CUDA-graph "
                f"batch size ({largest}), so the fallback would never run on a graph; raise "
                f"--cuda-graph-max-bs above {threshold} or lower the threshold"
            )
'''

class ServerArgsDynspecCheck(CstPatch):
    REVISION = 4
    TARGET = "srt/server_args.py"
    SGLANG = ">=0.4.10.post2"
    SUMMARY = "validate the dynspec flags at startup (ServerArgs.check_server_args)"
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


