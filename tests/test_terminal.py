"""dynspec on a terminal: colour, pager, table layout, spinner; through pseudo-terminals and tmux.

Piped, every command prints what it printed before (tests/test_cli.py); here stdout and stderr are
terminals of a chosen size, and tmux screenshots (tests/screens/, DYNSPEC_UPDATE_SCREENS=1
re-records them) show what a person sees at 80 and 160 columns.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from patcher.registry import all_patches
from patcher.render import ANSI_ESCAPE, color_diff, screen_rows
from patches.server_args_dynspec_flags_legacy import ServerArgsDynspecFlagsLegacy
from tests.conftest import ROOT, run_dynspec
from tests.terminal import Tmux, fixed_length_dir, needs_tmux, on_pty, same_place, terminal_env

VERSION = "0.5.12"
SCREENS = ROOT / "tests" / "screens"
IDS = sorted(all_patches())


def mask_revisions(screen: str) -> str:
    """Patch revisions as ``r#`` padded to their own width, so a screen stays put when one is bumped."""
    masked = re.sub(r"\br[0-9]+\b", lambda m: "r#".ljust(len(m.group())), screen)
    return "\n".join(line.rstrip() for line in masked.split("\n"))  # a screen's lines end at their text


@pytest.fixture
def package(release_tree) -> Path:
    return release_tree(VERSION)


def plain(text: str) -> str:
    return ANSI_ESCAPE.sub("", text)


# -- diff: colour ------------------------------------------------------------------------------


def test_diff_on_a_terminal_is_in_gits_colours_and_the_same_bytes_without_them(package: Path) -> None:
    piped = run_dynspec("diff", "--sglang", str(package)).stdout
    seen = on_pty("diff", "--no-pager", "--sglang", str(package))
    assert seen.returncode == 0, seen.stderr
    assert "\x1b[1mdiff --git a/srt/server_args.py b/srt/server_args.py\x1b[m\n" in seen.stdout
    assert "\x1b[36m@@ -583,6 +583,10 @@\x1b[m\n" in seen.stdout
    marker = f"# dynspec: server_args_dynspec_flags_legacy r{ServerArgsDynspecFlagsLegacy.REVISION}"
    assert f"\x1b[32m+    {marker}\x1b[m\n" in seen.stdout
    assert plain(seen.stdout) == piped
    assert seen.stderr == ""


@pytest.mark.parametrize(
    ("args", "env"),
    [([], {"NO_COLOR": "1"}), (["--color=never"], {}), ([], {"TERM": "dumb"})],
    ids=["NO_COLOR", "color-never", "TERM-dumb"],
)
def test_no_colour_on_a_terminal_when_asked(package: Path, args: list[str], env: dict[str, str]) -> None:
    piped = run_dynspec("diff", "--sglang", str(package)).stdout
    seen = on_pty("diff", "--no-pager", *args, "--sglang", str(package), env=terminal_env(**env))
    assert seen.stdout == piped


def test_color_always_colours_a_pipe_too(package: Path) -> None:
    piped = run_dynspec("diff", "--sglang", str(package)).stdout
    coloured = run_dynspec("diff", "--color=always", "--sglang", str(package)).stdout
    assert coloured == color_diff(piped) != piped
    assert run_dynspec("diff", "--color=auto", "--sglang", str(package)).stdout == piped


def test_color_diff_keeps_the_text_of_every_kind_of_line() -> None:
    text = (
        "diff --git a/x.py b/x.py\nnew file mode 100644\n--- /dev/null\n+++ b/x.py\n@@ -0,0 +1,2 @@ def f():\n"
        "+--- not a header\n-removed\n context\n\\ No newline at end of file\n"
    )
    coloured = color_diff(text)
    assert plain(coloured) == text
    assert "\x1b[32m+--- not a header\x1b[m" in coloured and "\x1b[31m-removed\x1b[m" in coloured
    assert "\x1b[36m@@ -0,0 +1,2 @@\x1b[m def f():" in coloured
    assert "\x1b[1m--- /dev/null\x1b[m" in coloured


# -- diff: pager -------------------------------------------------------------------------------


def test_a_diff_longer_than_the_screen_goes_through_the_pager(package: Path, tmp_path: Path) -> None:
    paged = tmp_path / "paged"
    piped = run_dynspec("diff", "--sglang", str(package)).stdout
    seen = on_pty("diff", "--sglang", str(package), env=terminal_env(PAGER=f"cat > {paged}"))
    assert seen.returncode == 0
    assert seen.stdout == "", "the pager, not dynspec, writes to the terminal"
    assert paged.read_text() == color_diff(piped)


