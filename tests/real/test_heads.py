"""The EAGLE-3 head: its checkpoint layout (SGLang's LlamaForCausalLMEagle3 names and shapes) checked
without torch, with negative controls; with torch, the trainer on a tiny synthetic target, the chain
walk that measures acceptance, and the parallel unroll against a step-by-step chain."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

np = pytest.importorskip("numpy")

from patcher.errors import ModelInvalid, ModelMissing  # noqa: E402
from patcher.real import heads, tensorfile  # noqa: E402

TARGET = {
    "hidden_size": 64,
    "vocab_size": 300,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def head_config(**changes: Any) -> dict[str, Any]:
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1, "hidden_size": 64, "vocab_size": 300,
        "draft_vocab_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 48, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
    }  # fmt: skip
    config.update(changes)
    return config


def shapes(c: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    h, dv, v, f = c["hidden_size"], c["draft_vocab_size"], c["vocab_size"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    return {
        "fc.weight": ((h, 3 * h), "BF16"), "norm.weight": ((h,), "BF16"), "lm_head.weight": ((dv, h), "BF16"),
        "d2t": ((dv,), "I64"), "t2d": ((v,), "BOOL"),
        "midlayer.input_layernorm.weight": ((h,), "BF16"), "midlayer.hidden_norm.weight": ((h,), "BF16"),
        "midlayer.post_attention_layernorm.weight": ((h,), "BF16"),
        "midlayer.self_attn.q_proj.weight": ((q, 2 * h), "BF16"), "midlayer.self_attn.k_proj.weight": ((kv, 2 * h), "BF16"),
        "midlayer.self_attn.v_proj.weight": ((kv, 2 * h), "BF16"), "midlayer.self_attn.o_proj.weight": ((h, q), "BF16"),
        "midlayer.mlp.gate_proj.weight": ((f, h), "BF16"), "midlayer.mlp.up_proj.weight": ((f, h), "BF16"),
        "midlayer.mlp.down_proj.weight": ((h, f), "BF16"),
    }  # fmt: skip


def write_head(path: Path, config: dict[str, Any], drop: str = "", extra: str = "", resize: str = "") -> Path:
    path.mkdir(parents=True)
    tensors = {}
    for name, (shape, dtype) in shapes(config).items():
        if name == drop:
            continue
        if name == resize:
            shape = (shape[0] + 1, *shape[1:])
        tensors[name] = (
            np.zeros(shape, dtype=np.bool_ if dtype == "BOOL" else np.int64 if dtype == "I64" else np.float32),
            dtype,
        )
    if extra:
        tensors[extra] = (np.zeros(4, dtype=np.float32), "BF16")
    tensorfile.write(path / "model.safetensors", tensors)
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_a_head_in_sglangs_layout_passes(tmp_path: Path) -> None:
    config = heads.check_head(write_head(tmp_path / "head", head_config()), TARGET)
    assert config["draft_vocab_size"] == 32


@pytest.mark.parametrize(
    ("config", "damage", "words"),
    [
        (head_config(), {"drop": "midlayer.hidden_norm.weight"}, "no midlayer.hidden_norm.weight"),
        (head_config(), {"resize": "fc.weight"}, "fc.weight has shape [65, 192], expected [64, 192]"),
        (head_config(), {"extra": "embed_tokens.weight"}, "unexpected tensor(s) embed_tokens.weight"),
        (head_config(hidden_size=128), {}, "hidden_size 128 does not match the target's 64"),
        (head_config(vocab_size=301), {}, "vocab_size 301 does not match the target's 300"),
        (head_config(num_hidden_layers=2), {}, "not a one-layer LlamaForCausalLMEagle3 head"),
        (head_config(architectures=["LlamaForCausalLM"]), {}, "not a one-layer LlamaForCausalLMEagle3 head"),
        (head_config(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 6]}), {}, "are not layers of the target"),
    ],
    ids=["missing", "shape", "extra", "hidden", "vocab", "layers", "architecture", "aux-layers"],
)
def test_a_head_that_does_not_fit_is_refused(
    tmp_path: Path, config: dict[str, Any], damage: dict[str, str], words: str
) -> None:
    with pytest.raises(ModelInvalid) as caught:
        heads.check_head(write_head(tmp_path / "head", config, **damage), TARGET)
    assert words in str(caught.value)


def test_a_missing_head_is_its_own_error(tmp_path: Path) -> None:
    with pytest.raises(ModelMissing):
        heads.check_head(tmp_path / "nope", TARGET)


def test_the_chain_walk_advances_by_accepted_plus_one() -> None:
    torch = pytest.importorskip("torch", reason="the [real] extra")
    from patcher.real import eagle3

    tokens = torch.tensor([9, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10])  # prompt of 2, continuation from index 2
    drafts = torch.zeros(len(tokens), 3, dtype=torch.long)
    drafts[1] = torch.tensor([2, 3, 0])  # round at t=2 (extend ends at 1): tokens[3], [4] right, then wrong
    drafts[4] = torch.tensor([5, 6, 7])  # round at t=5: all three right
    drafts[8] = torch.tensor([0, 0, 0])  # round at t=9 would need tokens up to 12: not played
    assert eagle3.accept_walk(tokens, drafts, 2) == (3 + 4, 2)  # 2 -> 5 -> 9; then 9 + 3 >= 12 stops


def test_each_step_predicts_the_token_after_its_input() -> None:
    """On a continuation (the target's argmax at j is token j + 1), step k at i reads token i + 1 + k
    and is trained towards token i + 2 + k, never towards its own input (what a label shifted one
    place too few teaches: to copy, which scores well in training and accepts nothing)."""
    torch = pytest.importorskip("torch", reason="the [real] extra")
    from patcher.real import eagle3

    tokens = torch.arange(10, 22)[None]  # a continuation: 10, 11, ..., 21
    labels = torch.cat([tokens[:, 1:], torch.tensor([[-1]])], 1)  # argmax at j = token j + 1
    for k in range(eagle3.STEPS):
        inputs, want = eagle3.step_inputs(tokens, k), eagle3.step_labels(labels, k)
        for i in range(12 - 2 - k):
            assert int(inputs[0, i]) == int(tokens[0, i + 1 + k]) and int(want[0, i]) == int(tokens[0, i + 2 + k])
        assert int(want[0, 12 - 2 - k]) == -1  # past the end: not trained


def tiny_training(prompt_tokens: int, new_tokens: int) -> tuple[Any, list[Any], Any]:
    """The tiny target, its greedy continuations of 12 seeded random prompts, and a recipe that trains
    a head on them in seconds (the caller has skipped without torch and transformers)."""
    import torch

    from patcher.real import eagle3
    from tests.real.test_generate import tiny_target

    target = tiny_target()
    g = torch.Generator().manual_seed(1)
    prompts = [(f"t/{i}", torch.randint(3, 300, (prompt_tokens,), generator=g).tolist()) for i in range(12)]
    samples = eagle3.generate(target, prompts, new_tokens, 6, lambda m: None)
    return target, samples, eagle3.Recipe(draft_vocab=64, intermediate=48, epochs=8, batch_tokens=200, lr=3e-3)


def test_training_is_deterministic_and_learns_a_tiny_target(tmp_path: Path) -> None:
    """A tiny random llama target whose 'continuations' are its own greedy tokens: two runs of the
    recipe give the same head; it beats an untrained head; the saved head passes check_head."""
    torch = pytest.importorskip("torch", reason="the [real] extra")
    pytest.importorskip("transformers", reason="the [real] extra")
    from patcher.real import eagle3

    target, samples, recipe = tiny_training(prompt_tokens=12, new_tokens=24)
    head, head_cfg, _ = eagle3.train(target, samples, recipe, lambda m: None)
    again, _, _ = eagle3.train(target, samples, recipe, lambda m: None)
    for (name, a), b in zip(head.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name
    trained = eagle3.acceptance(head, target, samples)["accept_length"]
    untrained = eagle3.acceptance(eagle3.Eagle3Head(head_cfg, 300), target, samples)["accept_length"]
    assert trained > untrained
    eagle3.save(head, head_cfg, tmp_path / "head")
    heads.check_head(tmp_path / "head", {**target.model.config.to_dict(), "num_hidden_layers": 6})
    written = tensorfile.read(tmp_path / "head" / "model.safetensors")
    assert written["d2t"].dtype == np.int64 and written["t2d"].dtype == np.bool_ and int(written["t2d"].sum()) == 64
    hot = written["d2t"] + np.arange(64)  # SGLang's hot_token_id
    assert np.array_equal(np.flatnonzero(written["t2d"]), np.sort(hot))


def test_the_parallel_unroll_is_the_chain_decoded_step_by_step() -> None:
    """The chain as SGLang runs it, one query at a time over a KV cache: the extend's keys up to i
    (target features), then step 1 at position i + 1 and step 2 at i + 2, each attending to the
    extend's keys and the chain's own; its logits equal the parallel unroll's at row i."""
    torch = pytest.importorskip("torch", reason="the [real] extra")
    import math

    from patcher.real import eagle3

    torch.manual_seed(3)
    config = {**head_config(draft_vocab_size=300), "rope_theta": 10000.0, "rms_norm_eps": 1e-5}
    head = eagle3.Eagle3Head(config, 300)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.2)
    head.d2t.zero_()  # the draft vocabulary is the target's
    embed = torch.nn.Embedding(300, 64)
    n = 10
    tokens = torch.randint(0, 300, (1, n))
    aux = torch.randn(1, n, 3 * 64)

    def chain(k: int, previous: torch.Tensor | None) -> torch.Tensor:
        if k == 0:
            return embed(eagle3.step_inputs(tokens, 0))
        assert previous is not None
        return embed(previous.argmax(-1))

    with torch.no_grad():
        parallel = head.unroll(chain, aux, torch.ones(1, n, dtype=torch.bool), eagle3.STEPS)
        layer, attn = head.midlayer, head.midlayer.self_attn
        group = head.heads // head.kv_heads

        def qkv(e: torch.Tensor, h: torch.Tensor, pos: int) -> tuple[torch.Tensor, ...]:
            x = torch.cat([layer.input_layernorm(e), layer.hidden_norm(h)], -1)
            q = attn.q_proj(x).view(1, head.heads, 1, head.head_dim)
            k = attn.k_proj(x).view(1, head.kv_heads, 1, head.head_dim)
            v = attn.v_proj(x).view(1, head.kv_heads, 1, head.head_dim)
            at = torch.tensor([pos])
            return (
                eagle3.rope(q, at, head.theta),
                eagle3.rope(k, at, head.theta).repeat_interleave(group, 1),
                v.repeat_interleave(group, 1),
            )

        for i in range(n - eagle3.STEPS):
            keys, values = [], []
            for j in range(i + 1):  # the extend: token j + 1 with the target's features at j
                _, k, v = qkv(embed(tokens[:, j + 1]), head.fc(aux[:, j]), j)
                keys.append(k)
                values.append(v)
            e, h = embed(tokens[:, i + 1]), head.fc(aux[:, i])
            for step in range(eagle3.STEPS):
                q, k, v = qkv(e, h, i + step)
                if step:  # the extend wrote position i itself; later steps add their own
                    keys.append(k)
                    values.append(v)
                scores = torch.cat([q @ kk.transpose(-1, -2) for kk in keys], -1) / math.sqrt(head.head_dim)
                mixed = torch.softmax(scores, -1) @ torch.cat(values, 2)
                residual = attn.o_proj(mixed.transpose(1, 2).reshape(1, -1)) + h
                h = layer.mlp(layer.post_attention_layernorm(residual)) + residual
                logits = head.lm_head(head.norm(h))
                assert torch.allclose(logits, parallel[step][:, i], atol=1e-4), (i, step)
                e = embed(logits.argmax(-1))


