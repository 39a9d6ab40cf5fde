"""The GGUF converter on a tiny synthetic llama written with gguf's own GGUFWriter.

The tiny model's weights are made in HF layout, permuted as llama.cpp's converter does and written
as a GGUF (F32, and Q8_0 for the embeddings); the conversion must give back the HF tensors, names
and shapes, and where torch is installed the converted checkpoint must compute the same logits
as the transformers model the weights came from. Damaged and foreign files are refused in one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

np = pytest.importorskip("numpy", reason="the converter needs numpy (the [test] extra has it)")
gguf = pytest.importorskip("gguf", reason="the converter needs gguf (the [test] extra has it)")

from patcher.errors import ExitCode, ModelInvalid, ModelMissing  # noqa: E402
from patcher.real import convert, tensorfile  # noqa: E402

TINY = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 96, "context": 128}
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table (what byte-level BPE vocabularies are made of)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def vocabulary() -> tuple[list[str], list[str]]:
    chars = byte_chars()
    merges = ["Ġ t", "Ġ a", "h e", "i n", "Ġt he", "Ġ s", "e r", "o n"]
    merged = [m.replace(" ", "") for m in merges]
    return SPECIAL + chars + merged, merges


def hf_weights(seed: int = 0) -> dict[str, Any]:
    """HF-layout float32 weights of the tiny llama."""
    rng = np.random.default_rng(seed)
    tokens, _ = vocabulary()
    v, h, f = len(tokens), TINY["hidden"], TINY["ffn"]
    d = h // TINY["heads"]
    q, kv = TINY["heads"] * d, TINY["kv_heads"] * d
    out = {"model.embed_tokens.weight": rng.normal(0, 0.5, (v, h)), "model.norm.weight": 1 + rng.normal(0, 0.1, h)}
    for i in range(TINY["layers"]):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": rng.normal(0, 0.2, (q, h)),
            p + "self_attn.k_proj.weight": rng.normal(0, 0.2, (kv, h)),
            p + "self_attn.v_proj.weight": rng.normal(0, 0.2, (kv, h)),
            p + "self_attn.o_proj.weight": rng.normal(0, 0.2, (h, q)),
            p + "mlp.gate_proj.weight": rng.normal(0, 0.2, (f, h)),
            p + "mlp.up_proj.weight": rng.normal(0, 0.2, (f, h)),
            p + "mlp.down_proj.weight": rng.normal(0, 0.2, (h, f)),
            p + "input_layernorm.weight": 1 + rng.normal(0, 0.1, h),
            p + "post_attention_layernorm.weight": 1 + rng.normal(0, 0.1, h),
        }
    return {k: np.asarray(a, dtype=np.float32) for k, a in out.items()}


GGUF_NAMES = {hf: gg for gg, hf in convert.BLOCK_NAMES.items()}


def write_gguf(
    path: Path,
    weights: dict[str, Any],
    *,
    arch: str = "llama",
    skip: str = "",
    extra: str = "",
    permute: bool = True,
    nan: str = "",
) -> Path:
    """``weights`` (HF layout) as a llama.cpp-style GGUF. ``skip`` leaves a GGUF tensor out, ``extra``
    adds one, ``nan`` puts a NaN into one; ``permute=False`` writes q/k as they are (a broken converter)."""
    tokens, merges = vocabulary()
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(TINY["layers"])
    w.add_context_length(TINY["context"])
    w.add_embedding_length(TINY["hidden"])
    w.add_feed_forward_length(TINY["ffn"])
    w.add_head_count(TINY["heads"])
    w.add_head_count_kv(TINY["kv_heads"])
    w.add_rope_dimension_count(TINY["hidden"] // TINY["heads"])
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([convert.TOKEN_TYPE_CONTROL] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL)))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
    for hf, array in weights.items():
        if hf == "model.embed_tokens.weight":
            name = "token_embd.weight"
        elif hf == "model.norm.weight":
            name = "output_norm.weight"
        elif hf == "lm_head.weight":
            name = "output.weight"
        else:
            layer, rest = hf.split(".")[2], ".".join(hf.split(".")[3:-1])
            name = f"blk.{layer}.{GGUF_NAMES[rest]}.weight"
        if name == skip:
            continue
        data = array.copy()
        if permute and name.endswith("attn_q.weight"):
            data = convert.permute(data, TINY["heads"])
        if permute and name.endswith("attn_k.weight"):
            data = convert.permute(data, TINY["kv_heads"])
        if name == nan:
            data[0, 0] = np.nan
        if name == "token_embd.weight":  # one quantized tensor: the path the real file's Q4_1 / Q8_0 take
            qtype = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, data)
    if extra:
        w.add_tensor(extra, np.zeros(TINY["hidden"], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    weights = hf_weights()
    return write_gguf(tmp_path / "tiny.gguf", weights), weights


def test_permute_and_unpermute_are_inverse_and_not_the_identity() -> None:
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    for heads in (1, 2, 8):
        assert np.array_equal(convert.unpermute(convert.permute(w, heads), heads), w)
        assert not np.array_equal(convert.permute(w, heads), w)


def test_the_checkpoint_has_hf_names_shapes_and_values(tiny: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, weights = tiny
    done = convert.convert(path, tmp_path / "hf")
    assert done.tied and done.parameters == sum(a.size for a in weights.values())
    got = tensorfile.read(tmp_path / "hf" / convert.WEIGHTS)
    assert set(got) == set(weights)
    for name, want in weights.items():
        assert got[name].shape == want.shape, name
        tol = 0.02 if "embed" in name else 0.008  # bf16 (and Q8_0 for the embeddings)
        assert np.allclose(got[name], want, atol=tol * np.abs(want).max()), name
    header, _ = tensorfile.read_header(tmp_path / "hf" / convert.WEIGHTS)
    assert {e["dtype"] for e in header.values()} == {"BF16"}
    config = convert.check_checkpoint(tmp_path / "hf")
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"]) == (2, 64, 4)
    assert (config["num_key_value_heads"], config["head_dim"], config["vocab_size"]) == (2, 16, len(vocabulary()[0]))
    files = {p.name for p in (tmp_path / "hf").iterdir()}
    assert files == {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json", "special_tokens_map.json"}  # fmt: skip
    tok = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert (tok["bos_token"], tok["eos_token"]) == ("<|im_start|>", "<|im_end|>") and "chat_template" in tok


def test_the_unpermutation_is_what_makes_q_and_k_right(tmp_path: Path) -> None:
    """Negative control: a file written without llama.cpp's permutation converts to other q/k."""
    weights = hf_weights()
    convert.convert(write_gguf(tmp_path / "raw.gguf", weights, permute=False), tmp_path / "hf")
    got = tensorfile.read(tmp_path / "hf" / convert.WEIGHTS)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not np.allclose(got[q], weights[q], atol=0.05)
    v = "model.layers.0.self_attn.v_proj.weight"
    assert np.allclose(got[v], weights[v], atol=0.01)  # only q and k are permuted


