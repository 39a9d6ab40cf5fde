"""The server side of `dynspec remote` and `dynspec bundle`: standard library only, Python >= 3.9.

This module travels to servers that have nothing but python3, together with ``patcher/txn.py`` and
``patcher/treefacts.py`` (shipped as the top-level modules ``dynspec_txn`` and ``dynspec_treefacts``;
see ``client.SHIPPED``). It never imports or runs code from the SGLang tree. It has two entry points:

``serve()``        `dynspec remote`: talks JSON lines with the local dynspec over the ssh pipe.
                   It finds the tree, sends the files the plan needs, and for apply/revert holds the
                   tree's lock from that read until the write, then checks every pre-image sha256
                   and writes through ``Tree.commit`` (all or nothing, journal, recovery).
``bundle_main()``  `python3 dynspec-plan.pyz apply|status|revert|diff --sglang PATH`: the plan
                   (pristine sha256 and patched bytes of every target) is inside the archive.

Messages to the local side are lines starting with ``MARK``, so whatever a login script prints
on stdout is ignored. While ``Tree.commit`` runs, SIGHUP, SIGINT, SIGTERM and SIGPIPE are held
back: a dropped connection or a Ctrl-C cannot stop the write between two renames. Only SIGKILL
or a crash can, and then the journal makes the next run roll the partial write back.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

if __package__ == "patcher.remote":
    from patcher import treefacts, txn
else:  # on a server: shipped next to this module
    import dynspec_treefacts as treefacts  # type: ignore[import-not-found, no-redef]  # exists only there
    import dynspec_txn as txn  # type: ignore[import-not-found, no-redef]  # exists only there

MARK = b"DYNSPEC1 "
PROTOCOL = 1

# Exit codes, the same numbers as patcher/errors.py's ExitCode (the bundle has no patcher).
EXIT_OK, EXIT_CHANGES, EXIT_USAGE, EXIT_REFUSED, EXIT_PYTHON, EXIT_DAMAGED, EXIT_INTERRUPTED = 0, 1, 2, 4, 8, 10, 130
INTERRUPTED_NOTE = "an interrupted dynspec write is pending; the next apply or revert finishes it"


class Failure(Exception):
    """Something to report to the user in one line; ``kind`` picks the exit code locally."""

    def __init__(self, kind: str, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.kind = kind
        self.detail = detail

    def as_message(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": str(self), **self.detail}

    @property
    def exit_code(self) -> int:
        if self.kind == "damaged":
            return EXIT_DAMAGED
        return EXIT_USAGE if self.kind in ("usage", "not_a_tree") else EXIT_REFUSED


# -- finding the tree (patcher/treefacts.py's rules, as for a local tree) --------------------------


def locate(spec: str) -> tuple[str, str]:
    """``--sglang`` → (root as given, resolved; the sglang package dir)."""
    try:
        found = treefacts.locate(spec)
    except treefacts.NotATree as error:
        # Word for word what patcher.errors.NotAnSGLangTree says for a local tree.
        raise Failure("not_a_tree", str(error), path=error.path, why=error.why) from None
    except treefacts.NothingImportable as error:
        raise Failure("usage", str(error)) from None
    return found.root, found.package_dir


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def snapshot(root: str, package_dir: str, targets: list[str], tree: Any) -> dict[str, Any]:
    """Everything the local engine reads, as it is on this server now."""
    state = tree.load_state()
    recorded = (state or {}).get("files", {})
    wanted = list(dict.fromkeys([*targets, *recorded]))
    blobs: dict[str, str] = {}
    for entry in recorded.values():
        digest = entry["pre"]
        if digest and digest not in blobs:
            with contextlib.suppress(txn.DamagedState):  # the local engine names the missing one
                blobs[digest] = _b64(tree.blob(digest)) or ""
    return {
        "root": root,
        "package_dir": package_dir,
        "state_dir": tree.state_dir,
        "versions": treefacts.read_versions(package_dir),
        "git": treefacts.git_facts(package_dir),
        "files": {rel: _b64(tree.read(rel)) for rel in wanted},
        "state": state,
        "blobs": blobs,
        "journal": tree.has_journal(),
        "python": sys.version.split()[0],
        "pid": os.getpid(),
    }


# -- the write ---------------------------------------------------------------------------------


def check_pre_images(tree: Any, expect: dict[str, str | None], why: str) -> None:
    """Refuse, naming the file and the sha256 it should have, unless every file is as expected."""
    for rel, digest in expect.items():
        found = txn.sha256(tree.read(rel))
        if found != digest:
            raise Failure(
                "mismatch",
                f"{rel} is not the file {why}: expected sha256 {digest or '(no file)'}, found {found or '(no file)'}; nothing written",
                file=rel,
                expected=digest,
                found=found,
            )


def commit(
    tree: Any, writes: dict[str, bytes | None], state: dict[str, Any] | None, pause: dict[str, Any] | None = None
) -> None:
    """``Tree.commit`` (which holds hang-ups and Ctrl-C back); an OSError (full disk, ...) is a clean refusal."""
    if pause:
        _pause_after_puts(tree, pause)
    try:
        tree.commit(writes, state)
    except OSError as error:
        raise Failure("refused", f"writing failed ({error.strerror or error}); every file was left as it was") from None


def _pause_after_puts(tree: Any, pause: dict[str, Any]) -> None:
    """Test hook, reachable only from patcher.remote's Python API: stop after the Nth file replace.

    Writes ``<file>.paused`` (holding the pid) and waits for ``<file>.go``, so a test can cut the
    connection or SIGKILL this process between two renames, deterministically.
    """
    real_put, count = tree._put, [0]

    def put(rel: str, data: bytes | None) -> None:
        real_put(rel, data)
        count[0] += 1
        if count[0] == pause["after"]:
            with open(pause["file"] + ".paused-", "w") as f:
                f.write(str(os.getpid()))
            os.replace(pause["file"] + ".paused-", pause["file"] + ".paused")  # a reader never sees it empty
            while not os.path.exists(pause["file"] + ".go"):
                time.sleep(0.01)

    tree._put = put


# -- dynspec remote: the ssh side ---------------------------------------------------------------


class Pipe:
    def __init__(self, reader: IO[bytes], writer: IO[bytes]) -> None:
        self.reader, self.writer = reader, writer

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.writer.write(MARK + json.dumps(message, separators=(",", ":")).encode() + b"\n")
            self.writer.flush()
        except (BrokenPipeError, OSError):
            pass  # the local side is gone; what was to be written has been written

    def receive(self) -> dict[str, Any] | None:
        """The next message, or None when the connection closed (possibly mid-message)."""
        line = self.reader.readline()
        if not line.endswith(b"\n"):
            return None
        try:
            message = json.loads(line)
        except ValueError:
            return None
        return message if isinstance(message, dict) else None


def serve(reader: IO[bytes] | None = None, writer: IO[bytes] | None = None) -> int:
    pipe = Pipe(reader or sys.stdin.buffer, writer or sys.stdout.buffer)
    request = pipe.receive()
    if request is None:
        return 0
    if request.get("protocol") != PROTOCOL:
        pipe.send({"error": {"kind": "internal", "message": f"protocol {request.get('protocol')} != {PROTOCOL}"}})
        return 0
    state_dir = txn.STATE_DIR
    try:
        root, package_dir = locate(request["sglang"])
        tree = txn.Tree(package_dir)
        state_dir = tree.state_dir
        if not request.get("write"):
            pipe.send({"snapshot": snapshot(root, package_dir, request["targets"], tree)})
            return 0
        with tree.locked():
            recovered = tree.recover(request["targets"])
            pipe.send({"snapshot": snapshot(root, package_dir, request["targets"], tree), "recovered": recovered})
            plan = pipe.receive()
            if plan is None or plan.get("writes") is None:
                return 0  # nothing to write, or the connection broke before the plan arrived
            writes = {rel: _unb64(data) for rel, data in plan["writes"].items()}
            check_pre_images(tree, plan["expect"], "dynspec planned for")
            commit(tree, writes, plan["state"], request.get("pause"))
            pipe.send({"done": sorted(writes)})
    except Failure as failure:
        pipe.send({"error": failure.as_message()})
    except txn.DamagedState as error:
        pipe.send({"error": {"kind": "damaged", "message": str(error), "state_dir": state_dir}})
    except txn.TxnError as error:
        pipe.send({"error": {"kind": "refused", "message": str(error)}})
    except OSError as error:  # e.g. a file the ssh user may not read
        pipe.send({"error": {"kind": "refused", "message": _os_error(error)}})
    except KeyboardInterrupt as interrupt:
        done = isinstance(interrupt, txn.Interrupted) and interrupt.completed
        pipe.send({"error": {"kind": "interrupted", "message": _interrupted(done)}})
    return 0


def _interrupted(completed: bool) -> str:
    if completed:
        return "interrupted after the write had finished: every file is new"
    return "interrupted: nothing was written"


def _os_error(error: OSError) -> str:
    where = f"{error.filename}: " if error.filename else ""
    return f"{where}{error.strerror or error}"


# -- dynspec bundle: the plan in a zipapp --------------------------------------------------------


def _say(message: str) -> None:
    sys.stderr.write(message + "\n")


def _table(columns: list[str], rows: list[list[str]]) -> None:
    """patcher/render.py's table when stdout is not a terminal, column for column."""
    widths = [max(len(str(c)) for c in col) for col in zip(columns, *rows)]
    for line in [columns, *rows]:
        sys.stdout.write("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() + "\n")


class Bundle:
    """A plan made by `dynspec bundle` for the pristine files of one SGLang release."""

    def __init__(self, plan: dict[str, Any], sglang: str) -> None:
        self.plan = plan
        self.version: str = plan["sglang_version"]
        self.root, self.package_dir = locate(sglang)
        self.tree = txn.Tree(self.package_dir)

    def display(self, target: str) -> str:
        full = os.path.join(self.package_dir, target)
        return os.path.relpath(full, self.root).replace(os.sep, "/")

    @property
    def why(self) -> str:
        return f"this plan was made for (pristine SGLang {self.version})"

    def _writes(
        self, state: dict[str, Any] | None, force: bool
    ) -> tuple[dict[str, bytes | None], dict[str, str | None]]:
        recorded = (state or {}).get("files", {})
        writes: dict[str, bytes | None] = {}
        expect: dict[str, str | None] = {}
        for rel, planned in self.plan["files"].items():
            found = txn.sha256(self.tree.read(rel))
            if rel in recorded:
                back_to_original = found == recorded[rel]["pre"]  # e.g. a revert killed before it forgot the state
                if found != recorded[rel]["post"] and not back_to_original and not force:
                    raise Failure(
                        "refused",
                        f"{rel} changed after dynspec patched it; apply --force rebuilds it from the original "
                        "(your edits are lost), or undo the edits",
                    )
                base = recorded[rel]["pre"]
            else:
                base = found
            if base != planned["pre"]:
                what = " (its original, as recorded in the state dir)" if rel in recorded else ""
                raise Failure(
                    "mismatch",
                    f"{rel}{what} is not the file {self.why}: expected sha256 {planned['pre'] or '(no file)'}, "
                    f"found {base or '(no file)'}; nothing written (make a bundle for the server's release)",
                    file=rel,
                    expected=planned["pre"],
                    found=base,
                )
            if found != planned["post"]:
                writes[rel] = _unb64(planned["new"])
                expect[rel] = found
        return writes, expect

    def _new_state(self, state: dict[str, Any] | None) -> dict[str, Any]:
        new = dict(self.plan["state"])
        new["files"] = {**(state or {}).get("files", {}), **self.plan["state"]["files"]}
        return new

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any] | None]:
        """The tree locked, a write cut short recovered (and said so), and the state dir's state."""
        with self.tree.locked():
            recovered = self.tree.recover(self.plan["files"])
            if recovered:
                _say(f"note: {recovered}")
            yield self.tree.load_state()

    def apply(self, force: bool) -> int:
        with self._locked() as state:
            writes, expect = self._writes(state, force)
            if not writes:
                _say(f"already applied: nothing to do for SGLang {self.version}")
                return EXIT_OK
            commit(self.tree, writes, self._new_state(state))
        for rel in writes:
            _say(f"patched {self.display(rel)}")
        _say(f"{len(writes)} file(s) patched for SGLang {self.version}; state in {self.tree.state_dir}")
        return EXIT_OK

    def revert(self, force: bool) -> int:
        with self._locked() as state:
            if state is None:
                _say("nothing to revert: dynspec has not patched this tree")
                return EXIT_OK
            writes: dict[str, bytes | None] = {}
            for rel, entry in state.get("files", {}).items():
                found = txn.sha256(self.tree.read(rel))
                if found == entry["pre"]:
                    continue  # already the original
                if found != entry["post"] and not force:
                    raise Failure(
                        "refused",
                        f"{rel} changed after dynspec patched it; revert --force restores the original and discards those edits",
                    )
                writes[rel] = None if entry["pre"] is None else self.tree.blob(entry["pre"])
            commit(self.tree, writes, None)
        for rel in sorted(writes):
            _say(f"restored {self.display(rel)}")
        _say(f"{len(writes)} file(s) restored")
        return EXIT_OK

    def status_rows(self) -> list[dict[str, Any]]:
        """Per patch, what `dynspec status` says: the plan holds its answers for the pristine and
        the patched tree; anything else is a target that is neither."""
        state = self.tree.load_state()
        recorded_files = (state or {}).get("files", {})
        recorded_patches = (state or {}).get("patches", {})
        rows = []
        for row in self.plan["status"]:
            target = row["target"]
            planned = self.plan["files"].get(target)
            if planned is None:  # the plan changes nothing in this file: its pristine answer holds
                rows.append(dict(row["pristine"], **{"id": row["id"], "revision": row["revision"], "target": target}))
                continue
            found = txn.sha256(self.tree.read(target))
            if row["id"] in recorded_patches:
                if target in recorded_files and found != recorded_files[target]["post"]:
                    answer = {"state": "drifted", "detail": f"{target} changed after apply"}
                elif recorded_patches[row["id"]] < row["revision"]:
                    answer = {
                        "state": "outdated",
                        "detail": f"r{recorded_patches[row['id']]} on disk, r{row['revision']} available",
                    }
                else:
                    answer = {"state": "applied", "detail": f"r{recorded_patches[row['id']]}"}
            elif found == planned["pre"] and target not in recorded_files:
                answer = row["pristine"]
            elif found == planned["post"]:
                answer = (
                    row["patched"]
                    if target in recorded_files
                    else {
                        "state": "applied, not recorded",
                        "detail": "its code is in the file but the state dir has no record",
                    }
                )
            else:
                answer = {
                    "state": "drifted",
                    "detail": f"{target} is not the file of SGLang {self.version} (sha256 {found})",
                }
            if row.get("note") and answer is not row["pristine"] and answer is not row["patched"]:
                # as dynspec status says it: what SGLang offers next to the patch
                answer = dict(answer, detail=f"{answer['detail']}; {row['note']}")
            rows.append({"id": row["id"], "revision": row["revision"], "target": target, **answer})
        return rows

    def status(self, as_json: bool, check: bool) -> int:
        if self.tree.has_journal():
            _say(f"note: {INTERRUPTED_NOTE}")
        rows = self.status_rows()
        if as_json:
            report = {
                "sglang_version": self.version,
                "package_dir": self.package_dir,
                "patches": [
                    {
                        "id": r["id"],
                        "revision": r["revision"],
                        "target": self.display(r["target"]),
                        "state": r["state"],
                        "detail": r["detail"],
                    }
                    for r in rows
                ],
            }
            sys.stdout.write(json.dumps(report, indent=2) + "\n")
        else:
            _table(
                ["patch", "rev", "state", "detail"],
                [[r["id"], f"r{r['revision']}", r["state"], r["detail"]] for r in rows],
            )
        done = ("applied", "n/a", "provided upstream")
        return EXIT_CHANGES if check and any(r["state"] not in done for r in rows) else EXIT_OK

    def diff(self, check: bool) -> int:
        state = self.tree.load_state()
        writes, _ = self._writes(state, force=False)
        prefix = os.path.relpath(self.package_dir, self.root).replace(os.sep, "/")
        for rel in writes:
            text = self.plan["files"][rel]["diff"]
            if prefix != ".":
                head, sep, body = text.partition("\n@@")
                for side in ("a/", "b/"):
                    head = head.replace(f"{side}{rel}", f"{side}{prefix}/{rel}")
                text = head + sep + body
            sys.stdout.write(text)
        return EXIT_CHANGES if check and writes else EXIT_OK