def test_the_head_starts_from_the_targets_lm_head_and_norm() -> None:
    """Recipe.lm_head "target": before any step, the head's lm_head rows are the target's output rows
    of the draft vocabulary and its norm the target's final norm; "random" (the control) is not."""
    torch = pytest.importorskip("torch", reason="the [real] extra")
    pytest.importorskip("transformers", reason="the [real] extra")
    from patcher.errors import UsageError
    from patcher.real import eagle3
    from tests.real.test_generate import tiny_target

    target = tiny_target()
    with torch.no_grad():
        target.model.get_decoder().norm.weight.mul_(1.5)  # not the ones a fresh norm starts from
    recipe = eagle3.Recipe(draft_vocab=64, intermediate=48, epochs=1)
    config = eagle3.head_config(target.config, recipe, target.aux_layers)
    hot = torch.arange(100, 164)
    head = eagle3.Eagle3Head(config, 300)
    eagle3.start_from_target(head, target, hot)
    assert torch.equal(head.lm_head.weight, target.model.get_output_embeddings().weight[hot])
    assert torch.equal(head.norm.weight, target.model.get_decoder().norm.weight)
    fresh = eagle3.Eagle3Head(config, 300)
    assert not torch.equal(fresh.lm_head.weight, head.lm_head.weight) and not torch.equal(
        fresh.norm.weight, head.norm.weight
    )
    with pytest.raises(UsageError, match="--lm-head middle: one of target, random"):
        eagle3.check_recipe(eagle3.Recipe(lm_head="middle"))


