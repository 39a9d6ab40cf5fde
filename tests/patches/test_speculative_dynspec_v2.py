"""The spec-v2 runtime module dynspec ships into SGLang: fallback plumbing, stride padding, zero-step policy.

Everything runs on the CPU with stand-ins for SGLang's objects; what only a GPU can show (the
one-token graphs, token-identical outputs) is for the proof runs. Where the module relies on a
fact about SGLang (which result field carries the stride, what the worker calls on its adaptive
controller, the verify input's fields), the fact is read from every real release.
"""

from __future__ import annotations

import abc
import ast
import dataclasses
import inspect
import logging
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from patcher.engine import patch_file
from patcher.releases import unpacked
from patches.runtime import dynspec_auto, dynspec_settings
from patches.runtime import dynspec_runtime as runtime
from patches.runtime import dynspec_v2 as v2
from patches.runtime.dynspec_settings import Settings
from patches.speculative_dynspec_v2 import SpeculativeDynspecV2
from tests.patches.fake_draft import DraftWorker, draft_stack
from tests.patches.patched_package import install_patched_package
from tests.patches.test_eagle_worker_v2_dynspec_fallback import OWN_FALLBACK_RELEASES
from tests.patches.test_eagle_worker_v2_dynspec_zero_step import ZERO_STEP_RELEASES

WORKER_FILE = "srt/speculative/eagle_worker_v2.py"


@pytest.fixture(autouse=True)
def sglang_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """``sglang.srt.speculative`` holding the real ``dynspec_runtime``, as in a patched tree."""
    install_patched_package(monkeypatch)


def source_of(version: str, member: str) -> str:
    return (unpacked(version, [member]) / "sglang" / member).read_text()


def class_node(source: str, name: str) -> ast.ClassDef:
    return next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == name)


def method_node(classdef: ast.ClassDef, name: str) -> ast.FunctionDef:
    return next(n for n in classdef.body if isinstance(n, ast.FunctionDef) and n.name == name)


# -- settings ------------------------------------------------------------------------------------


def test_settings_come_from_server_args_before_runtime_context_exists() -> None:
    worker = SimpleNamespace(server_args=SimpleNamespace(speculative_disable_batch_size=32))
    assert v2.settings_of(worker) == Settings(32, 32, 8)
    assert v2.settings_of(SimpleNamespace(server_args=SimpleNamespace())) is None  # flags patch absent


def test_resolved_spec_settings_win_over_the_raw_server_args(monkeypatch: pytest.MonkeyPatch) -> None:
    """From 0.5.17 the worker reads ``get_spec()``; 0.5.20's ``ServerArgs`` keeps only raw input."""

    class Spec:
        speculative_disable_batch_size = 48
        speculative_enable_batch_size = 24

        def __getattr__(self, name: str) -> Any:
            raise AttributeError(name)

    context = types.ModuleType("sglang.srt.runtime_context")
    context.get_spec = Spec  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, context.__name__, context)
    raw = SimpleNamespace(speculative_disable_batch_size=None, speculative_switch_min_steps=3, pp_size=1)
    worker = SimpleNamespace(server_args=raw)
    assert v2.settings_of(worker) == Settings(48, 24, 3)
    assert v2.read_setting(worker, "pp_size") == 1  # not a speculative setting: server_args
    assert v2.read_setting(worker, "nothing", "default") == "default"


# -- stride padding ------------------------------------------------------------------------------


class FakeTensor:
    """The three tensor operations ``pad_to_stride`` uses, on a list."""

    def __init__(self, values: list[int]) -> None:
        self.values = list(values)

    @property
    def shape(self) -> tuple[int]:
        return (len(self.values),)

    def new_zeros(self, shape: tuple[int]) -> FakeTensor:
        return FakeTensor([0] * shape[0])

    def __setitem__(self, key: slice, other: FakeTensor) -> None:
        self.values[key] = other.values


@pytest.mark.parametrize("stride", [2, 4, 8])
def test_padding_puts_each_token_where_the_scheduler_reads_it(stride: int) -> None:
    tokens = [11, 22, 33, 44, 55]
    padded = v2.pad_to_stride(FakeTensor(tokens), stride).values
    assert len(padded) == len(tokens) * stride
    # _resolve_spec_overlap_token_ids (<= 0.5.11) with every accept_lens[i] == 1:
    accept_lens = [1] * len(tokens)
    assert [padded[i * stride : i * stride + accept_lens[i]] for i in range(len(tokens))] == [[t] for t in tokens]


def test_stride_one_needs_no_copy() -> None:
    tokens = FakeTensor([1, 2])
    assert v2.pad_to_stride(tokens, 1) is tokens


