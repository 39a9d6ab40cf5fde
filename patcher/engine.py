"""Plan, apply, revert and report dynspec's patches on one SGLang tree.

The engine knows no individual patch: it takes a recipe (an ordered tuple of ``Patch`` classes) and
guarantees, for every patch, before anything is written:

1. outside the patch's ``SGLANG`` range it is n/a; where ``APPLIED`` already matches, it is skipped;
2. every anchor is found, or ``AnchorNotFound`` names patch, anchor, file and version;
3. the transform runs once; ``APPLIED`` matches its output; the file compiles; an insert-only
   patch added lines and touched none; running the whole chain again changes nothing.

Patched text is always derived from the pristine pre-image (kept in the state dir), so applying a
newer revision upgrades in place and revert restores the exact bytes.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import enum
import functools
import hashlib
import io
import json
import os
import tokenize
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libcst as cst

from patcher import __version__, progress, releases, txn
from patcher.errors import AnchorNotFound, BadTarget, Refused
from patcher.patch import CstPatch, NewFilePatch, Patch
from patcher.registry import Recipe

# -- pure text transforms -----------------------------------------------------------------------

_PARSED: dict[str, cst.Module] = {}
_PARSED_KEPT = 8  # a tree of server_args.py is large; a matrix worker sees many releases


def parse(text: str, target: str) -> cst.Module:
    """Parse each distinct text once per run (libcst takes ~0.7 s for SGLang's server_args.py)."""
    key = hashlib.sha256(text.encode()).hexdigest()
    if key not in _PARSED:
        check_nesting(text, target)
        try:
            module = cst.parse_module(text)
        except cst.ParserSyntaxError as error:
            raise BadTarget(f"{target} has a syntax error at line {error.raw_line}: {error.message}") from None
        except RecursionError:
            raise too_deep(target) from None
        if len(_PARSED) >= _PARSED_KEPT:
            del _PARSED[next(iter(_PARSED))]
        _PARSED[key] = module
    return _PARSED[key]


def too_deep(target: str) -> BadTarget:
    return BadTarget(f"{target} nests expressions too deeply for dynspec's parser; nothing written")


# libcst's native parser overflows the C stack (a segfault, not an exception) on some text that
# CPython parses, e.g. 20000 terms joined by `or` or 6000 adjacent string literals: both are flat in
# CPython's AST and nested in libcst's tree. SGLang's files nest about 30 deep.
LIBCST_NESTING_LIMIT = 1000
_LONG_CONSTANT = 4096  # characters: only a constant this long can hold many adjacent literals


def check_nesting(text: str, target: str) -> None:
    """Refuse, before libcst sees it, text whose libcst tree would nest deeper than the limit."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes and the like: SGLang's, not ours to report
            tree = ast.parse(text, target)
    except SyntaxError as error:
        raise BadTarget(f"{target} has a syntax error at line {error.lineno}: {error.msg}") from None
    except ValueError as error:  # a NUL byte (Python < 3.12)
        raise BadTarget(f"{target} cannot be parsed: {error}") from None
    except (RecursionError, MemoryError):
        raise too_deep(target) from None
    lines: list[str] | None = None
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        depth += 1
        if isinstance(node, ast.BoolOp):
            depth += len(node.values) - 2  # `a or b or c` is one node here, a chain of nodes in libcst
        elif isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and hasattr(node, "end_lineno"):
            span = (node.end_lineno or node.lineno) - node.lineno, (node.end_col_offset or 0) - node.col_offset
            if span[0] or span[1] > _LONG_CONSTANT:
                lines = lines if lines is not None else text.splitlines(keepends=True)
                depth += _literals_in(node, lines) - 1  # "a" "b" "c": one constant here, a chain in libcst
        if depth > LIBCST_NESTING_LIMIT:
            raise too_deep(target)
        stack.extend((child, depth) for child in ast.iter_child_nodes(node))


def _literals_in(node: ast.expr, lines: list[str]) -> int:
    """How many string literals make up one (implicitly concatenated) constant."""
    first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
    span = [line.encode() for line in lines[first : last + 1]]  # AST offsets count UTF-8 bytes
    span[-1] = span[-1][: node.end_col_offset]
    span[0] = span[0][node.col_offset :]
    segment = b"".join(span).decode(errors="replace")
    count = 0
    with contextlib.suppress(tokenize.TokenError, SyntaxError):
        for token in tokenize.generate_tokens(io.StringIO(segment).readline):
            count += token.type == tokenize.STRING
    return max(1, count)


def _store(path: Path, value: object) -> None:
    """Best effort: a cache that cannot be written only costs time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(value), encoding="utf-8")
        os.replace(temporary, path)
    except OSError:
        pass


