"""The ``dynspec`` command line: parse, call the session, render, exit. Nothing else.

The engine (libcst) is imported inside the commands so that ``dynspec proof`` also runs on GPU
servers that have only click.
"""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable
from typing import Any

import click

from patcher import __version__
from patcher.errors import DynspecError, ExitCode
from patcher.options import apply_options, diff_command_options, revert_force

EXIT_CODES = """\b
Exit codes:
  0    done, or nothing to do
  1    --check: changes are pending (or, for status, a patch is not applied)
  2    usage: bad option, or the path is not an SGLang tree
  3    drift: a patch's anchor is missing in this SGLang release; nothing written
  4    refused: hand edits after apply, unsupported version, tree locked,
       read-only, unreadable, unparsable or non-regular target, a link out
       of the tree; nothing written
  5-9  dynspec remote: ssh authentication (5), host key (6), unreachable (7),
       no python3 >= 3.9 on the server (8), connection lost mid-command (9)
  10   damaged state: the state dir is a link, not a directory, or holds
       files dynspec did not write; nothing written (the message says how
       to start over)
  11   dynspec real: a model file or directory is missing or unreadable
  12   dynspec real: a model file is damaged or not the model expected
       (format, architecture, tensor names or shapes, digest)
  123  internal error: a bug in dynspec
  130  interrupted (Ctrl-C): the tree is all old, or all new if the write
       had finished (the message says which)
"""


class DynspecGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            # apply and revert say how their write ended; a Ctrl-C anywhere else cannot cut one in half.
            from patcher import render

            render.error("interrupted; the tree is all old or all new (`dynspec status` tells which)")
            ctx.exit(int(ExitCode.INTERRUPTED))
        except DynspecError as error:
            from patcher import render

            render.error(str(error))
            ctx.exit(int(error.exit_code))


@click.group(cls=DynspecGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES)
@click.version_option(__version__, prog_name="dynspec")
def main() -> None:
    """Patch SGLang so EAGLE speculative decoding turns itself off under load and back on.

    Typical use: `dynspec diff --sglang /root/sglang` to review, `dynspec apply --sglang
    /root/sglang`, restart the server with `--speculative-disable-batch-size N`, and
    `dynspec revert --sglang /root/sglang` before upgrading SGLang.
    """


def tree_options(command: Callable[..., Any]) -> Callable[..., Any]:
    @click.option(
        "--sglang",
        default="auto",
        show_default=True,
        metavar="PATH|auto",
        help="SGLang checkout root, its python/ dir, an installed sglang package dir, or 'auto'.",
    )
    @click.option("--recipe", default="default", show_default=True, help="Patch series from recipes/.")
    @click.option("--sglang-version", default=None, metavar="V", help="Use V instead of the detected version.")
    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return command(*args, **kwargs)

    return wrapper


def _session(sglang: str, recipe: str, force: bool, sglang_version: str | None) -> Any:
    from patcher import render
    from patcher.session import Session

    render.show_progress()
    session = Session.open(sglang, recipe, force=force, sglang_version=sglang_version)
    for message in session.notes:
        render.note(message)
    session.notes.clear()
    return session


def _flush_notes(session: Any) -> None:
    from patcher import render

    for message in session.notes:
        render.note(message)
    session.notes.clear()


@main.command()
@tree_options
@click.option("--dry-run", is_flag=True, help="Print the diff instead of writing (same as `dynspec diff`).")
@apply_options
def apply(
    sglang: str,
    recipe: str,
    sglang_version: str | None,
    dry_run: bool,
    check: bool,
    force: bool,
    color: str,
    no_pager: bool,
) -> None:
    """Patch the tree (idempotent; upgrades older revisions in place)."""
    from patcher import render

    session = _session(sglang, recipe, force, sglang_version)
    if dry_run or check:
        _print_diff(session, check, force, color, not no_pager)
        return
    plan = session.apply(force=force)
    _flush_notes(session)
    if not plan.pending:
        render.say(f"already applied: nothing to do for SGLang {session.version}")
        return
    for f in plan.pending:
        render.say(f"patched {session.display_path(f.target)}")
    render.say(f"{len(plan.pending)} file(s) patched for SGLang {session.version}; state in {session.files.state_dir}")


def _print_diff(session: Any, check: bool, force: bool, color: str, pager: bool) -> None:
    from patcher import render

    plan = session.plan(force=force)
    _flush_notes(session)
    render.diff(session.diff(plan), color, pager)
    if check and plan.pending:
        sys.exit(int(ExitCode.CHANGES))


@main.command()
@tree_options
@diff_command_options
def diff(
    sglang: str, recipe: str, sglang_version: str | None, check: bool, force: bool, color: str, no_pager: bool
) -> None:
    """Print what `apply` would change, as a diff `git apply` accepts. Nothing else on stdout."""
    _print_diff(_session(sglang, recipe, force, sglang_version), check, force, color, not no_pager)


