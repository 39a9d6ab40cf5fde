"""The v1 EAGLEWorker hooks: every real release that has the worker, and hand-written edge cases."""

from __future__ import annotations

import ast

import pytest

from patcher.engine import apply_text
from patcher.errors import AnchorNotFound
from patches.eagle_worker_dynspec_fallback import WORKER
from patches.eagle_worker_dynspec_fallback import EagleWorkerDynspecFallback as Patch
from tests.conftest import RELEASES, releases_of
from tests.patches.real_release import classes, is_guarded, methods, patched_release, target_source

V1_RELEASES = releases_of(Patch)


@pytest.mark.releases
@pytest.mark.parametrize("version", V1_RELEASES)
def test_real_release(version: str) -> None:
    after = patched_release(Patch, target_source(Patch, version), version, markers=4)

    worker = classes(after)["EAGLEWorker"]
    found = methods(worker)
    entry = found.get("forward_batch_speculative_generation") or found["forward_batch_generation"]
    assert ast.unparse(worker.body[worker.body.index(found["__init__"]) - 1]) == "_dynspec = None"
    assert ast.unparse(found["__init__"].body[-1]) == "self._dynspec = attach_dynspec(self)"
    branch = next(s for s in entry.body if isinstance(s, ast.If) and s.orelse)
    decode_hook = branch.orelse[0]
    assert is_guarded(decode_hook)
    assert ast.unparse(decode_hook.body[0]) == f"return self._dynspec.fall_back(self, batch, self.{entry.name})"
    draft_hook = found["draft"].body[0]
    assert is_guarded(draft_hook)
    assert ast.unparse(draft_hook.body[0]) == "return self._dynspec.trivial_verify_input(self, batch, EagleVerifyInput)"


def test_release_range_ends_where_the_v1_worker_does() -> None:
    assert RELEASES[: RELEASES.index("0.5.13")] == V1_RELEASES  # every release up to v1's last
    assert not Patch.applies_to("0.5.13") and not Patch.applies_to("0.4.9")


# Our own stand-in, shaped like the worker (the class name is the patch's anchor).
SMALL = f'''\
from sglang.srt.speculative.eagle_info import EagleVerifyInput


class {WORKER}(TpModelWorker):
    """A worker."""

    def __init__(self, server_args):
        self.server_args = server_args

    def forward_batch_generation(self, schedule_batch):
        if schedule_batch.forward_mode.is_extend():
            return self.forward_target_extend(schedule_batch)
        else:
            verify_input = self.draft(schedule_batch)
            return self.verify(schedule_batch, verify_input)

    def draft(self, schedule_batch):
        """Draft."""
        return None
'''


def test_small_worker_is_patched_in_place() -> None:
    after = apply_text([Patch], SMALL, "0.5.12")
    assert (
        after
        == f'''\
from sglang.srt.speculative.eagle_info import EagleVerifyInput


class {WORKER}(TpModelWorker):
    """A worker."""
    # dynspec: eagle_worker_dynspec_fallback r1
    _dynspec = None  # a dynspec_runtime.DynspecFallback when the flag is set

    def __init__(self, server_args):
        self.server_args = server_args

        # dynspec: eagle_worker_dynspec_fallback r1
        from sglang.srt.speculative.dynspec_runtime import attach_dynspec

        self._dynspec = attach_dynspec(self)

    def forward_batch_generation(self, schedule_batch):
        if schedule_batch.forward_mode.is_extend():
            return self.forward_target_extend(schedule_batch)
        else:
            # dynspec: eagle_worker_dynspec_fallback r1
            if self._dynspec is not None and self._dynspec.should_fall_back(schedule_batch):
                return self._dynspec.fall_back(self, schedule_batch, self.forward_batch_generation)
            verify_input = self.draft(schedule_batch)
            return self.verify(schedule_batch, verify_input)

    def draft(self, schedule_batch):
        """Draft."""
        # dynspec: eagle_worker_dynspec_fallback r1
        if self._dynspec is not None and self._dynspec.in_fallback:
            return self._dynspec.trivial_verify_input(self, schedule_batch, EagleVerifyInput)
        return None
'''
    )


def test_old_entry_point_name_is_preferred() -> None:
    source = SMALL.replace("def forward_batch_generation", "def forward_batch_speculative_generation")
    after = apply_text([Patch], source, "0.5.1")
    assert "self.forward_batch_speculative_generation)" in after


def test_already_patched_worker_is_left_alone() -> None:
    after = apply_text([Patch], SMALL, "0.5.12")
    assert apply_text([Patch], after, "0.5.12") == after


@pytest.mark.parametrize(
    ("edit", "anchor"),
    [
        (
            lambda s: s.replace("    def draft(self, schedule_batch):", "    def draft_tree(self, schedule_batch):"),
            "EAGLEWorker.draft(self, batch)",
        ),
        (
            lambda s: s.replace(
                "        else:\n            verify_input", "        if True:\n            verify_input"
            ),
            "decode branch",
        ),
        (lambda s: s.replace("forward_batch_generation", "run"), "decode branch"),
        (lambda s: s.replace("import EagleVerifyInput", "import EagleDraftInput"), "import EagleVerifyInput"),
        (lambda s: s.replace("class EAGLEWorker", "class EAGLEWorkerV2"), "EAGLEWorker.__init__"),
    ],
    ids=["no-draft", "no-else", "no-entry-point", "no-verify-input-import", "other-class"],
)
def test_drift_is_reported_by_anchor(edit, anchor: str) -> None:
    with pytest.raises(AnchorNotFound, match=anchor.replace("(", r"\(").replace(")", r"\)")):
        apply_text([Patch], edit(SMALL), "0.5.12")