class Outcome(enum.Enum):
    PATCHED = "patched"
    ALREADY = "already applied"
    NOT_APPLICABLE = "n/a"


@dataclass
class PatchStep:
    patch: type[Patch]
    outcome: Outcome


def patch_file(
    patches: Sequence[type[Patch]], target: str, text: str | None, version: str, module: cst.Module | None = None
) -> tuple[str | None, list[PatchStep], cst.Module | None]:
    """Apply ``patches`` (all on ``target``) to ``text``; return the new text, what each did, the tree.

    Raises ``AnchorNotFound`` or ``BadTarget``; never touches the disk. ``module``, when given, is
    ``text`` already parsed.
    """
    steps: list[PatchStep] = []
    changed = False
    for patch in patches:
        if not patch.applies_to(version):
            steps.append(PatchStep(patch, Outcome.NOT_APPLICABLE))
            continue
        if issubclass(patch, NewFilePatch):
            wanted = patch().text()
            if text is not None and text != wanted:
                raise BadTarget(f"{patch.id}: {target} already exists with other content (SGLang {version})")
            steps.append(PatchStep(patch, Outcome.ALREADY if text == wanted else Outcome.PATCHED))
            text = wanted
            continue
        assert issubclass(patch, CstPatch)
        if text is None:
            raise AnchorNotFound(patch.id, f"file {target}", target, version)
        if module is None:
            module = parse(text, target)
        if patch.APPLIED.found(module):
            steps.append(PatchStep(patch, Outcome.ALREADY))
            continue
        for name, anchor in patch.ANCHORS.items():
            if not anchor.found(module):
                raise AnchorNotFound(patch.id, name, target, version)
        module = patch().transform(module)
        if not patch.APPLIED.found(module):
            raise BadTarget(f"{patch.id}: its applied-matcher does not recognise its own output in {target}")
        steps.append(PatchStep(patch, Outcome.PATCHED))
        changed = True
    if changed:
        assert module is not None
        text = module.code
    return text, steps, module


def check_result(
    patches: Sequence[type[Patch]],
    target: str,
    before: str | None,
    after: str,
    version: str,
    module: cst.Module | None = None,
) -> None:
    """The post-conditions every patched file must meet before it may be written.

    ``module`` is ``after`` as the transforms left it; without it ``after`` is parsed again.
    """
    try:
        compile(after, target, "exec", dont_inherit=True)
    except RecursionError:
        raise too_deep(target) from None
    except (SyntaxError, ValueError) as error:  # ValueError: a NUL byte (Python < 3.12)
        where = f"line {error.lineno}: {error.msg}" if isinstance(error, SyntaxError) else str(error)
        raise BadTarget(f"patched {target} does not compile ({where}); nothing written") from None
    if before is not None and all(p.INSERT_ONLY for p in patches if p.applies_to(version)):
        line = first_changed_line(before, after)
        if line is not None:
            raise BadTarget(f"patching {target} would change original line {line}; dynspec only adds lines")
    again, _, _ = patch_file(patches, target, after, version, module)
    if again != after:
        raise BadTarget(f"patching {target} twice does not give the same text: a second apply would not be a no-op")


