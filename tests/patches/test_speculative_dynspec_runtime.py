"""The runtime module dynspec ships into SGLang: controller, metrics, refusals and the fallback plumbing.

Everything runs on the CPU with stand-ins for SGLang's objects; what only a GPU can show (the
one-token graphs, token-identical outputs) is in the proof runs. The field names of the trivial
verify input are checked against every real release's ``EagleVerifyInput``.
"""

from __future__ import annotations

import abc
import ast
import dataclasses
import enum
import inspect
import logging
import random
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
from patches.speculative_dynspec_runtime import SpeculativeDynspecRuntime
from tests.conftest import RELEASES
from tests.patches.fake_draft import draft_stack
from tests.patches.fake_sampler import SixParameterSampler
from tests.patches.patched_package import install_patched_package
from tests.patches.test_dynspec_settings import supported_server_args
from tests.patches.test_eagle_worker_dynspec_fallback import V1_RELEASES
from tests.patches.test_eagle_worker_v2_dynspec_fallback import OWN_FALLBACK_RELEASES


@pytest.fixture(autouse=True)
def patched_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """``attach_dynspec`` imports ``sglang.srt.speculative.dynspec_auto``: a patched tree's package."""
    install_patched_package(monkeypatch)


SwitchController = runtime.SwitchController


