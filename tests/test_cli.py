"""The command line as a user meets it: every command, every exit code, every refusal.

Each refusal also checks that no byte of the tree changed.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from patcher import txn
from tests.conftest import run_dynspec, snapshot

VERSION = "0.5.12"  # has v1 and v2 workers and the plain-dataclass ServerArgs


@pytest.fixture
def package(release_tree) -> Path:
    return release_tree(VERSION)


def test_help_lists_commands_and_exit_codes() -> None:
    done = run_dynspec("--help")
    assert done.returncode == 0
    for word in ("apply", "diff", "revert", "status", "list", "Exit codes", "123"):
        assert word in done.stdout


def test_diff_prints_only_a_git_applicable_diff(package: Path, tmp_path: Path) -> None:
    before = snapshot(package)
    done = run_dynspec("diff", "--sglang", str(package))
    assert done.returncode == 0
    assert done.stdout.startswith("diff --git a/srt/server_args.py b/srt/server_args.py\n")
    assert snapshot(package) == before, "diff writes nothing"
    patch_file = tmp_path / "dynspec.patch"
    patch_file.write_text(done.stdout)
    subprocess.run(["git", "apply", "--check", str(patch_file)], cwd=package, check=True)
    subprocess.run(["git", "apply", str(patch_file)], cwd=package, check=True)
    assert run_dynspec("diff", "--check", "--sglang", str(package)).returncode == 0, "git apply gave the same result"


def test_diff_check_and_apply_dry_run(package: Path) -> None:
    before = snapshot(package)
    assert run_dynspec("diff", "--check", "--sglang", str(package)).returncode == 1
    dry = run_dynspec("apply", "--dry-run", "--sglang", str(package))
    assert dry.returncode == 0 and dry.stdout.startswith("diff --git")
    assert run_dynspec("apply", "--dry-run", "--check", "--sglang", str(package)).returncode == 1
    assert snapshot(package) == before


def test_apply_status_reapply_revert(package: Path) -> None:
    before = snapshot(package)
    applied = run_dynspec("apply", "--sglang", str(package))
    assert applied.returncode == 0, applied.stderr
    assert "patched srt/server_args.py" in applied.stderr
    assert applied.stdout == ""

    again = run_dynspec("apply", "--sglang", str(package))
    assert again.returncode == 0 and "already applied" in again.stderr

    status = run_dynspec("status", "--json", "--sglang", str(package))
    assert status.returncode == 0
    report = json.loads(status.stdout)
    assert report["sglang_version"] == VERSION
    states = {p["id"]: p["state"] for p in report["patches"]}
    assert states["server_args_dynspec_flags_legacy"] == "applied"
    assert states["spec_fields_dynspec_flags"] == "n/a"
    assert run_dynspec("status", "--check", "--sglang", str(package)).returncode == 0
    assert run_dynspec("diff", "--check", "--sglang", str(package)).returncode == 0

    reverted = run_dynspec("revert", "--sglang", str(package))
    assert reverted.returncode == 0 and "restored srt/server_args.py" in reverted.stderr
    assert snapshot(package) == before
    assert run_dynspec("status", "--check", "--sglang", str(package)).returncode == 1
    nothing = run_dynspec("revert", "--sglang", str(package))
    assert nothing.returncode == 0 and "nothing to revert" in nothing.stderr


def test_plain_status_table_when_piped(package: Path) -> None:
    done = run_dynspec("status", "--sglang", str(package))
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["patch", "rev", "state", "detail"]
    assert any(line.startswith("server_args_dynspec_check") and "not applied" in line for line in lines)
    assert "\x1b[" not in done.stdout


def test_list_shows_patches_and_recipes() -> None:
    done = run_dynspec("list", "--json")
    assert done.returncode == 0
    listing = json.loads(done.stdout)
    ids = {p["id"] for p in listing["patches"]}
    assert {"server_args_dynspec_flags_legacy", "server_args_dynspec_check"} <= ids
    default = next(r for r in listing["recipes"] if r["name"] == "default")
    assert default["patches"][0] == "server_args_dynspec_flags_legacy"
    assert "server_args_dynspec_flags_legacy" in run_dynspec("list").stdout


def test_accepts_checkout_root_and_python_dir(release_tree, tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    release_tree(VERSION, where=checkout / "python")
    from_root = run_dynspec("diff", "--sglang", str(checkout))
    assert from_root.stdout.startswith("diff --git a/python/sglang/srt/server_args.py")
    from_python = run_dynspec("diff", "--sglang", str(checkout / "python"))
    assert from_python.stdout.startswith("diff --git a/sglang/srt/server_args.py")


def test_auto_finds_the_importable_sglang(package: Path) -> None:
    done = run_dynspec("status", "--json", "--sglang", "auto", env={"PYTHONPATH": str(package.parent)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["package_dir"] == str(package)


# -- refusals ----------------------------------------------------------------------------------


def test_not_an_sglang_tree(tmp_path: Path) -> None:
    done = run_dynspec("apply", "--sglang", str(tmp_path))
    assert done.returncode == 2
    assert "is not an SGLang tree" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    missing = run_dynspec("apply", "--sglang", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such directory" in missing.stderr


def test_syntax_error_in_a_target(package: Path) -> None:
    target = package / "srt" / "server_args.py"
    target.write_text(target.read_text() + "\ndef broken(:\n")
    before = snapshot(package)
    done = run_dynspec("apply", "--sglang", str(package))
    assert done.returncode == 4
    assert "srt/server_args.py has a syntax error" in done.stderr
    assert snapshot(package) == before


def test_renamed_anchor_is_drift(package: Path) -> None:
    target = package / "srt" / "server_args.py"
    target.write_text(target.read_text().replace("def check_server_args(self)", "def validate_server_args(self)"))
    before = snapshot(package)
    done = run_dynspec("apply", "--sglang", str(package))
    assert done.returncode == 3
    assert (
        "server_args_dynspec_check: anchor 'ServerArgs.check_server_args' not found in srt/server_args.py (SGLang 0.5.12)"
        in done.stderr
    )
    assert snapshot(package) == before
    status = run_dynspec("status", "--json", "--sglang", str(package))
    states = {p["id"]: (p["state"], p["detail"]) for p in json.loads(status.stdout)["patches"]}
    assert states["server_args_dynspec_check"] == ("drifted", "anchor 'ServerArgs.check_server_args' not found")


def test_read_only_target(package: Path) -> None:
    target = package / "srt" / "server_args.py"
    target.chmod(0o444)
    before = snapshot(package)
    done = run_dynspec("apply", "--sglang", str(package))
    assert done.returncode == 4
    assert "srt/server_args.py is read-only" in done.stderr
    assert snapshot(package) == before
    assert not (package / ".dynspec").exists()
    assert stat.S_IMODE(target.stat().st_mode) == 0o444


def test_hand_edit_after_apply(package: Path) -> None:
    assert run_dynspec("apply", "--sglang", str(package)).returncode == 0
    target = package / "srt" / "server_args.py"
    target.write_text(target.read_text() + "# my local tweak\n")
    before = snapshot(package)
    for command in ("revert", "apply"):
        done = run_dynspec(command, "--sglang", str(package))
        assert done.returncode == 4, command
        assert "srt/server_args.py changed after dynspec patched it" in done.stderr
        assert snapshot(package) == before
    status = run_dynspec("status", "--json", "--sglang", str(package))
    states = {p["id"]: p["state"] for p in json.loads(status.stdout)["patches"]}
    assert states["server_args_dynspec_check"] == "drifted"
    forced = run_dynspec("revert", "--force", "--sglang", str(package))
    assert forced.returncode == 0
    assert "# my local tweak" not in target.read_text()
    assert not (package / ".dynspec").exists()


def test_second_concurrent_run_is_refused(package: Path) -> None:
    before = snapshot(package)
    with txn.Tree(str(package)).locked():
        done = run_dynspec("apply", "--sglang", str(package))
    assert done.returncode == 4
    assert "another dynspec is working on" in done.stderr
    assert snapshot(package) == before


def test_unsupported_version_needs_force(release_tree) -> None:
    # A release newer than any the recipe was verified on: refused, unless --force.
    package = release_tree("0.5.23")
    (package / "_version.py").write_text("__version__ = version = '0.5.99'\n")
    before = snapshot(package)
    done = run_dynspec("apply", "--sglang", str(package))
    assert done.returncode == 4
    assert "SGLang 0.5.99 is not a release recipe 'default' supports" in done.stderr
    assert snapshot(package) == before
    forced = run_dynspec("diff", "--force", "--sglang", str(package))
    assert forced.returncode == 0 and forced.stdout.startswith("diff --git")


def test_unknown_version_asks_for_one(package: Path) -> None:
    (package / "_version.py").unlink()
    (package / "version.py").unlink()
    done = run_dynspec("diff", "--sglang", str(package))
    assert done.returncode == 4 and "pass --sglang-version" in done.stderr
    given = run_dynspec("diff", "--sglang", str(package), "--sglang-version", VERSION)
    assert given.returncode == 0 and given.stdout.startswith("diff --git")


def test_disagreeing_version_sources_are_reported(package: Path) -> None:
    dist_info = package.parent / "sglang-0.5.11.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.11\n")
    done = run_dynspec("status", "--sglang", str(package))
    assert done.returncode == 0
    assert "version sources disagree" in done.stderr and "0.5.11" in done.stderr


def test_damaged_state_exit_code(package: Path) -> None:
    # A corrupt state file is a refusal with its own exit code and a way out, never a traceback.
    state_dir = package / ".dynspec"
    state_dir.mkdir()
    (state_dir / "state.json").write_text("{not json")
    done = run_dynspec("status", "--sglang", str(package))
    assert done.returncode == 10, done.stderr
    assert "state.json is damaged: it is not valid JSON" in done.stderr
    assert "pip install --force-reinstall --no-deps sglang==0.5.12" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_bug_exits_123(package: Path, tmp_path: Path) -> None:
    # A patch that raises a plain exception is a dynspec bug: traceback, a sentence, exit 123.
    script = tmp_path / "buggy.py"
    script.write_text(
        "import sys\n"
        "from patcher import engine\n"
        "def boom(*a, **k):\n    raise KeyError('boom')\n"
        "engine.plan = boom\n"
        "from patcher.cli import run\n"
        f"sys.argv = ['dynspec', 'diff', '--sglang', {str(package)!r}]\n"
        "run()\n"
    )
    done = subprocess.run([os.sys.executable, str(script)], capture_output=True, text=True)
    assert done.returncode == 123
    assert "KeyError" in done.stderr and "this is a bug in dynspec" in done.stderr


def test_every_exit_code_is_in_the_readme_and_in_help() -> None:
    from patcher.cli import EXIT_CODES
    from patcher.errors import ExitCode
    from tests.conftest import ROOT

    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("### Exit codes") : readme.index("### Safety")]
    for code in ExitCode:
        assert f"\n| {int(code)} |" in table, f"README's exit-code table lacks {int(code)} ({code.name})"
        in_help = f"  {int(code)} " in EXIT_CODES or int(code) in range(5, 10) and "5-9" in EXIT_CODES
        assert in_help, f"dynspec --help lacks exit code {int(code)} ({code.name})"
