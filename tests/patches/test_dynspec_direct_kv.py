"""``kv-direct`` on 0.5.14+: the KV-only twin graph fed straight from the verify (``DirectKVWrite``).

The fakes here have the layout of 0.5.14+'s ``EAGLEDraftExtendCudaGraphRunner``: input buffers
that a replay reads in place (views that ``copy_`` and ``zero_`` write through), one graph per
captured batch size in a ``FullCudaGraphBackend``'s ``_graphs``, the draft runner's read-done
mailbox. A replay writes, for every row up to the captured size, the K/V a full forward would
write for that row's token, position and hidden state into the slot the row names, as the KV-only
graph's kernels do. What only a GPU shows (the drafts after a fallback span equal a full
extend's) is ``dynspec proof``'s ``exact_kv``; the release facts the writer relies on are pinned
at the end, against every 0.5.14+ release.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import logging
import re
import sys
import types
import zipfile
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from types import SimpleNamespace
from typing import Any

import pytest
from packaging.version import Version

from patcher import releases
from patches.runtime import dynspec_runtime as runtime
from patches.runtime import dynspec_v2 as v2
from tests.conftest import RELEASES
from tests.patches.fake_draft import (
    EXTEND,
    EagleDraftInput,
    Extend,
    MHATokenToKVPool,
    Zeros,
    full_forward_kv,
    install_fake_torch,
    kv_of,
)
from tests.patches.patched_package import install_patched_package
from tests.patches.real_release import release_file, release_source
from tests.patches.test_dynspec_draft_kv import (
    EXTEND_RUNNER,
    FORWARD_BATCH_INFO,
    KV_GRAPH_MEMBERS,
    V1_WORKER,
    V2_WORKER,
    ZERO_STEP,
    class_def,
    method_def,
)

SIZES = [2, 4, 8]  # the twin's captured batch sizes


@pytest.fixture(autouse=True)
def worker_stream_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The write in the worker's stream, as these fakes model it: the side stream (on by default since
    r33 on every release) needs ``streams``, which sets 1, or a test that sets or clears the variable."""
    monkeypatch.setenv(v2.KV_STREAM_ENV, "0")


HIDDEN_WIDTH = 24  # the target's hidden states per row (EAGLE-3: three layers')


class Buffer:
    """A view of a static buffer: slicing is a view, ``copy_`` and ``zero_`` write through it."""

    def __init__(self, store: list[Any], start: int = 0, stop: int | None = None, width: int | None = None) -> None:
        self.store, self.start, self.stop, self.width = store, start, len(store) if stop is None else stop, width

    @classmethod
    def of(cls, size: int, width: int | None = None) -> Buffer:
        return cls([None] * size, width=width)

    def __getitem__(self, key: slice) -> Buffer:
        assert isinstance(key, slice) and key.step is None
        start, stop, _ = key.indices(self.stop - self.start)
        return Buffer(self.store, self.start + start, self.start + stop, self.width)

    @property
    def shape(self) -> tuple[int, ...]:
        rows = self.stop - self.start
        return (rows,) if self.width is None else (rows, self.width)

    def copy_(self, source: Tensor | Buffer) -> None:
        values = source.store[source.start : source.stop] if isinstance(source, Buffer) else source.values
        assert len(values) == self.stop - self.start, "copy_ of a different row count"
        self.store[self.start : self.stop] = list(values)

    def zero_(self) -> None:
        self.store[self.start : self.stop] = [0] * (self.stop - self.start)

    def clone(self) -> Buffer:
        return Buffer(list(self.store[self.start : self.stop]), width=self.width)


@dataclass
class Tensor:
    """A tensor the verify hands over: its rows, and for 2-D ones the width."""

    values: list[Any]
    width: int | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.values),) if self.width is None else (len(self.values), self.width)


class Graph:
    """One captured KV-only graph: embedding, fc, norms, QKV, rope and the KV write, for ``size``
    requests of ``width`` token rows each (0.5.14+'s in a full-graph backend, a ``torch.cuda.CUDAGraph``
    of 0.5.10 - 0.5.13's ``graphs``)."""

    def __init__(self, twin: Any, size: int, width: int) -> None:
        self.twin, self.size, self.width = twin, size, width

    def replay(self) -> None:
        b, twin = self.twin.buffers, self.twin
        twin.log.append(f"replay {self.size}")
        off = getattr(twin, "rounds_off", {}).get(self.size, 0)  # a graph whose GEMMs round differently
        late = getattr(twin, "rounds_late_rows", {}).get(self.size)  # rows from here round differently
        if off == "nothing":  # a graph that writes no K/V
            return
        for row in range(self.size * self.width):
            token, position, hidden = b.input_ids.store[row], b.positions.store[row], b.hidden_states.store[row]
            k, v = kv_of(token or 0, position or 0, hidden or 0)
            twin.pool.kv[(0, b.out_cache_loc.store[row])] = (
                k + off + (1 if late is not None and row >= late else 0),
                v,
            )


class FullCudaGraphBackend:
    def __init__(self) -> None:
        self._graphs: dict[Any, Graph] = {}

    def replay(self, shape_key: Any, static_forward_batch: Any) -> None:
        assert static_forward_batch is None, "the direct write hands no forward batch"
        self._graphs[shape_key].replay()


class BreakableCudaGraphBackend(FullCudaGraphBackend):
    """Has ``_graphs`` too, but its replay runs eager pieces between them."""


class Event:
    def __init__(self) -> None:
        self.recorded = False

    def record(self) -> None:
        self.recorded = True


class TritonAttnBackend:
    """The draft-extend backend the direct write has run with; it translates no slots."""

    _translate_kv_loc = None


class FlashInferAttnBackend(TritonAttnBackend):
    """FlashInfer's: its graphed draft extend writes the KV with the slots as given, then attends."""


class FlashAttentionBackend(TritonAttnBackend):
    """FA3's: not a backend the direct write takes."""


def input_buffers(rows: int) -> SimpleNamespace:
    """A twin's four input buffers (``DirectKVWrite.INPUTS``), ``rows`` token rows each."""
    return SimpleNamespace(
        input_ids=Buffer.of(rows),
        positions=Buffer.of(rows),
        out_cache_loc=Buffer.of(rows),
        hidden_states=Buffer.of(rows, HIDDEN_WIDTH),
    )


class EAGLEDraftExtendCudaGraphRunner:
    """0.5.14+'s, as the direct write reads it."""

    def __init__(
        self, pool: Any, log: list[str], mailbox: str = "war_fastpath_read_done_event", width: int = 1
    ) -> None:
        self.pool, self.log = pool, log
        self.model_runner = SimpleNamespace(token_to_kv_pool=pool, **{mailbox: None})
        self.device_module = SimpleNamespace(Event=Event)
        self.capture_bs = list(SIZES)
        self.captured_req_width = width
        self.require_mlp_tp_gather = self.require_gathered_buffer = False
        self.draft_extend_attn_backend = TritonAttnBackend()
        self.buffers = input_buffers(max(SIZES) * width)
        self.backend = FullCudaGraphBackend()
        for size in SIZES:
            self.backend._graphs[self._make_graph_key(size)] = Graph(self, size, width)

    def _make_graph_key(self, size: int) -> tuple[str, int]:
        return ("ShapeKey", size)


ZeroStepTwin = EAGLEDraftExtendCudaGraphRunner


class Mode:
    def __init__(self, idle: bool = False) -> None:
        self.idle = idle

    def is_idle(self) -> bool:
        return self.idle


def batch_of(extend: Extend = EXTEND, idle: bool = False) -> tuple[Any, Any]:
    """A zero-step iteration's ``(batch, batch_output)`` as ``_draft_extend_for_decode`` gets them:
    the verified next token per request, its position (the pre-verify ``seq_lens``), its slot."""
    batch = SimpleNamespace(
        forward_mode=Mode(idle), seq_lens=Tensor(list(extend.positions)), out_cache_loc=Tensor(list(extend.slots))
    )
    output = SimpleNamespace(
        next_token_ids=Tensor(list(extend.tokens)),
        logits_output=SimpleNamespace(hidden_states=Tensor(list(extend.hidden), HIDDEN_WIDTH)),
        next_draft_input=SimpleNamespace(),
    )
    return batch, output


@dataclass
class Stub:
    """A zero tensor of ``rows`` rows the stub makes; a slice is a view of the same one."""

    name: str
    rows: int
    of: Stub | None = None  # the tensor this is a view of

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, 1)

    def __getitem__(self, key: slice) -> Stub:
        return Stub(self.name, len(range(self.rows)[key]), self.of or self)


class Worker:
    """EAGLEWorkerV2 as far as the direct write needs it: the stubs upstream's skip switch leaves
    (0.5.14 - 0.5.23: three zero tensors of one row per request on ``next_draft_input``)."""

    def __init__(self) -> None:
        self.stubbed: list[int] = []
        self.server_args = SimpleNamespace()  # read_setting's home before 0.5.17

    def _stub_skipped_draft_extend(self, batch: Any, batch_output: Any) -> None:
        bs = batch.seq_lens.shape[0]
        self.stubbed.append(bs)
        for name in ("topk_p", "topk_index", "hidden_states"):
            setattr(batch_output.next_draft_input, name, Stub(name, bs))


def stack(**twin_options: Any) -> tuple[ZeroStepTwin, MHATokenToKVPool, v2.ZeroStepDirectWrite]:
    pool = MHATokenToKVPool([])
    twin = ZeroStepTwin(pool, [], **twin_options)
    direct, why_not = v2.ZeroStepDirectWrite.build(twin, Worker())
    assert direct is not None, why_not
    return twin, pool, direct


def without_padding(pool: MHATokenToKVPool) -> dict[tuple[int, int], tuple[int, int]]:
    return {key: kv for key, kv in pool.kv.items() if key[1] != 0}


# -- the write ----------------------------------------------------------------------------------


def test_the_direct_write_puts_the_kv_of_a_full_forward_in_the_slots_the_verify_used() -> None:
    twin, pool, direct = stack()
    assert direct.write(*batch_of())
    assert without_padding(pool) == full_forward_kv(EXTEND)
    # three rows ran in the graph captured for four; the fourth wrote the reserved slot 0
    assert twin.log == ["replay 4"] and (0, 0) in pool.kv
    assert twin.buffers.out_cache_loc.store[3] == 0 and twin.buffers.input_ids.store[3] == 0


def test_the_kv_comparison_sees_a_write_at_the_wrong_positions() -> None:
    """The control for the test above: one position off, and the K/V are not a full forward's."""
    twin, pool, direct = stack()
    moved = Extend(EXTEND.tokens, [p + 1 for p in EXTEND.positions], EXTEND.slots, EXTEND.hidden)
    assert direct.write(*batch_of(moved))
    assert without_padding(pool) != full_forward_kv(EXTEND)


def test_a_twin_four_tokens_wide_takes_the_rows_packed_in_the_smallest_graph_that_holds_them() -> None:
    """0.5.14+ capture the twin at the speculative width (4 for 3 steps); the stock replay pads each
    one-token request to 4 rows, the direct write packs them: 3 rows fit the size-2 graph's 8."""
    twin, pool, direct = stack(width=4)
    assert direct.write(*batch_of())
    assert without_padding(pool) == full_forward_kv(EXTEND)
    assert twin.log == ["replay 2"]
    assert twin.buffers.out_cache_loc.store[3:8] == [0] * 5 and twin.buffers.input_ids.store[3:8] == [0] * 5
    assert twin.buffers.out_cache_loc.store[8:] == [None] * (len(twin.buffers.out_cache_loc.store) - 8)
    n = max(SIZES) * 4  # the most rows the largest graph holds; one more is the stock extend's
    assert direct.write(*batch_of(Extend(list(range(1, n + 1)), list(range(n)), list(range(100, 100 + n)))))
    assert twin.log[-1] == f"replay {max(SIZES)}"
    assert not direct.write(*batch_of(Extend(list(range(1, n + 2)), list(range(n + 1)), list(range(100, 101 + n)))))


FOUR = Extend(tokens=[21, 22, 23, 24], positions=[60, 61, 62, 63], slots=[700, 701, 702, 703])
REUSED = Extend(tokens=[31], positions=[5], slots=[703])  # slot 703, freed, now another request's


def test_a_writer_that_ignored_the_width_would_leave_stale_rows_in_the_wide_graph() -> None:
    """The control for the test above: zeroing only ``size`` rows of a graph that runs ``size * 4``
    leaves an earlier batch's rows in place, and one of them overwrites a slot now another request's."""
    twin, pool, direct = stack(width=4)
    direct.width = 1
    for extend in (FOUR, REUSED):
        assert direct.write(*batch_of(extend))
    assert pool.kv[(0, 703)] == full_forward_kv(FOUR)[(0, 703)] != full_forward_kv(REUSED)[(0, 703)]


def test_padding_rows_are_zeroed_so_a_stale_row_cannot_write_a_slot_now_someone_elses() -> None:
    twin, pool, direct = stack()
    for extend in (FOUR, REUSED, EXTEND):  # the last: three rows in the graph for four
        assert direct.write(*batch_of(extend))
    assert pool.kv[(0, 703)] == full_forward_kv(REUSED)[(0, 703)]
    assert twin.log == ["replay 4", "replay 2", "replay 4"]


