"""The server-flag patches: each ServerArgs layout, and the startup check's behaviour.

The check is taken out of a really patched SGLang file and run, so what is tested is exactly what
the server will run.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from patcher.engine import apply_text
from patcher.releases import unpacked
from patches._flags import FLAGS
from patches.runtime import dynspec_settings
from patches.server_args_dynspec_check import CHECK, ServerArgsDynspecCheck
from patches.server_args_dynspec_flags import ServerArgsDynspecFlags
from patches.server_args_dynspec_flags_legacy import ServerArgsDynspecFlagsLegacy
from patches.spec_fields_dynspec_flags import SpecFieldsDynspecFlags
from tests.conftest import ROOT


@pytest.fixture(autouse=True)
def shipped_settings_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check imports ``dynspec_settings`` from the patched tree, where ``speculative_dynspec_settings``
    puts it; here beside a 0.5.14+ tree's zero-step mode (``test_auto_before_0_5_14_...`` takes it away)."""
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.dynspec_settings", dynspec_settings)
    monkeypatch.setattr(dynspec_settings, "zero_step_mode_here", lambda: True)


ANNOTATED = """\
@dataclasses.dataclass
class ServerArgs:
    speculative_num_draft_tokens: A[
        Optional[int],
        "The number of tokens sampled from the draft model in Speculative Decoding.",
{ns}    ] = None
    speculative_attention_mode: A[str, "mode"] = "prefill"
"""


@pytest.mark.parametrize(("ns", "version"), [("", "0.5.14"), ('        NS("spec"),\n', "0.5.17")], ids=["plain", "NS"])
def test_annotated_fields_copy_the_neighbours_namespace(ns: str, version: str) -> None:
    out = apply_text([ServerArgsDynspecFlags], ANNOTATED.format(ns=ns), version)
    added = out.split(f"# dynspec: server_args_dynspec_flags r{ServerArgsDynspecFlags.REVISION}\n")[1].split(
        "    speculative_attention_mode"
    )[0]
    assert added.count(": A[") == 3
    assert added.count('NS("spec")') == (3 if ns else 0)
    # a string, so that the command line may say auto (SGLang derives argparse's type from it)
    assert "    speculative_disable_batch_size: A[\n        Optional[str],\n" in added
    assert "    speculative_enable_batch_size: A[\n        Optional[int],\n" in added


def test_old_style_neighbour_is_drift_for_the_annotated_patch() -> None:
    from patcher.errors import AnchorNotFound

    with pytest.raises(AnchorNotFound, match=r"ServerArgs.speculative_num_draft_tokens: A\[...\]"):
        apply_text(
            [ServerArgsDynspecFlags],
            "class ServerArgs:\n    speculative_num_draft_tokens: Optional[int] = None\n",
            "0.5.14",
        )


def test_spec_namespace_fields() -> None:
    source = "class Spec(msgspec.Struct):\n" + ANNOTATED.format(ns="").split("class ServerArgs:\n")[1]
    out = apply_text([SpecFieldsDynspecFlags], source, "0.5.20")
    assert all(f"    {f.field}: A[" in out for f in FLAGS)


def check_function(version: str) -> Any:
    """``_dynspec_check_server_args`` as it lands in the real server_args.py of ``version``."""
    tree = unpacked(version, ["srt/server_args.py"])
    source = (tree / "sglang" / "srt" / "server_args.py").read_text()
    patched = apply_text([ServerArgsDynspecCheck], source, version)
    function = next(n for n in ast.parse(patched).body if isinstance(n, ast.FunctionDef) and n.name == CHECK)
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module([function], []), "server_args.py", "exec"), namespace)
    return namespace[CHECK]


def args(**overrides: Any) -> SimpleNamespace:
    values = {
        "speculative_disable_batch_size": 32,
        "speculative_enable_batch_size": None,
        "speculative_switch_min_steps": 8,
        "speculative_algorithm": "EAGLE3",
        "speculative_eagle_topk": 1,
        "max_running_requests": 128,
        "cuda_graph_max_bs": 128,
        "cuda_graph_bs": None,
        "disable_cuda_graph": False,
        "enable_dp_attention": False,
        "pp_size": 1,
    }
    return SimpleNamespace(**{**values, **overrides})


@pytest.fixture(scope="module")
def check() -> Any:
    return check_function("0.5.12")


