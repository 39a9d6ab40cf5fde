"""The spec-v2 hooks of 0.5.4-0.5.13: every real release, and hand-written edge cases."""

from __future__ import annotations

import ast

import libcst
import pytest

from patcher.engine import apply_text
from patcher.errors import AnchorNotFound
from patches.eagle_worker_v2_dynspec_fallback import EagleWorkerV2DynspecFallback as Patch
from patches.eagle_worker_v2_dynspec_fallback import forwarding_arguments
from tests.conftest import RELEASES, releases_of
from tests.patches.real_release import classes, inserted_lines, is_guarded, methods, patched_release, target_source

OWN_FALLBACK_RELEASES = releases_of(Patch)


def drafting_branch(entry: ast.FunctionDef) -> list[ast.stmt]:
    """The branch of the entry's top-level if/else that calls ``.draft(...)``."""
    for statement in entry.body:
        if isinstance(statement, ast.If) and statement.orelse:
            for branch in (statement.body, statement.orelse):
                calls = [n for s in branch for n in ast.walk(s) if isinstance(n, ast.Call)]
                if any(isinstance(c.func, ast.Attribute) and c.func.attr == "draft" for c in calls):
                    return branch
    raise AssertionError("no drafting branch")


@pytest.mark.releases
@pytest.mark.parametrize("version", OWN_FALLBACK_RELEASES)
def test_real_release(version: str) -> None:
    after = patched_release(Patch, target_source(Patch, version), version, markers=5)

    found = classes(after)
    worker, draft_worker = found["EAGLEWorkerV2"], found["EagleDraftWorker"]
    for classdef in (worker, draft_worker):
        assert ast.unparse(classdef.body[0]) == "_dynspec = None"
    init = methods(worker)["__init__"]
    assert [ast.unparse(s) for s in init.body[-2:]] == [
        "from sglang.srt.speculative.dynspec_v2 import attach_fallback",
        "self._dynspec = attach_fallback(self)",
    ]

    entry = methods(worker)["forward_batch_generation"]
    batch = entry.args.args[1].arg
    hook = drafting_branch(entry)[0]
    assert is_guarded(hook)
    assert ast.unparse(hook.test) == f"self._dynspec is not None and self._dynspec.should_fall_back({batch})"
    # The re-entry passes on every parameter this release's entry point has (on_publish in 0.5.13),
    # after the fallback may have published the next lengths itself and taken the callback away.
    takes_callback = "on_publish" in [a.arg for a in entry.args.args]
    assert takes_callback == (version == "0.5.13")
    assert [ast.unparse(s) for s in hook.body[:-1]] == (
        [f"on_publish = self._dynspec.publish_early({batch}, on_publish)"] if takes_callback else []
    )
    rerun = hook.body[-1].value
    assert ast.unparse(rerun.func) == "self._dynspec.fall_back"
    call = rerun.args[1].body
    assert ast.unparse(call.func) == "self.forward_batch_generation"
    passed = [ast.unparse(a) for a in call.args] + [k.arg for k in call.keywords]
    assert passed == [a.arg for a in entry.args.args[1:]]

    draft = methods(draft_worker)["draft"]
    draft_hook = draft.body[0]
    assert is_guarded(draft_hook)
    assert ast.unparse(draft_hook.body[0]) == (
        f"return self._dynspec.trivial_verify_input({draft.args.args[1].arg}, EagleVerifyInput)"
    )


@pytest.mark.releases
@pytest.mark.parametrize("version", OWN_FALLBACK_RELEASES)
def test_everything_inserted_is_inert_without_the_flag(version: str) -> None:
    """Besides the attach call (None without the flag) every inserted statement is a guarded hook."""
    unguarded = [
        line
        for line in inserted_lines(Patch, version)
        if line
        and not line.startswith(("# dynspec: ", "if self._dynspec is not None and ", "return self._dynspec."))
        and line != "on_publish = self._dynspec.publish_early(batch, on_publish)"  # inside the guarded if
    ]
    assert unguarded == [
        "_dynspec = None  # a dynspec_v2 object while --speculative-disable-batch-size is set",
        "_dynspec = None  # a dynspec_v2 object while --speculative-disable-batch-size is set",
        "from sglang.srt.speculative.dynspec_v2 import attach_fallback",
        "self._dynspec = attach_fallback(self)",
    ]


@pytest.mark.releases
def test_the_range_is_the_releases_with_a_v2_worker_and_no_zero_step_mode() -> None:
    v2 = RELEASES[RELEASES.index("0.5.4") :]  # the first release with EAGLEWorkerV2
    for version in v2:  # the range follows the releases' code, not a list
        assert Patch.applies_to(version) == ("_build_trivial_verify_input" not in target_source(Patch, version)), (
            version
        )
    assert OWN_FALLBACK_RELEASES[-1] == "0.5.13" and not Patch.applies_to("0.5.3")


