"""``DirectKVWrite``'s start-up rounding check and batched write on real torch tensors (CPU).

The other direct-write tests use list-backed fakes; these run ``RoundingProbe``'s own tensor code
(seeded probe rows, index writes, byte views, block comparisons) and ``write`` / ``flush`` against
a twin whose replay is a bf16 GEMM into a real K/V buffer. A GPU is what decides which kernels
round alike (``dynspec proof``'s exact_kv); here the twin's "kernels" are told to round apart by
batch size or by row. Needs torch, which ``make test`` does not install: skipped without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from patches.runtime import dynspec_v2 as v2
from tests.patches.fake_sampler import SixParameterSampler

torch = pytest.importorskip("torch")

SIZES = [1, 2, 4, 8, 12, 16]
WIDTH = 4
HIDDEN, HEADS, DIM = 48, 2, 8
SLOTS = 1024


class Twin:
    """A KV-only twin: per row, K/V = (embedding + hidden @ W) in bf16, written to the row's slot.
    ``apart``: sizes whose GEMM rounds differently; ``late_rows``: sizes whose rows from 8 on do."""

    def __init__(self, apart: tuple[int, ...] = (), late_rows: tuple[int, ...] = ()) -> None:
        rows = max(SIZES) * WIDTH
        generator = torch.Generator().manual_seed(1)
        self.buffers = SimpleNamespace(
            input_ids=torch.zeros(rows, dtype=torch.int64),
            positions=torch.zeros(rows, dtype=torch.int64),
            out_cache_loc=torch.zeros(rows, dtype=torch.int64),
            hidden_states=torch.zeros(rows, HIDDEN, dtype=torch.bfloat16),
        )
        self.capture_bs = list(SIZES)
        self.captured_req_width = WIDTH
        self.weight = torch.randn(HIDDEN, 2 * HEADS * DIM, generator=generator).to(torch.bfloat16)
        self.embed = torch.randn(100, 2 * HEADS * DIM, generator=generator).to(torch.bfloat16)
        pool = SimpleNamespace(
            k_buffer=[torch.zeros(SLOTS, HEADS, DIM, dtype=torch.bfloat16)],
            v_buffer=[torch.zeros(SLOTS, HEADS, DIM, dtype=torch.bfloat16)],
        )
        self.model_runner = SimpleNamespace(token_to_kv_pool=pool)
        self.apart, self.late_rows = apart, late_rows
        self.replays: list[int] = []

    def replay(self, size: int) -> None:
        self.replays.append(size)
        rows, b = size * WIDTH, self.buffers
        kv = b.hidden_states[:rows] @ self.weight + self.embed[b.input_ids[:rows]]
        kv = kv + (b.positions[:rows, None] % 7).to(torch.bfloat16)
        if size in self.apart:
            kv = kv * (1 + 2**-6)  # another kernel: other low bits
        if size in self.late_rows:
            kv[8:] = kv[8:] * (1 + 2**-6)
        k, v = kv.view(rows, 2, HEADS, DIM).unbind(1)
        pool = self.model_runner.token_to_kv_pool
        pool.k_buffer[0][b.out_cache_loc[:rows]] = k
        pool.v_buffer[0][b.out_cache_loc[:rows]] = v


class Write(v2.DirectKVWrite):
    def replay(self, size: int) -> None:
        self.twin.replay(size)

    def stand_in(self, batch: Any, batch_result: Any) -> None:
        return None


def writer(twin: Twin, steps: int = 1) -> Write:
    write = Write(twin, log=False, batch_steps=steps)
    probe = v2.RoundingProbe.of(twin)
    assert probe is not None
    write.check_rounding(probe)
    pool = twin.model_runner.token_to_kv_pool
    for layer in (*pool.k_buffer, *pool.v_buffer):
        layer.zero_()
    twin.replays.clear()
    return write


def iteration(requests: list[Any], step: int) -> tuple[Any, Any]:
    n = len(requests)
    generator = torch.Generator().manual_seed(100 + step)
    batch = SimpleNamespace(
        forward_mode=SimpleNamespace(is_idle=lambda: False),
        seq_lens=torch.arange(40 + step, 40 + step + n, dtype=torch.int64),
        out_cache_loc=torch.arange(200 + step * n, 200 + (step + 1) * n, dtype=torch.int64),
        reqs=list(requests),
    )
    result = SimpleNamespace(
        next_token_ids=torch.randint(0, 100, (n,), generator=generator),
        logits_output=SimpleNamespace(hidden_states=torch.randn(n, HIDDEN, generator=generator).to(torch.bfloat16)),
    )
    return batch, result


def pool_bytes(twin: Twin) -> Any:
    """Every slot's K/V bytes but slot 0's, the reserved slot padding rows write."""
    pool = twin.model_runner.token_to_kv_pool
    return torch.cat(
        [pool.k_buffer[0][1:].view(torch.uint8).flatten(), pool.v_buffer[0][1:].view(torch.uint8).flatten()]
    )


def test_graphs_of_one_kernel_round_alike_and_the_check_says_so() -> None:
    write = writer(Twin())
    assert write.rounding == [0] * len(SIZES) and write.rounding_groups() == "1-16:0"


def test_graphs_that_round_apart_by_size_or_by_row_are_told_apart() -> None:
    write = writer(Twin(apart=(12, 16), late_rows=(8,)))
    assert write.rounding == [0, 0, 0, -4, 1, 1]
    assert write.rounding_groups() == "1-4:0 | 8:by-row | 12-16:1"
    assert (
        write.same_rounding_rows(5) == 16 and write.same_rounding_rows(20) == 0 and write.same_rounding_rows(45) == 64
    )


@pytest.mark.parametrize(("apart", "late_rows"), [((), ()), ((12, 16), ()), ((), (8, 12, 16))])
def test_batched_writes_leave_the_bits_one_iteration_per_replay_leaves(
    apart: tuple[int, ...], late_rows: tuple[int, ...]
) -> None:
    requests = [object() for _ in range(5)]
    single, batched = Twin(apart, late_rows), Twin(apart, late_rows)
    one, eight = writer(single), writer(batched, steps=8)
    for step in range(9):
        assert one.write(*iteration(requests, step)) and eight.write(*iteration(requests, step))
    eight.flush()
    assert torch.equal(pool_bytes(single), pool_bytes(batched))
    assert len(batched.replays) < len(single.replays) == 9  # it batched where the check let it


def test_unchecked_batching_into_a_graph_that_rounds_apart_changes_the_bits() -> None:
    """Negative control for the test above: told every graph rounds alike, the batch lands in the
    graph for 12, which rounds differently."""
    requests = [object() for _ in range(5)]
    single, batched = Twin(apart=(12, 16)), Twin(apart=(12, 16))
    one, eight = writer(single), writer(batched, steps=8)
    eight.rounding = [0] * len(SIZES)
    for step in range(9):
        one.write(*iteration(requests, step))
        eight.write(*iteration(requests, step))
    eight.flush()
    assert 12 in batched.replays and not torch.equal(pool_bytes(single), pool_bytes(batched))


# -- v1 (0.5.12): the direct write in graphs that round as the stock extend's --------------------------


class V1Twin(Twin):
    """The twin as v1's ``StockGraphDirectWrite`` reads it: ``graphs[size].replay()`` and the width as
    0.5.12's runner names it."""

    def __init__(self, apart: tuple[int, ...] = (), late_rows: tuple[int, ...] = ()) -> None:
        super().__init__(apart, late_rows)
        self.num_tokens_per_bs = WIDTH
        self.graphs = {size: SimpleNamespace(replay=lambda size=size: self.replay(size)) for size in SIZES}


