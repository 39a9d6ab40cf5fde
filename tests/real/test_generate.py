"""The head's training data on any device: ``eagle3.generate`` (many prompts at once, left padded,
over a KV cache, greedy and seeded sampled continuations) against transformers' own ``generate``
one prompt at a time, with a negative control; the sampled continuations' determinism and their
hidden states; the recipe's flags (one-line errors); the prompt files; a whole build on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the [real] extra")
transformers = pytest.importorskip("transformers", reason="the [real] extra")

from patcher.errors import ModelInvalid, ModelMissing, UsageError  # noqa: E402
from patcher.real import eagle3, heads  # noqa: E402

NEW = 12


def tiny_target(eos: int | None = None) -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rope_theta=10000.0, tie_word_embeddings=True,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    model.train(False)
    if eos is not None:  # where transformers' generate would stop, unless told not to
        model.config.eos_token_id = model.generation_config.eos_token_id = eos
    return eagle3.Target(model, {**config.to_dict(), "eos_token_id": eos}, eagle3.default_aux_layers(6))


def tiny_prompts(count: int = 7) -> list[tuple[str, list[int]]]:
    g = torch.Generator().manual_seed(1)
    lengths = [3, 9, 5, 14, 9, 2, 11, 6][:count]  # unequal: batches are left padded
    return [(f"t/{i}", torch.randint(3, 300, (n,), generator=g).tolist()) for i, n in enumerate(lengths)]


def same(a: eagle3.Sample, b: eagle3.Sample) -> bool:
    """Same tokens and labels, features equal to float16 storage (and float32 batch-order) precision."""
    return (
        a.id == b.id
        and a.prompt_len == b.prompt_len
        and torch.equal(a.tokens, b.tokens)
        and torch.equal(a.labels, b.labels)
        and a.aux.shape == b.aux.shape
        and bool(torch.allclose(a.aux.float(), b.aux.float(), atol=2e-3, rtol=1e-3))
    )


@pytest.fixture(scope="module")
def eos_target() -> Any:
    """A target whose EOS is a token its greedy continuations produce, so they run through it."""
    plain = tiny_target()
    first = eagle3.generate_hf(plain, tiny_prompts(), NEW, 1, lambda m: None)
    counts = torch.bincount(torch.cat([s.tokens[s.prompt_len :] for s in first]), minlength=300)
    return tiny_target(eos=int(counts.argmax()))


@pytest.fixture(scope="module")
def reference(eos_target: Any) -> list[eagle3.Sample]:
    return eagle3.generate_hf(eos_target, tiny_prompts(), NEW, 1, lambda m: None)  # one at a time: no padding


@pytest.mark.parametrize("batch", [7, 3, 1])
def test_batched_generation_is_transformers_generate_one_prompt_at_a_time(
    eos_target: Any, reference: list[eagle3.Sample], batch: int
) -> None:
    got = eagle3.generate(eos_target, tiny_prompts(), NEW, batch, lambda m: None)
    assert [s.id for s in got] == [s.id for s in reference]
    for a, b in zip(reference, got):
        assert same(a, b), a.id
        assert int(b.labels[-1]) == -1 and not b.aux[-1].any()  # the last token: never fed, never a label
    eos = eos_target.config["eos_token_id"]
    # generated where it is the argmax, and the continuation goes on after it (SGLang's ignore_eos),
    # in transformers' generate too, whose generation config names that EOS
    assert eos_target.model.generation_config.eos_token_id == eos
    assert any(eos in s.tokens[s.prompt_len : -1].tolist() for s in got)
    assert all(s.tokens.shape[0] == s.prompt_len + NEW for s in got + reference)


def test_the_comparison_fails_when_padding_is_attended(
    eos_target: Any, reference: list[eagle3.Sample], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: a mask that lets the prompts attend to their left padding."""
    right = eagle3.left_pad

    def unmasked(rows: Any, pad: int) -> tuple[Any, Any]:
        ids, mask = right(rows, pad)
        return ids, torch.ones_like(mask)

    monkeypatch.setattr(eagle3, "left_pad", unmasked)
    got = eagle3.generate(eos_target, tiny_prompts(), NEW, 7, lambda m: None)
    longest = max(s.prompt_len for s in reference)
    verdicts = {a.id: same(a, b) for a, b in zip(reference, got)}
    assert verdicts == {a.id: a.prompt_len == longest for a in reference}  # only the unpadded row survives


