"""The runtime's settings module (``patches/runtime/dynspec_settings.py``): the one reading of the
three flags and the one list of what they refuse, for the start-up check and both runtimes.

The start-up check itself runs inside each release's patched ``server_args.py`` in
``test_server_args_flags.py``; here are the pieces and the rule that they have one home.
"""

from __future__ import annotations

import ast
import sys
import zipfile
from fnmatch import fnmatch
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from patcher import releases
from patcher.engine import patch_file
from patches._flags import FLAGS
from patches.runtime import dynspec_settings as settings
from patches.runtime.dynspec_settings import (
    AUTO,
    DEFAULT_MIN_STEPS,
    Settings,
    getter_of,
    read_settings,
    unsupported_reason,
)
from patches.server_args_dynspec_check import ServerArgsDynspecCheck
from patches.speculative_dynspec_settings import SpeculativeDynspecSettings
from tests.conftest import ROOT, releases_of

SUPPORTED = {
    "speculative_algorithm": "EAGLE3",
    "speculative_eagle_topk": 1,
    "enable_dp_attention": False,
    "pp_size": 1,
    "enable_two_batch_overlap": False,
    "enable_pdmux": False,
    "enable_multi_layer_eagle": False,
    "speculative_adaptive": False,
}


def supported_server_args(**overrides: Any) -> SimpleNamespace:
    """``server_args`` that dynspec supports (no refusal), but for ``overrides``."""
    return SimpleNamespace(**{**SUPPORTED, **overrides})


def reason(**overrides: Any) -> str | None:
    return unsupported_reason(getter_of(supported_server_args(**overrides)))


def test_supported_settings_have_no_refusal() -> None:
    assert reason() is None
    assert reason(speculative_algorithm="EAGLE") is None
    assert unsupported_reason(getter_of(SimpleNamespace(speculative_algorithm="EAGLE"))) is None  # older releases


