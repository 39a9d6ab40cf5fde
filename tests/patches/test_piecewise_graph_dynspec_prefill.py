"""The insertion that lets a dynspec server's target prefill replay its piecewise graphs
(0.5.11 - 0.5.13), on the real releases, and the decision it inserts, run on stand-ins of the
model runner with dynspec's own v2 runtime as the module it imports its switch from."""

from __future__ import annotations

import ast
import enum
import logging
import sys
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from patcher.engine import apply_text
from patcher.errors import AnchorNotFound
from patches.piecewise_graph_dynspec_prefill import DECLARE, ENV
from patches.piecewise_graph_dynspec_prefill import PiecewiseGraphDynspecPrefill as Patch
from patches.runtime import dynspec_v2
from tests.conftest import releases_of
from tests.patches.real_release import patched_release, target_source

RELEASES = releases_of(Patch)
MARKER = Patch.marker()


class CaptureHiddenMode(enum.IntEnum):  # sglang's, by name: NULL, LAST, FULL
    NULL = 0
    LAST = 1
    FULL = 2


def inserted_function(source: str) -> Callable[[Any, CaptureHiddenMode], CaptureHiddenMode]:
    """The inserted function, compiled on its own with ``CaptureHiddenMode`` from here."""
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == DECLARE)
    namespace: dict[str, Any] = {"CaptureHiddenMode": CaptureHiddenMode}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "<inserted>", "exec"), namespace)
    return namespace[DECLARE]  # type: ignore[no-any-return]


def model_runner(threshold: int | None = 32, draft: bool = False, eagle: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        server_args=SimpleNamespace(speculative_disable_batch_size=threshold),
        is_draft_worker=draft,
        spec_algorithm=SimpleNamespace(is_eagle=lambda: eagle),
    )


@pytest.mark.releases
@pytest.mark.parametrize("version", RELEASES)
def test_real_release(version: str) -> None:
    after = patched_release(Patch, target_source(Patch, version), version, markers=2)
    lines = after.splitlines()
    call = next(i for i, line in enumerate(lines) if f"= {DECLARE}(" in line)
    assert lines[call].strip() == f"self.capture_hidden_mode = {DECLARE}(model_runner, self.capture_hidden_mode)"
    # right after upstream's own FULL for --enable-return-hidden-states, inside __init__
    assert lines[call - 3].strip() == "if model_runner.server_args.enable_return_hidden_states:"
    assert lines[call - 2].strip() == "self.capture_hidden_mode = CaptureHiddenMode.FULL"
    assert lines[call - 1].strip() == MARKER


@pytest.fixture
def installed_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """dynspec's v2 runtime where the patched runner imports it from (speculative_dynspec_v2
    installs it on 0.5.4+, so on every release this patch applies to)."""
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.dynspec_v2", dynspec_v2)


def test_the_v2_runtime_is_installed_wherever_this_patch_applies() -> None:
    from patches.speculative_dynspec_v2 import SpeculativeDynspecV2

    assert all(SpeculativeDynspecV2.applies_to(v) for v in RELEASES)
    assert not SpeculativeDynspecV2.applies_to("0.5.3")  # negative control: the check can fail


@pytest.mark.usefixtures("installed_runtime")
def test_the_decision_is_full_for_a_dynspec_eagle_target_unless_switched_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    declare = inserted_function(apply_text([Patch], target_source(Patch, "0.5.12"), "0.5.12", Patch.TARGET))
    null, full = CaptureHiddenMode.NULL, CaptureHiddenMode.FULL
    monkeypatch.delenv(ENV, raising=False)
    caplog.set_level(logging.INFO)
    assert declare(model_runner(), null) is full  # on by default (session 21's GPU run)
    assert "dynspec: the target's prefill replays its piecewise CUDA graphs" in caplog.text  # what a user greps for
    assert declare(model_runner(), full) is full  # --enable-return-hidden-states already said FULL
    assert declare(model_runner(threshold=None), null) is null  # stock server: not dynspec's to change
    assert declare(model_runner(draft=True), null) is null  # the draft has no piecewise graphs to declare
    assert declare(model_runner(eagle=False), null) is null
    monkeypatch.setenv(ENV, "1")
    assert declare(model_runner(), null) is full
    monkeypatch.setenv(ENV, "0")
    caplog.clear()
    assert declare(model_runner(), null) is null
    assert "replays its piecewise CUDA graphs" not in caplog.text


@pytest.mark.usefixtures("installed_runtime")
def test_a_bad_switch_value_refuses_to_start_and_a_stock_server_never_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    declare = inserted_function(apply_text([Patch], target_source(Patch, "0.5.12"), "0.5.12", Patch.TARGET))
    monkeypatch.setenv(ENV, "yes")
    with pytest.raises(ValueError, match=f"{ENV} must be 0 or 1, not 'yes'"):
        declare(model_runner(), CaptureHiddenMode.NULL)
    assert declare(model_runner(threshold=None), CaptureHiddenMode.NULL) is CaptureHiddenMode.NULL


def test_a_runner_whose_can_run_does_not_compare_the_mode_is_refused() -> None:
    """0.5.10's runner replays any mode (its server turns the graphs off for speculation instead):
    declaring FULL there would not be what makes a prefill replay them."""
    old = target_source(Patch, "0.5.10")
    with pytest.raises(AnchorNotFound, match="can_run compares"):
        apply_text([Patch], old, "0.5.12", Patch.TARGET)
    assert not Patch.applies_to("0.5.10") and not Patch.applies_to("0.5.14") and Patch.applies_to("0.5.12")