def test_sampled_continuations_are_seeded_and_the_targets_own() -> None:
    target = tiny_target()
    prompts = tiny_prompts(4)
    runs = [
        eagle3.generate(target, prompts, NEW, 5, lambda m: None, continuations=3, temperature=1.0, seed=s)
        for s in (15, 15, 16)
    ]
    first, again, other = runs
    assert [s.id for s in first] == [f"t/{i}{c}" for i in range(4) for c in ("", "#1", "#2")]
    assert all(torch.equal(a.tokens, b.tokens) and torch.equal(a.aux, b.aux) for a, b in zip(first, again))
    greedy = eagle3.generate(target, prompts, NEW, 5, lambda m: None)
    for a, b, g in zip(first[::3], other[::3], greedy):  # the greedy one, whatever the seed and the batch
        assert torch.equal(a.tokens, g.tokens) and torch.equal(b.tokens, g.tokens)
    sampled = [s for s in first if not s.greedy]
    assert sum(not torch.equal(a.tokens, b.tokens) for a, b in zip(sampled, [s for s in other if not s.greedy])) >= 6
    assert all(not torch.equal(s.tokens, greedy[i // 2].tokens) for i, s in enumerate(sampled))
    with torch.no_grad():
        for s in sampled:
            assert (s.labels[: s.prompt_len] == -1).all()  # a prompt trains once
            # the features are what the target computes for these very tokens, fed all at once
            out = target.model(s.tokens[None, :-1], output_hidden_states=True)
            want = torch.cat([out.hidden_states[layer + 1] for layer in target.aux_layers], -1)[0]
            assert torch.allclose(s.aux[:-1].float(), want, atol=2e-3, rtol=1e-3), s.id
            argmax = out.logits[0].argmax(-1)
            assert torch.equal(s.labels[s.prompt_len : -1], argmax[s.prompt_len :])


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"continuations": 3, "temperature": 0.0}, "--continuations 3 needs --temperature > 0"),
        ({"temperature": 2.5}, "--temperature 2.5: between 0 and 2"),
        ({"new_tokens": 2}, "--new-tokens 2: at least 4"),
        ({"continuations": 0}, "--continuations 0: at least 1"),
        ({"gen_batch": 0}, "--gen-batch 0: at least 1"),
        ({"eval_prompts": -1}, "--eval-prompts -1: at least 0"),
        ({"draft_vocab": 0}, "--draft-vocab 0: at least 1"),
        ({"device": "cuda"}, "--device cuda: torch"),
        ({"device": "mps"}, "--device mps: cpu or cuda"),
    ],
)
def test_a_bad_recipe_is_one_usage_error(changes: dict[str, Any], words: str) -> None:
    import dataclasses

    with pytest.raises(UsageError) as caught:
        eagle3.check_recipe(dataclasses.replace(eagle3.Recipe(), **changes), cuda_available=False)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_the_cuda_recipe_is_valid_where_there_is_a_gpu() -> None:
    eagle3.check_recipe(eagle3.CUDA_RECIPE, cuda_available=True)
    assert eagle3.recipe_for("cpu") == eagle3.Recipe() and eagle3.recipe_for("cuda").device == "cuda"


def test_the_train_command_refuses_bad_flags_in_one_line(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "patcher", "real", "train", str(tmp_path / "t"), str(tmp_path / "h"), *args],
                              capture_output=True, text=True)  # fmt: skip

    for args, words in [
        (("--train-prompts", str(tmp_path / "p.json")), "--train-prompts and --held-out-prompts go together"),
        (("--continuations", "4", "--temperature", "0"), "needs --temperature > 0"),
        (("--device", "cuda") if not torch.cuda.is_available() else ("--new-tokens", "1"), "--"),
    ]:
        done = run(*args)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr
    assert not (tmp_path / "h").exists()


def prompt_file(path: Path, rows: list[tuple[str, list[int]]], split: str | None) -> Path:
    data: dict[str, Any] = {"prompts": [{"id": i, "input_ids": ids} for i, ids in rows]}
    if split is not None:
        data["split"] = split
    path.write_text(json.dumps(data))
    return path


def test_prompt_files_are_checked(tmp_path: Path) -> None:
    rows = tiny_prompts(4)
    train = prompt_file(tmp_path / "train.json", rows[:3], "train")
    held = prompt_file(tmp_path / "held.json", rows[3:], None)  # a prompts.json of before the split key
    assert [p.id for p in eagle3.load_prompts(train, "train")] == ["t/0", "t/1", "t/2"]
    assert eagle3.load_prompts(held, "held_out")[0].ids == rows[3][1]
    with pytest.raises(ModelInvalid, match="holds the held_out prompts, not the train ones"):
        eagle3.load_prompts(held, "train")
    with pytest.raises(ModelMissing):
        eagle3.load_prompts(tmp_path / "nope.json", "train")
    (tmp_path / "bad.json").write_text('{"prompts": [{"id": "a"}]}')
    with pytest.raises(ModelInvalid, match="not a prompts file"):
        eagle3.load_prompts(tmp_path / "bad.json", "held_out")
    overlap = prompt_file(tmp_path / "overlap.json", rows[2:], "held_out")
    with pytest.raises(ModelInvalid, match="share prompt t/2"):
        eagle3.training_prompts(tmp_path, eagle3.Recipe(), (train, overlap))