def test_the_tokenizer_round_trips_text(tiny: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers", reason="the [real] extra's tokenizers reads tokenizer.json")
    convert.convert(tiny[0], tmp_path / "hf")
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    text = "<|im_start|>on the heat in 2024<|im_end|>"
    enc = tok.encode(text, add_special_tokens=False)
    assert enc.ids[0] == 1 and enc.ids[-1] == 2  # special tokens stay whole
    assert tok.decode(enc.ids, skip_special_tokens=False) == text
    assert [t for t in enc.tokens if t in "0123456789"] == list("2024")  # smollm: one digit per token
    assert "Ġthe" in enc.tokens  # a merge applied


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        ({"skip": "blk.1.attn_v.weight"}, "tensor blk.1.attn_v.weight is missing"),
        ({"extra": "blk.0.bogus.weight"}, "unexpected tensor(s) blk.0.bogus.weight"),
        ({"nan": "blk.0.ffn_up.weight"}, "blk.0.ffn_up.weight holds NaN"),
        ({"arch": "gpt2"}, "a 'gpt2' GGUF, not llama"),
    ],
    ids=["missing-tensor", "extra-tensor", "nan", "architecture"],
)
def test_a_foreign_or_damaged_gguf_is_refused_naming_what_is_wrong(
    tmp_path: Path, damage: dict[str, Any], words: str
) -> None:
    path = write_gguf(tmp_path / "bad.gguf", hf_weights(), **damage)
    with pytest.raises(ModelInvalid, match=None) as caught:
        convert.convert(path, tmp_path / "hf")
    assert words in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "hf").exists()  # nothing half-written