def stock_extend_bytes(twin: Twin, batch: Any, result: Any) -> Any:
    """What v1's stock extend writes: the batch's rows at the front of the graph for its request count."""
    n = int(batch.seq_lens.shape[0])
    size = next(s for s in SIZES if s >= n)
    b = twin.buffers
    b.input_ids[:n], b.positions[:n], b.out_cache_loc[:n] = result.next_token_ids, batch.seq_lens, batch.out_cache_loc
    b.hidden_states[:n] = result.logits_output.hidden_states
    for name in ("input_ids", "positions", "out_cache_loc"):
        getattr(b, name)[n : size * WIDTH] = 0
    twin.replay(size)
    return pool_bytes(twin)


def v1_writer(twin: V1Twin, rounding: list[int] | None = None) -> v2.StockGraphDirectWrite:
    write = v2.StockGraphDirectWrite(twin, (HIDDEN, torch.bfloat16), log=False)
    write.round_as_stock(SimpleNamespace(server_args=SimpleNamespace(tp_size=1)))
    if rounding is not None:  # what a wrong check would have said
        write.rounding = rounding
        write.replay_index = [write.stock_alike(n) for n in range(SIZES[-1] + 1)]
    pool = twin.model_runner.token_to_kv_pool
    for layer in (*pool.k_buffer, *pool.v_buffer):
        layer.zero_()
    twin.replays.clear()
    return write


def v1_iteration(n: int, step: int) -> tuple[Any, Any]:
    batch, result = iteration([object()] * n, step)
    result.next_draft_input = SimpleNamespace()
    return batch, result


@pytest.mark.parametrize("requests", [3, 6, 10, 16])
def test_v1s_direct_write_leaves_the_bits_of_the_stock_extend_in_a_smaller_graph(requests: int) -> None:
    """Graphs 8 and 16 round apart from the small ones: 6 requests (stock graph 8) replay graph 8,
    10 and 16 (stock 12 and 16) the smallest of those, 3 (stock graph 4) a packed small one."""
    direct, stock = V1Twin(apart=(8, 12, 16)), V1Twin(apart=(8, 12, 16))
    write = v1_writer(direct)
    assert write.rounding == [0, 0, 0, 1, 1, 1]
    assert write.write(*v1_iteration(requests, 0))
    assert torch.equal(pool_bytes(direct), stock_extend_bytes(stock, *v1_iteration(requests, 0)))
    assert direct.replays == [{3: 1, 6: 8, 10: 8, 16: 8}[requests]]


def test_v1s_direct_write_packed_as_the_own_fallbacks_would_change_the_bits() -> None:
    """Negative control: told that every graph rounds alike, 6 requests pack into graph 2, which
    rounds apart from the stock extend's graph 8."""
    direct, stock = V1Twin(apart=(8, 12, 16)), V1Twin(apart=(8, 12, 16))
    write = v1_writer(direct, rounding=[0] * len(SIZES))
    assert write.write(*v1_iteration(6, 0))
    assert direct.replays == [2] and not torch.equal(pool_bytes(direct), stock_extend_bytes(stock, *v1_iteration(6, 0)))


def test_v1s_start_up_check_does_not_write_past_a_small_pool() -> None:
    """A pool of fewer slots than the largest graph's rows: no probe (it would index past the
    buffers), and every batch replays the stock graph itself."""
    twin = V1Twin(apart=(8, 12, 16))
    pool = twin.model_runner.token_to_kv_pool
    pool.k_buffer, pool.v_buffer = (
        [pool.k_buffer[0][:64]],
        [pool.v_buffer[0][:64]],
    )  # slots 0 - 63; the probe needs 1 - 64
    write = v2.StockGraphDirectWrite(twin, (HIDDEN, torch.bfloat16), log=False)
    write.round_as_stock(SimpleNamespace(server_args=SimpleNamespace(tp_size=1)))
    assert write.rounding is None and twin.replays == []
    assert [SIZES[write.replay_index[n]] for n in (3, 6, 10)] == [4, 8, 12]
    pool.k_buffer, pool.v_buffer = (
        [torch.zeros(65, HEADS, DIM, dtype=torch.bfloat16)],
        [torch.zeros(65, HEADS, DIM, dtype=torch.bfloat16)],
    )
    write.round_as_stock(SimpleNamespace(server_args=SimpleNamespace(tp_size=1)))  # the control: 65 slots hold 1 - 64
    assert write.rounding == [0, 0, 0, 1, 1, 1] and [SIZES[write.replay_index[n]] for n in (3, 6, 10)] == [1, 8, 8]


# -- DYNSPEC_CHECK_KV_BITS: the direct write against the full extend, in one server ---------------------


def bit_check(twin: Twin, tmp_path: Any) -> tuple[v2.KVBitCheck, Any]:
    probe = v2.RoundingProbe.of(twin)
    assert probe is not None
    path = tmp_path / "bits.jsonl"
    return v2.KVBitCheck(probe, str(path)), path


def checked_iteration(write: v2.StockGraphDirectWrite, check: v2.KVBitCheck, requests: int, step: int) -> Any:
    """One v1 fallback iteration under the check: the direct write and its packed control, then the
    stock extend (its rows at the front of the stock graph), whose result comes back."""
    batch, result = v1_iteration(requests, step)

    def direct() -> bool:
        return write.write(batch, result)

    def packed() -> bool:
        with write.packing():
            return write.write(batch, result)

    def full_extend() -> str:
        stock_extend_bytes(write.twin, batch, result)
        return "the full extend's result"

    return check.compare(batch.out_cache_loc, [("direct", direct), ("packed", packed)], full_extend)


def test_the_bit_check_finds_the_direct_write_exact_and_its_packed_control_not(tmp_path: Any) -> None:
    """Graphs 8 - 16 round apart from the small ones: 10 requests' stock graph is 12, the direct
    write replays graph 8 (same rounding), the packed control graph 4 (another)."""
    twin = V1Twin(apart=(8, 12, 16))
    write, (check, path) = v1_writer(twin), bit_check(twin, tmp_path)
    assert checked_iteration(write, check, 10, 0) == "the full extend's result"
    assert twin.replays == [8, 4, 12]
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"rows": 10, "direct": 0, "packed": 10}]
    assert not write.packed  # the control's graph choice does not outlive it
    # what the check leaves is the full extend's K/V
    assert torch.equal(pool_bytes(twin), stock_extend_bytes(V1Twin(apart=(8, 12, 16)), *v1_iteration(10, 0)))


def test_the_bit_check_catches_a_direct_write_that_rounds_apart(tmp_path: Any) -> None:
    """Negative control: told (wrongly) that every graph rounds alike, the direct write packs 10
    requests into graph 4, and the check counts every row."""
    twin = V1Twin(apart=(8, 12, 16))
    write, (check, path) = v1_writer(twin, rounding=[0] * len(SIZES)), bit_check(twin, tmp_path)
    checked_iteration(write, check, 10, 0)
    assert json.loads(path.read_text()) == {"rows": 10, "direct": 10, "packed": 10}


def test_the_bit_check_counts_a_write_that_leaves_nothing(tmp_path: Any) -> None:
    """The slots are zeroed before each write, so a write that lands elsewhere cannot pass for exact."""
    twin = V1Twin()
    write, (check, path) = v1_writer(twin), bit_check(twin, tmp_path)
    batch, result = v1_iteration(6, 0)

    def elsewhere() -> bool:
        batch.out_cache_loc += 500
        try:
            return write.write(batch, result)
        finally:
            batch.out_cache_loc -= 500

    check.compare(batch.out_cache_loc, [("direct", elsewhere)], lambda: stock_extend_bytes(twin, batch, result))
    assert json.loads(path.read_text()) == {"rows": 6, "direct": 6}


