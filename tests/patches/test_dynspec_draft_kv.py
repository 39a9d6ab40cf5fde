"""The draft side of a fallback iteration: ``DraftKV`` (kv, kv-graph, full, skip), ``RESUME``, the recorder.

With ``DYNSPEC_DRAFT_KV=kv`` or ``kv-graph`` a fallback iteration's draft extend writes only the
draft model's KV (eagerly, or replayed from a second draft-extend graph captured through the
stand-in forward); the iteration that switches speculation back on runs the full one. ``auto`` is
``DRAFT_KV_DEFAULT``, the full extend. These tests drive ``DraftKV.kv_only`` and
``DraftKV.capture_graph`` through a fake draft stack with SGLang's call structure (``fake_draft``),
so what they check is what a real extend would do: which stages ran, what the KV pool holds, what
is left on the objects afterwards. What only a GPU shows (the drafts after a fallback span equal a
full extend's) is ``dynspec proof``'s ``exact_kv``; the names the runtime and that check share are
pinned here.
"""

from __future__ import annotations

import ast
import contextlib
import enum
import json
import logging
import random
import re
import sys
import types
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from packaging.version import Version

from patcher import releases
from patcher.proof import exactkv
from patcher.proof import run as proof_run
from patches.eagle_worker_v2_dynspec_fallback import EagleWorkerV2DynspecFallback
from patches.eagle_worker_v2_dynspec_zero_step import EagleWorkerV2DynspecZeroStep
from patches.runtime import dynspec_runtime as runtime
from patches.runtime import dynspec_v2 as v2
from tests.conftest import RELEASES, releases_of
from tests.patches import test_speculative_dynspec_runtime as runtime_tests
from tests.patches import test_speculative_dynspec_v2 as v2_tests
from tests.patches.fake_draft import (
    CAPTURE,
    DEVICE,
    EXTEND,
    GRAPH_ATTRIBUTES,
    HIDDEN,
    SPEC_HIDDEN,
    VOCAB,
    DraftStack,
    EAGLEDraftExtendCudaGraphRunner,
    EAGLEDraftExtendCudaGraphRunnerUpTo0510,
    Extend,
    LlamaForCausalLMEagle,
    LlamaForCausalLMEagle3,
    RadixAttention,
    Rows,
    TritonAttnBackend,
    Zeros,
    draft_stack,
    full_forward_kv,
    graph_attributes,
    install_fake_torch,
    kv_of,
)
from tests.patches.patched_package import install_patched_package

KV, GRAPH, FULL, SKIP = runtime.DRAFT_KV_ONLY, runtime.DRAFT_KV_GRAPH, runtime.DRAFT_KV_FULL, runtime.DRAFT_KV_SKIP
DIRECT = runtime.DRAFT_KV_DIRECT
PLACEHOLDER_LOGITS = Zeros((3, 1), "torch.float32", DEVICE)