def test_a_build_from_prompt_files_with_sampled_continuations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole recipe on the CPU at toy size, as the GPU runs it: pre-tokenized prompts, two
    continuations per prompt, a head in SGLang's layout whose config records the recipe; the
    samples cache keys on the sampling too."""
    import dataclasses

    monkeypatch.setenv("DYNSPEC_CACHE", str(tmp_path / "cache"))
    target = tiny_target()
    target_dir = tmp_path / "target"
    target.model.save_pretrained(str(target_dir))
    config = json.loads((target_dir / "config.json").read_text())
    (target_dir / "config.json").write_text(json.dumps({**config, "rope_theta": 10000.0}))
    g = torch.Generator().manual_seed(2)
    rows = [
        (f"{'code' if i % 2 else 'text'}/{i}", torch.randint(3, 300, (6 + i % 5,), generator=g).tolist())
        for i in range(14)
    ]
    files = (
        prompt_file(tmp_path / "train.json", rows[:10], "train"),
        prompt_file(tmp_path / "held.json", rows[10:], "held_out"),
    )
    recipe = dataclasses.replace(
        eagle3.Recipe(), draft_vocab=64, intermediate=48, epochs=2, batch_tokens=128, max_prompts=0, new_tokens=10,
        eval_new_tokens=10, eval_prompts=0, gen_batch=8, continuations=2, temperature=0.9, threads=1,
    )  # fmt: skip
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        built = eagle3.build(target_dir, tmp_path / "head", recipe, lambda m: None, files)
        cached = sorted((tmp_path / "cache" / "real" / "samples").glob("*.pt"))
        again = eagle3.build(
            target_dir, tmp_path / "head2", dataclasses.replace(recipe, continuations=1), lambda m: None, files
        )
    finally:
        torch.use_deterministic_algorithms(deterministic)
    assert built.acceptance["prompts"] == 4 and set(built.acceptance["by_set"]) == {"code", "text"}
    assert built.training["positions"] == sum(2 * (len(ids) + 10) for _, ids in rows[:10])
    assert len(cached) == 2  # training (2 continuations) and held out
    assert len(sorted((tmp_path / "cache" / "real" / "samples").glob("*.pt"))) == 3  # 1 continuation: another key
    assert again.training["positions"] == built.training["positions"] // 2
    head_config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert head_config["dynspec_recipe"]["continuations"] == 2 and head_config["dynspec_recipe"]["device"] == "cpu"
    heads.check_head(tmp_path / "head", {**config, "num_hidden_layers": 6})


def test_the_eos_target_stops_transformers_generate_unless_told_not_to(
    eos_target: Any, reference: list[eagle3.Sample]
) -> None:
    """The negative control of the EOS test: the fixture's EOS does end a plain ``generate``."""
    eos = eos_target.config["eos_token_id"]
    sample = next(s for s in reference if eos in s.tokens[s.prompt_len : -1].tolist())
    prompt = sample.tokens[: sample.prompt_len].view(1, -1)
    with torch.no_grad():
        plain = eos_target.model.generate(input_ids=prompt, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    assert plain.shape[1] < sample.prompt_len + NEW


def test_a_draft_vocabulary_larger_than_the_targets_is_one_usage_error() -> None:
    eagle3.check_draft_vocab(eagle3.Recipe(draft_vocab=49152), 49152)  # the control: the whole vocabulary is allowed
    with pytest.raises(UsageError) as caught:
        eagle3.check_draft_vocab(eagle3.Recipe(draft_vocab=49153), 49152)
    assert str(caught.value) == "--draft-vocab 49153: at most the target's vocabulary, 49152"


def test_the_draft_vocabulary_coverage_counts_the_trained_labels_inside_it() -> None:
    from types import SimpleNamespace

    t2d = torch.zeros(10, dtype=torch.bool)
    t2d[[1, 2, 3]] = True
    head = SimpleNamespace(t2d=t2d)

    def sample(labels: list[int]) -> eagle3.Sample:
        n = len(labels)
        return eagle3.Sample("p", torch.arange(n), 1, torch.zeros(n, 3), torch.tensor(labels))

    # -1 (prompt positions) is not trained; of 1, 2, 7, 3, 9 three of five lie inside
    assert eagle3.draft_vocab_coverage(head, [sample([-1, 1, 2, 7]), sample([3, 9])]) == 0.6
    t2d[[7, 9]] = True  # the control: a vocabulary holding every label covers all of them
    assert eagle3.draft_vocab_coverage(head, [sample([-1, 1, 2, 7]), sample([3, 9])]) == 1.0