def result_fields(version: str) -> list[str]:
    source = source_of(version, "srt/managers/utils.py")
    return [s.target.id for s in class_node(source, "GenerationBatchResult").body if isinstance(s, ast.AnnAssign)]


@pytest.mark.releases
@pytest.mark.parametrize("version", OWN_FALLBACK_RELEASES)
def test_padding_is_applied_exactly_where_the_scheduler_uses_the_workers_stride(version: str) -> None:
    result_class = dataclasses.make_dataclass("GenerationBatchResult", [(f, Any, None) for f in result_fields(version)])
    scheduler = next(
        source_of(version, m)
        for m in (
            "srt/managers/scheduler_output_processor_mixin.py",
            "srt/managers/scheduler_components/batch_result_processor.py",
        )
        if (unpacked(version, [m]) / "sglang" / m).exists()
    )
    worker = class_node(source_of(version, WORKER_FILE), "EAGLEWorkerV2")
    stamped = [
        k
        for n in ast.walk(method_node(worker, "verify"))
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "GenerationBatchResult"
        for k in n.keywords
        if k.arg == "speculative_num_draft_tokens"
    ]
    if "stride = self.draft_worker.speculative_num_draft_tokens" in scheduler:  # up to 0.5.11
        assert not stamped
        assert v2.needs_stride_padding(result_class())
    else:
        assert "stride = result.speculative_num_draft_tokens" in scheduler
        assert [ast.unparse(k.value) for k in stamped] == ["self.speculative_num_draft_tokens"]  # 1 in a fallback
        assert not v2.needs_stride_padding(result_class(speculative_num_draft_tokens=1))


# -- the fallback (0.5.4-0.5.13) -----------------------------------------------------------------


class FakeTarget:
    def __init__(self, runner: SimpleNamespace) -> None:
        self.runner = runner
        self.attn_backend = "one-token backend"
        self.capture_bs = [16, 32]

    def swap_in(self) -> tuple[str, str]:
        previous = (self.runner.attn_backend, self.runner.graph_runner)
        self.runner.attn_backend, self.runner.graph_runner = "one-token backend", "one-token graph"
        return previous

    def swap_out(self, previous: tuple[str, str]) -> None:
        self.runner.attn_backend, self.runner.graph_runner = previous


def fake_worker() -> SimpleNamespace:
    draft = SimpleNamespace(
        speculative_num_steps=3,
        speculative_num_draft_tokens=4,
        cuda_graph_runner_for_draft_extend="extend graph",
        draft_runner=draft_stack().runner,
    )
    runner = SimpleNamespace(attn_backend="live backend", graph_runner="live graph")
    return SimpleNamespace(
        speculative_num_steps=3,
        speculative_num_draft_tokens=4,
        draft_worker=draft,
        target_worker=SimpleNamespace(model_runner=runner),
    )


def state_of(worker: SimpleNamespace) -> tuple:
    draft, runner = worker.draft_worker, worker.target_worker.model_runner
    return (
        worker.speculative_num_steps,
        worker.speculative_num_draft_tokens,
        draft.speculative_num_steps,
        draft.speculative_num_draft_tokens,
        draft.cuda_graph_runner_for_draft_extend,
        runner.attn_backend,
        runner.graph_runner,
    )


STOCK = (3, 4, 3, 4, "extend graph", "live backend", "live graph")
ONE_TOKEN = (0, 1, 0, 1, None, "one-token backend", "one-token graph")


class SeqLens(FakeTensor):
    device = "cuda:0"

    def __add__(self, other: int) -> SeqLens:
        return SeqLens([value + other for value in self.values])


def decode_batch(size: int, idle: bool = False, spec_info: Any = "draft input") -> SimpleNamespace:
    return SimpleNamespace(
        seq_lens=SeqLens(list(range(100, 100 + size))),
        forward_mode=SimpleNamespace(is_idle=lambda: idle),
        spec_info=spec_info,
    )