def test_a_write_that_refuses_the_batch_is_not_compared_and_other_ranks_write_nothing(tmp_path: Any) -> None:
    twin = V1Twin()
    probe = v2.RoundingProbe.of(twin)
    assert probe is not None
    batch, result = v1_iteration(6, 0)
    quiet = v2.KVBitCheck(probe, None)  # a rank other than 0
    assert quiet.compare(batch.out_cache_loc, [("direct", lambda: True)], lambda: 7) == 7
    check, path = bit_check(twin, tmp_path)
    check.compare(batch.out_cache_loc, [("direct", lambda: False)], lambda: stock_extend_bytes(twin, batch, result))
    assert not path.exists()


# -- v1's lean fallback step (LeanFallbackStep) in a fake 0.5.12 around a real direct write --------------

VOCAB = 100  # the twin's embedding rows


class ForwardMode:
    DECODE, TARGET_VERIFY, IDLE = "decode", "target verify", "idle"

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def is_decode(self) -> bool:
        return self.mode == self.DECODE

    def is_idle(self) -> bool:
        return self.mode == self.IDLE


def fake_forward_batch_info() -> Any:
    import types

    module = types.ModuleType("sglang.srt.model_executor.forward_batch_info")
    module.ForwardMode = SimpleNamespace(  # type: ignore[attr-defined]
        DECODE=ForwardMode(ForwardMode.DECODE), TARGET_VERIFY=ForwardMode(ForwardMode.TARGET_VERIFY)
    )
    module.CaptureHiddenMode = SimpleNamespace(FULL="full", LAST="last")  # type: ignore[attr-defined]
    return module


class Req:
    """0.5.12's Req as the verify's loop uses it; finishes after ``max_new`` output tokens."""

    def __init__(self, max_new: int) -> None:
        self.max_new = max_new
        self.output_ids: list[int] = []
        self.require_reasoning = False
        self.decode_batch_idx = 0
        self.kv_committed_len = self.kv_allocated_len = 40
        self.spec_verify_ct = 0
        self.histogram: list[int] = []
        self._finished = False

    def check_finished(self) -> None:
        self._finished = len(self.output_ids) >= self.max_new

    def finished(self) -> bool:
        return self._finished

    def update_spec_correct_drafts_histogram(self, correct: int) -> None:
        self.histogram.append(correct)

    def update_reasoning_tokens(self, token: int, think_end_id: int) -> None:
        raise AssertionError("no reasoning in these requests")


@dataclasses.dataclass
class EagleVerifyInput:
    draft_token: Any
    custom_mask: Any
    positions: Any
    retrieve_index: Any
    retrieve_next_token: Any
    retrieve_next_sibling: Any
    retrieve_cum_len: Any
    spec_steps: int
    topk: int
    draft_token_num: int
    capture_hidden_mode: Any
    seq_lens_sum: int
    seq_lens_cpu: Any
    num_tokens_per_req: int = -1

    def prepare_for_verify(self, batch: Any, page_size: int) -> None:
        """0.5.12's, page size 1: the tokens, a new slot per request, req_to_token at seq_lens."""
        batch.input_ids = self.draft_token
        batch.out_cache_loc = torch.arange(300, 300 + len(batch.reqs), dtype=torch.int64)
        batch.req_to_token_writes.append((batch.seq_lens.clone(), batch.out_cache_loc.clone()))


@dataclasses.dataclass
class EagleDraftInput:
    bonus_tokens: Any
    hidden_states: Any
    topk_p: Any
    topk_index: Any
    capture_hidden_mode: Any


@dataclasses.dataclass
class GenerationBatchResult:
    logits_output: Any
    next_token_ids: Any
    num_correct_drafts: int
    num_correct_drafts_per_req_cpu: list[int]
    can_run_cuda_graph: bool


