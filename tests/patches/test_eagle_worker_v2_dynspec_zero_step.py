"""The 0.5.14+ insertion that puts dynspec's policy on SGLang's zero-step runtime state."""

from __future__ import annotations

import ast

import pytest

from patcher.engine import apply_text
from patcher.errors import AnchorNotFound
from patches.eagle_worker_v2_dynspec_fallback import EagleWorkerV2DynspecFallback
from patches.eagle_worker_v2_dynspec_zero_step import EagleWorkerV2DynspecZeroStep as Patch
from tests.conftest import RELEASES, releases_of
from tests.patches.real_release import classes, inserted_lines, methods, patched_release, target_source

ZERO_STEP_RELEASES = releases_of(Patch)
MARKER = Patch.marker()


@pytest.mark.releases
@pytest.mark.parametrize("version", ZERO_STEP_RELEASES)
def test_real_release(version: str) -> None:
    after = patched_release(Patch, target_source(Patch, version), version, markers=3)

    worker = classes(after)["EAGLEWorkerV2"]
    assert ast.unparse(worker.body[0]) == "_dynspec = None"
    init = methods(worker)["__init__"]
    assert [ast.unparse(s) for s in init.body[-2:]] == [
        "from sglang.srt.speculative.dynspec_v2 import attach_zero_step_policy",
        "self._dynspec = attach_zero_step_policy(self)",
    ]
    # The policy replaces the controller upstream set up, so it has to come after it.
    sets_controller = [i for i, s in enumerate(init.body) if "self.adaptive_controller" in ast.unparse(s).split("=")[0]]
    assert sets_controller and max(sets_controller) < len(init.body) - 2

    # In the decode branch, right before the verify: the policy may publish early and keep the callback.
    lines = after.splitlines()
    verify = next(i for i, line in enumerate(lines) if line.strip().startswith("batch_output = self.verify("))
    indent = lines[verify][: len(lines[verify]) - len(lines[verify].lstrip())]
    assert lines[verify - 3 : verify] == [
        f"{indent}{MARKER}",
        f"{indent}if self._dynspec is not None:",
        f"{indent}    on_publish = self._dynspec.publish_early(batch, on_publish)",
    ]
    entry = methods(worker)["forward_batch_generation"]
    assert entry.lineno < verify < entry.end_lineno  # type: ignore[operator]


@pytest.mark.releases
@pytest.mark.parametrize("version", ZERO_STEP_RELEASES)
def test_nothing_else_changes(version: str) -> None:
    inserted = inserted_lines(Patch, version)
    assert [line for line in inserted if line and not line.startswith("# dynspec: ")] == [
        "_dynspec = None  # a dynspec_v2 object while --speculative-disable-batch-size is set",
        "from sglang.srt.speculative.dynspec_v2 import attach_zero_step_policy",
        "self._dynspec = attach_zero_step_policy(self)",
        "if self._dynspec is not None:",
        "on_publish = self._dynspec.publish_early(batch, on_publish)",
    ]


@pytest.mark.releases
def test_the_two_v2_patches_split_the_v2_releases_between_them() -> None:
    own, zero_step = releases_of(EagleWorkerV2DynspecFallback), releases_of(Patch)
    assert zero_step[0] == "0.5.14" and own[-1] == "0.5.13"
    assert not set(own) & set(zero_step)
    assert own + zero_step == RELEASES[RELEASES.index("0.5.4") :]


@pytest.mark.releases
def test_a_release_without_the_zero_step_mode_is_drift() -> None:
    """0.5.13 has adaptive states but no trivial verify: the policy would have nothing to switch to."""
    with pytest.raises(AnchorNotFound, match="_build_trivial_verify_input"):
        apply_text([Patch], target_source(Patch, "0.5.13"), "0.5.14", Patch.TARGET)


@pytest.mark.releases
@pytest.mark.parametrize("version", RELEASES)
def test_what_status_says_upstream_offers_matches_the_release(version: str) -> None:
    """The notes ``dynspec status`` prints are checked against each worker's own source."""
    from patches.eagle_worker_dynspec_fallback import EagleWorkerDynspecFallback

    for patch in (EagleWorkerDynspecFallback, EagleWorkerV2DynspecFallback, Patch):
        if not patch.applies_to(version):
            continue  # status prints no note for a patch that is n/a
        source = target_source(patch, version)
        adaptive = "adaptive_controller" in source or "AdaptiveController" in source
        zero_step = "_build_trivial_verify_input" in source
        note = patch.upstream_note(version)
        assert (note is not None) == adaptive, (patch.id, version)
        if note is not None:
            assert ("no zero-step mode" in note) == (not zero_step), (patch.id, version)