@pytest.mark.parametrize(
    ("overrides", "flag"),
    [
        ({"speculative_eagle_topk": 4}, "--speculative-eagle-topk > 1"),
        ({"enable_dp_attention": True}, "--enable-dp-attention"),
        ({"pp_size": 2}, "--pp-size > 1"),
        ({"enable_two_batch_overlap": True}, "--enable-two-batch-overlap"),
        ({"enable_pdmux": True}, "--enable-pdmux"),
        ({"enable_multi_layer_eagle": True}, "--enable-multi-layer-eagle"),
        ({"speculative_adaptive": True}, "--speculative-adaptive"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_unsupported_settings_are_refused_by_flag(overrides: dict[str, Any], flag: str) -> None:
    assert reason(**overrides) == f"--speculative-disable-batch-size does not support {flag}"


def test_other_algorithms_are_refused() -> None:
    assert reason(speculative_algorithm="STANDALONE") == (
        "--speculative-disable-batch-size works with --speculative-algorithm EAGLE or EAGLE3, not STANDALONE"
    )


def read(**values: Any) -> Settings | None:
    return read_settings(lambda name, default: values.get(name, default))


def test_the_flags_read_with_their_defaults() -> None:
    assert read() is None  # the flag unset: dynspec is off
    assert read(speculative_disable_batch_size="32") == Settings(32, 32, DEFAULT_MIN_STEPS)
    assert read(
        speculative_disable_batch_size=32, speculative_enable_batch_size=16, speculative_switch_min_steps=3
    ) == Settings(32, 16, 3)
    auto = read(speculative_disable_batch_size="auto")
    assert auto == Settings(AUTO, 1, DEFAULT_MIN_STEPS) and auto.auto  # auto's floor: 1 unless given
    assert read(speculative_disable_batch_size="auto", speculative_enable_batch_size=8) == Settings(
        AUTO, 8, DEFAULT_MIN_STEPS
    )
    # a None the layout may hold for an unset field is the default too
    assert read(speculative_disable_batch_size=8, speculative_switch_min_steps=None) == Settings(
        8, 8, DEFAULT_MIN_STEPS
    )
    with pytest.raises(
        ValueError, match=r"^--speculative-disable-batch-size must be a positive integer or auto, got '0'$"
    ):
        read(speculative_disable_batch_size="0")


def test_the_flags_default_dwell_is_the_runtimes() -> None:
    """The dwell's default has one home: ServerArgs gets the runtime's number, as the flag patches spell it."""
    (min_steps,) = [f for f in FLAGS if f.field == "speculative_switch_min_steps"]
    assert min_steps.default == str(DEFAULT_MIN_STEPS)


def homes_of(words: str, files: list[Path]) -> list[str]:
    return sorted(p.name for p in files if words in p.read_text(encoding="utf-8"))


def test_what_is_refused_is_written_in_the_settings_module_only() -> None:
    """The start-up check and both runtimes call it; none reads a refused setting of its own."""
    shipped = sorted((ROOT / "patches").glob("*.py")) + sorted((ROOT / "patches" / "runtime").glob("*.py"))
    for _, name, *_ in settings.UNSUPPORTED:
        assert homes_of(name, shipped) == ["dynspec_settings.py"], name
    assert homes_of("works with --speculative-algorithm", shipped) == ["dynspec_settings.py"]
    # the control: a second copy, as the check patch held before, is found
    copy = ROOT / "patches" / "runtime" / "dynspec_settings.py"
    assert homes_of("enable_dp_attention", [copy, copy]) == ["dynspec_settings.py", "dynspec_settings.py"]


def test_the_new_file_is_the_settings_module_and_imports_nothing_but_the_standard_library() -> None:
    new, steps, _ = patch_file([SpeculativeDynspecSettings], SpeculativeDynspecSettings.TARGET, None, "0.4.10.post2")
    assert new == SpeculativeDynspecSettings.marker() + "\n" + Path(settings.__file__).read_text(encoding="utf-8")
    assert steps[0].outcome.value == "patched"
    imported = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for node in ast.walk(ast.parse(new))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert imported == {"__future__", "os", "sys", "dataclasses", "typing"}


def as_main(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    main = SimpleNamespace(__spec__=SimpleNamespace(name=name))
    monkeypatch.setitem(sys.modules, "__main__", main)


def test_from_the_server_command_a_refusal_is_one_line_and_exit_code_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    refused = SimpleNamespace(**SUPPORTED, speculative_disable_batch_size=128, max_running_requests=128)
    as_main(monkeypatch, "sglang.launch_server")
    with pytest.raises(SystemExit) as exit_:
        settings.check_server_args(refused)
    assert exit_.value.code == 2 and exit_.value.__cause__ is None and exit_.value.__suppress_context__
    assert capsys.readouterr().err == (
        "error: --speculative-disable-batch-size 128 can never trigger: at most 128 requests run at once; "
        "lower it or raise --max-running-requests\n"
    )
    settings.check_server_args(
        SimpleNamespace(**SUPPORTED, speculative_disable_batch_size=32, max_running_requests=128)
    )
    # the control: a program that builds its own ServerArgs gets the ValueError, as from SGLang's own checks
    as_main(monkeypatch, "my_service")
    with pytest.raises(ValueError, match="can never trigger"):
        settings.check_server_args(refused)
    assert capsys.readouterr().err == ""


def server_args_fields(version: str) -> set[str]:
    """The names ServerArgs declares in ``version``: its own class body before 0.5.20, and the
    field groups (``arg_groups/fields/*.py``) it is assembled from after."""
    names: set[str] = set()
    with zipfile.ZipFile(releases.wheel(version)) as wheel:
        for member in wheel.namelist():
            if member == "sglang/srt/server_args.py" or fnmatch(member, "sglang/srt/arg_groups/fields/*.py"):
                for node in ast.walk(ast.parse(wheel.read(member))):
                    if isinstance(node, ast.ClassDef):
                        names |= {
                            n.target.id
                            for n in node.body
                            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                        }
    return names


@pytest.fixture(scope="module")
def fields_by_release() -> dict[str, set[str]]:
    return {version: server_args_fields(version) for version in releases_of(ServerArgsDynspecCheck)}


def unheld(setting: tuple[str, ...], fields_by_release: dict[str, set[str]]) -> list[str]:
    """The releases after the first that names ``setting`` (under any of its names) that name it under none:
    a rename that would turn the check reading it off there."""
    versions = list(fields_by_release)  # oldest first, as tests/releases.txt lists them
    held = [bool(fields_by_release[v].intersection(setting)) for v in versions]
    if True not in held:
        return []
    first = held.index(True)
    return [v for v, has in zip(versions[first:], held[first:]) if not has]


REQUIRED = {("speculative_algorithm",), ("max_running_requests",), ("disable_cuda_graph",)}


@pytest.mark.releases
def test_every_setting_the_check_reads_keeps_a_name_in_every_later_release(
    fields_by_release: dict[str, set[str]],
) -> None:
    """Once a release has a setting, every later one has it under a name the check reads; the size
    limits it compares the threshold with exist in every release. 0.5.14 renamed the CUDA-graph sizes:
    the check read the old names alone, and an H100 run of 0.5.17 started where it had to refuse."""
    for setting in settings.SGLANG_SETTINGS_READ:
        assert unheld(setting, fields_by_release) == [], setting
    for setting in (*REQUIRED, settings.GRAPH_BATCH_SIZES, settings.GRAPH_MAX_BATCH_SIZE):
        assert [v for v, names in fields_by_release.items() if not names.intersection(setting)] == [], setting
    # the control: the old names alone, as the check read them before, are missing from 0.5.14 on
    assert unheld(("cuda_graph_max_bs",), fields_by_release)[0] == "0.5.14"