def first_changed_line(before: str, after: str) -> int | None:
    """1-based number of the first original line that is not kept, in order, in ``after``.

    Insert-only edits keep the original lines as a subsequence; a linear scan checks that on
    9000-line files far faster than a diff would.
    """
    new_lines = iter(after.splitlines())
    for number, line in enumerate(before.splitlines(), 1):
        if not any(candidate == line for candidate in new_lines):
            return number
    return None


def apply_text(patches: Sequence[type[Patch]], text: str, version: str, target: str = "<text>") -> str:
    """Pure string-to-string entry point for tests: run the checks, return the patched text."""
    new, _, _ = patch_file(patches, target, text, version)
    assert new is not None
    if new != text:
        check_result(patches, target, text, new, version)
    return new


# -- plans over a tree --------------------------------------------------------------------------


@dataclass
class FilePlan:
    target: str
    pristine: str | None  # the pre-image: from the state dir when recorded, else the disk
    disk: str | None
    new: str | None
    steps: list[PatchStep]

    @property
    def changes(self) -> bool:
        return self.new != self.disk


@dataclass
class Plan:
    version: str
    files: list[FilePlan]
    notes: list[str] = field(default_factory=list)

    @property
    def pending(self) -> list[FilePlan]:
        return [f for f in self.files if f.changes]


def targets_in_order(patches: Iterable[type[Patch]]) -> dict[str, list[type[Patch]]]:
    grouped: dict[str, list[type[Patch]]] = {}
    for patch in patches:
        grouped.setdefault(patch.TARGET, []).append(patch)
    return grouped


def _decode(data: bytes | None, target: str) -> str | None:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadTarget(f"{target} is not UTF-8 text") from None


def plan(tree: txn.Tree, recipe: Recipe, version: str, state: dict[str, Any] | None, force: bool = False) -> Plan:
    """What applying ``recipe`` would write. Refuses hand-edited targets unless ``force``."""
    recorded = (state or {}).get("files", {})
    result = Plan(version=version, files=[])
    for target, patches in targets_in_order(recipe.patches).items():
        if not any(p.applies_to(version) for p in patches):
            continue
        disk = tree.read(target)
        entry = recorded.get(target)
        # A recorded file that is back to its original (e.g. by a revert killed before it could
        # forget the state) is as good as one dynspec never touched.
        if entry is not None and txn.sha256(disk) != entry["pre"]:
            if txn.sha256(disk) != entry["post"]:
                if not force:
                    raise Refused(
                        f"{target} changed after dynspec patched it; revert with --force to restore the "
                        "original (your edits are lost), or undo the edits"
                    )
                result.notes.append(f"{target} changed after apply; --force rebuilds it from the original")
            pristine = _decode(None if entry["pre"] is None else tree.blob(entry["pre"]), target)
        else:
            pristine = _decode(disk, target)
        with progress.step(f"checking {target}"):
            new, steps = checked_patch_file(patches, target, pristine, version)
        result.files.append(FilePlan(target, pristine, _decode(disk, target), new, steps))
    return result


def checked_patch_file(
    patches: Sequence[type[Patch]], target: str, pristine: str | None, version: str
) -> tuple[str | None, list[PatchStep]]:
    """``patch_file`` plus every post-condition, remembered on disk once it has passed.

    The result is a pure function of the pristine text, the version and dynspec's own code, so a
    result that passed every check once is reused as is: a `diff` followed by an `apply`, or a
    second tree of the same release, costs no parse and no code generation.
    """
    key = _result_key(patches, target, pristine, version)
    remembered = _result_cache_dir() / f"{key}.json"
    try:
        new, outcomes = json.loads(remembered.read_text(encoding="utf-8"))
        return new, [PatchStep(p, Outcome(o)) for p, o in zip(patches, outcomes)]
    except (OSError, ValueError, TypeError):
        pass
    try:
        new, steps, module = patch_file(patches, target, pristine, version)
        if new is not None and new != pristine:
            check_result(patches, target, pristine, new, version, module)
    except RecursionError:
        raise too_deep(target) from None
    _store(remembered, (new, [s.outcome.value for s in steps]))
    return new, steps