@pytest.mark.parametrize("why", ["--no-pager", "piped", "PAGER=cat", "PAGER empty"])
def test_no_pager(package: Path, tmp_path: Path, why: str) -> None:
    paged = tmp_path / "paged"
    pager = {"PAGER=cat": "cat", "PAGER empty": ""}.get(why, f"cat > {paged}")
    args = ["--no-pager"] if why == "--no-pager" else []
    seen = on_pty("diff", *args, "--sglang", str(package), env=terminal_env(PAGER=pager), stdout_pty=why != "piped")
    assert seen.returncode == 0
    assert not paged.exists()
    assert plain(seen.stdout) == run_dynspec("diff", "--sglang", str(package)).stdout


def test_only_a_diff_longer_than_the_screen_is_paged(package: Path, tmp_path: Path) -> None:
    paged = tmp_path / "paged"
    rows = screen_rows(run_dynspec("diff", "--sglang", str(package)).stdout, 80)
    env = terminal_env(PAGER=f"cat > {paged}")
    fits = on_pty("diff", "--sglang", str(package), columns=80, rows=rows + 1, env=env)
    assert not paged.exists() and fits.stdout, "one row is left for the prompt: this fits"
    on_pty("diff", "--sglang", str(package), columns=80, rows=rows, env=env)
    assert paged.exists(), "the prompt would push the first row off the screen"


def test_screen_rows_counts_wrapped_lines() -> None:
    assert screen_rows("a\n" + "b" * 80 + "\n" + "c" * 81 + "\n\n", 80) == 1 + 1 + 2 + 1
    assert screen_rows("\t" * 10 + "\n", 80) == 1 and screen_rows("\t" * 11 + "\n", 80) == 2


# -- tables ------------------------------------------------------------------------------------


def broken_ids(screen: str) -> list[str]:
    """The patch ids that no line of ``screen`` holds whole."""
    return [i for i in IDS if not any(i in line for line in screen.splitlines())]


def test_status_at_80_columns_keeps_every_id_on_one_line_and_fits(package: Path) -> None:
    seen = on_pty("status", "--sglang", str(package), columns=80)
    assert seen.returncode == 0
    screen = plain(seen.stdout)
    assert broken_ids(screen) == []
    assert max(len(line) for line in screen.splitlines()) <= 80
    assert "upstream has" in screen, "the detail column is there, folded"


def test_the_id_check_finds_the_ids_the_old_layout_broke(package: Path) -> None:
    # Negative control: the table of 2440456, every column folding, cut server_args_dynspec_flags_legacy at 80.
    report = json.loads(run_dynspec("status", "--json", "--sglang", str(package)).stdout)
    old = Table(title="SGLang 0.5.12", title_justify="left")
    for column in ("patch", "rev", "state", "detail"):
        old.add_column(column, overflow="fold")
    for p in report["patches"]:
        old.add_row(p["id"], f"r{p['revision']}", p["state"], p["detail"])
    console = Console(file=io.StringIO(), width=80)
    console.print(old)
    assert "server_args_dynspec_flags_legacy" in broken_ids(console.file.getvalue())  # type: ignore[attr-defined]


def test_below_100_columns_the_table_is_compact(package: Path) -> None:
    narrow = plain(on_pty("status", "--sglang", str(package), columns=99).stdout)
    wide = plain(on_pty("status", "--sglang", str(package), columns=100).stdout)
    assert "┃" not in narrow and "│" not in narrow
    assert "┃ patch" in wide
    assert broken_ids(narrow) == broken_ids(wide) == []


def test_states_are_coloured_as_git_colours_them(package: Path) -> None:
    def colour_of(state: str, screen: str) -> str:
        found = re.search(rf"(\x1b\[[0-9;]*m){re.escape(state)} *\x1b\[0m", screen)
        assert found, f"{state!r} is not coloured"
        return found.group(1)

    pending = on_pty("status", "--sglang", str(package), columns=160).stdout
    assert colour_of("not applied", pending) == "\x1b[33m"
    assert colour_of("n/a", pending) == "\x1b[2m"
    assert run_dynspec("apply", "--sglang", str(package)).returncode == 0
    assert colour_of("applied", on_pty("status", "--sglang", str(package), columns=160).stdout) == "\x1b[32m"
    target = package / "srt" / "server_args.py"
    target.write_text(target.read_text() + "# a hand edit\n")
    assert colour_of("drifted", on_pty("status", "--sglang", str(package), columns=160).stdout) == "\x1b[1;31m"
    no_colour = on_pty("status", "--sglang", str(package), env=terminal_env(NO_COLOR="1")).stdout
    assert "drifted" in no_colour
    assert not re.search(r"\x1b\[(?:[0-9]+;)*3[0-7](?:;[0-9]+)*m", no_colour), "NO_COLOR: bold and dim only"