@pytest.fixture(autouse=True)
def no_dynspec_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime reads DYNSPEC_* at start-up; a shell that has them set must not change these tests."""
    for name in (runtime.DRAFT_KV_ENV, runtime.RECORD_ENV, runtime.ATTENTION_ENV):
        monkeypatch.delenv(name, raising=False)


def decisions(controller: SwitchController, sizes: list[int]) -> str:
    return "".join(
        {runtime.SPECULATE: "S", runtime.FALL_BACK: "-", runtime.RESUME: "r"}[controller.step(bs)] for bs in sizes
    )


# -- the controller ------------------------------------------------------------------------------


def test_switches_off_above_and_on_at_or_below_the_thresholds() -> None:
    controller = SwitchController(32, 16, min_steps=1, log=False)
    assert decisions(controller, [1, 32, 33, 33, 20, 17, 16, 20, 32, 33]) == "SS----rSS-"


def test_enable_size_defaults_to_the_disable_size() -> None:
    controller = SwitchController(8, min_steps=1, log=False)
    assert controller.enable_at_or_below == 8
    assert decisions(controller, [9, 8, 9, 8]) == "-r-r"


def test_a_switch_waits_min_steps_iterations_after_the_previous_one() -> None:
    controller = SwitchController(8, 8, min_steps=4, log=False)
    # off at once (no switch yet), then three more iterations off although the batch is small
    assert decisions(controller, [9, 1, 1, 1, 1, 9, 9, 9, 9]) == "----rSSS-"


def test_an_admission_of_more_than_the_threshold_switches_off_before_its_prefill() -> None:
    controller = SwitchController(8, 4, min_steps=2, log=False)
    assert not controller.switch_off_at_admission(8)  # 8 alone do not make the batch larger than 8
    assert controller.speculating and controller.switches == 0
    assert controller.switch_off_at_admission(9) and not controller.speculating
    # not an iteration: the dwell counts from the switch, and the next iterations fall back
    assert (controller.spec_iterations, controller.fallback_iterations) == (0, 0)
    assert decisions(controller, [9, 2, 2]) == "--r"
    assert controller.switches == 2


def test_an_admission_waits_for_the_dwell_and_says_when_already_off() -> None:
    controller = SwitchController(8, 4, min_steps=3, log=False)
    assert decisions(controller, [9, 9, 9, 2]) == "---r"  # back on at the 4th iteration
    assert not controller.switch_off_at_admission(100)  # 1 iteration since the switch on: too soon
    assert decisions(controller, [2, 2]) == "SS"
    assert controller.switch_off_at_admission(100)  # 3 since the switch
    assert controller.switch_off_at_admission(1)  # off already, whatever the admission
    assert decisions(controller, [9]) == "-"


def test_an_admission_switch_logs_like_any_switch(caplog: pytest.LogCaptureFixture) -> None:
    controller = SwitchController(32, min_steps=1)
    with caplog.at_level(logging.INFO, logger=runtime.__name__):
        controller.switch_off_at_admission(64)
    assert [r.getMessage() for r in caplog.records] == [
        "dynspec: speculation OFF at batch size 64 (off above 32, on at or below 32)"
    ]


def test_counters() -> None:
    controller = SwitchController(8, 4, min_steps=2, log=False)
    assert decisions(controller, [9, 9, 6, 4, 4, 9, 9]) == "---rS--"
    # the resume iteration does not speculate, so it counts as a fallback iteration
    assert (controller.spec_iterations, controller.fallback_iterations, controller.switches) == (1, 6, 3)


def test_each_switch_logs_exactly_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    controller = SwitchController(32, min_steps=1)
    with caplog.at_level(logging.INFO, logger=runtime.__name__):
        decisions(controller, [6, 40, 40, 6, 6])
    assert [r.getMessage() for r in caplog.records] == [
        "dynspec: speculation OFF at batch size 40 (off above 32, on at or below 32)",
        "dynspec: speculation ON at batch size 6 (off above 32, on at or below 32)",
    ]
    assert {r.levelno for r in caplog.records} == {logging.INFO}


def test_a_rank_that_does_not_log_stays_silent(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=runtime.__name__):
        decisions(SwitchController(8, log=False), [9, 1] * 20)
    assert caplog.records == []


def test_identical_batch_sizes_give_identical_decisions(caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(7)
    sizes = [rng.randint(1, 64) for _ in range(2000)]
    runs = []
    for _ in range(2):  # e.g. two tensor-parallel ranks
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=runtime.__name__):
            runs.append(
                (decisions(SwitchController(32, 16, min_steps=3), sizes), [r.getMessage() for r in caplog.records])
            )
    assert runs[0] == runs[1]
    assert "S" in runs[0][0] and "-" in runs[0][0] and len(runs[0][1]) > 10


def test_enable_size_above_disable_size_is_refused() -> None:
    with pytest.raises(
        ValueError,
        match=r"--speculative-enable-batch-size \(9\) must not exceed --speculative-disable-batch-size \(8\)",
    ):
        SwitchController(8, 9)


# -- metrics -------------------------------------------------------------------------------------


@pytest.fixture
def fake_prometheus(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    created: dict[str, Any] = {}

    class Counter:
        def __init__(self, name: str, doc: str, labelnames: list[str]) -> None:
            assert name not in created, "prometheus refuses a second counter of the same name"
            self.name, self.labelnames, self.values = name, labelnames, {}
            created[name] = self

        def labels(self, **labels: str) -> Any:
            key = tuple(sorted(labels.items()))
            counter = self

            class Child:
                def inc(self) -> None:
                    counter.values[key] = counter.values.get(key, 0) + 1

            return Child()

    class Gauge(Counter):
        def __init__(self, name: str, doc: str, labelnames: list[str], multiprocess_mode: str) -> None:
            assert multiprocess_mode == "mostrecent"  # as SGLang's gauges, under PROMETHEUS_MULTIPROC_DIR
            super().__init__(name, doc, labelnames)

        def labels(self, **labels: str) -> Any:
            key = tuple(sorted(labels.items()))
            gauge = self

            class Child:
                def set(self, value: float) -> None:
                    gauge.values[key] = value

            return Child()

    monkeypatch.setitem(sys.modules, "prometheus_client", types.SimpleNamespace(Counter=Counter, Gauge=Gauge))
    monkeypatch.setattr(runtime.DynspecMetrics, "_counters", None)
    monkeypatch.setattr(runtime.DynspecMetrics, "_gauges", None)
    return created


def test_metrics_count_iterations_and_switches(fake_prometheus: dict[str, Any]) -> None:
    controller = SwitchController(8, min_steps=1, log=False, metrics=runtime.DynspecMetrics("m"))
    assert decisions(controller, [1, 9, 9, 1]) == "S--r"
    values = {name: sum(c.values.values()) for name, c in fake_prometheus.items()}
    assert values == {
        "sglang:dynspec_spec_iterations_total": 1,
        "sglang:dynspec_fallback_iterations_total": 3,
        "sglang:dynspec_switches_total": 2,
    }
    assert all(c.labelnames == ["model_name"] for c in fake_prometheus.values())


def test_auto_exports_its_decisions_and_a_fixed_n_no_gauges(fake_prometheus: dict[str, Any]) -> None:
    fixed = SwitchController(8, min_steps=1, log=False, metrics=runtime.DynspecMetrics("m"))
    decisions(fixed, [1, 9])
    assert not any(name.startswith("sglang:dynspec_disable") for name in fake_prometheus)  # the control
    controller = SwitchController(1, min_steps=1, log=False, metrics=runtime.DynspecMetrics("m"))
    auto = dynspec_auto.AutoThreshold(1, 63)
    driver = dynspec_auto.AutoDriver(controller, auto, clock=lambda: 0.0, log=False)
    auto.verified([2, 2])
    driver.step(4)
    gauges = {name: c.values for name, c in fake_prometheus.items() if not name.endswith("_total")}
    assert gauges == {
        "sglang:dynspec_disable_above": {(("model_name", "m"),): 63},
        "sglang:dynspec_enable_at_or_below": {(("model_name", "m"),): 63},
        "sglang:dynspec_acceptance": {(("model_name", "m"),): 3.0},
    }


def test_metrics_are_created_once_per_process(fake_prometheus: dict[str, Any]) -> None:
    for _ in range(2):
        SwitchController(8, log=False, metrics=runtime.DynspecMetrics("m")).step(1)
    assert len(fake_prometheus) == 3


def test_metrics_without_prometheus_client_are_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import raises ImportError
    monkeypatch.setattr(runtime.DynspecMetrics, "_counters", None)
    controller = SwitchController(8, min_steps=1, log=False, metrics=runtime.DynspecMetrics("m"))
    assert decisions(controller, [1, 9]) == "S-"


def test_capture_sizes_keep_only_batches_above_the_switch_on_size() -> None:
    assert runtime.fallback_capture_sizes([1, 2, 4, 8, 16, 32, 40, 48, 40], 32) == [40, 48]
    assert runtime.fallback_capture_sizes([1, 8], 32) == []
    assert runtime.fallback_capture_sizes(None, 32) is None


# -- the one-token target state ------------------------------------------------------------------


class FakeModelRunner:
    """The ModelRunner attributes the fallback touches, recording what builders saw."""

    def __init__(
        self, graph_attr: str = "graph_runner", graph: Any = "live graph", new_workspace_arg: bool = True
    ) -> None:
        self.server_args = SimpleNamespace(
            speculative_num_steps=3, speculative_num_draft_tokens=4, cuda_graph_bs=[1, 8, 16, 32, 64]
        )
        self.attn_backend = "live backend"
        self.init_new_workspace = False
        setattr(self, graph_attr, graph)
        self.seen: list[tuple] = []
        if not new_workspace_arg:
            self._get_attention_backend = self._get_attention_backend_old  # type: ignore[method-assign]

    def _get_attention_backend(self, init_new_workspace: bool = False) -> str:
        self.init_new_workspace = init_new_workspace
        args = self.server_args
        self.seen.append(("backend", init_new_workspace, args.speculative_num_steps, args.speculative_num_draft_tokens))
        return "one-token backend"

    def _get_attention_backend_old(self) -> str:
        self.seen.append(("backend", None))
        return "one-token backend"


class NewStyleRunner:  # 0.5.11+: backend and N are arguments
    def __init__(
        self,
        model_runner: Any,
        *,
        attn_backend: Any = None,
        speculative_num_steps: Any = None,
        speculative_num_draft_tokens: Any = None,
    ) -> None:
        self.kwargs = (attn_backend, speculative_num_steps, speculative_num_draft_tokens)
        self.capture_bs = list(model_runner.server_args.cuda_graph_bs)
        model_runner.server_args.cuda_graph_bs.append(999)  # SGLang appends to the list in place


class OldStyleRunner:  # up to 0.5.10: reads the backend and N off the runner
    def __init__(self, model_runner: Any) -> None:
        args = model_runner.server_args
        self.read = (model_runner.attn_backend, args.speculative_num_draft_tokens, list(args.cuda_graph_bs))
        self.capture_bs = list(args.cuda_graph_bs)


def test_one_token_state_is_built_with_n_1_and_everything_is_restored() -> None:
    runner = FakeModelRunner(graph=NewStyleRunner.__new__(NewStyleRunner))
    target = runtime.SingleTokenTarget.build(runner, enable_at_or_below=8)
    assert runner.seen == [("backend", True, 0, 1)]
    assert target.attn_backend == "one-token backend"
    assert target.graph_runner.kwargs == ("one-token backend", 0, 1)
    assert target.capture_bs == [16, 32, 64]
    assert (runner.attn_backend, runner.init_new_workspace, runner.server_args) == (
        "live backend",
        False,
        SimpleNamespace(speculative_num_steps=3, speculative_num_draft_tokens=4, cuda_graph_bs=[1, 8, 16, 32, 64]),
    )


def test_old_runners_read_the_backend_and_n_from_the_model_runner() -> None:
    runner = FakeModelRunner(
        graph_attr="cuda_graph_runner", graph=OldStyleRunner.__new__(OldStyleRunner), new_workspace_arg=False
    )
    target = runtime.SingleTokenTarget.build(runner, enable_at_or_below=16)
    assert target.graph_attr == "cuda_graph_runner"
    assert target.graph_runner.read == ("one-token backend", 1, [32, 64])
    assert runner.seen == [("backend", None)]
    assert runner.attn_backend == "live backend"


@pytest.mark.parametrize("enable_at_or_below", [8, 64], ids=["cuda-graph-disabled", "no-size-above-switch-on"])
def test_no_graph_runs_eager(enable_at_or_below: int) -> None:
    live = None if enable_at_or_below == 8 else NewStyleRunner.__new__(NewStyleRunner)
    target = runtime.SingleTokenTarget.build(FakeModelRunner(graph=live), enable_at_or_below)
    assert target.graph_runner is None and target.capture_bs == []


def test_build_failure_restores_the_model_runner() -> None:
    class Failing:
        def __init__(self, model_runner: Any) -> None:
            raise RuntimeError("capture failed")

    runner = FakeModelRunner(graph=Failing.__new__(Failing))
    with pytest.raises(RuntimeError, match="capture failed"):
        runtime.SingleTokenTarget.build(runner, 8)
    assert runner.attn_backend == "live backend"
    assert runner.server_args.speculative_num_draft_tokens == 4
    assert runner.server_args.cuda_graph_bs == [1, 8, 16, 32, 64]


# -- the fallback plumbing -----------------------------------------------------------------------


class FakeBatch:
    def __init__(self, size: int, idle: bool = False) -> None:
        self.reqs = [object()] * size
        self.forward_mode = SimpleNamespace(is_idle=lambda: idle)

    def batch_size(self) -> int:
        return len(self.reqs)


def fallback_for(runner: FakeModelRunner, disable_above: int = 8) -> runtime.DynspecFallback:
    target = runtime.SingleTokenTarget(runner, "one-token backend", "one-token graph", "graph_runner", [16])
    draft_kv = runtime.DraftKV(runtime.DRAFT_KV_ONLY, draft_stack().runner, log=False)
    return runtime.DynspecFallback(SwitchController(disable_above, min_steps=1, log=False), target, draft_kv)


def test_fall_back_reenters_the_entry_point_with_the_one_token_state() -> None:
    runner = FakeModelRunner()
    fallback = fallback_for(runner)
    worker = SimpleNamespace(speculative_num_steps=3, speculative_num_draft_tokens=4)
    batch = FakeBatch(9)
    seen = []

    def entry(b: Any) -> str:
        assert not fallback.should_fall_back(b), "the re-entered decode branch must not decide again"
        seen.append(
            (
                fallback.in_fallback,
                worker.speculative_num_steps,
                worker.speculative_num_draft_tokens,
                runner.attn_backend,
                runner.graph_runner,
            )
        )
        return "result"

    assert fallback.should_fall_back(batch)
    assert fallback.fall_back(worker, batch, entry) == "result"
    assert seen == [(True, 0, 1, "one-token backend", "one-token graph")]
    assert (fallback.in_fallback, worker.speculative_num_steps, worker.speculative_num_draft_tokens) == (False, 3, 4)
    assert (runner.attn_backend, runner.graph_runner) == ("live backend", "live graph")
    assert fallback.controller.fallback_iterations == 1, "the re-entry is not counted"


def test_fall_back_restores_the_worker_when_the_iteration_fails() -> None:
    runner = FakeModelRunner()
    fallback = fallback_for(runner)
    worker = SimpleNamespace(speculative_num_steps=3, speculative_num_draft_tokens=4)

    def entry(b: Any) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fallback.fall_back(worker, FakeBatch(9), entry)
    assert (fallback.in_fallback, worker.speculative_num_steps, runner.attn_backend, runner.graph_runner) == (
        False,
        3,
        "live backend",
        "live graph",
    )


def test_idle_batches_always_take_the_normal_path() -> None:
    fallback = fallback_for(FakeModelRunner(), disable_above=1)
    assert not fallback.should_fall_back(FakeBatch(9, idle=True))
    assert fallback.controller.spec_iterations + fallback.controller.fallback_iterations == 0


def worker_with(**flags: Any) -> SimpleNamespace:
    args = supported_server_args(model_path="m", served_model_name="m", **flags)
    return SimpleNamespace(
        server_args=args,
        tp_rank=0,
        target_worker=SimpleNamespace(model_runner=FakeModelRunner()),
        draft_model_runner=draft_stack().runner,
    )


def test_attach_is_a_no_op_without_the_flag() -> None:
    assert runtime.attach_dynspec(worker_with()) is None
    assert runtime.attach_dynspec(SimpleNamespace(server_args=SimpleNamespace())) is None  # flags patch absent


def test_attach_refuses_unsupported_settings() -> None:
    with pytest.raises(ValueError, match="does not support --enable-dp-attention"):
        runtime.attach_dynspec(worker_with(speculative_disable_batch_size=8, enable_dp_attention=True))


def test_attach_refuses_auto_and_reads_a_command_line_number() -> None:
    """v1 has no verify feed for auto: refused at start-up, naming what to give instead. A number
    arrives as the text typed (the flag is a string so that it can say auto) and is read as one."""
    with pytest.raises(
        ValueError, match=r"^--speculative-disable-batch-size auto needs SGLang 0.5.14 or later .*give a number$"
    ):
        runtime.attach_dynspec(worker_with(speculative_disable_batch_size="auto"))
    fallback = runtime.attach_dynspec(worker_with(speculative_disable_batch_size="32"))
    assert fallback is not None and fallback.controller.disable_above == 32 == fallback.controller.enable_at_or_below


def test_attach_builds_the_controller_from_the_flags(caplog: pytest.LogCaptureFixture) -> None:
    worker = worker_with(
        speculative_disable_batch_size=32, speculative_enable_batch_size=16, speculative_switch_min_steps=4
    )
    with caplog.at_level(logging.INFO, logger=runtime.__name__):
        fallback = runtime.attach_dynspec(worker)
    assert fallback is not None
    controller = fallback.controller
    assert (controller.disable_above, controller.enable_at_or_below, controller.min_steps, controller.log) == (
        32,
        16,
        4,
        True,
    )
    assert controller.metrics is None
    assert fallback.target.capture_bs == [32, 64]
    assert "dynspec: fallback ready" in caplog.text
    # DYNSPEC_DRAFT_KV unset: auto, which on v1 (exact_kv not yet run there) is the full draft extend,
    # said so at start-up; nothing recorded unless asked
    assert fallback.draft_kv.mode == runtime.DRAFT_KV_FULL != runtime.DRAFT_KV_DEFAULT and fallback.recorder is None
    assert fallback.draft_kv.graph is None
    assert "full draft extend in every fallback iteration" in caplog.text


# -- the trivial verify input against every release ----------------------------------------------


def verify_input_fields(version: str) -> list[tuple[str, bool]]:
    """``(name, has_default)`` of the release's ``EagleVerifyInput`` dataclass fields."""
    members = ["srt/speculative/eagle_info.py", "srt/speculative/eagle_utils.py"]
    tree = unpacked(version, members)
    for member in members:
        path = tree / "sglang" / member
        if not path.exists():
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name == "EagleVerifyInput":
                return [
                    (s.target.id, s.value is not None)
                    for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                ]
    raise AssertionError(f"no EagleVerifyInput in SGLang {version}")