@pytest.fixture(autouse=True)
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The one torch call the early fence makes, logging when events are recorded."""
    timeline: list[str] = []

    class Event:
        def record(self) -> None:
            timeline.append("fence recorded")

    device_module = SimpleNamespace(Event=Event)
    torch = types.ModuleType("torch")
    torch.get_device_module = lambda device: device_module  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    for name in (v2.EARLY_FENCE_ENV, runtime.DRAFT_KV_ENV, runtime.RECORD_ENV, runtime.ATTENTION_ENV):
        monkeypatch.delenv(name, raising=False)  # a shell with DYNSPEC_* set must not change these tests
    return timeline


def fallback_for(worker: SimpleNamespace, disable_above: int = 8) -> v2.V2Fallback:
    controller = runtime.SwitchController(disable_above, min_steps=1, log=False)
    draft_kv = runtime.DraftKV(runtime.DRAFT_KV_ONLY, worker.draft_worker.draft_runner, log=False)
    return v2.V2Fallback(controller, FakeTarget(worker.target_worker.model_runner), draft_kv)


@pytest.mark.parametrize("stamped", [False, True], ids=["<=0.5.11", "0.5.12+"])
def test_fall_back_reruns_the_branch_with_one_token_everywhere_and_restores(stamped: bool) -> None:
    worker = fake_worker()
    fallback = fallback_for(worker, disable_above=2)
    batch = decode_batch(3)
    seen = []

    def rerun() -> SimpleNamespace:
        assert not fallback.should_fall_back(batch), "the re-entered decode branch must not decide again"
        seen.append((fallback.in_fallback, state_of(worker)))
        result = SimpleNamespace(next_token_ids=FakeTensor([7, 8, 9]))
        if stamped:
            result.speculative_num_draft_tokens = worker.speculative_num_draft_tokens  # as verify() does
        return result

    assert fallback.should_fall_back(batch)
    result = fallback.fall_back(worker, rerun)
    assert seen == [(True, ONE_TOKEN)]
    assert (fallback.in_fallback, state_of(worker)) == (False, STOCK)
    assert result.next_token_ids.values == ([7, 8, 9] if stamped else [7, 0, 0, 0, 8, 0, 0, 0, 9, 0, 0, 0])
    assert (fallback.controller.spec_iterations, fallback.controller.fallback_iterations) == (0, 1)


def test_fall_back_restores_everything_when_the_iteration_fails() -> None:
    worker = fake_worker()
    fallback = fallback_for(worker)

    def rerun() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fallback.fall_back(worker, rerun)
    assert (fallback.in_fallback, state_of(worker)) == (False, STOCK)


def verify_result(timeline: list[str], with_verify_done: bool) -> SimpleNamespace:
    """A 0.5.12 verify result (its draft input carries ``new_seq_lens`` and ``verify_done``) or a 0.5.13 one."""
    timeline.append("target forward")
    draft_input = SimpleNamespace(new_seq_lens="after verify", verify_done="event after verify")
    if not with_verify_done:
        draft_input = SimpleNamespace(new_seq_lens="after verify")  # 0.5.13 publishes by callback
    return SimpleNamespace(
        next_token_ids=FakeTensor([1, 2, 3]), speculative_num_draft_tokens=1, next_draft_input=draft_input
    )


def test_the_next_seq_lens_are_published_before_the_target_forward(fake_torch: list[str]) -> None:
    worker = fake_worker()
    fallback = fallback_for(worker, disable_above=2)
    batch = decode_batch(3)
    assert fallback.should_fall_back(batch)
    result = fallback.fall_back(worker, lambda: verify_result(fake_torch, with_verify_done=True))
    assert fake_torch == ["fence recorded", "target forward"]
    assert result.next_draft_input.new_seq_lens.values == [101, 102, 103]  # every request accepts its root
    assert result.next_draft_input.verify_done not in ("event after verify", None)
    assert batch.seq_lens.values == [100, 101, 102]  # the batch itself is not touched


def test_a_release_without_verify_done_keeps_its_own_publication(fake_torch: list[str]) -> None:
    worker = fake_worker()
    fallback = fallback_for(worker, disable_above=2)
    assert fallback.should_fall_back(decode_batch(3))
    result = fallback.fall_back(worker, lambda: verify_result(fake_torch, with_verify_done=False))
    assert result.next_draft_input == SimpleNamespace(new_seq_lens="after verify")


def test_the_early_fence_can_be_turned_off(fake_torch: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(v2.EARLY_FENCE_ENV, "0")
    worker = fake_worker()
    fallback = fallback_for(worker, disable_above=2)
    assert fallback.should_fall_back(decode_batch(3))
    result = fallback.fall_back(worker, lambda: verify_result(fake_torch, with_verify_done=True))
    assert fake_torch == ["target forward"]
    assert result.next_draft_input.verify_done == "event after verify"


def test_a_bad_early_fence_setting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(v2.EARLY_FENCE_ENV, "yes")
    with pytest.raises(ValueError, match="DYNSPEC_EARLY_FENCE must be 0 or 1, not 'yes'"):
        v2.early_fence_enabled()
    with pytest.raises(ValueError, match="DYNSPEC_EARLY_FENCE"):  # at start-up, not mid-decode
        fallback_for(fake_worker())


@pytest.mark.parametrize(
    "batch", [decode_batch(9, idle=True), decode_batch(9, spec_info=None)], ids=["idle", "no-draft-input"]
)
def test_batches_the_fallback_cannot_serve_keep_the_stock_path_uncounted(batch: SimpleNamespace) -> None:
    fallback = fallback_for(fake_worker(), disable_above=1)
    assert not fallback.should_fall_back(batch)
    assert fallback.controller.spec_iterations + fallback.controller.fallback_iterations == 0


class FakeModelRunner:
    """What ``dynspec_runtime.SingleTokenTarget.build`` reads and restores."""

    def __init__(self) -> None:
        self.server_args = SimpleNamespace(
            speculative_num_steps=3, speculative_num_draft_tokens=4, cuda_graph_bs=[1, 8, 16, 32, 64]
        )
        self.attn_backend = "live backend"
        self.graph_runner = None  # CUDA graphs disabled: the fallback runs eagerly

    def _get_attention_backend(self, init_new_workspace: bool = False) -> str:
        return f"backend built for N={self.server_args.speculative_num_draft_tokens}"


def worker_with(**flags: Any) -> SimpleNamespace:
    settings = {"speculative_algorithm": "EAGLE3", "speculative_eagle_topk": 1, "model_path": "m", **flags}
    worker = fake_worker()
    worker.server_args = SimpleNamespace(**settings)
    worker.tp_rank = 0
    worker.target_worker.model_runner = FakeModelRunner()
    return worker


def test_attach_fallback_is_a_no_op_without_the_flag() -> None:
    worker = worker_with()
    assert v2.attach_fallback(worker) is None
    assert not hasattr(worker.draft_worker, "_dynspec")


def test_attach_fallback_refuses_unsupported_settings() -> None:
    with pytest.raises(ValueError, match="does not support --speculative-eagle-topk > 1"):
        v2.attach_fallback(worker_with(speculative_disable_batch_size=8, speculative_eagle_topk=4))


def test_attach_fallback_builds_the_one_token_state_and_hands_it_to_the_draft_worker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = worker_with(
        speculative_disable_batch_size=32, speculative_enable_batch_size=16, speculative_switch_min_steps=4
    )
    with caplog.at_level(logging.INFO, logger=v2.__name__):
        fallback = v2.attach_fallback(worker)
    assert fallback is not None and worker.draft_worker._dynspec is fallback
    controller = fallback.controller
    assert (controller.disable_above, controller.enable_at_or_below, controller.min_steps) == (32, 16, 4)
    assert fallback.target.attn_backend == "backend built for N=1"
    assert worker.target_worker.model_runner.server_args.speculative_num_draft_tokens == 4
    assert "dynspec: v2 fallback ready" in caplog.text and "none (eager)" in caplog.text


def test_mask_length() -> None:
    assert v2.mask_length(4, 100, 4096) == 104
    assert v2.mask_length(4, None, 4096) == 4 * 4097
    assert v2.mask_length(4, None, None) is None


@pytest.mark.releases
@pytest.mark.parametrize("version", OWN_FALLBACK_RELEASES)
def test_the_swapped_attributes_are_the_ones_the_release_reads(version: str) -> None:
    """verify and the draft extend read N from the worker copies we swap, the graph from ``graph_runner``."""
    worker_source = source_of(version, WORKER_FILE)
    worker, draft = class_node(worker_source, "EAGLEWorkerV2"), class_node(worker_source, "EagleDraftWorker")
    read_by_verify = ast.unparse(method_node(worker, "verify"))
    read_by_extend = ast.unparse(method_node(draft, "_draft_extend_for_decode"))
    assert "self.speculative_num_draft_tokens" in read_by_verify
    assert "self.speculative_num_draft_tokens" in read_by_extend
    for classdef in (worker, draft):
        assigned = {
            ast.unparse(t)
            for n in ast.walk(method_node(classdef, "__init__"))
            if isinstance(n, ast.Assign)
            for t in n.targets
        }
        assert {"self.speculative_num_steps", "self.speculative_num_draft_tokens"} <= assigned
    verify_prep = source_of(version, "srt/speculative/eagle_info_v2.py")
    assert "target_worker.model_runner.graph_runner" in verify_prep
    assert "decode_cuda_graph_runner" not in worker_source + verify_prep


# -- the zero-step policy (0.5.14+) ---------------------------------------------------------------


class TritonAttnBackend(abc.ABC):  # noqa: B024 (as SGLang has it)
    """Named like the backend whose one-token verify runs as a decode by default."""


class TargetRunner:
    def _get_attention_backend(self, init_new_workspace: bool = False) -> TritonAttnBackend:
        return TritonAttnBackend()


class FakeAdaptiveWorker:
    """An EAGLEWorkerV2 of 0.5.14+ as far as its adaptive controller sees it."""

    def __init__(self, **flags: Any) -> None:
        self.server_args = SimpleNamespace(
            speculative_algorithm="EAGLE", speculative_eagle_topk=1, model_path="m", **flags
        )
        self.tp_rank = 0
        self.speculative_num_steps = 3
        self.speculative_num_draft_tokens = 4
        self.adaptive_controller = None
        self.built: list[tuple] = []
        self.applied: list[int] = []
        self._target_worker = SimpleNamespace(model_runner=TargetRunner())
        self.draft_worker: DraftWorker = draft_stack().worker

    def build_adaptive_runtime_state(
        self, speculative_num_steps: int, speculative_num_draft_tokens: int, cuda_graph_bs: Any = None
    ) -> Any:
        self.built.append((speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs))
        graphs = SimpleNamespace(capture_bs=cuda_graph_bs) if cuda_graph_bs else None
        # as upstream does: a fresh target backend from the model runner
        backend = self._target_worker.model_runner._get_attention_backend(init_new_workspace=True)
        return SimpleNamespace(
            speculative_num_steps=speculative_num_steps, target_graph_runner=graphs, target_attn_backend=backend
        )

    def apply_runtime_state(self, state: Any) -> None:
        self.applied.append(state.speculative_num_steps)
        self.speculative_num_steps = state.speculative_num_steps

    def _build_trivial_verify_input(self, batch: Any) -> None:
        raise AssertionError("not called by the policy")

    def forward_batch_generation(self, batch: Any) -> str:
        return "forward"

    def init_cuda_graphs(self, cuda_graph_bs: Any) -> None:  # what the real one does with its controller
        if self.adaptive_controller is not None:
            self.adaptive_controller.register(SimpleNamespace(speculative_num_steps=self.speculative_num_steps))
            self.adaptive_controller.init_states(cuda_graph_bs=cuda_graph_bs)


GRAPH_SIZES = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]


def test_policy_is_not_installed_without_the_flag() -> None:
    worker = FakeAdaptiveWorker()
    assert v2.attach_zero_step_policy(worker) is None and worker.adaptive_controller is None


def test_policy_builds_the_zero_step_state_for_graph_sizes_above_the_switch_on_size(
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = FakeAdaptiveWorker(speculative_disable_batch_size=32, speculative_enable_batch_size=16)
    policy = v2.attach_zero_step_policy(worker)
    assert worker.adaptive_controller is policy and policy.candidate_steps == [0, 3]
    with caplog.at_level(logging.INFO, logger=v2.__name__):
        worker.init_cuda_graphs(GRAPH_SIZES)
    assert worker.built == [(0, 1, [24, 32, 40, 48, 56, 64])]  # the configured state is the worker's own
    assert "dynspec: zero-step state ready" in caplog.text and "[24, 32, 40, 48, 56, 64]" in caplog.text
    worker.init_cuda_graphs(None)  # graphs disabled: eager, nothing built twice
    assert len(worker.built) == 1


class SharingAdaptiveWorker(FakeAdaptiveWorker):
    """A release whose state builder keeps the server's own target backend instead of making one."""

    def build_adaptive_runtime_state(
        self, speculative_num_steps: int, speculative_num_draft_tokens: int, cuda_graph_bs: Any = None
    ) -> Any:
        self.built.append((speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs))
        return SimpleNamespace(speculative_num_steps=speculative_num_steps, target_graph_runner=None)