def test_without_zeroing_the_padding_a_stale_row_overwrites_that_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control for the test above: why ``write`` zeroes the padding rows."""
    monkeypatch.setattr(Buffer, "zero_", lambda self: None)
    twin, pool, direct = stack()
    for extend in (FOUR, REUSED, EXTEND):
        direct.write(*batch_of(extend))
    assert pool.kv[(0, 703)] == full_forward_kv(FOUR)[(0, 703)] != full_forward_kv(REUSED)[(0, 703)]


@pytest.mark.parametrize("mailbox", v2.ZeroStepDirectWrite.READ_DONE_EVENTS)
def test_the_write_publishes_the_read_done_event_the_scheduler_waits_on(mailbox: str) -> None:
    twin, _, direct = stack(mailbox=mailbox)
    assert getattr(twin.model_runner, mailbox) is None
    direct.write(*batch_of())
    event = getattr(twin.model_runner, mailbox)
    assert isinstance(event, Event) and event.recorded


def test_a_runner_without_a_mailbox_gets_no_event() -> None:
    twin, _, direct = stack(mailbox="some_other_name")
    assert direct.read_done is None and direct.write(*batch_of())
    assert twin.model_runner.some_other_name is None


@pytest.mark.parametrize(
    "case",
    ["idle", "too-many-rows", "hidden-width", "two-tokens-per-request", "no-hidden", "no-rows"],
)
def test_a_batch_it_cannot_take_is_left_to_the_stock_extend(case: str) -> None:
    twin, pool, direct = stack()
    batch, output = batch_of(idle=case == "idle")
    if case == "too-many-rows":
        n = max(SIZES) + 1
        batch, output = batch_of(Extend(list(range(1, n + 1)), list(range(n)), list(range(100, 100 + n))))
    elif case == "hidden-width":
        output.logits_output.hidden_states.width = HIDDEN_WIDTH // 3
    elif case == "two-tokens-per-request":
        output.next_token_ids.values *= 2
    elif case == "no-hidden":
        output.logits_output.hidden_states = None
    elif case == "no-rows":
        batch, output = batch_of(Extend([], [], []))
    assert not direct.write(batch, output)
    assert twin.log == [] and pool.kv == {} and all(v is None for v in twin.buffers.input_ids.store)


# -- what build refuses ---------------------------------------------------------------------------


def damage(case: str, twin: ZeroStepTwin, worker: Worker) -> None:
    if case == "no-hidden-buffer":
        twin.buffers.hidden_states = None
    elif case == "breakable-backend":
        graphs = twin.backend._graphs
        twin.backend = BreakableCudaGraphBackend()
        twin.backend._graphs = graphs
    elif case == "a-size-not-captured":
        del twin.backend._graphs[twin._make_graph_key(SIZES[-1])]
    elif case == "zero-width":
        twin.captured_req_width = 0
    elif case == "dp-gather":
        twin.require_gathered_buffer = True
    elif case == "no-stub":
        worker._stub_skipped_draft_extend = None  # type: ignore[assignment]
    elif case == "dsa-seed":
        worker.draft_worker = SimpleNamespace(seed_dsa_topk_from_draft_extend=True)  # type: ignore[attr-defined]
    elif case == "rejection-sampling":
        worker.server_args = SimpleNamespace(speculative_use_rejection_sampling=True)
    elif case == "swa-pool":
        twin.model_runner.token_to_kv_pool = type("SWAKVPool", (), {})()
    elif case == "translated-slots":
        twin.draft_extend_attn_backend._translate_kv_loc = lambda loc: loc
    elif case == "another-backend":
        twin.draft_extend_attn_backend = FlashAttentionBackend()
    elif case == "no-width":
        del twin.captured_req_width
    elif case == "mrope":  # 0.5.14+ keep the flag on the model config
        twin.model_runner.model_config = SimpleNamespace(model_is_mrope=True)


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("no-hidden-buffer", "EAGLEDraftExtendCudaGraphRunner has no hidden_states buffer"),
        ("breakable-backend", "replays through BreakableCudaGraphBackend, not a plain CUDA graph per batch size"),
        ("a-size-not-captured", "has not captured a graph for every batch size it lists"),
        ("zero-width", "holds 0 tokens per request"),
        ("no-width", "holds None tokens per request"),
        (
            "another-backend",
            "the direct write takes TritonAttnBackend, FlashInferAttnBackend only, not FlashAttentionBackend",
        ),
        ("dp-gather", "gathers across data-parallel ranks"),
        ("no-stub", "this EAGLEWorkerV2 has no _stub_skipped_draft_extend"),
        ("dsa-seed", "the draft extend seeds the DSA indexer's top-k"),
        ("rejection-sampling", "rejection sampling keeps the draft extend's probabilities"),
        ("swa-pool", "the draft KV pool SWAKVPool may translate its cache slots with the attention metadata"),
        ("translated-slots", "the draft-extend backend translates its cache slots with the attention metadata"),
        ("mrope", "the draft takes multimodal rope positions (mrope_positions)"),
    ],
)
def test_build_refuses_a_twin_it_cannot_feed_and_says_why(case: str, why: str) -> None:
    twin, worker = ZeroStepTwin(MHATokenToKVPool([]), []), Worker()
    assert v2.ZeroStepDirectWrite.build(twin, worker)[0] is not None  # the control: undamaged, it builds
    damage(case, twin, worker)
    direct, why_not = v2.ZeroStepDirectWrite.build(twin, worker)
    assert direct is None and why in why_not


@pytest.mark.parametrize("backend", [TritonAttnBackend, FlashInferAttnBackend])
def test_both_writers_take_the_draft_extend_backends_that_write_the_kv_as_given(backend: type) -> None:
    """Triton and FlashInfer (v2 module r50): a twin on either is fed directly on both kinds of release."""
    zero_step, worker = ZeroStepTwin(MHATokenToKVPool([]), []), Worker()
    zero_step.draft_extend_attn_backend = backend()
    own = FallbackTwin(MHATokenToKVPool([]), [])
    own.draft_extend_attn_backend = backend()
    direct, why_not = v2.ZeroStepDirectWrite.build(zero_step, worker)
    assert isinstance(direct, v2.ZeroStepDirectWrite) and why_not == ""
    direct, why_not = v2.FallbackDirectWrite.build(own, Worker(), fallback_draft_kv())
    assert isinstance(direct, v2.FallbackDirectWrite) and why_not == ""


# -- the zero-step policy: direct at fall back, the stock extend everywhere else -----------------------


@pytest.fixture
def sglang_side(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (runtime.DRAFT_KV_ENV, runtime.RECORD_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(v2.EARLY_FENCE_ENV, "0")
    install_patched_package(monkeypatch)


class DraftWorker:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def _draft_extend_for_decode(self, batch: Any, batch_output: Any) -> str:
        self.log.append("stock extend")
        return "stock"


def policy_with(mode: str, twin: ZeroStepTwin | None) -> tuple[v2.ZeroStepPolicy, DraftWorker, Worker]:
    worker = Worker()
    worker_ns: Any = SimpleNamespace(
        speculative_num_steps=3,
        server_args=worker.server_args,
        _stub_skipped_draft_extend=worker._stub_skipped_draft_extend,
    )
    draft_kv = runtime.DraftKV(mode, SimpleNamespace(model=None), log=False)
    draft_kv.graph = twin
    policy = v2.ZeroStepPolicy(worker_ns, runtime.SwitchController(4, min_steps=1, log=False), draft_kv, log=False)
    draft_worker = DraftWorker(twin.log if twin is not None else [])
    policy.watch_draft_extend(draft_worker)
    return policy, draft_worker, worker


@pytest.mark.usefixtures("sglang_side")
def test_the_policy_writes_directly_only_at_fall_back_and_resume_runs_the_stock_extend(
    caplog: pytest.LogCaptureFixture,
) -> None:
    twin = ZeroStepTwin(MHATokenToKVPool([]), [])
    policy, draft_worker, worker = policy_with(runtime.DRAFT_KV_DIRECT, twin)
    policy._build_direct()
    assert isinstance(policy.draft_kv.direct, v2.ZeroStepDirectWrite)
    assert runtime.describe_draft_kv(policy.draft_kv).endswith(
        "(from a CUDA graph, replayed directly), full draft extend at resume"
    )
    ran = []
    for size in (2, 9, 9, 3, 2):  # speculate, fall back twice, resume, speculate
        twin.log.clear()
        policy._step = policy.controller.step(size)
        policy.worker.speculative_num_steps = 0 if policy._step != runtime.SPECULATE else 3
        out = draft_worker._draft_extend_for_decode(*batch_of())
        ran.append((policy._step, out, list(twin.log)))
    assert ran == [
        (runtime.SPECULATE, "stock", ["stock extend"]),
        (runtime.FALL_BACK, None, ["replay 4"]),
        (runtime.FALL_BACK, None, ["replay 4"]),
        (runtime.RESUME, "stock", ["stock extend"]),
        (runtime.SPECULATE, "stock", ["stock extend"]),
    ]
    # the stubs stand in for the extend's outputs at each direct write: made once, at the capacity (8 rows)
    assert worker.stubbed == [max(SIZES)]


@pytest.mark.usefixtures("sglang_side")
def test_a_batch_the_direct_write_refuses_goes_through_the_stock_kv_only_extend() -> None:
    twin = ZeroStepTwin(MHATokenToKVPool([]), [])
    policy, draft_worker, worker = policy_with(runtime.DRAFT_KV_DIRECT, twin)
    policy._build_direct()
    policy._step, policy.worker.speculative_num_steps = runtime.FALL_BACK, 0
    n = max(SIZES) + 1
    kv_only = []
    policy.draft_kv.kv_only = lambda owner: (kv_only.append(owner), contextlib.nullcontext())[1]  # type: ignore[method-assign]
    out = draft_worker._draft_extend_for_decode(
        *batch_of(Extend(list(range(1, n + 1)), list(range(n)), list(range(n))))
    )
    assert out == "stock" and twin.log == ["stock extend"] and kv_only == [draft_worker] and worker.stubbed == []


@pytest.mark.usefixtures("sglang_side")
@pytest.mark.parametrize("mode", [runtime.DRAFT_KV_GRAPH, runtime.DRAFT_KV_ONLY])
def test_only_kv_direct_builds_the_direct_write(mode: str) -> None:
    twin = ZeroStepTwin(MHATokenToKVPool([]), [])
    policy, draft_worker, _ = policy_with(mode, twin)
    policy._build_direct()
    assert policy.draft_kv.direct is None
    policy._step, policy.worker.speculative_num_steps = runtime.FALL_BACK, 0
    policy.draft_kv.kv_only = lambda owner: contextlib.nullcontext()  # type: ignore[method-assign]
    assert draft_worker._draft_extend_for_decode(*batch_of()) == "stock"


@pytest.mark.usefixtures("sglang_side")
def test_kv_direct_without_a_feedable_twin_says_why_once_and_stays_kv_graph(caplog: pytest.LogCaptureFixture) -> None:
    twin = ZeroStepTwin(MHATokenToKVPool([]), [])
    twin.captured_req_width = 0
    policy, _, _ = policy_with(runtime.DRAFT_KV_DIRECT, twin)
    policy.log = True
    with caplog.at_level(logging.INFO, logger=v2.__name__):
        policy._build_direct()
    assert policy.draft_kv.direct is None
    assert [r.getMessage() for r in caplog.records] == [
        "dynspec: EAGLEDraftExtendCudaGraphRunner holds 0 tokens per request; kv-direct replays the "
        "KV-only graph through the stock extend"
    ]
    assert runtime.describe_draft_kv(policy.draft_kv).endswith("(from a CUDA graph), full draft extend at resume")


@pytest.mark.usefixtures("sglang_side")
def test_a_give_up_turns_the_direct_write_off() -> None:
    twin = ZeroStepTwin(MHATokenToKVPool([]), [])
    policy, draft_worker, _ = policy_with(runtime.DRAFT_KV_DIRECT, twin)
    policy._build_direct()
    policy.draft_kv._give_up("a test")
    assert policy.draft_kv.mode == runtime.DRAFT_KV_FULL and policy.draft_kv.direct is None
    policy._step, policy.worker.speculative_num_steps = runtime.FALL_BACK, 0
    assert draft_worker._draft_extend_for_decode(*batch_of()) == "stock"


# -- what the direct write relies on, in every 0.5.14+ release ------------------------------------

FULL_BACKEND = "srt/model_executor/runner_backend/full_cuda_graph_backend.py"
COMMON = "srt/speculative/eagle_worker_common.py"
MODEL_RUNNER = "srt/model_executor/model_runner.py"
BASE_WORKER = "srt/speculative/base_spec_worker.py"
SERVER_ARGS = "srt/server_args.py"
SPEC_FIELDS = "srt/arg_groups/fields/spec.py"  # 0.5.20+: the speculative settings' own namespace
# kv-graph's members too: one cached tree per release serves both files' release tests.
EAGLE_INFO_V2 = "srt/speculative/eagle_info_v2.py"  # the own fallback's extend preparation (0.5.10 - 0.5.13)
EAGLE_INFO = "srt/speculative/eagle_info.py"  # v1's verify and extend inputs
SPEC_UTILS = "srt/speculative/spec_utils.py"  # v1 0.5.12's positions and bonus-token kernel
MEMBERS = [
    *KV_GRAPH_MEMBERS,
    FULL_BACKEND,
    COMMON,
    MODEL_RUNNER,
    BASE_WORKER,
    SERVER_ARGS,
    SPEC_FIELDS,
    EAGLE_INFO_V2,
    EAGLE_INFO,
    SPEC_UTILS,
]


def has_member(version: str, member: str) -> bool:
    return release_file(version, MEMBERS, member).exists()


def source_of(version: str, member: str) -> str:
    return release_source(version, MEMBERS, member)


def class_named(source: str, name: str) -> ast.ClassDef:
    found = class_def(source, name)
    assert found is not None, name
    return found


def self_assigned(node: ast.AST) -> set[str]:
    return {
        ast.unparse(t)[len("self.") :]
        for n in ast.walk(node)
        if isinstance(n, (ast.Assign, ast.AnnAssign))
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        for t in (t.elts if isinstance(t, ast.Tuple) else [t])
        if ast.unparse(t).startswith("self.")
    }


@pytest.mark.releases
@pytest.mark.parametrize("version", ZERO_STEP)
def test_the_draft_extend_runner_keeps_what_the_direct_write_reads(version: str) -> None:
    source = source_of(version, EXTEND_RUNNER)
    runner = class_named(source, "EAGLEDraftExtendCudaGraphRunner")
    assigned = self_assigned(runner)
    assert {"buffers", "model_runner", "device_module", "capture_bs", "backend"} <= assigned, sorted(assigned)
    assert "_make_graph_key" in {n.name for n in runner.body if isinstance(n, ast.FunctionDef)}
    buffers = class_named(source, "EagleDraftExtendInputBuffers")
    fields = {ast.unparse(n.target) for n in buffers.body if isinstance(n, ast.AnnAssign)}
    assert set(v2.DirectKVWrite.INPUTS) <= fields, sorted(fields)
    # the graph reads them as captured: sliced from the start, one row per request
    for name in v2.DirectKVWrite.INPUTS:
        assert re.search(rf"buffers\.{name}\[:num_tokens\]", source), name


@pytest.mark.releases
@pytest.mark.parametrize("version", ZERO_STEP)
def test_the_full_backends_replay_replays_its_graph_and_never_reads_the_forward_batch(version: str) -> None:
    backend = class_named(source_of(version, FULL_BACKEND), v2.ZeroStepDirectWrite.GRAPH_BACKENDS[0])
    assert "_graphs" in self_assigned(backend)
    replay = method_def(backend, "replay")
    batch = replay.args.args[2].arg
    assert [a.arg for a in replay.args.args[:2]] == ["self", "shape_key"] and batch == "static_forward_batch"
    assert batch not in {n.id for n in ast.walk(replay) if isinstance(n, ast.Name)}
    assert "self._graphs[shape_key].replay()" in ast.unparse(replay)


def nested_in(tree: ast.AST, target: ast.AST) -> list[ast.AST]:
    """The nodes from ``tree`` down to ``target``."""
    for child in ast.iter_child_nodes(tree):
        if child is target:
            return [tree]
        path = nested_in(child, target)
        if path:
            return [tree, *path]
    return []


@pytest.mark.releases
@pytest.mark.parametrize("version", ZERO_STEP)
def test_the_stock_extend_takes_the_four_inputs_from_where_the_direct_write_does(version: str) -> None:
    """``prepare_for_draft_extend``: the tokens are the verify's next tokens, the positions follow the
    prefix lengths (``seq_lens``, one token per request), the slots are ``batch.out_cache_loc`` as the
    verify left it (only the widened window, off by default, sets others)."""
    worker = source_of(version, V2_WORKER)
    assert "def _stub_skipped_draft_extend(" in worker
    extend = next(
        n
        for n in ast.walk(ast.parse(worker))
        if isinstance(n, ast.FunctionDef) and n.name == "_draft_extend_for_decode"
    )
    text = ast.unparse(extend)
    assert "hidden_states=batch_result.logits_output.hidden_states" in text
    assert "next_token_ids = batch_result.next_token_ids.to(torch.int64)" in text
    homes = [source_of(version, m) for m in (V2_WORKER, COMMON, BASE_WORKER) if has_member(version, m)]
    prepare = [
        n
        for home in homes
        for n in ast.walk(ast.parse(home))
        if isinstance(n, ast.FunctionDef) and n.name == "prepare_for_draft_extend"
    ]
    assert len(prepare) == 1, len(prepare)
    body = ast.unparse(prepare[0])
    assert "batch.input_ids = predict" in body
    assert re.search(r"batch\.prefix_lens = .*seq_lens", body)
    slot_writes = [
        n
        for n in ast.walk(prepare[0])
        if isinstance(n, ast.Assign) and any(ast.unparse(t) == "batch.out_cache_loc" for t in n.targets)
    ]
    for write in slot_writes:
        guards = [ast.unparse(n.test) for n in nested_in(prepare[0], write) if isinstance(n, ast.If)]
        assert guards == ["widen"], guards
    runner = source_of(version, MODEL_RUNNER)
    assert any(f"self.{name}" in runner for name in v2.ZeroStepDirectWrite.READ_DONE_EVENTS), "no read-done mailbox"


@pytest.mark.releases
@pytest.mark.parametrize("version", ZERO_STEP)
def test_the_extend_outputs_the_stubs_miss_are_named_as_build_reads_them(version: str) -> None:
    """``build`` refuses a DSA-seeding draft extend and rejection sampling by these names; a rename
    would turn the refusal silently off."""
    worker = source_of(version, V2_WORKER)
    draft = next(
        n
        for n in ast.walk(ast.parse(worker))
        if isinstance(n, ast.ClassDef)
        and any(isinstance(f, ast.FunctionDef) and f.name == "_draft_extend_for_decode" for f in n.body)
    )
    if "dsa_topk" in ast.unparse(draft):
        assert "seed_dsa_topk_from_draft_extend" in self_assigned(draft)
    homes = [source_of(version, m) for m in (SERVER_ARGS, SPEC_FIELDS) if has_member(version, m)]
    assert any(re.search(r"^\s+speculative_use_rejection_sampling\s*:", home, re.M) for home in homes)


# -- 0.5.10 - 0.5.13: the own fallback's direct write (FallbackDirectWrite) --------------------------

DRAFT_WIDTH = 8  # the draft model's hidden size: the width of next_draft_input.hidden_states


class FallbackTwin:
    """0.5.10 - 0.5.13's ``EAGLEDraftExtendCudaGraphRunner`` as the direct write reads it."""

    def __init__(self, pool: Any, log: list[str], width: int = 4) -> None:
        self.pool, self.log = pool, log
        self.model_runner = SimpleNamespace(token_to_kv_pool=pool)
        self.capture_bs = list(SIZES)
        self.num_tokens_per_bs = width
        self.require_mlp_tp_gather = self.require_gathered_buffer = self.require_mlp_sync = False
        self.draft_extend_attn_backend = TritonAttnBackend()
        self.buffers = input_buffers(max(SIZES) * width)
        self.graphs = {size: Graph(self, size, width) for size in SIZES}


