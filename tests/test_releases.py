"""The static round trip on every real SGLang release: apply, compile, re-apply, status, revert."""

from __future__ import annotations

import shutil
from pathlib import Path

import git
import pytest

from patcher.engine import Status
from patcher.session import Session
from patches._flags import FLAGS
from tests.conftest import RELEASES, snapshot

pytestmark = pytest.mark.releases


@pytest.mark.parametrize("version", RELEASES)
def test_round_trip_on_installed_package(version: str, release_tree) -> None:
    package = release_tree(version)
    before = snapshot(package)

    session = Session.open(str(package))
    assert session.version == version
    plan = session.apply()
    touched = [f.target for f in plan.pending]
    assert "srt/server_args.py" in touched, "every release gets at least the startup check"
    for target in touched:
        text = (package / target).read_text()
        compile(text, target, "exec")
        assert "# dynspec: " in text
    assert snapshot(package) != before
    patched = "".join((package / t).read_text() for t in touched)
    for flag in FLAGS:  # spelled the same on every release
        assert patched.count(f"    {flag.field}: ") == 1, flag.field

    again = Session.open(str(package)).apply()
    assert again.pending == [], "a second apply writes nothing"

    report = Session.open(str(package)).status()
    states = {s.patch.id: s.status for s in report}
    assert set(states.values()) <= {Status.APPLIED, Status.NOT_APPLICABLE}
    assert Status.APPLIED in states.values()

    restored = Session.open(str(package)).revert()
    assert sorted(restored) == sorted(touched)
    assert snapshot(package) == before, "revert restores every byte and removes the state dir"


@pytest.mark.parametrize("version", RELEASES)
def test_git_checkout_is_clean_after_revert(version: str, release_tree, tmp_path: Path) -> None:
    checkout = tmp_path / "sglang-checkout"
    release_tree(version, where=checkout / "python")
    files = [str(p.relative_to(checkout)) for p in checkout.rglob("*") if p.is_file()]
    repo = git.Repo.init(checkout)
    repo.index.add(files)
    repo.index.commit(f"sglang {version}")
    repo.create_tag(f"v{version}")

    session = Session.open(str(checkout))
    assert session.notes == [], "git describe and the version files agree"
    plan = session.apply()
    assert plan.pending
    modified = {d.a_path for d in repo.index.diff(None)}
    created = set(repo.untracked_files)
    assert modified | created == {f"python/sglang/{f.target}" for f in plan.pending}
    assert created == {f"python/sglang/{f.target}" for f in plan.pending if f.disk is None}, (
        "the state dir ignores itself"
    )

    Session.open(str(checkout)).revert()
    assert not repo.is_dirty(untracked_files=True)
    shutil.rmtree(checkout)


def test_the_cache_is_dynspec_cache_else_under_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from patcher import releases

    monkeypatch.delenv("DYNSPEC_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert releases.cache_dir() == Path.home() / ".cache" / "dynspec"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert releases.cache_dir() == tmp_path / "xdg" / "dynspec"
    monkeypatch.setenv("DYNSPEC_CACHE", str(tmp_path / "mine"))
    assert releases.cache_dir() == tmp_path / "mine"


def test_an_unpacked_tree_grows_and_keeps_what_it_held(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Two callers asking for different members: the second extraction keeps the first's files,
    and asking again for either extracts nothing (the tree, marker included, is left as it is)."""
    from patcher import releases

    wheel = releases.wheel("0.5.12")  # the shared cache's; the trees here are this test's own
    monkeypatch.setenv("DYNSPEC_CACHE", str(tmp_path))
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / wheel.name).symlink_to(wheel)
    first, second = "srt/server_args.py", "srt/speculative/eagle_worker.py"
    root = releases.unpacked("0.5.12", [first])
    assert (root / "sglang" / first).exists() and not (root / "sglang" / second).exists()
    root = releases.unpacked("0.5.12", [second])
    assert (root / "sglang" / first).exists() and (root / "sglang" / second).exists()
    marker = root / ".members"
    before = (marker.stat().st_mtime_ns, (root / "sglang" / second).stat().st_ino)
    for members in ([first], [second], [first, second]):
        assert releases.unpacked("0.5.12", members) == root
    assert (marker.stat().st_mtime_ns, (root / "sglang" / second).stat().st_ino) == before