def test_a_stale_span_costs_a_trained_head_its_context() -> None:
    """stale_kv_cost zeroes the draft K/V of the continuation's first positions (a fallback that
    skipped the draft extend) and walks from the span's end: an untouched span is the control."""
    torch = pytest.importorskip("torch", reason="the [real] extra")
    pytest.importorskip("transformers", reason="the [real] extra")
    from patcher.real import eagle3

    target, samples, recipe = tiny_training(prompt_tokens=8, new_tokens=40)
    head, _, _ = eagle3.train(target, samples, recipe, lambda m: None)
    cost = eagle3.stale_kv_cost(head, target, samples, spans=(16, 60))
    assert list(cost) == ["16"]  # a span that leaves too little after it is not measured
    row = cost["16"]
    assert row["prompts"] == 12 and row["rounds"] > 0 and row["stale"] != row["exact"]
    assert row["ratio"] == round(row["stale"] / row["exact"], 4)
    made = eagle3.chain_drafts(head, target, samples)  # build's drafts, passed in: the same numbers
    assert eagle3.stale_kv_cost(head, target, samples, spans=(16, 60), exact=made) == cost
    assert eagle3.acceptance(head, target, samples, made) == eagle3.acceptance(head, target, samples)
    with torch.no_grad():
        exact = eagle3.chain_drafts(head, target, samples)
        assert all(torch.equal(a, b) for a, b in zip(exact, eagle3.chain_drafts(head, target, samples, 0)))
        stale = eagle3.chain_drafts(head, target, samples, 16)
    assert any(not torch.equal(a, b) for a, b in zip(exact, stale))