def fallback_draft_kv() -> runtime.DraftKV:
    config = SimpleNamespace(spec_hidden_size=DRAFT_WIDTH, hidden_size=DRAFT_WIDTH, dtype="torch.bfloat16")
    return runtime.DraftKV(runtime.DRAFT_KV_DIRECT, SimpleNamespace(model=None, model_config=config), log=False)


def fallback_batch_of(extend: Extend = EXTEND) -> tuple[Any, Any]:
    """A fallback iteration's ``(batch, batch_result)``; the verify has set ``next_draft_input``."""
    batch, output = batch_of(extend)
    output.next_token_ids.device = "cuda:0"
    output.next_draft_input = SimpleNamespace(topk_p="verify's", topk_index="verify's", hidden_states="verify's")
    return batch, output


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = install_fake_torch(monkeypatch)
    monkeypatch.setattr(torch, "int64", "torch.int64", raising=False)
    monkeypatch.setattr(
        torch, "ones", lambda shape, dtype=None, device=None: Ones(tuple(shape), dtype, device), raising=False
    )


@dataclass
class Ones:
    shape: tuple[int, ...]
    dtype: Any
    device: Any
    of: Any = dataclass_field(default=None, compare=False, repr=False)  # what a slice was cut from

    def __getitem__(self, rows: slice) -> Ones:
        return Ones(
            (len(range(*rows.indices(self.shape[0]))), *self.shape[1:]), self.dtype, self.device, self.of or self
        )


def fallback_stack(**twin_options: Any) -> tuple[FallbackTwin, MHATokenToKVPool, v2.FallbackDirectWrite]:
    pool = MHATokenToKVPool([])
    twin = FallbackTwin(pool, [], **twin_options)
    direct, why_not = v2.FallbackDirectWrite.build(twin, Worker(), fallback_draft_kv())
    assert direct is not None, why_not
    return twin, pool, direct


@pytest.mark.usefixtures("fake_torch")
def test_the_fallbacks_direct_write_packs_the_rows_and_leaves_what_the_eager_kv_only_extend_leaves() -> None:
    twin, pool, direct = fallback_stack()
    batch, output = fallback_batch_of()
    assert direct.write(batch, output)
    assert without_padding(pool) == full_forward_kv(EXTEND)
    assert twin.log == ["replay 2"]  # 3 rows in the size-2 graph's 8
    assert twin.buffers.out_cache_loc.store[3:8] == [0] * 5
    stand_in = output.next_draft_input
    assert stand_in.topk_p == Ones((3, 1), "torch.float32", "cuda:0")
    assert stand_in.topk_index == Zeros((3, 1), "torch.int64", "cuda:0")
    assert stand_in.hidden_states == Zeros((3, DRAFT_WIDTH), "torch.bfloat16", "cuda:0")


@pytest.mark.usefixtures("fake_torch")
def test_the_fallbacks_stand_ins_are_rows_of_one_set_made_once() -> None:
    """Three allocations and fills a step fewer; each batch gets its own row count."""
    _, _, direct = fallback_stack()
    seen = []
    for extend in (EXTEND, Extend([1, 2], [5, 6], [700, 701])):
        batch, output = fallback_batch_of(extend)
        assert direct.write(batch, output)
        seen.append(output.next_draft_input)
    first, second = seen
    assert second.hidden_states == Zeros((2, DRAFT_WIDTH), "torch.bfloat16", "cuda:0")
    for name in ("topk_p", "topk_index", "hidden_states"):
        assert getattr(first, name).of is getattr(second, name).of is not None, name
        assert getattr(first, name).of.shape[0] == direct.capacity, name


@pytest.mark.usefixtures("fake_torch")
def test_the_fallbacks_direct_write_zeroes_the_padding_of_the_wide_graph() -> None:
    """As at 0.5.14+: a row left from an earlier batch would overwrite a slot now another request's."""
    twin, pool, direct = fallback_stack()
    for extend in (FOUR, REUSED):
        assert direct.write(*fallback_batch_of(extend))
    assert pool.kv[(0, 703)] == full_forward_kv(REUSED)[(0, 703)]
    direct.width = 1  # the control: zeroing one row per request leaves FOUR's rows 2 and 3 in place
    for extend in (FOUR, REUSED):
        assert direct.write(*fallback_batch_of(extend))
    assert pool.kv[(0, 703)] == full_forward_kv(FOUR)[(0, 703)]


def damage_fallback_twin(case: str, twin: FallbackTwin, worker: Worker) -> None:
    if case == "no-buffers":  # 0.5.4 - 0.5.9 keep their inputs as attributes, not in buffers
        twin.buffers = None  # type: ignore[assignment]
    elif case == "a-size-not-captured":
        del twin.graphs[SIZES[-1]]
    elif case == "dp-mlp-sync":
        twin.require_mlp_sync = True
    elif case == "moe-a2a":
        worker.server_args = SimpleNamespace(moe_a2a_backend="deepep")
    elif case == "swa-pool":
        twin.model_runner.token_to_kv_pool = type("SWAKVPool", (), {})()
    elif case == "no-width":  # captured_req_width is 0.5.14+'s name: not the one these runners use
        del twin.num_tokens_per_bs
        twin.captured_req_width = 4  # type: ignore[attr-defined]
    elif case == "another-backend":
        twin.draft_extend_attn_backend = FlashAttentionBackend()
    elif case == "mrope":
        twin.model_runner.model_is_mrope = True
    elif case == "backend-of-the-worker":  # 0.5.10: the runner reads eagle_worker.draft_extend_attn_backend
        del twin.draft_extend_attn_backend


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("mrope", "the draft takes multimodal rope positions (mrope_positions)"),
        ("no-width", "holds None tokens per request"),
        ("another-backend", "takes TritonAttnBackend, FlashInferAttnBackend only, not FlashAttentionBackend"),
        ("backend-of-the-worker", "keeps no draft-extend attention backend of its own"),
        ("no-buffers", "EAGLEDraftExtendCudaGraphRunner has no input_ids buffer"),
        ("a-size-not-captured", "has not captured a graph for every batch size it lists"),
        ("dp-mlp-sync", "gathers across data-parallel ranks"),
        ("moe-a2a", "an all-to-all MoE backend runs hooks around the replay"),
        ("swa-pool", "the draft KV pool SWAKVPool may translate its cache slots"),
    ],
)
def test_the_fallbacks_direct_write_refuses_a_twin_it_cannot_feed(case: str, why: str) -> None:
    twin, worker = FallbackTwin(MHATokenToKVPool([]), []), Worker()
    twin.__class__ = type("EAGLEDraftExtendCudaGraphRunner", (FallbackTwin,), {})  # messages name the release's class
    assert v2.FallbackDirectWrite.build(twin, worker, fallback_draft_kv())[0] is not None  # the control
    damage_fallback_twin(case, twin, worker)
    direct, why_not = v2.FallbackDirectWrite.build(twin, worker, fallback_draft_kv())
    assert direct is None and why in why_not


@pytest.mark.usefixtures("sglang_side")
def test_the_own_fallbacks_auto_is_kv_direct_where_the_stock_runner_can_be_fed_and_kv_elsewhere(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Asked of the stock draft-extend runner before any twin is captured (the twin is another
    instance of its class): 0.5.11 - 0.5.13 with Triton feed it; 0.5.4 - 0.5.9 (inputs as
    attributes, not ``buffers``), another backend or no graph at all keep the eager kv."""

    def worker_with(case: str | None) -> Any:
        worker = SimpleNamespace(server_args=SimpleNamespace())
        worker.draft_worker = SimpleNamespace(cuda_graph_runner_for_draft_extend=FallbackTwin(MHATokenToKVPool([]), []))
        if case is not None:
            damage_fallback_twin(case, worker.draft_worker.cuda_graph_runner_for_draft_extend, worker)
        return worker

    with caplog.at_level(logging.INFO, logger=v2.logger.name):
        assert v2.own_fallback_draft_kv_default(worker_with(None), log=True) == runtime.DRAFT_KV_DIRECT
        assert caplog.messages == []
        for case in ("no-buffers", "another-backend"):
            assert v2.own_fallback_draft_kv_default(worker_with(case), log=True) == runtime.DRAFT_KV_ONLY
        unfed = worker_with(None)
        unfed.draft_worker.cuda_graph_runner_for_draft_extend = None  # --disable-cuda-graph
        assert v2.own_fallback_draft_kv_default(unfed, log=False) == runtime.DRAFT_KV_ONLY
        sharded = worker_with(None)
        sharded.server_args = SimpleNamespace(tp_size=2)  # no KV-only graph has run with TP > 1
        assert v2.own_fallback_draft_kv_default(sharded, log=False) == runtime.DRAFT_KV_ONLY
    assert caplog.messages == [
        "dynspec: FallbackTwin has no input_ids buffer; by default the fallback writes the draft KV eagerly (kv)",
        "dynspec: the direct write takes TritonAttnBackend, FlashInferAttnBackend only, not FlashAttentionBackend; by default the "
        "fallback writes the draft KV eagerly (kv)",
    ]


@pytest.mark.parametrize("version", ["0.5.10", "0.5.11", "0.5.12", "0.5.13"])
def test_which_releases_draft_extend_runner_keeps_its_own_attention_backend(version: str) -> None:
    """``unfit`` reads ``draft_extend_attn_backend`` on the runner: 0.5.11+ set it there, 0.5.10 reads
    its worker's, so there the direct write (and ``auto``'s kv-direct) stays off."""
    runner = class_named(source_of(version, EXTEND_RUNNER), "EAGLEDraftExtendCudaGraphRunner")
    assert ("draft_extend_attn_backend" in self_assigned(runner)) == (version != "0.5.10")


class OwnFallbackDraftWorker:
    """0.5.10 - 0.5.13's ``EagleDraftWorker``: the stock ``_draft_extend_for_decode`` logs itself."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def _draft_extend_for_decode(self, batch: Any, batch_result: Any) -> None:
        self.log.append("stock extend")


def fallback_with(mode: str) -> tuple[v2.V2Fallback, FallbackTwin, Any]:
    twin = FallbackTwin(MHATokenToKVPool([]), [])
    draft_kv = fallback_draft_kv()
    draft_kv.mode, draft_kv.graph = mode, twin
    controller = runtime.SwitchController(4, min_steps=1, log=False)
    fallback = v2.V2Fallback(controller, None, draft_kv)
    worker = SimpleNamespace(server_args=SimpleNamespace(), draft_worker=OwnFallbackDraftWorker(twin.log))
    fallback.feed_twin_directly(worker, log=False)
    return fallback, twin, worker


@pytest.mark.usefixtures("sglang_side", "fake_torch")
def test_the_own_fallback_writes_directly_only_in_a_fall_back_iteration() -> None:
    fallback, twin, worker = fallback_with(runtime.DRAFT_KV_DIRECT)
    assert isinstance(fallback.draft_kv.direct, v2.FallbackDirectWrite)
    ran = []
    for step, inside in (
        (runtime.SPECULATE, False),
        (runtime.FALL_BACK, True),
        (runtime.RESUME, True),
        (runtime.FALL_BACK, True),
    ):
        twin.log.clear()
        fallback._step, fallback.in_fallback = step, inside
        worker.draft_worker._draft_extend_for_decode(*fallback_batch_of())
        ran.append(twin.log[0])
    assert ran == ["stock extend", "replay 2", "stock extend", "replay 2"]
    fallback.draft_kv.direct = None  # given up (DraftKV._give_up): the stock extend again
    twin.log.clear()
    worker.draft_worker._draft_extend_for_decode(*fallback_batch_of())
    assert twin.log == ["stock extend"]


@pytest.mark.usefixtures("sglang_side", "fake_torch")
@pytest.mark.parametrize("mode", [runtime.DRAFT_KV_GRAPH, runtime.DRAFT_KV_ONLY])
def test_the_own_fallback_feeds_the_twin_directly_only_under_kv_direct(mode: str) -> None:
    fallback, twin, worker = fallback_with(mode)
    assert fallback.draft_kv.direct is None and "_draft_extend_for_decode" not in vars(worker.draft_worker)


