"""All-or-nothing writes: an error or a killed process never leaves a half-patched tree."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest

from patcher import txn
from tests.conftest import ROOT, snapshot


@pytest.fixture
def tree(tmp_path: Path) -> txn.Tree:
    (tmp_path / "srt").mkdir()
    (tmp_path / "srt" / "a.py").write_text("a = 1\n")
    (tmp_path / "srt" / "b.py").write_text("b = 1\n")
    return txn.Tree(str(tmp_path))


def recorded(*files: tuple[str, bytes | None, bytes | None]) -> dict:
    """A state as the engine records it: per file the pre and post sha256."""
    return {
        "patches": {"x": 1},
        "files": {rel: {"pre": txn.sha256(pre), "post": txn.sha256(post)} for rel, pre, post in files},
    }


def test_commit_writes_files_state_and_pre_images(tree: txn.Tree) -> None:
    state = recorded(("srt/a.py", b"a = 1\n", b"a = 2\n"), ("srt/new.py", None, b"n = 1\n"))
    tree.commit({"srt/a.py": b"a = 2\n", "srt/new.py": b"n = 1\n"}, state)
    root = Path(tree.root)
    assert (root / "srt/a.py").read_bytes() == b"a = 2\n"
    assert (root / "srt/new.py").read_bytes() == b"n = 1\n"
    state = tree.load_state()
    assert state is not None and state["patches"] == {"x": 1} and state["format"] == txn.STATE_FORMAT
    assert tree.blob(txn.sha256(b"a = 1\n") or "") == b"a = 1\n"
    assert (root / ".dynspec/.gitignore").read_text() == "*\n"
    assert not (root / ".dynspec/journal.json").exists()


def test_error_on_second_file_rolls_back_the_first(tree: txn.Tree, monkeypatch: pytest.MonkeyPatch) -> None:
    before = snapshot(Path(tree.root))
    real_put = txn.Tree._put

    def failing_put(self: txn.Tree, rel: str, data: bytes | None) -> None:
        if rel == "srt/b.py" and data == b"b = 2\n":
            raise OSError(errno.ENOSPC, "No space left on device")
        real_put(self, rel, data)

    monkeypatch.setattr(txn.Tree, "_put", failing_put)
    with pytest.raises(OSError, match="No space left"):
        tree.commit({"srt/a.py": b"a = 2\n", "srt/b.py": b"b = 2\n"}, recorded())
    assert snapshot(Path(tree.root)) == before, "a.py restored, no state dir left behind"


def test_paths_outside_the_tree_are_refused(tree: txn.Tree, tmp_path: Path) -> None:
    for bad in ("../escape.py", "/etc/passwd", "srt/../../escape.py"):
        with pytest.raises(txn.TxnError, match="refusing path"):
            tree.commit({bad: b"x"}, None)
    (tmp_path / "srt" / "link").symlink_to(tmp_path.parent)
    with pytest.raises(txn.TxnError, match=r"srt/link is a link to .*, outside the SGLang tree"):
        tree.path("srt/link/escape.py")


def test_lock_refuses_a_second_holder(tree: txn.Tree) -> None:
    with (
        tree.locked(),
        pytest.raises(txn.TxnError, match="another dynspec is working on"),
        txn.Tree(tree.root).locked(),
    ):
        pass
    with tree.locked():  # released after the first holder left
        pass


KILLER = """
import os, signal, sys
sys.path.insert(0, {root!r})
from patcher import txn
tree = txn.Tree({tree!r})
real_put = txn.Tree._put
def put_then_die(self, rel, data):
    real_put(self, rel, data)
    if rel == "srt/a.py":
        os.kill(os.getpid(), signal.SIGKILL)   # killed between the two renames
txn.Tree._put = put_then_die
tree.commit({{"srt/a.py": b"a = 2\\n", "srt/b.py": b"b = 2\\n"}}, {{"patches": {{}}, "files": {{}}}})
"""


def test_killed_mid_write_is_rolled_back_by_the_next_run(tree: txn.Tree) -> None:
    before = snapshot(Path(tree.root))
    child = subprocess.run([sys.executable, "-c", KILLER.format(root=str(ROOT), tree=tree.root)])
    assert child.returncode == -9
    root = Path(tree.root)
    assert (root / "srt/a.py").read_bytes() == b"a = 2\n", "the kill landed between the renames"
    assert (root / ".dynspec/journal.json").exists()

    message = tree.recover()
    assert message is not None and "rolled back" in message
    after = snapshot(root)
    assert {k: v for k, v in after.items() if not k.startswith(".dynspec")} == {
        k: v for k, v in before.items() if not k.startswith(".dynspec")
    }
    assert not (root / ".dynspec").exists()


def test_interrupted_after_state_was_written_counts_as_done(tree: txn.Tree) -> None:
    tree.commit({"srt/a.py": b"a = 2\n"}, recorded(("srt/a.py", b"a = 1\n", b"a = 2\n")))
    state = tree.load_state()
    assert state is not None
    journal = {
        "txid": state["txid"],
        "files": {"srt/a.py": {"pre": txn.sha256(b"a = 1\n"), "post": txn.sha256(b"a = 2\n")}},
    }
    Path(tree.state_dir, "journal.json").write_text(__import__("json").dumps(journal))
    assert "complete" in (tree.recover() or "")
    assert Path(tree.root, "srt/a.py").read_bytes() == b"a = 2\n"


def test_txn_module_needs_only_the_standard_library() -> None:
    # The remote applier ships this file alone to servers that have only python3.
    source = (ROOT / "patcher" / "txn.py").read_text()
    imports = [line.split()[1] for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert set(imports) <= set(sys.stdlib_module_names) | {"__future__"}, imports