# The releases of each fallback that builds the trivial tree, with the lengths it passes: v1's, v2's own.
TRIVIAL_TREE_CALLERS = [
    *(pytest.param(version, 10, "cpu", id=f"v1-{version}") for version in V1_RELEASES),
    *(pytest.param(version, None, None, id=f"v2-{version}") for version in OWN_FALLBACK_RELEASES),
]


@pytest.mark.releases
@pytest.mark.parametrize(("version", "seq_lens_sum", "seq_lens_cpu"), TRIVIAL_TREE_CALLERS)
def test_trivial_verify_input_fits_the_releases_eagle_verify_input(
    version: str, seq_lens_sum: int | None, seq_lens_cpu: str | None
) -> None:
    fields = verify_input_fields(version)
    verify_input = dataclasses.make_dataclass(
        "EagleVerifyInput", [(n, Any, dataclasses.field(default=None)) if d else (n, Any) for n, d in fields]
    )
    kwargs = runtime.trivial_tree_fields(
        runtime.tree_field_prefix(verify_input),
        draft_token="bonus",
        custom_mask="mask",
        positions="positions",
        root_index="index",
        no_child="none",
        capture_hidden_mode="FULL",
        seq_lens_sum=seq_lens_sum,
        seq_lens_cpu=seq_lens_cpu,
    )
    built = verify_input(**kwargs)  # every required field is given, no unknown one
    assert (built.spec_steps, built.topk, built.draft_token_num) == (0, 1, 1)
    assert {n for n, _ in fields} >= set(kwargs)