def _result_key(patches: Sequence[type[Patch]], target: str, pristine: str | None, version: str) -> str:
    ids = [(p.id, p.REVISION, _module_digest(p.__module__)) for p in patches]
    text = "" if pristine is None else pristine
    return hashlib.sha256(
        repr((_code_fingerprint(), ids, target, version, pristine is None, text)).encode()
    ).hexdigest()


@functools.cache
def _code_fingerprint() -> str:
    """Changes whenever the engine or any patch changes, so no stale result is ever reused."""
    import patches as shipped

    here = Path(__file__).resolve().parent
    files = sorted([*here.glob("*.py"), *Path(next(iter(shipped.__path__))).rglob("*.py")])
    digest = hashlib.sha256(__version__.encode())
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.cache
def _module_digest(name: str) -> str:
    """The source of the module a patch is defined in (patches written in tests included)."""
    import sys

    source = getattr(sys.modules.get(name), "__file__", None)
    return hashlib.sha256(Path(source).read_bytes()).hexdigest() if source else name


def _result_cache_dir() -> Path:
    return releases.cache_dir() / "results"


def new_state(tree_state: dict[str, Any] | None, recipe: Recipe, plan_: Plan) -> dict[str, Any]:
    """The state.json that describes the tree once ``plan_`` is written."""
    files = dict((tree_state or {}).get("files", {}))
    for f in plan_.files:
        if f.new == f.pristine:
            files.pop(f.target, None)  # nothing of ours in this file
            continue
        pre = files.get(f.target, {}).get("pre") if f.target in files else txn.sha256(_encode(f.disk))
        files[f.target] = {"pre": pre, "post": txn.sha256(_encode(f.new))}
    patches = {
        s.patch.id: s.patch.REVISION
        for f in plan_.files
        for s in f.steps
        if s.outcome is not Outcome.NOT_APPLICABLE and f.new != f.pristine
    }
    return {
        "dynspec": __version__,
        "sglang_version": plan_.version,
        "recipe": recipe.name,
        "patches": patches,
        "files": files,
    }


def _encode(text: str | None) -> bytes | None:
    return None if text is None else text.encode("utf-8")


def writes_for(plan_: Plan) -> dict[str, bytes | None]:
    return {f.target: _encode(f.new) for f in plan_.pending}


# -- revert ------------------------------------------------------------------------------------


def revert_writes(tree: txn.Tree, state: dict[str, Any], force: bool = False) -> dict[str, bytes | None]:
    """The pristine bytes of every recorded file; refuses hand edits unless ``force``."""
    writes: dict[str, bytes | None] = {}
    for target, entry in state.get("files", {}).items():
        disk = tree.read(target)
        if txn.sha256(disk) == entry["pre"]:
            continue  # already the original
        if txn.sha256(disk) != entry["post"] and not force:
            raise Refused(
                f"{target} changed after dynspec patched it; revert --force restores the original "
                "and discards those edits"
            )
        writes[target] = None if entry["pre"] is None else tree.blob(entry["pre"])
    return writes


# -- status ------------------------------------------------------------------------------------


class Status(enum.Enum):
    NOT_APPLIED = "not applied"
    APPLIED = "applied"
    OUTDATED = "outdated"
    DRIFTED = "drifted"
    NOT_APPLICABLE = "n/a"
    UPSTREAM = "provided upstream"
    UNRECORDED = "applied, not recorded"


@dataclass
class PatchStatus:
    patch: type[Patch]
    status: Status
    detail: str = ""