def _read_plan() -> dict[str, Any]:
    import pkgutil

    data = pkgutil.get_data(__name__, "plan.json")
    if data is None:  # pragma: no cover - the archive always holds it
        raise Failure("usage", "this archive holds no plan.json")
    plan = json.loads(data)
    if not isinstance(plan, dict):  # pragma: no cover - the archive is made by dynspec bundle
        raise Failure("usage", "this archive's plan.json is not a JSON object")
    return plan


def bundle_main(argv: list[str] | None = None, plan: dict[str, Any] | None = None) -> int:
    plan = plan if plan is not None else _read_plan()
    parser = argparse.ArgumentParser(
        prog="python3 dynspec-plan.pyz",
        description=(
            f"dynspec {plan['dynspec']} plan for SGLang {plan['sglang_version']} (recipe {plan['recipe']}): "
            f"{', '.join(plan['files']) or 'no files'}. Needs only python3 >= 3.9."
        ),
        epilog="exit codes: 0 done, 1 --check found work, 2 usage or not an SGLang tree, "
        "4 refused (not the files this plan is for, hand edits, locked, read-only, a link out of the tree), "
        "8 python < 3.9, 10 the state dir is damaged, 130 interrupted; "
        "nothing is written unless the exit code is 0 (or 130 after a finished write)",
    )
    parser.add_argument("command", choices=["apply", "status", "revert", "diff"])
    parser.add_argument(
        "--sglang",
        default="auto",
        metavar="PATH|auto",
        help="checkout root, its python/ dir, the sglang package dir, or auto",
    )
    parser.add_argument("--force", action="store_true", help="apply/revert over hand edits (they are lost)")
    parser.add_argument("--json", action="store_true", help="status: machine-readable")
    parser.add_argument("--check", action="store_true", help="status/diff: exit 1 unless nothing is left to do")
    args = parser.parse_args(argv)
    bundle = None
    try:
        bundle = Bundle(plan, args.sglang)
        if args.command == "apply":
            return bundle.apply(args.force)
        if args.command == "revert":
            return bundle.revert(args.force)
        if args.command == "status":
            return bundle.status(args.json, args.check)
        return bundle.diff(args.check)
    except Failure as failure:
        _say(f"dynspec: error: {failure}")
        return failure.exit_code
    except txn.DamagedState as error:
        state_dir = bundle.tree.state_dir if bundle else txn.STATE_DIR
        _say(f"dynspec: error: {error}; {txn.damaged_way_out(state_dir, plan['sglang_version'])}")
        return EXIT_DAMAGED
    except txn.TxnError as error:
        _say(f"dynspec: error: {error}")
        return EXIT_REFUSED
    except OSError as error:
        _say(f"dynspec: error: {_os_error(error)}")
        return EXIT_REFUSED
    except KeyboardInterrupt as interrupt:
        _say(f"dynspec: error: {_interrupted(isinstance(interrupt, txn.Interrupted) and interrupt.completed)}")
        return EXIT_INTERRUPTED
