"""What a GPU's memory gives dummy 8B-shape servers started side by side (``--parallel-starts``):
how many fit, and each one's fixed KV pool (launch.py says why the pool is fixed), from what such
servers were seen to hold besides it."""

from __future__ import annotations

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