def status(tree: txn.Tree, recipe: Recipe, version: str, state: dict[str, Any] | None) -> list[PatchStatus]:
    recorded_patches = (state or {}).get("patches", {})
    recorded_files = (state or {}).get("files", {})
    report: list[PatchStatus] = []
    for target, patches in targets_in_order(recipe.patches).items():
        disk_bytes = tree.read(target)
        found = txn.sha256(disk_bytes)
        original = target in recorded_files and found == recorded_files[target]["pre"]
        drifted = target in recorded_files and found != recorded_files[target]["post"] and not original
        disk = _decode(disk_bytes, target)
        recorded = {} if original else recorded_patches  # back to the original: nothing of ours in it
        try:
            with progress.step(f"reading {target}"):
                for patch in patches:
                    report.append(_status_of(patch, target, disk, version, recorded, drifted))
        except RecursionError:
            raise too_deep(target) from None
    return report


def _status_of(
    patch: type[Patch], target: str, disk: str | None, version: str, recorded: dict[str, Any], drifted: bool
) -> PatchStatus:
    found = _state_of(patch, target, disk, version, recorded, drifted)
    note = patch.upstream_note(version) if found.status is not Status.NOT_APPLICABLE else None
    if note:
        found.detail = f"{found.detail}; {note}" if found.detail else note
    return found


def _state_of(
    patch: type[Patch], target: str, disk: str | None, version: str, recorded: dict[str, Any], drifted: bool
) -> PatchStatus:
    if not patch.applies_to(version):
        return PatchStatus(patch, Status.NOT_APPLICABLE, f"for SGLang {patch.SGLANG}")
    if patch.provided_upstream(version):
        return PatchStatus(patch, Status.UPSTREAM, f"SGLang {version} has it")
    if patch.id in recorded:
        if drifted:
            return PatchStatus(patch, Status.DRIFTED, f"{target} changed after apply")
        if recorded[patch.id] < patch.REVISION:
            return PatchStatus(patch, Status.OUTDATED, f"r{recorded[patch.id]} on disk, r{patch.REVISION} available")
        return PatchStatus(patch, Status.APPLIED, f"r{recorded[patch.id]}")
    if disk is not None:
        if issubclass(patch, NewFilePatch):
            found = patch().text() == disk
        else:
            assert issubclass(patch, CstPatch)
            found = patch.APPLIED.found(parse(disk, target))
        if found:
            return PatchStatus(patch, Status.UNRECORDED, "its code is in the file but the state dir has no record")
    if issubclass(patch, CstPatch):
        if disk is None:
            return PatchStatus(patch, Status.DRIFTED, f"{target} is missing")
        module = parse(disk, target)
        missing = [name for name, anchor in patch.ANCHORS.items() if not anchor.found(module)]
        if missing:
            return PatchStatus(patch, Status.DRIFTED, f"anchor {missing[0]!r} not found")
    return PatchStatus(patch, Status.NOT_APPLIED)


# -- diff --------------------------------------------------------------------------------------


def unified_diff(path: str, before: str | None, after: str | None) -> str:
    """A git-style diff that ``git apply`` and ``patch -p1`` both accept."""
    old = [] if before is None else before.splitlines(keepends=True)
    new = [] if after is None else after.splitlines(keepends=True)
    header = [f"diff --git a/{path} b/{path}\n"]
    if before is None:
        header.append("new file mode 100644\n")
    if after is None:
        header.append("deleted file mode 100644\n")
    lines = list(
        difflib.unified_diff(
            old, new, "/dev/null" if before is None else f"a/{path}", "/dev/null" if after is None else f"b/{path}", n=3
        )
    )
    if not lines:
        return ""
    out = header + lines[:2]
    for line in lines[2:]:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def relative_to_root(package_dir: Path, diff_root: Path, target: str) -> str:
    return (package_dir / target).relative_to(diff_root).as_posix()