@pytest.mark.usefixtures("sglang_side", "fake_torch")
def test_a_batch_the_fallbacks_direct_write_cannot_take_goes_to_the_stock_extend() -> None:
    fallback, twin, worker = fallback_with(runtime.DRAFT_KV_DIRECT)
    fallback._step, fallback.in_fallback = runtime.FALL_BACK, True
    n = max(SIZES) * 4 + 1
    worker.draft_worker._draft_extend_for_decode(
        *fallback_batch_of(Extend(list(range(1, n + 1)), list(range(n)), list(range(100, 100 + n))))
    )
    assert twin.log == ["stock extend"]


OWN_FALLBACK_DIRECT = [v for v in RELEASES if Version("0.5.10") <= Version(v) < Version("0.5.14")]
OWN_FALLBACK_BEFORE_BUFFERS = [v for v in RELEASES if Version("0.5.4") <= Version(v) < Version("0.5.10")]


@pytest.mark.releases
@pytest.mark.parametrize("version", OWN_FALLBACK_DIRECT)
def test_the_own_fallbacks_runner_and_extend_are_what_the_direct_write_feeds(version: str) -> None:
    """0.5.10 - 0.5.13: the runner keeps the four inputs in ``self.buffers``, one ``torch.cuda.CUDAGraph``
    per size in ``self.graphs``, its width in ``num_tokens_per_bs``; the extend's preparation makes
    the positions from the pre-verify ``seq_lens`` and keeps the verify's ``out_cache_loc``; the extend
    ends by setting the three ``next_draft_input`` fields the stand-ins replace."""
    runner_source = source_of(version, EXTEND_RUNNER)
    runner = class_def(runner_source, "EAGLEDraftExtendCudaGraphRunner")
    assert runner is not None
    init = ast.unparse(method_def(runner, "__init__"))
    assert "self.buffers = EagleDraftExtendInputBuffers(" in init and "self.num_tokens_per_bs = " in init
    assert all(f"{name}={name}" in init for name in v2.DirectKVWrite.INPUTS), version
    assert "self.graphs[self.bs].replay()" in ast.unparse(method_def(runner, "_replay"))
    worker_source = source_of(version, V2_WORKER)
    draft = class_def(worker_source, "EagleDraftWorker")
    assert draft is not None
    extend = method_def(draft, "_draft_extend_for_decode")
    assert [a.arg for a in extend.args.args] == ["self", "batch", "batch_result"]
    last = ast.unparse(extend.body[-1])
    assert last.startswith("next_draft_input.topk_p, next_draft_input.topk_index, next_draft_input.hidden_states = ")
    assert "prepare_for_extend_to_fill_draft_kvcache(batch, batch_result.next_token_ids," in ast.unparse(extend)
    info = class_def(source_of(version, EAGLE_INFO_V2), "EagleDraftInputV2Mixin")
    assert info is not None
    prepare = ast.unparse(method_def(info, "prepare_for_extend_to_fill_draft_kvcache"))
    # the extend's prefix (so its one position) is the pre-verify length: saved before 0.5.13 bumps it
    # on the batch, on the forward batch only from 0.5.13
    prefix = (
        ["seq_lens_cpu_ = batch.seq_lens_cpu", "batch.extend_prefix_lens = seq_lens_cpu_.tolist()"]
        if Version(version) < Version("0.5.13")
        else ["batch.prefix_lens = batch.seq_lens_cpu.tolist()", "batch.prefix_lens = batch.seq_lens.to(torch.int32)"]
    )
    assert all(line in prepare for line in prefix), version
    assert prepare.index(prefix[0]) < prepare.index("ForwardBatch.init_new(batch, draft_model_runner)")
    assert "batch.input_ids = predict" in prepare and "out_cache_loc" not in prepare


@pytest.mark.releases
@pytest.mark.parametrize("version", OWN_FALLBACK_BEFORE_BUFFERS)
def test_before_0_5_10_the_runner_has_no_input_buffers_so_kv_direct_is_kv_graph(version: str) -> None:
    runner = class_def(source_of(version, EXTEND_RUNNER), "EAGLEDraftExtendCudaGraphRunner")
    assert runner is not None
    assert "self.buffers" not in ast.unparse(method_def(runner, "__init__")), version


# -- DYNSPEC_KV_STREAM: the own fallback's direct write on a stream of its own -----------------------


class LaggingStream:
    """A CUDA stream as the side stream's ordering must assume: work queued on it may run as late
    as the moment another stream waits for an event recorded after it, and no earlier."""

    def __init__(self, name: str) -> None:
        self.name, self.queue = name, []  # type: list[Any]
        self.waited_for: list[str] = []

    def wait_stream(self, other: LaggingStream) -> None:
        self.waited_for.append(other.name)  # the worker's work runs at once here: nothing to hold back

    def wait_event(self, event: LaggingEvent) -> None:
        event.stream.run_until(event.index)

    def run_until(self, index: int) -> None:
        while index > 0 and self.queue:
            self.queue.pop(0)()
            index -= 1


class LaggingEvent:
    def __init__(self, streams: LaggingStreams) -> None:
        self.streams = streams
        self.stream: LaggingStream = streams.main
        self.index = 0

    def record(self, stream: LaggingStream | None = None) -> None:
        self.stream = stream or self.streams.current
        self.index = len(self.stream.queue)


class LaggingStreams:
    """``torch.cuda`` for ``SideStream``: the worker's stream runs work at once, any other queues it."""

    def __init__(self) -> None:
        self.main = self.current = LaggingStream("main")
        self.sides: list[LaggingStream] = []

    def Stream(self) -> LaggingStream:  # noqa: N802 - torch's spelling
        self.sides.append(LaggingStream(f"side{len(self.sides)}"))
        return self.sides[-1]

    def current_stream(self, device: int | None = None) -> LaggingStream:
        return self.current

    @contextlib.contextmanager
    def stream(self, stream: LaggingStream) -> Any:
        previous, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = previous

    def Event(self) -> LaggingEvent:  # noqa: N802
        return LaggingEvent(self)

    def launch(self, work: Any) -> None:
        if self.current is self.main:
            work()
        else:
            self.current.queue.append(work)

    def drain(self) -> None:
        for side in self.sides:
            side.run_until(len(side.queue))


def lagging_graphs(twin: FallbackTwin, streams: LaggingStreams) -> None:
    """The twin's graphs replay in whatever stream is current, as ``CUDAGraph.replay`` does."""
    for size, graph in list(twin.graphs.items()):
        twin.graphs[size] = SimpleNamespace(replay=lambda graph=graph: streams.launch(graph.replay))  # type: ignore[assignment]


def lagging_backend(twin: ZeroStepTwin, streams: LaggingStreams) -> None:
    """The twin's full-graph backend replays in whatever stream is current."""
    backend = twin.backend
    replay = backend.replay
    backend.replay = lambda key, batch: streams.launch(lambda: replay(key, batch))  # type: ignore[method-assign]


class ForwardingWorker:
    """EAGLEWorkerV2 as ``write_beside`` reads it; its forward notes what the draft KV holds then."""

    def __init__(self, twin: FallbackTwin, pool: MHATokenToKVPool, **settings: Any) -> None:
        self.server_args = SimpleNamespace(**settings)
        self.device = "cuda"
        self.draft_worker = OwnFallbackDraftWorker(twin.log)
        self.plan_stream = None
        self.pool = pool
        self.seen: list[dict[tuple[int, int], tuple[int, int]]] = []

    def forward_batch_generation(self, batch: Any) -> str:
        self.seen.append(without_padding(self.pool))
        return "forwarded"


@pytest.fixture
def streams(monkeypatch: pytest.MonkeyPatch, fake_torch: None) -> LaggingStreams:
    streams = LaggingStreams()
    monkeypatch.setattr(sys.modules["torch"], "get_device_module", lambda device: streams, raising=False)
    monkeypatch.setenv(v2.KV_STREAM_ENV, "1")
    return streams


def beside_with(
    streams: LaggingStreams, plan_stream: Any = None, **settings: Any
) -> tuple[v2.V2Fallback, FallbackTwin, ForwardingWorker]:
    pool = MHATokenToKVPool([])
    twin = FallbackTwin(pool, [])
    lagging_graphs(twin, streams)
    draft_kv = fallback_draft_kv()
    draft_kv.mode, draft_kv.graph = runtime.DRAFT_KV_DIRECT, twin
    fallback = v2.V2Fallback(runtime.SwitchController(4, min_steps=1, log=False), None, draft_kv)
    worker = ForwardingWorker(twin, pool, **settings)
    worker.plan_stream = plan_stream
    fallback.feed_twin_directly(worker, log=False)
    fallback.write_beside(worker, log=False)
    fallback._step, fallback.in_fallback = runtime.FALL_BACK, True
    return fallback, twin, worker


@pytest.mark.usefixtures("sglang_side")
def test_beside_the_worker_the_write_waits_for_its_inputs_and_is_not_waited_for_until_the_next_forward(
    streams: LaggingStreams,
) -> None:
    fallback, twin, worker = beside_with(streams)
    worker.draft_worker._draft_extend_for_decode(*fallback_batch_of())
    side = streams.sides[0]
    assert side.waited_for == ["main"] and len(side.queue) == 1  # queued behind the copies, not run
    assert worker.pool.kv == {}
    assert worker.forward_batch_generation("next batch") == "forwarded"
    assert side.queue == [] and worker.seen == [full_forward_kv(EXTEND)]  # the forward saw the KV written


@pytest.mark.usefixtures("sglang_side")
def test_beside_the_worker_two_writes_in_a_row_each_write_their_own_rows(streams: LaggingStreams) -> None:
    """The second write fills the inputs the first replay reads: it waits for that replay first."""
    fallback, twin, worker = beside_with(streams)
    for extend in (FOUR, REUSED):
        worker.draft_worker._draft_extend_for_decode(*fallback_batch_of(extend))
    streams.drain()
    assert without_padding(worker.pool) == {**full_forward_kv(FOUR), **full_forward_kv(REUSED)}


@pytest.mark.usefixtures("sglang_side")
def test_without_the_join_a_lagging_replay_writes_the_next_writes_inputs(
    streams: LaggingStreams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: with nothing waiting, FOUR's replay runs after REUSED's copies and writes REUSED's rows."""
    monkeypatch.setattr(v2.SideStream, "join", lambda self: None)
    fallback, twin, worker = beside_with(streams)
    for extend in (FOUR, REUSED):
        worker.draft_worker._draft_extend_for_decode(*fallback_batch_of(extend))
    streams.drain()
    assert without_padding(worker.pool) != {**full_forward_kv(FOUR), **full_forward_kv(REUSED)}
    assert worker.forward_batch_generation("next batch") == "forwarded"


@pytest.mark.usefixtures("sglang_side")
def test_without_the_forward_hook_the_next_forward_runs_before_the_draft_kv_is_written(streams: LaggingStreams) -> None:
    """The control of the first test: a forward (a prefill given a freed slot, a resume) would
    run before the lagging replay, so the hook on the worker's forward is what orders them."""
    fallback, twin, worker = beside_with(streams)
    del worker.forward_batch_generation  # the stock method, without write_beside's hook
    worker.draft_worker._draft_extend_for_decode(*fallback_batch_of())
    worker.forward_batch_generation("next batch")
    assert worker.seen == [{}]


@pytest.mark.usefixtures("sglang_side")
@pytest.mark.parametrize(
    ("settings", "plan_stream", "setting"),
    [
        ({"tp_size": 2}, None, "1"),
        ({"disaggregation_mode": "decode"}, None, "1"),
        ({"enable_hierarchical_cache": True}, None, ""),
        ({}, "a plan stream", ""),
        ({}, None, "0"),
    ],
)
def test_the_write_stays_in_the_workers_stream_where_a_side_stream_is_not_safe_or_switched_off(
    streams: LaggingStreams, monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any], plan_stream: Any, setting: str
) -> None:
    monkeypatch.setenv(v2.KV_STREAM_ENV, setting)
    fallback, twin, worker = beside_with(streams, plan_stream, **settings)
    direct = fallback.draft_kv.direct
    assert isinstance(direct, v2.FallbackDirectWrite) and direct.side is None
    assert "forward_batch_generation" not in vars(worker) and streams.sides == []


