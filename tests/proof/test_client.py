from __future__ import annotations

import hashlib
import json
import socket

import pytest

from patcher.proof import client as client_module
from patcher.proof.client import Client, LevelResult, Reply, digest, measure_level, prompt, run_level

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
    ("durations", "median_seconds"), [([9.0, 1.0, 3.0, 2.0], 2.0), ([9.0, 1.0, 2.0], 2.0)], ids=["odd", "even: the slower middle"]
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