@pytest.fixture(autouse=True)
def sglang_side(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch and the SGLang modules the runtime imports inside functions; no DYNSPEC_* from the shell."""
    for name in (runtime.DRAFT_KV_ENV, runtime.RECORD_ENV, runtime.ATTENTION_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(v2.EARLY_FENCE_ENV, "0")  # no CUDA event to record
    install_patched_package(monkeypatch)
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    install_fake_torch(monkeypatch)


def stack_under(monkeypatch: pytest.MonkeyPatch, setting: str) -> DraftStack:
    """A draft stack on a server started with ``DYNSPEC_DRAFT_KV=setting`` (read when dynspec attaches)."""
    monkeypatch.setenv(runtime.DRAFT_KV_ENV, setting)
    return draft_stack()


def draft_kv_for(stack: DraftStack, mode: str = KV, log: bool = True) -> runtime.DraftKV:
    return runtime.DraftKV(mode, stack.runner, log=log)


def what_ran(log: list[str]) -> str:
    """``kv``: the draft forward stopped at its KV write; ``full``: it ran to the lm_head; else ``none``."""
    if "lm_head" in log:
        return "full"
    return "kv" if "set_kv_buffer" in log else "none"


def warnings_in(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# -- kv: the K/V of a full forward, nothing after it ---------------------------------------------


@pytest.mark.parametrize("backend", ["triton", "triton-own-pool"], ids=["pool-on-forward-batch", "pool-on-backend"])
def test_kv_mode_writes_exactly_the_kv_of_a_full_forward_and_runs_nothing_after_it(backend: str) -> None:
    stack = draft_stack(backend=backend)
    draft_kv = draft_kv_for(stack)
    with draft_kv.kv_only(stack.worker):
        stack.extend()
    assert stack.pool.kv == full_forward_kv() and len(stack.pool.kv) == 3
    # no attention, MLP or lm_head; the stock code after the forward (top-k) still runs
    assert stack.log == ["embed", "qkv 0", "set_kv_buffer", "topk"]
    assert draft_kv.mode == KV


def test_the_kv_comparison_fails_for_a_stand_in_that_stops_before_the_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control for the test above: stopping one call too early leaves the pool without the K/V."""

    def stop_before_writing(self: runtime.DraftKV, write: Any, *args: Any, **kwargs: Any) -> None:
        raise runtime._DraftKVWritten()

    monkeypatch.setattr(runtime.DraftKV, "_write_and_stop", stop_before_writing)
    stack = draft_stack()
    with draft_kv_for(stack).kv_only(stack.worker):
        stack.extend()
    assert stack.pool.kv != full_forward_kv()
    assert stack.log == ["embed", "qkv 0", "topk"]


def test_the_kv_depends_on_each_positions_inputs_so_equality_is_not_trivial() -> None:
    moved = Extend(EXTEND.tokens, [p + 1 for p in EXTEND.positions], EXTEND.slots, EXTEND.hidden)
    other_token = Extend([t + 1 for t in EXTEND.tokens], EXTEND.positions, EXTEND.slots, EXTEND.hidden)
    assert len({tuple(sorted(full_forward_kv(e).items())) for e in (EXTEND, moved, other_token)}) == 3


@pytest.mark.parametrize(("spec_hidden_size", "width"), [(SPEC_HIDDEN, SPEC_HIDDEN), (None, HIDDEN)])
def test_the_placeholder_has_one_logit_column_and_the_drafts_hidden_width(
    spec_hidden_size: int | None, width: int
) -> None:
    stack = draft_stack(spec_hidden_size=spec_hidden_size)
    with draft_kv_for(stack).kv_only(stack.worker):
        out = stack.extend()
    assert out.next_token_logits == PLACEHOLDER_LOGITS
    assert out.hidden_states == Zeros((3, width), "torch.bfloat16", DEVICE)  # the draft model's dtype


def test_graph_runners_are_set_aside_inside_the_window_and_put_back_after() -> None:
    stack = draft_stack(runner_graphs=("prefill_cuda_graph_runner", "piecewise_cuda_graph_runner"))
    before = graph_attributes(stack.worker)
    assert None not in before.values() and "missing" not in before.values()
    with draft_kv_for(stack).kv_only(stack.worker):
        stack.extend()
    assert stack.worker.seen_inside == [dict.fromkeys(GRAPH_ATTRIBUTES)]
    after = graph_attributes(stack.worker)
    assert all(after[name] is before[name] for name in GRAPH_ATTRIBUTES)
    assert not any("replay" in line for line in stack.log)


def test_graph_attributes_a_release_does_not_have_are_not_created() -> None:
    stack = draft_stack(runner_graphs=("piecewise_cuda_graph_runner",))  # up to 0.5.13: no prefill graph runner
    stack.runner.piecewise_cuda_graph_runner = None  # and this one disabled
    with draft_kv_for(stack).kv_only(stack.worker):
        stack.extend()
    assert stack.worker.seen_inside[0]["runner.prefill_cuda_graph_runner"] == "missing"
    assert not hasattr(stack.runner, "prefill_cuda_graph_runner")
    assert stack.runner.piecewise_cuda_graph_runner is None


def test_a_graph_left_in_place_would_bypass_the_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the graphs are set aside: a replay never calls the model's Python forward."""
    monkeypatch.setattr(runtime, "_WORKER_GRAPH", "a_graph_runner_no_release_has")  # the worker's is left alone
    stack = draft_stack()
    with draft_kv_for(stack).kv_only(stack.worker):
        stack.extend()
    assert stack.log[0] == "draft extend graph replay" and what_ran(stack.log) == "full"


def test_no_instance_attribute_is_left_on_the_model_or_the_pool() -> None:
    stack = draft_stack()
    inside: list[tuple[bool, bool]] = []

    def write(*args: Any) -> None:
        inside.append(("forward" in vars(stack.model), "set_kv_buffer" in vars(stack.pool)))
        type(stack.backend).write(stack.backend, *args)

    stack.backend.write = write  # type: ignore[method-assign]
    with draft_kv_for(stack).kv_only(stack.worker):
        stack.extend()
    assert inside == [(True, True)]  # both shadowed while the draft forward ran
    assert "forward" not in vars(stack.model) and "set_kv_buffer" not in vars(stack.pool)
    assert stack.model.forward.__func__ is LlamaForCausalLMEagle3.forward  # type: ignore[attr-defined]


def test_instance_attributes_that_were_there_are_put_back_and_used() -> None:
    stack = draft_stack()
    own_forward, own_write = stack.model.forward, stack.pool.set_kv_buffer

    def compiled_forward(*args: Any, **kwargs: Any) -> Any:  # e.g. a compiled forward set on the instance
        stack.log.append("compiled forward")
        return own_forward(*args, **kwargs)

    def watched_write(*args: Any, **kwargs: Any) -> Any:
        stack.log.append("watched write")
        return own_write(*args, **kwargs)

    stack.model.forward = compiled_forward  # type: ignore[method-assign]
    stack.pool.set_kv_buffer = watched_write  # type: ignore[method-assign]
    with draft_kv_for(stack).kv_only(stack.worker):
        stack.extend()
    assert vars(stack.model)["forward"] is compiled_forward and vars(stack.pool)["set_kv_buffer"] is watched_write
    assert stack.log == ["compiled forward", "embed", "qkv 0", "watched write", "set_kv_buffer", "topk"]
    assert stack.pool.kv == full_forward_kv()


def break_in(stack: DraftStack, where: str) -> None:
    def boom(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"boom in {where}")

    if where == "the layer, before the write":
        stack.backend.write = boom  # type: ignore[method-assign]
    elif where == "the write":
        stack.pool.store = boom  # type: ignore[method-assign]


@pytest.mark.parametrize("where", ["the stock code", "the layer, before the write", "the write"])
def test_everything_is_put_back_when_the_window_raises(where: str) -> None:
    stack = draft_stack(runner_graphs=("prefill_cuda_graph_runner", "piecewise_cuda_graph_runner"))
    draft_kv = draft_kv_for(stack)
    before = graph_attributes(stack.worker)
    break_in(stack, where)
    with pytest.raises(RuntimeError, match=f"boom in {where}"), draft_kv.kv_only(stack.worker):
        if where == "the stock code":
            raise RuntimeError("boom in the stock code")
        stack.extend()
    after = graph_attributes(stack.worker)
    assert all(after[name] is before[name] for name in GRAPH_ATTRIBUTES)
    assert "forward" not in vars(stack.model) and "set_kv_buffer" not in vars(stack.pool)
    assert (draft_kv._active, draft_kv._real_forward, draft_kv.mode) == (False, None, KV)
    vars(stack.pool).pop("store", None)  # mend the fault: the next write goes in, nothing stops it
    stack.pool.set_kv_buffer(RadixAttention(0), Rows([5]), [1], [2])
    assert stack.pool.kv[(0, 5)] == (1, 2)


# -- full and skip -------------------------------------------------------------------------------


def test_full_mode_leaves_the_stock_path_alone() -> None:
    stack = draft_stack()
    draft_kv = draft_kv_for(stack, FULL)
    with draft_kv.kv_only(stack.worker):
        assert "forward" not in vars(stack.model)
        out = stack.extend()
    assert (
        stack.worker.seen_inside[0]["cuda_graph_runner_for_draft_extend"]
        is stack.worker.cuda_graph_runner_for_draft_extend
    )
    assert stack.log == [
        "draft extend graph replay",
        "embed",
        "qkv 0",
        "set_kv_buffer",
        "attention",
        "mlp 0",
        "lm_head",
        "topk",
    ]
    assert out.next_token_logits == ("logits", 3, VOCAB)
    assert not draft_kv.saves_work


def test_skip_mode_writes_no_kv_and_returns_the_placeholder() -> None:
    stack = draft_stack()
    with draft_kv_for(stack, SKIP).kv_only(stack.worker):
        out = stack.extend()
    assert stack.pool.kv == {} and stack.log == ["topk"]
    assert out.next_token_logits == PLACEHOLDER_LOGITS


# -- choosing the mode at start-up ---------------------------------------------------------------


def test_auto_is_what_exact_kv_proved_on_each_path() -> None:
    """Measured on the H200: on the zero-step state (0.5.17) fed directly and from a graph, 0.97 / 0.99
    of a plain decode step at 64 / 128 requests fed directly; on dynspec's own v2 fallback (0.5.12,
    0.5.13) fed directly, eagerly where it cannot be (``own_fallback_draft_kv_default``, in
    test_dynspec_direct_kv.py); on v1 (0.5.12) fed directly, bit for bit (session 13), and full on
    older v1 releases (``v1_draft_kv_default``, in test_dynspec_direct_kv.py)."""
    assert (
        runtime.DRAFT_KV_DEFAULT,
        runtime.DRAFT_KV_DEFAULT_OWN_FALLBACK,
        runtime.DRAFT_KV_DEFAULT_OWN_FALLBACK_UNFED,
        runtime.DRAFT_KV_DEFAULT_V1,
    ) == (runtime.DRAFT_KV_DIRECT, runtime.DRAFT_KV_DIRECT, KV, runtime.DRAFT_KV_DIRECT)
    assert runtime.DraftKV.build(draft_stack().runner, log=False).mode == runtime.DRAFT_KV_DIRECT
    assert runtime.DraftKV.build(draft_stack().runner, log=False, auto=FULL).mode == FULL


def test_a_default_that_must_be_worked_out_is_asked_only_for_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def default() -> str:
        asked.append("asked")
        return KV

    monkeypatch.setenv(runtime.DRAFT_KV_ENV, FULL)
    assert runtime.DraftKV.build(draft_stack().runner, log=False, auto=default).mode == FULL and asked == []
    monkeypatch.setenv(runtime.DRAFT_KV_ENV, "auto")  # the control: auto asks it
    assert runtime.DraftKV.build(draft_stack().runner, log=False, auto=default).mode == KV and asked == ["asked"]


# Drafts the KV-only extend cannot serve, and the words that say why.
UNSERVABLE_DRAFTS: dict[str, Any] = {
    "argvalues": [
        ({"model_class": LlamaForCausalLMEagle}, "does not know the draft model class LlamaForCausalLMEagle"),
        ({"layers": 2}, "needs a one-layer draft; LlamaForCausalLMEagle3 has 2 attention layers"),
    ],
    "ids": ["unknown-class", "two-layers"],
}


@pytest.mark.parametrize("default", [KV, GRAPH, runtime.DRAFT_KV_DIRECT])
def test_auto_is_the_callers_default(default: str) -> None:
    assert runtime.DraftKV.build(draft_stack().runner, log=False, auto=default).mode == default


@pytest.mark.parametrize("default", [KV, GRAPH, runtime.DRAFT_KV_DIRECT])
@pytest.mark.parametrize(("stack_options", "why"), **UNSERVABLE_DRAFTS)
def test_a_kv_only_default_meets_a_draft_it_cannot_serve_with_the_full_extend_said_once(
    default: str,
    stack_options: dict[str, Any],
    why: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only ``auto`` falls back so; an explicit kv or kv-graph refuses (above)."""
    with caplog.at_level(logging.INFO, logger=runtime.__name__):
        draft_kv = runtime.DraftKV.build(draft_stack(**stack_options).runner, auto=default)
        quiet = runtime.DraftKV.build(draft_stack(**stack_options).runner, log=False, auto=default)  # rank > 0
    assert draft_kv.mode == quiet.mode == FULL
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            logging.INFO,
            f"dynspec: the KV-only draft extend {why}; the fallback runs the full draft extend in every iteration",
        )
    ]
    monkeypatch.setenv(runtime.DRAFT_KV_ENV, default)
    with pytest.raises(ValueError, match=re.escape(f"DYNSPEC_DRAFT_KV={default}: the KV-only draft extend {why}")):
        runtime.DraftKV.build(draft_stack(**stack_options).runner)


@pytest.mark.parametrize(
    "stack_options",
    [{}, {"model_class": LlamaForCausalLMEagle}, {"layers": 2}],
    ids=["eagle3", "unknown-class", "two-layers"],
)
def test_unproven_auto_is_full_for_any_draft_and_says_nothing(
    stack_options: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=runtime.__name__):
        draft_kv = runtime.DraftKV.build(draft_stack(**stack_options).runner, auto=FULL)  # older v1 releases
    assert draft_kv.mode == FULL and draft_kv.graph is None
    assert caplog.records == []


@pytest.mark.parametrize("mode", [KV, GRAPH, runtime.DRAFT_KV_DIRECT])
@pytest.mark.parametrize(("stack_options", "named"), **UNSERVABLE_DRAFTS)
def test_kv_asked_for_where_it_cannot_work_is_refused(
    monkeypatch: pytest.MonkeyPatch, mode: str, stack_options: dict[str, Any], named: str
) -> None:
    monkeypatch.setenv(runtime.DRAFT_KV_ENV, mode)
    with pytest.raises(ValueError, match=re.escape(f"DYNSPEC_DRAFT_KV={mode}: the KV-only draft extend {named}")):
        runtime.DraftKV.build(draft_stack(**stack_options).runner)


@pytest.mark.parametrize("mode", [KV, GRAPH])
def test_the_draft_pool_is_read_when_a_window_needs_it_not_at_start_up(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0.5.14+ allocate the draft KV pool after the worker (and so the fallback) is built."""
    stack = stack_under(monkeypatch, mode)
    pool, stack.runner.token_to_kv_pool = stack.runner.token_to_kv_pool, None
    draft_kv = runtime.DraftKV.build(stack.runner)
    assert draft_kv.mode == mode and runtime.kv_only_unsupported(stack.model) is None
    stack.runner.token_to_kv_pool = pool
    with draft_kv.kv_only(stack.worker):
        stack.extend()
    assert stack.log == ["embed", "qkv 0", "set_kv_buffer", "topk"] and stack.pool.kv == full_forward_kv()


@pytest.mark.parametrize(
    ("setting", "mode"),
    [
        ("", DIRECT),
        ("auto", DIRECT),
        (" AUTO ", DIRECT),
        (" KV ", KV),
        ("Kv-Graph", GRAPH),
        ("full", FULL),
        ("Skip", SKIP),
    ],
)
def test_the_setting_is_read_case_and_space_insensitively(
    monkeypatch: pytest.MonkeyPatch, setting: str, mode: str
) -> None:
    monkeypatch.setenv(runtime.DRAFT_KV_ENV, setting)
    assert runtime.DraftKV.build(draft_stack().runner, log=False).mode == mode


def test_full_and_skip_need_nothing_of_the_draft(monkeypatch: pytest.MonkeyPatch) -> None:
    for setting, mode in (("auto", FULL), (FULL, FULL), (SKIP, SKIP)):
        monkeypatch.setenv(runtime.DRAFT_KV_ENV, setting)
        assert runtime.DraftKV.build(draft_stack(layers=2).runner, log=False).mode == mode


@pytest.mark.parametrize("setting", ["fast", "graph", "kv_graph", "kvgraph"])
def test_a_bad_setting_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, setting: str) -> None:
    monkeypatch.setenv(runtime.DRAFT_KV_ENV, setting)
    with pytest.raises(
        ValueError,
        match=re.escape(f"DYNSPEC_DRAFT_KV must be one of auto, full, kv, kv-graph, kv-direct, skip, not {setting!r}"),
    ):
        runtime.DraftKV.build(draft_stack().runner)


def test_skip_warns_that_it_is_a_negative_control(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(runtime.DRAFT_KV_ENV, "skip")
    with caplog.at_level(logging.INFO, logger=runtime.__name__):
        runtime.DraftKV.build(draft_stack().runner)
        runtime.DraftKV.build(draft_stack().runner, log=False)
    assert len(caplog.records) == 1 and caplog.records[0].levelno == logging.WARNING
    assert "DYNSPEC_DRAFT_KV=skip" in caplog.text and "negative control, not for serving" in caplog.text


# -- giving kv up where it cannot work -----------------------------------------------------------


@pytest.mark.parametrize("backend", ["fused", "prebound"])
def test_a_backend_that_writes_the_kv_another_way_gets_the_full_extend(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    stack = draft_stack(backend=backend)
    draft_kv = draft_kv_for(stack)
    with caplog.at_level(logging.WARNING, logger=runtime.__name__):
        with draft_kv.kv_only(stack.worker):
            out = stack.extend()
        assert out.next_token_logits == ("logits", 3, VOCAB)  # the full forward's own output, not the placeholder
        assert stack.pool.kv == full_forward_kv() and what_ran(stack.log) == "full"
        assert draft_kv.mode == FULL
        stack.clear()
        with draft_kv.kv_only(stack.worker):  # from now on the stock path, graph included
            stack.extend()
    assert stack.log[0] == "draft extend graph replay"
    assert warnings_in(caplog) == [
        "dynspec: DYNSPEC_DRAFT_KV=kv cannot work here (MHATokenToKVPool.set_kv_buffer was not called by the "
        "draft layer); running the full draft extend"
    ]


class SlottedPool:
    """A pool without an instance ``__dict__``: its ``set_kv_buffer`` cannot be shadowed."""

    __slots__ = ("kv", "log")

    def __init__(self, log: list[str]) -> None:
        self.kv: dict[tuple[int, int], tuple[int, int]] = {}
        self.log = log

    def set_kv_buffer(self, layer: Any, loc: Rows, cache_k: list[int], cache_v: list[int], *scales: Any) -> None:
        self.log.append("set_kv_buffer")
        self.kv.update({(layer.layer_id, slot): (k, v) for slot, k, v in zip(loc.values, cache_k, cache_v)})


def test_a_pool_that_cannot_be_watched_gets_the_full_extend(caplog: pytest.LogCaptureFixture) -> None:
    stack = draft_stack()
    stack.runner.token_to_kv_pool = pool = SlottedPool(stack.log)
    draft_kv = draft_kv_for(stack)
    with caplog.at_level(logging.WARNING, logger=runtime.__name__), draft_kv.kv_only(stack.worker):
        out = stack.extend()
    assert out.next_token_logits == ("logits", 3, VOCAB) and what_ran(stack.log) == "full"
    assert pool.kv == full_forward_kv() and draft_kv.mode == FULL
    assert warnings_in(caplog) == [
        "dynspec: DYNSPEC_DRAFT_KV=kv cannot work here (the draft KV pool (SlottedPool) cannot be watched for its "
        "KV write); running the full draft extend"
    ]


# kv-graph without a graph (the capture failed) is eager: its windows count, unlike replayed ones (below);
# skip, which never sees a draft forward either, gives up too.
@pytest.mark.parametrize("mode", [KV, GRAPH, SKIP])
def test_64_windows_without_a_draft_forward_turn_kv_into_full(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    """A path that never calls the stand-in (a graph this module does not know) saves nothing: say so, once."""
    stack = draft_stack()
    draft_kv = draft_kv_for(stack, mode)
    with caplog.at_level(logging.WARNING, logger=runtime.__name__):
        for _ in range(63):
            with draft_kv.kv_only(stack.worker):
                pass
        assert draft_kv.mode == mode
        with draft_kv.kv_only(stack.worker):
            pass
        assert draft_kv.mode == FULL
        for _ in range(100):
            with draft_kv.kv_only(stack.worker):
                pass
    assert warnings_in(caplog) == [
        f"dynspec: DYNSPEC_DRAFT_KV={mode} cannot work here (the draft model's forward was not called in 64 fallback "
        "iterations); running the full draft extend"
    ]


@pytest.mark.parametrize("called_at", [0, 63])
def test_windows_in_which_the_draft_forward_ran_keep_kv(called_at: int, caplog: pytest.LogCaptureFixture) -> None:
    """Windows whose requests all finished run no extend; one that ran is enough."""
    stack = draft_stack()
    draft_kv = draft_kv_for(stack)
    with caplog.at_level(logging.WARNING, logger=runtime.__name__):
        for window in range(300):
            with draft_kv.kv_only(stack.worker):
                if window == called_at:
                    stack.extend()
    assert draft_kv.mode == KV and warnings_in(caplog) == []


def test_a_rank_that_does_not_log_gives_up_silently(caplog: pytest.LogCaptureFixture) -> None:
    stack = draft_stack(backend="fused")
    draft_kv = draft_kv_for(stack, log=False)
    with caplog.at_level(logging.INFO, logger=runtime.__name__), draft_kv.kv_only(stack.worker):
        stack.extend()
    assert draft_kv.mode == FULL and caplog.records == []


@pytest.mark.parametrize("backend", ["triton", "lazy"])
def test_a_kv_write_outside_the_stand_in_never_raises(backend: str) -> None:
    """Prefill and anything else that writes the draft KV outside the draft forward goes through, even
    through a ``set_kv_buffer`` a backend kept from inside a window (``lazy``)."""
    stack = draft_stack(backend=backend)
    draft_kv = draft_kv_for(stack)
    layer = RadixAttention(0)
    stack.pool.set_kv_buffer(layer, Rows([1]), [10], [11])  # a prefill before any window
    with draft_kv.kv_only(stack.worker):
        stack.pool.set_kv_buffer(layer, Rows([2]), [20], [21])  # in the window, before the draft forward
        stack.extend()
        stack.pool.set_kv_buffer(layer, Rows([3]), [30], [31])  # after it
    stack.clear()
    stack.runner.forward(stack.worker.forward_batch(Extend([5], [6], [4])))  # an eager prefill after the window
    assert stack.log == ["piecewise graph replay", "embed", "qkv 0", "set_kv_buffer", "attention", "mlp 0", "lm_head"]
    assert {slot for _, slot in stack.pool.kv} == {1, 2, 3, 4, *EXTEND.slots}
    stack.clear()
    with draft_kv.kv_only(stack.worker):  # and the next window still stops at the write
        stack.extend()
    assert stack.log == ["embed", "qkv 0", "set_kv_buffer", "topk"] and draft_kv.mode == KV


# -- kv-graph: the KV-only extend replayed from a graph captured through the stand-in ----------------

KV_ONLY_KERNELS = ["embed", "qkv 0", "set_kv_buffer"]
FULL_KERNELS = ["embed", "qkv 0", "set_kv_buffer", "attention", "mlp 0", "lm_head"]
TWO_TOKENS = Extend(tokens=[11, 12], positions=[40, 41], slots=[900, 901])  # a shape the graph was not captured for


class _Captured:
    """Matches the info line of a capture, whatever it took."""

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, str)
            and re.fullmatch(r"dynspec: KV-only draft-extend CUDA graph captured in \d+\.\d\d s", other) is not None
        )

    def __repr__(self) -> str:
        return "'dynspec: KV-only draft-extend CUDA graph captured in <t> s'"


ANY_CAPTURED = _Captured()


def captured(stack: DraftStack, log: bool = True) -> runtime.DraftKV:
    """A kv-graph DraftKV whose graph is a new instance of the release's draft-extend graph runner class,
    built on the backend whose CUDA-graph buffers the stock runner allocated (made here)."""
    stack.backend.init_cuda_graph_state(len(CAPTURE.tokens), len(CAPTURE.tokens))  # the stock runner's, at start-up
    draft_kv = draft_kv_for(stack, GRAPH, log=log)
    draft_kv.capture_graph(lambda: EAGLEDraftExtendCudaGraphRunner(stack.worker), stack.backend)
    return draft_kv


def outside_capture(pool: Any) -> dict[tuple[int, int], tuple[int, int]]:
    """The pool's K/V without the padding slot a capture writes into."""
    return {key: kv for key, kv in pool.kv.items() if key[1] != CAPTURE.slots[0]}


def test_capture_graph_builds_the_runner_under_the_stand_in(caplog: pytest.LogCaptureFixture) -> None:
    stack = draft_stack()
    with caplog.at_level(logging.INFO, logger=runtime.__name__):
        draft_kv = captured(stack)
    graph = draft_kv.graph
    assert isinstance(graph, EAGLEDraftExtendCudaGraphRunner) and draft_kv.mode == GRAPH
    # the capture's forward wrote the static batch's K/V and stopped there; the runner got the placeholder
    assert graph.kernels == KV_ONLY_KERNELS
    assert stack.pool.kv == {(0, CAPTURE.slots[0]): kv_of(0, 0, 0)}
    assert graph.output.next_token_logits == PLACEHOLDER_LOGITS
    assert graph.output.hidden_states == Zeros((3, SPEC_HIDDEN), "torch.bfloat16", DEVICE)
    # nothing left shadowed, the stock graph where it was
    assert "forward" not in vars(stack.model) and "set_kv_buffer" not in vars(stack.pool)
    assert (draft_kv._active, draft_kv._real_forward) == (False, None)
    assert stack.worker.cuda_graph_runner_for_draft_extend is not graph
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.INFO, ANY_CAPTURED)]
    assert (
        runtime.describe_draft_kv(draft_kv)
        == "draft KV only while off (from a CUDA graph), full draft extend at resume"
    )