# -- one-token verify through the decode kernel -----------------------------------------------


class Mode(enum.Enum):
    """ForwardMode as far as the backends' dispatch goes."""

    DECODE = 1
    TARGET_VERIFY = 2
    DRAFT_EXTEND = 3

    def is_target_verify(self) -> bool:
        return self is Mode.TARGET_VERIFY


class Lens:
    """The tensor operations the decode view uses, on a list (views share storage, like torch)."""

    dtype, device = "int32", "cuda:0"

    def __init__(self, values: list[int], storage: list[int] | None = None, start: int = 0) -> None:
        self.storage = list(values) if storage is None else storage
        self.start, self.n = start, len(values)

    @property
    def values(self) -> list[int]:
        return self.storage[self.start : self.start + self.n]

    @property
    def shape(self) -> tuple[int]:
        return (self.n,)

    def __add__(self, other: int) -> Lens:
        return Lens([v + other for v in self.values])

    def __getitem__(self, key: slice) -> Lens:
        values = self.values[key]
        return Lens(values, self.storage, self.start + (key.start or 0))

    def new_empty(self, shape: tuple[int]) -> Lens:
        return Lens([0] * shape[0])

    def copy_(self, other: Lens) -> None:
        self.storage[self.start : self.start + self.n] = other.values


@pytest.fixture
def lens_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch whose ``add(lens, n, out=...)`` writes into ``out``'s storage: the persistent ``seq_lens + 1``."""

    def add(lens: Lens, other: int, *, out: Lens) -> Lens:
        out.copy_(lens + other)
        return out

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(add=add))


class AttentionBackend(abc.ABC):  # noqa: B024 (as SGLang has it)
    """Like SGLang's: an ABC, whose empty __slots__ make CPython strict about __class__ assignment."""


