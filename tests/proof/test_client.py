from __future__ import annotations

import hashlib
import json
import socket
import threading
import time

import pytest

from patcher.proof import client as client_module
from patcher.proof.client import (
    Client,
    LevelResult,
    Reply,
    Request,
    digest,
    measure_level,
    prompt,
    run_batches,
    run_level,
    run_requests,
)

from .fake_sglang import outputs


def test_prompt_matches_the_shared_gpu_client():
    # shared/gpu/client.py: [(i * 7919 + j * 104729) % 31000 + 100 for j in range(32 + i % 16)]
    assert prompt(0)[:3] == [100, 104729 % 31000 + 100, 209458 % 31000 + 100]
    assert len(prompt(0)) == 32 and len(prompt(15)) == 47 and len(prompt(16)) == 32
    assert all(100 <= t < 31100 for i in range(200) for t in prompt(i))


def test_digest_is_the_shared_gpu_client_digest():
    outs = {3: [5, 6], 1: [7], 2: [8, 9, 10]}
    res = [(i, o, None) for i, o in outs.items()]
    expected = hashlib.sha256(json.dumps(sorted((i, o) for i, o, _ in res)).encode()).hexdigest()[:12]
    assert digest(outs) == expected
    assert digest({1: [7], 2: [8, 9, 11], 3: [5, 6]}) != expected


def test_generate_returns_the_servers_tokens(fake_server):
    port, state = fake_server()
    reply = Client("127.0.0.1", port).generate(7, 12)
    assert reply.error is None and reply.status == 200
    assert reply.output_ids == outputs(prompt(7), 12)
    assert state.generates == 1


def test_a_level_sends_all_requests_at_once(fake_server):
    port, state = fake_server(delay=0.3)
    level = run_level(Client("127.0.0.1", port), range(16), 8)
    assert state.max_inflight == 16
    assert [r.index for r in level.replies] == list(range(16))
    assert level.tokens == 16 * 8
    assert level.seconds < 16 * 0.3  # concurrent, not one after the other
    assert level.tok_s == level.tokens / level.seconds
    assert level.outputs[5] == outputs(prompt(5), 8)
    assert level.failures == []


def test_non_200_replies_are_failures_and_not_counted(fake_server):
    port, _ = fake_server(faults="http500")
    level = run_level(Client("127.0.0.1", port), range(10), 4)
    failed = [r for r in level.replies if r.error]
    assert len(failed) == 2 and all(r.status == 500 and "HTTP 500" in (r.error or "") for r in failed)
    assert len(level.failures) == 2
    assert level.tokens == 8 * 4


def test_a_reply_with_the_wrong_token_count_is_a_failure(fake_server):
    port, _ = fake_server(faults="short")
    reply = Client("127.0.0.1", port).generate(0, 6)
    assert reply.status == 200
    assert reply.error == "5 tokens instead of 6 (ignore_eos is set)"


def test_no_server_is_a_failure_not_an_exception():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    reply = Client("127.0.0.1", port, timeout=2).generate(0, 4)
    assert reply.status == 0 and (reply.error or "").startswith("no answer")


def test_accept_length_comes_from_spec_verify_ct(fake_server, monkeypatch):
    port, state = fake_server(speculative=True)
    state.acc = 3.0
    level = run_level(Client("127.0.0.1", port), range(2), 12)
    assert level.accept_length == 3.0
    port2, _ = fake_server(speculative=False)
    assert run_level(Client("127.0.0.1", port2), range(2), 12).accept_length is None


def test_a_measured_level_is_warmed_up_then_the_median_of_its_timed_runs(fake_server):
    port, state = fake_server()
    level = measure_level(Client("127.0.0.1", port), range(4), 8, warmup=True, repeats=3)
    assert state.generates == 4 * (1 + 3)  # the warm-up run is sent but not timed
    assert len(level.samples) == 3 and level.failures == []
    assert round(level.tok_s, 1) == sorted(level.samples)[1]


def _timed(seconds: float, error: str | None = None) -> LevelResult:
    return LevelResult(1, 10, seconds, [Reply(0, 200 if error is None else 500, [1] * 10, {}, seconds, error)])


