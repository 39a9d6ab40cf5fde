"""The fake server's sampling, logprobs and penalties (issue 17), and the faults that break them."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from patcher.proof.client import Client, greedy, prompt

from .fake_sglang import candidates, decode, distribution, logit_step, outputs, truncate

SAMPLED = {"temperature": 1.0, "top_k": 50, "top_p": 0.9}


def post(port: int, body: dict[str, Any]) -> Any:
    status, raw = Client("127.0.0.1", port).request("POST", "/generate", body)
    assert status == 200, raw
    return json.loads(raw)


def generate(port: int, index: int, new_tokens: int, sampling: dict[str, Any] | None = None, **fields: Any) -> Any:
    body = {**fields, "input_ids": prompt(index), "sampling_params": {**greedy(new_tokens), **(sampling or {})}}
    return post(port, body)


def test_plain_greedy_requests_are_unchanged(fake_server):
    port, _ = fake_server(delay=0)
    off, _ = fake_server(disable=0, delay=0, faults="skewsampling,logprobdrift,droppenalty,nologprobs")
    for p in (port, off):
        for i in range(4):
            reply = generate(p, i, 12)
            assert reply["output_ids"] == outputs(prompt(i), 12)
            assert reply["meta_info"] == {"completion_tokens": 12}
        assert post(p, {"input_ids": prompt(3), "sampling_params": {"max_new_tokens": 5}})["output_ids"] == outputs(
            prompt(3), 5
        )
        batch = post(p, {"input_ids": [prompt(1), prompt(2)], "sampling_params": greedy(6)})
        assert [r["output_ids"] for r in batch] == [outputs(prompt(1), 6), outputs(prompt(2), 6)]


def test_sampling_spreads_over_the_truncated_candidates(fake_server):
    port, _ = fake_server(delay=0)
    first = candidates(prompt(5), len(prompt(5)))
    step = logit_step(len(prompt(5)))
    nucleus = {t for _, t in truncate(distribution(first, {}, 1.0, 0.0, 0.0, step), 50, 0.9)}
    assert 30 <= len(nucleus) < 50
    seen = [generate(port, 5, 1, SAMPLED)["output_ids"][0] for _ in range(200)]
    assert len(set(seen)) >= 20
    assert set(seen) <= nucleus <= set(first[:50])
    # greedy with the token model: the argmax, every time
    assert {generate(port, 5, 1, {"top_k": 50})["output_ids"][0] for _ in range(5)} == {first[0]}


def test_top_k_one_and_a_low_temperature_are_greedy_like(fake_server):
    port, _ = fake_server(delay=0)
    argmax = decode(prompt(2), 8, {"temperature": 0, "top_k": 1})[0]
    assert generate(port, 2, 8, {"temperature": 1.0, "top_k": 1})["output_ids"] == argmax
    assert generate(port, 2, 8, {"temperature": 0.001})["output_ids"] == argmax


def test_logprobs_shapes(fake_server):
    port, _ = fake_server(delay=0)
    status, raw = Client("127.0.0.1", port).request(
        "POST",
        "/generate",
        {"input_ids": prompt(4), "sampling_params": greedy(8), "return_logprob": True, "top_logprobs_num": 5},
    )
    assert status == 200 and b"null" in raw  # the text of each entry, as with --skip-tokenizer-init
    reply = json.loads(raw)
    tokens, meta = reply["output_ids"], reply["meta_info"]
    chosen, top = meta["output_token_logprobs"], meta["output_top_logprobs"]
    assert len(tokens) == len(chosen) == len(top) == meta["completion_tokens"] == 8
    for token, entry, ranked in zip(tokens, chosen, top):
        assert len(ranked) == 5 and all(len(e) == 3 and e[2] is None for e in [entry, *ranked])
        assert [e[0] for e in ranked] == sorted((e[0] for e in ranked), reverse=True)
        assert entry == ranked[0] and entry[1] == token  # greedy: the top-1 entry
        assert entry[0] < 0
    # the whole distribution sums to one; without top_logprobs_num there are no top logprobs
    full = generate(port, 4, 3, return_logprob=True, top_logprobs_num=64)["meta_info"]["output_top_logprobs"]
    assert all(abs(sum(math.exp(e[0]) for e in ranked) - 1.0) < 1e-9 for ranked in full)
    meta = generate(port, 4, 3, return_logprob=True)["meta_info"]
    assert len(meta["output_token_logprobs"]) == 3 and "output_top_logprobs" not in meta
    assert "output_token_logprobs" not in generate(port, 4, 3, return_logprob=False, top_logprobs_num=2)["meta_info"]


def test_a_sampled_tokens_logprob_is_before_truncation(fake_server):
    port, _ = fake_server(delay=0)
    for _ in range(10):
        meta = generate(port, 6, 4, {"temperature": 1.0, "top_k": 3}, return_logprob=True, top_logprobs_num=3)[
            "meta_info"
        ]
        for entry, ranked in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
            assert entry in ranked  # within the top 3 ...
            assert sum(math.exp(e[0]) for e in ranked) < 0.5  # ... whose logprobs are of the full distribution (not 1)


def test_logprobs_in_a_batch(fake_server):
    port, _ = fake_server(delay=0)
    batch = post(
        port,
        {"input_ids": [prompt(1), prompt(2)], "sampling_params": greedy(4), "return_logprob": [True, False]},
    )
    assert len(batch[0]["meta_info"]["output_token_logprobs"]) == 4
    assert "output_token_logprobs" not in batch[1]["meta_info"]
    assert batch[0]["output_ids"] == decode(prompt(1), 4, {"temperature": 0})[0]


@pytest.mark.parametrize("penalty", ["frequency_penalty", "presence_penalty"])
def test_penalties_change_greedy_outputs(fake_server, penalty):
    port, _ = fake_server(delay=0)
    for i in range(8):
        plain = generate(port, i, 16, {penalty: 0.0})["output_ids"]
        assert len(set(plain)) <= 4  # unpenalized greedy decoding repeats itself
        penalized = generate(port, i, 16, {penalty: 0.5})["output_ids"]
        assert plain != penalized
        assert penalized == decode(prompt(i), 16, {"temperature": 0, penalty: 0.5}, late_penalties=True)[0]


@pytest.mark.parametrize("penalty", ["frequency_penalty", "presence_penalty"])
def test_only_penalties_tell_the_overlap_scheduler_from_v1s(fake_server, penalty):
    """As in SGLang, a server on the overlap scheduler counts a token late: penalized outputs differ
    from one with --disable-overlap-schedule, unpenalized ones and sampled distributions do not."""
    overlap, _ = fake_server(delay=0)
    v1_port, v1 = fake_server(delay=0)
    v1.overlap = False
    apart = 0
    for i in range(8):
        assert generate(overlap, i, 16, {penalty: 0.0}) == generate(v1_port, i, 16, {penalty: 0.0})
        late, counted = (generate(port, i, 16, {penalty: 0.5})["output_ids"] for port in (overlap, v1_port))
        assert counted == decode(prompt(i), 16, {"temperature": 0, penalty: 0.5})[0]
        apart += late != counted
    assert apart == 8
    sampled = {**SAMPLED, "sampling_seed": 7}
    assert generate(overlap, 1, 8, sampled) == generate(v1_port, 1, 8, sampled)


def skewed(reply: Any) -> Any:
    return reply["meta_info"]["output_top_logprobs"]  # the distribution; the tokens are random


def whole(reply: Any) -> Any:
    meta = {k: v for k, v in reply["meta_info"].items() if k != "spec_verify_ct"}  # always-on speculation's
    return reply["output_ids"], meta


FAULTS = {  # fault: (request's sampling, top-level fields, what to compare)
    "skewsampling": (SAMPLED, {"return_logprob": True, "top_logprobs_num": 5}, skewed),
    "logprobdrift": ({}, {"return_logprob": True, "top_logprobs_num": 3}, whole),
    "droppenalty": ({"frequency_penalty": 0.5}, {}, whole),
    "nologprobs": ({}, {"return_logprob": True}, whole),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_fault_hits_only_requests_that_arrive_while_off(fake_server, fault):
    sampling, fields, observe = FAULTS[fault]

    def seen(port: int) -> Any:
        # 16 tokens: an overlap server's penalties count a period late (fake_sglang.decode)
        return observe(generate(port, 3, 16, sampling, **fields))

    reference = seen(fake_server(delay=0)[0])
    base, _ = fake_server(delay=0, faults=fault)
    always, _ = fake_server(speculative=True, delay=0, faults=fault)
    on, on_state = fake_server(disable=4, delay=0, faults=fault)
    clean_off, _ = fake_server(disable=0, delay=0)
    off, off_state = fake_server(disable=0, delay=0, faults=fault)
    for port in (base, always, on, clean_off):
        assert seen(port) == reference
    broken = seen(off)
    assert on_state.on and not off_state.on  # the requests arrived while on, and while off
    assert broken != reference
    if fault == "skewsampling":  # the distribution of 0.7x the temperature
        expected = decode(prompt(3), 16, {**sampling, "temperature": 0.7})[2]
        assert [[t for _, t, _ in ranked] for ranked in broken] == [[t for _, t in r[:5]] for r in expected]
        assert [lp for ranked in broken for lp, _, _ in ranked] == pytest.approx(
            [lp for r in expected for lp, _ in r[:5]]
        )
    elif fault == "logprobdrift":
        tokens, meta = broken
        assert tokens == reference[0]
        for got, want in zip(meta["output_token_logprobs"], reference[1]["output_token_logprobs"]):
            assert got[0] == pytest.approx(want[0] + 0.2) and got[1:] == want[1:]
        for got, want in zip(meta["output_top_logprobs"], reference[1]["output_top_logprobs"]):
            assert [e[0] for e in got] == pytest.approx([e[0] + 0.2 for e in want])
    elif fault == "droppenalty":
        assert broken[0] == decode(prompt(3), 16, {"temperature": 0})[0]
    else:
        assert broken[0] == reference[0] and "output_token_logprobs" not in broken[1]