class LegacyBackend(AttentionBackend):
    """The metadata API up to 0.5.12: capture and replay methods, and an eager one."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.calls.append(("graph state", max_bs, max_num_tokens))

    def init_forward_metadata(self, forward_batch: Any) -> None:
        fb = forward_batch
        self.calls.append(
            ("eager", fb.forward_mode, fb.seq_lens.values, fb.seq_lens_sum, fb.seq_lens_cpu, fb.spec_info)
        )

    def init_forward_metadata_capture_cuda_graph(
        self,
        bs: int,
        num_tokens: int,
        req_pool_indices: Any,
        seq_lens: Any,
        encoder_lens: Any,
        forward_mode: Any,
        spec_info: Any,
    ) -> None:
        self.calls.append(("capture", bs, forward_mode, seq_lens, spec_info))

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        req_pool_indices: Any,
        seq_lens: Any,
        seq_lens_sum: int,
        encoder_lens: Any,
        forward_mode: Any,
        spec_info: Any,
        seq_lens_cpu: Any = None,
    ) -> None:
        self.calls.append(("replay", bs, forward_mode, seq_lens, seq_lens_sum, seq_lens_cpu, spec_info))

    def forward(
        self, q: Any, k: Any, v: Any, layer: Any, forward_batch: Any, save_kv_cache: bool = True, **kwargs: Any
    ) -> tuple:
        if forward_batch.forward_mode is Mode.DECODE:
            return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)
        return ("extend kernel", save_kv_cache, kwargs)

    def forward_decode(
        self, q: Any, k: Any, v: Any, layer: Any, forward_batch: Any, save_kv_cache: bool = True, **kwargs: Any
    ) -> tuple:
        return ("decode kernel", save_kv_cache, kwargs)


class TritonAttnBackend(LegacyBackend):
    """Named like the backend the one-token decode path is proven on."""


class FlashInferAttnBackend(LegacyBackend):
    """Named like the backend whose decode kernel serves it since r30."""


class FlashAttentionBackend(LegacyBackend):
    """Named like FA3's backend, whose decode kernel has not served a one-token verify on a GPU."""


class Fp4FlashInferAttnBackend(FlashInferAttnBackend):
    """FlashInfer with an FP4 KV cache: its decode kernel reads a workspace sized by the batch's own lengths."""

    decode_uses_dequant_workspace = True


Fp4FlashInferAttnBackend.__name__ = "FlashInferAttnBackend"  # the class SGLang has, with the flag set


class OutGraphBackend(LegacyBackend):
    """The API from 0.5.13: eager = out_graph + in_graph (the ABC's default), capture and replay through out_graph."""

    def init_forward_metadata(self, forward_batch: Any) -> None:
        self.init_forward_metadata_out_graph(forward_batch)
        self.init_forward_metadata_in_graph(forward_batch)

    def init_forward_metadata_out_graph(self, forward_batch: Any, in_capture: bool = False) -> None:
        self.calls.append(
            (
                "out_graph",
                in_capture,
                forward_batch.forward_mode,
                forward_batch.seq_lens.values,
                forward_batch.spec_info,
            )
        )

    def init_forward_metadata_in_graph(self, forward_batch: Any) -> None:
        self.calls.append(("in_graph", forward_batch.forward_mode, forward_batch.seq_lens.values))


def verify_batch(lens: list[int], mode: Mode = Mode.TARGET_VERIFY) -> SimpleNamespace:
    return SimpleNamespace(
        forward_mode=mode,
        seq_lens=Lens(lens),
        seq_lens_sum=sum(lens),
        seq_lens_cpu=Lens(lens),
        spec_info="one-node tree",
    )