def test_valid_settings_pass(check: Any) -> None:
    check(args())
    check(args(speculative_enable_batch_size=16))
    check(args(speculative_disable_batch_size=None, speculative_algorithm=None))  # feature off


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"speculative_disable_batch_size": 0},
            "--speculative-disable-batch-size must be a positive integer or auto, got 0",
        ),
        (
            {"speculative_disable_batch_size": "thirty"},
            "--speculative-disable-batch-size must be a positive integer or auto, got 'thirty'",
        ),
        (
            {"speculative_disable_batch_size": "32", "speculative_enable_batch_size": 40},
            "(40) must not exceed --speculative-disable-batch-size (32)",
        ),
        (
            {"speculative_disable_batch_size": "auto", "speculative_enable_batch_size": 128},
            "--speculative-enable-batch-size 128 (auto's floor) can never trigger",
        ),
        (
            {"speculative_disable_batch_size": "auto", "speculative_eagle_topk": 4},
            "does not support --speculative-eagle-topk > 1",
        ),
        ({"speculative_switch_min_steps": -1}, "--speculative-switch-min-steps must be a positive integer"),
        (
            {"speculative_enable_batch_size": 40},
            "--speculative-enable-batch-size (40) must not exceed --speculative-disable-batch-size (32)",
        ),
        ({"speculative_algorithm": "NGRAM"}, "works with --speculative-algorithm EAGLE or EAGLE3, not NGRAM"),
        ({"speculative_eagle_topk": 4}, "does not support --speculative-eagle-topk > 1"),
        ({"enable_dp_attention": True}, "does not support --enable-dp-attention"),
        ({"pp_size": 2}, "does not support --pp-size > 1"),
        ({"speculative_adaptive": True}, "does not support --speculative-adaptive"),
        (
            {"max_running_requests": 32},
            "can never trigger: at most 32 requests run at once; lower it or raise --max-running-requests",
        ),
        ({"cuda_graph_max_bs": 24}, "raise --cuda-graph-max-bs above 32"),
        ({"cuda_graph_bs": [1, 2, 4, 8, 16]}, "largest CUDA-graph batch size (16)"),
        # 0.5.14+ names them with a _decode suffix (the flags stay as aliases): read first
        ({"cuda_graph_max_bs_decode": 24}, "raise --cuda-graph-max-bs above 32"),
        ({"cuda_graph_bs_decode": [1, 2, 4, 8, 16]}, "largest CUDA-graph batch size (16)"),
        ({"cuda_graph_max_bs_decode": 24, "cuda_graph_max_bs": 128}, "largest CUDA-graph batch size (24)"),
        (
            {"speculative_disable_batch_size": None, "speculative_enable_batch_size": 4},
            "needs --speculative-disable-batch-size",
        ),
    ],
)
def test_refusals_name_the_flag_and_the_fix(check: Any, overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as error:
        check(args(**overrides))
    assert message in str(error.value)


def test_auto_and_command_line_numbers_pass(check: Any) -> None:
    check(args(speculative_disable_batch_size="auto"))
    check(args(speculative_disable_batch_size="AUTO", speculative_enable_batch_size=8))  # 8: auto's floor
    check(args(speculative_disable_batch_size="32", speculative_enable_batch_size=16))


def test_auto_before_0_5_14_is_refused_at_the_check(check: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dynspec_settings, "zero_step_mode_here", lambda: False)
    with pytest.raises(ValueError, match=r"^--speculative-disable-batch-size auto needs SGLang 0.5.14 or later"):
        check(args(speculative_disable_batch_size="auto"))
    check(args(speculative_disable_batch_size="32"))  # the control: a number is fine there


@pytest.mark.releases
@pytest.mark.parametrize(("version", "here"), [("0.5.13", False), ("0.5.14", True), ("0.5.23", True)])
def test_the_zero_step_mode_is_found_beside_the_shipped_module(
    version: str, here: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dynspec_settings, written beside a copy of the release's eagle_worker_v2.py (as the patch writes
    it into speculative/), finds the zero-step mode there from 0.5.14 on."""
    member = "srt/speculative/eagle_worker_v2.py"
    release = unpacked(version, [member]) / "sglang" / member
    speculative = tmp_path / "speculative"
    speculative.mkdir()
    shutil.copy(release, speculative / release.name)
    shutil.copy(ROOT / "patches/runtime/dynspec_settings.py", speculative / "dynspec_settings.py")
    spec = importlib.util.spec_from_file_location("shipped_dynspec_settings", speculative / "dynspec_settings.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "shipped_dynspec_settings", module)  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    assert module.zero_step_mode_here() is here
    (speculative / release.name).unlink()
    assert module.zero_step_mode_here() is False  # the control: no worker beside it


def test_the_legacy_command_line_takes_auto_and_numbers() -> None:
    """0.5.12's patched ``add_cli_args`` calls, run on argparse: the threshold arrives as the text
    given (the check and the runtime read it), the other two as ints."""
    tree = unpacked("0.5.12", ["srt/server_args.py"])
    patched = apply_text(
        [ServerArgsDynspecFlagsLegacy], (tree / "sglang" / "srt" / "server_args.py").read_text(), "0.5.12"
    )
    add_cli_args = next(
        m
        for c in ast.parse(patched).body
        if isinstance(c, ast.ClassDef) and c.name == "ServerArgs"
        for m in c.body
        if isinstance(m, ast.FunctionDef) and m.name == "add_cli_args"
    )
    ours = [s for s in add_cli_args.body if any(f.option in ast.unparse(s) for f in FLAGS)]
    parser = argparse.ArgumentParser()
    defaults = SimpleNamespace(**{f.field: eval(f.default) for f in FLAGS})
    exec(compile(ast.Module(ours, []), "server_args.py", "exec"), {"parser": parser, "ServerArgs": defaults})
    parsed = parser.parse_args(["--speculative-disable-batch-size", "auto", "--speculative-enable-batch-size", "4"])
    assert (parsed.speculative_disable_batch_size, parsed.speculative_enable_batch_size) == ("auto", 4)
    assert parser.parse_args(["--speculative-disable-batch-size", "32"]).speculative_disable_batch_size == "32"
    with pytest.raises(SystemExit):  # the control: the other flags are still ints
        parser.parse_args(["--speculative-enable-batch-size", "auto"])


def test_no_cuda_graph_needs_no_graph_headroom(check: Any) -> None:
    check(args(cuda_graph_max_bs=8, disable_cuda_graph=True))


@pytest.mark.parametrize(("version", "argument"), [("0.5.12", "self"), ("0.5.23", "resolving_view(self)")])
def test_check_is_called_first_in_check_server_args(version: str, argument: str) -> None:
    tree = unpacked(version, ["srt/server_args.py"])
    source = (tree / "sglang" / "srt" / "server_args.py").read_text()
    patched = apply_text([ServerArgsDynspecCheck], source, version)
    method = patched.split("    def check_server_args(self):\n", 1)[1]
    assert method.startswith(
        f"        # dynspec: server_args_dynspec_check r{ServerArgsDynspecCheck.REVISION}\n        {CHECK}({argument})\n"
    )
