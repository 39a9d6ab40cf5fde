"""The exact server command lines and environments ``dynspec proof`` runs.

Flags follow shared/gpu/serve.sh and sweep.sh: dummy weights from a ``config.json``-only model
directory shipped in this package, no tokenizer, triton attention, pytorch sampling, half the GPU
memory; plus ``--max-running-requests 128 --cuda-graph-max-bs 128`` on every server, because
under speculation SGLang otherwise lowers both to 48 and a threshold above that never triggers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

MODELS = Path(__file__).resolve().parent / "models"
# 8b-32k: the 8B pair with a 32k draft vocabulary, as real EAGLE-3 heads for Llama-3.1-8B have
# (draft8b's 128k lm_head is the pessimistic case for the draft extend's cost)
SHAPES = {"small": ("target", "draft"), "8b": ("target8b", "draft8b"), "8b-32k": ("target8b", "draft8b-32k")}
MAX_RUNNING_REQUESTS = 128
THRESHOLD_FLAG = "--speculative-disable-batch-size"  # the runtime names it in every refusal
AUTO = "auto"  # THRESHOLD_FLAG auto
# auto's highest switch point on these servers: one below the running-request limit and the largest
# CUDA-graph batch (both MAX_RUNNING_REQUESTS), so a batch that large is served off whatever it decides
AUTO_CEILING = MAX_RUNNING_REQUESTS - 1
# With --parallel-starts > 1, several servers share the GPU. SGLang sizes a KV pool from the memory
# free before and after it loads its weights (pool = after - (1 - fraction) x before), which servers
# loading side by side make meaningless: each gets a fixed pool instead, far above any load here (128
# requests of a few hundred tokens), and a fraction that leaves it room to allocate that pool whatever
# its neighbours hold at the moment it looks. The 8B shape (16 GB of weights, 16 GB of pool) fits 3.
SHARED_GPU_MAX_TOTAL_TOKENS = 131072
SHARED_GPU_MEM_FRACTION = "0.85"
# A pool sized to what the GPU's memory leaves each server (an H100 with three 8B ones): SGLang keeps
# (1 - fraction) x the memory it found free before loading, which for a server that looked before its
# neighbours loaded is gigabytes it does not need; its pool would come out below the one asked for.
SHARED_GPU_TIGHT_MEM_FRACTION = "0.95"

BASE_FLAGS = (
    "--load-format", "dummy",
    "--skip-tokenizer-init",
    "--attention-backend", "triton",
    "--sampling-backend", "pytorch",
    "--mem-fraction-static", "0.5",
)  # fmt: skip
EAGLE3_FLAGS = (
    "--speculative-algorithm", "EAGLE3",
    "--speculative-draft-model-path", "{draft}",
    "--speculative-draft-load-format", "dummy",
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
)  # fmt: skip

# --attention-backend of the servers: Triton unless asked (FA3 needs sgl-kernel's flash_ops, ~1 GB,
# which no device call can carry)
ATTENTION_BACKENDS = ("triton", "flashinfer", "fa3")
MODES = ("base", "always_on", "dynspec")  # (a) speculation off, (b) always on, (c) dynspec
# (d), only with --upstream-adaptive: always on plus upstream's adaptive mode, as a reference
UPSTREAM_ADAPTIVE = "upstream_adaptive"
# (e), only with --no-overlap-base: speculation off on the non-overlap scheduler, the plain decode a
# v1 server (which never overlaps) can be compared with
BASE_NO_OVERLAP = "base_no_overlap"
PLAIN_MODES = ("base", BASE_NO_OVERLAP)  # no draft model: the rest speculate
ADAPTIVE_CONFIG_NAME = "upstream-adaptive.json"
EAGLE3_STEPS = 3  # --speculative-num-steps in EAGLE3_FLAGS
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
SIMULATION_VARS = ("SGLANG_SIMULATE_ACC_LEN", "SGLANG_SIMULATE_ACC_METHOD", "SIMULATE_ACC_LEN", "SIMULATE_ACC_METHOD")


def speculates(mode: str) -> bool:
    """Whether a server of ``mode`` loads a draft model (and so holds more memory than plain decode's)."""
    return mode not in PLAIN_MODES


@dataclass(frozen=True)
class Dynspec:
    """dynspec's server flags; ``None`` leaves a flag out so the server's default applies."""

    disable_batch_size: int | str  # a number, or "auto" (0.5.14+)
    enable_batch_size: int | None = None
    switch_min_steps: int | None = None

    def flags(self) -> list[str]:
        out = [THRESHOLD_FLAG, str(self.disable_batch_size)]
        if self.enable_batch_size is not None:
            out += ["--speculative-enable-batch-size", str(self.enable_batch_size)]
        if self.switch_min_steps is not None:
            out += ["--speculative-switch-min-steps", str(self.switch_min_steps)]
        return out

    @property
    def on_at_most(self) -> int:
        """The largest batch size at which speculation comes back on (a fixed threshold's)."""
        if self.enable_batch_size is not None:
            return self.enable_batch_size
        if not isinstance(self.disable_batch_size, int):
            raise ValueError("auto has no fixed switch-on size")
        return self.disable_batch_size


def adaptive_config(threshold: int) -> dict[str, dict[str, list[int]]]:
    """Upstream's adaptive mode made to switch like dynspec: all steps at batch size 1..N, none above."""
    return {"1": {"candidate_steps": [EAGLE3_STEPS]}, str(threshold + 1): {"candidate_steps": [0]}}


def model_dirs(shape: str) -> tuple[Path, Path]:
    target, draft = SHAPES[shape]
    return MODELS / target, MODELS / draft


# SGLang's batch-invariant kernels (0.5.3+): greedy tokens that do not depend on the batch
DETERMINISTIC_FLAGS = ("--enable-deterministic-inference",)

# Where the release has the flag, SGLang's HTTP process logs each of its garbage collections longer
# than this: session 38 found the ~0.45 s stalls that had decided R(128) to be one generation-2
# collection per server, in whichever run's admission it fell
GC_WARNING_SECS = 0.05
GC_WARNING_FLAGS = ("--gc-warning-threshold-secs", str(GC_WARNING_SECS))


def gc_warning_secs(argv: Sequence[str]) -> float:
    """The threshold a server's command line gives SGLang's collection warning (the last one wins,
    as in its parser); 0, SGLang's default, where it gives none or one that is not a number."""
    flag = GC_WARNING_FLAGS[0]
    values = [
        arg.split("=", 1)[1] if arg.startswith(flag + "=") else argv[i + 1]
        for i, arg in enumerate(argv)
        if arg.startswith(flag + "=") or (arg == flag and i + 1 < len(argv))
    ]
    try:
        return max(0.0, float(values[-1])) if values else 0.0
    except ValueError:
        return 0.0


REAL_TARGET, REAL_DRAFT, REAL_PROMPTS, REAL_INFO = "target", "draft", "prompts.json", "model.json"


def real_dirs(model_dir: Path) -> tuple[Path, Path]:
    """The layout of ``dynspec real prepare`` (the converted target, the trained EAGLE-3 head) and of
    ``dynspec real own`` (links to the user's)."""
    return model_dir / REAL_TARGET, model_dir / REAL_DRAFT


def without_dummy(flags: Sequence[str]) -> list[str]:
    """The flags less ``--load-format dummy`` and ``--speculative-draft-load-format dummy``: real weights."""
    out: list[str] = []
    skip = False
    for i, flag in enumerate(flags):
        if skip:
            skip = False
            continue
        if (
            flag in ("--load-format", "--speculative-draft-load-format")
            and i + 1 < len(flags)
            and flags[i + 1] == "dummy"
        ):
            skip = True
            continue
        out.append(flag)
    return out


def server_args(
    mode: str,
    *,
    shape: str,
    port: int,
    path: str,
    dynspec: Dynspec | None = None,
    tp: int | None = None,
    extra: Sequence[str] = (),
    adaptive_config_path: Path | None = None,
    real: Path | None = None,
    shared_gpu_nccl_port: int | None = None,
    shared_gpu_pool_tokens: int = SHARED_GPU_MAX_TOTAL_TOKENS,
    attention_backend: str = "triton",
    tokenizer: bool = False,
) -> list[str]:
    """The arguments after ``python -m sglang.launch_server`` for one mode; ``real``: a model dir
    of ``dynspec real prepare`` or ``real own`` whose weights are loaded (the shape is then ignored).
    ``shared_gpu_nccl_port``: the server starts beside others on the GPU (--parallel-starts): a
    fixed KV pool of ``shared_gpu_pool_tokens`` (``SHARED_GPU_MAX_TOTAL_TOKENS`` unless the GPU's
    memory asks for less), a port of its own for torch.distributed, and an idle loop that sleeps.
    ``attention_backend`` replaces Triton, every check's default.
    ``tokenizer``: the server loads the model's tokenizer (grammar needs it; a real model's only) and
    writes JSON without free whitespace, so that a schema's output is as short as it can be."""
    if mode not in (*MODES, UPSTREAM_ADAPTIVE, BASE_NO_OVERLAP):
        raise ValueError(f"unknown mode {mode!r}")
    target, draft = model_dirs(shape) if real is None else real_dirs(real)
    args = ["--model-path", str(target), *(BASE_FLAGS if real is None else without_dummy(BASE_FLAGS))]
    args[args.index("--attention-backend") + 1] = attention_backend
    if tokenizer:
        args.remove("--skip-tokenizer-init")
        args.append("--constrained-json-disable-any-whitespace")
    args += ["--port", str(port), "--log-level", "info"]
    args += ["--max-running-requests", str(MAX_RUNNING_REQUESTS), "--cuda-graph-max-bs", str(MAX_RUNNING_REQUESTS)]
    if tp is not None:
        args += ["--tp-size", str(tp)]
    if shared_gpu_nccl_port is not None:
        tight = shared_gpu_pool_tokens < SHARED_GPU_MAX_TOTAL_TOKENS
        args[args.index("--mem-fraction-static") + 1] = (
            SHARED_GPU_TIGHT_MEM_FRACTION if tight else SHARED_GPU_MEM_FRACTION
        )
        args += ["--max-total-tokens", str(shared_gpu_pool_tokens), "--nccl-port", str(shared_gpu_nccl_port)]
        args.append("--sleep-on-idle")  # else a server waiting its turn spins a core at 100 % (SGLang's IdleSleeper)
    if mode == BASE_NO_OVERLAP:
        args.append("--disable-overlap-schedule")
    elif speculates(mode):
        args += [a.format(draft=draft) for a in (EAGLE3_FLAGS if real is None else without_dummy(EAGLE3_FLAGS))]
        if path == "v1":
            args.append("--disable-overlap-schedule")
    if mode == "dynspec":
        if dynspec is None:
            raise ValueError("the dynspec mode needs its threshold")
        args += dynspec.flags()
    if mode == UPSTREAM_ADAPTIVE:
        if adaptive_config_path is None:
            raise ValueError("the upstream adaptive mode needs its config file")
        args += ["--speculative-adaptive", "--speculative-adaptive-config", str(adaptive_config_path)]
    return args + list(extra)


def server_argv(python: str, args: Sequence[str]) -> list[str]:
    return [python, "-m", "sglang.launch_server", *args]


def env_changes(
    *,
    simulate_acc_len: float | None,
    pythonpath: str | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str | None]:
    """Variables to set (str) or remove (None). Simulated acceptance only where asked for:
    equivalence must never inherit a ``SGLANG_SIMULATE_ACC_LEN`` left in the caller's shell."""
    base = os.environ if base is None else base
    changes: dict[str, str | None] = dict(OFFLINE_ENV)
    for var in SIMULATION_VARS:
        if var in base:
            changes[var] = None
    if simulate_acc_len is not None:
        changes["SGLANG_SIMULATE_ACC_LEN"] = f"{simulate_acc_len:g}"
        changes["SGLANG_SIMULATE_ACC_METHOD"] = "match-expected"
    if pythonpath is not None:
        old = base.get("PYTHONPATH")
        changes["PYTHONPATH"] = pythonpath if not old else f"{pythonpath}{os.pathsep}{old}"
    return changes


def apply_env(changes: Mapping[str, str | None], base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env