class Target:
    """The target's one-token verify forward: per request a next token and a hidden-state row."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.seen: list[Any] = []
        self.outputs: list[Any] = []  # the hidden states of each forward, as the graph's output buffer holds them

    def forward_batch_generation(self, model_worker_batch: Any, is_verify: bool = False) -> Any:
        assert is_verify and model_worker_batch.forward_mode.mode == ForwardMode.TARGET_VERIFY
        self.seen.append(model_worker_batch)
        n = len(self.tokens)
        logits = torch.zeros(n, VOCAB)
        logits[torch.arange(n), torch.tensor(self.tokens)] = 1.0
        hidden = torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
        self.outputs.append(hidden)
        return SimpleNamespace(
            logits_output=SimpleNamespace(next_token_logits=logits, hidden_states=hidden), can_run_cuda_graph=True
        )


def lean_world(
    monkeypatch: pytest.MonkeyPatch, reqs: list[Req], tokens: list[int], writer: Any
) -> tuple[Any, Any, Any, Any]:
    """(lean step, worker, batch, fallback) of a fake 0.5.12 v1 server at a fallback iteration."""
    import types

    from patches.runtime import dynspec_runtime as rt

    monkeypatch.setitem(sys.modules, "sglang.srt.model_executor.forward_batch_info", fake_forward_batch_info())
    module = types.ModuleType("fake_eagle_worker")
    module.EagleVerifyInput = EagleVerifyInput  # type: ignore[attr-defined]
    module.GenerationBatchResult = GenerationBatchResult  # type: ignore[attr-defined]
    n = len(reqs)
    batch = SimpleNamespace(
        reqs=reqs,
        seq_lens=torch.arange(40, 40 + n, dtype=torch.int64),
        seq_lens_cpu=torch.arange(40, 40 + n, dtype=torch.int64),
        req_pool_indices=torch.arange(n, dtype=torch.int64),
        forward_mode=ForwardMode(ForwardMode.DECODE),
        spec_info=SimpleNamespace(bonus_tokens=torch.arange(n, dtype=torch.int32)),
        sampling_info=SimpleNamespace(
            is_all_greedy=True,
            penalizer_orchestrator=SimpleNamespace(is_required=False),
            logit_bias=None,
            has_custom_logit_processor=False,
        ),
        has_grammar=False,
        return_logprob=False,
        model_config=SimpleNamespace(think_end_id=None),
        maybe_evict_swa=lambda: None,
        req_to_token_writes=[],
    )
    batch.get_model_worker_batch = lambda seq_lens_cpu_cache: SimpleNamespace(
        forward_mode=batch.forward_mode,
        input_ids=batch.input_ids.clone(),
        seq_lens_cpu=seq_lens_cpu_cache,
        sampling_info=batch.sampling_info,
        top_logprobs_nums=None,
        token_ids_logprobs=None,
    )
    idle: list[Any] = []
    worker = SimpleNamespace(target_worker=Target(tokens), page_size=1, _draft_preprocess_idle=idle.append)
    fallback = rt.DynspecFallback(
        rt.SwitchController(2, 2, 1, log=False), SimpleNamespace(), SimpleNamespace(direct=writer)
    )
    step = rt.LeanFallbackStep(module, EagleDraftInput, EagleDraftInput, None, log=False)
    return step, worker, batch, fallback


def slot_bytes(twin: Twin, slots: list[int]) -> Any:
    """The K/V bytes of these slots."""
    pool, at = twin.model_runner.token_to_kv_pool, torch.tensor(slots)
    return torch.cat(
        [pool.k_buffer[0][at].view(torch.uint8).flatten(), pool.v_buffer[0][at].view(torch.uint8).flatten()]
    )


def written_ahead_alone(twin: V1Twin, tokens: list[int], hidden: Any) -> V1Twin:
    """The lean step's write ahead of its wait on its own: every request's row (pre-step positions
    40 + i, slots 300 + i), finished ones too, and no second write."""
    n = len(tokens)
    v1_writer(twin).write(
        SimpleNamespace(
            forward_mode=ForwardMode(ForwardMode.DECODE),
            seq_lens=torch.arange(40, 40 + n),
            out_cache_loc=torch.arange(300, 300 + n),
        ),
        SimpleNamespace(
            next_token_ids=torch.tensor(tokens),
            logits_output=SimpleNamespace(hidden_states=hidden),
            next_draft_input=SimpleNamespace(),
        ),
    )
    return twin


def test_the_lean_step_writes_the_draft_kv_the_stock_extend_writes_for_the_unfinished_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five requests, the second and fourth finish in this step: the verify hands the extend the
    other three (tokens, pre-step positions, their slots, their hidden rows), whose stock graph is
    4. The lean step wrote all five ahead of its wait (graph 8, which rounds apart) and writes the
    three again in graph 1, which rounds as graph 4: their bits are the stock extend's. The
    scheduler then sees every request's token, one more KV slot committed, lengths + 1 for all,
    and a next draft input of the three."""
    reqs = [Req(max_new=1 if i in (1, 3) else 8) for i in range(5)]
    tokens = [11, 12, 13, 14, 15]
    direct, stock = V1Twin(apart=(8, 12, 16)), V1Twin(apart=(8, 12, 16))
    step, worker, batch, fallback = lean_world(monkeypatch, reqs, tokens, v1_writer(direct))
    assert step.takes(batch)
    result = step.step(worker, batch, fallback)

    keep = torch.tensor([0, 2, 4])
    hidden = worker.target_worker.forward_batch_generation(
        worker.target_worker.seen[0], True
    ).logits_output.hidden_states
    reference = SimpleNamespace(seq_lens=torch.arange(40, 45)[keep], out_cache_loc=torch.arange(300, 305)[keep])
    stock_rows = SimpleNamespace(
        next_token_ids=torch.tensor(tokens)[keep], logits_output=SimpleNamespace(hidden_states=hidden[keep])
    )
    stock_extend_bytes(stock, reference, stock_rows)
    others = [slot for slot in range(1, SLOTS) if slot not in (301, 303)]
    assert torch.equal(slot_bytes(direct, others), slot_bytes(stock, others))  # the kept rows', nothing else
    assert (
        slot_bytes(direct, [301, 303]).any() and not slot_bytes(stock, [301, 303]).any()
    )  # the finished rows: written ahead
    assert direct.replays == [8, 1]  # all five ahead of the wait, then the three in graph 1, which rounds as graph 4

    assert [r.output_ids for r in reqs] == [[t] for t in tokens]
    assert [r.kv_committed_len for r in reqs] == [41] * 5 and all(r.kv_allocated_len == 41 for r in reqs)
    assert [r.spec_verify_ct for r in reqs] == [1] * 5 and all(r.histogram == [0] for r in reqs)
    assert [r.decode_batch_idx for r in reqs] == [1] * 5
    assert batch.seq_lens.tolist() == list(range(41, 46)) and batch.seq_lens_cpu.tolist() == list(range(41, 46))
    assert batch.out_cache_loc.tolist() == [300, 302, 304] and batch.input_ids.tolist() == [11, 13, 15]
    assert batch.forward_mode.is_decode()
    assert batch.spec_info.bonus_tokens.tolist() == [11, 13, 15] and batch.spec_info.bonus_tokens.dtype == torch.int32
    assert batch.spec_info.topk_p.shape == (3, 1) and batch.spec_info.hidden_states.shape == (3, HIDDEN)
    assert result.next_token_ids.tolist() == tokens and result.num_correct_drafts == 0
    assert result.num_correct_drafts_per_req_cpu == [0] * 5 and result.can_run_cuda_graph
    # The verify's preparation ran: the bonus tokens went in at the pre-step lengths.
    ((positions, slots),) = batch.req_to_token_writes
    assert positions.tolist() == list(range(40, 45)) and slots.tolist() == list(range(300, 305))
    assert worker.target_worker.seen[0].input_ids.tolist() == [0, 1, 2, 3, 4]
    # Negative control: the write ahead alone (every request's row, finished ones too) replays graph 8,
    # whose bits for the three are not the stock extend's: the second write is what makes them so.
    everyone = written_ahead_alone(V1Twin(apart=(8, 12, 16)), tokens, hidden)
    assert everyone.replays == [8] and not torch.equal(
        slot_bytes(everyone, [300, 302, 304]), slot_bytes(stock, [300, 302, 304])
    )


def replays_at_the_wait(step: Any, twin: V1Twin) -> list[list[int]]:
    """What the twin had replayed each time the step waited for its tokens."""
    seen: list[list[int]] = []
    wait = step.to_host.wait

    def waiting() -> list[int]:
        seen.append(list(twin.replays))
        return wait()

    step.to_host.wait = waiting
    return seen


