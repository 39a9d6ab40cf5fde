"""The registry refuses a recipe whose order breaks what a patch ``REQUIRES``."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from patcher import registry
from patcher.patch import Patch
from patcher.registry import all_patches, check_requirements, load_recipe
from tests.test_engine import Helper


class Module(Helper):
    SUMMARY = "a module the hook calls"


class Hook(Module):
    TARGET = "srt/hook.py"
    SUMMARY = "calls the module"
    REQUIRES = ("Module",)


class OldHook(Hook):
    SGLANG = "<1.0"  # no release has both: the requirement binds nowhere


class LastOldHook(Hook):
    SGLANG = "<=1.0"  # 1.0 has both


class StrayHook(Hook):
    REQUIRES = ("NoSuchPatch",)


def default_ids() -> list[str]:
    return [patch.id for patch in load_recipe("default").patches]


def recipe_of(ids: list[str]) -> tuple[type[Patch], ...]:
    return tuple(all_patches()[i] for i in ids)


def moved_last(ids: list[str], moved: str) -> list[str]:
    return [i for i in ids if i != moved] + [moved]


def test_the_default_recipe_meets_every_requirement() -> None:
    patches = load_recipe("default").patches  # load_recipe checks it
    check_requirements("default", patches)
    assert any(patch.REQUIRES for patch in patches)


def test_every_requirement_names_a_shipped_patch() -> None:
    known = all_patches()
    assert {required for patch in known.values() for required in patch.REQUIRES} <= set(known)


def test_two_patches_swapped_are_refused() -> None:
    ids = default_ids()
    hook, module = ids.index("eagle_worker_dynspec_fallback"), ids.index("speculative_dynspec_runtime")
    ids[hook], ids[module] = ids[module], ids[hook]
    message = (
        f"recipe 'swapped': eagle_worker_dynspec_fallback (patch {module + 1}) requires "
        f"speculative_dynspec_runtime before it, which stands at patch {hook + 1}"
    )
    with pytest.raises(RuntimeError, match=f"^{re.escape(message)}$"):
        check_requirements("swapped", recipe_of(ids))


def test_a_required_patch_left_out_is_refused() -> None:
    ids = [i for i in default_ids() if i != "speculative_dynspec_v2"]
    with pytest.raises(RuntimeError, match="requires speculative_dynspec_v2 before it, which is not in the recipe$"):
        check_requirements("short", recipe_of(ids))


def test_a_requirement_binds_only_where_both_patches_apply() -> None:
    """The piecewise patch (0.5.11-0.5.13) reads the flags: the legacy flag patch must come first,
    the Spec-field one (0.5.20+) may stand anywhere. (Without the start-up check, which reads the
    flags on every release and so needs each flag patch first.)"""
    ids = [i for i in default_ids() if i != "server_args_dynspec_check"]
    check_requirements("spec-last", recipe_of(moved_last(ids, "spec_fields_dynspec_flags")))
    with pytest.raises(
        RuntimeError, match="piecewise_graph_dynspec_prefill .* requires server_args_dynspec_flags_legacy"
    ):
        check_requirements("legacy-last", recipe_of(moved_last(ids, "server_args_dynspec_flags_legacy")))
    with pytest.raises(RuntimeError, match="server_args_dynspec_check .* requires spec_fields_dynspec_flags"):
        check_requirements("check-first", recipe_of(moved_last(default_ids(), "spec_fields_dynspec_flags")))


def test_patches_of_a_test_recipe() -> None:
    check_requirements("in order", (Module, Hook, LastOldHook))
    check_requirements("never together", (OldHook, Module))
    with pytest.raises(
        RuntimeError, match=r"^recipe 'reversed': Hook \(patch 1\) requires Module before it, which stands at patch 2$"
    ):
        check_requirements("reversed", (Hook, Module))
    with pytest.raises(
        RuntimeError, match=r"LastOldHook \(patch 1\) requires Module before it, which stands at patch 2$"
    ):
        check_requirements("on 1.0", (LastOldHook, Module))
    with pytest.raises(RuntimeError, match=r"^recipe 'stray': StrayHook requires NoSuchPatch, which is no patch$"):
        check_requirements("stray", (StrayHook,))


def test_loading_a_recipe_checks_its_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "swapped.toml").write_text(
        'sglang = ">=0.5.4"\npatches = ["eagle_worker_v2_dynspec_fallback", "speculative_dynspec_v2"]\n'
    )
    monkeypatch.setattr(registry, "resources", SimpleNamespace(files=lambda package: tmp_path))
    with pytest.raises(
        RuntimeError, match="eagle_worker_v2_dynspec_fallback \\(patch 1\\) requires speculative_dynspec_v2"
    ):
        load_recipe("swapped")