def test_self_written_queries_sit_between_the_chat_templates_halves() -> None:
    """self_prompts samples queries after the prefix, cuts each at EOS, drops short ones and repeats,
    and wraps them; the same recipe gives the same queries."""
    torch = pytest.importorskip("torch", reason="the [real] extra")
    pytest.importorskip("transformers", reason="the [real] extra")
    from patcher.real import eagle3
    from tests.real.test_generate import tiny_target

    eos = 7
    target = tiny_target(eos=eos)
    with torch.no_grad():  # make EOS likely, so that some queries end early
        target.model.get_output_embeddings().weight[eos] *= 4
    chat = ([1, 20, 21], [2, 30])
    recipe = eagle3.Recipe(self_prompts=24, self_prompt_tokens=12, gen_batch=8)
    made = eagle3.self_prompts(target, chat, recipe, lambda m: None)
    assert made == eagle3.self_prompts(target, chat, recipe, lambda m: None)
    assert 0 < len(made) <= 24 and [p.id for p in made] == [f"self/{i}" for i in range(len(made))]
    queries = [p.ids[3:-2] for p in made]
    assert all(p.ids[:3] == [1, 20, 21] and p.ids[-2:] == [2, 30] for p in made)
    assert all(eagle3.MIN_QUERY <= len(q) <= 12 and eos not in q for q in queries)
    assert len({tuple(q) for q in queries}) == len(queries)
    assert any(len(q) < 12 for q in queries)  # some were cut at EOS (the control: nothing is cut without EOS)
    uncut = eagle3.self_prompts(tiny_target(), chat, recipe, lambda m: None)
    assert all(len(p.ids) == 3 + 12 + 2 for p in uncut)


def test_self_prompts_without_the_chat_ids_is_a_usage_error(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the [real] extra")
    from patcher.errors import UsageError
    from patcher.real import eagle3

    train, held = tmp_path / "train.json", tmp_path / "held.json"
    train.write_text(json.dumps({"split": "train", "prompts": [{"id": "a/1", "input_ids": [5, 6]}]}))
    held.write_text(json.dumps({"split": "held_out", "prompts": [{"id": "b/1", "input_ids": [5, 7]}]}))
    with pytest.raises(UsageError, match="--self-prompts needs the chat template's ids"):
        eagle3.build(
            tmp_path / "target", tmp_path / "head", eagle3.Recipe(self_prompts=4), lambda m: None, (train, held)
        )
    with pytest.raises(UsageError, match="--self-prompts -1: at least 0"):
        eagle3.check_recipe(eagle3.Recipe(self_prompts=-1))