def test_a_step_in_which_no_request_finishes_writes_once_and_before_its_wait(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Six requests, none finishes: one replay (graph 8, the stock one's rounding), queued before the
    step waits for its tokens, with the stock extend's bits; the next draft input is that write's.
    The control: with the bit check on, the write comes after the wait, as before."""
    tokens = [11, 12, 13, 14, 15, 16]
    direct, stock = V1Twin(apart=(8, 12, 16)), V1Twin(apart=(8, 12, 16))
    step, worker, batch, fallback = lean_world(monkeypatch, [Req(8) for _ in tokens], tokens, v1_writer(direct))
    at_wait = replays_at_the_wait(step, direct)
    step.step(worker, batch, fallback)
    assert at_wait == [[8]] and direct.replays == [8]
    hidden = worker.target_worker.outputs[-1]
    stock_extend_bytes(
        stock,
        SimpleNamespace(seq_lens=torch.arange(40, 46), out_cache_loc=torch.arange(300, 306)),
        SimpleNamespace(next_token_ids=torch.tensor(tokens), logits_output=SimpleNamespace(hidden_states=hidden)),
    )
    assert torch.equal(pool_bytes(direct), pool_bytes(stock))
    assert batch.spec_info.bonus_tokens.tolist() == tokens and batch.spec_info.topk_p.shape == (6, 1)

    twin = V1Twin(apart=(8, 12, 16))
    step, worker, batch, fallback = lean_world(monkeypatch, [Req(8) for _ in tokens], tokens, v1_writer(twin))
    fallback.bit_check, _ = bit_check(twin, tmp_path)
    fallback.stock_extend = stock_extend_of(twin)
    step.extend_input_cls = lambda **fields: SimpleNamespace(**fields)
    at_wait = replays_at_the_wait(step, twin)
    step.step(worker, batch, fallback)
    assert at_wait == [[]] and twin.replays == [8, 2, 8]  # after the wait: direct, packed control, full extend

    # DYNSPEC_WRITE_AHEAD=0: after the wait, the same graph and bits.
    after = V1Twin(apart=(8, 12, 16))
    step, worker, batch, fallback = lean_world(monkeypatch, [Req(8) for _ in tokens], tokens, v1_writer(after))
    step.ahead = False
    at_wait = replays_at_the_wait(step, after)
    step.step(worker, batch, fallback)
    assert at_wait == [[]] and after.replays == [8] and torch.equal(pool_bytes(after), pool_bytes(stock))


def timeline_world(
    monkeypatch: pytest.MonkeyPatch, reqs: list[Req], tokens: list[int], twin: V1Twin
) -> tuple[Any, ...]:
    """``lean_world`` with the draft's TP context and the worker module's MoE context recorded, with
    each replay, the wait, the bookkeeping, the idle draft input and the stock extend."""
    step, worker, batch, fallback = lean_world(monkeypatch, reqs, tokens, v1_writer(twin))
    timeline: list[str] = []

    def context(name: str) -> Any:
        @contextlib.contextmanager
        def entered(*args: Any) -> Any:
            timeline.append(f"enter {name}")
            yield
            timeline.append(f"exit {name}")

        return entered

    worker.draft_tp_context = context("tp")
    worker.draft_model_runner = SimpleNamespace(tp_group="the draft's group")
    step.module.speculative_moe_backend_context = context("moe")
    replay = twin.replay
    twin.replay = lambda size: timeline.append("replay") or replay(size)  # type: ignore[method-assign]
    wait = step.to_host.wait
    step.to_host.wait = lambda: timeline.append("wait") or wait()
    worker._draft_preprocess_idle = lambda b: timeline.append("idle")
    fallback.draft_kv.kv_only = lambda w: contextlib.nullcontext()
    worker.forward_draft_extend_after_decode = lambda b: timeline.append("extend") or "the stock extend's"
    step.extend_input_cls = lambda **fields: SimpleNamespace(**fields)
    return step, worker, batch, fallback, timeline


def stock_extends_of_a_step(step: Any, worker: Any, batch: Any, fallback: Any) -> list[int]:
    """Runs the lean step of ``lean_world`` with the stock extend (KV-only) recorded: the rows of each
    stock extend it ran."""
    extended: list[int] = []
    fallback.draft_kv.kv_only = lambda w: contextlib.nullcontext()
    worker.forward_draft_extend_after_decode = lambda b: (
        extended.append(int(b.spec_info.input_ids.shape[0])) or "the stock extend's"
    )
    step.extend_input_cls = lambda **fields: SimpleNamespace(**fields)
    step.step(worker, batch, fallback)
    return extended


IN = ["enter tp", "enter moe"]
OUT = ["exit moe", "exit tp"]


@pytest.mark.parametrize(
    ("requests", "finishing", "expected"),
    [
        (6, 0, [*IN, "replay", *OUT, "wait"]),
        (5, 2, [*IN, "replay", *OUT, "wait", *IN, "replay", *OUT]),
        (3, 3, [*IN, "replay", *OUT, "wait", *IN, "idle", *OUT]),
        (17, 0, [*IN, *OUT, "wait", *IN, "extend", *OUT]),
    ],
    ids=["none-finish", "some-finish", "all-finish", "declined"],
)
def test_every_draft_write_runs_in_the_drafts_contexts_and_the_wait_outside(
    monkeypatch: pytest.MonkeyPatch, requests: int, finishing: int, expected: list[str]
) -> None:
    """The draft's TP group and the MoE backends around each write, the idle draft input and the
    stock extend, as the stock decode branch runs its extend; the wait and the bookkeeping outside.
    The control: without the contexts (a runtime that forgot them) the same timeline differs."""
    reqs = [Req(max_new=1 if i < finishing else 8) for i in range(requests)]
    tokens = [10 + i for i in range(requests)]
    step, worker, batch, fallback, timeline = timeline_world(monkeypatch, reqs, tokens, V1Twin(apart=(8, 12, 16)))
    step.step(worker, batch, fallback)
    assert timeline == expected

    from patches.runtime import dynspec_runtime as rt

    monkeypatch.setattr(rt, "draft_extend_contexts", lambda *args: contextlib.ExitStack())
    reqs = [Req(max_new=1 if i < finishing else 8) for i in range(requests)]
    step, worker, batch, fallback, timeline = timeline_world(monkeypatch, reqs, tokens, V1Twin(apart=(8, 12, 16)))
    step.step(worker, batch, fallback)
    assert timeline != expected


def test_the_bookkeeping_that_needs_no_token_is_done_before_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """At the wait every request has its KV slot committed and its verify counted, and no token yet.
    The control: the first request's token is appended only after."""
    reqs = [Req(max_new=8) for _ in range(4)]
    step, worker, batch, fallback = lean_world(monkeypatch, reqs, [5, 6, 7, 8], v1_writer(V1Twin()))
    seen: list[tuple[Any, ...]] = []
    wait = step.to_host.wait

    def waiting() -> list[int]:
        seen.append(
            tuple(
                (r.kv_committed_len, r.kv_allocated_len, r.spec_verify_ct, list(r.histogram), list(r.output_ids))
                for r in reqs
            )
        )
        return wait()

    step.to_host.wait = waiting
    step.step(worker, batch, fallback)
    assert seen == [tuple((41, 41, 1, [0], []) for _ in reqs)]
    assert [r.output_ids for r in reqs] == [[5], [6], [7], [8]] and [r.kv_committed_len for r in reqs] == [41] * 4


def test_a_step_in_which_every_request_finishes_leaves_an_idle_draft_input(monkeypatch: pytest.MonkeyPatch) -> None:
    """The write ahead has run (three rows, graph 1); nothing is written after the wait."""
    reqs = [Req(max_new=1) for _ in range(3)]
    direct = V1Twin()
    step, worker, batch, fallback = lean_world(monkeypatch, reqs, [5, 6, 7], v1_writer(direct))
    step.step(worker, batch, fallback)
    assert worker._draft_preprocess_idle.__self__ == [batch] and direct.replays == [1]
    assert all(r.finished() for r in reqs) and batch.seq_lens.tolist() == [41, 42, 43]


def stock_bits_of_the_kept(worker: Any, tokens: list[int], kept: list[int], twin: V1Twin) -> V1Twin:
    """What the stock extend leaves for the kept requests (pre-step positions 40 + i, slots 300 + i)."""
    keep = torch.tensor(kept)
    stock_extend_bytes(
        twin,
        SimpleNamespace(
            seq_lens=torch.arange(40, 40 + len(tokens))[keep], out_cache_loc=torch.arange(300, 300 + len(tokens))[keep]
        ),
        SimpleNamespace(
            next_token_ids=torch.tensor(tokens)[keep],
            logits_output=SimpleNamespace(hidden_states=worker.target_worker.outputs[-1][keep]),
        ),
    )
    return twin


def test_rows_written_ahead_in_a_graph_that_rounds_by_row_are_written_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Twelve requests, the first finishes: graphs 8 - 16 round rows from the eighth on apart (by
    row). Written ahead, the ninth request sat at row 8; in the stock extend of the eleven kept it
    sits at row 7. The kept rows are written again (graph 12): the stock bits. The control: the
    write ahead alone leaves other bits for that request, though its graph is the stock one."""
    tokens = [20 + i for i in range(12)]
    reqs = [Req(max_new=1 if i == 0 else 8) for i in range(12)]
    direct = V1Twin(late_rows=(8, 12, 16))
    write = v1_writer(direct)
    assert write.rounding is not None and write.rounding[SIZES.index(12)] < 0
    step, worker, batch, fallback = lean_world(monkeypatch, reqs, tokens, write)
    step.step(worker, batch, fallback)
    assert direct.replays == [12, 12]
    kept = list(range(1, 12))
    stock = stock_bits_of_the_kept(worker, tokens, kept, V1Twin(late_rows=(8, 12, 16)))
    slots = [300 + i for i in kept]
    assert torch.equal(slot_bytes(direct, slots), slot_bytes(stock, slots))
    ahead_only = written_ahead_alone(V1Twin(late_rows=(8, 12, 16)), tokens, worker.target_worker.outputs[-1])
    assert not torch.equal(slot_bytes(ahead_only, [308]), slot_bytes(stock, [308]))


def test_with_the_write_after_the_sync_a_step_in_which_some_finish_writes_the_kept_rows_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DYNSPEC_WRITE_AHEAD=0, two of five finish: one replay after the wait (graph 1, as graph 4),
    the stock extend's bits, and the finished requests' slots untouched, as before r22."""
    reqs = [Req(max_new=1 if i in (1, 3) else 8) for i in range(5)]
    direct = V1Twin(apart=(8, 12, 16))
    step, worker, batch, fallback = lean_world(monkeypatch, reqs, [11, 12, 13, 14, 15], v1_writer(direct))
    step.ahead = False
    at_wait = replays_at_the_wait(step, direct)
    step.step(worker, batch, fallback)
    assert at_wait == [[]] and direct.replays == [1]
    keep, stock = torch.tensor([0, 2, 4]), V1Twin(apart=(8, 12, 16))
    hidden = worker.target_worker.outputs[-1]
    stock_extend_bytes(
        stock,
        SimpleNamespace(seq_lens=torch.arange(40, 45)[keep], out_cache_loc=torch.arange(300, 305)[keep]),
        SimpleNamespace(
            next_token_ids=torch.tensor([11, 13, 15]), logits_output=SimpleNamespace(hidden_states=hidden[keep])
        ),
    )
    assert torch.equal(pool_bytes(direct), pool_bytes(stock))  # the finished requests' slots untouched too


@pytest.mark.parametrize(
    ("requests", "finishing", "replays", "extended"),
    [(8, 3, [2], [5]), (5, 1, [1], [])],
    ids=["all-have-a-graph-the-kept-not", "all-have-none-the-kept-do"],
)
def test_without_graph_padding_each_write_takes_only_counts_with_a_graph(
    monkeypatch: pytest.MonkeyPatch, requests: int, finishing: int, replays: list[int], extended: list[int]
) -> None:
    """``--disable-cuda-graph-padding``: the stock extend runs a count without a graph eagerly, and
    so does the direct write. Eight requests (a graph) of which five are kept (none): written ahead
    (packed in graph 2: every graph rounds alike here), then the stock extend over the five. Five
    (none) of which four are kept (a graph): nothing ahead, the four written after the wait (graph 1)."""
    reqs = [Req(max_new=1 if i < finishing else 8) for i in range(requests)]
    twin = V1Twin()
    twin.disable_padding = True
    step, worker, batch, fallback = lean_world(monkeypatch, reqs, [10 + i for i in range(requests)], v1_writer(twin))
    assert stock_extends_of_a_step(step, worker, batch, fallback) == extended and twin.replays == replays


@pytest.mark.parametrize(
    ("finishing", "direct_rows", "stock_rows"),
    [(0, [], [17]), (1, [16], []), (17, [], [])],
    ids=["none-finish", "one-finishes", "all-finish"],
)
def test_a_batch_the_write_ahead_does_not_take_is_written_after_the_wait(
    monkeypatch: pytest.MonkeyPatch, finishing: int, direct_rows: list[int], stock_rows: list[int]
) -> None:
    """17 requests, more than the largest graph (16) holds: the write ahead declines them. If none
    finishes the stock extend runs KV-only and the writer is not asked again for the same rows; if
    one finishes, the 16 others are written directly after the wait."""
    reqs = [Req(max_new=1 if i < finishing else 8) for i in range(17)]
    twin = V1Twin()
    write = v1_writer(twin)
    step, worker, batch, fallback = lean_world(monkeypatch, reqs, [i % 90 for i in range(17)], write)
    asked: list[int] = []
    stock_write = write.write

    def counted(rows_in: Any, verified: Any) -> bool:
        asked.append(int(rows_in.seq_lens.shape[0]))
        return stock_write(rows_in, verified)

    write.write = counted  # type: ignore[method-assign]
    extended = stock_extends_of_a_step(step, worker, batch, fallback)
    assert asked == [17, *direct_rows] and extended == stock_rows
    assert twin.replays == ([4] if direct_rows else [])  # 16 rows pack into graph 4, which rounds as 16 here


def test_simulated_acceptance_fills_the_tokens_as_the_stock_verify_does(monkeypatch: pytest.MonkeyPatch) -> None:
    reqs = [Req(max_new=8) for _ in range(2)]
    step, worker, batch, fallback = lean_world(monkeypatch, reqs, [5, 6], v1_writer(V1Twin()))
    step.simulated_token = 100 - 1  # within the twin's embedding; 0.5.12 fills 100
    result = step.step(worker, batch, fallback)
    assert result.next_token_ids.tolist() == [99, 99] and [r.output_ids for r in reqs] == [[99], [99]]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda b: setattr(b.sampling_info, "is_all_greedy", False), "sampling"),
        (lambda b: setattr(b.sampling_info.penalizer_orchestrator, "is_required", True), "penalties or a logit bias"),
        (lambda b: setattr(b.sampling_info, "logit_bias", torch.zeros(1)), "penalties or a logit bias"),
        (lambda b: setattr(b.sampling_info, "has_custom_logit_processor", True), "a custom logit processor"),
        (lambda b: setattr(b, "has_grammar", True), "grammar"),
        (lambda b: setattr(b, "return_logprob", True), "logprobs"),
        (lambda b: setattr(b, "forward_mode", ForwardMode(ForwardMode.IDLE)), "not a decode batch"),
    ],
)
def test_batches_the_lean_step_cannot_mirror_go_to_the_stock_path(
    monkeypatch: pytest.MonkeyPatch, change: Any, why: str
) -> None:
    step, _, batch, _ = lean_world(monkeypatch, [Req(8)], [5], None)
    assert step.refusal(batch) is None  # the control: the unchanged batch is taken
    change(batch)
    assert step.refusal(batch) == why and not step.takes(batch)