@pytest.mark.parametrize(
    ("durations", "median_seconds"),
    [([9.0, 1.0, 3.0, 2.0], 2.0), ([9.0, 1.0, 2.0], 2.0)],
    ids=["odd", "even: the slower middle"],
)
def test_the_median_run_counts_and_the_warm_up_does_not(monkeypatch, durations, median_seconds):
    runs = iter(_timed(s) for s in durations)
    monkeypatch.setattr(client_module, "run_level", lambda *a: next(runs))
    level = measure_level(None, range(1), 10, warmup=True, repeats=len(durations) - 1)  # type: ignore[arg-type]
    assert level.seconds == median_seconds  # the slow first (warm-up) run is not among the samples
    assert level.samples == tuple(round(10 / s, 1) for s in durations[1:])


def test_a_failing_run_is_returned_not_hidden_by_the_median(monkeypatch):
    runs = iter([_timed(1.0), _timed(1.0, error="HTTP 500"), _timed(1.0)])
    monkeypatch.setattr(client_module, "run_level", lambda *a: next(runs))
    level = measure_level(None, range(1), 10, warmup=False, repeats=3)  # type: ignore[arg-type]
    assert level.failures == ["prompt 0: HTTP 500"]


class RecordingClient:
    """Stands in for Client in run_requests: each generate takes ``seconds``; what was in flight is logged."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.lock = threading.Lock()
        self.inflight = self.max_inflight = 0
        self.calls: list[tuple[float, int, str | None]] = []  # (start, index, rid)

    def generate(self, index: int, new_tokens: int, rid: str | None = None, *_parameters: object) -> Reply:
        with self.lock:
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            self.calls.append((time.perf_counter(), index, rid))
        time.sleep(self.seconds)
        with self.lock:
            self.inflight -= 1
        return Reply(index, 200, [index] * new_tokens, {}, self.seconds)


def test_run_requests_is_a_closed_loop_of_at_most_concurrency_in_flight():
    client = RecordingClient(0.05)
    requests = [Request(i, 3) for i in range(10)]
    level = run_requests(client, requests, concurrency=3)  # type: ignore[arg-type]
    assert client.max_inflight == 3
    order = [index for _, index, _ in sorted(client.calls)]
    # rounds of three, in order: each freed slot takes the next request
    assert [set(order[i : i + 3]) for i in range(0, 10, 3)] == [{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9}]
    assert 4 * 0.05 <= level.seconds < 10 * 0.05  # ceil(10 / 3) rounds, not one request after the other
    assert (level.concurrency, level.new_tokens, [r.index for r in level.replies]) == (3, 3, list(range(10)))
    assert level.tokens == 30 and level.failures == []


def test_run_requests_holds_each_request_back_by_its_delay():
    client = RecordingClient(0.01)
    requests = [Request(0, 1), Request(1, 1, delay=0.2), Request(2, 1), Request(3, 1, delay=0.1)]
    started = time.perf_counter()
    level = run_requests(client, requests, concurrency=len(requests))  # type: ignore[arg-type]
    start_of = {index: at - started for at, index, _ in client.calls}
    assert start_of[0] < 0.05 and start_of[2] < 0.05
    assert 0.1 <= start_of[3] < 0.2 <= start_of[1]
    assert level.seconds >= 0.2


def test_run_requests_sends_each_requests_rid(fake_server):
    port, state = fake_server()
    requests = [
        Request(1, 2, rid="dynspec-record-0-long-1"),
        Request(2, 2),
        Request(3, 2, rid="dynspec-record-0-short-3"),
    ]
    level = run_requests(Client("127.0.0.1", port), requests, concurrency=1)
    assert level.failures == [] and level.outputs[2] == outputs(prompt(2), 2)
    assert state.rids == ["dynspec-record-0-long-1", None, "dynspec-record-0-short-3"]  # no rid: none in the body
    assert state.max_inflight == 1


def test_run_requests_with_nothing_to_send():
    level = run_requests(RecordingClient(0.0), [], concurrency=4)  # type: ignore[arg-type]
    assert (level.replies, level.new_tokens, level.concurrency) == ([], 0, 4)


def test_a_batch_is_one_call_with_a_reply_per_request_in_order(fake_server):
    port, state = fake_server()
    requests = [Request(3, 4, rid="dynspec-record-0-long-3"), Request(1, 2, rid="dynspec-record-0-short-1")]
    replies = Client("127.0.0.1", port).generate_batch(requests)
    assert [(r.index, r.error, r.output_ids) for r in replies] == [
        (3, None, outputs(prompt(3), 4)),
        (1, None, outputs(prompt(1), 2)),
    ]
    assert sorted(state.rids, key=str) == ["dynspec-record-0-long-3", "dynspec-record-0-short-1"]
    assert Client("127.0.0.1", port).generate_batch([]) == []


def test_a_failed_batch_fails_every_request_of_it(fake_server):
    port, _ = fake_server(faults="http500")  # the 5th request of the server fails, so the call does
    replies = Client("127.0.0.1", port).generate_batch([Request(i, 2) for i in range(6)])
    assert len(replies) == 6 and all(r.status == 500 and "HTTP 500" in (r.error or "") for r in replies)
    port2, _ = fake_server(faults="short")
    assert all(
        r.error == "1 tokens instead of 2 (ignore_eos is set)"
        for r in Client("127.0.0.1", port2).generate_batch([Request(0, 2)])
    )


def test_a_batch_names_every_rid_or_none():
    with pytest.raises(ValueError, match="every request's rid or none"):
        Client("127.0.0.1", 1).generate_batch([Request(0, 1, rid="a"), Request(1, 1)])


class BatchRecordingClient:
    """Stands in for Client in run_batches: logs each batch call's start and indices."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, list[int]]] = []
        self.lock = threading.Lock()

    def generate_batch(self, requests: list[Request]) -> list[Reply]:
        with self.lock:
            self.calls.append((time.perf_counter(), [r.index for r in requests]))
        return [Reply(r.index, 200, [r.index] * r.new_tokens, {}, 0.0) for r in requests]