def test_the_same_runner_class_built_outside_the_stand_in_captures_the_full_forward() -> None:
    """The control for the test above: what made the capture KV-only is the stand-in."""
    stack = draft_stack()
    graph = EAGLEDraftExtendCudaGraphRunner(stack.worker)
    assert graph.kernels == FULL_KERNELS and graph.output.next_token_logits == ("logits", 3, VOCAB)


def test_the_twin_captures_on_the_buffers_the_stock_runner_allocated() -> None:
    stack = draft_stack()
    stock = EAGLEDraftExtendCudaGraphRunner(stack.worker)  # at start-up: allocates the backend's graph buffers
    buffers = stack.backend.cuda_graph_buffers
    draft_kv = draft_kv_for(stack, GRAPH)
    draft_kv.capture_graph(lambda: EAGLEDraftExtendCudaGraphRunner(stack.worker), stack.backend)
    assert draft_kv.graph is not None and draft_kv.graph.buffers is buffers
    assert stack.backend.cuda_graph_buffers is buffers and stack.backend.cuda_graph_state_inits == 1
    assert "init_cuda_graph_state" not in vars(stack.backend)
    stack.worker.cuda_graph_runner_for_draft_extend = stock
    stack.clear()
    stack.extend()  # the stock graph still reads the buffers the backend refills
    assert stack.log == ["draft extend graph replay", *FULL_KERNELS, "topk"]


def test_a_second_runner_built_plainly_would_leave_the_stock_graph_on_stale_buffers() -> None:
    """The control for the test above: why capture_graph keeps the backend's buffers while the twin is built."""
    stack = draft_stack()
    stack.worker.cuda_graph_runner_for_draft_extend = EAGLEDraftExtendCudaGraphRunner(stack.worker)
    EAGLEDraftExtendCudaGraphRunner(stack.worker)
    assert stack.backend.cuda_graph_state_inits == 2
    with pytest.raises(AssertionError, match="replays on buffers nobody refills"):
        stack.extend()


def test_the_twin_plans_into_copies_of_the_backends_per_size_wrappers() -> None:
    """FlashInfer keeps a planning object per captured size (``draft_extend_cuda_graph_metadata[bs]``);
    the twin's capture must not replace the stock graph's, which its next replay plans into."""
    stack = draft_stack()
    stock = {8: "stock wrappers 8"}
    stack.backend.draft_extend_cuda_graph_metadata = stock
    stack.backend.graph_metadata_note = "a str, not a dict"
    draft_kv = draft_kv_for(stack, GRAPH)

    def build() -> Any:
        backend = stack.backend
        assert backend.draft_extend_cuda_graph_metadata == stock  # a copy holding the stock's
        assert backend.draft_extend_cuda_graph_metadata is not stock
        backend.draft_extend_cuda_graph_metadata.update({8: "twin wrappers 8", 16: "twin wrappers 16"})
        return EAGLEDraftExtendCudaGraphRunner(stack.worker)

    draft_kv.capture_graph(build, stack.backend)
    assert draft_kv.graph is not None
    assert stack.backend.draft_extend_cuda_graph_metadata is stock and stock == {8: "stock wrappers 8"}
    assert stack.backend.graph_metadata_note == "a str, not a dict"


def test_the_backends_buffers_are_its_own_again_when_the_build_fails() -> None:
    stack = draft_stack()
    draft_kv = draft_kv_for(stack, GRAPH, log=False)

    def build() -> None:
        assert "init_cuda_graph_state" in vars(stack.backend)  # kept while the twin is built
        stack.backend.init_cuda_graph_state(3, 3)
        raise RuntimeError("capture failed")

    draft_kv.capture_graph(build, stack.backend)
    assert draft_kv.graph is None and "init_cuda_graph_state" not in vars(stack.backend)
    assert stack.backend.cuda_graph_state_inits == 0
    stack.backend.init_cuda_graph_state(3, 3)
    assert stack.backend.cuda_graph_state_inits == 1


def test_without_a_backend_the_twin_allocates_its_own_buffers() -> None:
    """A release whose stock runner and worker name no draft-extend backend: nothing to keep."""
    stack = draft_stack()
    draft_kv = draft_kv_for(stack, GRAPH)
    draft_kv.capture_graph(lambda: EAGLEDraftExtendCudaGraphRunner(stack.worker), None)
    assert draft_kv.graph is not None and draft_kv.graph.kernels == KV_ONLY_KERNELS
    assert stack.backend.cuda_graph_state_inits == 1


def test_kv_graph_replays_the_captured_graph_in_the_window_and_puts_the_stock_one_back() -> None:
    stack = draft_stack(runner_graphs=("prefill_cuda_graph_runner", "piecewise_cuda_graph_runner"))
    draft_kv = captured(stack)
    before = graph_attributes(stack.worker)
    stack.clear()
    with draft_kv.kv_only(stack.worker):
        out = stack.extend()
    assert stack.worker.seen_inside == [
        {
            "cuda_graph_runner_for_draft_extend": draft_kv.graph,
            "runner.prefill_cuda_graph_runner": None,
            "runner.piecewise_cuda_graph_runner": None,
        }
    ]
    # the replay wrote the K/V of a full forward and ran nothing after the write; the model's forward was not called
    assert stack.log == ["draft extend graph replay", *KV_ONLY_KERNELS, "topk"]
    assert outside_capture(stack.pool) == full_forward_kv()
    assert out.next_token_logits == PLACEHOLDER_LOGITS and not draft_kv._called
    after = graph_attributes(stack.worker)
    assert all(after[name] is before[name] for name in GRAPH_ATTRIBUTES)
    assert "forward" not in vars(stack.model) and draft_kv.mode == GRAPH


def test_the_graph_is_put_back_when_the_window_raises() -> None:
    stack = draft_stack(runner_graphs=("prefill_cuda_graph_runner", "piecewise_cuda_graph_runner"))
    draft_kv = captured(stack)
    before = graph_attributes(stack.worker)
    with pytest.raises(RuntimeError, match="boom"), draft_kv.kv_only(stack.worker):
        assert stack.worker.cuda_graph_runner_for_draft_extend is draft_kv.graph
        raise RuntimeError("boom")
    after = graph_attributes(stack.worker)
    assert all(after[name] is before[name] for name in GRAPH_ATTRIBUTES)
    assert "forward" not in vars(stack.model) and draft_kv.graph is not None


def test_a_batch_the_graph_cannot_run_goes_eagerly_through_the_stand_in() -> None:
    stack = draft_stack()
    draft_kv = captured(stack)
    stack.clear()
    with draft_kv.kv_only(stack.worker):
        out = stack.extend(TWO_TOKENS)
    assert stack.log == [*KV_ONLY_KERNELS, "topk"] and draft_kv._called
    assert outside_capture(stack.pool) == full_forward_kv(TWO_TOKENS)
    assert out.next_token_logits == Zeros((2, 1), "torch.float32", DEVICE) and draft_kv.mode == GRAPH


@pytest.mark.parametrize("mode", [KV, FULL, SKIP])
def test_capture_graph_builds_nothing_outside_kv_graph(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    stack = draft_stack()
    draft_kv = draft_kv_for(stack, mode)
    built: list[Any] = []
    with caplog.at_level(logging.INFO, logger=runtime.__name__):
        draft_kv.capture_graph(lambda: built.append(EAGLEDraftExtendCudaGraphRunner(stack.worker)), stack.backend)
    assert built == [] and draft_kv.graph is None and stack.log == [] and caplog.records == []
    assert "init_cuda_graph_state" not in vars(stack.backend)
    assert draft_kv.mode == mode


def test_kv_never_replays_a_graph() -> None:
    """kv is the eager KV-only extend: the worker's graph is set aside even if one were captured."""
    stack = draft_stack()
    draft_kv = captured(stack)
    draft_kv.mode = KV
    stack.clear()
    with draft_kv.kv_only(stack.worker):
        stack.extend()
    assert stack.worker.seen_inside[0]["cuda_graph_runner_for_draft_extend"] is None
    assert stack.log == [*KV_ONLY_KERNELS, "topk"]


def test_a_capture_that_fails_leaves_kv_graph_eager_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    stack = draft_stack()
    break_in(stack, "the layer, before the write")
    with caplog.at_level(logging.INFO, logger=runtime.__name__):
        draft_kv = captured(stack)
    assert draft_kv.graph is None and draft_kv.mode == GRAPH
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            logging.WARNING,
            "dynspec: no KV-only draft-extend CUDA graph (RuntimeError('boom in the layer, before the write')); "
            "the KV-only extend runs eagerly",
        )
    ]
    assert "forward" not in vars(stack.model) and "set_kv_buffer" not in vars(stack.pool)
    assert (draft_kv._active, draft_kv._real_forward) == (False, None)
    assert runtime.describe_draft_kv(draft_kv) == "draft KV only while off (eagerly), full draft extend at resume"
    del stack.backend.write  # mend the fault: the windows run the KV-only extend eagerly
    stack.clear()
    with draft_kv.kv_only(stack.worker):
        stack.extend()
    assert stack.worker.seen_inside[0]["cuda_graph_runner_for_draft_extend"] is None
    assert stack.log == [*KV_ONLY_KERNELS, "topk"] and stack.pool.kv == full_forward_kv()


def test_a_build_that_returns_no_runner_leaves_kv_graph_eager_silently(caplog: pytest.LogCaptureFixture) -> None:
    stack = draft_stack()
    draft_kv = draft_kv_for(stack, GRAPH)
    with caplog.at_level(logging.INFO, logger=runtime.__name__):
        draft_kv.capture_graph(lambda: None, stack.backend)
    assert draft_kv.graph is None and draft_kv.mode == GRAPH and caplog.records == []


def test_a_rank_that_does_not_log_captures_and_fails_silently(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=runtime.__name__):
        assert captured(draft_stack(), log=False).graph is not None
        broken = draft_stack()
        break_in(broken, "the write")
        assert captured(broken, log=False).graph is None
    assert caplog.records == []


def test_a_capture_that_gives_kv_graph_up_keeps_no_graph(caplog: pytest.LogCaptureFixture) -> None:
    """A backend that writes the KV its own way: the capture ran the full forward; that graph saves nothing."""
    stack = draft_stack(backend="fused")
    with caplog.at_level(logging.INFO, logger=runtime.__name__):
        draft_kv = captured(stack)
    assert draft_kv.mode == FULL and draft_kv.graph is None
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            logging.WARNING,
            "dynspec: DYNSPEC_DRAFT_KV=kv-graph cannot work here (MHATokenToKVPool.set_kv_buffer was not called by "
            "the draft layer); running the full draft extend",
        )
    ]
    assert runtime.describe_draft_kv(draft_kv) == "full draft extend in every fallback iteration"
    stack.clear()
    with draft_kv.kv_only(stack.worker):  # the stock path, its graph included
        stack.extend()
    assert stack.log[0] == "draft extend graph replay" and what_ran(stack.log) == "full"


def test_giving_kv_graph_up_later_drops_the_graph(caplog: pytest.LogCaptureFixture) -> None:
    stack = draft_stack()
    draft_kv = captured(stack)
    stack.runner.token_to_kv_pool = SlottedPool(stack.log)
    stack.clear()
    with caplog.at_level(logging.WARNING, logger=runtime.__name__), draft_kv.kv_only(stack.worker):
        out = stack.extend(TWO_TOKENS)  # eager: through the stand-in, which cannot watch this pool
    assert out.next_token_logits == ("logits", 2, VOCAB) and what_ran(stack.log) == "full"
    assert draft_kv.mode == FULL and draft_kv.graph is None
    assert warnings_in(caplog) == [
        "dynspec: DYNSPEC_DRAFT_KV=kv-graph cannot work here (the draft KV pool (SlottedPool) cannot be watched for "
        "its KV write); running the full draft extend"
    ]
    stack.clear()
    with draft_kv.kv_only(stack.worker):
        stack.extend()
    assert (
        stack.worker.seen_inside[-1]["cuda_graph_runner_for_draft_extend"]
        is stack.worker.cuda_graph_runner_for_draft_extend
    )
    assert stack.log[0] == "draft extend graph replay" and what_ran(stack.log) == "full"


