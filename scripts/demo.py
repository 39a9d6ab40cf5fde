"""The main job on an embedded default: a real SGLang release, patched and restored.

Fetches SGLang VERSION (default 0.5.12) from PyPI into a temp dir, then runs what a user runs:
`dynspec diff`, `dynspec apply`, `dynspec status`, `dynspec revert`, and checks that revert gave
back every byte. One line per step; of the diff, its stat and first hunk (`--full-diff`: all of it).
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

from patcher import releases, render
from patcher.registry import all_patches


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return h.hexdigest()


def step(line: str) -> None:
    print(line, flush=True)


def dynspec(*args: str, capture: bool = False) -> str:
    step(f"\n$ dynspec {' '.join(args)}")
    done = subprocess.run(
        [sys.executable, "-m", "patcher", *args], stdout=subprocess.PIPE if capture else None, text=True
    )
    if done.returncode != 0:
        sys.exit(f"dynspec {args[0]} exited with {done.returncode}")
    return done.stdout if capture else ""


def diff_stat(diff: str) -> tuple[list[tuple[str, int, int]], int]:
    """Per file (path, lines added, lines removed), as `git diff --stat` counts them; and the hunks."""
    files: list[tuple[str, int, int]] = []
    hunks = 0
    in_hunk = False  # a "+++ " line is a header only before a file's first hunk
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            files.append((line.split(" b/", 1)[1], 0, 0))
            in_hunk = False
        elif line.startswith("@@ "):
            hunks += 1
            in_hunk = True
        elif in_hunk and line[:1] in ("+", "-"):
            path, added, removed = files[-1]
            files[-1] = (path, added + (line[0] == "+"), removed + (line[0] == "-"))
    return files, hunks


def stat_lines(files: list[tuple[str, int, int]], bar: int = 40) -> list[str]:
    """`git diff --stat`'s lines: a bar per file, scaled to the largest, and the total."""
    width = max(len(path) for path, _, _ in files)
    digits = max(len(str(a + r)) for _, a, r in files)
    largest = max(a + r for _, a, r in files)
    lines = []
    for path, added, removed in files:
        scale = min(1.0, bar / largest)
        plus, minus = round(added * scale) or (added > 0), round(removed * scale) or (removed > 0)
        lines.append(f" {path.ljust(width)} | {str(added + removed).rjust(digits)} {'+' * plus}{'-' * minus}")
    added, removed = sum(a for _, a, _ in files), sum(r for _, _, r in files)
    total = (
        f" {len(files)} file{'s' if len(files) != 1 else ''} changed, {added} insertion{'s' if added != 1 else ''}(+)"
    )
    if removed:
        total += f", {removed} deletion{'s' if removed != 1 else ''}(-)"
    return [*lines, total]


def first_hunk(diff: str) -> str:
    """The diff's first file header and first hunk: what the patch series starts with."""
    lines = diff.splitlines(keepends=True)
    hunks = [i for i, line in enumerate(lines) if line.startswith(("@@ ", "diff --git "))]
    start = next(i for i in hunks if lines[i].startswith("@@ "))
    end = next((i for i in hunks if i > start), len(lines))
    return "".join(lines[:end])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", nargs="?", default="0.5.12")
    parser.add_argument("--full-diff", action="store_true", help="print the whole diff, not its stat and first hunk")
    options = parser.parse_args()
    version = options.version
    targets = sorted({p.TARGET for p in all_patches().values()})
    with tempfile.TemporaryDirectory(prefix="dynspec-demo-") as scratch:
        if releases.cached_wheel(version) is None:
            step(f"downloading SGLang {version} from PyPI into {releases.cache_dir() / 'wheels'}")
        else:
            step(f"SGLang {version}: the wheel is in {releases.cache_dir() / 'wheels'} already")
        try:
            package = releases.copy_tree(version, targets, Path(scratch) / "site-packages")
        except RuntimeError as error:  # no such release, or PyPI unreachable
            sys.exit(f"make run: {error}")
        step(f"unpacked its version files and the files dynspec patches into {package}")
        before = digest(package)
        if options.full_diff:
            dynspec("diff", "--no-pager", "--sglang", str(package))
        else:
            diff = dynspec("diff", "--sglang", str(package), capture=True)
            files, hunks = diff_stat(diff)
            print("\n".join(stat_lines(files)) + "\n")
            hunk = first_hunk(diff)
            sys.stdout.write(render.color_diff(hunk) if render.wants_color("auto", sys.stdout) else hunk)
            step(f"... the first of {hunks} hunks; `make run FULL_DIFF=1` prints the whole diff")
        dynspec("apply", "--sglang", str(package))
        dynspec("status", "--sglang", str(package))
        dynspec("apply", "--sglang", str(package))
        dynspec("revert", "--sglang", str(package))
        if digest(package) != before:
            sys.exit("revert did not restore the original bytes")
        step(f"\nSGLang {version}: patched, checked and restored byte for byte.")


if __name__ == "__main__":
    main()