class LastTokenSampler(SixParameterSampler):
    """Softmaxes the logits it is given in place, as the real sampler does, and draws the
    lowest-probability token of each row (the target's argmax is the highest), so that its tokens
    are told apart from the argmax; int64, as the pytorch backend's before its cast."""

    def draw(self, logits: Any) -> Any:
        logits[:] = torch.softmax(logits, dim=-1)
        return torch.argmin(logits, dim=-1)


def test_a_sampled_batch_takes_the_lean_step_with_the_targets_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.5.12 v1: the step as for a greedy batch, with the sampler's tokens as the accepted ones."""
    reqs = [Req(max_new=8) for _ in range(3)]
    step, worker, batch, fallback = lean_world(monkeypatch, reqs, [5, 6, 7], None)
    batch.sampling_info.is_all_greedy = False
    assert step.refusal(batch) == "sampling"  # the control: without a sampler, the stock path
    sampler = LastTokenSampler()
    step.decode_sample = v2.DecodeSample(sampler)
    assert step.refusal(batch) is None
    fallback.draft_kv.kv_only = lambda w: contextlib.nullcontext()
    worker.forward_draft_extend_after_decode = lambda b: "the stock extend's next input"
    step.extend_input_cls = lambda **fields: SimpleNamespace(**fields)
    result = step.step(worker, batch, fallback)
    # every logit row is one-hot at the target's token, so the lowest is token 0 (5, 6, 7 are the argmax)
    assert result.next_token_ids.tolist() == [0, 0, 0] and result.next_token_ids.dtype == torch.int32
    assert [r.output_ids for r in reqs] == [[0], [0], [0]]
    (call,) = sampler.calls
    assert call.sampling_info is batch.sampling_info and call.return_logprob is False
    assert call.positions.tolist() == [
        40,
        41,
        42,
    ]  # the pre-step seq_lens: each input token's position, as a decode step's
    # v1's lean step refuses logprobs, so no copy: the sampler softmaxed the target's own logits, as plain decode's does
    logits = result.logits_output.next_token_logits
    assert logits.argmax(dim=-1).tolist() == [5, 6, 7] and torch.allclose(logits.sum(dim=-1), torch.ones(3))


