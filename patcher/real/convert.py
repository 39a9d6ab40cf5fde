"""A llama GGUF file -> a Hugging Face Llama checkpoint directory that SGLang and transformers load.

numpy and ``gguf`` only (no torch), so it runs on the GPU machine too, where converting keeps a
device call's carry to the 98 MB GGUF instead of a 270 MB checkpoint.

* Weights are dequantized with ``gguf.quants.dequantize`` and written as bf16 ``model.safetensors``.
* llama.cpp's convert_hf_to_gguf.py permutes the rows of ``q_proj`` and ``k_proj`` per head (its
  ``LlamaModel.permute``: HF's rotate-half RoPE layout to GGML's interleaved one); ``unpermute``
  undoes it. Everything else maps one to one.
* The tokenizer is rebuilt from the GGUF's vocabulary and merges as a byte-level BPE
  ``tokenizer.json`` with llama.cpp's ``smollm`` / ``gpt2`` pre-tokenizer, the chat template goes
  to ``tokenizer_config.json``.

Every expected tensor must be there with the shape the metadata implies, and nothing else; a
damaged or foreign file is refused with ModelInvalid (exit 12), a missing one with ModelMissing (11).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from patcher.errors import ModelInvalid, ModelMissing
from patcher.real import jsonfile, tensorfile

WEIGHTS = "model.safetensors"
TOKEN_TYPE_CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL: special tokens
# GGUF block tensor -> HF name inside model.layers.N
BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
PRE_TOKENIZERS = ("smollm", "gpt2", "starcoder")  # llama.cpp pre-tokenizer names we rebuild (digits split or not)


@dataclass(frozen=True)
class LlamaShape:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    head_dim: int
    context: int
    rope_theta: float
    rms_eps: float

    def block_shapes(self) -> dict[str, tuple[int, ...]]:
        """HF (out, in) shapes of one layer's tensors."""
        h, q, kv, f = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return {
            "attn_q": (q, h),
            "attn_k": (kv, h),
            "attn_v": (kv, h),
            "attn_output": (h, q),
            "ffn_gate": (f, h),
            "ffn_up": (f, h),
            "ffn_down": (h, f),
            "attn_norm": (h,),
            "ffn_norm": (h,),
        }


