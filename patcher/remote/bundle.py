"""`dynspec bundle`: the plan for one SGLang release in a single file that needs only python3.

The file is a zipapp holding what `dynspec remote` ships (``client.SHIPPED``: patcher/txn.py,
patcher/treefacts.py and applier.py, as ``dynspec_*.py``), a ``__main__.py`` and ``plan.json``: for
every target the sha256 of the pristine file and the patched bytes, the state.json a local apply
would write, and, per patch, what `dynspec status` says on the pristine and on the patched tree.
On the server, ``python3 dynspec-plan.pyz apply|status|revert|diff --sglang PATH`` checks every
file against the plan (refusing with the file and the expected sha256) and writes through
``Tree.commit``, so a later local `dynspec status` on that server agrees. The archive is
byte-for-byte reproducible.
"""

from __future__ import annotations

import base64
import io
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patcher import __version__, engine, releases, treefacts, txn
from patcher.errors import Refused, UsageError
from patcher.registry import Recipe, load_recipe
from patcher.remote import client

PLAN_FORMAT = 1

# Kept to syntax every python3 parses, so an old one says what is wrong instead of a SyntaxError.
MAIN = """\
import sys
if sys.version_info < (3, 9):
    sys.stderr.write("dynspec: %s is Python %d.%d; this plan needs python3 >= 3.9\\n" % ((sys.executable,) + tuple(sys.version_info[:2])))
    sys.exit(8)
import dynspec_applier
sys.exit(dynspec_applier.bundle_main())
"""


@dataclass
class Built:
    path: Path
    size: int
    version: str
    recipe: str
    files: dict[str, str | None]  # target -> the pristine sha256 the server must have


def pristine_package(version: str | None, source: Path | None, recipe: Recipe) -> tuple[Path, str]:
    """The files the plan is made from: ``--from DIR`` or the release from PyPI (cached)."""
    if source is None:
        if version is None:
            raise UsageError("dynspec bundle needs --sglang-version V (or --from DIR with the server's files)")
        targets = sorted(engine.targets_in_order(recipe.patches))
        try:
            return releases.unpacked(version, targets) / "sglang", version
        except RuntimeError as error:
            raise UsageError(str(error)) from None
    try:
        package = Path(treefacts.locate_path(str(source)).package_dir)
    except treefacts.NotATree:
        package = source.resolve()  # fetched files laid out as in the package dir: srt/server_args.py, ...
    if (package / txn.STATE_DIR).exists():
        raise Refused(f"{package} has a dynspec state dir: make the bundle from the unpatched files")
    found = version or treefacts.read_version(str(package))
    if found is None:
        raise UsageError(f"cannot tell the SGLang version of {package}; pass --sglang-version")
    return package, found


def make_plan(package: Path, version: str, recipe: Recipe, force: bool = False) -> dict[str, Any]:
    recipe.refuse_unsupported(version, force)
    files = txn.Tree(str(package))
    plan = engine.plan(files, recipe, version, None)
    if not plan.pending:
        raise Refused(f"recipe {recipe.name!r} changes nothing in these SGLang {version} files; no bundle written")
    state = engine.new_state(None, recipe, plan)
    targets = sorted(engine.targets_in_order(recipe.patches))
    patched_files = {t: files.read(t) for t in targets}
    patched_files.update(engine.writes_for(plan))
    patched = client.SnapshotTree(str(package), files.state_dir, patched_files, {}, state)
    before = engine.status(files, recipe, version, None)
    after = engine.status(patched, recipe, version, state)
    return {
        "format": PLAN_FORMAT,
        "dynspec": __version__,
        "sglang_version": version,
        "recipe": recipe.name,
        "files": {
            f.target: {
                "pre": txn.sha256(_encode(f.disk)),
                "post": txn.sha256(_encode(f.new)),
                "new": base64.b64encode(_encode(f.new) or b"").decode("ascii") if f.new is not None else None,
                "diff": engine.unified_diff(f.target, f.disk, f.new),
            }
            for f in plan.pending
        },
        "state": state,
        "status": [
            {
                "id": b.patch.id,
                "revision": b.patch.REVISION,
                "target": b.patch.TARGET,
                "pristine": {"state": b.status.value, "detail": b.detail},
                "patched": {"state": a.status.value, "detail": a.detail},
                # for the answers the applier works out itself; the two above already carry it
                "note": b.patch.upstream_note(version),
            }
            for b, a in zip(before, after)
        ],
    }


def _encode(text: str | None) -> bytes | None:
    return None if text is None else text.encode("utf-8")


def archive(plan: dict[str, Any]) -> bytes:
    """The zipapp: a shebang line, then a zip with fixed timestamps (reproducible bytes)."""
    members = {
        "__main__.py": MAIN,
        **{f"{name}.py": source for name, source in client.shipped_sources().items()},
        "plan.json": json.dumps(plan, indent=1) + "\n",
    }
    buffer = io.BytesIO()
    buffer.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, text in members.items():
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, text.encode("utf-8"))
    return buffer.getvalue()


def build(
    output: Path, version: str | None = None, recipe: str = "default", source: Path | None = None, force: bool = False
) -> Built:
    loaded = load_recipe(recipe)
    package, version = pristine_package(version, source, loaded)
    plan = make_plan(package, version, loaded, force)
    data = archive(plan)
    output = output.expanduser()
    temporary = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    try:
        temporary.write_bytes(data)
        temporary.chmod(0o755)
        os.replace(temporary, output)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise UsageError(f"cannot write {output}: {error.strerror or error}") from None
    return Built(output, len(data), version, loaded.name, {t: f["pre"] for t, f in plan["files"].items()})
