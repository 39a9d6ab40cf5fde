"""One command's view of one SGLang tree: where it is, its version, its recipe, its lock."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patcher import engine, progress, txn
from patcher.errors import AnchorNotFound, DamagedState, Interrupted, Refused
from patcher.registry import Recipe, load_recipe
from patcher.tree import SGLangTree, choose_version, locate
from patcher.treefacts import git_facts, git_head_file
from patcher.txn import damaged_way_out


@dataclass
class Session:
    tree: SGLangTree
    files: txn.Tree
    recipe: Recipe
    version: str
    diff_root: Path
    notes: list[str] = field(default_factory=list)
    in_git: bool = False  # the package is tracked by a git checkout
    override: str | None = None  # the note when --sglang-version differs from the tree's own version

    @classmethod
    def open(
        cls, sglang: str, recipe: str | Recipe = "default", force: bool = False, sglang_version: str | None = None
    ) -> Session:
        tree = locate(sglang)
        git = git_facts(str(tree.package_dir))
        chosen = choose_version(tree.sources, sglang_version, git["describe"], str(tree.package_dir))
        version, notes = chosen.version, chosen.notes
        loaded = load_recipe(recipe) if isinstance(recipe, str) else recipe
        forced = loaded.refuse_unsupported(version, force)
        if forced:
            notes.append(forced)
        top = Path(git["toplevel"]) if git["toplevel"] else None
        diff_root = top if top is not None and _inside(tree.package_dir, top) else tree.root
        files = txn.Tree(str(tree.package_dir))
        return cls(tree, files, loaded, version, diff_root, notes, bool(git["tracked"]), chosen.override)

    def display_path(self, target: str) -> str:
        return engine.relative_to_root(self.tree.package_dir, self.diff_root, target)

    @contextlib.contextmanager
    def refusals(self) -> Iterator[None]:
        """What the tree and its state dir refuse, as the user's errors (exit 4, or 10 for the state dir)."""
        try:
            yield
        except txn.DamagedState as error:
            raise DamagedState(f"{error}; {self.way_out()}") from None
        except txn.TxnError as error:
            raise Refused(str(error)) from None
        except AnchorNotFound as error:
            raise error.with_note(self.override) if self.override else error from None

    def way_out(self) -> str:
        if self.in_git:
            return (
                f"nothing was written; `dynspec revert --from-git` restores the targets from git and removes "
                f"{self.files.state_dir}"
            )
        return damaged_way_out(self.files.state_dir, self.version)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Lock the tree and finish any interrupted write first."""
        with self.refusals(), self.files.locked():
            try:
                recovered = self.files.recover(self.targets())
            except txn.Interrupted as interrupt:
                if interrupt.completed:
                    raise Interrupted(
                        "interrupted after finishing an earlier write; nothing else was written"
                    ) from None
                raise Interrupted("interrupted: nothing was written") from None
            if recovered:
                self.notes.append(recovered)
            yield

    def targets(self) -> list[str]:
        return list(engine.targets_in_order(self.recipe.patches))

    def state(self) -> dict[str, Any] | None:
        with self.refusals():
            return self.files.load_state()

    def plan(self, force: bool = False) -> engine.Plan:
        with self.refusals(), self.step():
            return engine.plan(self.files, self.recipe, self.version, self.state(), force)

    def diff(self, plan: engine.Plan) -> str:
        return "".join(engine.unified_diff(self.display_path(f.target), f.disk, f.new) for f in plan.pending)

    def step(self) -> contextlib.AbstractContextManager[None]:
        """This command's work on the tree, as one step for the spinner; the engine's steps go inside."""
        return progress.step(f"SGLang {self.version}")

    def apply(self, force: bool = False) -> engine.Plan:
        with _interrupts("patched"), self.step(), self.writing():
            state = self.state()
            plan = engine.plan(self.files, self.recipe, self.version, state, force)
            if plan.pending:
                self._commit(engine.writes_for(plan), engine.new_state(state, self.recipe, plan))
            return plan

    def revert(self, force: bool = False) -> list[str]:
        """Restore every touched file byte for byte; returns the targets written."""
        with _interrupts("restored"), self.step(), self.writing():
            state = self.state()
            if state is None:
                return []
            writes = engine.revert_writes(self.files, state, force)
            self._commit(writes, None)
            return sorted(state.get("files", {}))

    def revert_from_git(self) -> list[str]:
        """Restore every target as the checkout's HEAD has it and drop the state dir, whatever it
        holds: the way out of a damaged state dir. Returns the targets written."""
        package_dir = str(self.tree.package_dir)
        if not self.in_git:
            raise Refused(f"--from-git: {package_dir} is not tracked by a git checkout")
        writes: dict[str, bytes | None] = {}
        with _interrupts("restored"), self.step(), self.refusals(), self.files.locked():
            for target in self.targets():
                head = git_head_file(package_dir, target)
                disk = self.files.read(target)
                if head is None:
                    if disk is not None and disk.startswith(b"# dynspec: "):
                        writes[target] = None  # a file dynspec added
                elif disk != head:
                    writes[target] = head
            try:
                self.files.remove_state_dir()
            except txn.Interrupted:
                raise Interrupted("interrupted after the state dir was removed, before any file was restored") from None
            if writes:
                self._commit(writes, None)
        return sorted(writes)

    def status(self) -> list[engine.PatchStatus]:
        with self.refusals(), self.step():
            if self.files.has_journal():
                self.notes.append("an interrupted dynspec write is pending; the next apply or revert finishes it")
            return engine.status(self.files, self.recipe, self.version, self.state())

    def _commit(self, writes: dict[str, bytes | None], state: dict[str, Any] | None) -> None:
        try:
            with progress.step(f"writing {len(writes)} file(s)"):
                self.files.commit(writes, state)
        except OSError as error:
            raise Refused(f"writing failed ({error.strerror or error}); every file was left as it was") from None


@contextlib.contextmanager
def _interrupts(done: str) -> Iterator[None]:
    """Ctrl-C as a one-line error that says whether the write had finished (txn held it back till then)."""
    try:
        yield
    except txn.Interrupted as interrupt:
        if interrupt.completed:
            raise Interrupted(f"interrupted after the write had finished: every file is {done}") from None
        raise Interrupted("interrupted: nothing was written") from None
    except KeyboardInterrupt:
        raise Interrupted("interrupted; the tree is all old or all new (`dynspec status` tells which)") from None


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root)
        return True
    except ValueError:
        return False