# -- spinner -----------------------------------------------------------------------------------


def spinner_env(tmp_path: Path, delay: str) -> dict[str, str]:
    # An empty result cache, so that checking the files takes a while.
    return terminal_env(DYNSPEC_SPINNER_DELAY=delay, DYNSPEC_CACHE=str(tmp_path / "cache"))


def test_a_slow_step_shows_a_spinner_on_stderr_that_erases_itself(package: Path, tmp_path: Path) -> None:
    seen = on_pty("diff", "--no-pager", "--sglang", str(package), env=spinner_env(tmp_path, "0"))
    assert seen.returncode == 0
    assert "SGLang 0.5.12: checking srt/server_args.py" in seen.stderr
    assert seen.stderr.endswith("\x1b[2K"), "the last thing on stderr erases the spinner's line"
    assert plain(seen.stdout) == run_dynspec("diff", "--sglang", str(package)).stdout


def test_no_spinner_for_quick_steps_or_a_pipe(package: Path, tmp_path: Path) -> None:
    quick = on_pty("diff", "--no-pager", "--sglang", str(package), env=spinner_env(tmp_path, "60"))
    assert quick.stderr == ""
    env = spinner_env(tmp_path / "again", "0")
    piped = run_dynspec("diff", "--sglang", str(package), env={**env, "NO_COLOR": "1"})
    assert piped.stderr == ""


# -- screenshots in tmux -----------------------------------------------------------------------


def check_screen(name: str, screen: str) -> None:
    # A patch's revision is data, not layout: a bumped one (r6 to r7) must not re-record every screen.
    screen = mask_revisions(screen)
    path = SCREENS / f"{name}.txt"
    if os.environ.get("DYNSPEC_UPDATE_SCREENS"):
        path.write_text(screen)
    assert screen == path.read_text(), (
        f"{path} differs from the screen (DYNSPEC_UPDATE_SCREENS=1 re-records):\n{screen}"
    )


@pytest.fixture
def fixed_tree(release_tree) -> Iterator[tuple[Path, Path]]:
    """A release at /tmp/dynspec-XXXXXXXX/site-packages/sglang: the same path length everywhere."""
    where = fixed_length_dir()
    try:
        yield where, release_tree(VERSION, where=where / "site-packages")
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def tmux_80_160(request: pytest.FixtureRequest) -> Iterator[Tmux]:
    tmux = Tmux(request.param, 40)
    try:
        yield tmux
    finally:
        tmux.close()


@needs_tmux
@pytest.mark.parametrize("tmux_80_160", [80, 160], indirect=True)
def test_status_screen(tmux_80_160: Tmux, fixed_tree: tuple[Path, Path]) -> None:
    where, package = fixed_tree
    assert run_dynspec("apply", "--sglang", str(package)).returncode == 0
    tmux_80_160.start("status", "--sglang", str(package), env={"DYNSPEC_SPINNER_DELAY": "0"})
    assert tmux_80_160.wait_exit() == 0
    check_screen(f"status-{tmux_80_160.columns}", same_place(tmux_80_160.screen(), where))
    assert "\x1b[32mapplied" in tmux_80_160.colours()


@needs_tmux
@pytest.mark.parametrize("tmux_80_160", [80, 160], indirect=True)
def test_diff_screen_is_the_first_page_of_less(tmux_80_160: Tmux, fixed_tree: tuple[Path, Path]) -> None:
    where, package = fixed_tree
    tmux_80_160.start("diff", "--sglang", str(package), env={"DYNSPEC_SPINNER_DELAY": "0"})
    screen = tmux_80_160.wait_for("\n:\n")  # less's prompt on the last row: it waits for a key
    check_screen(f"diff-{tmux_80_160.columns}", same_place(screen, where))
    assert "\x1b[32m+" in tmux_80_160.colours(), "less -R shows git's colours"
    assert not (tmux_80_160.dir / "rc").exists(), "dynspec waits for its pager"
    tmux_80_160.keys("q")
    assert tmux_80_160.wait_exit() == 0


def test_the_readme_shows_the_status_screen_as_captured() -> None:
    readme = (ROOT / "README.md").read_text()
    shown = readme.split("<!-- screen:status-80 -->\n```\n", 1)[1].split("```", 1)[0]
    assert mask_revisions(shown) == (SCREENS / "status-80.txt").read_text()
