"""The draft side of a fallback iteration (runtime r4, v2 module r7): ``DraftKV``, ``RESUME``, the recorder.

A fallback iteration's draft extend writes only the draft model's KV; the iteration that switches
speculation back on runs the full one. These tests drive ``DraftKV.kv_only`` through a fake draft
stack with SGLang's call structure (``fake_draft``), so what they check is what a real extend would
do: which stages ran, what the KV pool holds, what is left on the objects afterwards. What only a
GPU shows (the drafts after a fallback span equal a full extend's) is ``dynspec proof``'s
``exact_kv``; the names the runtime and that check share are pinned here.
"""

from __future__ import annotations

import ast
import json
import logging
import random
import re
import sys
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from patcher import releases
from patcher.proof import exactkv
from patcher.proof import run as proof_run
from patches.runtime import dynspec_runtime as runtime
from patches.runtime import dynspec_v2 as v2
from tests.conftest import RELEASES
from tests.patches import test_speculative_dynspec_runtime as runtime_tests
from tests.patches import test_speculative_dynspec_v2 as v2_tests
from tests.patches.fake_draft import (
    DEVICE,
    EXTEND,
    GRAPH_ATTRIBUTES,
    HIDDEN,
    SPEC_HIDDEN,
    VOCAB,
    DraftStack,
    Extend,
    LlamaForCausalLMEagle,
    LlamaForCausalLMEagle3,
    RadixAttention,
    Rows,
    Zeros,
    draft_stack,
    full_forward_kv,
    graph_attributes,
    install_fake_torch,
)

KV, FULL, SKIP = runtime.DRAFT_KV_ONLY, runtime.DRAFT_KV_FULL, runtime.DRAFT_KV_SKIP
PLACEHOLDER_LOGITS = Zeros((3, 1), "torch.float32", DEVICE)


