"""A kill before every file-system call of apply and revert, and a second kill during the recovery
that follows, or a Ctrl-C there; a Ctrl-C before every such call. The tree always ends all old or all new (nothing of
dynspec's left when it is all old), nothing outside it changes, and the command can be run again.

The calls are counted on a real run first (an audit hook logs each change inside the tree), so the
suite follows the code: a new write in txn.py is a new place to be killed at.
"""

from __future__ import annotations

import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from patcher import engine, txn
from patcher.registry import load_recipe
from tests.faults.harness import FULL, cli, count_changes, difference, forked, picture, sample, stop_at

RELEASES = ["0.5.12", "0.5.17", "0.5.23"] if FULL else ["0.5.12"]  # 0.5.12: three patched files, two new ones
TARGETS = list(engine.targets_in_order(load_recipe("default").patches))


@dataclass
class Scene:
    package: Path
    outside: Path
    start: Path  # a copy of the tree as it is before the command
    before: dict[str, str]
    after: dict[str, str]
    command: str

    def reset(self, source: Path | None = None) -> None:
        shutil.rmtree(self.package)
        shutil.copytree(source or self.start, self.package, symlinks=True)

    def work(self) -> Callable[[], Any]:
        return cli(self.command, "--sglang", str(self.package))

    def recover(self) -> Callable[[], Any]:
        return lambda: txn.Tree(str(self.package)).recover(TARGETS)

    def check(self, what: str) -> None:
        now = picture(self.package)
        assert now in (self.before, self.after), f"{what}: neither all old nor all new: {difference(self.before, now)}"
        assert picture(self.outside) == self.outside_picture, f"{what}: a file outside the tree changed"

    @property
    def outside_picture(self) -> dict[str, str]:
        return {"victim.py": self._victim, ".": self._outside_dir}

    def remember_outside(self) -> None:
        found = picture(self.outside)
        self._victim, self._outside_dir = found["victim.py"], found["."]


@pytest.fixture(params=[(v, c) for v in RELEASES for c in ("apply", "revert")], ids=lambda p: f"{p[1]}-{p[0]}")
def scene(request: pytest.FixtureRequest, release_tree, tmp_path: Path) -> Scene:
    version, command = request.param
    package = release_tree(version, where=tmp_path / "site")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.py").write_text("untouched = True\n")
    pristine = picture(package)
    shutil.copytree(package, tmp_path / "pristine", symlinks=True)
    assert forked(cli("apply", "--sglang", str(package))).code == 0
    applied = picture(package)
    shutil.copytree(package, tmp_path / "applied", symlinks=True)
    if command == "apply":
        found = Scene(package, outside, tmp_path / "pristine", pristine, applied, command)
    else:
        found = Scene(package, outside, tmp_path / "applied", applied, pristine, command)
    found.remember_outside()
    found.reset()
    return found


def test_a_kill_before_any_change_is_recovered_to_all_old_or_all_new(scene: Scene, tmp_path: Path) -> None:
    changes = count_changes(scene.work(), scene.package)
    assert len(changes) >= 10, changes  # mkdir, temp files, renames, unlinks: the suite must see them
    killed_copy = tmp_path / "killed"
    second_kills = 0
    for k, change in enumerate(changes):
        scene.reset()
        run = forked(scene.work(), hook=stop_at(k, scene.package))
        assert run.code == -signal.SIGKILL, f"kill before {change}: {run.err}"
        shutil.rmtree(killed_copy, ignore_errors=True)
        shutil.copytree(scene.package, killed_copy, symlinks=True)

        recovery = count_changes(scene.recover(), scene.package)
        scene.check(f"killed before change {k} ({change}), then recovered")
        for j in sample(list(range(len(recovery))), 2, seed=f"{scene.command}-{k}"):
            scene.reset(killed_copy)
            again = forked(scene.recover(), hook=stop_at(j, scene.package))
            assert again.code == -signal.SIGKILL, again.err
            assert forked(scene.recover()).code == 0
            scene.check(f"killed before change {k} ({change}), killed again in recovery before {recovery[j]}")
            second_kills += 1

            scene.reset(killed_copy)  # the command run again, with a Ctrl-C in its recovery
            interrupted = forked(scene.work(), hook=stop_at(j, scene.package, signal.SIGINT))
            assert interrupted.code == 130, interrupted.err
            assert interrupted.lines == [
                "dynspec: error: interrupted after finishing an earlier write; nothing else was written"
            ], interrupted.err
            scene.check(f"killed before change {k} ({change}), Ctrl-C in recovery before {recovery[j]}")

        redo = forked(scene.work())
        assert redo.code == 0, f"after a kill before {change}: {redo.err}"
        assert picture(scene.package) == scene.after, f"{scene.command} again after a kill before {change}"
    assert second_kills > 0, "no recovery had anything to do: the kills never landed mid-write"
    print(f"\n{scene.command}: {len(changes)} first kills, {second_kills} second kills and Ctrl-Cs in recovery")


def test_ctrl_c_before_any_change_exits_130_all_old_or_all_new(scene: Scene) -> None:
    changes = count_changes(scene.work(), scene.package)
    done_word = "patched" if scene.command == "apply" else "restored"
    for k, change in enumerate(changes):
        scene.reset()
        run = forked(scene.work(), hook=stop_at(k, scene.package, signal.SIGINT))
        assert run.code == 130, f"Ctrl-C before {change}: exit {run.code}: {run.err}"
        assert len(run.lines) == 1 and run.lines[0].startswith("dynspec: error: interrupted"), run.err
        now = picture(scene.package)
        if now == scene.after:
            assert f"every file is {done_word}" in run.err, run.err
        else:
            assert now == scene.before, f"Ctrl-C before {change} left: {difference(scene.before, now)}"
            assert "nothing was written" in run.err, run.err
        scene.check(f"Ctrl-C before {change}")
