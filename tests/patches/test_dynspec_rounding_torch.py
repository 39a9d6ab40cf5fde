"""``DirectKVWrite``'s start-up rounding check and batched write on real torch tensors (CPU).

The other direct-write tests use list-backed fakes; these run ``RoundingProbe``'s own tensor code
(seeded probe rows, index writes, byte views, block comparisons) and ``write`` / ``flush`` against
a twin whose replay is a bf16 GEMM into a real K/V buffer. A GPU is what decides which kernels
round alike (``dynspec proof``'s exact_kv); here the twin's "kernels" are told to round apart by
batch size or by row. Needs torch, which ``make test`` does not install: skipped without it.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from patches.runtime import dynspec_v2 as v2

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
    return torch.cat([pool.k_buffer[0][1:].view(torch.uint8).flatten(), pool.v_buffer[0][1:].view(torch.uint8).flatten()])


def test_graphs_of_one_kernel_round_alike_and_the_check_says_so() -> None:
    write = writer(Twin())
    assert write.rounding == [0] * len(SIZES) and write.rounding_groups() == "1-16:0"


def test_graphs_that_round_apart_by_size_or_by_row_are_told_apart() -> None:
    write = writer(Twin(apart=(12, 16), late_rows=(8,)))
    assert write.rounding == [0, 0, 0, -4, 1, 1]
    assert write.rounding_groups() == "1-4:0 | 8:by-row | 12-16:1"
    assert write.same_rounding_rows(5) == 16 and write.same_rounding_rows(20) == 0 and write.same_rounding_rows(45) == 64


@pytest.mark.parametrize(("apart", "late_rows"), [((), ()), ((12, 16), ()), ((), (8, 12, 16))])
def test_batched_writes_leave_the_bits_one_iteration_per_replay_leaves(apart: tuple[int, ...], late_rows: tuple[int, ...]) -> None:
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
    pool.k_buffer, pool.v_buffer = [pool.k_buffer[0][:64]], [pool.v_buffer[0][:64]]  # slots 0 - 63; the probe needs 1 - 64
    write = v2.StockGraphDirectWrite(twin, (HIDDEN, torch.bfloat16), log=False)
    write.round_as_stock(SimpleNamespace(server_args=SimpleNamespace(tp_size=1)))
    assert write.rounding is None and twin.replays == []
    assert [SIZES[write.replay_index[n]] for n in (3, 6, 10)] == [4, 8, 12]
    pool.k_buffer, pool.v_buffer = [torch.zeros(65, HEADS, DIM, dtype=torch.bfloat16)], [torch.zeros(65, HEADS, DIM, dtype=torch.bfloat16)]
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