@main.command()
@tree_options
@revert_force
@click.option(
    "--from-git",
    is_flag=True,
    help="Restore every target as the git checkout's HEAD has it and remove the state dir, whatever it holds "
    "(the way out of a damaged state dir; hand edits are lost).",
)
def revert(sglang: str, recipe: str, sglang_version: str | None, force: bool, from_git: bool) -> None:
    """Restore every file dynspec touched, byte for byte, and remove the state dir."""
    from patcher import render

    session = _session(sglang, recipe, True, sglang_version)
    if from_git:
        restored = session.revert_from_git()
        _flush_notes(session)
        for target in restored:
            render.say(f"restored {session.display_path(target)} from git")
        render.say(f"{len(restored)} file(s) restored from git; state dir removed")
        return
    restored = session.revert(force=force)
    _flush_notes(session)
    if not restored:
        render.say("nothing to revert: dynspec has not patched this tree")
        return
    for target in restored:
        render.say(f"restored {session.display_path(target)}")
    render.say(f"{len(restored)} file(s) restored")


@main.command()
@tree_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--check", is_flag=True, help="Exit 1 unless every patch for this version is applied.")
def status(sglang: str, recipe: str, sglang_version: str | None, as_json: bool, check: bool) -> None:
    """Show, per patch: not applied, applied (rev), outdated, drifted, n/a or provided upstream."""
    from patcher import render
    from patcher.engine import Status

    session = _session(sglang, recipe, True, sglang_version)
    report = session.status()
    _flush_notes(session)
    if as_json:
        render.as_json(
            {
                "sglang_version": session.version,
                "package_dir": str(session.tree.package_dir),
                "patches": [
                    {
                        "id": s.patch.id,
                        "revision": s.patch.REVISION,
                        "target": session.display_path(s.patch.TARGET),
                        "state": s.status.value,
                        "detail": s.detail,
                    }
                    for s in report
                ],
            }
        )
    else:
        rows = [[s.patch.id, f"r{s.patch.REVISION}", render.state(s.status.value), s.detail] for s in report]
        render.table(
            f"SGLang {session.version} at {session.tree.package_dir}", ["patch", "rev", "state", "detail"], rows
        )
    wanted = {Status.APPLIED}
    if check and any(s.status not in wanted | {Status.NOT_APPLICABLE, Status.UPSTREAM} for s in report):
        sys.exit(int(ExitCode.CHANGES))


@main.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_(as_json: bool) -> None:
    """List the patches and recipes with their SGLang version ranges."""
    from patcher import render
    from patcher.registry import all_patches, load_recipe, recipe_names

    patches = all_patches()
    recipes = [load_recipe(name) for name in recipe_names()]
    if as_json:
        render.as_json(
            {
                "patches": [
                    {"id": p.id, "revision": p.REVISION, "target": p.TARGET, "sglang": p.SGLANG, "summary": p.SUMMARY}
                    for p in patches.values()
                ],
                "recipes": [
                    {
                        "name": r.name,
                        "sglang": r.sglang,
                        "description": r.description,
                        "patches": [p.id for p in r.patches],
                    }
                    for r in recipes
                ],
            }
        )
        return
    render.table(
        "patches",
        ["patch", "rev", "SGLang", "target", "what it does"],
        [[p.id, f"r{p.REVISION}", p.SGLANG, p.TARGET, p.SUMMARY] for p in patches.values()],
        fold=(2, 3, 4),
    )
    render.table(
        "recipes",
        ["recipe", "SGLang", "patches (in order)"],
        [[r.name, r.sglang, ", ".join(p.id for p in r.patches)] for r in recipes],
    )


def _register_commands() -> None:
    # Each lives in its own module so that `dynspec proof` runs with click alone on a GPU server.
    from patcher.proof.command import proof

    main.add_command(proof)
    from patcher.real.command import real

    main.add_command(real)
    try:
        from patcher.matrix.command import matrix
    except ImportError:  # pragma: no cover - as below
        return
    main.add_command(matrix)
    try:
        from patcher.remote.command import bundle, remote
    except ImportError:  # pragma: no cover - a GPU server with only click: remote is run from here, not there
        return
    main.add_command(remote)
    main.add_command(bundle)


_register_commands()


def run() -> None:
    """Console-script entry: any exception that is not a DynspecError is a dynspec bug."""
    try:
        main(standalone_mode=True)
    except SystemExit:
        raise
    except Exception:  # noqa: BLE001 - the last line of defence
        traceback.print_exc()
        sys.stderr.write(
            "dynspec: internal error: this is a bug in dynspec, please report it with the traceback above\n"
        )
        sys.exit(int(ExitCode.INTERNAL))