@pytest.fixture(autouse=True)
def sglang_side(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch and the SGLang modules the runtime imports inside functions; no DYNSPEC_* from the shell."""
    for name in (runtime.DRAFT_KV_ENV, runtime.RECORD_ENV, runtime.ATTENTION_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(v2.EARLY_FENCE_ENV, "0")  # no CUDA event to record
    for name in ("sglang", "sglang.srt", "sglang.srt.speculative"):
        package = types.ModuleType(name)
        package.__path__ = []
        monkeypatch.setitem(sys.modules, name, package)
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.dynspec_runtime", runtime)
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    install_fake_torch(monkeypatch)


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
    monkeypatch.setattr(runtime, "_WORKER_GRAPHS", ())
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


def test_auto_is_kv_for_a_one_layer_eagle3_draft_and_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=runtime.__name__):
        assert runtime.DraftKV.build(draft_stack().runner).mode == KV
    assert caplog.records == []


def test_auto_with_a_draft_class_it_does_not_know_runs_the_full_extend_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger=runtime.__name__):
        draft_kv = runtime.DraftKV.build(draft_stack(model_class=LlamaForCausalLMEagle).runner)
        runtime.DraftKV.build(draft_stack(model_class=LlamaForCausalLMEagle).runner, log=False)  # rank > 0
    assert draft_kv.mode == FULL
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            logging.INFO,
            "dynspec: the KV-only draft extend does not know the draft model class LlamaForCausalLMEagle; "
            "the fallback runs the full draft extend in every iteration",
        )
    ]


@pytest.mark.parametrize(
    ("stack_options", "named"),
    [
        ({"model_class": LlamaForCausalLMEagle}, "does not know the draft model class LlamaForCausalLMEagle"),
        ({"layers": 2}, "needs a one-layer draft; LlamaForCausalLMEagle3 has 2 attention layers"),
    ],
    ids=["unknown-class", "two-layers"],
)
def test_kv_asked_for_where_it_cannot_work_is_refused(
    monkeypatch: pytest.MonkeyPatch, stack_options: dict[str, Any], named: str
) -> None:
    monkeypatch.setenv(runtime.DRAFT_KV_ENV, "kv")
    with pytest.raises(ValueError, match=re.escape(f"DYNSPEC_DRAFT_KV=kv: the KV-only draft extend {named}")):
        runtime.DraftKV.build(draft_stack(**stack_options).runner)


def test_the_draft_pool_is_read_when_a_window_needs_it_not_at_start_up() -> None:
    """0.5.14+ allocate the draft KV pool after the worker (and so the fallback) is built."""
    stack = draft_stack()
    pool, stack.runner.token_to_kv_pool = stack.runner.token_to_kv_pool, None
    draft_kv = runtime.DraftKV.build(stack.runner)
    assert draft_kv.mode == KV and runtime.kv_only_unsupported(stack.model) is None
    stack.runner.token_to_kv_pool = pool
    with draft_kv.kv_only(stack.worker):
        stack.extend()
    assert stack.log == ["embed", "qkv 0", "set_kv_buffer", "topk"] and stack.pool.kv == full_forward_kv()


@pytest.mark.parametrize(("setting", "mode"), [("", KV), ("auto", KV), (" KV ", KV), ("full", FULL), ("Skip", SKIP)])
def test_the_setting_is_read_case_and_space_insensitively(
    monkeypatch: pytest.MonkeyPatch, setting: str, mode: str
) -> None:
    monkeypatch.setenv(runtime.DRAFT_KV_ENV, setting)
    assert runtime.DraftKV.build(draft_stack().runner, log=False).mode == mode


def test_full_and_skip_need_nothing_of_the_draft(monkeypatch: pytest.MonkeyPatch) -> None:
    for setting in (FULL, SKIP):
        monkeypatch.setenv(runtime.DRAFT_KV_ENV, setting)
        assert runtime.DraftKV.build(draft_stack(layers=2).runner, log=False).mode == setting


def test_a_bad_setting_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(runtime.DRAFT_KV_ENV, "fast")
    with pytest.raises(ValueError, match=re.escape("DYNSPEC_DRAFT_KV must be one of auto, kv, full, skip, not 'fast'")):
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


def test_64_windows_without_a_draft_forward_turn_kv_into_full(caplog: pytest.LogCaptureFixture) -> None:
    """A path that never calls the stand-in (a graph this module does not know) saves nothing: say so."""
    stack = draft_stack()
    draft_kv = draft_kv_for(stack)
    with caplog.at_level(logging.WARNING, logger=runtime.__name__):
        for _ in range(63):
            with draft_kv.kv_only(stack.worker):
                pass
        assert draft_kv.mode == KV
        with draft_kv.kv_only(stack.worker):
            pass
        assert draft_kv.mode == FULL
        for _ in range(100):
            with draft_kv.kv_only(stack.worker):
                pass
    assert warnings_in(caplog) == [
        "dynspec: DYNSPEC_DRAFT_KV=kv cannot work here (the draft model's forward was not called in 64 fallback "
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


def test_skip_that_never_sees_a_draft_forward_gives_up_too(caplog: pytest.LogCaptureFixture) -> None:
    stack = draft_stack()
    draft_kv = draft_kv_for(stack, SKIP)
    with caplog.at_level(logging.WARNING, logger=runtime.__name__):
        for _ in range(64):
            with draft_kv.kv_only(stack.worker):
                pass
    assert draft_kv.mode == FULL and warnings_in(caplog)[0].startswith(
        "dynspec: DYNSPEC_DRAFT_KV=skip cannot work here"
    )


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


def test_v1_runs_the_fall_back_iterations_draft_extend_under_kv_only_and_the_resume_in_full() -> None:
    stack = draft_stack()
    worker = stack.worker
    worker.speculative_num_steps, worker.speculative_num_draft_tokens = 3, 4  # type: ignore[attr-defined]
    recorder = StepRecorder()
    controller = runtime.SwitchController(4, min_steps=1, log=False)
    fallback = runtime.DynspecFallback(controller, TargetStub(), draft_kv_for(stack), recorder)  # type: ignore[arg-type]

    def decode_branch(batch: Any) -> Any:  # forward_batch_generation's decode branch, as the hook sees it
        if fallback.should_fall_back(batch):
            return fallback.fall_back(worker, batch, decode_branch)
        return stack.extend()

    ran = []
    for size in SIZES:
        stack.clear()
        decode_branch(v1_batch(size))
        ran.append(what_ran(stack.log))
    assert ran == EXPECTED
    assert recorder.steps == [s for s in STEPS if s != runtime.SPECULATE]
    assert stack.pool.kv == full_forward_kv()  # every iteration wrote the same K/V
    assert "forward" not in vars(stack.model) and worker.cuda_graph_runner_for_draft_extend is not None


def test_v2_runs_the_fall_back_iterations_draft_extend_under_kv_only_and_the_resume_in_full() -> None:
    stack = draft_stack()
    draft_worker = stack.worker
    draft_worker.speculative_num_steps, draft_worker.speculative_num_draft_tokens = 3, 4  # type: ignore[attr-defined]
    worker = SimpleNamespace(speculative_num_steps=3, speculative_num_draft_tokens=4, draft_worker=draft_worker)
    recorder = StepRecorder()
    controller = runtime.SwitchController(4, min_steps=1, log=False)
    fallback = v2.V2Fallback(controller, TargetStub(), draft_kv_for(stack), recorder)

    def decode_branch(batch: Any) -> Any:
        if fallback.should_fall_back(batch):
            return fallback.fall_back(worker, lambda: decode_branch(batch))
        stack.extend()
        return SimpleNamespace(next_token_ids=None, speculative_num_draft_tokens=worker.speculative_num_draft_tokens)

    ran = []
    for size in SIZES:
        stack.clear()
        decode_branch(v2_tests.decode_batch(size))
        ran.append(what_ran(stack.log))
    assert ran == EXPECTED
    assert recorder.steps == [s for s in STEPS if s != runtime.SPECULATE]
    assert draft_worker.cuda_graph_runner_for_draft_extend is not None and "forward" not in vars(stack.model)


def zero_step_worker(stack: DraftStack, **flags: Any) -> v2_tests.FakeAdaptiveWorker:
    worker = v2_tests.FakeAdaptiveWorker(speculative_disable_batch_size=4, speculative_switch_min_steps=1, **flags)
    worker.draft_worker = stack.worker
    return worker


def test_the_zero_step_policy_runs_the_draft_extend_under_kv_only_only_at_fall_back_with_zero_steps() -> None:
    stack = draft_stack()
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


def test_at_fall_back_without_a_zero_step_state_the_draft_extend_stays_full(caplog: pytest.LogCaptureFixture) -> None:
    stack = draft_stack()
    worker = zero_step_worker(stack)
    policy = v2.attach_zero_step_policy(worker)  # init_states never runs: no zero-step state
    assert policy is not None
    with caplog.at_level(logging.ERROR, logger=v2.__name__):
        policy.activate_step_by_batch(9)
    assert policy._step == runtime.FALL_BACK and worker.speculative_num_steps == 3
    stack.worker._draft_extend_for_decode(EXTEND)
    assert what_ran(stack.log) == "full"


def test_the_zero_step_policy_leaves_the_draft_extend_alone_in_full_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(runtime.DRAFT_KV_ENV, "full")
    stack = draft_stack()
    policy = v2.attach_zero_step_policy(zero_step_worker(stack))
    assert policy is not None and policy.draft_kv.mode == FULL
    assert "_draft_extend_for_decode" not in vars(stack.worker)


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
    assert exactkv.Load(1, 1, 1, 1, 1, 1).waves()[0][0].rid.startswith(runtime.RECORD_RID_PREFIX)


def test_the_kv_only_words_are_in_the_start_up_line_exactly_when_kv_is_on() -> None:
    for mode in (KV, FULL, SKIP):
        described = runtime.describe_draft_kv(runtime.DraftKV(mode, None))
        assert (proof_run.KV_ONLY_WORDS in described) == (mode == KV), described


def start_up_lines(attach: str, caplog: pytest.LogCaptureFixture) -> list[str]:
    """The INFO/WARNING lines one of the three attach paths logs at start-up."""
    caplog.clear()
    with caplog.at_level(logging.INFO):
        if attach == "v1":
            assert runtime.attach_dynspec(runtime_tests.worker_with(speculative_disable_batch_size=8)) is not None
        elif attach == "v2":
            assert v2.attach_fallback(v2_tests.worker_with(speculative_disable_batch_size=8)) is not None
        else:
            worker = v2_tests.FakeAdaptiveWorker(speculative_disable_batch_size=8)
            assert v2.attach_zero_step_policy(worker) is not None
            worker.init_cuda_graphs(v2_tests.GRAPH_SIZES)
    return [f"[2026-12-01 10:00:00 TP0] {r.getMessage()}" for r in caplog.records]


@pytest.mark.parametrize("attach", ["v1", "v2", "zero-step"])
def test_the_proof_reads_the_runtimes_own_start_up_line(
    attach: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    proof = proof_run.Proof(proof_run.ProofOptions(out=tmp_path), progress=lambda message: None)
    log = tmp_path / "dynspec.log"
    log.write_text("\n".join(start_up_lines(attach, caplog)) + "\n")
    problems: list[str] = []
    proof.check_kv_only_path(log, problems)
    assert problems == []
    monkeypatch.setenv(runtime.DRAFT_KV_ENV, "full")  # the control: a server that runs the full extend
    log.write_text("\n".join(start_up_lines(attach, caplog)) + "\n")
    proof.check_kv_only_path(log, problems)
    assert len(problems) == 1 and problems[0].startswith("the dynspec server did not run the KV-only draft extend")


def test_the_proof_reads_the_runtimes_own_give_up_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lines = start_up_lines("v1", caplog)
    stack = draft_stack(backend="fused")
    with caplog.at_level(logging.WARNING, logger=runtime.__name__), draft_kv_for(stack).kv_only(stack.worker):
        stack.extend()
    log = tmp_path / "dynspec.log"
    log.write_text("\n".join([*lines, *(f"[TP0] {m}" for m in warnings_in(caplog))]) + "\n")
    problems: list[str] = []
    proof_run.Proof(proof_run.ProofOptions(out=tmp_path), progress=lambda message: None).check_kv_only_path(
        log, problems
    )
    assert len(problems) == 1 and problems[0].startswith("the dynspec server gave the KV-only draft extend up")


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
    assert worker_graphs - DECODE_GRAPHS == set(runtime._WORKER_GRAPHS), worker_graphs