def test_a_tensor_of_the_wrong_shape_is_refused(tmp_path: Path) -> None:
    weights = hf_weights()
    weights["model.layers.1.mlp.down_proj.weight"] = weights["model.layers.1.mlp.down_proj.weight"][:, :64].copy()
    path = write_gguf(tmp_path / "bad.gguf", weights)
    with pytest.raises(ModelInvalid, match=r"blk\.1\.ffn_down\.weight has shape \[64, 64\], expected \[64, 96\]"):
        convert.convert(path, tmp_path / "hf")


@pytest.mark.parametrize("cut", [10, 200, -100], ids=["header", "metadata", "tensor-data"])
def test_a_truncated_gguf_is_refused(tiny: tuple[Path, dict[str, Any]], tmp_path: Path, cut: int) -> None:
    data = tiny[0].read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[:cut])
    with pytest.raises(ModelInvalid, match="not a readable GGUF file"):
        convert.convert(bad, tmp_path / "hf")


def test_a_missing_file_is_its_own_error(tmp_path: Path) -> None:
    with pytest.raises(ModelMissing, match="no such model file"):
        convert.convert(tmp_path / "nope.gguf", tmp_path / "hf")
    assert ModelMissing.exit_code == ExitCode.MODEL_MISSING and ModelInvalid.exit_code == ExitCode.MODEL_INVALID


def test_check_checkpoint_refuses_a_checkpoint_that_does_not_fit_its_config(
    tiny: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    out = tmp_path / "hf"
    convert.convert(tiny[0], out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "intermediate_size": 128}))
    with pytest.raises(
        ModelInvalid, match=r"mlp\.down_proj\.weight has shape \[64, 96\], config\.json implies \[64, 128\]"
    ):
        convert.check_checkpoint(out)
    (out / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    with pytest.raises(ModelInvalid, match="missing \\['lm_head.weight'\\]"):
        convert.check_checkpoint(out)
    (out / "config.json").write_text(json.dumps(config))
    data = (out / convert.WEIGHTS).read_bytes()
    (out / convert.WEIGHTS).write_bytes(data[:-7])
    with pytest.raises(ModelInvalid, match="needs .* bytes"):
        convert.check_checkpoint(out)
    (out / convert.WEIGHTS).write_bytes(b"\xff" * 16)
    with pytest.raises(ModelInvalid, match="not a safetensors file"):
        convert.check_checkpoint(out)


def test_the_command_exits_11_and_12_with_one_line(tiny: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "patcher", "real", *args], capture_output=True, text=True)

    done = run("convert", str(tmp_path / "nope.gguf"), str(tmp_path / "a"))
    assert done.returncode == 11 and done.stderr.count("\n") == 1 and "no such model file" in done.stderr
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(tiny[0].read_bytes()[:300])
    done = run("convert", str(bad), str(tmp_path / "b"))
    assert done.returncode == 12 and done.stderr.count("\n") == 1, done.stderr
    done = run("convert", "--check-digest", str(tiny[0]), str(tmp_path / "c"))
    assert done.returncode == 12 and "is not that of" in done.stderr
    done = run("convert", str(tiny[0]), str(tmp_path / "d"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["layers"] == 2


def test_logits_equal_the_transformers_model_the_weights_came_from(tmp_path: Path) -> None:
    """The tiny llama's own logits against the converted checkpoint's, in transformers (bf16 tolerance);
    without the un-permutation (the negative control) they differ."""
    torch = pytest.importorskip("torch", reason="comparing logits needs the [real] extra (torch)")
    transformers = pytest.importorskip("transformers", reason="comparing logits needs the [real] extra (transformers)")
    weights = hf_weights()
    convert.convert(write_gguf(tmp_path / "tiny.gguf", weights), tmp_path / "hf")
    config = transformers.AutoConfig.from_pretrained(str(tmp_path / "hf"))
    reference = transformers.LlamaForCausalLM(config)
    state = {k: torch.from_numpy(tensorfile.from_bf16(tensorfile.to_bf16(v))) for k, v in weights.items()}
    reference.load_state_dict(state, strict=False)
    reference.tie_weights()
    converted = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
    ids = torch.randint(3, config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = reference(ids).logits, converted(ids).logits
        assert (got - want).abs().max() < 0.05 * want.abs().max()  # Q8_0 embeddings, bf16 weights
        convert.convert(write_gguf(tmp_path / "raw.gguf", weights, permute=False), tmp_path / "raw")
        broken = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "raw"), dtype=torch.float32)
        assert (broken(ids).logits - want).abs().max() > 0.2 * want.abs().max()