@pytest.mark.usefixtures("sglang_side")
def test_a_bad_stream_setting_refuses_to_start(streams: LaggingStreams, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(v2.KV_STREAM_ENV, "yes")
    fallback, twin, worker = fallback_with(runtime.DRAFT_KV_GRAPH)  # read even where it could not apply
    with pytest.raises(ValueError, match="DYNSPEC_KV_STREAM must be 0 or 1"):
        fallback.write_beside(worker, log=False)
    with pytest.raises(ValueError, match="DYNSPEC_KV_STREAM must be 0 or 1"):  # 0.5.14+, without kv-direct too
        policy_with(runtime.DRAFT_KV_GRAPH, None)


@pytest.mark.usefixtures("sglang_side")
def test_the_side_stream_is_the_default(streams: LaggingStreams, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(v2.KV_STREAM_ENV)
    fallback, twin, worker = beside_with(streams)
    assert isinstance(fallback.draft_kv.direct, v2.FallbackDirectWrite) and fallback.draft_kv.direct.side is not None
    assert "forward_batch_generation" in vars(worker)


# -- DYNSPEC_KV_BATCH: the rows of several iterations in one replay ---------------------------------


class Decode(Mode):
    def __init__(self, decode: bool = True) -> None:
        super().__init__(False)
        self.decode = decode

    def is_decode(self) -> bool:
        return self.decode


A, B, C, D = (SimpleNamespace(rid=name) for name in "ABCD")  # requests, told apart by identity


def step_of(reqs: list[Any], step: int, slots: list[int] | None = None) -> tuple[Any, Any]:
    """Iteration ``step`` of a zero-step span: each request's next token at position 40 + step."""
    n = len(reqs)
    extend = Extend(
        [10 + step] * n, [40 + step + i * 100 for i in range(n)], slots or [900 + 10 * step + i for i in range(n)]
    )
    batch, output = batch_of(extend)
    batch.reqs = list(reqs)
    batch.forward_mode = Decode()
    return batch, output


class Probe:
    """``RoundingProbe`` on the fakes: the probe block repeated as buffers, the pool's K/V at their slots."""

    def __init__(self, pool: MHATokenToKVPool, slots: int = 1 << 20) -> None:
        self.pool = pool
        self.pool_slots = slots

    def slots(self) -> int:
        return self.pool_slots

    @staticmethod
    def inputs(buffers: Any, block: int, blocks: int) -> Any:
        return SimpleNamespace(
            input_ids=Buffer([5 + i for i in range(block)] * blocks),
            positions=Buffer([60 + i for i in range(block)] * blocks),
            out_cache_loc=Buffer(list(range(1, block * blocks + 1))),
            hidden_states=Buffer([3 * i for i in range(block)] * blocks, width=HIDDEN_WIDTH),
        )

    def clear(self, slots: Buffer) -> None:
        for slot in slots.store[slots.start : slots.stop]:
            self.pool.kv.pop((0, slot), None)

    def signature(self, slots: Buffer, block: int) -> list[Any] | None:
        kv = [self.pool.kv.get((0, slot)) for slot in slots.store[slots.start : slots.stop]]
        blocks = [kv[at : at + block] for at in range(0, len(kv), block)]
        return blocks[0] if all(b == blocks[0] for b in blocks) else None

    @staticmethod
    def same(kv: list[Any], other: list[Any]) -> bool:
        return kv == other


def batched(
    steps: int, rounds_off: dict[int, int] | None = None
) -> tuple[ZeroStepTwin, MHATokenToKVPool, v2.ZeroStepDirectWrite]:
    """A writer of ``steps`` iterations per replay into a twin four rows per request wide, as
    0.5.17's, after the start-up check; ``rounds_off``: graph sizes whose K/V round differently."""
    twin, pool, direct = stack(width=4)
    twin.rounds_off = rounds_off or {}
    direct.batch_steps = steps
    direct.check_rounding(Probe(pool))
    pool.kv.clear()
    twin.log.clear()
    return twin, pool, direct


def expected_kv(*steps: tuple[Any, Any]) -> dict[tuple[int, int], tuple[int, int]]:
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for batch, output in steps:
        extend = Extend(output.next_token_ids.values, batch.seq_lens.values, batch.out_cache_loc.values)
        out.update(full_forward_kv(extend))
    return out


def test_two_iterations_of_the_same_requests_are_written_in_one_replay() -> None:
    twin, pool, direct = batched(2)
    first, second = step_of([A, B, C], 0), step_of([A, B, C], 1)
    assert direct.write(*first) and twin.log == [] and direct.pending == 3  # staged, not written
    assert twin.model_runner.war_fastpath_read_done_event.recorded  # the verify's tensors were read all the same
    assert direct.write(*second)
    assert twin.log == ["replay 2"] and direct.pending == 0  # 6 rows in the graph for 2 requests (8 rows)
    assert without_padding(pool) == expected_kv(first, second)


def test_a_change_of_requests_writes_the_staged_rows_first() -> None:
    """A finished request's slots may go to the next step's joiner: its rows must not wait past it."""
    twin, pool, direct = batched(4)
    first = step_of([A, B, C], 0)
    direct.write(*first)
    assert twin.log == []
    direct.write(*step_of([A, B, D], 1))  # C left, D joined
    assert twin.log == ["replay 2"] and direct.pending == 3
    assert without_padding(pool) == expected_kv(first)
    direct.write(*step_of([A, B, C], 2))  # the same length again, other requests: still a change
    assert twin.log == ["replay 2", "replay 2"]


def test_a_replay_stays_in_graphs_that_round_as_one_iterations_does() -> None:
    """The graph for 8 rounds differently: three requests (one iteration: the graph for 2) may fill
    the graph for 4, 16 rows, so the fifth iteration flushes, whatever the setting allows."""
    twin, pool, direct = batched(8, rounds_off={8: 1})
    assert direct.rounding == [0, 0, 1]
    steps = [step_of([A, B, C], i) for i in range(5)]
    for s in steps[:4]:
        direct.write(*s)
    assert twin.log == [] and direct.pending == 12
    direct.write(*steps[4])
    assert twin.log == ["replay 4"] and direct.pending == 0  # 15 rows
    assert without_padding(pool) == expected_kv(*steps)


def test_unchecked_a_replay_in_a_graph_that_rounds_differently_writes_other_kv() -> None:
    """Negative control for the test above: told that all graphs round alike, eight iterations go
    in the graph for 8 and its K/V differ from one iteration's (on the H200: 2 of 1056 proposals)."""
    twin, pool, direct = batched(8, rounds_off={8: 1})
    direct.rounding = [0, 0, 0]
    steps = [step_of([A, B, C], i) for i in range(8)]
    for s in steps:
        direct.write(*s)
    assert twin.log == ["replay 8"] and without_padding(pool) != expected_kv(*steps)


def test_graphs_that_round_alike_take_as_many_iterations_as_the_setting_allows() -> None:
    twin, pool, direct = batched(8)
    assert direct.rounding == [0, 0, 0] and direct.rounding_groups() == "2-8:0"
    steps = [step_of([A, B, C], i) for i in range(8)]
    for s in steps:
        direct.write(*s)
    assert twin.log == ["replay 8"] and without_padding(pool) == expected_kv(*steps)


def test_the_check_replays_every_graph_on_probe_rows_in_slots_from_1_and_numbers_what_they_leave() -> None:
    twin, pool, direct = stack(width=4)
    twin.rounds_off = {4: 2, 8: 2}
    assert direct.check_rounding(Probe(pool)) == [0, 1, 1]
    assert twin.log == ["replay 2", "replay 4", "replay 8"] and direct.rounding_groups() == "2:0 | 4-8:1"
    assert set(without_padding(pool)) == {
        (0, slot) for slot in range(1, 33)
    }  # the largest graph's 32 rows, blocks of 8
    assert (
        direct.same_rounding_rows(5) == 8 and direct.same_rounding_rows(9) == 32 and direct.same_rounding_rows(33) == 0
    )


def test_an_iteration_as_large_as_the_largest_alike_graph_writes_at_once() -> None:
    """30 requests: one iteration needs the graph for 8, and no graph holds two."""
    twin, pool, direct = batched(4)
    first = step_of([SimpleNamespace(rid=i) for i in range(30)], 0)
    assert direct.write(*first)
    assert twin.log == ["replay 8"] and direct.pending == 0 and without_padding(pool) == expected_kv(first)


def test_a_batch_without_its_requests_writes_every_iteration() -> None:
    """0.5.12's ``ModelWorkerBatch`` carries no ``reqs``: who the rows belong to is unknown."""
    twin, _, direct = batched(4)
    batch, output = step_of([A, B, C], 0)
    del batch.reqs
    direct.write(batch, output)
    assert twin.log == ["replay 2"] and direct.pending == 0


def test_a_batch_it_cannot_take_writes_the_staged_rows_before_the_stock_extend() -> None:
    twin, pool, direct = batched(4)
    first = step_of([A, B, C], 0)
    direct.write(*first)
    batch, output = step_of([A, B, C], 1)
    output.logits_output.hidden_states = None
    assert not direct.write(batch, output)
    assert twin.log == ["replay 2"] and without_padding(pool) == expected_kv(first)


@pytest.mark.parametrize(("setting", "steps"), [("", 1), ("1", 1), (" 4 ", 4), ("8", 8)])
def test_the_setting(monkeypatch: pytest.MonkeyPatch, setting: str, steps: int) -> None:
    monkeypatch.setenv(v2.KV_BATCH_ENV, setting)
    assert v2.kv_batch_steps() == steps


@pytest.mark.parametrize("setting", ["0", "9", "two", "-1", "2.5"])
def test_a_bad_setting_refuses_to_start(monkeypatch: pytest.MonkeyPatch, setting: str) -> None:
    monkeypatch.setenv(v2.KV_BATCH_ENV, setting)
    with pytest.raises(ValueError, match=r"DYNSPEC_KV_BATCH must be a whole number from 1 to 8"):
        v2.kv_batch_steps()


class Forwarding:
    """The worker's ``forward_batch_generation``: a prefill's draft extend writes the draft KV of
    its new tokens, here the slots it was given."""

    def __init__(self, pool: MHATokenToKVPool, log: list[str]) -> None:
        self.pool, self.log = pool, log

    def __call__(self, batch: Any) -> str:
        self.log.append(f"forward {'decode' if batch.forward_mode.is_decode() else 'prefill'}")
        for slot in getattr(batch, "prefill_slots", []):
            self.pool.kv[(0, slot)] = ("prefill", slot)
        return "result"


def batched_policy(
    monkeypatch: pytest.MonkeyPatch, steps: int, streams: LaggingStreams | None = None
) -> tuple[v2.ZeroStepPolicy, DraftWorker, ZeroStepTwin]:
    """``streams``: the twin replays in whatever stream is current, as ``DYNSPEC_KV_STREAM=1`` replays it."""
    monkeypatch.setenv(v2.KV_BATCH_ENV, str(steps))
    pool = MHATokenToKVPool([])
    twin = ZeroStepTwin(pool, [], width=4)
    if streams is not None:
        lagging_backend(twin, streams)
    policy, draft_worker, _ = policy_with(runtime.DRAFT_KV_DIRECT, twin)
    policy.worker.device = "cuda"
    policy.worker.forward_batch_generation = Forwarding(pool, twin.log)
    monkeypatch.setattr(v2.RoundingProbe, "of", staticmethod(lambda twin: Probe(twin.pool)))
    policy._build_direct()
    assert policy.draft_kv.direct is not None and policy.draft_kv.direct.batch_steps == steps
    pool.kv.clear()
    twin.log.clear()  # the start-up check's replays
    policy._step, policy.worker.speculative_num_steps = runtime.FALL_BACK, 0
    return policy, draft_worker, twin


@pytest.mark.usefixtures("sglang_side")
def test_resume_writes_the_staged_rows_before_the_stock_extend(monkeypatch: pytest.MonkeyPatch) -> None:
    policy, draft_worker, twin = batched_policy(monkeypatch, 4)
    draft_worker._draft_extend_for_decode(*step_of([A, B, C], 0))
    assert twin.log == []
    policy._step = runtime.RESUME
    draft_worker._draft_extend_for_decode(*step_of([A, B, C], 1))
    assert twin.log == ["replay 2", "stock extend"]


@pytest.mark.usefixtures("sglang_side")
def test_a_prefill_forward_writes_the_staged_rows_first_and_a_decode_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    policy, draft_worker, twin = batched_policy(monkeypatch, 4)
    draft_worker._draft_extend_for_decode(*step_of([A, B, C], 0, slots=[900, 901, 902]))
    decode = SimpleNamespace(forward_mode=Decode(True))
    assert policy.worker.forward_batch_generation(decode) == "result" and twin.log == ["forward decode"]
    # A finished; its slot 902 went to a new request whose prefill writes its draft KV there.
    prefill = SimpleNamespace(forward_mode=Decode(False), prefill_slots=[902])
    policy.worker.forward_batch_generation(prefill)
    assert twin.log == ["forward decode", "replay 2", "forward prefill"]
    assert twin.pool.kv[(0, 902)] == ("prefill", 902)  # the new owner's KV stands


@pytest.mark.usefixtures("sglang_side")
def test_without_the_forward_hook_a_staged_row_overwrites_the_new_owners_kv(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control for the test above: the hazard the flush before a prefill prevents."""
    monkeypatch.setattr(v2.ZeroStepPolicy, "_flush_before_other_forwards", lambda self: None)
    policy, draft_worker, twin = batched_policy(monkeypatch, 4)
    draft_worker._draft_extend_for_decode(*step_of([A, B, C], 0, slots=[900, 901, 902]))
    policy.worker.forward_batch_generation(SimpleNamespace(forward_mode=Decode(False), prefill_slots=[902]))
    policy.draft_kv.direct.flush()
    assert twin.pool.kv[(0, 902)] != ("prefill", 902)


@pytest.mark.usefixtures("sglang_side")
def test_one_iteration_per_replay_installs_no_forward_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(v2.KV_BATCH_ENV, raising=False)
    twin = ZeroStepTwin(MHATokenToKVPool([]), [])
    policy, _, _ = policy_with(runtime.DRAFT_KV_DIRECT, twin)
    policy._build_direct()
    assert policy.draft_kv.direct is not None and policy.draft_kv.direct.batch_steps == 1
    assert "forward_batch_generation" not in vars(policy.worker)


@pytest.mark.usefixtures("sglang_side")
def test_the_iteration_that_switches_back_on_writes_the_staged_rows_before_anything_drafts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy, draft_worker, twin = batched_policy(monkeypatch, 4)
    policy.controller = runtime.SwitchController(4, min_steps=1, log=False)
    policy.worker.apply_runtime_state = lambda state: None
    policy._states = {0: "zero", 3: "speculative"}
    policy.worker.speculative_num_steps = 0
    policy.activate_step_by_batch(9)  # off
    draft_worker._draft_extend_for_decode(*step_of([A, B, C], 0))
    policy.activate_step_by_batch(9)  # still off: the rows wait
    assert twin.log == [] and policy.draft_kv.direct is not None and policy.draft_kv.direct.pending == 3
    policy.activate_step_by_batch(3)  # back on: RESUME, before its verify
    assert policy._step == runtime.RESUME and twin.log == ["replay 2"]


def test_the_stand_ins_are_rows_of_one_set_made_once() -> None:
    _, _, direct = stack()
    worker = direct.worker
    outputs = []
    for extend in (EXTEND, Extend([1, 2], [5, 6], [700, 701])):
        batch, output = batch_of(extend)
        assert direct.write(batch, output)
        outputs.append(output.next_draft_input)
    assert worker.stubbed == [max(SIZES)]  # once, for the largest graph's rows
    first, second = outputs
    assert [first.topk_p.rows, first.topk_index.rows, first.hidden_states.rows] == [3, 3, 3]
    assert second.hidden_states.rows == 2 and second.hidden_states.of is first.hidden_states.of


def test_a_stub_that_wants_more_than_the_batch_size_runs_every_iteration() -> None:
    """Negative control of the shortcut: a release whose stub reads another field keeps its own."""
    _, _, direct = stack()
    worker = direct.worker
    stock = worker._stub_skipped_draft_extend

    def reads_more(batch: Any, batch_output: Any) -> None:
        batch.req_pool_indices  # noqa: B018 - a field the stand-ins do not carry
        stock(batch, batch_output)

    worker._stub_skipped_draft_extend = reads_more  # type: ignore[method-assign]
    for _ in range(2):
        batch, output = batch_of()
        batch.req_pool_indices = Tensor([0, 1, 2])
        assert direct.write(batch, output)
        assert output.next_draft_input.hidden_states.rows == 3
    assert worker.stubbed == [3, 3]


# -- the stand-ins made once (ZeroStepDirectWrite and FallbackDirectWrite.stand_in): what they rely on --

STUB_FIELDS = frozenset({"topk_p", "topk_index", "hidden_states"})
# Writes through these names that are not writes to the stubs: a graph runner's own static input
# buffers (it copies the draft input into them; 0.5.10's multi-layer MTP runner keeps them as its
# own attributes) and a request's list of returned hidden states.
NOT_THE_STUBS = ("buffers.", "req.hidden_states", "self.hidden_states[:num_tokens].copy_(ret.hidden_states")


def stub_problems(source: str) -> list[str]:
    """The stub reads nothing of the batch but its size and sets exactly the three fields, each a
    ``torch.zeros`` of ``bs`` rows: then one set made at the capacity, sliced, is the same stub."""
    stub = method_def(class_named(source, "EAGLEWorkerV2"), "_stub_skipped_draft_extend")
    batch, output = (a.arg for a in stub.args.args[1:3])
    problems = []
    reads = {ast.unparse(n) for n in ast.walk(stub) if isinstance(n, ast.Attribute) and ast.unparse(n.value) == batch}
    if reads != {f"{batch}.seq_lens"} or f"{batch}.seq_lens.shape[0]" not in ast.unparse(stub):
        problems.append(f"reads {sorted(reads)} of the batch, not only its size")
    if f"{output}.next_draft_input" not in ast.unparse(stub):
        problems.append("does not set the fields on next_draft_input")
    sets = {}
    for n in ast.walk(stub):
        if (
            isinstance(n, ast.Assign)
            and isinstance(n.targets[0], ast.Attribute)
            and ast.unparse(n.targets[0].value) == "next_draft_input"
        ):
            sets[n.targets[0].attr] = ast.unparse(n.value)
    if set(sets) != STUB_FIELDS:
        problems.append(f"sets {sorted(sets)}")
    problems += [f"{k} = {v}" for k, v in sets.items() if not re.match(r"torch\.zeros\(\(bs, ", v)]
    return problems


@pytest.mark.releases
@pytest.mark.parametrize("version", ZERO_STEP)
def test_the_stub_depends_only_on_the_batch_size(version: str) -> None:
    assert stub_problems(source_of(version, V2_WORKER)) == [], version


def test_the_stub_check_sees_a_stub_that_reads_more() -> None:
    """Negative control: the 0.5.17 stub made to read the batch's request indices is reported."""
    source = source_of(ZERO_STEP[-1], V2_WORKER)
    at = source.index("def _stub_skipped_draft_extend")
    changed = source[:at] + source[at:].replace("batch.seq_lens.shape[0]", "batch.req_pool_indices.shape[0]", 1)
    assert changed != source and stub_problems(changed) != []


@pytest.mark.releases
@pytest.mark.parametrize("version", OWN_FALLBACK_DIRECT + ZERO_STEP)
def test_nothing_writes_the_stubs_in_place(version: str) -> None:
    """The views handed out each iteration are of one set: a write through one would reach all
    (0.5.12 covers v1's lean step too, whose next draft input carries the same stand-ins)."""
    from tests.patches.test_lean_verify_releases import inplace_write_problems

    with zipfile.ZipFile(releases.wheel(version)) as archive:
        sources = {
            n: archive.read(n).decode()
            for n in archive.namelist()
            if n.endswith(".py") and n.startswith(("sglang/srt/managers/", "sglang/srt/speculative/"))
        }
    writes = {
        name: hits
        for name, source in sources.items()
        if (
            hits := [
                h
                for h in inplace_write_problems(source, STUB_FIELDS)
                if not h.split(": ", 1)[1].startswith(NOT_THE_STUBS)
            ]
        )
    }
    assert writes == {}, f"{version}: in-place writes to a stub field: {writes}"


def overwrite_the_shared_buffers(twin: ZeroStepTwin) -> None:
    """What the next iteration's target replay does to input buffers pooled with the twin's."""
    for name in v2.DirectKVWrite.INPUTS:
        store = getattr(twin.buffers, name).store
        store[:] = [7] * len(store)


def test_staged_rows_survive_another_runner_filling_the_pooled_buffers() -> None:
    twin, pool, direct = batched(2)
    first, second = step_of([A, B, C], 0), step_of([A, B, C], 1)
    direct.write(*first)
    overwrite_the_shared_buffers(twin)  # between the staged iteration and the flush
    direct.write(*second)
    assert twin.log == ["replay 2"] and without_padding(pool) == expected_kv(first, second)


def test_rows_staged_in_the_twins_own_buffers_would_be_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control for the test above: staging in the pooled buffers themselves."""
    twin, pool, direct = batched(2)
    monkeypatch.setattr(direct, "_staging", lambda: direct.buffers)
    first, second = step_of([A, B, C], 0), step_of([A, B, C], 1)
    direct.write(*first)
    overwrite_the_shared_buffers(twin)
    direct.write(*second)
    assert without_padding(pool) != expected_kv(first, second)


@pytest.mark.usefixtures("sglang_side")
@pytest.mark.parametrize(
    ("setting", "value", "words"),
    [
        ("disaggregation_mode", "decode", "PD disaggregation"),  # both move draft KV outside the forwards
        ("enable_hierarchical_cache", True, "a hierarchical cache"),
        ("tp_size", 2, "tensor parallelism"),  # not run there
        (None, None, "a draft KV pool without per-layer"),  # the start-up check could not read it
    ],
)
def test_batching_stays_off_where_it_is_not_safe_or_cannot_be_checked(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, setting: str | None, value: Any, words: str
) -> None:
    monkeypatch.setenv(v2.KV_BATCH_ENV, "4")
    twin = ZeroStepTwin(MHATokenToKVPool([]), [], width=4)
    policy, _, worker = policy_with(runtime.DRAFT_KV_DIRECT, twin)
    if setting is not None:
        setattr(worker.server_args, setting, value)
        monkeypatch.setattr(v2.RoundingProbe, "of", staticmethod(lambda twin: Probe(twin.pool)))
    policy.log = True
    with caplog.at_level(logging.INFO, logger=v2.logger.name):
        policy._build_direct()
    assert policy.draft_kv.direct is not None and policy.draft_kv.direct.batch_steps == 1
    assert "forward_batch_generation" not in vars(policy.worker)
    assert f"DYNSPEC_KV_BATCH is not used with {words}" in caplog.text
    assert twin.log == []  # no check ran


@pytest.mark.usefixtures("sglang_side")
def test_a_decode_with_an_extend_in_the_batch_writes_the_staged_rows_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stock entry takes its prefill branch for ``is_extend_in_batch`` too (0.5.17 eagle_worker_v2.py:1106)."""
    policy, draft_worker, twin = batched_policy(monkeypatch, 4)
    draft_worker._draft_extend_for_decode(*step_of([A, B, C], 0))
    policy.worker.forward_batch_generation(SimpleNamespace(forward_mode=Decode(True), is_extend_in_batch=True))
    assert twin.log == ["replay 2", "forward decode"]


@pytest.mark.usefixtures("sglang_side")
def test_a_checked_twin_batches_and_says_which_graphs_round_alike(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Control for the test above: a single-GPU worker whose pool the check can read."""
    monkeypatch.setenv(v2.KV_BATCH_ENV, "4")
    monkeypatch.setattr(v2.RoundingProbe, "of", staticmethod(lambda twin: Probe(twin.pool)))
    pool = MHATokenToKVPool([])
    twin = ZeroStepTwin(pool, [], width=4)
    twin.rounds_off = {8: 1}
    policy, _, _ = policy_with(runtime.DRAFT_KV_DIRECT, twin)
    policy.worker.forward_batch_generation = Forwarding(pool, [])
    policy.log = True
    with caplog.at_level(logging.INFO, logger=v2.logger.name):
        policy._build_direct()
    assert policy.draft_kv.direct is not None and policy.draft_kv.direct.batch_steps == 4
    assert policy.draft_kv.direct.rounding == [0, 0, 1]
    assert "writes the draft KV of up to 4 fallback iterations per replay, in graphs that round" in caplog.text
    assert "checked at start-up: 2-4:0 | 8:1)" in caplog.text


# -- v1 (0.5.12): the draft extend after the verify fed directly ------------------------------------


class EagleDraftExtendInput:
    """0.5.12's verify output for the extend: one accepted token per request in a fallback
    iteration. ``prepare_extend_after_decode`` does what the release's does: the batch takes its
    input ids, post-verify lengths and pool indices; its kernel writes each accepted token's
    position (the length before it) and the bonus token (the last accepted)."""

    def __init__(self, extend: Extend, accepted: list[int] | None = None) -> None:
        self.input_ids = Tensor(list(extend.tokens))
        self.input_ids.device = "cuda:0"  # type: ignore[attr-defined]
        self.hidden_states = Tensor(list(extend.hidden), HIDDEN_WIDTH)
        self.num_accept_tokens_cpu = accepted or [1] * len(extend.tokens)
        self.seq_lens = Tensor([position + 1 for position in extend.positions])
        self.seq_lens_cpu = "filtered lengths on the CPU"
        self.req_pool_indices = "filtered pool indices"
        self.positions: Any = None
        self.bonus_tokens: Any = None

    def prepare_extend_after_decode(self, batch: Any, speculative_num_steps: int) -> None:
        batch.input_ids = self.input_ids
        batch.extend_lens = self.num_accept_tokens_cpu
        batch.seq_lens, batch.seq_lens_cpu, batch.req_pool_indices = (
            self.seq_lens,
            self.seq_lens_cpu,
            self.req_pool_indices,
        )
        batch.return_logprob = batch.return_hidden_states = False
        self.positions = Tensor([length - 1 for length in self.seq_lens.values])
        self.bonus_tokens = Tensor(list(self.input_ids.values))


V1_MODULE = types.ModuleType("fake_eagle_worker")
V1_MODULE.EagleDraftInput = EagleDraftInput  # type: ignore[attr-defined]
V1_MODULE.EagleDraftExtendInput = EagleDraftExtendInput  # type: ignore[attr-defined]


def stock_graph(**options: Any) -> Any:
    """v1's stock draft-extend graph runner as the direct write compares the twin with it."""
    return SimpleNamespace(**{"capture_bs": list(SIZES), "num_tokens_per_bs": 4, **options})


class V1Worker:
    """0.5.12's ``EAGLEWorker``: its stock extend after the verify logs itself."""

    speculative_num_steps = 0  # the fallback's one-token state

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.server_args = SimpleNamespace()
        self.cuda_graph_runner_for_draft_extend = stock_graph()

    def forward_draft_extend_after_decode(self, batch: Any) -> str:
        self.log.append("stock extend")
        return "stock"


V1Worker.__module__ = V1_MODULE.__name__


def test_v1s_auto_is_kv_direct_where_the_twin_is_fed_directly_and_full_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, V1_MODULE.__name__, V1_MODULE)
    assert runtime.v1_draft_kv_default(V1Worker([])) == runtime.DRAFT_KV_DIRECT
    monkeypatch.delattr(V1_MODULE, "EagleDraftExtendInput")  # before 0.5.12: the extend takes the draft input
    assert runtime.v1_draft_kv_default(V1Worker([])) == runtime.DRAFT_KV_FULL


def v1_batch_of(extend: Extend = EXTEND, accepted: list[int] | None = None) -> Any:
    """The batch as v1's verify leaves it for the extend: its ``spec_info`` the extend input, its
    ``out_cache_loc`` the accepted tokens' slots, its own lengths (unfiltered) still its own."""
    return SimpleNamespace(
        forward_mode=Mode(False),
        spec_info=EagleDraftExtendInput(extend, accepted),
        out_cache_loc=Tensor(list(extend.slots)),
        seq_lens="the batch's lengths",
        seq_lens_cpu="the batch's lengths on the CPU",
        req_pool_indices="the batch's pool indices",
        return_logprob=True,
    )


@pytest.fixture
def v1_side(monkeypatch: pytest.MonkeyPatch, sglang_side: None, fake_torch: None) -> None:
    monkeypatch.setitem(sys.modules, V1_MODULE.__name__, V1_MODULE)
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.dynspec_v2", v2)
    forward_batch_info = types.ModuleType("sglang.srt.model_executor.forward_batch_info")
    forward_batch_info.CaptureHiddenMode = SimpleNamespace(LAST="LAST")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, forward_batch_info.__name__, forward_batch_info)


def v1_fallback_with(
    mode: str = runtime.DRAFT_KV_DIRECT, **stock_options: Any
) -> tuple[runtime.DynspecFallback, FallbackTwin, V1Worker]:
    twin = FallbackTwin(MHATokenToKVPool([]), [])
    for name, value in stock_options.items():  # the twin is built as the stock graph was
        setattr(twin, name, value)
    draft_kv = fallback_draft_kv()
    draft_kv.mode, draft_kv.graph = mode, twin
    fallback = runtime.DynspecFallback(runtime.SwitchController(4, min_steps=1, log=False), None, draft_kv)  # type: ignore[arg-type]
    worker = V1Worker(twin.log)
    worker.cuda_graph_runner_for_draft_extend = stock_graph(**stock_options)
    fallback.feed_twin_directly(worker, log=False)
    fallback._step, fallback.in_fallback = runtime.FALL_BACK, True
    return fallback, twin, worker


@pytest.mark.usefixtures("v1_side")
def test_v1_fallback_writes_the_accepted_tokens_kv_directly_and_hands_on_the_bonus_tokens() -> None:
    fallback, twin, worker = v1_fallback_with()
    batch = v1_batch_of()
    next_input = worker.forward_draft_extend_after_decode(batch)
    # The stock extend's graph for 3 requests: this pool has no k_buffer list for the start-up check.
    assert twin.log == ["replay 4"] and without_padding(twin.pool) == full_forward_kv(EXTEND)
    assert isinstance(next_input, EagleDraftInput) and next_input.bonus_tokens.values == EXTEND.tokens
    assert next_input.capture_hidden_mode == "LAST"
    assert next_input.topk_p == Ones((3, 1), "torch.float32", "cuda:0")  # what the eager KV-only extend leaves
    assert next_input.hidden_states == Zeros((3, DRAFT_WIDTH), "torch.bfloat16", "cuda:0")
    # What the stock function leaves on the batch: its own lengths and pool indices back, the extend's ids.
    assert (batch.seq_lens, batch.seq_lens_cpu, batch.req_pool_indices, batch.return_logprob) == (
        "the batch's lengths",
        "the batch's lengths on the CPU",
        "the batch's pool indices",
        True,
    )
    assert batch.input_ids is batch.spec_info.input_ids and batch.return_hidden_states is False


@pytest.mark.usefixtures("v1_side")
def test_v1_writing_at_the_post_verify_lengths_would_put_the_kv_one_position_late(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Negative control for the test above: the kernel's positions, not the batch's new lengths."""
    fallback, twin, worker = v1_fallback_with()
    batch = v1_batch_of()
    monkeypatch.setattr(
        EagleDraftExtendInput,
        "prepare_extend_after_decode",
        lambda self, batch, speculative_num_steps: (
            setattr(batch, "input_ids", self.input_ids),
            setattr(self, "positions", self.seq_lens),
            setattr(self, "bonus_tokens", self.input_ids),
        ),
    )
    worker.forward_draft_extend_after_decode(batch)
    assert without_padding(twin.pool) != full_forward_kv(EXTEND)


@pytest.mark.usefixtures("v1_side")
@pytest.mark.parametrize(("step", "inside"), [(runtime.SPECULATE, False), (runtime.RESUME, True)])
def test_v1_speculation_and_resume_run_the_stock_extend(step: str, inside: bool) -> None:
    fallback, twin, worker = v1_fallback_with()
    fallback._step, fallback.in_fallback = step, inside
    assert worker.forward_draft_extend_after_decode(v1_batch_of()) == "stock" and twin.log == ["stock extend"]


@pytest.mark.usefixtures("v1_side")
@pytest.mark.parametrize("case", ["two-accepted", "no-hidden", "idle", "another-input", "too-many-rows", "slots"])
def test_v1_a_batch_the_direct_write_cannot_take_goes_to_the_stock_extend_untouched(case: str) -> None:
    fallback, twin, worker = v1_fallback_with()
    batch = v1_batch_of(accepted=[1, 2, 1] if case == "two-accepted" else None)
    if case == "no-hidden":
        batch.spec_info.hidden_states = None
    elif case == "idle":
        batch.forward_mode = Mode(True)
    elif case == "another-input":
        batch.spec_info.__class__ = type("EagleDraftInput", (EagleDraftExtendInput,), {})
    elif case == "too-many-rows":
        n = max(SIZES) * 4 + 1
        batch = v1_batch_of(Extend(list(range(1, n + 1)), list(range(n)), list(range(100, 100 + n))))
    elif case == "slots":
        batch.out_cache_loc = Tensor([900, 901])
    assert worker.forward_draft_extend_after_decode(batch) == "stock" and twin.log == ["stock extend"]
    assert batch.seq_lens == "the batch's lengths" and not hasattr(batch, "input_ids")  # not prepared


@pytest.mark.usefixtures("v1_side")
@pytest.mark.parametrize("mode", [runtime.DRAFT_KV_GRAPH, runtime.DRAFT_KV_ONLY, runtime.DRAFT_KV_FULL])
def test_v1_feeds_the_twin_directly_only_under_kv_direct(mode: str) -> None:
    fallback, _, worker = v1_fallback_with(mode)
    assert fallback.draft_kv.direct is None and "forward_draft_extend_after_decode" not in vars(worker)


@pytest.mark.usefixtures("v1_side")
def test_v1_before_0_5_12_kv_direct_is_kv_graph_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delattr(V1_MODULE, "EagleDraftExtendInput")
    twin = FallbackTwin(MHATokenToKVPool([]), [])
    draft_kv = fallback_draft_kv()
    draft_kv.graph = twin
    fallback = runtime.DynspecFallback(runtime.SwitchController(4, min_steps=1, log=False), None, draft_kv)  # type: ignore[arg-type]
    worker = V1Worker(twin.log)
    with caplog.at_level(logging.INFO, logger=runtime.logger.name):
        fallback.feed_twin_directly(worker, log=True)
    assert draft_kv.direct is None and "forward_draft_extend_after_decode" not in vars(worker)
    assert "takes no EagleDraftExtendInput; kv-direct is kv-graph" in caplog.text


def stock_graph_write(sizes: list[int], rounding: list[int] | None) -> v2.StockGraphDirectWrite:
    """A ``StockGraphDirectWrite`` holding only captured sizes, width 4 and a check's numbers."""
    direct = v2.StockGraphDirectWrite.__new__(v2.StockGraphDirectWrite)  # no twin: only what the rule reads
    direct.sizes, direct.width, direct.rounding = sizes, 4, rounding
    return direct


ROUNDING_SIZES = [1, 2, 4, 8, 16, 32]


@pytest.mark.parametrize(
    ("rounding", "expected"),
    [
        # graph 8 rounds as 32 (another kernel at 32 and 128 rows), 16 as the smaller ones
        ([0, 0, 0, 1, 0, 1], {3: 0, 5: 3, 8: 3, 12: 2, 16: 2, 17: 3, 32: 3}),
        ([0, 0, 0, 1, -5, 1], {12: 4, 16: 4, 20: 3}),  # 16 rounds rows by where they sit: only itself
        (None, {3: 2, 12: 4, 16: 4, 20: 5, 32: 5}),  # nothing checked: the stock graph itself
    ],
    ids=["checked", "by-row", "unchecked"],
)
def test_v1_replays_the_smallest_graph_that_rounds_as_the_stock_extends(
    rounding: list[int] | None, expected: dict[int, int]
) -> None:
    direct = stock_graph_write(ROUNDING_SIZES, rounding)
    assert {n: direct.stock_alike(n) for n in expected} == expected
    for n in range(1, ROUNDING_SIZES[-1] + 1):
        chosen, stock = direct.stock_alike(n), direct.stock_index(n)
        assert ROUNDING_SIZES[chosen] * 4 >= n and chosen <= stock  # holds the rows, no larger than the stock graph
        if rounding is not None and rounding[stock] >= 0:
            assert rounding[chosen] == rounding[stock]
            assert all(rounding[i] != rounding[stock] for i in range(direct._graph_for(n), chosen))


def test_v1_packing_the_rows_would_replay_a_graph_that_rounds_apart_from_the_stock_one() -> None:
    """Negative control for the rule above: the own fallback's packing (the smallest graph that holds
    the rows) lands in another rounding group at 5 - 8 requests."""
    rounding = [0, 0, 0, 1, 0, 1]
    direct = stock_graph_write(ROUNDING_SIZES, rounding)
    apart = [n for n in range(1, 33) if rounding[direct._graph_for(n)] != rounding[direct.stock_index(n)]]
    assert apart == [5, 6, 7, 8]  # packed into graph 2 (group 0) where the stock graph is 8 (group 1)


@pytest.mark.usefixtures("fake_torch")
@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("checked", "checked at start-up, by requests of 4 rows: 2-4:0 | 8:1"),
        ("tp", "the stock graph itself: no start-up check with tensor parallelism"),
        ("no-probe", "the stock graph itself: no start-up check with a draft KV pool without per-layer k_buffer"),
        (
            "check-failed",
            "the stock graph itself: no start-up check with a start-up rounding check that failed (RuntimeError('out of memory'))",
        ),
        (
            "small-pool",
            "the stock graph itself: no start-up check with a draft KV pool of 32 slots (the start-up check writes slots 1 to 32)",
        ),
    ],
)
def test_v1_start_up_picks_the_graphs_and_says_how(
    case: str, said: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    twin = FallbackTwin(MHATokenToKVPool([]), [])
    worker = Worker()
    worker.server_args = SimpleNamespace(tp_size=2 if case == "tp" else 1)
    worker.cuda_graph_runner_for_draft_extend = stock_graph()  # type: ignore[attr-defined]
    probe = (
        None if case == "no-probe" else Probe(twin.pool, slots=32 if case == "small-pool" else 33)
    )  # 8 x 4 rows from slot 1
    monkeypatch.setattr(v2.RoundingProbe, "of", classmethod(lambda cls, twin: probe))

    def check(self: v2.DirectKVWrite, probe: Any) -> list[int]:
        if case == "check-failed":
            self.rounding = [9, 9, 9]  # a half-done check must not count
            raise RuntimeError("out of memory")
        self.rounding = [0, 0, 1]  # graph 8 rounds apart
        return self.rounding

    monkeypatch.setattr(v2.DirectKVWrite, "check_rounding", check)
    with caplog.at_level(logging.INFO, logger=v2.logger.name):
        direct, why_not = v2.StockGraphDirectWrite.build(twin, worker, fallback_draft_kv(), log=True)
    assert isinstance(direct, v2.StockGraphDirectWrite), why_not
    assert said in caplog.text
    # 5 requests: the stock graph is 8; packed they would fit graph 2, which rounds apart from 8 when checked.
    assert direct.replay_index[5] == 2
    assert direct.replay_index[3] == (0 if case == "checked" else 1)


@pytest.mark.usefixtures("fake_torch")
@pytest.mark.parametrize(
    ("stock", "why"),
    [
        (stock_graph(capture_bs=[2, 4]), "differ from the stock draft-extend graphs in their sizes or width"),
        (stock_graph(num_tokens_per_bs=2), "differ from the stock draft-extend graphs in their sizes or width"),
        (stock_graph(disable_padding=True), "differ from the stock draft-extend graphs in their sizes or width"),
        (None, "differ from the stock draft-extend graphs in their sizes or width (NoneType)"),
    ],
    ids=["sizes", "width", "padding", "no-stock-graph"],
)
def test_v1_a_twin_that_does_not_stand_for_the_stock_graph_is_not_fed_directly(stock: Any, why: str) -> None:
    twin, worker = FallbackTwin(MHATokenToKVPool([]), []), Worker()
    worker.cuda_graph_runner_for_draft_extend = stock_graph()  # type: ignore[attr-defined]
    assert v2.StockGraphDirectWrite.build(twin, worker, fallback_draft_kv())[0] is not None  # the control
    worker.cuda_graph_runner_for_draft_extend = stock  # type: ignore[attr-defined]
    direct, why_not = v2.StockGraphDirectWrite.build(twin, worker, fallback_draft_kv())
    assert direct is None and why in why_not


@pytest.mark.usefixtures("v1_side")
def test_v1_without_cuda_graph_padding_a_count_with_no_graph_goes_to_the_stock_extend() -> None:
    """With --disable-cuda-graph-padding the stock extend runs a count it has no graph for eagerly."""
    fallback, twin, worker = v1_fallback_with(disable_padding=True)
    assert worker.forward_draft_extend_after_decode(v1_batch_of()) == "stock" and twin.log == [
        "stock extend"
    ]  # 3 requests
    twin.log.clear()  # the control: 4 requests have a graph of their own
    assert worker.forward_draft_extend_after_decode(v1_batch_of(FOUR)) != "stock" and twin.log == ["replay 4"]


@pytest.mark.usefixtures("v1_side")
def test_v1_a_batch_beyond_the_largest_graph_goes_to_the_stock_extend() -> None:
    """The stock extend runs such a batch eagerly; the twin's packed rows would round as no eager GEMM."""
    fallback, twin, worker = v1_fallback_with()
    n = max(SIZES) + 1  # 9 requests: 36 rows fit the size-8 graph's 32 only packed
    batch = v1_batch_of(Extend(list(range(1, n + 1)), list(range(n)), list(range(100, 100 + n))))
    assert worker.forward_draft_extend_after_decode(batch) == "stock" and twin.log == ["stock extend"]
    n = max(SIZES)  # the control: 8 requests replay the stock graph for 8
    twin.log.clear()
    assert (
        worker.forward_draft_extend_after_decode(
            v1_batch_of(Extend(list(range(1, n + 1)), list(range(n)), list(range(100, 100 + n))))
        )
        != "stock"
    )
    assert twin.log == ["replay 8"]


V1_DIRECT = ["0.5.12"]
V1_BEFORE = [v for v in RELEASES if Version("0.4.10.post2") <= Version(v) < Version("0.5.12")]


@pytest.mark.releases
@pytest.mark.parametrize("version", V1_DIRECT)
def test_v1_extend_after_decode_is_what_the_direct_path_mirrors(version: str) -> None:
    """0.5.12: the extend after the verify backs up and restores four batch fields, prepares through
    ``prepare_extend_after_decode`` (the batch's ids, lengths and pool indices; its kernel's
    positions ``seq_len - accept_len + i`` and last accepted token as bonus), and builds the next
    draft input from the bonus tokens and the graph's three outputs; the verify keeps only the
    accepted tokens' slots in ``out_cache_loc``."""
    worker = class_named(source_of(version, V1_WORKER), "EAGLEWorker")
    extend = ast.unparse(method_def(worker, "forward_draft_extend_after_decode"))
    for field in ("seq_lens", "seq_lens_cpu", "req_pool_indices", "return_logprob"):
        assert f"batch.{field} = {field}_backup" in extend, field
    assert "draft_extend_input.num_tokens_per_req = self.speculative_num_steps + 1" in extend
    assert (
        "draft_extend_input.prepare_extend_after_decode(batch, speculative_num_steps=self.speculative_num_steps)"
        in extend
    )
    built = re.search(r"next_draft_input = EagleDraftInput\((.*?)\)\n", extend, re.S)
    assert built is not None
    assert re.findall(r"(\w+)=", built.group(1)) == [
        "bonus_tokens",
        "hidden_states",
        "topk_p",
        "topk_index",
        "capture_hidden_mode",
    ]
    assert "bonus_tokens=draft_extend_input.bonus_tokens" in built.group(1)
    info = source_of(version, EAGLE_INFO)
    prepare = ast.unparse(method_def(class_named(info, "EagleDraftExtendInput"), "prepare_extend_after_decode"))
    assert all(
        line in prepare
        for line in (
            "batch.input_ids = self.input_ids",
            "batch.seq_lens = self.seq_lens",
            "batch.return_hidden_states = False",
        )
    )
    kernel = source_of(version, SPEC_UTILS)
    assert "tl.store(positions_ptr + offsets, seq_length - accept_len + offsets, mask)" in kernel
    assert (
        "accept_len_cumsum += accept_len - 1" in kernel
        and "bonus_token = tl.load(accept_tokens + accept_len_cumsum)" in kernel
    )
    assert ".add_(" not in prepare and ".copy_(" not in prepare  # it assigns; the saved fields stay as they were
    assert "CaptureHiddenMode.NULL if self.speculative_algorithm.is_standalone() else CaptureHiddenMode.LAST" in extend
    verify = ast.unparse(method_def(class_named(info, "EagleVerifyInput"), "verify"))
    assert (
        "batch.spec_info.hidden_states[accept_index]" in verify
        and "batch.spec_info.hidden_states[unfinished_accept_index]" in verify
    )
    assert "num_accept_tokens_list = num_accept_tokens_cpu.tolist()" in verify  # a list: sum() and len() read it
    assert "batch.out_cache_loc = batch.out_cache_loc[accept_index]" in verify
    assert "input_ids=accept_tokens" in verify and "input_ids=predict[unfinished_accept_index]" in verify
    decode = ast.unparse(method_def(worker, "forward_batch_generation"))
    assert "next_draft_input = self.forward_draft_extend_after_decode(batch)" in decode
    assert "EagleDraftExtendInput" in source_of(version, V1_WORKER).split("class EAGLEWorker")[0]  # a module global


@pytest.mark.releases
@pytest.mark.parametrize("version", V1_DIRECT)
def test_v1_stock_extend_replays_the_graph_for_its_request_count(version: str) -> None:
    """What ``StockGraphDirectWrite`` rounds as: 0.5.12's v1 extend after the verify replays its
    graph whenever the request count fits (one token per request in a fallback iteration too),
    the graph for that count, the tokens copied to the front of its rows; dynspec's v1 fallback
    leaves that graph in place for the full extend (the own fallback puts it aside, ``_SavedSteps``)."""
    runner = class_named(source_of(version, EXTEND_RUNNER), "EAGLEDraftExtendCudaGraphRunner")
    can_run = ast.unparse(method_def(runner, "can_run"))
    assert "cuda_graph_bs = forward_batch.seq_lens.numel()" in can_run
    # with --disable-cuda-graph-padding only a count with a graph of its own (StockGraphDirectWrite.fits)
    assert "cuda_graph_bs in self.graphs if self.disable_padding else cuda_graph_bs <= self.max_bs" in can_run
    replay = ast.unparse(method_def(runner, "replay"))
    assert "index = bisect.bisect_left(self.capture_bs, raw_bs)" in replay and "bs = self.capture_bs[index]" in replay
    assert "buffers.input_ids[:num_tokens].copy_(forward_batch.input_ids)" in replay
    assert "buffers.hidden_states[:num_tokens].copy_(forward_batch.spec_info.hidden_states)" in replay
    assert "self.num_tokens_per_bs = self.speculative_num_steps + 1" in ast.unparse(method_def(runner, "__init__"))
    extend = ast.unparse(
        method_def(class_named(source_of(version, V1_WORKER), "EAGLEWorker"), "forward_draft_extend_after_decode")
    )
    assert "self.cuda_graph_runner_for_draft_extend.can_run(forward_batch)" in extend
    fall_back = inspect.getsource(runtime.DynspecFallback.fall_back)
    assert "cuda_graph_runner_for_draft_extend" not in fall_back and "_SavedSteps" not in fall_back
    assert "self.draft.cuda_graph_runner_for_draft_extend = None" in inspect.getsource(v2._SavedSteps.one_token)


@pytest.mark.releases
@pytest.mark.parametrize("version", V1_BEFORE)
def test_v1_before_0_5_12_the_worker_module_has_no_extend_input_so_kv_direct_is_kv_graph(version: str) -> None:
    if not has_member(version, V1_WORKER):
        pytest.skip(f"{version} has no v1 worker")
    assert "EagleDraftExtendInput" not in source_of(version, V1_WORKER)


def test_a_graph_whose_later_rows_round_differently_takes_no_batch() -> None:
    """Batching moves an iteration's rows to later rows of the graph: where that changes their bits,
    the graph gets a number of its own, and neither it nor a smaller graph batches into it."""
    twin, _, direct = stack(width=4)
    twin.rounds_late_rows = {8: 8}  # the graph for 8: rows 8 - 31 round differently from rows 0 - 7
    assert direct.check_rounding(Probe(twin.pool)) == [0, 0, -3] and direct.rounding_groups() == "2-4:0 | 8:by-row"
    assert direct.same_rounding_rows(20) == 0  # one iteration of 20 requests is the graph for 8's
    assert direct.same_rounding_rows(3) == 16  # the graph for 2's batches up to the graph for 4


def test_the_check_compares_every_block_of_a_graph_not_only_the_first() -> None:
    """Negative control for the test above: a probe that read only the first block sees nothing."""
    twin, _, direct = stack(width=4)
    twin.rounds_late_rows = {8: 8}
    probe = Probe(twin.pool)
    first_only = lambda slots, block: Probe.signature(probe, slots[:block], block)  # noqa: E731
    probe.signature = first_only  # type: ignore[method-assign]
    assert direct.check_rounding(probe) == [0, 0, 0]


def test_a_graph_that_writes_nothing_does_not_pass_for_one_that_rounds_alike() -> None:
    twin, _, direct = stack(width=4)
    twin.rounds_off = {4: "nothing"}
    assert direct.check_rounding(Probe(twin.pool)) == [0, 1, 0]


def test_without_clearing_the_slots_a_graph_that_writes_nothing_inherits_the_last_ones_bits() -> None:
    """Negative control for the test above: with the slots holding what an earlier write left there
    (here a first check; at start-up, whatever the capture wrote), the silent graph passes."""
    twin, _, direct = stack(width=4)
    probe = Probe(twin.pool)
    assert direct.check_rounding(probe) == [0, 0, 0]
    twin.rounds_off = {4: "nothing"}
    probe.clear = lambda slots: None  # type: ignore[method-assign]
    assert direct.check_rounding(probe) == [0, 0, 0]


@pytest.mark.usefixtures("sglang_side")
def test_a_check_that_fails_leaves_one_iteration_per_replay_and_the_server_up(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(v2.KV_BATCH_ENV, "4")
    probe = Probe(MHATokenToKVPool([]))

    def broken(slots: Any, block: int) -> None:
        raise RuntimeError("CUDA error: an illegal memory access")

    probe.signature = broken  # type: ignore[assignment]
    monkeypatch.setattr(v2.RoundingProbe, "of", staticmethod(lambda twin: probe))
    policy, _, _ = policy_with(runtime.DRAFT_KV_DIRECT, ZeroStepTwin(probe.pool, [], width=4))
    policy.log = True
    with caplog.at_level(logging.INFO, logger=v2.logger.name):
        policy._build_direct()
    assert policy.draft_kv.direct is not None and policy.draft_kv.direct.batch_steps == 1
    assert "DYNSPEC_KV_BATCH is not used with a start-up rounding check that failed (RuntimeError(" in caplog.text


@pytest.mark.parametrize(
    ("attribute", "value"), [("k_scale_buffer", "scales"), ("kv_cache_layout", "hnd"), ("k_buffer", None)]
)
def test_the_probe_refuses_a_pool_whose_bits_it_would_not_read_whole(attribute: str, value: Any) -> None:
    pool = SimpleNamespace(k_buffer=["layer 0 K"], v_buffer=["layer 0 V"])
    twin = SimpleNamespace(model_runner=SimpleNamespace(token_to_kv_pool=pool))
    assert v2.RoundingProbe.of(twin) is not None  # the control
    setattr(pool, attribute, value)
    assert v2.RoundingProbe.of(twin) is None


@pytest.mark.usefixtures("v1_side")
def test_v1_a_write_refused_after_the_preparation_leaves_the_stock_extend_a_restored_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, Any] = {}

    def stock(batch: Any) -> str:
        seen.update(seq_lens=batch.seq_lens, return_logprob=batch.return_logprob, pool_indices=batch.req_pool_indices)
        return "stock"

    monkeypatch.setattr(V1Worker, "forward_draft_extend_after_decode", lambda self, batch: stock(batch))
    fallback, twin, worker = v1_fallback_with()
    assert fallback.draft_kv.direct is not None
    monkeypatch.setattr(fallback.draft_kv.direct, "write", lambda batch, result: False)
    assert worker.forward_draft_extend_after_decode(v1_batch_of()) == "stock"
    assert seen == {
        "seq_lens": "the batch's lengths",
        "return_logprob": True,
        "pool_indices": "the batch's pool indices",
    }


def test_the_tree_field_names_are_cached_per_class_and_no_worker_is_kept() -> None:
    """``tree_field_prefix`` runs every fallback iteration (a dataclass walk): cached. The start-up
    lookup of v1's next-draft input class takes a worker: not cached, so none is kept alive."""
    assert hasattr(runtime.tree_field_prefix, "cache_info")
    assert not hasattr(runtime.v1_next_draft_input_class, "cache_info")


@pytest.mark.releases
@pytest.mark.parametrize("version", [v for v in RELEASES if Version(v) >= Version("0.5.10")])
def test_the_mrope_flag_the_direct_write_refuses_is_where_it_looks(version: str) -> None:
    """Up to 0.5.13 the model runner has ``model_is_mrope`` (a property, then an attribute); later
    releases read it from the model config (``model_runner.model_config.model_is_mrope``): ``unfit``
    looks in both."""
    runner = source_of(version, MODEL_RUNNER)
    forward_batch = source_of(version, FORWARD_BATCH_INFO)
    on_runner = "self.model_is_mrope = " in runner or "def model_is_mrope(self)" in runner
    assert on_runner or "model_runner.model_config.model_is_mrope" in forward_batch, version


# -- DYNSPEC_CHECK_KV_BITS on v1: the wrapper hands the check its writes and the full extend -------------


class RecordingBitCheck:
    """Stands in for ``KVBitCheck`` (whose tensor code tests/patches/test_dynspec_rounding_torch.py runs)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, list[str], list[bool]]] = []

    def compare(self, slots: Any, writes: list[tuple[str, Any]], full_extend: Any) -> Any:
        self.calls.append((slots, [name for name, _ in writes], [write() for _, write in writes]))
        return full_extend()


@pytest.mark.usefixtures("v1_side")
def test_v1_under_the_bit_check_writes_directly_and_packed_then_keeps_the_full_extend() -> None:
    fallback, twin, worker = v1_fallback_with()
    check = RecordingBitCheck()
    fallback.bit_check = check
    batch = v1_batch_of()
    assert worker.forward_draft_extend_after_decode(batch) == "stock"  # the full extend's result stays
    [(slots, names, written)] = check.calls
    assert slots is batch.out_cache_loc and names == ["direct", "packed"] and written == [True, True]
    # graph 4 for 3 requests (no start-up check on this pool), then the packed one, then the stock extend
    assert twin.log == ["replay 4", f"replay {SIZES[0]}", "stock extend"]
    assert not fallback.draft_kv.direct.packed


@pytest.mark.usefixtures("v1_side")
@pytest.mark.parametrize(("step", "inside"), [(runtime.SPECULATE, False), (runtime.RESUME, True)])
def test_v1_under_the_bit_check_speculation_and_resume_are_not_checked(step: str, inside: bool) -> None:
    fallback, twin, worker = v1_fallback_with()
    fallback.bit_check = check = RecordingBitCheck()
    fallback._step, fallback.in_fallback = step, inside
    assert worker.forward_draft_extend_after_decode(v1_batch_of()) == "stock" and check.calls == []


@pytest.mark.usefixtures("v1_side")
def test_v1_bit_check_refuses_a_pool_whose_bits_it_cannot_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(v2.KV_BITS_ENV, "/tmp/bits.jsonl")
    with pytest.raises(ValueError, match="DYNSPEC_CHECK_KV_BITS: no KV-only graph fed directly"):
        v1_fallback_with()  # this pool has no per-layer buffers
    monkeypatch.delenv(v2.KV_BITS_ENV)
    assert v1_fallback_with()[0].bit_check is None  # unset: nothing is built


def test_the_bit_check_is_refused_on_the_v2_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    v2._refuse_bit_check()  # unset: nothing to refuse
    monkeypatch.setenv(v2.KV_BITS_ENV, "/tmp/bits.jsonl")
    with pytest.raises(ValueError, match="built for v1"):
        v2._refuse_bit_check()
    import inspect

    for attach in (v2.attach_fallback, v2.attach_zero_step_policy):
        assert "_refuse_bit_check()" in inspect.getsource(attach)


@pytest.mark.usefixtures("v1_side")
def test_v1_bit_check_leaves_out_a_control_that_would_replay_the_direct_writes_graph() -> None:
    """One request: the packed graph is the stock one, so a control there could not differ."""
    fallback, twin, worker = v1_fallback_with()
    fallback.bit_check = check = RecordingBitCheck()
    worker.forward_draft_extend_after_decode(v1_batch_of(Extend([5], [40], [300])))
    assert [names for _, names, _ in check.calls] == [["direct"]]


@pytest.mark.usefixtures("v1_side")
def test_v1_bit_check_skips_an_iteration_whose_slots_are_not_the_extends() -> None:
    """Requests that finished in the verify leave their slots in out_cache_loc but no row in the
    extend: zeroing those would leave the reference's K/V unlike the full extend's."""
    fallback, twin, worker = v1_fallback_with()
    fallback.bit_check = check = RecordingBitCheck()
    batch = v1_batch_of()
    batch.out_cache_loc = Tensor(list(EXTEND.slots) + [777])
    assert worker.forward_draft_extend_after_decode(batch) == "stock" and check.calls == []


@pytest.mark.usefixtures("sglang_side")
@pytest.mark.parametrize(("setting", "beside"), [("", True), ("0", False), ("1", True)])
def test_on_0_5_14_the_stream_is_on_unless_0(
    monkeypatch: pytest.MonkeyPatch, streams: LaggingStreams, setting: str, beside: bool
) -> None:
    monkeypatch.setenv(v2.KV_STREAM_ENV, setting)
    policy, draft_worker, twin = batched_policy(monkeypatch, 1, streams)
    assert (policy.draft_kv.direct.side is not None) is beside
    draft_worker._draft_extend_for_decode(*step_of([A, B, C], 0))
    assert (twin.log == []) is beside  # beside the worker, the replay waits in the side stream
    policy.worker.forward_batch_generation(SimpleNamespace(forward_mode=Decode(True)))
    assert twin.log == ["replay 2", "forward decode"]


@pytest.mark.usefixtures("sglang_side")
def test_on_0_5_14_batched_rows_on_the_side_stream_are_written_before_a_prefill_takes_their_slot(
    monkeypatch: pytest.MonkeyPatch, streams: LaggingStreams
) -> None:
    policy, draft_worker, twin = batched_policy(monkeypatch, 4, streams)
    assert policy.draft_kv.direct.side is not None and policy.draft_kv.direct.batch_steps == 4
    draft_worker._draft_extend_for_decode(*step_of([A, B, C], 0, slots=[900, 901, 902]))
    policy.worker.forward_batch_generation(SimpleNamespace(forward_mode=Decode(False), prefill_slots=[902]))
    assert twin.log == ["replay 2", "forward prefill"] and twin.pool.kv[(0, 902)] == ("prefill", 902)


@pytest.mark.usefixtures("sglang_side")
def test_on_0_5_14_without_the_join_the_lagging_replay_overwrites_the_new_owners_kv(
    monkeypatch: pytest.MonkeyPatch, streams: LaggingStreams
) -> None:
    """The control: the flush puts the rows on the side stream, and nothing makes the prefill wait."""
    monkeypatch.setattr(v2.SideStream, "join", lambda self: None)
    policy, draft_worker, twin = batched_policy(monkeypatch, 4, streams)
    draft_worker._draft_extend_for_decode(*step_of([A, B, C], 0, slots=[900, 901, 902]))
    policy.worker.forward_batch_generation(SimpleNamespace(forward_mode=Decode(False), prefill_slots=[902]))
    streams.drain()
    assert twin.pool.kv[(0, 902)] != ("prefill", 902)


@pytest.mark.usefixtures("sglang_side")
def test_on_0_5_14_resume_waits_for_the_staged_rows_before_the_stock_extend(
    monkeypatch: pytest.MonkeyPatch, streams: LaggingStreams
) -> None:
    policy, draft_worker, twin = batched_policy(monkeypatch, 4, streams)
    draft_worker._draft_extend_for_decode(*step_of([A, B, C], 0))
    policy._step = runtime.RESUME
    draft_worker._draft_extend_for_decode(*step_of([A, B, C], 1))
    assert twin.log == ["replay 2", "stock extend"]


@pytest.mark.releases
@pytest.mark.parametrize("version", OWN_FALLBACK_DIRECT + ZERO_STEP)
def test_the_worker_keeps_its_plan_stream_where_write_beside_looks_for_it(version: str) -> None:
    """``write_beside`` refuses a side stream where ``worker.plan_stream`` is not None. Every release
    with a direct write sets that attribute in ``EAGLEWorkerV2.__init__`` from ``_get_plan_stream``
    (in the worker's module) or ``get_plan_stream`` (in spec_utils, later releases), which gives
    None unless SGLANG_ENABLE_OVERLAP_PLAN_STREAM is set, so the refusal reads the release's switch."""
    worker_source = source_of(version, V2_WORKER)
    init = ast.unparse(method_def(class_named(worker_source, "EAGLEWorkerV2"), "__init__"))
    assignment = r"self\.plan_stream, self\.plan_stream_ctx = (_?get_plan_stream)\(self\.device\)"
    call = re.search(assignment, init)
    assert call is not None, version
    assert re.search(assignment, init.replace("self.plan_stream,", "self.stream,")) is None  # the pattern's control
    home = worker_source if call.group(1) == "_get_plan_stream" else source_of(version, SPEC_UTILS)
    getter = next(n for n in ast.walk(ast.parse(home)) if isinstance(n, ast.FunctionDef) and n.name == call.group(1))
    body = ast.unparse(getter)
    assert (
        "if envs.SGLANG_ENABLE_OVERLAP_PLAN_STREAM.get():" in body and "return (None, contextlib.nullcontext())" in body
    ), version
