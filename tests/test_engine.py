"""The engine with patches written here: it must know no patch of its own.

The inputs are small files of our own, shaped like the code SGLang has.
"""

from __future__ import annotations

import libcst as cst
import pytest

from patcher import anchors
from patcher.engine import Status, apply_text, first_changed_line
from patcher.errors import AnchorNotFound, BadTarget, ExitCode, Refused
from patcher.patch import CstPatch, NewFilePatch
from patcher.registry import Recipe
from patcher.session import Session
from tests.conftest import ROOT, snapshot

CONFIG = """\
import dataclasses


@dataclasses.dataclass
class Config:
    speed: int = 1
    # more fields below
    depth: int = 2

    def check(self):
        assert self.speed > 0
"""


class AddColour(CstPatch):
    REVISION = 1
    TARGET = "srt/config.py"
    SGLANG = ">=1.0"
    SUMMARY = "add a colour field"
    ANCHORS = {"Config.speed": anchors.class_field("Config", "speed")}
    APPLIED = anchors.class_field("Config", "colour")
    FIELD = 'colour: str = "red"\n'

    def transform(self, module: cst.Module) -> cst.Module:
        new = self.parse_statements(module, self.FIELD)
        return anchors.replace_class(
            module,
            "Config",
            lambda c: anchors.with_body(
                c, anchors.insert_after(anchors.body_of(c), lambda s: anchors.is_field(s, "speed"), new)
            ),
        )


class AddColourR2(AddColour):
    id = "AddColour"
    REVISION = 2
    FIELD = 'colour: str = "blue"\n'


class RenameSpeed(AddColour):
    """Breaks the insert-only rule on purpose."""

    APPLIED = anchors.class_field("Config", "velocity")

    def transform(self, module: cst.Module) -> cst.Module:
        return cst.parse_module(module.code.replace("speed: int = 1", "velocity: int = 1"))


class ForgetsItself(AddColour):
    """Its applied-matcher does not recognise its output."""

    APPLIED = anchors.class_field("Config", "nowhere")


class Helper(NewFilePatch):
    REVISION = 1
    TARGET = "srt/helper.py"
    SGLANG = ">=1.0"
    SUMMARY = "a new module"

    def content(self) -> str:
        return "VALUE = 42\n"


def test_insert_after_anchor_with_marker_and_no_op_second_time() -> None:
    out = apply_text([AddColour], CONFIG, "1.0")
    assert '    speed: int = 1\n    # dynspec: AddColour r1\n    colour: str = "red"\n    # more fields below\n' in out
    assert apply_text([AddColour], out, "1.0") == out


def test_missing_anchor_names_patch_anchor_file_and_version() -> None:
    with pytest.raises(AnchorNotFound) as error:
        apply_text([AddColour], CONFIG.replace("speed", "pace"), "1.0", "srt/config.py")
    assert str(error.value) == "AddColour: anchor 'Config.speed' not found in srt/config.py (SGLang 1.0)"


def test_outside_the_version_range_nothing_happens() -> None:
    assert apply_text([AddColour], CONFIG, "0.9") == CONFIG


def test_edits_to_original_lines_are_refused() -> None:
    with pytest.raises(BadTarget, match="would change original line 6"):
        apply_text([RenameSpeed], CONFIG, "1.0", "srt/config.py")


def test_applied_matcher_must_recognise_the_output() -> None:
    with pytest.raises(BadTarget, match="applied-matcher does not recognise its own output"):
        apply_text([ForgetsItself], CONFIG, "1.0")


def test_first_changed_line() -> None:
    assert first_changed_line("a\nb\nc\n", "a\nx\nb\ny\nc\n") is None
    assert first_changed_line("a\nb\nc\n", "a\nc\n") == 2


@pytest.fixture
def tree(tmp_path):
    package = tmp_path / "sglang"
    (package / "srt").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "version.py").write_text('__version__ = "1.2"\n')
    (package / "srt" / "server_args.py").write_text("")
    (package / "srt" / "config.py").write_text(CONFIG)
    return package


def recipe(*patches) -> Recipe:
    return Recipe("test", "", ">=1.0", tuple(patches))


def test_a_recipe_supports_the_releases_of_its_range_and_refuses_others_unless_forced(tree) -> None:
    series = recipe(AddColour)
    assert series.supports("1.2") and series.supports("2.0rc1")
    assert not series.supports("0.9") and not series.supports("not a version")  # controls
    assert series.refuse_unsupported("1.2", force=False) is None
    message = "SGLang 0.9 is not a release recipe 'test' supports (>=1.0)"
    with pytest.raises(Refused) as refused:
        series.refuse_unsupported("0.9", force=False)
    assert str(refused.value) == f"{message}; --force tries anyway" and refused.value.exit_code == ExitCode.REFUSED
    assert series.refuse_unsupported("0.9", force=True) == f"{message}; going ahead because of --force"
    before = snapshot(tree)
    (tree / "version.py").write_text('__version__ = "0.9"\n')  # the Session asks the recipe
    with pytest.raises(Refused, match="--force tries anyway"):
        Session.open(str(tree), series)
    assert f"{message}; going ahead because of --force" in Session.open(str(tree), series, force=True).notes
    (tree / "version.py").write_text('__version__ = "1.2"\n')
    assert snapshot(tree) == before