@pytest.fixture
def attention_env(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv(runtime.ATTENTION_ENV, raising=False)
    return lambda value: monkeypatch.setenv(runtime.ATTENTION_ENV, value)


def test_triton_verifies_one_token_through_its_decode_path_by_default(attention_env: Any) -> None:
    backend = runtime.one_token_attention(TritonAttnBackend())
    assert runtime.verifies_as_decode(backend) and isinstance(backend, TritonAttnBackend)
    assert type(backend).__name__ == "TritonAttnBackend" and type(type(backend)) is abc.ABCMeta
    subclass = type(backend)
    assert runtime.serve_verify_as_decode(backend) is backend and type(backend) is subclass


def test_flashinfer_verifies_one_token_through_its_decode_path_by_default(attention_env: Any) -> None:
    """r30: session 38 measured FlashInfer's verify path at 0.55 of a plain step."""
    backend = runtime.one_token_attention(FlashInferAttnBackend())
    assert runtime.verifies_as_decode(backend) and type(backend).__name__ == "FlashInferAttnBackend"
    assert (
        runtime.describe_one_token_attention(backend)
        == "one-token verify through FlashInferAttnBackend's decode kernel"
    )


def test_other_backends_keep_their_verify_path_unless_asked(attention_env: Any) -> None:
    fa3 = runtime.one_token_attention(FlashAttentionBackend())
    assert not runtime.verifies_as_decode(fa3)
    assert runtime.describe_one_token_attention(fa3) == (
        "one-token verify through FlashAttentionBackend's verify path "
        "(DYNSPEC_ONE_TOKEN_ATTENTION=decode would try its decode kernel)"
    )
    attention_env("decode")
    forced = runtime.one_token_attention(FlashAttentionBackend())
    assert runtime.verifies_as_decode(forced)
    assert runtime.describe_one_token_attention(forced).endswith("decode kernel (DYNSPEC_ONE_TOKEN_ATTENTION=decode)")
    attention_env("verify")
    kept = runtime.one_token_attention(TritonAttnBackend())
    assert not runtime.verifies_as_decode(kept)
    assert runtime.describe_one_token_attention(kept).endswith("verify path (DYNSPEC_ONE_TOKEN_ATTENTION=verify)")
    attention_env("fast")
    with pytest.raises(ValueError, match="DYNSPEC_ONE_TOKEN_ATTENTION must be auto, decode or verify, not 'fast'"):
        runtime.one_token_attention(TritonAttnBackend())


def test_the_start_up_words_are_the_choice_made_not_the_setting_read_again(attention_env: Any) -> None:
    """The line is logged on rank 0 after the backends are built: it must say what was done, and
    never raise there (a setting changed or broken since would stop only rank 0)."""
    attention_env("decode")
    backend = runtime.one_token_attention(FlashAttentionBackend())
    attention_env("fast")  # invalid now: one_token_attention would raise
    assert runtime.describe_one_token_attention(backend) == (
        "one-token verify through FlashAttentionBackend's decode kernel (DYNSPEC_ONE_TOKEN_ATTENTION=decode)"
    )
    # a backend that keeps no words (no instance dict) is described by the mode its class runs
    slotted = type("SlotAttnBackend", (), {"__slots__": ()})()
    attention_env("verify")
    assert runtime.one_token_attention(slotted) is slotted
    assert runtime.describe_one_token_attention(slotted) == "one-token verify through SlotAttnBackend's verify path"


@pytest.mark.parametrize("setting", ["auto", "decode"])
def test_an_fp4_dequant_workspace_keeps_the_verify_path_even_when_asked(attention_env: Any, setting: str) -> None:
    """Its decode kernel would size the workspace by the verify batch's lengths, one key short."""
    attention_env(setting)
    backend = runtime.one_token_attention(Fp4FlashInferAttnBackend())
    assert not runtime.verifies_as_decode(backend)
    assert runtime.describe_one_token_attention(backend) == (
        "one-token verify through FlashInferAttnBackend's verify path (its decode kernel reads an FP4 dequant workspace)"
    )
    # the control: the same backend without the workspace decodes
    assert runtime.verifies_as_decode(runtime.one_token_attention(FlashInferAttnBackend()))


def replay_a_verify_of_two(backend: Any) -> None:
    """The model runner's replay for a target verify of two requests, 10 and 20 tokens long."""
    backend.init_forward_metadata_replay_cuda_graph(
        2,
        "rpi",
        Lens([10, 20]),
        30,
        None,
        forward_mode=Mode.TARGET_VERIFY,
        spec_info="tree",
        seq_lens_cpu=Lens([10, 20]),
    )


@pytest.mark.usefixtures("lens_torch")
def test_graph_metadata_is_built_for_decode_over_the_prefix_and_the_new_token() -> None:
    backend = runtime.serve_verify_as_decode(TritonAttnBackend())
    backend.init_forward_metadata_capture_cuda_graph(4, 4, "rpi", Lens([1, 1, 1, 1]), None, Mode.TARGET_VERIFY, "tree")
    assert backend.calls[0][3].values == [2, 2, 2, 2]
    replay_a_verify_of_two(backend)
    (_, bs, mode, captured, spec), (_, rbs, rmode, replayed, total, cpu, rspec) = backend.calls
    assert (bs, mode, spec) == (4, Mode.DECODE, None)
    assert (rbs, rmode, replayed.values, total, cpu.values, rspec) == (2, Mode.DECODE, [11, 21], 32, [11, 21], None)
    # one persistent buffer: what the captured graph points at is what a replay refills
    assert replayed.storage is captured.storage


def test_other_modes_pass_through_untouched() -> None:
    backend = runtime.serve_verify_as_decode(TritonAttnBackend())
    lens = Lens([5, 6])
    backend.init_forward_metadata_replay_cuda_graph(2, "rpi", lens, 11, None, Mode.DRAFT_EXTEND, "draft input", None)
    backend.init_forward_metadata(verify_batch([5, 6], Mode.DECODE))
    replay, eager = backend.calls
    assert replay == ("replay", 2, Mode.DRAFT_EXTEND, lens, 11, None, "draft input")
    assert eager[1:4] == (Mode.DECODE, [5, 6], 11)
    assert backend.forward("q", "k", "v", "layer", verify_batch([5], Mode.DRAFT_EXTEND)) == ("extend kernel", True, {})


def test_eager_metadata_reads_a_decode_view_and_leaves_the_batch_alone() -> None:
    backend = runtime.serve_verify_as_decode(TritonAttnBackend())
    batch = verify_batch([7, 9])
    backend.init_forward_metadata(batch)
    assert backend.calls == [("eager", Mode.DECODE, [8, 10], 18, backend.calls[0][4], None)]
    assert backend.calls[0][4].values == [8, 10]
    assert (batch.forward_mode, batch.seq_lens.values, batch.seq_lens_sum, batch.spec_info) == (
        Mode.TARGET_VERIFY,
        [7, 9],
        16,
        "one-node tree",
    )


def test_the_layers_run_the_decode_kernel_with_their_arguments() -> None:
    backend = runtime.serve_verify_as_decode(TritonAttnBackend())
    out = backend.forward("q", "k", "v", "layer", verify_batch([3]), False, sinks="sinks")
    assert out == ("decode kernel", False, {"sinks": "sinks"})


@pytest.mark.usefixtures("lens_torch")
def test_the_out_graph_api_converts_once() -> None:
    backend = runtime.serve_verify_as_decode(OutGraphBackend())
    backend.init_forward_metadata(verify_batch([7, 9]))  # eager: the default wrapper calls both halves
    backend.init_forward_metadata_out_graph(verify_batch([1, 1]), in_capture=True)
    assert backend.calls == [
        ("out_graph", False, Mode.DECODE, [8, 10], None),
        ("in_graph", Mode.DECODE, [8, 10]),
        ("out_graph", True, Mode.DECODE, [2, 2], None),
    ]


def _methods(version: str, member: str, class_name: str) -> dict[str, list[str]]:
    source = (unpacked(version, [member]) / "sglang" / member).read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return {f.name: [a.arg for a in f.args.args[1:]] for f in node.body if isinstance(f, ast.FunctionDef)}
    raise AssertionError(f"no {class_name} in {member} of SGLang {version}")


@pytest.mark.releases
@pytest.mark.parametrize("version", RELEASES)
def test_the_decode_view_matches_each_releases_backend_api(version: str) -> None:
    """The argument names rebound, the mode members used, and which metadata API the release calls."""
    modes = _methods(version, "srt/model_executor/forward_batch_info.py", "ForwardMode")
    assert "is_target_verify" in modes and "is_decode" in modes
    base = _methods(version, "srt/layers/attention/base_attn_backend.py", "AttentionBackend")
    triton = _methods(version, "srt/layers/attention/triton_backend.py", "TritonAttnBackend")
    assert {"forward", "forward_decode"} <= set(base) and "forward_decode" in triton
    assert base["forward"][:5] == ["q", "k", "v", "layer", "forward_batch"]
    if "init_forward_metadata_capture_cuda_graph" in triton:  # up to 0.5.12
        capture = inspect.signature(runtime.VerifyAsDecode.init_forward_metadata_capture_cuda_graph)
        assert capture.parameters  # rebinding by name against the release's own signature:
        assert {"seq_lens", "forward_mode", "spec_info"} <= set(triton["init_forward_metadata_capture_cuda_graph"])
        assert {"seq_lens", "seq_lens_sum", "forward_mode", "spec_info", "seq_lens_cpu"} <= set(
            triton["init_forward_metadata_replay_cuda_graph"]
        )
    else:
        assert "init_forward_metadata_out_graph" in base and "init_forward_metadata_in_graph" in base
        assert triton["init_forward_metadata_out_graph"][:2] == ["forward_batch", "in_capture"]


# -- the shipped file ----------------------------------------------------------------------------


def test_the_new_file_is_the_runtime_module_and_imports_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    new, steps, _ = patch_file([SpeculativeDynspecRuntime], SpeculativeDynspecRuntime.TARGET, None, "0.5.12")
    marker = f"# dynspec: speculative_dynspec_runtime r{SpeculativeDynspecRuntime.REVISION}\n"
    assert new == marker + Path(runtime.__file__).read_text(encoding="utf-8")
    assert steps[0].outcome.value == "patched"
    shipped = types.ModuleType("sglang.srt.speculative.dynspec_runtime")
    monkeypatch.setitem(sys.modules, shipped.__name__, shipped)
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.dynspec_settings", dynspec_settings)  # shipped beside it
    monkeypatch.setitem(sys.modules, "torch", None)  # importing torch at module level would fail
    exec(compile(new, "dynspec_runtime.py", "exec"), shipped.__dict__)
    assert shipped.SwitchController(8, log=False).step(9) == shipped.FALL_BACK
    again, steps, _ = patch_file([SpeculativeDynspecRuntime], SpeculativeDynspecRuntime.TARGET, new, "0.5.12")
    assert again == new and steps[0].outcome.value == "already applied"


@pytest.mark.usefixtures("lens_torch")
def test_a_replay_reads_the_metadata_signature_once_per_method(monkeypatch: pytest.MonkeyPatch) -> None:
    """inspect.signature cost about as much as the rest of a replay's preparation (session 13's v1
    profile): it is read once per backend method, not per replay, and the arguments land the same."""
    runtime._signature_of.cache_clear()
    runtime._names_by_position.cache_clear()
    read: list[Any] = []
    signature = inspect.signature
    monkeypatch.setattr(runtime.inspect, "signature", lambda f: read.append(f) or signature(f))
    backend = runtime.serve_verify_as_decode(TritonAttnBackend())
    seen = []
    for lens in ([10, 20], [11, 21], [12, 22]):
        backend.init_forward_metadata_replay_cuda_graph(
            2, "rpi", Lens(lens), 30, None, Mode.TARGET_VERIFY, "tree", Lens(lens)
        )
        seen.append(list(backend.calls[-1][3].values))  # the persistent buffer: read before the next replay
    assert seen == [[11, 21], [12, 22], [13, 23]]
    assert len(read) == 1
    # The control: another backend class's method is another signature.
    other = runtime.serve_verify_as_decode(FlashInferAttnBackend())
    other.init_forward_metadata_replay_cuda_graph(
        2, "rpi", Lens([1, 2]), 3, None, Mode.TARGET_VERIFY, "tree", Lens([1, 2])
    )
    assert len(read) == 1  # FlashInfer inherits the same function from LegacyBackend: still one
    backend.init_forward_metadata_capture_cuda_graph(4, 4, "rpi", Lens([1, 1, 1, 1]), None, Mode.TARGET_VERIFY, "tree")
    assert len(read) == 2


class KeywordsBackend(LegacyBackend):
    """A replay method that takes ``**kwargs``: the zip cannot name its arguments, ``bind`` does."""

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, seq_lens: Any, forward_mode: Any, spec_info: Any, **rest: Any
    ) -> None:  # type: ignore[override]
        self.calls.append(("replay", bs, forward_mode, seq_lens, spec_info, rest))


