"""The EAGLE-3 head's checkpoint, checked without torch: what SGLang's LlamaForCausalLMEagle3 loads.

``load_weights`` renames ``midlayer`` to ``layers.0``, fuses q/k/v (over 2 x hidden) and gate/up,
turns ``d2t`` into ``hot_token_id`` and ignores ``t2d``; a tensor with a name it does not know is
dropped without a word, and a wrong shape fails deep inside a weight loader. So the names and
shapes are checked here, against the target's config, before a server is started.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from patcher.errors import ModelInvalid
from patcher.real import jsonfile, tensorfile

HEAD_NAMES = ("fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d")


def check_head(head_dir: Path, target_config: dict[str, Any]) -> dict[str, Any]:
    """A head dir that SGLang's LlamaForCausalLMEagle3 loads and that fits ``target_config``."""
    path = head_dir / "config.json"
    config = jsonfile.read(path)
    if config.get("architectures") != ["LlamaForCausalLMEagle3"] or config.get("num_hidden_layers") != 1:
        raise ModelInvalid(f"{path}: not a one-layer LlamaForCausalLMEagle3 head")
    for key in ("hidden_size", "vocab_size"):
        if config.get(key) != target_config.get(key):
            raise ModelInvalid(f"{path}: {key} {config.get(key)} does not match the target's {target_config.get(key)}")
    layers = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or []
    if not layers or not all(isinstance(x, int) and 0 <= x < target_config["num_hidden_layers"] for x in layers):
        raise ModelInvalid(f"{path}: eagle_aux_hidden_state_layer_ids {layers} are not layers of the target")
    header, _ = tensorfile.read_header(head_dir / "model.safetensors")
    h, v, dv = config["hidden_size"], config["vocab_size"], config["draft_vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    d = config.get("head_dim", h // heads)
    f = config["intermediate_size"]
    want = {
        "fc.weight": [h, len(layers) * h], "norm.weight": [h], "lm_head.weight": [dv, h], "d2t": [dv], "t2d": [v],
        "midlayer.input_layernorm.weight": [h], "midlayer.hidden_norm.weight": [h],
        "midlayer.post_attention_layernorm.weight": [h],
        "midlayer.self_attn.q_proj.weight": [heads * d, 2 * h], "midlayer.self_attn.k_proj.weight": [kv * d, 2 * h],
        "midlayer.self_attn.v_proj.weight": [kv * d, 2 * h], "midlayer.self_attn.o_proj.weight": [h, heads * d],
        "midlayer.mlp.gate_proj.weight": [f, h], "midlayer.mlp.up_proj.weight": [f, h], "midlayer.mlp.down_proj.weight": [h, f],
    }  # fmt: skip
    for name, shape in want.items():
        if name not in header:
            raise ModelInvalid(f"{head_dir / 'model.safetensors'}: no {name}")
        if header[name]["shape"] != shape:
            raise ModelInvalid(
                f"{head_dir / 'model.safetensors'}: {name} has shape {header[name]['shape']}, expected {shape}"
            )
    extra = sorted(set(header) - set(want))
    if extra:
        raise ModelInvalid(f"{head_dir / 'model.safetensors'}: unexpected tensor(s) {', '.join(extra[:3])}")
    return dict(config)