@pytest.mark.parametrize("worker_class", [FakeAdaptiveWorker, SharingAdaptiveWorker])
def test_the_zero_step_line_names_the_one_token_verify_it_built(
    worker_class: type, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(runtime.ATTENTION_ENV, raising=False)
    worker = worker_class(speculative_disable_batch_size=32)
    policy = v2.attach_zero_step_policy(worker)
    with caplog.at_level(logging.INFO, logger=v2.__name__):
        worker.init_cuda_graphs(GRAPH_SIZES)
    made = worker_class is FakeAdaptiveWorker
    assert len(policy.one_token_backends) == (1 if made else 0)
    said = (
        "; one-token verify through TritonAttnBackend's decode kernel; "
        if made
        else "; one-token verify through the server's own target backend (no one-token backend made); "
    )
    assert said in caplog.text


def test_the_zero_step_state_verifies_through_the_decode_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(runtime.ATTENTION_ENV, raising=False)
    worker = FakeAdaptiveWorker(speculative_disable_batch_size=32)
    policy = v2.attach_zero_step_policy(worker)
    worker.init_cuda_graphs(GRAPH_SIZES)
    backend = policy._states[0].target_attn_backend
    assert runtime.verifies_as_decode(backend) and isinstance(backend, TritonAttnBackend)
    runner = worker._target_worker.model_runner
    assert "_get_attention_backend" not in vars(runner)  # the shadow is gone after the build
    assert not runtime.verifies_as_decode(runner._get_attention_backend())


class Publications:
    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def __call__(self, new_seq_lens: SeqLens) -> None:
        self.seen.append(new_seq_lens.values)


@pytest.mark.parametrize(
    ("setting", "steps", "early"), [("1", 0, True), ("", 0, True), ("0", 0, False), ("1", 3, False)]
)
def test_the_zero_step_policy_publishes_early_unless_turned_off_and_only_at_zero_steps(
    monkeypatch: pytest.MonkeyPatch, setting: str, steps: int, early: bool
) -> None:
    monkeypatch.setenv(v2.EARLY_FENCE_ENV, setting)
    worker = FakeAdaptiveWorker(speculative_disable_batch_size=8)
    policy = v2.attach_zero_step_policy(worker)
    worker.speculative_num_steps = steps
    publish = Publications()
    kept = policy.publish_early(decode_batch(3), publish)
    if early:  # the next lengths now, and the stock publication after the verify skipped
        assert publish.seen == [[101, 102, 103]] and kept is None
    else:
        assert publish.seen == [] and kept is publish
    assert policy.publish_early(decode_batch(3), None) is None  # prefill-less callers pass none


def test_the_early_fence_defaults_to_what_was_proven(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(v2.EARLY_FENCE_ENV, raising=False)
    assert v2.early_fence_enabled() and not v2.early_fence_enabled(proven=False)
    monkeypatch.setenv(v2.EARLY_FENCE_ENV, "1")
    assert v2.early_fence_enabled(proven=False)
    monkeypatch.setenv(v2.EARLY_FENCE_ENV, "0")
    assert not v2.early_fence_enabled()


@pytest.mark.parametrize(("setting", "early"), [("1", True), ("", False), ("0", False)])
def test_the_0513_fallback_publishes_early_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, fake_torch: list[str], setting: str, early: bool
) -> None:
    """0.5.13's callback path has not run on a GPU with the early publication: opt-in."""
    monkeypatch.setenv(v2.EARLY_FENCE_ENV, setting)
    fallback = fallback_for(fake_worker(), disable_above=2)
    batch = decode_batch(3)
    assert fallback.should_fall_back(batch)
    publish = Publications()
    kept = fallback.publish_early(batch, publish)
    if early:  # the next lengths now; the re-run's stock publication after the verify is skipped
        assert publish.seen == [[101, 102, 103]] and kept is None
    else:
        assert publish.seen == [] and kept is publish
    assert fallback.publish_early(batch, None) is None  # releases without the callback
    assert fake_torch == []  # no event of its own: the callback records the scheduler's


def test_policy_switches_with_hysteresis_and_dwell() -> None:
    worker = FakeAdaptiveWorker(
        speculative_disable_batch_size=32, speculative_enable_batch_size=16, speculative_switch_min_steps=2
    )
    policy = v2.attach_zero_step_policy(worker)
    worker.init_cuda_graphs(GRAPH_SIZES)
    steps, kinds = [], []
    for batch_size in [8, 33, 20, 17, 16, 16, 40, 0, 40, 40]:
        policy.activate_step_by_batch(batch_size)
        steps.append(worker.speculative_num_steps)
        kinds.append(
            "."
            if batch_size == 0
            else {runtime.SPECULATE: "S", runtime.FALL_BACK: "-", runtime.RESUME: "r"}[policy._step]
        )
    # off above 32; 20 and 17 are inside the band; 16 switches back on, and that iteration (the
    # resume) still runs at zero steps with the full draft extend; 40 only after 2 iterations;
    # an idle batch (0) changes nothing and is not counted
    assert "".join(kinds) == "S---rS-.--"
    assert steps == [3, 0, 0, 0, 0, 3, 0, 0, 0, 0]
    assert worker.applied == [0, 3, 0]
    assert (policy.controller.spec_iterations, policy.controller.fallback_iterations) == (2, 7)
    policy.on_verify_complete([2, 2, 2], batch_size=3)  # acceptance does not move it
    assert worker.applied == [0, 3, 0]


def test_the_own_fallback_refuses_auto() -> None:
    with pytest.raises(
        ValueError,
        match=r"^--speculative-disable-batch-size auto needs SGLang 0.5.14 or later .*on this release, give a number$",
    ):
        v2.attach_fallback(worker_with(speculative_disable_batch_size="auto"))


def test_a_fixed_n_has_no_driver_and_ignores_the_verify_feed() -> None:
    worker = FakeAdaptiveWorker(speculative_disable_batch_size="32")  # as typed on the command line
    policy = v2.attach_zero_step_policy(worker)
    worker.init_cuda_graphs(GRAPH_SIZES)
    assert policy.driver is None and policy.controller.disable_above == 32
    policy.activate_step_by_batch(4)
    policy.on_verify_complete([2, 2, 2, 2], batch_size=4)
    assert not policy._unverified


def test_auto_builds_its_driver_once_the_graph_sizes_are_known(caplog: pytest.LogCaptureFixture) -> None:
    """Floor 1 (no enable size), ceiling one below the largest graph (64) and the running limit (40):
    39; the zero-step state is captured for every size above the floor, since the switch moves."""
    worker = FakeAdaptiveWorker(speculative_disable_batch_size="auto", max_running_requests=40)
    policy = v2.attach_zero_step_policy(worker)
    with caplog.at_level(logging.INFO, logger=v2.__name__):
        worker.init_cuda_graphs(GRAPH_SIZES)
    assert worker.built == [(0, 1, GRAPH_SIZES[1:])]
    assert (policy.driver.auto.floor, policy.driver.auto.ceiling) == (1, 39)
    assert "auto: the switch point between 1 and 39 requests" in caplog.text
    assert (policy.controller.disable_above, policy.controller.enable_at_or_below) == (39, 39)  # speculate until timed


def test_auto_takes_the_acceptance_from_the_iterations_that_speculated() -> None:
    """The scheduler hands each verify back one iteration late: a zero-step verify's zeros are
    not acceptance, and a result out of step with the iterations starts the matching again."""
    worker = FakeAdaptiveWorker(
        speculative_disable_batch_size="auto", speculative_enable_batch_size=2, speculative_switch_min_steps=1
    )
    policy = v2.attach_zero_step_policy(worker)
    worker.init_cuda_graphs(GRAPH_SIZES)
    auto = policy.driver.auto
    auto.thresholds = dynspec_auto.Thresholds(4, 4)
    policy.driver._left = 10**6  # no new decision during the test
    policy.driver._apply(auto.thresholds)
    policy.activate_step_by_batch(3)  # speculates
    policy.activate_step_by_batch(8)  # falls back
    policy.on_verify_complete([2, 2, 2], batch_size=3)
    assert auto.acceptance == 3.0
    policy.on_verify_complete([0] * 8, batch_size=8)  # the zero-step verify: not acceptance
    assert auto.acceptance == 3.0
    policy.activate_step_by_batch(3)
    policy.on_verify_complete([1] * 5, batch_size=5)  # out of step: dropped, and the queue with it
    assert auto.acceptance == 3.0 and not policy._unverified
    policy.activate_step_by_batch(3)
    policy.on_verify_complete([0, 0, 0], batch_size=3)
    assert auto.acceptance == pytest.approx(2.8)


def test_auto_times_only_decodes_and_shares_rank_0s_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    broadcasts: list[Any] = []

    class Group:
        def broadcast_object(self, obj: Any, src: int = 0) -> Any:
            broadcasts.append((obj, src))
            return obj

    distributed = types.ModuleType("sglang.srt.distributed")
    distributed.get_tp_group = Group  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sglang.srt.distributed", distributed)
    worker = FakeAdaptiveWorker(speculative_disable_batch_size="auto", tp_size=2)
    policy = v2.attach_zero_step_policy(worker)
    worker.init_cuda_graphs(GRAPH_SIZES)
    policy.activate_step_by_batch(4)
    assert broadcasts and broadcasts[0][1] == 0 and broadcasts[0][0][0] == dynspec_auto.Thresholds(63, 63)
    policy.driver.auto._previous.append((4, True, 0.0))
    prefill = SimpleNamespace(forward_mode=SimpleNamespace(is_decode=lambda: False))
    assert worker.forward_batch_generation(prefill) == "forward"
    assert not policy.driver.auto._previous  # the prefill's time is not a decode step's


def test_policy_without_states_keeps_speculating_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    worker = FakeAdaptiveWorker(speculative_disable_batch_size=8)
    policy = v2.attach_zero_step_policy(worker)
    with caplog.at_level(logging.ERROR, logger=v2.__name__):
        policy.activate_step_by_batch(9)
        policy.activate_step_by_batch(9)
    assert worker.speculative_num_steps == 3 and worker.applied == []
    assert caplog.text.count("init_states never ran") == 1


def test_policy_refuses_upstream_adaptive_and_workers_without_the_zero_step_mode() -> None:
    with pytest.raises(ValueError, match="does not support --speculative-adaptive"):
        v2.attach_zero_step_policy(FakeAdaptiveWorker(speculative_disable_batch_size=8, speculative_adaptive=True))
    old = SimpleNamespace(server_args=FakeAdaptiveWorker(speculative_disable_batch_size=8).server_args, tp_rank=0)
    with pytest.raises(
        RuntimeError, match="lacks build_adaptive_runtime_state, apply_runtime_state, _build_trivial_verify_input"
    ):
        v2.attach_zero_step_policy(old)


def controller_calls(version: str) -> list[tuple[str, int, list[str]]]:
    """``(method, positional count, keywords)`` of every call EAGLEWorkerV2 makes on its adaptive controller."""
    worker = class_node(source_of(version, WORKER_FILE), "EAGLEWorkerV2")
    found = []
    for node in ast.walk(worker):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and ast.unparse(node.func.value) == "self.adaptive_controller"
        ):
            found.append((node.func.attr, len(node.args), [k.arg for k in node.keywords if k.arg]))
    return found