@pytest.mark.usefixtures("lens_torch")
def test_a_replay_names_its_arguments_without_bind_where_the_signature_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Signature.bind`` cost as much as the rest of the rebinding; the zip lands the same arguments."""
    bound: list[Any] = []
    bind = inspect.Signature.bind
    monkeypatch.setattr(inspect.Signature, "bind", lambda self, *a, **k: bound.append(a) or bind(self, *a, **k))
    backend = runtime.serve_verify_as_decode(TritonAttnBackend())
    replay_a_verify_of_two(backend)
    ((_, bs, mode, lens, total, cpu, spec),) = backend.calls
    assert (bs, mode, lens.values, total, cpu.values, spec) == (2, Mode.DECODE, [11, 21], 32, [11, 21], None)
    assert bound == []
    # The control: a signature the zip cannot name goes through bind, and lands the same.
    other = runtime.serve_verify_as_decode(KeywordsBackend())
    other.init_forward_metadata_replay_cuda_graph(2, Lens([10, 20]), Mode.TARGET_VERIFY, "tree", encoder_lens=None)
    ((_, bs, mode, lens, spec, rest),) = other.calls
    assert (bs, mode, lens.values, spec, rest) == (2, Mode.DECODE, [11, 21], None, {"encoder_lens": None}) and len(
        bound
    ) == 1


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (
            (2, "rpi", Lens([1]), 1, None, Mode.TARGET_VERIFY, "tree", None, "extra"),
            {},
            "too many positional arguments",
        ),
        ((2, "rpi", Lens([1]), 1, None, Mode.TARGET_VERIFY, "tree"), {"bs": 3}, "multiple values for argument 'bs'"),
        (
            (2, "rpi", Lens([1]), 1),
            {"forward_mode": Mode.TARGET_VERIFY, "spec_info": "tree"},
            "missing a required argument: 'encoder_lens'",
        ),
    ],
)
def test_a_wrong_replay_call_raises_what_it_raises_without_dynspec(args: tuple, kwargs: dict, message: str) -> None:
    backend = runtime.serve_verify_as_decode(TritonAttnBackend())
    with pytest.raises(TypeError, match=message):
        backend.init_forward_metadata_replay_cuda_graph(*args, **kwargs)
    assert backend.calls == []


# -- v1's lean step at start-up: where its draft-KV write goes (DYNSPEC_WRITE_AHEAD) ----------------------


def lean_build_world(monkeypatch: pytest.MonkeyPatch, disaggregation: str = "null", streaming: bool = False) -> Any:
    """A v1 worker of a fake 0.5.12 that the lean step fits: the worker module's classes, a Req with
    the verify's methods, no hybrid target, no simulated acceptance."""
    from patches.runtime import dynspec_v2

    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.dynspec_v2", dynspec_v2)
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.spec_utils", types.SimpleNamespace(SIMULATE_ACC_LEN=-1))
    req = type("Req", (), {name: lambda self: None for name in runtime.LeanFallbackStep.REQ_NEEDS})
    monkeypatch.setitem(sys.modules, "sglang.srt.managers.schedule_batch", types.SimpleNamespace(Req=req))
    module = types.ModuleType("fake_v1_eagle_worker")
    module.EagleVerifyInput = type("EagleVerifyInput", (), {"prepare_for_verify": lambda self, b, p: None})  # type: ignore[attr-defined]
    module.EagleDraftExtendInput = type(
        "EagleDraftExtendInput", (), {"create_idle_input": classmethod(lambda cls: None)}
    )  # type: ignore[attr-defined]
    module.GenerationBatchResult = lambda **fields: SimpleNamespace(**fields)  # type: ignore[attr-defined]
    worker_cls = type("EAGLEWorker", (), {"__module__": module.__name__})
    module.EAGLEWorker = worker_cls  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    worker = worker_cls()
    worker.target_worker = SimpleNamespace(model_runner=SimpleNamespace())
    worker.server_args = SimpleNamespace(disaggregation_mode=disaggregation, enable_streaming_session=streaming)
    for name in (runtime.WRITE_AHEAD_ENV, dynspec_v2.LEAN_VERIFY_ENV):
        monkeypatch.delenv(name, raising=False)
    return worker