def test_replayed_windows_do_not_count_towards_the_64_window_verdict(caplog: pytest.LogCaptureFixture) -> None:
    """A replayed KV-only graph never calls the stand-in; that is no sign of a path that bypasses it
    (the control: eager kv-graph windows count, ``test_64_windows_without_a_draft_forward_turn_kv_into_full``)."""
    stack = draft_stack()
    draft_kv = captured(stack)
    with caplog.at_level(logging.WARNING, logger=runtime.__name__):
        for window in range(300):
            with draft_kv.kv_only(stack.worker):
                if window % 2:
                    stack.extend()
    assert draft_kv.mode == GRAPH and draft_kv.graph is not None and not draft_kv._called
    assert draft_kv._windows == 0 and warnings_in(caplog) == []


# -- placeholder rows: per request for v1's DRAFT_EXTEND, per token otherwise ------------------------


class ForwardMode(enum.IntEnum):
    """0.4.10 - 0.5.13's, as far as ``placeholder_rows`` asks: ``is_draft_extend()`` is v1's mode only."""

    EXTEND = 0
    DRAFT_EXTEND = 1
    DRAFT_EXTEND_V2 = 2

    def is_draft_extend(self, include_v2: bool = False) -> bool:
        return self == ForwardMode.DRAFT_EXTEND or (include_v2 and self == ForwardMode.DRAFT_EXTEND_V2)


class ForwardModeV2Only(enum.IntEnum):
    """0.5.14+'s: no v1 worker, no ``is_draft_extend``."""

    DRAFT_EXTEND_V2 = 2

    def is_draft_extend_v2(self) -> bool:
        return self == ForwardModeV2Only.DRAFT_EXTEND_V2


SIX_TOKENS = Extend(tokens=[11, 12, 13, 21, 22, 23], positions=[40, 41, 42, 70, 71, 72], slots=list(range(900, 906)))


@pytest.mark.parametrize(
    ("forward_mode", "rows"),
    [
        (ForwardMode.DRAFT_EXTEND, 2),
        (ForwardMode.EXTEND, 2),  # a prefill: its logits keep each request's last token
        (ForwardMode.DRAFT_EXTEND_V2, 6),
        (ForwardModeV2Only.DRAFT_EXTEND_V2, 6),
        ("DRAFT_EXTEND", 6),  # a mode with no is_draft_extend at all
    ],
    ids=["v1", "prefill", "v2", "v2-without-is-draft-extend", "plain"],
)
def test_placeholder_rows(forward_mode: Any, rows: int) -> None:
    input_ids = Rows(list(SIX_TOKENS.tokens))
    assert runtime.placeholder_rows(input_ids, SimpleNamespace(forward_mode=forward_mode, batch_size=2)) == rows
    assert runtime.placeholder_rows(input_ids, SimpleNamespace(batch_size=2)) == 6  # no mode: per token


@pytest.mark.parametrize(
    ("forward_mode", "rows"),
    [(ForwardMode.DRAFT_EXTEND, 2), (ForwardMode.DRAFT_EXTEND_V2, 6), (ForwardModeV2Only.DRAFT_EXTEND_V2, 6)],
    ids=["v1", "v2", "v2-without-is-draft-extend"],
)
def test_the_stand_in_returns_the_rows_the_stock_forward_would(forward_mode: Any, rows: int) -> None:
    """Two requests of three tokens each: v1's draft extend keeps each request's last token, v2 every token."""
    stack = draft_stack()
    forward_batch = stack.worker.forward_batch(SIX_TOKENS)
    forward_batch.forward_mode, forward_batch.batch_size = forward_mode, 2
    with draft_kv_for(stack).kv_only(stack.worker):
        out = stack.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)
    assert out.next_token_logits == Zeros((rows, 1), "torch.float32", DEVICE)
    assert out.hidden_states == Zeros((rows, SPEC_HIDDEN), "torch.bfloat16", DEVICE)
    assert stack.pool.kv == full_forward_kv(SIX_TOKENS) and stack.log == KV_ONLY_KERNELS


# -- the controller's resume ---------------------------------------------------------------------


class CountingMetrics:
    """What SwitchController tells DynspecMetrics."""

    def __init__(self) -> None:
        self.spec = self.fallback = self.switches = 0

    def iteration(self, speculating: bool) -> None:
        if speculating:
            self.spec += 1
        else:
            self.fallback += 1

    def switch(self) -> None:
        self.switches += 1


@pytest.mark.parametrize("min_steps", [2, 3, 8])
def test_each_switch_on_is_exactly_one_resume_then_speculation(min_steps: int) -> None:
    rng = random.Random(min_steps)
    sizes = [rng.choice([1, 4, 8, 9, 16, 40]) for _ in range(3000)]
    metrics = CountingMetrics()
    controller = runtime.SwitchController(8, 4, min_steps, log=False, metrics=metrics)  # type: ignore[arg-type]
    kinds = runtime_tests.decisions(controller, sizes)
    ons = controller.switches // 2  # it starts on, so switches alternate OFF, ON, OFF, ...
    assert ons > 50 and kinds.count("r") == ons
    assert "-S" not in kinds  # speculation comes back only through a resume
    assert all(kinds[i - 1] == "-" and kinds[i + 1 : i + 2] in ("S", "") for i, k in enumerate(kinds) if k == "r")
    # metrics: the resume does not speculate, so it counts as a fallback iteration
    assert (metrics.spec, metrics.fallback, metrics.switches) == (
        kinds.count("S"),
        len(kinds) - kinds.count("S"),
        controller.switches,
    )
    assert (controller.spec_iterations, controller.fallback_iterations) == (metrics.spec, metrics.fallback)


def test_with_a_one_step_dwell_a_resume_may_be_followed_by_a_fall_back() -> None:
    controller = runtime.SwitchController(8, min_steps=1, log=False)
    assert runtime_tests.decisions(controller, [9, 1, 9, 1, 1]) == "-r-rS"


# -- which iterations run under kv_only ----------------------------------------------------------

SIZES = [2, 9, 9, 2, 2, 9]  # with a threshold of 4 and min_steps 1: S - - r S -
STEPS = [runtime.SPECULATE, runtime.FALL_BACK, runtime.FALL_BACK, runtime.RESUME, runtime.SPECULATE, runtime.FALL_BACK]
EXPECTED = ["full", "kv", "kv", "full", "full", "kv"]


class StepRecorder:
    """Stands in for DraftRecorder: the step of every recorded iteration."""

    def __init__(self) -> None:
        self.steps: list[str] = []

    def iteration(self, step: str, batch: Any, verify_input: Any = None) -> None:
        self.steps.append(step)


class TargetStub:
    def swap_in(self) -> None:
        return None

    def swap_out(self, previous: None) -> None:
        return None


def v1_batch(size: int) -> SimpleNamespace:
    return SimpleNamespace(
        reqs=[object()] * size, forward_mode=SimpleNamespace(is_idle=lambda: False), batch_size=lambda: size
    )


def what_each_size_ran(
    stack: DraftStack, decode_branch: Callable[[Any], Any], batch_of: Callable[[int], Any]
) -> list[str]:
    """Drive a batch of each of ``SIZES`` through ``decode_branch``; what each draft extend ran."""
    ran = []
    for size in SIZES:
        stack.clear()
        decode_branch(batch_of(size))
        ran.append(what_ran(stack.log))
    return ran


def v1_decode_loop(fallback: runtime.DynspecFallback, worker: Any, stack: DraftStack) -> list[str]:
    """``SIZES`` through v1's decode branch of ``forward_batch_generation`` as the hook sees it."""

    def decode_branch(batch: Any) -> Any:
        if fallback.should_fall_back(batch):
            return fallback.fall_back(worker, batch, decode_branch)
        return stack.extend()

    return what_each_size_ran(stack, decode_branch, v1_batch)


def test_v1_runs_the_fall_back_iterations_draft_extend_under_kv_only_and_the_resume_in_full() -> None:
    stack = draft_stack()
    worker = stack.worker
    worker.speculative_num_steps, worker.speculative_num_draft_tokens = 3, 4  # type: ignore[attr-defined]
    recorder = StepRecorder()
    controller = runtime.SwitchController(4, min_steps=1, log=False)
    fallback = runtime.DynspecFallback(controller, TargetStub(), draft_kv_for(stack), recorder)  # type: ignore[arg-type]
    assert v1_decode_loop(fallback, worker, stack) == EXPECTED
    assert recorder.steps == [s for s in STEPS if s != runtime.SPECULATE]
    assert stack.pool.kv == full_forward_kv()  # every iteration wrote the same K/V
    assert "forward" not in vars(stack.model) and worker.cuda_graph_runner_for_draft_extend is not None


def v2_decode_loop(fallback: v2.V2Fallback, worker: Any, stack: DraftStack) -> list[str]:
    """``SIZES`` through 0.5.4 - 0.5.13's decode branch as the hook sees it."""

    def decode_branch(batch: Any) -> Any:
        if fallback.should_fall_back(batch):
            return fallback.fall_back(worker, lambda: decode_branch(batch))
        stack.extend()
        return SimpleNamespace(next_token_ids=None, speculative_num_draft_tokens=worker.speculative_num_draft_tokens)

    return what_each_size_ran(stack, decode_branch, v2_tests.decode_batch)


def test_v2_runs_the_fall_back_iterations_draft_extend_under_kv_only_and_the_resume_in_full() -> None:
    stack = draft_stack()
    draft_worker = stack.worker
    draft_worker.speculative_num_steps, draft_worker.speculative_num_draft_tokens = 3, 4  # type: ignore[attr-defined]
    worker = SimpleNamespace(speculative_num_steps=3, speculative_num_draft_tokens=4, draft_worker=draft_worker)
    recorder = StepRecorder()
    controller = runtime.SwitchController(4, min_steps=1, log=False)
    fallback = v2.V2Fallback(controller, TargetStub(), draft_kv_for(stack), recorder)
    assert v2_decode_loop(fallback, worker, stack) == EXPECTED
    assert recorder.steps == [s for s in STEPS if s != runtime.SPECULATE]
    assert draft_worker.cuda_graph_runner_for_draft_extend is not None and "forward" not in vars(stack.model)


def zero_step_worker(stack: DraftStack, **flags: Any) -> v2_tests.FakeAdaptiveWorker:
    worker = v2_tests.FakeAdaptiveWorker(speculative_disable_batch_size=4, speculative_switch_min_steps=1, **flags)
    worker.draft_worker = stack.worker
    return worker


def test_the_zero_step_policy_runs_the_draft_extend_under_kv_only_only_at_fall_back_with_zero_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stack = stack_under(monkeypatch, KV)
    worker = zero_step_worker(stack)
    policy = v2.attach_zero_step_policy(worker)
    assert policy is not None and "_draft_extend_for_decode" in vars(stack.worker)
    worker.init_cuda_graphs(v2_tests.GRAPH_SIZES)
    ran, steps = [], []
    for size in SIZES:
        stack.clear()
        policy.activate_step_by_batch(size)
        stack.worker._draft_extend_for_decode(EXTEND)
        ran.append(what_ran(stack.log))
        steps.append(worker.speculative_num_steps)
    assert steps == [3, 0, 0, 0, 3, 0]  # the resume keeps zero steps
    assert ran == EXPECTED