# -- hand-written edge cases -----------------------------------------------------------------------

SOURCE = '''\
from sglang.srt.speculative.eagle_info import EagleDraftInput, EagleVerifyInput


class EagleDraftWorker:
    """Drafts."""

    def __init__(self):
        self.speculative_num_steps = 3

    def draft(self, batch):
        """Run the draft model."""
        return EagleVerifyInput()

    def _draft_extend_for_decode(self, batch, result):
        pass


class EAGLEWorkerV2:
    def __init__(self):
        self.speculative_num_steps = 3

    def forward_batch_generation(self, batch, on_publish=None, *, grammar_barrier=None):
        if batch.forward_mode.is_extend():
            return self.target_worker.forward_batch_generation(batch)
        else:
            verify_input = self.draft_worker.draft(batch)
            return self.verify(batch)

    def verify(self, batch):
        pass
'''


def test_hooks_go_after_docstrings_and_forward_every_parameter() -> None:
    after = apply_text([Patch], SOURCE, "0.5.8")
    found = classes(after)
    draft_worker, worker = found["EagleDraftWorker"], found["EAGLEWorkerV2"]
    assert ast.unparse(draft_worker.body[0]) == "'Drafts.'"
    assert ast.unparse(draft_worker.body[1]) == "_dynspec = None"
    draft = methods(draft_worker)["draft"]
    assert ast.get_docstring(draft) == "Run the draft model." and is_guarded(draft.body[1])
    hook = drafting_branch(methods(worker)["forward_batch_generation"])[0]
    assert [ast.unparse(s) for s in hook.body] == [
        "on_publish = self._dynspec.publish_early(batch, on_publish)",
        "return self._dynspec.fall_back(self, lambda: self.forward_batch_generation("
        "batch, on_publish=on_publish, grammar_barrier=grammar_barrier))",
    ]


def test_the_decode_branch_may_be_the_if_branch() -> None:
    """0.5.4 and 0.5.5 test ``is_decode()`` and draft in the ``if`` branch."""
    source = SOURCE.replace(
        """        if batch.forward_mode.is_extend():
            return self.target_worker.forward_batch_generation(batch)
        else:
            verify_input = self.draft_worker.draft(batch)
            return self.verify(batch)
""",
        """        if batch.forward_mode.is_decode():
            verify_input = self.draft_worker.draft(batch)
            return self.verify(batch)
        else:
            return self.target_worker.forward_batch_generation(batch)
""",
    )
    entry = methods(classes(apply_text([Patch], source, "0.5.4"))["EAGLEWorkerV2"])["forward_batch_generation"]
    branch = entry.body[0]
    assert ast.unparse(branch.test) == "batch.forward_mode.is_decode()"
    assert is_guarded(branch.body[0]) and not is_guarded(branch.orelse[0])


def test_a_decode_branch_that_does_not_draft_is_drift() -> None:
    source = SOURCE.replace(
        "verify_input = self.draft_worker.draft(batch)", "verify_input = self.draft_worker.propose(batch)"
    )
    with pytest.raises(AnchorNotFound, match=r"forward_batch_generation: if/else, one branch calling \.draft"):
        apply_text([Patch], source, "0.5.8")


def test_a_draft_worker_without_draft_extend_for_decode_is_drift() -> None:
    source = SOURCE.replace("_draft_extend_for_decode", "_extend")
    with pytest.raises(AnchorNotFound, match="EagleDraftWorker._draft_extend_for_decode"):
        apply_text([Patch], source, "0.5.8")


def test_already_patched_is_left_alone() -> None:
    after = apply_text([Patch], SOURCE, "0.5.8")
    assert apply_text([Patch], after, "0.5.8") == after


def signature(code: str) -> libcst.FunctionDef:
    function = libcst.parse_module(code).body[0]
    assert isinstance(function, libcst.FunctionDef)
    return function


@pytest.mark.parametrize(
    ("code", "arguments"),
    [
        ("def f(self, model_worker_batch): pass", "model_worker_batch"),
        ("def f(self, batch, on_publish=None): pass", "batch, on_publish=on_publish"),
        (
            "def f(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None): pass",
            "batch, on_publish=on_publish, grammar_barrier=grammar_barrier, pp_proxy_tensors=pp_proxy_tensors",
        ),
        ("def f(self, batch, *args, flag=False, **kwargs): pass", "batch, *args, flag=flag, **kwargs"),
        ("def f(self, batch, /, extra): pass", "batch, extra=extra"),
    ],
    ids=["0.5.4", "0.5.13", "0.5.19", "varargs", "positional-only"],
)
def test_forwarding_arguments(code: str, arguments: str) -> None:
    assert forwarding_arguments(signature(code)) == arguments