@pytest.mark.releases
@pytest.mark.parametrize("version", ZERO_STEP_RELEASES)
def test_the_policy_answers_every_call_the_release_makes_on_its_controller(version: str) -> None:
    calls = controller_calls(version)
    assert {name for name, _, _ in calls} >= {"register", "init_states", "activate_step_by_batch", "on_verify_complete"}
    for name, positional, keywords in calls:
        signature = inspect.signature(getattr(v2.ZeroStepPolicy, name))
        signature.bind(None, *range(positional), **dict.fromkeys(keywords))  # raises TypeError on a mismatch
    worker = class_node(source_of(version, WORKER_FILE), "EAGLEWorkerV2")
    build = method_node(worker, "build_adaptive_runtime_state")
    assert [a.arg for a in build.args.args[1:4]] == [
        "speculative_num_steps",
        "speculative_num_draft_tokens",
        "cuda_graph_bs",
    ]
    state = class_node(source_of(version, "srt/speculative/adaptive_runtime_state.py"), "SpecRuntimeState")
    assert {"speculative_num_steps", "target_graph_runner"} <= {
        s.target.id for s in state.body if isinstance(s, ast.AnnAssign)
    }


# -- the shipped file ----------------------------------------------------------------------------


def test_the_new_file_is_the_module_and_is_inert_without_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    new, steps, _ = patch_file([SpeculativeDynspecV2], SpeculativeDynspecV2.TARGET, None, "0.5.8")
    assert new == SpeculativeDynspecV2.marker() + "\n" + Path(v2.__file__).read_text(encoding="utf-8")
    assert steps[0].outcome.value == "patched"
    assert not SpeculativeDynspecV2.applies_to("0.5.3")
    shipped = types.ModuleType("sglang.srt.speculative.dynspec_v2")
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.dynspec_settings", dynspec_settings)  # shipped beside it
    monkeypatch.setitem(sys.modules, "torch", None)  # importing torch would fail
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.dynspec_runtime", None)  # so would the runtime module
    exec(compile(new, "dynspec_v2.py", "exec"), shipped.__dict__)
    assert shipped.attach_fallback(worker_with()) is None
    assert shipped.attach_zero_step_policy(FakeAdaptiveWorker()) is None
    again, steps, _ = patch_file([SpeculativeDynspecV2], SpeculativeDynspecV2.TARGET, new, "0.5.8")
    assert again == new and steps[0].outcome.value == "already applied"