def test_at_fall_back_without_a_zero_step_state_the_draft_extend_stays_full(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    stack = stack_under(monkeypatch, KV)
    worker = zero_step_worker(stack)
    policy = v2.attach_zero_step_policy(worker)  # init_states never runs: no zero-step state
    assert policy is not None
    with caplog.at_level(logging.ERROR, logger=v2.__name__):
        policy.activate_step_by_batch(9)
    assert policy._step == runtime.FALL_BACK and worker.speculative_num_steps == 3
    stack.worker._draft_extend_for_decode(EXTEND)
    assert what_ran(stack.log) == "full"


@pytest.mark.parametrize(("setting", "mode"), [("full", FULL), ("auto", DIRECT), ("", DIRECT)])
def test_the_zero_step_policy_watches_the_draft_extend_unless_in_full_mode(
    monkeypatch: pytest.MonkeyPatch, setting: str, mode: str
) -> None:
    stack = stack_under(monkeypatch, setting)
    policy = v2.attach_zero_step_policy(zero_step_worker(stack))
    assert policy is not None and policy.draft_kv.mode == mode
    assert ("_draft_extend_for_decode" in vars(stack.worker)) == (mode != FULL)


def test_the_zero_step_policy_records_the_zero_step_iterations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "drafts.jsonl"
    monkeypatch.setenv(runtime.RECORD_ENV, str(record))
    stack = draft_stack()
    stack.worker.draft = lambda batch: None  # type: ignore[attr-defined]  # draft() is what watch_drafts shadows
    worker = zero_step_worker(stack)
    policy = v2.attach_zero_step_policy(worker)
    assert policy is not None and policy.recorder is not None
    worker.init_cuda_graphs(v2_tests.GRAPH_SIZES)
    for size in SIZES:
        policy.activate_step_by_batch(size)
        policy.publish_early(recorded_batch([f"{runtime.RECORD_RID_PREFIX}a"], [size]), None)
    policy.recorder._file.close()
    assert [json.loads(line)["step"] for line in record.read_text().splitlines()] == [
        s for s in STEPS if s != runtime.SPECULATE
    ]


# -- kv-graph at start-up: v1's attach and the zero-step policy capture the twin -----------------------


def v1_worker(stack: DraftStack, runner_class: type = EAGLEDraftExtendCudaGraphRunner) -> Any:
    """The stack's worker as v1's ``EAGLEWorker`` at the end of its ``__init__``: the server args, a target,
    its draft-extend backend, and the stock draft-extend graph its ``init_cuda_graphs`` captured."""
    template = runtime_tests.worker_with(speculative_disable_batch_size=4, speculative_switch_min_steps=1)
    worker: Any = stack.worker
    worker.server_args, worker.tp_rank, worker.target_worker = template.server_args, 0, template.target_worker
    worker.speculative_num_steps, worker.speculative_num_draft_tokens = 3, 4
    worker.draft_extend_attn_backend = stack.backend
    worker.cuda_graph_runner_for_draft_extend = runner_class(worker)
    stack.clear()
    stack.pool.kv.clear()
    return worker


@pytest.mark.parametrize(
    "runner_class",
    [EAGLEDraftExtendCudaGraphRunner, EAGLEDraftExtendCudaGraphRunnerUpTo0510],
    ids=["backend-on-the-runner", "backend-on-the-worker"],
)
def test_v1_attach_captures_a_kv_only_twin_of_the_stock_draft_extend_graph(
    runner_class: type, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    stack = stack_under(monkeypatch, GRAPH)
    worker = v1_worker(stack, runner_class)
    stock = worker.cuda_graph_runner_for_draft_extend
    with caplog.at_level(logging.INFO, logger=runtime.__name__):
        fallback = runtime.attach_dynspec(worker)
    assert fallback is not None
    graph = fallback.draft_kv.graph
    assert type(graph) is type(stock) and graph is not stock and graph.worker is worker  # type(stock_graph)(worker)
    assert graph.kernels == KV_ONLY_KERNELS and stock.kernels == FULL_KERNELS
    assert worker.cuda_graph_runner_for_draft_extend is stock and "forward" not in vars(stack.model)
    # on the stock runner's buffers, which the backend keeps
    assert graph.buffers is stock.buffers is stack.backend.cuda_graph_buffers
    assert stack.backend.cuda_graph_state_inits == 1 and "init_cuda_graph_state" not in vars(stack.backend)
    assert ANY_CAPTURED in [r.getMessage() for r in caplog.records]
    assert "draft KV only while off (from a CUDA graph), full draft extend at resume" in caplog.text


@pytest.mark.parametrize("setting", ["", "auto", FULL, KV, SKIP])
def test_v1_attach_captures_nothing_outside_kv_graph(setting: str, monkeypatch: pytest.MonkeyPatch) -> None:
    stack = stack_under(monkeypatch, setting)
    fallback = runtime.attach_dynspec(v1_worker(stack))
    assert fallback is not None and fallback.draft_kv.graph is None and stack.log == []


def test_v1_attach_without_a_stock_draft_extend_graph_is_eager(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """CUDA graphs disabled (or a backend without a draft-extend graph): nothing to make a twin of."""
    stack = stack_under(monkeypatch, GRAPH)
    worker = v1_worker(stack)
    worker.cuda_graph_runner_for_draft_extend = None
    with caplog.at_level(logging.INFO, logger=runtime.__name__):
        fallback = runtime.attach_dynspec(worker)
    assert fallback is not None and fallback.draft_kv.graph is None and stack.log == []
    assert "draft KV only while off (eagerly), full draft extend at resume" in caplog.text


def test_v1_with_kv_graph_replays_the_twin_at_fall_back_and_the_stock_graph_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stack = stack_under(monkeypatch, GRAPH)
    worker = v1_worker(stack)
    stock = worker.cuda_graph_runner_for_draft_extend
    attached = runtime.attach_dynspec(worker)
    assert attached is not None and attached.draft_kv.graph is not None
    twin = attached.draft_kv.graph
    recorder = StepRecorder()
    controller = runtime.SwitchController(4, min_steps=1, log=False)
    fallback = runtime.DynspecFallback(controller, TargetStub(), attached.draft_kv, recorder)  # type: ignore[arg-type]
    assert v1_decode_loop(fallback, worker, stack) == EXPECTED
    replayed = [seen["cuda_graph_runner_for_draft_extend"] for seen in stack.worker.seen_inside]
    assert replayed == [stock, twin, twin, stock, stock, twin]
    assert outside_capture(stack.pool) == full_forward_kv()
    assert worker.cuda_graph_runner_for_draft_extend is stock and attached.draft_kv.mode == GRAPH


def v2_worker(stack: DraftStack) -> Any:
    """0.5.4 - 0.5.13's ``EAGLEWorkerV2`` at the end of its ``__init__``: server args, a target, and the stack's
    worker as its ``EagleDraftWorker``, holding the stock draft-extend graph its ``init_cuda_graphs`` captured."""
    worker = v2_tests.worker_with(speculative_disable_batch_size=4, speculative_switch_min_steps=1)
    draft_worker: Any = stack.worker
    draft_worker.speculative_num_steps, draft_worker.speculative_num_draft_tokens = 3, 4
    draft_worker.draft_extend_attn_backend = stack.backend
    draft_worker.cuda_graph_runner_for_draft_extend = EAGLEDraftExtendCudaGraphRunner(draft_worker)
    worker.draft_worker = draft_worker
    worker.speculative_num_steps, worker.speculative_num_draft_tokens = 3, 4
    stack.clear()
    stack.pool.kv.clear()
    return worker


@pytest.mark.parametrize("setting", [GRAPH, DIRECT])
def test_v2_fallback_attach_captures_a_kv_only_twin_of_the_draft_workers_graph(
    setting: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """0.5.4 - 0.5.13: the twin as on v1, of the draft worker's runner; kv-direct (the default) is kv-graph here."""
    stack = stack_under(monkeypatch, setting)
    worker = v2_worker(stack)
    stock = worker.draft_worker.cuda_graph_runner_for_draft_extend
    with caplog.at_level(logging.INFO):
        fallback = v2.attach_fallback(worker)
    assert fallback is not None
    graph = fallback.draft_kv.graph
    assert type(graph) is type(stock) and graph is not stock and graph.worker is worker.draft_worker
    assert graph.kernels == KV_ONLY_KERNELS and stock.kernels == FULL_KERNELS
    assert graph.buffers is stock.buffers and worker.draft_worker.cuda_graph_runner_for_draft_extend is stock
    assert "draft KV only while off (from a CUDA graph), full draft extend at resume" in caplog.text
    assert "eager while off" not in caplog.text
    # this fake runner keeps no input buffers (as 0.5.4 - 0.5.9's): kv-direct says so once and stays kv-graph
    refusal = "EAGLEDraftExtendCudaGraphRunner has no input_ids buffer; kv-direct replays the KV-only graph"
    assert (refusal in caplog.text) == (setting != GRAPH) and fallback.draft_kv.direct is None


@pytest.mark.parametrize("setting", ["", "auto", KV, FULL, SKIP])  # auto: kv, as on 0.5.4 - 0.5.9 (no input buffers)
def test_v2_fallback_attach_captures_nothing_outside_the_graph_modes(
    setting: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = stack_under(monkeypatch, setting)
    fallback = v2.attach_fallback(v2_worker(stack))
    assert fallback is not None and fallback.draft_kv.graph is None and stack.log == []
    assert fallback.draft_kv.mode == (KV if setting in ("", "auto") else setting)


def test_v2_fallback_replays_the_twin_at_fall_back_the_stock_graph_when_speculating_and_none_at_resume(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The resume's full extend stays eager (_SavedSteps: the stock graph holds four tokens per request)."""
    stack = stack_under(monkeypatch, GRAPH)
    worker = v2_worker(stack)
    stock = worker.draft_worker.cuda_graph_runner_for_draft_extend
    attached = v2.attach_fallback(worker)
    assert attached is not None and attached.draft_kv.graph is not None
    twin = attached.draft_kv.graph
    controller = runtime.SwitchController(4, min_steps=1, log=False)
    fallback = v2.V2Fallback(controller, TargetStub(), attached.draft_kv, StepRecorder())
    assert v2_decode_loop(fallback, worker, stack) == EXPECTED
    replayed = [seen["cuda_graph_runner_for_draft_extend"] for seen in stack.worker.seen_inside]
    assert replayed == [stock, twin, twin, None, stock, twin]
    assert outside_capture(stack.pool) == full_forward_kv()
    assert worker.draft_worker.cuda_graph_runner_for_draft_extend is stock


class OverridingWorker(v2_tests.FakeAdaptiveWorker):
    """0.5.14+'s ``EAGLEWorkerV2`` as the zero-step policy's capture sees it.

    ``_override_worker_state`` sets the step counts, records its enter and exit, and puts back the
    attributes it backed up (the draft-extend backend, the draft runner's backend, the draft-extend
    graph), as the release's does; ``build_adaptive_runtime_state`` makes, under it, the state's own
    draft-extend backend and graph runner; ``apply_runtime_state`` puts a state's draft side on the
    draft worker; ``init_cuda_graphs`` registers the worker's own state with its graph.
    """

    def __init__(self, stack: DraftStack, **flags: Any) -> None:
        super().__init__(speculative_disable_batch_size=4, speculative_switch_min_steps=1, **flags)
        self.stack = stack
        draft_worker: Any = stack.worker
        self.draft_worker = draft_worker
        draft_worker.speculative_num_steps, draft_worker.speculative_num_draft_tokens = 3, 4
        draft_worker.draft_extend_attn_backend = stack.backend
        self.own_state = SimpleNamespace(
            speculative_num_steps=3,
            speculative_num_draft_tokens=4,
            draft_extend_attn_backend=stack.backend,
            cuda_graph_runner_for_draft_extend=draft_worker.cuda_graph_runner_for_draft_extend,
        )
        self.overrides: list[tuple[Any, ...]] = []

    def own_places(self) -> list[tuple[Any, str]]:
        """(owner, attribute) of what ``_override_worker_state`` backs up."""
        dw: Any = self.draft_worker
        return [
            (self, "speculative_num_steps"),
            (self, "speculative_num_draft_tokens"),
            (dw, "speculative_num_steps"),
            (dw, "speculative_num_draft_tokens"),
            (dw, "draft_extend_attn_backend"),
            (dw.draft_runner, "attn_backend"),
            (dw, "cuda_graph_runner_for_draft_extend"),
        ]

    def own(self) -> tuple[Any, ...]:
        return tuple(getattr(owner, name) for owner, name in self.own_places())

    @contextlib.contextmanager
    def _override_worker_state(
        self, speculative_num_steps: int, speculative_num_draft_tokens: int, cuda_graph_bs: Any = None
    ) -> Iterator[None]:
        dw: Any = self.draft_worker
        backup = self.own()
        self.overrides.append(("enter", speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs))
        self.speculative_num_steps = dw.speculative_num_steps = speculative_num_steps
        self.speculative_num_draft_tokens = dw.speculative_num_draft_tokens = speculative_num_draft_tokens
        try:
            yield
        finally:
            for (owner, name), value in zip(self.own_places(), backup):
                setattr(owner, name, value)
            self.overrides.append(("exit",))

    def build_adaptive_runtime_state(
        self, speculative_num_steps: int, speculative_num_draft_tokens: int, cuda_graph_bs: Any = None
    ) -> Any:
        state = super().build_adaptive_runtime_state(speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs)
        dw: Any = self.draft_worker
        with self._override_worker_state(
            speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=cuda_graph_bs
        ):
            # init_attention_backend, then _capture_cuda_graphs
            dw.draft_extend_attn_backend = dw.draft_runner.attn_backend = TritonAttnBackend(
                self.stack.pool, self.stack.log
            )
            dw.cuda_graph_runner_for_draft_extend = EAGLEDraftExtendCudaGraphRunner(dw)
            state.speculative_num_draft_tokens = speculative_num_draft_tokens
            state.draft_extend_attn_backend = dw.draft_extend_attn_backend
            state.cuda_graph_runner_for_draft_extend = dw.cuda_graph_runner_for_draft_extend
        return state

    def apply_runtime_state(self, state: Any) -> None:
        super().apply_runtime_state(state)
        dw: Any = self.draft_worker
        dw.speculative_num_steps = state.speculative_num_steps
        dw.draft_extend_attn_backend = state.draft_extend_attn_backend
        dw.draft_runner.attn_backend = state.draft_extend_attn_backend
        dw.cuda_graph_runner_for_draft_extend = state.cuda_graph_runner_for_draft_extend

    def init_cuda_graphs(self, cuda_graph_bs: Any) -> None:
        if self.adaptive_controller is not None:
            self.adaptive_controller.register(self.own_state)
            self.adaptive_controller.init_states(cuda_graph_bs=cuda_graph_bs)


CAPTURE_BS = runtime.fallback_capture_sizes(v2_tests.GRAPH_SIZES, 4)


def test_graph_like_builds_under_the_override_with_the_states_backend_and_puts_the_workers_own_back() -> None:
    stack = draft_stack()
    worker = OverridingWorker(stack)
    own = worker.own()
    state = worker.build_adaptive_runtime_state(0, 1, cuda_graph_bs=CAPTURE_BS)
    assert worker.own() == own and state.draft_extend_attn_backend is not stack.backend
    policy = v2.ZeroStepPolicy(worker, runtime.SwitchController(4, log=False), draft_kv_for(stack, GRAPH), log=False)
    worker.overrides.clear()
    stock = state.cuda_graph_runner_for_draft_extend
    graph = policy._graph_like(state, stock, CAPTURE_BS)
    assert type(graph) is type(stock) and graph is not stock and graph.worker is stack.worker
    assert worker.overrides == [("enter", 0, 1, CAPTURE_BS), ("exit",)]
    # built as the state built its own: zero steps, the state's draft-extend backend on the worker and its runner
    assert graph.steps == 0
    assert graph.backend is state.draft_extend_attn_backend
    assert graph.runner_backend is state.draft_extend_attn_backend
    assert worker.own() == own


class FailingRunner:
    def __init__(self, worker: Any) -> None:
        raise RuntimeError("capture failed")


def test_graph_like_puts_the_workers_own_back_when_the_build_fails() -> None:
    stack = draft_stack()
    worker = OverridingWorker(stack)
    own = worker.own()
    state = worker.build_adaptive_runtime_state(0, 1, cuda_graph_bs=CAPTURE_BS)
    policy = v2.ZeroStepPolicy(worker, runtime.SwitchController(4, log=False), draft_kv_for(stack, GRAPH), log=False)
    worker.overrides.clear()
    with pytest.raises(RuntimeError, match="capture failed"):
        policy._graph_like(state, object.__new__(FailingRunner), CAPTURE_BS)
    assert worker.overrides == [("enter", 0, 1, CAPTURE_BS), ("exit",)] and worker.own() == own


def test_the_zero_step_policy_captures_the_kv_only_twin_of_the_zero_step_states_graph(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    stack = stack_under(monkeypatch, GRAPH)
    worker = OverridingWorker(stack)
    own = worker.own()
    policy = v2.attach_zero_step_policy(worker)
    assert policy is not None
    with caplog.at_level(logging.INFO):
        worker.init_cuda_graphs(v2_tests.GRAPH_SIZES)
    zero = policy._states[0]
    twin = policy.draft_kv.graph
    assert worker.overrides == [("enter", 0, 1, CAPTURE_BS), ("exit",)] * 2  # the state's build, then the twin's
    assert (
        type(twin) is type(zero.cuda_graph_runner_for_draft_extend)
        and twin is not zero.cuda_graph_runner_for_draft_extend
    )
    assert twin.kernels == KV_ONLY_KERNELS and zero.cuda_graph_runner_for_draft_extend.kernels == FULL_KERNELS
    assert twin.steps == 0 and twin.backend is twin.runner_backend is zero.draft_extend_attn_backend
    assert worker.own() == own and "forward" not in vars(stack.model)
    assert ANY_CAPTURED in [r.getMessage() for r in caplog.records]
    assert "draft KV only while off (from a CUDA graph), full draft extend at resume" in caplog.text
    backend = zero.draft_extend_attn_backend
    assert twin.buffers is zero.cuda_graph_runner_for_draft_extend.buffers is backend.cuda_graph_buffers
    assert backend.cuda_graph_state_inits == 1 and "init_cuda_graph_state" not in vars(backend)
    # the decode loop: the twin at fall back, the zero-step state's own graph at resume, the worker's while speculating
    stack.pool.kv.clear()
    ran = []
    for size in SIZES:
        stack.clear()
        policy.activate_step_by_batch(size)
        stack.worker._draft_extend_for_decode(EXTEND)
        ran.append(what_ran(stack.log))
    assert ran == EXPECTED
    stock, zero_graph = worker.own_state.cuda_graph_runner_for_draft_extend, zero.cuda_graph_runner_for_draft_extend
    replayed = [seen["cuda_graph_runner_for_draft_extend"] for seen in stack.worker.seen_inside]
    assert replayed == [stock, twin, twin, zero_graph, stock, twin]
    assert stack.pool.kv == full_forward_kv()


@pytest.mark.parametrize("mode", [KV, FULL])
def test_the_zero_step_policy_captures_nothing_outside_kv_graph(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    stack = stack_under(monkeypatch, mode)
    worker = OverridingWorker(stack)
    policy = v2.attach_zero_step_policy(worker)
    assert policy is not None
    worker.init_cuda_graphs(v2_tests.GRAPH_SIZES)
    assert policy.draft_kv.graph is None and worker.overrides == [("enter", 0, 1, CAPTURE_BS), ("exit",)]


# -- recording the drafts ------------------------------------------------------------------------


class Lens:
    """``seq_lens``: a CPU read (``tolist``) is a GPU sync; ``forbidden`` makes one fail the test."""

    def __init__(self, values: list[int], forbidden: bool = False) -> None:
        self.values, self.forbidden = values, forbidden

    def tolist(self) -> list[int]:
        assert not self.forbidden, "read to the CPU although no request is recorded"
        return list(self.values)


class DraftTokens:
    """``verify_input.draft_token``: flat, ``draft_token_num`` tokens per request, the root first."""

    def __init__(self, rows: list[list[int]], forbidden: bool = False) -> None:
        self.rows, self.forbidden = rows, forbidden

    def reshape(self, n: int, width: int) -> DraftTokens:
        flat = [t for row in self.rows for t in row]
        assert width == -1 and len(flat) % n == 0
        size = len(flat) // n
        return DraftTokens([flat[i * size : (i + 1) * size] for i in range(n)], self.forbidden)

    def __getitem__(self, key: tuple[slice, slice]) -> DraftTokens:
        return DraftTokens([row[key[1]] for row in self.rows], self.forbidden)

    def tolist(self) -> list[list[int]]:
        assert not self.forbidden, "read to the CPU although no request is recorded"
        return [list(r) for r in self.rows]


def recorded_batch(rids: list[str], positions: list[int], forbidden: bool = False) -> SimpleNamespace:
    return SimpleNamespace(reqs=[SimpleNamespace(rid=r) for r in rids], seq_lens=Lens(positions, forbidden))


@pytest.fixture
def recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[runtime.DraftRecorder, Path]]:
    path = tmp_path / "drafts.jsonl"
    monkeypatch.setenv(runtime.RECORD_ENV, str(path))
    made = runtime.DraftRecorder.from_env(rank0=True)
    assert made is not None
    yield made, path
    made._file.close()


NAMED = [f"{runtime.RECORD_RID_PREFIX}0-long-1", "unnamed", f"{runtime.RECORD_RID_PREFIX}0-short-2"]


def test_one_json_line_per_iteration_with_only_the_named_requests(recorder: tuple[runtime.DraftRecorder, Path]) -> None:
    rec, path = recorder
    batch = recorded_batch(NAMED, [100, 7, 300])
    rec.iteration(
        runtime.SPECULATE,
        batch,
        SimpleNamespace(draft_token=DraftTokens([[5, 51, 52, 53], [6, 61, 62, 63], [7, 71, 72, 73]])),
    )
    rec.iteration(runtime.FALL_BACK, batch)
    rec.iteration(runtime.RESUME, recorded_batch(NAMED, [101, 8, 301]))
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": "speculate", "rid": [NAMED[0], NAMED[2]], "pos": [100, 300], "draft": [[51, 52, 53], [71, 72, 73]]},
        {"step": "fall back", "rid": [NAMED[0], NAMED[2]], "pos": [100, 300]},
        {"step": "resume", "rid": [NAMED[0], NAMED[2]], "pos": [101, 301]},
    ]
    parsed = exactkv.parse(lines)  # what the proof reads back
    assert parsed.bad_lines == 0 and parsed.first_off == {NAMED[0]: 100, NAMED[2]: 300}
    assert parsed.drafts == {NAMED[0]: {100: [51, 52, 53]}, NAMED[2]: {300: [71, 72, 73]}}


def test_an_iteration_without_a_named_request_reads_and_writes_nothing(
    recorder: tuple[runtime.DraftRecorder, Path],
) -> None:
    rec, path = recorder
    verify_input = SimpleNamespace(draft_token=DraftTokens([[1, 2], [3, 4]], forbidden=True))
    rec.iteration(runtime.SPECULATE, recorded_batch(["a", "warmup"], [3, 4], forbidden=True), verify_input)
    rec.iteration(runtime.FALL_BACK, SimpleNamespace(seq_lens=Lens([3], forbidden=True)))  # a batch without reqs
    rec.iteration(runtime.FALL_BACK, SimpleNamespace(reqs=None, seq_lens=Lens([], forbidden=True)))
    assert path.read_text() == ""


def test_the_recorder_is_built_only_when_asked_and_on_rank_0(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert runtime.DraftRecorder.from_env(rank0=True) is None
    monkeypatch.setenv(runtime.RECORD_ENV, "  ")
    assert runtime.DraftRecorder.from_env(rank0=True) is None
    monkeypatch.setenv(runtime.RECORD_ENV, str(tmp_path / "r.jsonl"))
    assert runtime.DraftRecorder.from_env(rank0=False) is None
    assert not (tmp_path / "r.jsonl").exists()


def test_watch_drafts_records_only_outside_the_fallback(recorder: tuple[runtime.DraftRecorder, Path]) -> None:
    rec, path = recorder
    verify_input = SimpleNamespace(draft_token=DraftTokens([[9, 90, 91]]))
    owner = SimpleNamespace(draft=lambda batch, *args, **kwargs: verify_input)
    in_fallback = [False]
    rec.watch_drafts(owner, lambda: in_fallback[0])
    batch = recorded_batch([NAMED[0]], [40])
    assert owner.draft(batch) is verify_input
    in_fallback[0] = True
    assert owner.draft(batch, "more", key="word") is verify_input  # the trivial tree of a fallback iteration
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"step": "speculate", "rid": [NAMED[0]], "pos": [40], "draft": [[90, 91]]}
    ]


def attached(path: str) -> tuple[Any, Any]:
    """``(fallback, the object whose draft() it watches)`` for v1 or v2, each draft() returning one draft."""
    verify_input = SimpleNamespace(draft_token=DraftTokens([[9, 90, 91]]))
    if path == "v1":
        worker = runtime_tests.worker_with(speculative_disable_batch_size=8)
        worker.draft = lambda batch: verify_input
        return runtime.attach_dynspec(worker), worker
    worker = v2_tests.worker_with(speculative_disable_batch_size=8)
    worker.draft_worker.draft = lambda batch: verify_input
    return v2.attach_fallback(worker), worker.draft_worker


@pytest.mark.parametrize("path", ["v1", "v2"])
def test_attach_records_the_drafts_of_speculative_iterations_only_when_asked(
    path: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fallback, owner = attached(path)
    assert fallback.recorder is None and owner.draft.__name__ == "<lambda>"
    record = tmp_path / "r.jsonl"
    monkeypatch.setenv(runtime.RECORD_ENV, str(record))
    fallback, owner = attached(path)
    assert fallback.recorder is not None and owner.draft.__name__ == "recording_draft"
    batch = recorded_batch([NAMED[0]], [40])
    owner.draft(batch)
    fallback.in_fallback = True  # draft() returns the trivial tree: nothing drafted
    owner.draft(recorded_batch([NAMED[0]], [41]))
    fallback.recorder._file.close()
    assert [json.loads(line)["pos"] for line in record.read_text().splitlines()] == [[40]]


# -- names the runtime and dynspec proof share ---------------------------------------------------


def test_the_runtime_and_the_proof_harness_use_the_same_names() -> None:
    assert runtime.RECORD_RID_PREFIX == exactkv.RID_PREFIX
    assert (runtime.DRAFT_KV_ENV, runtime.RECORD_ENV) == (proof_run.DRAFT_KV_ENV, proof_run.RECORD_ENV)
    assert (exactkv.SPECULATE, exactkv.FALL_BACK, exactkv.RESUME) == (
        runtime.SPECULATE,
        runtime.FALL_BACK,
        runtime.RESUME,
    )
    assert set(proof_run.DRAFT_KV_VARIANTS) == {FULL, SKIP} and set(proof_run.DRAFT_KV_VARIANTS) < set(
        runtime.DRAFT_KV_SETTINGS
    )
    assert (
        set(proof_run.KV_ONLY_MODES) == {KV, GRAPH, runtime.DRAFT_KV_DIRECT}
        and proof_run.KV_ONLY_MODE == runtime.DRAFT_KV_DEFAULT
    )
    assert set(proof_run.KV_ONLY_MODES) < set(runtime.DRAFT_KV_SETTINGS)
    assert exactkv.Load(1, 1, 1, 1, 1, 1).waves()[0][0].rid.startswith(runtime.RECORD_RID_PREFIX)


def test_the_kv_only_words_are_in_the_start_up_line_exactly_when_kv_is_on() -> None:
    for mode in (KV, GRAPH, runtime.DRAFT_KV_DIRECT, FULL, SKIP):
        for graph in (None, object()):
            draft_kv = runtime.DraftKV(mode, None)
            draft_kv.graph = graph
            draft_kv.direct = object() if graph is not None and mode == runtime.DRAFT_KV_DIRECT else None
            described = runtime.describe_draft_kv(draft_kv)
            assert (proof_run.KV_ONLY_WORDS in described) == (mode in (KV, GRAPH, runtime.DRAFT_KV_DIRECT)), described


@pytest.mark.parametrize(
    ("mode", "graph", "words"),
    [
        (FULL, False, "full draft extend in every fallback iteration"),
        (SKIP, False, "no draft extend while off (negative control)"),
        (KV, False, "draft KV only while off (eagerly), full draft extend at resume"),
        (GRAPH, False, "draft KV only while off (eagerly), full draft extend at resume"),
        (GRAPH, True, "draft KV only while off (from a CUDA graph), full draft extend at resume"),
    ],
)
def test_the_start_up_words_of_each_mode(mode: str, graph: bool, words: str) -> None:
    stack = draft_stack()
    draft_kv = captured(stack) if graph else draft_kv_for(stack, mode)
    assert runtime.describe_draft_kv(draft_kv) == words


ATTACH_PATHS = ["v1", "v1-graph", "v2", "v2-graph", "zero-step", "zero-step-graph"]  # -graph: a stock graph to twin


def start_up_lines(attach: str, caplog: pytest.LogCaptureFixture) -> list[str]:
    """The INFO/WARNING lines one of the attach paths logs at start-up."""
    caplog.clear()
    with caplog.at_level(logging.INFO):
        if attach == "v1":
            assert runtime.attach_dynspec(runtime_tests.worker_with(speculative_disable_batch_size=8)) is not None
        elif attach == "v1-graph":
            assert runtime.attach_dynspec(v1_worker(draft_stack())) is not None
        elif attach == "v2":
            worker = v2_tests.worker_with(speculative_disable_batch_size=8)
            worker.draft_worker.cuda_graph_runner_for_draft_extend = None  # CUDA graphs off: nothing to twin
            assert v2.attach_fallback(worker) is not None
        elif attach == "v2-graph":
            assert v2.attach_fallback(v2_worker(draft_stack())) is not None
        else:
            worker = (
                OverridingWorker(draft_stack())
                if attach == "zero-step-graph"
                else v2_tests.FakeAdaptiveWorker(speculative_disable_batch_size=8)
            )
            assert v2.attach_zero_step_policy(worker) is not None
            worker.init_cuda_graphs(v2_tests.GRAPH_SIZES)
    return [f"[2026-12-01 10:00:00 TP0] {r.getMessage()}" for r in caplog.records]


@pytest.mark.parametrize("mode", [KV, GRAPH])
@pytest.mark.parametrize("attach", ATTACH_PATHS)
def test_the_proof_reads_the_runtimes_own_start_up_line(
    attach: str, mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    proof = proof_run.Proof(proof_run.ProofOptions(out=tmp_path), progress=lambda message: None)
    log = tmp_path / "dynspec.log"
    monkeypatch.setenv(runtime.DRAFT_KV_ENV, mode)
    lines = start_up_lines(attach, caplog)
    how = "from a CUDA graph" if mode == GRAPH and attach.endswith("-graph") else "eagerly"
    ready = [line for line in lines if " ready in " in line][-1]
    assert ready.endswith(f"draft KV only while off ({how}), full draft extend at resume")
    # every path says how its one-token verify attends (r30), before the draft KV's words
    assert re.search(r"; one-token verify through \S+'s (decode kernel|verify path)[^;]*; draft KV only", ready)
    log.write_text("\n".join(lines) + "\n")
    problems: list[str] = []
    proof.check_kv_only_path(log, problems)
    assert problems == []
    # A server that runs the full extend: asked to, or on v1 by default (auto is full where unproven).
    for control in ("full", "auto", "") if attach.startswith("v1") else ("full",):
        monkeypatch.setenv(runtime.DRAFT_KV_ENV, control)
        log.write_text("\n".join(start_up_lines(attach, caplog)) + "\n")
        proof.check_kv_only_path(log, problems)
        assert len(problems) == 1 and problems[0].startswith("the dynspec server did not run the KV-only draft extend")
        problems.clear()


@pytest.mark.parametrize("mode", [KV, GRAPH])
def test_the_proof_reads_the_runtimes_own_give_up_warning(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(runtime.DRAFT_KV_ENV, mode)
    lines = start_up_lines("v1", caplog)
    stack = draft_stack(backend="fused")
    with caplog.at_level(logging.WARNING, logger=runtime.__name__), draft_kv_for(stack, mode).kv_only(stack.worker):
        stack.extend()
    gave_up = warnings_in(caplog)
    assert len(gave_up) == 1 and gave_up[0].startswith(f"dynspec: DYNSPEC_DRAFT_KV={mode} cannot work here")
    log = tmp_path / "dynspec.log"
    log.write_text("\n".join([*lines, *(f"[TP0] {m}" for m in gave_up)]) + "\n")
    problems: list[str] = []
    proof_run.Proof(proof_run.ProofOptions(out=tmp_path), progress=lambda message: None).check_kv_only_path(
        log, problems
    )
    assert len(problems) == 1 and problems[0].startswith("the dynspec server gave the KV-only draft extend up")


def test_the_proof_reads_a_give_up_at_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """kv-graph given up while its twin is captured: the start-up line already says full."""
    monkeypatch.setenv(runtime.DRAFT_KV_ENV, GRAPH)
    stack = draft_stack(backend="fused")
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert runtime.attach_dynspec(v1_worker(stack)) is not None
    lines = [f"[TP0] {r.getMessage()}" for r in caplog.records]
    log = tmp_path / "dynspec.log"
    log.write_text("\n".join(lines) + "\n")
    problems: list[str] = []
    proof_run.Proof(proof_run.ProofOptions(out=tmp_path), progress=lambda message: None).check_kv_only_path(
        log, problems
    )
    assert [p.split(":")[0] for p in problems] == [
        "the dynspec server did not run the KV-only draft extend",
        "the dynspec server gave the KV-only draft extend up",
    ]


# -- what the KV-only extend relies on, in every release -------------------------------------


def release_source(archive: zipfile.ZipFile, member: str) -> str | None:
    try:
        return archive.read(f"sglang/{member}").decode()
    except KeyError:
        return None


def assigned_attributes(source: str) -> set[str]:
    """``X`` of every ``self.X = ...`` in a module."""
    return {
        t.attr
        for n in ast.walk(ast.parse(source))
        if isinstance(n, (ast.Assign, ast.AnnAssign))
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }


DECODE_GRAPHS = {"graph_runner", "cuda_graph_runner", "decode_cuda_graph_runner"}  # decode only: never the draft extend


@pytest.mark.releases
@pytest.mark.parametrize("version", RELEASES)
def test_the_draft_side_kv_only_relies_on_is_the_releases(version: str) -> None:
    """The draft class and attention layer names, the graph attributes set aside, the placeholder's fields."""
    with zipfile.ZipFile(releases.wheel(version)) as archive:
        eagle3 = release_source(archive, "srt/models/llama_eagle3.py")
        attention = release_source(archive, "srt/layers/radix_attention.py")
        logits = release_source(archive, "srt/layers/logits_processor.py")
        runner = release_source(archive, "srt/model_executor/model_runner.py")
        workers = [
            s
            for m in ("srt/speculative/eagle_worker.py", "srt/speculative/eagle_worker_v2.py")
            if (s := release_source(archive, m))
        ]
    assert eagle3 and attention and logits and runner and workers
    assert {n.name for n in ast.parse(eagle3).body if isinstance(n, ast.ClassDef)} >= set(runtime.KV_ONLY_DRAFTS)
    assert "RadixAttention" in {n.name for n in ast.parse(attention).body if isinstance(n, ast.ClassDef)}
    output = next(
        n for n in ast.parse(logits).body if isinstance(n, ast.ClassDef) and n.name == "LogitsProcessorOutput"
    )
    fields = [
        (s.target.id, s.value is not None)
        for s in output.body
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    ]
    assert fields[:2] == [("next_token_logits", False), ("hidden_states", True)]
    assert all(has_default for _, has_default in fields[1:])  # the placeholder gives only the first two
    runner_graphs = {a for a in assigned_attributes(runner) if "graph_runner" in a}
    assert runner_graphs - DECODE_GRAPHS <= set(runtime._RUNNER_GRAPHS), runner_graphs
    worker_graphs = {a for s in workers for a in assigned_attributes(s) if "graph_runner" in a}
    assert worker_graphs - DECODE_GRAPHS == {runtime._WORKER_GRAPH}, worker_graphs


# -- what kv-graph's twin runner relies on, in every release ----------------------------------------

ZERO_STEP = releases_of(EagleWorkerV2DynspecZeroStep)
V2_WORKER = "srt/speculative/eagle_worker_v2.py"
V1_WORKER = "srt/speculative/eagle_worker.py"
EXTEND_RUNNER = "srt/speculative/eagle_draft_extend_cuda_graph_runner.py"


FORWARD_BATCH_INFO = "srt/model_executor/forward_batch_info.py"
RUNTIME_STATE = "srt/speculative/adaptive_runtime_state.py"
KV_GRAPH_MEMBERS = [V1_WORKER, V2_WORKER, EXTEND_RUNNER, FORWARD_BATCH_INFO, RUNTIME_STATE]


def unpacked_source(version: str, member: str) -> str | None:
    """A member of the release, from one cached tree holding all of ``KV_GRAPH_MEMBERS``; None where it has none."""
    path = releases.unpacked(version, KV_GRAPH_MEMBERS) / "sglang" / member
    return path.read_text() if path.exists() else None


def class_def(source: str, name: str) -> ast.ClassDef | None:
    return next((n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == name), None)


def method_def(classdef: ast.ClassDef, name: str) -> ast.FunctionDef:
    found = [n for n in classdef.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert found, f"{classdef.name}.{name}"
    return found[0]


def calls_to(node: ast.AST, func: str) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and ast.unparse(n.func) == func]


def graph_runner_constructions(classdef: ast.ClassDef) -> list[ast.Call]:
    """The calls assigned to ``self.cuda_graph_runner_for_draft_extend`` in a class."""
    return [
        n.value
        for n in ast.walk(classdef)
        if isinstance(n, ast.Assign)
        and isinstance(n.value, ast.Call)
        and any(ast.unparse(t) == f"self.{runtime._WORKER_GRAPH}" for t in n.targets)
    ]


def only_the_worker(call: ast.Call) -> bool:
    return [ast.unparse(a) for a in call.args] == ["self"] and call.keywords == []


@pytest.mark.releases
@pytest.mark.parametrize("version", ZERO_STEP)
def test_graph_like_relies_on_the_releases_override_and_runtime_state(version: str) -> None:
    """``_graph_like``: ``_override_worker_state(steps, tokens, cuda_graph_bs=...)`` puts back the draft-extend
    backends it sets; the state carries them and the graph; the draft worker builds its runner from itself."""
    source = unpacked_source(version, V2_WORKER)
    assert source is not None
    worker = class_def(source, "EAGLEWorkerV2")
    assert worker is not None
    override = method_def(worker, "_override_worker_state")
    assert [ast.unparse(d) for d in override.decorator_list] == ["contextlib.contextmanager"]
    arguments = override.args
    assert [a.arg for a in arguments.args] == [
        "self",
        "speculative_num_steps",
        "speculative_num_draft_tokens",
        "cuda_graph_bs",
    ]
    assert len(arguments.defaults) == 1 and not arguments.kwonlyargs  # cuda_graph_bs has a default; as a keyword too
    draft_worker = {
        t.id
        for n in ast.walk(override)
        if isinstance(n, ast.Assign) and ast.unparse(n.value) in ("self._draft_worker", "self.draft_worker")
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    restored = {
        ast.unparse(e)
        for t in ast.walk(override)
        if isinstance(t, ast.Try)
        for statement in t.finalbody
        for n in ast.walk(statement)
        if isinstance(n, ast.Assign)
        for target in n.targets
        for e in (target.elts if isinstance(target, ast.Tuple) else [target])
    }
    for name in draft_worker:
        restored |= {r.replace(f"{name}.", "draft_worker.", 1) for r in restored if r.startswith(f"{name}.")}
    assert {
        "draft_worker.draft_extend_attn_backend",
        "draft_worker.draft_runner.attn_backend",
        f"draft_worker.{runtime._WORKER_GRAPH}",
    } <= restored, sorted(restored)
    build = method_def(worker, "build_adaptive_runtime_state")
    assert [(len(c.args), [k.arg for k in c.keywords]) for c in calls_to(build, "self._override_worker_state")] == [
        (2, ["cuda_graph_bs"])
    ]
    made = calls_to(build, "SpecRuntimeState")
    assert made and all(
        {"speculative_num_steps", "speculative_num_draft_tokens", "draft_extend_attn_backend", runtime._WORKER_GRAPH}
        <= {k.arg for k in c.keywords}
        for c in made
    )
    state_source = unpacked_source(version, RUNTIME_STATE)
    assert state_source is not None
    state = class_def(state_source, "SpecRuntimeState")
    assert state is not None
    fields = {n.target.id for n in state.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert {
        "speculative_num_steps",
        "speculative_num_draft_tokens",
        "draft_extend_attn_backend",
        runtime._WORKER_GRAPH,
    } <= fields
    draft = class_def(source, "EagleDraftWorker")
    assert draft is not None
    constructions = graph_runner_constructions(draft)
    assert constructions and all(only_the_worker(c) for c in constructions), [ast.unparse(c) for c in constructions]
    assert {"draft_extend_attn_backend", "draft_runner"} <= assigned_attributes(ast.unparse(draft))


OWN_FALLBACK = releases_of(EagleWorkerV2DynspecFallback)


@pytest.mark.releases
@pytest.mark.parametrize("version", OWN_FALLBACK)
def test_v2_draft_worker_builds_its_draft_extend_graph_runner_from_itself_before_the_fallback_attaches(
    version: str,
) -> None:
    """``capture_twin_of_stock_graph(draft_kv, worker.draft_worker)`` at the end of ``EAGLEWorkerV2.__init__``
    (0.5.4 - 0.5.13): the draft worker's ``__init__`` has captured its runner by then, made from itself alone."""
    source = unpacked_source(version, V2_WORKER)
    assert source is not None
    draft = class_def(source, "EagleDraftWorker")
    assert draft is not None, version
    constructions = graph_runner_constructions(draft)
    assert constructions and all(only_the_worker(c) for c in constructions), [ast.unparse(c) for c in constructions]
    assert calls_to(method_def(draft, "__init__"), "self.init_cuda_graphs"), version
    worker = class_def(source, "EAGLEWorkerV2")
    assert worker is not None
    init = method_def(worker, "__init__")
    made = [n for n in ast.walk(init) if isinstance(n, ast.Call) and ast.unparse(n.func) == "EagleDraftWorker"]
    assert made, version  # built inside the worker's __init__, which the fallback's hook ends


@pytest.mark.releases
@pytest.mark.parametrize("version", RELEASES)
def test_v1_builds_its_draft_extend_graph_runner_from_the_worker_alone(version: str) -> None:
    """``type(stock_graph)(worker)`` makes the runner as the v1 worker's ``init_cuda_graphs`` does."""
    source = unpacked_source(version, V1_WORKER)
    worker = class_def(source, "EAGLEWorker") if source else None
    if worker is None:
        assert Version(version) >= Version("0.5.13")  # no v1 worker since; nothing to check
        return
    constructions = graph_runner_constructions(worker)
    assert constructions, version
    assert all(
        ast.unparse(c.func) == "EAGLEDraftExtendCudaGraphRunner" and only_the_worker(c) for c in constructions
    ), [ast.unparse(c) for c in constructions]
    # the model DraftKV shadows (worker.draft_model_runner's) is the one the runner captures
    runner_property = method_def(worker, "draft_model_runner")
    assert [ast.unparse(n.value) for n in ast.walk(runner_property) if isinstance(n, ast.Return)] == [
        "self.model_runner"
    ]
    assert "draft_extend_attn_backend" in assigned_attributes(source or "")


@pytest.mark.releases
@pytest.mark.parametrize("version", RELEASES)
def test_the_draft_extend_graph_runner_captures_through_what_kv_graph_shadows(version: str) -> None:
    """The runner class takes the worker as its one positional argument, captures by calling the draft
    model's ``forward`` (the stand-in, inside ``capture_graph``) and allocates its graph buffers with
    ``init_cuda_graph_state`` on the draft-extend backend that ``capture_graph`` is given."""
    source = unpacked_source(version, EXTEND_RUNNER)
    assert source is not None
    runner = class_def(source, "EAGLEDraftExtendCudaGraphRunner")
    assert runner is not None
    init = method_def(runner, "__init__")
    positional = [a.arg for a in init.args.args]
    assert positional[1:] and len(positional) - len(init.args.defaults) == 2, positional  # self, the worker
    forwards = {
        ast.unparse(n.func)
        for n in ast.walk(runner)
        if isinstance(n, ast.Call) and ast.unparse(n.func).endswith(".model.forward")
    }
    assert forwards and forwards <= {
        "self.model_runner.model.forward",
        "self.eagle_worker.draft_model_runner.model.forward",
    }
    backends = {
        ast.unparse(n.func.value)
        for n in ast.walk(init)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "init_cuda_graph_state"
    }
    assert len(backends) == 1 and backends <= {
        "self.eagle_worker.draft_extend_attn_backend",
        "self.draft_extend_attn_backend",
    }
    if backends == {"self.draft_extend_attn_backend"}:  # 0.5.11+: kept on the runner, the worker's unless given
        kept = [
            ast.unparse(n.value)
            for n in ast.walk(init)
            if isinstance(n, ast.Assign) and any(ast.unparse(t) == "self.draft_extend_attn_backend" for t in n.targets)
        ]
        assert kept == ["draft_extend_attn_backend or eagle_worker.draft_extend_attn_backend"], kept


@pytest.mark.releases
@pytest.mark.parametrize("version", RELEASES)
def test_is_draft_extend_means_v1s_draft_extend_where_there_is_one(version: str) -> None:
    """``placeholder_rows`` calls ``is_draft_extend()``: true for v1's DRAFT_EXTEND only (v2's rows are per
    token); a release without it has no v1 worker."""
    source = unpacked_source(version, FORWARD_BATCH_INFO)
    assert source is not None
    mode = class_def(source, "ForwardMode")
    assert mode is not None
    found = [n for n in mode.body if isinstance(n, ast.FunctionDef) and n.name == "is_draft_extend"]
    if not found:
        v1 = unpacked_source(version, V1_WORKER)
        assert v1 is None or class_def(v1, "EAGLEWorker") is None
        return
    arguments = found[0].args
    assert len(arguments.args) - len(arguments.defaults) == 1  # self alone is required
    # run the release's method on an enum of the release's members
    members = [t.id for n in mode.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]
    namespace: dict[str, Any] = {"ForwardMode": enum.Enum("ForwardMode", members)}
    exec(compile(ast.Module(body=[found[0]], type_ignores=[]), version, "exec"), namespace)
    is_draft_extend = namespace["is_draft_extend"]
    forward_mode = namespace["ForwardMode"]
    assert {m.name for m in forward_mode if is_draft_extend(m)} == {"DRAFT_EXTEND"}


# -- DYNSPEC_PREFILL_KV (on unless 0): while off, a prefill's draft extend writes only the draft KV ------

PROMPTS = Extend(tokens=[5, 6, 7, 8, 9], positions=[0, 1, 2, 0, 1], slots=[300, 301, 302, 400, 401])  # two requests


def prefill_batch() -> SimpleNamespace:
    """Two whole prompts (``reqs``: what ``admitted_to_decode`` counts)."""
    mode = SimpleNamespace(name="EXTEND", is_idle=lambda: False, is_draft_extend=lambda include_v2=False: False)
    reqs = [SimpleNamespace(origin_input_ids=[0] * n, output_ids=[], fill_ids=[0] * n) for n in (3, 2)]
    return SimpleNamespace(
        forward_mode=mode, batch_size=2, prompt=PROMPTS, seq_lens=SimpleNamespace(shape=(2,)), reqs=reqs
    )


def prefill_fallback(
    monkeypatch: pytest.MonkeyPatch, setting: str | None, mode: str = KV
) -> tuple[DraftStack, v2.V2Fallback]:
    if setting is None:
        monkeypatch.delenv(v2.PREFILL_KV_ENV, raising=False)
    else:
        monkeypatch.setenv(v2.PREFILL_KV_ENV, setting)
    stack = draft_stack(graph=False)
    controller = runtime.SwitchController(8, min_steps=1, log=False)
    fallback = v2.V2Fallback(controller, SimpleNamespace(), draft_kv_for(stack, mode, log=False))
    fallback.prefill_kv_only(stack.worker, log=False)
    return stack, fallback


def test_while_off_a_prefill_writes_the_draft_kv_of_a_full_prefill_and_nothing_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stack, fallback = prefill_fallback(monkeypatch, "1")
    fallback.controller.step(9)  # off
    out = stack.worker._draft_extend_for_prefill(prefill_batch())
    assert stack.log == ["embed", "qkv 0", "set_kv_buffer", "topk"]
    reference = draft_stack(graph=False, runner_graphs=())
    reference.worker._draft_extend_for_prefill(prefill_batch())
    assert stack.pool.kv == reference.pool.kv and len(stack.pool.kv) == 5
    # one placeholder row per request (the logits processor keeps each request's last token)
    assert out.next_token_logits == Zeros((2, 1), "torch.float32", DEVICE)


@pytest.mark.parametrize(
    ("setting", "mode", "off"),
    [("1", KV, False), (None, KV, False), ("0", KV, True), ("1", FULL, True), ("1", SKIP, True)],
    ids=["speculating", "speculating-by-default", "off-by-setting", "full-extend-mode", "skip-control"],
)
def test_a_prefill_runs_the_full_draft_extend_otherwise(
    monkeypatch: pytest.MonkeyPatch, setting: str | None, mode: str, off: bool
) -> None:
    """The controls: while speculating, with the setting 0, in the full-extend mode, or in the skip
    control (which would leave the prompts without draft KV), the prefill runs to the lm_head."""
    stack, fallback = prefill_fallback(monkeypatch, setting, mode)
    if off:
        fallback.controller.step(9)
    stack.worker._draft_extend_for_prefill(prefill_batch())
    assert what_ran(stack.log) == "full"


@pytest.mark.parametrize(("threshold", "kv_only"), [(1, True), (2, False)], ids=["more-than-threshold", "at-threshold"])
def test_a_wave_larger_than_the_threshold_switches_off_and_writes_only_its_kv(
    monkeypatch: pytest.MonkeyPatch, threshold: int, kv_only: bool
) -> None:
    """Two requests admitted at once while speculating: above a threshold of 1 speculation goes off
    before their prefill, which then writes only the draft KV; at a threshold of 2 (the control) it
    stays on and the prefill runs to the lm_head."""
    stack, fallback = prefill_fallback(monkeypatch, "1")
    fallback.controller = runtime.SwitchController(threshold, min_steps=1, log=False)
    stack.worker._draft_extend_for_prefill(prefill_batch())
    assert fallback.controller.speculating is not kv_only
    assert what_ran(stack.log) == ("kv" if kv_only else "full")
    if kv_only:
        assert stack.log == ["embed", "qkv 0", "set_kv_buffer", "topk"]


def req(prompt: int, filled: int, output: int = 0, length_only: bool = False) -> SimpleNamespace:
    fill = {"fill_len": filled} if length_only else {"fill_ids": [0] * filled}
    return SimpleNamespace(origin_input_ids=[0] * prompt, output_ids=[0] * output, **fill)


@pytest.mark.parametrize(
    ("reqs", "admitted"),
    [
        ([req(5, 5), req(3, 3)], 2),
        ([req(5, 5), req(9, 4)], 1),  # the second's prompt goes on in the next chunk
        ([req(5, 5, length_only=True), req(9, 4, length_only=True)], 1),  # 0.5.13
        ([req(5, 7, output=2), req(3, 3)], 2),  # a retracted request prefills its output too
        (None, 0),  # 0.5.4 - 0.5.5: no requests to read, so no switch at admission
    ],
    ids=["whole-prompts", "a-chunk", "a-chunk-0.5.13", "retracted", "no-reqs"],
)
def test_only_requests_that_will_decode_count_at_admission(reqs: list[Any] | None, admitted: int) -> None:
    batch = prefill_batch()
    batch.reqs = reqs
    assert v2.admitted_to_decode(batch) == admitted


def test_a_wave_of_one_whole_prompt_and_a_chunk_does_not_switch_at_a_threshold_of_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stack, fallback = prefill_fallback(monkeypatch, "1")
    fallback.controller = runtime.SwitchController(1, min_steps=1, log=False)
    batch = prefill_batch()
    batch.reqs = [req(5, 5), req(9, 4)]
    stack.worker._draft_extend_for_prefill(batch)
    assert fallback.controller.speculating and what_ran(stack.log) == "full"


def test_a_pd_disaggregated_server_keeps_the_stock_prefill(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PD prefill server never decodes, so it would never resume: no KV-only prefill there, even
    while off; the control (no disaggregation) is the test above it."""
    monkeypatch.setenv(v2.PREFILL_KV_ENV, "1")
    stack = draft_stack(graph=False)
    controller = runtime.SwitchController(1, min_steps=1, log=False)
    fallback = v2.V2Fallback(controller, SimpleNamespace(), draft_kv_for(stack, KV, log=False))
    fallback.prefill_kv_only(stack.worker, log=False, disaggregation="prefill")
    controller.step(9)  # off
    stack.worker._draft_extend_for_prefill(prefill_batch())
    assert what_ran(stack.log) == "full"


@pytest.mark.parametrize(("setting", "switches"), [("0", False), (None, True)], ids=["turned-off", "default-on"])
def test_with_the_setting_0_a_wave_does_not_switch_at_admission(
    monkeypatch: pytest.MonkeyPatch, setting: str | None, switches: bool
) -> None:
    stack, fallback = prefill_fallback(monkeypatch, setting)
    fallback.controller = runtime.SwitchController(1, min_steps=1, log=False)
    stack.worker._draft_extend_for_prefill(prefill_batch())
    assert fallback.controller.speculating is not switches
    assert what_ran(stack.log) == ("kv" if switches else "full")


def test_a_bad_prefill_kv_setting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="DYNSPEC_PREFILL_KV must be 0 or 1, not 'on'"):
        prefill_fallback(monkeypatch, "on")


def test_prefill_windows_do_not_count_toward_the_stand_in_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode path that never reaches the stand-in must still be found out: prefills, which always
    reach it, are not counted. The control: a counted window is."""
    stack, fallback = prefill_fallback(monkeypatch, "1")
    fallback.controller.step(9)
    stack.worker._draft_extend_for_prefill(prefill_batch())
    assert (fallback.draft_kv._windows, fallback.draft_kv._windows_called) == (0, 0)
    with fallback.draft_kv.kv_only(stack.worker):
        stack.extend()
    assert (fallback.draft_kv._windows, fallback.draft_kv._windows_called) == (1, 1)


SCHEDULE_BATCH = "srt/managers/schedule_batch.py"


@pytest.mark.releases
@pytest.mark.parametrize("version", OWN_FALLBACK)
def test_a_prefill_batch_carries_what_admitted_to_decode_reads(version: str) -> None:
    """``admitted_to_decode`` reads ``reqs`` of the worker batch and each request's ``fill_ids``
    (0.5.13: ``fill_len``), ``origin_input_ids`` and ``output_ids``; where a release's batch has no
    ``reqs`` (0.5.4 - 0.5.5) it counts none."""
    source = (releases.unpacked(version, [SCHEDULE_BATCH]) / "sglang" / SCHEDULE_BATCH).read_text()
    # 0.5.13 hands the prefill's ScheduleBatch itself to the draft extend
    worker_batch = class_def(source, "ModelWorkerBatch") or class_def(source, "ScheduleBatch")
    request = class_def(source, "Req")
    assert worker_batch is not None and request is not None
    fields = {ast.unparse(n.target) for n in worker_batch.body if isinstance(n, ast.AnnAssign)}
    assert "seq_lens" in fields
    assigned = {ast.unparse(t) for n in ast.walk(request) if isinstance(n, ast.Assign | ast.AnnAssign)
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target])}  # fmt: skip
    if "reqs" in fields:
        assert {"self.origin_input_ids", "self.output_ids"} <= assigned, version
        assert {"self.fill_ids", "self.fill_len"} & assigned, version  # 0.5.13: only the length
    assert ("reqs" in fields) is (Version(version) >= Version("0.5.6")), version  # where it is known to be


WORKER_V2 = "srt/speculative/eagle_worker_v2.py"


@pytest.mark.releases
@pytest.mark.parametrize("version", OWN_FALLBACK)
def test_the_draft_worker_has_the_prefill_extend_the_kv_only_prefill_wraps(version: str) -> None:
    """``prefill_kv_only`` wraps ``EagleDraftWorker._draft_extend_for_prefill`` (on by default)."""
    source = (releases.unpacked(version, [WORKER_V2]) / "sglang" / WORKER_V2).read_text()
    draft_worker = class_def(source, "EagleDraftWorker")
    assert draft_worker is not None, version
    methods = {n.name for n in draft_worker.body if isinstance(n, ast.FunctionDef)}
    assert "_draft_extend_for_prefill" in methods, version
    assert "_draft_extend_for_prefill_missing" not in methods  # negative control: the set is read


def test_a_draft_worker_without_the_prefill_extend_keeps_its_prefills(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A tree whose draft worker lacks the method starts, says so once, and wraps nothing."""
    monkeypatch.delenv(v2.PREFILL_KV_ENV, raising=False)
    stack = draft_stack(graph=False)
    fallback = v2.V2Fallback(
        runtime.SwitchController(8, min_steps=1, log=False), SimpleNamespace(), draft_kv_for(stack, KV, log=False)
    )
    worker = SimpleNamespace()
    with caplog.at_level(logging.INFO):
        fallback.prefill_kv_only(worker, log=True)
    assert vars(worker) == {}
    assert "has no _draft_extend_for_prefill" in caplog.text
    # The control: a worker that has it gets the wrapper.
    fallback.prefill_kv_only(stack.worker, log=False)
    assert stack.worker._draft_extend_for_prefill.__name__ == "draft_extend_for_prefill"