def test_new_file_is_created_and_revert_deletes_it(tree) -> None:
    before = snapshot(tree)
    Session.open(str(tree), recipe(AddColour, Helper)).apply()
    assert (tree / "srt" / "helper.py").read_text() == "# dynspec: Helper r1\nVALUE = 42\n"
    report = {s.patch.id: s.status for s in Session.open(str(tree), recipe(AddColour, Helper)).status()}
    assert report == {"AddColour": Status.APPLIED, "Helper": Status.APPLIED}
    Session.open(str(tree), recipe(AddColour, Helper)).revert()
    assert snapshot(tree) == before


def test_a_new_file_without_content_of_its_own_ships_the_runtime_module_of_its_target_name() -> None:
    from patches.speculative_dynspec_settings import SpeculativeDynspecSettings

    shipped = (ROOT / "patches" / "runtime" / "dynspec_settings.py").read_text(encoding="utf-8")
    assert (
        SpeculativeDynspecSettings().text()
        == f"# dynspec: speculative_dynspec_settings r{SpeculativeDynspecSettings.REVISION}\n{shipped}"
    )

    class Unshipped(NewFilePatch):  # control: tests/ has no runtime/ package of such a module
        REVISION = 1
        TARGET = "srt/unshipped.py"
        SGLANG = ">=1.0"
        SUMMARY = "no runtime module"

    with pytest.raises(FileNotFoundError, match="unshipped.py"):
        Unshipped().content()


def test_newer_revision_is_outdated_then_upgraded_in_place(tree) -> None:
    before = snapshot(tree)
    Session.open(str(tree), recipe(AddColour)).apply()
    report = Session.open(str(tree), recipe(AddColourR2)).status()
    assert [(s.status, s.detail) for s in report] == [(Status.OUTDATED, "r1 on disk, r2 available")]
    plan = Session.open(str(tree), recipe(AddColourR2)).apply()
    assert [f.target for f in plan.pending] == ["srt/config.py"]
    text = (tree / "srt" / "config.py").read_text()
    assert '# dynspec: AddColour r2\n    colour: str = "blue"' in text and "red" not in text
    assert Session.open(str(tree), recipe(AddColourR2)).status()[0].status is Status.APPLIED
    Session.open(str(tree), recipe(AddColourR2)).revert()
    assert snapshot(tree) == before, "revert goes back to the original, not to r1"


def test_status_spots_code_without_a_record(tree) -> None:
    (tree / "srt" / "config.py").write_text(apply_text([AddColour], CONFIG, "1.2"))
    report = Session.open(str(tree), recipe(AddColour)).status()
    assert report[0].status is Status.UNRECORDED


class AddColourNoted(AddColour):
    id = "AddColour"
    UPSTREAM_NOTES = (
        (">=1.2,<2", "upstream has a palette; dynspec adds the colour"),
        (">=2", "upstream 2 has colours"),
    )


def test_status_says_what_upstream_offers_next_to_the_patch(tree) -> None:
    assert (
        AddColourNoted.upstream_note("1.1") is None and AddColourNoted.upstream_note("2.0") == "upstream 2 has colours"
    )
    [before] = Session.open(str(tree), recipe(AddColourNoted)).status()
    assert (before.status, before.detail) == (Status.NOT_APPLIED, "upstream has a palette; dynspec adds the colour")
    Session.open(str(tree), recipe(AddColourNoted)).apply()
    [after] = Session.open(str(tree), recipe(AddColourNoted)).status()
    assert (after.status, after.detail) == (Status.APPLIED, "r1; upstream has a palette; dynspec adds the colour")


def test_a_checked_result_is_reused_only_for_the_same_inputs(tmp_path, monkeypatch) -> None:
    from patcher import engine

    monkeypatch.setenv("DYNSPEC_CACHE", str(tmp_path / "cache"))
    first, steps = engine.checked_patch_file([AddColour], "srt/config.py", CONFIG, "1.0")
    assert 'colour: str = "red"' in (first or "") and steps[0].outcome is engine.Outcome.PATCHED

    def must_not_run(*args, **kwargs):
        raise AssertionError("patch_file ran although the same inputs were checked before")

    monkeypatch.setattr(engine, "patch_file", must_not_run)
    again, steps = engine.checked_patch_file([AddColour], "srt/config.py", CONFIG, "1.0")
    assert again == first and steps[0].outcome is engine.Outcome.PATCHED
    for other in (
        ([AddColourR2], CONFIG, "1.0"),  # another revision of the patch
        ([AddColour], CONFIG + "\n", "1.0"),  # another pristine text
        ([AddColour], CONFIG, "1.1"),  # another SGLang version
    ):
        with pytest.raises(AssertionError, match="patch_file ran"):
            engine.checked_patch_file(other[0], "srt/config.py", other[1], other[2])