def test_the_lean_step_setting_is_read_and_named_on_the_zero_step_path(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0.5.14+ has no own fallback to make lean: asked for, it says so; a bad value refuses to start, as elsewhere."""
    monkeypatch.setenv(v2.LEAN_STEP_ENV, "1")
    with caplog.at_level(logging.INFO, logger=v2.__name__):
        v2.attach_zero_step_policy(FakeAdaptiveWorker(speculative_disable_batch_size=32))
    assert "dynspec: DYNSPEC_LEAN_STEP and DYNSPEC_LEAN_PREFILL apply to 0.5.12's own fallback only" in caplog.text
    monkeypatch.setenv(v2.LEAN_STEP_ENV, "2")
    with pytest.raises(ValueError, match="DYNSPEC_LEAN_STEP must be 0 or 1, not '2'"):
        v2.attach_zero_step_policy(FakeAdaptiveWorker(speculative_disable_batch_size=32))
    monkeypatch.delenv(v2.LEAN_STEP_ENV)
    monkeypatch.setenv(v2.LEAN_PREFILL_ENV, "yes")
    with pytest.raises(ValueError, match="DYNSPEC_LEAN_PREFILL must be 0 or 1, not 'yes'"):
        v2.attach_zero_step_policy(FakeAdaptiveWorker(speculative_disable_batch_size=32))
    monkeypatch.delenv(v2.LEAN_PREFILL_ENV)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=v2.__name__):
        v2.attach_zero_step_policy(FakeAdaptiveWorker(speculative_disable_batch_size=32))
    assert "DYNSPEC_LEAN_STEP" not in caplog.text  # the control: unset, nothing said