def test_a_sampled_batch_the_draw_cannot_take_goes_to_the_stock_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """What only the draw refuses (the step's own checks come first: the cases above), here sampling masks."""
    step, _, batch, _ = lean_world(monkeypatch, [Req(8)], [5], None)
    step.decode_sample = v2.DecodeSample(LastTokenSampler())
    batch.sampling_info.is_all_greedy = False
    assert step.refusal(batch) is None  # the control
    batch.sampling_info.return_sampling_masks = [True]
    assert step.refusal(batch) == "sampling masks"


def test_rows_the_direct_write_cannot_take_go_to_the_stock_extend_kv_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """No direct writer (given up): the stock extend runs, KV-only, on the extend input the verify
    would have made for the unfinished requests."""
    reqs = [Req(max_new=1), Req(max_new=8)]
    step, worker, batch, fallback = lean_world(monkeypatch, reqs, [5, 6], None)
    seen: list[Any] = []
    windows: list[str] = []

    @contextlib.contextmanager
    def kv_only(w: Any) -> Any:
        windows.append("open")
        yield
        windows.append("closed")

    def extend(b: Any) -> str:
        seen.append((b.spec_info, list(windows)))
        return "the stock extend's next input"

    fallback.draft_kv.kv_only = kv_only
    worker.forward_draft_extend_after_decode = extend
    step.extend_input_cls = lambda **fields: SimpleNamespace(**fields)
    step.step(worker, batch, fallback)
    ((extend_input, open_then),) = seen
    assert open_then == ["open"] and windows == ["open", "closed"]
    assert batch.spec_info == "the stock extend's next input"
    assert extend_input.input_ids.tolist() == [6] and extend_input.num_accept_tokens_cpu == [1]
    assert extend_input.seq_lens.tolist() == [42] and extend_input.req_pool_indices.tolist() == [1]
    assert extend_input.num_correct_drafts.tolist() == [0] and extend_input.hidden_states.shape == (1, HIDDEN)


def stock_extend_of(twin: V1Twin, off_by: int = 0) -> Any:
    """0.5.12's extend after the verify, as the bit check runs it: the rows from the extend input
    (tokens, positions = post-step lengths - 1, the batch's slots, hidden rows) at the front of the
    stock graph for their count; ``off_by`` shifts the positions (a wrong derivation)."""

    def extend(batch: Any) -> str:
        extend_input = batch.spec_info
        result = SimpleNamespace(
            next_token_ids=extend_input.input_ids,
            logits_output=SimpleNamespace(hidden_states=extend_input.hidden_states),
        )
        rows = SimpleNamespace(seq_lens=extend_input.seq_lens - 1 + off_by, out_cache_loc=batch.out_cache_loc)
        stock_extend_bytes(twin, rows, result)
        return "the full extend's next input"

    return extend


@pytest.mark.parametrize(("off_by", "differing"), [(0, 0), (1, 3)], ids=["as-stock", "control-wrong-positions"])
def test_the_bit_check_on_the_lean_server_compares_its_rows_with_the_full_extend(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, off_by: int, differing: int
) -> None:
    """DYNSPEC_CHECK_KV_BITS with the lean step: its rows written directly, then the full extend of
    the extend input the verify would have made; the full extend's result stays. Five requests, two
    finish: three rows, all equal; with the full extend's positions shifted (the control), all three differ."""
    reqs = [Req(max_new=1 if i in (1, 3) else 8) for i in range(5)]
    twin = V1Twin(apart=(8, 12, 16))
    step, worker, batch, fallback = lean_world(monkeypatch, reqs, [11, 12, 13, 14, 15], v1_writer(twin))
    fallback.bit_check, path = bit_check(twin, tmp_path)
    fallback.stock_extend = stock_extend_of(twin, off_by)
    step.extend_input_cls = lambda **fields: SimpleNamespace(**fields)
    step.step(worker, batch, fallback)
    assert batch.spec_info == "the full extend's next input"
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"rows": 3, "direct": differing}]


def test_the_bit_check_on_the_lean_server_has_its_packed_control(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Six requests: the stock graph 8 rounds apart from graph 2, which packs six rows; the direct
    write replays graph 8 and leaves the full extend's bits, the packed control does not."""
    twin = V1Twin(apart=(8, 12, 16))
    step, worker, batch, fallback = lean_world(
        monkeypatch, [Req(8) for _ in range(6)], [11, 12, 13, 14, 15, 16], v1_writer(twin)
    )
    fallback.bit_check, path = bit_check(twin, tmp_path)
    fallback.stock_extend = stock_extend_of(twin)
    step.extend_input_cls = lambda **fields: SimpleNamespace(**fields)
    result = step.step(worker, batch, fallback)
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"rows": 6, "direct": 0, "packed": 6}]
    # What the scheduler reads for return_hidden_states is a copy: the stock extend graph the check
    # replays may reuse the target graph's output memory. The control: without the check, no copy.
    output = worker.target_worker.outputs[-1]
    assert result.logits_output.hidden_states is not output and torch.equal(result.logits_output.hidden_states, output)
    step, worker, batch, fallback = lean_world(
        monkeypatch, [Req(8) for _ in range(6)], [11, 12, 13, 14, 15, 16], v1_writer(V1Twin())
    )
    assert step.step(worker, batch, fallback).logits_output.hidden_states is worker.target_worker.outputs[-1]


def test_the_own_fallbacks_stand_ins_are_views_of_one_set_with_the_stock_values() -> None:
    """What the eager KV-only extend leaves (p 1, index 0, zero hidden states of the draft's width),
    as rows of tensors made once at the largest graph's capacity: every batch size gets its rows,
    and the rows handed out earlier stay what they were."""
    twin = Twin()
    twin.num_tokens_per_bs = WIDTH  # type: ignore[attr-defined]
    twin.graphs = dict.fromkeys(SIZES)  # type: ignore[attr-defined]
    write = v2.FallbackDirectWrite(twin, (HIDDEN, torch.bfloat16), log=False)
    made = []
    for rows in (3, 5, 1):
        batch, result = iteration(list(range(rows)), rows)
        result.next_draft_input = SimpleNamespace()
        write.stand_in(batch, result)
        made.append(result.next_draft_input)
    for rows, stand_in in zip((3, 5, 1), made):
        assert torch.equal(stand_in.topk_p, torch.ones(rows, 1)) and stand_in.topk_p.dtype == torch.float32
        assert torch.equal(stand_in.topk_index, torch.zeros(rows, 1, dtype=torch.int64))
        assert torch.equal(stand_in.hidden_states, torch.zeros(rows, HIDDEN, dtype=torch.bfloat16))
    for name in ("topk_p", "topk_index", "hidden_states"):
        pointers = {getattr(stand_in, name).data_ptr() for stand_in in made}
        assert len(pointers) == 1, name  # one allocation each, not one a step
        assert (
            getattr(made[0], name).untyped_storage().size() // getattr(made[0], name).element_size() >= write.capacity
        )


# -- LeanKVPrefill's shift: the same ids as 0.5.12's loop ------------------------------------------


def stock_prefill_shift() -> Any:
    """0.5.12's own shift, cut from ``EagleDraftWorker._draft_extend_for_prefill`` (the release's
    code, run as it is): its first statement, the loop over the requests."""
    import ast

    from patcher.releases import unpacked

    member = "srt/speculative/eagle_worker_v2.py"
    source = (unpacked("0.5.12", [member]) / "sglang" / member).read_text()
    worker = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "EagleDraftWorker")
    body = next(n for n in worker.body if isinstance(n, ast.FunctionDef) and n.name == "_draft_extend_for_prefill").body
    loop = next(n for n in body if isinstance(n, ast.If) and "is_idle" in ast.unparse(n.test))
    code = compile(ast.Module(body=[loop], type_ignores=[]), "0.5.12 _draft_extend_for_prefill", "exec")

    def shift(input_ids: Any, lens: list[int], next_token_ids: Any) -> None:
        batch = SimpleNamespace(
            input_ids=input_ids, extend_seq_lens=lens, forward_mode=SimpleNamespace(is_idle=lambda: False)
        )
        exec(code, {"torch": torch, "batch": batch, "next_token_ids": next_token_ids})  # noqa: S102 - the release's own lines

    return shift


