"""What a GPU's memory gives servers started side by side (``--parallel-starts``): for dummy 8B-shape
ones, how many fit and each one's fixed KV pool (launch.py says why the pool is fixed), and for a real
model's, how many fit; both from what such servers were seen to hold besides it."""

from __future__ import annotations

import json
from pathlib import Path

from patcher.proof import launch

SHARED_GPU_8B_SERVERS = 3  # 8B-shape servers side by side at most (throughput's and mixed_load's three)
# What the GPU's memory must hold for each of them besides its KV pool, from what they held on an H100
# (79.18 GiB that torch sees). Speculating: 22.8 GiB at most (session 35: three with 32768-slot pools
# held 26.96, 26.88 and 25.30 GiB when one ran out; session 34's three at 44032, 20.7 - 20.9). Plain:
# base beside two speculating servers, all with 40960-slot pools, left 1.4 GiB free (sessions 34 - 35),
# which puts base at about 16.7. Another attention backend than Triton takes more (session 35: on
# FlashInfer base held 17.9 besides its pool and dynspec 23.6 while still capturing graphs, so the three
# that fit on Triton did not). A KV slot is the target's 32 layers x 8 heads x 128 x (K, V) in bf16,
# 128 KiB, and the draft layer's 4. The reserve is what torch never sees of the card (an H100: 79.18 of
# 79.65 GiB) and slack.
EIGHT_B_PLAIN_MIB = 17 * 1024
EIGHT_B_SPECULATIVE_MIB = 23 * 1024
EIGHT_B_NOT_TRITON_MIB = {"plain": 1024, "speculative": 2 * 1024}  # on top of the above, FlashInfer's workspaces
EIGHT_B_SLOT_KIB = 132
SHARED_GPU_RESERVE_MIB = 1024


def eight_b_pool_tokens(
    gpu_memory_mib: int | None, speculative: int, plain: int = 0, attention_backend: str = "triton"
) -> int:
    """Each KV pool of 8B-shape servers side by side, ``speculative`` of them speculating and ``plain``
    not: launch.SHARED_GPU_MAX_TOTAL_TOKENS where that fits (an H200) or the memory is unknown, else
    what the memory leaves each, in whole 1024s (an H100 80GB on Triton: base and two speculating
    40960, three speculating 24576). Overfilled an H100: session 32's three at 131072 each, three
    speculating at 44032 (session 34) and 32768 (35), base and two speculating at 40960 on FlashInfer (35)."""
    if gpu_memory_mib is None:
        return launch.SHARED_GPU_MAX_TOTAL_TOKENS
    servers = speculative + plain
    held = speculative * EIGHT_B_SPECULATIVE_MIB + plain * EIGHT_B_PLAIN_MIB
    if attention_backend != "triton":
        held += speculative * EIGHT_B_NOT_TRITON_MIB["speculative"] + plain * EIGHT_B_NOT_TRITON_MIB["plain"]
    left = max(0, gpu_memory_mib - SHARED_GPU_RESERVE_MIB - held)
    fit = left * 1024 // servers // EIGHT_B_SLOT_KIB
    return min(launch.SHARED_GPU_MAX_TOTAL_TOKENS, fit // 1024 * 1024)


def shared_gpu_8b_servers(gpu_memory_mib: int | None, slots_needed: int, attention_backend: str = "triton") -> int:
    """How many 8B-shape servers can start side by side (at most 3), each with a pool of
    ``eight_b_pool_tokens`` that holds ``slots_needed``, at best: base among them and the rest
    speculating (an H200 or an H100 80GB on Triton 3 for the default loads, an H100 on FlashInfer 2).
    An early refusal of what cannot fit; a group that speculates more starts fewer at once
    (Proof._group)."""
    for servers in range(SHARED_GPU_8B_SERVERS, 1, -1):
        if (
            eight_b_pool_tokens(gpu_memory_mib, servers - 1, plain=1, attention_backend=attention_backend)
            >= slots_needed
        ):
            return servers
    return 1


# A real model's server beside others: what it holds besides its weights and its KV pool (CUDA context,
# CUDA graphs with the prefill ones, workspaces). Session 50, H100: three SmolLM2-135M servers with
# EAGLE-3 heads, 131072-slot pools and prefill graphs took 14.3 GiB together, 4.8 each, of which
# 0.3 weights and 2.9 pools (target and draft): 1.6 besides, rounded up.
REAL_SERVER_OTHER_MIB = 2 * 1024
KV_BYTES = 2  # bf16, as the servers run
WEIGHT_SUFFIXES = (".safetensors", ".bin")


def real_servers_side_by_side(gpu_memory_mib: int | None, target: Path, draft: Path) -> int:
    """How many servers of a real model (``target`` and its EAGLE-3 head ``draft``, HF dirs) fit the
    GPU side by side, each speculating with a launch.SHARED_GPU_MAX_TOTAL_TOKENS pool: what the memory
    holds of each one's weights, pool and REAL_SERVER_OTHER_MIB (SmolLM2-135M on an H100: 15), and
    SHARED_GPU_8B_SERVERS where the memory is unknown or a config cannot be read."""
    if gpu_memory_mib is None:
        return SHARED_GPU_8B_SERVERS
    try:
        slot = kv_bytes_per_token(target) + kv_bytes_per_token(draft)
        weights = sum(f.stat().st_size for d in (target, draft) for f in d.iterdir() if f.suffix in WEIGHT_SUFFIXES)
    except (OSError, ValueError, KeyError, TypeError):
        return SHARED_GPU_8B_SERVERS
    each = (weights + slot * launch.SHARED_GPU_MAX_TOTAL_TOKENS) // 2**20 + REAL_SERVER_OTHER_MIB
    return max(1, (gpu_memory_mib - SHARED_GPU_RESERVE_MIB) // each)


def kv_bytes_per_token(model: Path) -> int:
    """One token's K and V over the layers of the HF model in ``model`` (its config.json), in bf16."""
    config = json.loads((model / "config.json").read_text())
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    return 2 * KV_BYTES * int(config["num_hidden_layers"]) * kv_heads * head_dim