def unpermute(weight: npt.NDArray[Any], heads: int) -> npt.NDArray[Any]:
    """Inverse of llama.cpp's ``permute(w, n_head)``: w.reshape(n, 2, r//n//2, c).swapaxes(1, 2)."""
    rows = weight.shape[0]
    if rows % (2 * heads):
        raise ModelInvalid(f"cannot un-permute a {weight.shape} q/k weight over {heads} heads")
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def permute(weight: npt.NDArray[Any], heads: int) -> npt.NDArray[Any]:
    """llama.cpp's ``LlamaModel.permute`` (what convert_hf_to_gguf.py does to q_proj / k_proj)."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


class Gguf:
    """A GGUF file opened with ``gguf.GGUFReader``; every failure becomes one line."""

    def __init__(self, path: Path) -> None:
        import gguf  # the [real] extra

        self.path = path
        if not path.exists():
            raise ModelMissing(f"{path}: no such model file")
        if not path.is_file():
            raise ModelMissing(f"{path}: not a regular file")
        try:
            self.reader = gguf.GGUFReader(path)
        except PermissionError as error:
            raise ModelMissing(f"{path}: cannot read it ({error.strerror})") from error
        except (ValueError, KeyError, IndexError, OSError, UnicodeDecodeError, OverflowError) as error:
            raise ModelInvalid(f"{path}: not a readable GGUF file ({type(error).__name__}: {error})") from error
        self.tensors = {t.name: t for t in self.reader.tensors}

    def field(self, key: str, default: Any = None) -> Any:
        found = self.reader.fields.get(key)
        if found is None:
            if default is None:
                raise ModelInvalid(f"{self.path}: GGUF metadata has no {key}")
            return default
        try:
            return found.contents()
        except (ValueError, IndexError, UnicodeDecodeError) as error:
            raise ModelInvalid(f"{self.path}: damaged GGUF metadata {key} ({error})") from error

    def shape(self) -> LlamaShape:
        arch = self.field("general.architecture")
        if arch != "llama":
            raise ModelInvalid(f"{self.path}: a {arch!r} GGUF, not llama")
        heads = int(self.field("llama.attention.head_count"))
        hidden = int(self.field("llama.embedding_length"))
        tokens = self.field("tokenizer.ggml.tokens")
        vocab = int(self.field("llama.vocab_size", len(tokens)))
        return LlamaShape(
            layers=int(self.field("llama.block_count")),
            hidden=hidden,
            intermediate=int(self.field("llama.feed_forward_length")),
            heads=heads,
            kv_heads=int(self.field("llama.attention.head_count_kv", heads)),
            vocab=vocab,
            head_dim=int(self.field("llama.rope.dimension_count", hidden // heads)),
            context=int(self.field("llama.context_length", 2048)),
            rope_theta=float(self.field("llama.rope.freq_base", 10000.0)),
            rms_eps=float(self.field("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        )

    def array(self, name: str, shape: tuple[int, ...]) -> npt.NDArray[np.float32]:
        """The tensor dequantized to float32 in HF (numpy) order, checked against ``shape``."""
        import gguf

        tensor = self.tensors.get(name)
        if tensor is None:
            raise ModelInvalid(f"{self.path}: tensor {name} is missing")
        got = tuple(int(x) for x in reversed(tensor.shape.tolist()))  # GGUF lists ne0 (innermost) first
        if got != shape:
            raise ModelInvalid(f"{self.path}: tensor {name} has shape {list(got)}, expected {list(shape)}")
        try:
            data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except (ValueError, NotImplementedError, TypeError) as error:
            raise ModelInvalid(f"{self.path}: cannot dequantize {name} ({tensor.tensor_type.name}: {error})") from error
        data = np.asarray(data, dtype=np.float32).reshape(shape)
        if not np.isfinite(data).all():
            raise ModelInvalid(f"{self.path}: tensor {name} holds NaN or infinite values (damaged file)")
        return data


def hf_config(shape: LlamaShape, tied: bool, bos: int, eos: int, pad: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "num_hidden_layers": shape.layers,
        "vocab_size": shape.vocab,
        "max_position_embeddings": shape.context,
        "rms_norm_eps": shape.rms_eps,
        "rope_theta": shape.rope_theta,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tied,
        "torch_dtype": "bfloat16",
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
    }


def tokenizer_files(model: Gguf, vocab: int) -> dict[str, Any]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json from the GGUF's tokenizer."""
    kind = model.field("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelInvalid(f"{model.path}: tokenizer {kind!r} is not rebuilt here (only byte-level BPE, 'gpt2')")
    pre = model.field("tokenizer.ggml.pre", "gpt2")
    if pre not in PRE_TOKENIZERS:
        raise ModelInvalid(f"{model.path}: pre-tokenizer {pre!r} is not rebuilt here ({', '.join(PRE_TOKENIZERS)})")
    tokens = [str(t) for t in model.field("tokenizer.ggml.tokens")]
    types = [int(t) for t in model.field("tokenizer.ggml.token_type")]
    merges = [str(m) for m in model.field("tokenizer.ggml.merges")]
    if len(tokens) != vocab or len(types) != vocab:
        raise ModelInvalid(
            f"{model.path}: {len(tokens)} tokens and {len(types)} token types for a vocabulary of {vocab}"
        )
    bos = int(model.field("tokenizer.ggml.bos_token_id"))
    eos = int(model.field("tokenizer.ggml.eos_token_id"))
    unk = int(model.field("tokenizer.ggml.unknown_token_id", eos))
    pad = int(model.field("tokenizer.ggml.padding_token_id", eos))
    special = [i for i, t in enumerate(types) if t == TOKEN_TYPE_CONTROL]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    pretokenizers: list[dict[str, Any]] = [byte_level]
    if pre in ("smollm", "starcoder"):  # llama.cpp's regex list for these starts with \p{N}: one digit per piece
        pretokenizers.insert(0, {"type": "Digits", "individual_digits": True})
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": tokens[i],
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i in special
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": pretokenizers},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": merges,
        },
    }
    template = model.field("tokenizer.chat_template", "")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokens[bos],
        "eos_token": tokens[eos],
        "unk_token": tokens[unk],
        "pad_token": tokens[pad],
        "add_bos_token": bool(model.field("tokenizer.ggml.add_bos_token", False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(model.field("llama.context_length", 2048)),
        "additional_special_tokens": [tokens[i] for i in special if i not in (bos, eos, unk, pad)],
        **({"chat_template": template} if template else {}),
    }
    special_map = {
        k: config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token", "additional_special_tokens")
    }
    return {"tokenizer.json": tokenizer, "tokenizer_config.json": config, "special_tokens_map.json": special_map}


@dataclass(frozen=True)
class Converted:
    out: Path
    shape: LlamaShape
    tied: bool
    parameters: int

    def describe(self) -> dict[str, Any]:
        return {"out": str(self.out), "tied": self.tied, "parameters": self.parameters, **asdict(self.shape)}


def convert(gguf_path: Path, out: Path) -> Converted:
    """Write the checkpoint into ``out`` (replaced as a whole, via a temp dir beside it)."""
    model = Gguf(gguf_path)
    shape = model.shape()
    if shape.hidden % shape.heads or shape.heads % shape.kv_heads or shape.head_dim * shape.heads != shape.hidden:
        raise ModelInvalid(
            f"{gguf_path}: {shape.heads} heads / {shape.kv_heads} KV heads of dim {shape.head_dim} do not fit hidden {shape.hidden}"
        )
    tied = "output.weight" not in model.tensors
    expected = {"token_embd.weight", "output_norm.weight", *([] if tied else ["output.weight"])}
    expected |= {f"blk.{i}.{k}.weight" for i in range(shape.layers) for k in BLOCK_NAMES}
    unknown = sorted(set(model.tensors) - expected)
    if unknown:
        raise ModelInvalid(
            f"{gguf_path}: unexpected tensor(s) {', '.join(unknown[:3])} for a {shape.layers}-layer llama"
        )
    tensors: dict[str, tuple[npt.NDArray[Any], str]] = {}
    tensors["model.embed_tokens.weight"] = (model.array("token_embd.weight", (shape.vocab, shape.hidden)), "BF16")
    tensors["model.norm.weight"] = (model.array("output_norm.weight", (shape.hidden,)), "BF16")
    if not tied:
        tensors["lm_head.weight"] = (model.array("output.weight", (shape.vocab, shape.hidden)), "BF16")
    for i in range(shape.layers):
        for key, want in shape.block_shapes().items():
            data = model.array(f"blk.{i}.{key}.weight", want)
            if key == "attn_q":
                data = unpermute(data, shape.heads)
            elif key == "attn_k":
                data = unpermute(data, shape.kv_heads)
            tensors[f"model.layers.{i}.{BLOCK_NAMES[key]}.weight"] = (data, "BF16")
    files = tokenizer_files(model, shape.vocab)
    bos = int(model.field("tokenizer.ggml.bos_token_id"))
    eos = int(model.field("tokenizer.ggml.eos_token_id"))
    pad = int(model.field("tokenizer.ggml.padding_token_id", eos))
    files["config.json"] = hf_config(shape, tied, bos, eos, pad)
    files["generation_config.json"] = {
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "do_sample": False,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the checkpoint from other users' servers
    try:
        tensorfile.write(staging / WEIGHTS, tensors, {"source": gguf_path.name})
        for name, content in files.items():
            (staging / name).write_text(json.dumps(content, indent=1 if name != "tokenizer.json" else None) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    parameters = sum(int(a.size) for a, _ in tensors.values())
    return Converted(out, shape, tied, parameters)


def check_checkpoint(path: Path) -> dict[str, Any]:
    """A converted dir: config.json fits model.safetensors name for name and shape. Returns the config."""
    config_path = path / "config.json"
    config = jsonfile.read(config_path)
    try:
        shape = LlamaShape(
            layers=config["num_hidden_layers"],
            hidden=config["hidden_size"],
            intermediate=config["intermediate_size"],
            heads=config["num_attention_heads"],
            kv_heads=config["num_key_value_heads"],
            vocab=config["vocab_size"],
            head_dim=config.get("head_dim", config["hidden_size"] // config["num_attention_heads"]),
            context=config["max_position_embeddings"],
            rope_theta=config["rope_theta"],
            rms_eps=config["rms_norm_eps"],
        )
    except (KeyError, TypeError) as error:
        raise ModelInvalid(f"{config_path}: lacks {error}") from error
    header, _ = tensorfile.read_header(path / WEIGHTS)
    want: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (shape.vocab, shape.hidden),
        "model.norm.weight": (shape.hidden,),
    }
    if not config.get("tie_word_embeddings"):
        want["lm_head.weight"] = (shape.vocab, shape.hidden)
    for i in range(shape.layers):
        for key, dims in shape.block_shapes().items():
            want[f"model.layers.{i}.{BLOCK_NAMES[key]}.weight"] = dims
    got = {name: tuple(entry["shape"]) for name, entry in header.items()}
    missing = sorted(want.keys() - got.keys())
    extra = sorted(got.keys() - want.keys())
    if missing or extra:
        raise ModelInvalid(f"{path / WEIGHTS}: missing {missing[:3]}, unexpected {extra[:3]} for its config.json")
    wrong = [(n, got[n], want[n]) for n in sorted(want) if got[n] != want[n]]
    if wrong:
        name, has, expected = wrong[0]
        raise ModelInvalid(f"{path / WEIGHTS}: {name} has shape {list(has)}, config.json implies {list(expected)}")
    return dict(config)
