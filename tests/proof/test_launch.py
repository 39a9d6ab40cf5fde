from __future__ import annotations

import json

import pytest

from patcher.proof import launch
from patcher.proof.launch import MODELS, Dynspec, apply_env, env_changes, server_args, server_argv

SERVE_SH = [
    "--load-format", "dummy", "--skip-tokenizer-init", "--attention-backend", "triton",
    "--sampling-backend", "pytorch", "--mem-fraction-static", "0.5",
]  # fmt: skip
EAGLE3 = [
    "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(MODELS / "draft"),
    "--speculative-draft-load-format", "dummy", "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
]  # fmt: skip
TAIL = ["--port", "30001", "--log-level", "info", "--max-running-requests", "128", "--cuda-graph-max-bs", "128"]


def test_base_is_serve_sh_plus_the_two_max_bs_flags():
    args = server_args("base", shape="small", port=30001, path="v2")
    assert args == ["--model-path", str(MODELS / "target"), *SERVE_SH, *TAIL]
    assert server_argv("/py", args)[:3] == ["/py", "-m", "sglang.launch_server"]


def test_a_server_sharing_the_gpu_gets_a_fixed_pool_and_its_own_nccl_port():
    shared = server_args("always_on", shape="8b", port=30001, path="v2", shared_gpu_nccl_port=30501)
    alone = server_args("always_on", shape="8b", port=30001, path="v2")
    assert shared[shared.index("--mem-fraction-static") + 1] == "0.85"
    assert shared[shared.index("--max-total-tokens") + 1] == "131072"
    assert shared[shared.index("--nccl-port") + 1] == "30501" and "--sleep-on-idle" in shared
    # the control: alone, the command line is serve.sh's; and nothing else differs
    assert alone[alone.index("--mem-fraction-static") + 1] == "0.5"
    assert not {"--max-total-tokens", "--nccl-port", "--sleep-on-idle"} & set(alone)
    added = ("0.85", "0.5", "--max-total-tokens", "131072", "--nccl-port", "30501", "--sleep-on-idle")
    assert [a for a in shared if a not in added] == [a for a in alone if a != "0.5"]


def test_always_on_adds_eagle3_and_v1_disables_overlap():
    v2 = server_args("always_on", shape="small", port=30001, path="v2")
    assert v2 == ["--model-path", str(MODELS / "target"), *SERVE_SH, *TAIL, *EAGLE3]
    v1 = server_args("always_on", shape="small", port=30001, path="v1")
    assert v1 == [*v2, "--disable-overlap-schedule"]


def test_dynspec_adds_only_the_flags_given():
    args = server_args("dynspec", shape="small", port=30001, path="v2", dynspec=Dynspec(32))
    assert args[-2:] == ["--speculative-disable-batch-size", "32"]
    full = server_args("dynspec", shape="small", port=30001, path="v1", dynspec=Dynspec(32, 16, 4))
    assert full[-7:] == [
        "--disable-overlap-schedule",
        "--speculative-disable-batch-size", "32",
        "--speculative-enable-batch-size", "16",
        "--speculative-switch-min-steps", "4",
    ]  # fmt: skip


def test_8b_shape_tp_and_extra_args_reach_every_server():
    for mode in launch.MODES:
        args = server_args(mode, shape="8b", port=30001, path="v2", dynspec=Dynspec(8), tp=2, extra=["--x", "1"])
        assert args[:2] == ["--model-path", str(MODELS / "target8b")]
        assert args[args.index("--tp-size") + 1] == "2"
        assert args[-2:] == ["--x", "1"]
        if mode != "base":
            assert args[args.index("--speculative-draft-model-path") + 1] == str(MODELS / "draft8b")


def test_shipped_model_configs_are_the_eagle3_pairs():
    for target, draft in launch.SHAPES.values():
        t = json.loads((MODELS / target / "config.json").read_text())
        d = json.loads((MODELS / draft / "config.json").read_text())
        assert t["architectures"] == ["LlamaForCausalLM"]
        assert d["architectures"] == ["LlamaForCausalLMEagle3"] and "draft_vocab_size" in d
        assert d["hidden_size"] == t["hidden_size"] and d["vocab_size"] == t["vocab_size"]
        assert t["vocab_size"] > 31100  # the client's prompt ids


def test_equivalence_servers_never_inherit_simulated_acceptance():
    caller = {"SGLANG_SIMULATE_ACC_LEN": "3", "PATH": "/bin", "PYTHONPATH": "/old"}
    changes = env_changes(simulate_acc_len=None, pythonpath="/kit", base=caller)
    env = apply_env(changes, caller)
    assert "SGLANG_SIMULATE_ACC_LEN" not in env
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["PYTHONPATH"] == "/kit:/old" and env["PATH"] == "/bin"
    assert changes["SGLANG_SIMULATE_ACC_LEN"] is None


def test_throughput_servers_simulate_acceptance():
    env = apply_env(env_changes(simulate_acc_len=3.0, base={}), {})
    assert env["SGLANG_SIMULATE_ACC_LEN"] == "3"
    assert env["SGLANG_SIMULATE_ACC_METHOD"] == "match-expected"
    assert "PYTHONPATH" not in env


def test_upstream_adaptive_is_always_on_plus_the_adaptive_flags(tmp_path):
    assert json.dumps(launch.adaptive_config(32)) == '{"1": {"candidate_steps": [3]}, "33": {"candidate_steps": [0]}}'
    cfg = tmp_path / "upstream-adaptive.json"
    for path in ("v1", "v2"):
        on = server_args("always_on", shape="8b", port=30001, path=path, extra=["--x"])
        up = server_args(
            launch.UPSTREAM_ADAPTIVE, shape="8b", port=30001, path=path, dynspec=Dynspec(32), extra=["--x"],
            adaptive_config_path=cfg,
        )  # fmt: skip
        assert up == [*on[:-1], "--speculative-adaptive", "--speculative-adaptive-config", str(cfg), "--x"]


@pytest.mark.parametrize(
    ("argv", "secs"),
    [
        ([], 0.0),
        (["--gc-warning-threshold-secs", "0.05"], 0.05),
        (["--gc-warning-threshold-secs", "0.05", "--port", "1", "--gc-warning-threshold-secs=1.5"], 1.5),
        (["--gc-warning-threshold-secs=2", "--gc-warning-threshold-secs", "0"], 0.0),  # the last wins
        (["--gc-warning-threshold-secs", "x"], 0.0),
        (["--gc-warning-threshold-secs"], 0.0),  # a flag without its value
    ],
)
def test_the_gc_warning_threshold_is_the_command_lines_last(argv: list[str], secs: float) -> None:
    assert launch.gc_warning_secs(argv) == secs