WAVES = [[1], [5], [3, 1, 4], [1, 1, 1], [40, 2, 17, 1, 9], [7] * 64]


@pytest.mark.releases
@pytest.mark.parametrize("lens", WAVES, ids=[f"{len(w)}-requests" for w in WAVES])
def test_the_one_pass_shift_leaves_the_ids_0512s_loop_leaves(lens: list[int]) -> None:
    stock = stock_prefill_shift()
    generator = torch.Generator().manual_seed(len(lens) * 31 + sum(lens))
    ids = torch.randint(0, 30000, (sum(lens),), generator=generator)
    next_tokens = torch.randint(0, 30000, (len(lens),), generator=generator, dtype=torch.int64)
    expected = ids.clone()
    stock(expected, lens, next_tokens)
    got = ids.clone()
    v2.shift_for_the_draft(got, torch.tensor(lens, dtype=torch.int32), next_tokens.to(torch.int32))
    assert torch.equal(got, expected) and got.dtype == expected.dtype


@pytest.mark.releases
def test_a_shift_that_forgets_each_requests_last_slot_differs() -> None:
    """The control: the global shift alone moves the next request's first token into each last slot."""
    stock = stock_prefill_shift()
    lens = [3, 1, 4]
    ids = torch.arange(100, 108)
    next_tokens = torch.tensor([7, 8, 9])
    expected = ids.clone()
    stock(expected, lens, next_tokens)
    assert expected.tolist() == [101, 102, 7, 8, 105, 106, 107, 9]
    shifted_only = ids.clone()
    shifted_only[:-1] = ids[1:].clone()
    assert not torch.equal(shifted_only, expected)


# -- TokensToHost: the lean step's one wait, for its tokens' copy only -----------------------------------


class OnDevice(torch.Tensor):
    """A CPU tensor that says it is on a GPU, to take ``TokensToHost``'s device path here."""

    @property
    def device(self) -> Any:  # type: ignore[override]
        return torch.device("cuda", 0)


class Copied:
    """An event: ``record`` and ``synchronize`` logged in order."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def record(self, stream: Any) -> None:
        assert stream == "stream of cuda:0"  # the tokens' device's, where the copy went
        self.log.append("record")

    def synchronize(self) -> None:
        self.log.append("synchronize")


class Pinned(torch.Tensor):
    """A host buffer whose copies are logged (the fake ``torch.empty`` makes them)."""

    log: list[str] = []

    def copy_(self, source: Any, non_blocking: bool = False) -> Any:  # type: ignore[override]
        assert non_blocking
        Pinned.log.append("copy")
        return self.as_subclass(torch.Tensor).copy_(source.as_subclass(torch.Tensor))


def device_world(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[tuple[int, Any]]]:
    """Pinned buffers as plain ones (there is no driver here) whose copies log, and events that log
    their stream."""
    from patches.runtime import dynspec_runtime as rt

    log: list[str] = []
    made: list[tuple[int, Any]] = []
    empty = torch.empty
    monkeypatch.setattr(Pinned, "log", log)

    def pinned(count: int, dtype: Any, pin_memory: bool) -> Any:
        assert pin_memory
        made.append((count, dtype))
        return empty(count, dtype=dtype).as_subclass(Pinned)

    def current_stream(device: Any) -> str:
        return f"stream of {device}"

    monkeypatch.setattr(torch, "empty", pinned)
    monkeypatch.setattr(
        torch,
        "get_device_module",
        lambda device: SimpleNamespace(Event=lambda: Copied(log), current_stream=current_stream),
    )
    assert rt.TokensToHost  # imported before the patches above
    return log, made


def reads_after_the_copy(to_host: Any, log: list[str], tokens: list[int]) -> bool:
    """Whether ``to_host`` gives back ``tokens`` only after waiting for the event recorded after its copy."""
    return reads_after_the_copy_of(to_host, log, torch.tensor(tokens, dtype=torch.int32))


def reads_after_the_copy_of(to_host: Any, log: list[str], tokens: Any) -> bool:
    to_host.start(tokens.as_subclass(OnDevice))
    log.append("queued after the copy")
    read = to_host.wait()
    return read == tokens.tolist() and log[-4:] == ["copy", "record", "queued after the copy", "synchronize"]


def test_the_tokens_are_read_once_their_copy_is_done_into_one_pinned_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    from patches.runtime import dynspec_runtime as rt

    log, made = device_world(monkeypatch)
    to_host = rt.TokensToHost()
    assert reads_after_the_copy(to_host, log, [5, 6, 7])
    assert reads_after_the_copy(to_host, log, [8, 9, 10, 11])  # room for 4: the same buffer
    assert reads_after_the_copy(to_host, log, [1] * 5)  # grown to 8
    assert made == [(4, torch.int32), (8, torch.int32)]
    assert reads_after_the_copy_of(
        to_host, log, torch.tensor([3, 4], dtype=torch.int64)
    )  # another dtype: a buffer of its own
    assert made[-1] == (2, torch.int64)
    records = log.count("record")
    on_host = rt.TokensToHost()
    on_host.start(torch.tensor([1, 2]))  # CPU tokens: read as they are, no copy, no event
    assert on_host.wait() == [1, 2] and log.count("record") == records

    class Unwaited(rt.TokensToHost):  # the control: read as soon as queued
        def wait(self) -> list[int]:
            pending, self.pending = self.pending, None
            return pending.tolist()

    assert not reads_after_the_copy(Unwaited(), log, [5, 6, 7])

    class RecordedFirst(rt.TokensToHost):  # the control: the event before the copy it stands for
        def start(self, tokens: Any) -> None:
            self.copied = Copied(log)
            self.copied.record("stream of cuda:0")
            self.host = torch.empty(4, dtype=tokens.dtype, pin_memory=True)
            self.pending, self.waits = self.host[: tokens.shape[0]], True
            self.pending.copy_(tokens, non_blocking=True)

    assert not reads_after_the_copy(RecordedFirst(), log, [5, 6, 7])


# -- the verify-as-decode metadata's seq_lens + 1 (runtime) ---------------------------------------------


def test_the_plus_one_buffer_holds_seq_lens_plus_one_and_outlives_the_call() -> None:
    """One buffer per backend, grown only when a batch outgrows it: graph replays keep views of it."""
    from patches.runtime import dynspec_runtime as runtime

    class Backend(runtime.VerifyAsDecode):
        _dynspec_plus_one = None

    backend = Backend()
    first = backend._plus_one_persistent(torch.tensor([5, 9, 0], dtype=torch.int32))
    assert first.tolist() == [6, 10, 1] and first.dtype == torch.int32
    kept = backend._dynspec_plus_one
    second = backend._plus_one_persistent(torch.tensor([7, 1], dtype=torch.int32))
    assert second.tolist() == [8, 2] and backend._dynspec_plus_one is kept
    assert second.data_ptr() == first.data_ptr()  # the same rows the earlier call's views read
    big = torch.arange(300, dtype=torch.int64)
    assert backend._plus_one_persistent(big).tolist() == list(range(1, 301))
    assert backend._dynspec_plus_one is not kept  # another dtype and more rows: a new buffer