def test_run_batches_sends_each_delay_group_as_one_call_at_its_delay():
    client = BatchRecordingClient()
    requests = [
        Request(0, 2),
        Request(1, 2, delay=0.2),
        Request(2, 2),
        Request(3, 1, delay=0.2),
        Request(4, 2, delay=0.1),
    ]
    started = time.perf_counter()
    level = run_batches(client, requests)  # type: ignore[arg-type]
    calls = sorted((round(at - started, 2), indices) for at, indices in client.calls)
    assert [indices for _, indices in calls] == [[0, 2], [4], [1, 3]]  # one call per delay, requests in order
    assert calls[0][0] < 0.05 and 0.1 <= calls[1][0] < 0.2 <= calls[2][0]
    assert [r.index for r in level.replies] == [0, 1, 2, 3, 4] and level.tokens == 9
    assert (level.concurrency, level.new_tokens) == (5, 2)
    # Negative control: run_requests sends the same requests one call each.
    single = RecordingClient(0.0)
    run_requests(single, requests, concurrency=len(requests))  # type: ignore[arg-type]
    assert len(single.calls) == 5


def test_a_batched_wave_is_admitted_together(fake_server):
    port, state = fake_server(delay=0.2)
    level = run_batches(Client("127.0.0.1", port), [Request(i, 3, rid=f"r{i}") for i in range(8)])
    assert level.failures == [] and state.max_inflight == 8
    assert level.outputs == {i: outputs(prompt(i), 3) for i in range(8)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_socket_the_kernel_joined_to_itself_is_no_answer(monkeypatch, fake_server):
    """Polling a port of the ephemeral range where nothing listens can connect a socket to itself
    (TCP simultaneous open; a refusal server's wait_ready met it in session 45's make test): the
    request comes back as the "answer", ``BadStatusLine: GET /health HTTP/1.1``. The client says there
    is no answer, as a refused connection. Forced here by binding the client's socket to the port it
    dials; the control: a real server's answer through the same bound-socket path is read as one."""
    port = free_port()
    bound = client_module.http.client.HTTPConnection

    def to_itself(host, dialled, timeout):
        return bound(host, dialled, timeout=timeout, source_address=(host, port))

    monkeypatch.setattr(client_module.http.client, "HTTPConnection", to_itself)
    with pytest.raises(ConnectionRefusedError, match=f"nothing listens on port {port}"):
        Client("127.0.0.1", port, timeout=2).request("GET", "/health")
    served, _ = fake_server()
    port = free_port()  # a fresh source port, not the server's
    assert Client("127.0.0.1", served, timeout=2).request("GET", "/health")[0] == 200


def test_a_listener_that_does_not_speak_http_is_no_answer():
    """An echo on the port (what a self-joined socket amounts to) reads as no answer, an OSError that
    wait_ready takes for "not listening yet", not an http.client error that would end the proof."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def echo():
            conn, _ = listener.accept()
            with conn:
                conn.sendall(conn.recv(4096))

        threading.Thread(target=echo, daemon=True).start()
        with pytest.raises(ConnectionError, match="no HTTP answer on port .*BadStatusLine"):
            Client("127.0.0.1", listener.getsockname()[1], timeout=2).request("GET", "/health")
