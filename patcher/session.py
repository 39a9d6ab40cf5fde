"""One command's view of one SGLang tree: where it is, its version, its recipe, its lock."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patcher import engine, txn
from patcher.errors import Refused
from patcher.patch import _contains
from patcher.registry import Recipe, load_recipe
from patcher.tree import SGLangTree, disagreement, locate


@dataclass
class Session:
    tree: SGLangTree
    files: txn.Tree
    recipe: Recipe
    version: str
    diff_root: Path
    notes: list[str] = field(default_factory=list)

    @classmethod
    def open(
        cls, sglang: str, recipe: str | Recipe = "default", force: bool = False, sglang_version: str | None = None
    ) -> Session:
        tree = locate(sglang)
        notes: list[str] = []
        sources = dict(tree.sources)
        in_git = _in_git_work_tree(tree.package_dir)
        if in_git:
            from patcher import checkout  # GitPython costs 0.1 s to import; most trees are not checkouts
        described = checkout.describe(tree.package_dir) if in_git else None
        if described:
            sources["git describe"] = checkout.version_from_describe(described)
        clash = disagreement(sources)
        if clash:
            notes.append(clash)
        version = sglang_version or tree.version or sources.get("git describe")
        if version is None:
            raise Refused(f"cannot tell the SGLang version of {tree.package_dir}; pass --sglang-version")
        loaded = load_recipe(recipe) if isinstance(recipe, str) else recipe
        if not _contains(loaded.sglang, version):
            message = f"SGLang {version} is not a release recipe {loaded.name!r} supports ({loaded.sglang})"
            if not force:
                raise Refused(f"{message}; --force tries anyway")
            notes.append(f"{message}; going ahead because of --force")
        top = checkout.toplevel(tree.package_dir) if in_git else None
        diff_root = top if top is not None and _inside(tree.package_dir, top) else tree.root
        return cls(tree, txn.Tree(str(tree.package_dir)), loaded, version, diff_root, notes)

    def display_path(self, target: str) -> str:
        return engine.relative_to_root(self.tree.package_dir, self.diff_root, target)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Lock the tree and finish any interrupted write first. Txn errors become refusals."""
        try:
            with self.files.locked():
                recovered = self.files.recover()
                if recovered:
                    self.notes.append(recovered)
                yield
        except txn.TxnError as error:
            raise Refused(str(error)) from None

    def state(self) -> dict[str, Any] | None:
        try:
            return self.files.load_state()
        except txn.TxnError as error:
            raise Refused(str(error)) from None

    def plan(self, force: bool = False) -> engine.Plan:
        try:
            return engine.plan(self.files, self.recipe, self.version, self.state(), force)
        except txn.TxnError as error:  # a damaged state dir, e.g. a missing pre-image
            raise Refused(str(error)) from None

    def diff(self, plan: engine.Plan) -> str:
        return "".join(engine.unified_diff(self.display_path(f.target), f.disk, f.new) for f in plan.pending)

    def apply(self, force: bool = False) -> engine.Plan:
        with self.writing():
            state = self.state()
            plan = engine.plan(self.files, self.recipe, self.version, state, force)
            if plan.pending:
                self._commit(engine.writes_for(plan), engine.new_state(state, self.recipe, plan))
            return plan

    def revert(self, force: bool = False) -> list[str]:
        """Restore every touched file byte for byte; returns the targets written."""
        with self.writing():
            state = self.state()
            if state is None:
                return []
            writes = engine.revert_writes(self.files, state, force)
            self._commit(writes, None)
            return sorted(writes)

    def status(self) -> list[engine.PatchStatus]:
        if Path(self.files.state_dir, "journal.json").exists():
            self.notes.append("an interrupted dynspec write is pending; the next apply or revert finishes it")
        return engine.status(self.files, self.recipe, self.version, self.state())

    def _commit(self, writes: dict[str, bytes | None], state: dict[str, Any] | None) -> None:
        try:
            self.files.commit(writes, state)
        except txn.TxnError:
            raise
        except OSError as error:
            raise Refused(f"writing failed ({error.strerror or error}); every file was left as it was") from None


def _in_git_work_tree(path: Path) -> bool:
    """Cheap pre-check so that trees outside git never pay for importing GitPython."""
    return any((parent / ".git").exists() for parent in (path, *path.parents))


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root)
        return True
    except ValueError:
        return False


