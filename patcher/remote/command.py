"""`dynspec remote apply|revert|status|diff HOST...` and `dynspec bundle`: parse, run, render.

Register with ``main.add_command(remote)`` and ``main.add_command(bundle)`` in patcher/cli.py.
The only module of ``patcher.remote`` that imports click. The engine (and ``client`` and ``bundle``,
which import it) is imported inside the commands, as in patcher/cli.py.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from patcher.options import Decorated, apply_options, diff_command_options, revert_force

REMOTE_EXIT_CODES = """\b
Exit codes (with several hosts: the first failing host's, in the order given):
  0    done, or nothing to do
  1    --check: changes are pending (or, for status, a patch is not applied)
  2    usage: bad option, or the path is not an SGLang tree on the server
  3    drift: a patch's anchor is missing in the server's SGLang; nothing written
  4    refused: hand edits, unsupported version, tree locked, read-only target,
       or a file changed between read and write; nothing written
  5    ssh authentication failed (BatchMode: no password prompts)
  6    the server's host key is unknown or has changed
  7    the server cannot be reached (unknown name, refused, timed out)
  8    no python3 >= 3.9 at --python on the server
  9    the connection broke mid-command: the tree is all old or all new
  10   damaged state dir on the server (a link, bad JSON, a missing
       pre-image); nothing written
  123  internal error: a bug in dynspec
  130  interrupted (Ctrl-C)
"""

BUNDLE_EPILOG = """\b
On the server (needs only python3 >= 3.9):
  scp dynspec-plan.pyz HOST: && ssh HOST python3 dynspec-plan.pyz apply --sglang /root/sglang
  python3 dynspec-plan.pyz status|revert|diff --sglang /root/sglang
It refuses, naming the file and the expected sha256, when the server's files are not the ones
the plan was made for. Exit codes there: 0 done, 1 --check, 2 usage, 4 refused, 8 python < 3.9,
10 damaged state dir, 130 interrupted.
"""


def _at_least_one(*decls: str, default: int, metavar: str, help: str) -> Callable[[Decorated], Decorated]:
    """A whole number of 1 or more (seconds, hosts), its default shown in the help."""
    return click.option(*decls, default=default, show_default=True, metavar=metavar, type=click.IntRange(1), help=help)


def host_options(command: Callable[..., Any]) -> Callable[..., Any]:
    @click.argument("hosts", nargs=-1, required=True, metavar="HOST...")
    @click.option(
        "--sglang",
        default="auto",
        show_default=True,
        metavar="PATH|auto",
        help="On the server: SGLang checkout root, its python/ dir, the sglang package dir, or 'auto' (what --python imports).",
    )
    @click.option(
        "--python", "python", default="python3", show_default=True, metavar="PATH", help="python3 >= 3.9 on the server."
    )
    @click.option("--recipe", default="default", show_default=True, help="Patch series from recipes/.")
    @click.option("--sglang-version", default=None, metavar="V", help="Use V instead of the detected version.")
    @click.option("-F", "--ssh-config", default=None, metavar="FILE", help="ssh -F: another ssh config file.")
    @click.option("-o", "--ssh-option", "ssh_options", multiple=True, metavar="OPT", help="ssh -o OPT (repeatable).")
    @_at_least_one("--connect-timeout", default=10, metavar="S", help="ssh ConnectTimeout.")
    @_at_least_one("-j", "--jobs", default=8, metavar="N", help="Hosts worked on at once.")
    @click.option("-v", "--verbose", is_flag=True, help="Also print where the time went, per host.")
    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return command(*args, **kwargs)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=REMOTE_EXIT_CODES)
def remote() -> None:
    """Apply, revert, inspect dynspec on SGLang trees of other machines, over ssh.

    Uses the system OpenSSH client (your ~/.ssh/config, agent and ProxyJump apply) and the
    server's python3; nothing is installed there. The plan is made here by the same engine; the
    server checks every file's sha256 before an all-or-nothing write into the same state dir a
    local `dynspec apply` uses. Example: `dynspec remote apply gpu1 gpu2 --sglang /root/sglang`.
    """


def _run(op: str, options: dict[str, Any], **extra: Any) -> list[Any]:
    from patcher import render
    from patcher.registry import load_recipe
    from patcher.remote import client

    render.show_progress()

    ssh = client.Ssh(
        python=options["python"],
        config=options["ssh_config"],
        options=tuple(options["ssh_options"]),
        connect_timeout=options["connect_timeout"],
    )
    recipe = load_recipe(options["recipe"])
    hosts = list(dict.fromkeys(options["hosts"]))
    return client.run_many(
        op,
        hosts,
        ssh,
        options["sglang"],
        recipe,
        jobs=options["jobs"],
        sglang_version=options["sglang_version"],
        **extra,
    )


def _narrate(results: list[Any], verbose: bool) -> None:
    """Notes, what was written, errors and timings on stderr; a host prefix when there are several."""
    from patcher import render
    from patcher.errors import DynspecError
    from patcher.remote.client import RemoteCrash

    several = len(results) > 1
    for r in results:
        prefix = f"{r.host}: " if several else ""
        for message in r.notes:
            render.note(prefix + message)
        for message in r.said:
            render.say(prefix + message)
        if r.error is not None:
            if isinstance(r.error, RemoteCrash):
                sys.stderr.write(r.error.stderr.rstrip() + "\n")
                render.error(f"{r.host}: {r.error} (this is a bug in dynspec)")
            elif isinstance(r.error, DynspecError):
                render.error(f"{r.host}: {r.error}")
            else:
                import traceback

                traceback.print_exception(type(r.error), r.error, r.error.__traceback__)
                render.error(
                    f"{r.host}: internal error: this is a bug in dynspec, please report it with the traceback above"
                )
        if verbose and r.timings:
            where = f" (python {r.tree.python}, {r.tree.package_dir})" if r.tree else ""
            spent = ", ".join(f"{k} {v:.2f} s" for k, v in r.timings.items())
            render.say(f"{r.host}: {spent}{where}")


def _finish(
    results: list[Any], outcome: Callable[[Any], str], check_failed: Callable[[Any], bool] = lambda r: False
) -> None:
    from patcher import render
    from patcher.errors import ExitCode
    from patcher.remote.client import exit_code

    codes = [
        exit_code(r.error) if r.error is not None else int(ExitCode.CHANGES) if check_failed(r) else 0 for r in results
    ]
    if len(results) > 1:
        rows = [
            [
                r.host,
                r.version or "?",
                render.Styled(outcome(r), "green" if code == 0 else "yellow")
                if r.error is None
                else render.Styled(f"error: {r.error}", "bold red"),
                str(code),
            ]
            for r, code in zip(results, codes)
        ]
        render.summary("hosts", ["host", "SGLang", "result", "exit"], rows, fold=(2,))
    failed = [c for c in codes if c not in (0, int(ExitCode.CHANGES))]
    if failed:
        sys.exit(failed[0])
    if any(codes):
        sys.exit(int(ExitCode.CHANGES))


def _write(op: str, options: dict[str, Any], force: bool, verbose: bool, did: str, nothing: str) -> None:
    """apply or revert on every host: what each host did on stderr, then the summary ("<did> N file(s)",
    or ``nothing`` where a host wrote none) and the exit code."""
    results = _run(op, options, force=force)
    _narrate(results, verbose)
    _finish(results, lambda r: f"{did} {len(r.written)} file(s)" if r.written else nothing)


@remote.command()
@host_options
@click.option("--dry-run", is_flag=True, help="Print the diff instead of writing (same as `dynspec remote diff`).")
@apply_options
def apply(dry_run: bool, check: bool, force: bool, verbose: bool, color: str, no_pager: bool, **options: Any) -> None:
    """Patch the SGLang tree on each HOST (idempotent; all or nothing per host)."""
    if dry_run or check:
        _diff(check, force, verbose, color, not no_pager, options)
        return
    _write("apply", options, force, verbose, "patched", "already applied")


@remote.command()
@host_options
@revert_force
def revert(force: bool, verbose: bool, **options: Any) -> None:
    """Restore every file dynspec touched on each HOST, byte for byte, and remove the state dir."""
    _write("revert", options, force, verbose, "restored", "nothing to revert")


@remote.command()
@host_options
@diff_command_options
def diff(check: bool, force: bool, verbose: bool, color: str, no_pager: bool, **options: Any) -> None:
    """Print what `remote apply` would change on each HOST, as a diff `git apply` accepts."""
    _diff(check, force, verbose, color, not no_pager, options)


def _diff(check: bool, force: bool, verbose: bool, color: str, pager: bool, options: dict[str, Any]) -> None:
    from patcher import render

    results = _run("diff", options, force=force)
    _narrate(results, verbose)
    several = len(results) > 1
    render.diffs(
        [(f"{r.host}: {r.tree.package_dir}" if several else None, r.diff) for r in results if r.error is None],
        color,
        pager,
    )
    _finish(results, lambda r: "changes pending" if r.pending else "nothing to do", lambda r: check and r.pending)


@remote.command()
@host_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (a list with several hosts).")
@click.option("--check", is_flag=True, help="Exit 1 unless every patch for this version is applied.")
def status(as_json: bool, check: bool, verbose: bool, **options: Any) -> None:
    """Show, per HOST and patch: not applied, applied (rev), outdated, drifted, n/a or provided upstream."""
    from patcher import render
    from patcher.engine import Status

    results = _run("status", options)
    _narrate(results, verbose)
    done = {Status.APPLIED, Status.NOT_APPLICABLE, Status.UPSTREAM}
    reports = []
    for r in results:
        if r.error is not None:
            reports.append({"host": r.host, "error": str(r.error)})
            continue
        tree = r.tree
        if as_json:
            reports.append(
                {
                    "host": r.host,
                    "sglang_version": tree.version,
                    "package_dir": str(tree.package_dir),
                    "patches": [
                        {
                            "id": s.patch.id,
                            "revision": s.patch.REVISION,
                            "target": tree.display_path(s.patch.TARGET),
                            "state": s.status.value,
                            "detail": s.detail,
                        }
                        for s in r.report
                    ],
                }
            )
            continue
        if len(results) > 1:
            render.heading(f"{r.host}: SGLang {tree.version} at {tree.package_dir}")
        rows = [[s.patch.id, f"r{s.patch.REVISION}", render.state(s.status.value), s.detail] for s in r.report]
        render.table(f"SGLang {tree.version} at {r.host}:{tree.package_dir}", ["patch", "rev", "state", "detail"], rows)
    if as_json and len(results) > 1:
        render.as_json(reports)
    elif as_json and results[0].error is None:
        render.as_json(reports[0])

    def outcome(r: Any) -> str:
        counts: dict[str, int] = {}
        for s in r.report:
            counts[s.status.value] = counts.get(s.status.value, 0) + 1
        return ", ".join(f"{n} {state}" for state, n in counts.items())

    _finish(results, outcome, lambda r: check and any(s.status not in done for s in r.report))


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, epilog=BUNDLE_EPILOG)
@click.option(
    "--sglang-version", default=None, metavar="V", help="The release the server runs (its files are fetched from PyPI)."
)
@click.option(
    "--from",
    "source",
    default=None,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Make the plan from these files instead (copied from the server: a tree, or its package dir's files).",
)
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path), help="Where to write the .pyz."
)
@click.option("--recipe", default="default", show_default=True, help="Patch series from recipes/.")
@click.option("--force", is_flag=True, help="Allow a release outside the recipe's verified range.")
def bundle(sglang_version: str | None, source: Path | None, output: Path, recipe: str, force: bool) -> None:
    """Write one file that applies, checks and reverts the plan on a server with only python3."""
    from patcher import render
    from patcher.remote.bundle import build

    built = build(output, sglang_version, recipe, source, force)
    for target, digest in built.files.items():
        render.say(
            f"{target}: expects sha256 {digest}" if digest else f"{target}: expects no such file (dynspec adds it)"
        )
    render.say(
        f"wrote {built.path} ({built.size // 1024} KiB): recipe {built.recipe!r} for pristine SGLang {built.version}, "
        f"{len(built.files)} file(s); run it with: python3 {built.path.name} apply --sglang PATH"
    )