@pytest.mark.parametrize(
    ("setting", "server", "ahead", "said"),
    [
        (None, {}, True, "the draft KV written directly, before it)"),
        ("1", {}, True, "the draft KV written directly, before it)"),
        ("0", {}, False, "after it, DYNSPEC_WRITE_AHEAD=0)"),
        (None, {"disaggregation": "decode"}, False, "after it, as PD disaggregation moves KV into freed slots"),
        (None, {"streaming": True}, False, "after it, as a streaming session's next turn reads"),
        (None, {"checked": True}, False, "after it, beside the KV bit check's full extend)"),
    ],
)
def test_the_lean_step_writes_ahead_of_its_sync_unless_told_or_where_a_finished_slot_matters(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    setting: Any,
    server: dict,
    ahead: bool,
    said: str,
) -> None:
    checked = server.pop("checked", False)
    worker = lean_build_world(monkeypatch, **server)
    if setting is not None:
        monkeypatch.setenv(runtime.WRITE_AHEAD_ENV, setting)
    with caplog.at_level(logging.INFO, logger=runtime.logger.name):
        step = runtime.LeanFallbackStep.build(worker, object, log=True, checked=checked)
    assert step is not None and step.ahead is ahead
    assert said in caplog.text and "runs as a plain decode step" in caplog.text


@pytest.mark.parametrize(
    ("simulate", "sampler", "said"),
    [
        (-1, SixParameterSampler(), "the lean fallback step draws sampled batches with the target's sampler"),
        (3, SixParameterSampler(), "leaves sampled batches to the stock sample (SGLANG_SIMULATE_ACC_LEN decides"),
        (-1, None, "leaves sampled batches to the stock sample (the target's model runner has no sampler)"),
    ],
)
def test_the_lean_step_draws_sampled_batches_with_the_targets_sampler_where_it_can(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, simulate: int, sampler: Any, said: str
) -> None:
    worker = lean_build_world(monkeypatch)
    spec_utils = types.SimpleNamespace(
        SIMULATE_ACC_LEN=simulate, SIMULATE_ACC_METHOD="match-expected", SIMULATE_ACC_TOKEN_MODE="fixed"
    )
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.spec_utils", spec_utils)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(version=types.SimpleNamespace(hip=None)))  # CUDA
    worker.target_worker.model_runner.sampler = sampler
    with caplog.at_level(logging.INFO):  # the sampled line is dynspec_v2's logger's
        step = runtime.LeanFallbackStep.build(worker, object, log=True)
    assert step is not None and said in caplog.text
    assert (step.decode_sample is not None) is ("draws" in said)
    assert step.decode_sample is None or step.decode_sample.sampler is sampler


def test_a_bad_write_ahead_setting_refuses_to_start_even_with_the_lean_step_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from patches.runtime import dynspec_v2

    worker = lean_build_world(monkeypatch)
    monkeypatch.setenv(runtime.WRITE_AHEAD_ENV, "yes")
    with pytest.raises(ValueError, match="DYNSPEC_WRITE_AHEAD must be 0 or 1, not 'yes'"):
        runtime.LeanFallbackStep.build(worker, object, log=False)
    monkeypatch.setenv(dynspec_v2.LEAN_VERIFY_ENV, "0")
    with pytest.raises(ValueError, match="DYNSPEC_WRITE_AHEAD"):
        runtime.LeanFallbackStep.build(worker, object, log=False)
    monkeypatch.setenv(runtime.WRITE_AHEAD_ENV, "1")  # the control: a good value, the lean step off
    assert runtime.LeanFallbackStep.build(worker, object, log=False) is None
