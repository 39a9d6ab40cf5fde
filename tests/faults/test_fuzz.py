"""Fuzzed variants of real SGLang target files: renamed and deleted anchors, syntax errors, encodings,
huge and deeply nested files, non-regular files and links.

Each variant is one real release's tree with one target changed, and goes through status, diff,
apply, apply again and revert, in the console entry point. Whatever the variant, every command
exits with a documented code (never 123), a refusal is one line and changes nothing, an apply that
succeeds is a no-op the second time and its revert gives back every byte, nothing outside the tree
changes, and no code from the tree runs. ``make test`` runs a sample; ``make fuzz`` runs all.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import random
import re
import shutil
import socket
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from patcher import engine, releases, txn
from patcher.registry import all_patches
from tests.conftest import targets
from tests.faults.harness import FULL, KNOWN_EXIT_CODES, Run, difference, picture, sample

RELEASES = ("0.5.12", "0.5.17", "0.5.23")
SEEDS = 4
SAMPLED = 120
ANCHOR_WORDS_LEFT_OUT = {"self", "batch", "import", "if", "else", "calls", "sets", "and", "one", "branch", "calling",
                         "decode", "assigns", "registers", "states", "A", "add_argument", "on_publish", "speculative"}  # fmt: skip


@dataclass(frozen=True)
class Variant:
    version: str
    target: str
    mutation: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.version}:{self.target}:{self.mutation}:{self.seed}"


# -- mutations of a file's bytes ---------------------------------------------------------------


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True) or [b""]


def _anchor_words(version: str, target: str) -> list[str]:
    words: set[str] = set()
    for patch in all_patches().values():
        if target == patch.TARGET and patch.applies_to(version):
            for name in getattr(patch, "ANCHORS", {}):
                words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]+", name))
    return sorted(words - ANCHOR_WORDS_LEFT_OUT)


def _some_anchor(data: bytes, words: list[str], rng: random.Random) -> tuple[str, list[re.Match[bytes]]]:
    present = [w for w in words if re.search(rb"\b%s\b" % w.encode(), data)]
    word = rng.choice(present or ["ServerArgs"])
    return word, list(re.finditer(rb"\b%s\b" % word.encode(), data))


def rename_one(data: bytes, words: list[str], rng: random.Random) -> bytes:
    word, found = _some_anchor(data, words, rng)
    if not found:
        return data + b"\n"
    hit = rng.choice(found)
    return data[: hit.start()] + word.encode() + b"_renamed" + data[hit.end() :]


def rename_all(data: bytes, words: list[str], rng: random.Random) -> bytes:
    word, _ = _some_anchor(data, words, rng)
    return re.sub(rb"\b%s\b" % word.encode(), word.encode() + b"_gone", data)


def homoglyph(data: bytes, words: list[str], rng: random.Random) -> bytes:
    word, _ = _some_anchor(data, words, rng)
    look_alike = word.replace("a", "\u0430", 1).replace("e", "\u0435", 1).encode()  # Cyrillic a, e
    return re.sub(rb"\b%s\b" % word.encode(), look_alike, data)


def delete_anchor_line(data: bytes, words: list[str], rng: random.Random) -> bytes:
    _, found = _some_anchor(data, words, rng)
    if not found:
        return data
    at = rng.choice(found).start()
    start, end = data.rfind(b"\n", 0, at) + 1, data.find(b"\n", at)
    return data[:start] + data[(len(data) if end < 0 else end + 1) :]


def delete_lines(data: bytes, words: list[str], rng: random.Random) -> bytes:
    lines = _lines(data)
    at = rng.randrange(len(lines))
    return b"".join(lines[:at] + lines[at + rng.randint(1, 30) :])


def duplicate_lines(data: bytes, words: list[str], rng: random.Random) -> bytes:
    lines = _lines(data)
    at = rng.randrange(len(lines))
    return b"".join(lines[: at + 5] + lines[at : at + 5] + lines[at + 5 :])


def swap_lines(data: bytes, words: list[str], rng: random.Random) -> bytes:
    lines = _lines(data)
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    lines[i], lines[j] = lines[j], lines[i]
    return b"".join(lines)


def syntax_error(data: bytes, words: list[str], rng: random.Random) -> bytes:
    lines = _lines(data)
    broken = rng.choice(
        [b"def (:\n", b")\n", b"class\n", b"    return )\n", b"if x\n", b"@\n", b"lambda:\n", b"x = = 1\n"]
    )
    lines.insert(rng.randrange(len(lines) + 1), broken)
    return b"".join(lines)


def indent_one_line(data: bytes, words: list[str], rng: random.Random) -> bytes:
    lines = _lines(data)
    at = rng.randrange(len(lines))
    lines[at] = b" " + lines[at]
    return b"".join(lines)


def tabs(data: bytes, words: list[str], rng: random.Random) -> bytes:
    lines = _lines(data)
    for at in rng.sample(range(len(lines)), min(5, len(lines))):
        lines[at] = re.sub(rb"^    ", b"\t", lines[at])
    return b"".join(lines)


def second_class(data: bytes, words: list[str], rng: random.Random) -> bytes:
    classes = [w for w in words if w[:1].isupper() and re.search(rb"^class %s\b" % w.encode(), data, re.M)]
    name = rng.choice(classes or ["ServerArgs"])
    body = b"    pass\n" if rng.random() < 0.5 else b"    def check_server_args(self):\n        pass\n"
    return data + b"\n\nclass " + name.encode() + b":\n" + body


def truncate(data: bytes, words: list[str], rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def flip_bytes(data: bytes, words: list[str], rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        at = rng.randrange(len(out))
        out[at] ^= 1 << rng.randrange(8)
    return bytes(out)


def latin1(data: bytes, words: list[str], rng: random.Random) -> bytes:
    return data.decode().replace("\n", "\n# caf\u00e9\n", 1).encode("latin-1", errors="replace")


def utf16(data: bytes, words: list[str], rng: random.Random) -> bytes:
    return data.decode().encode("utf-16")


def bom(data: bytes, words: list[str], rng: random.Random) -> bytes:
    return b"\xef\xbb\xbf" + data


def crlf(data: bytes, words: list[str], rng: random.Random) -> bytes:
    return data.replace(b"\n", b"\r\n")


def cr_only(data: bytes, words: list[str], rng: random.Random) -> bytes:
    return data.replace(b"\n", b"\r")


def nul_byte(data: bytes, words: list[str], rng: random.Random) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + b"\0" + data[at:]


def invalid_utf8(data: bytes, words: list[str], rng: random.Random) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + b"\xff\xfe" + data[at:]


def no_final_newline(data: bytes, words: list[str], rng: random.Random) -> bytes:
    return data.rstrip(b"\n")


def empty(data: bytes, words: list[str], rng: random.Random) -> bytes:
    return b""


def deep_expression(data: bytes, words: list[str], rng: random.Random) -> bytes:
    return data + b"\nx = " + b" + ".join([b"1"] * rng.randint(2000, 8000)) + b"\n"


def deep_parentheses(data: bytes, words: list[str], rng: random.Random) -> bytes:
    depth = rng.randint(100, 1000)
    return data + b"\nx = " + b"(" * depth + b"1" + b")" * depth + b"\n"


def long_or_chain(data: bytes, words: list[str], rng: random.Random) -> bytes:
    return data + b"\nx = " + b" or ".join([b"a"] * rng.randint(2000, 30000)) + b"\n"


def adjacent_strings(data: bytes, words: list[str], rng: random.Random) -> bytes:
    return data + b"\nx = (\n" + b"\n".join([b'"s"'] * rng.randint(2000, 12000)) + b"\n)\n"


def huge(data: bytes, words: list[str], rng: random.Random) -> bytes:
    return data * (txn.MAX_FILE_BYTES // max(len(data), 1) + 1)


def code_on_import(data: bytes, words: list[str], rng: random.Random) -> bytes:
    return b"import os\nos.system('touch MARKER')\n" + data


BYTE_MUTATIONS: dict[str, Callable[[bytes, list[str], random.Random], bytes]] = {
    f.__name__: f
    for f in (
        rename_one,
        rename_all,
        homoglyph,
        delete_anchor_line,
        delete_lines,
        duplicate_lines,
        swap_lines,
        syntax_error,
        indent_one_line,
        tabs,
        second_class,
        truncate,
        flip_bytes,
        latin1,
        utf16,
        bom,
        crlf,
        cr_only,
        nul_byte,
        invalid_utf8,
        no_final_newline,
        empty,
        deep_expression,
        deep_parentheses,
        long_or_chain,
        adjacent_strings,
        huge,
        code_on_import,
    )  # fmt: skip
}


# -- mutations of what the file is -------------------------------------------------------------


def missing(path: Path, outside: Path) -> None:
    path.unlink()


def directory(path: Path, outside: Path) -> None:
    path.unlink()
    path.mkdir()


def fifo(path: Path, outside: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def unix_socket(path: Path, outside: Path) -> None:
    path.unlink()
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))


def link_out(path: Path, outside: Path) -> None:
    copy = outside / path.name
    shutil.move(path, copy)
    path.symlink_to(copy)


def hard_link_out(path: Path, outside: Path) -> None:
    copy = outside / path.name
    shutil.move(path, copy)
    os.link(copy, path)


def link_inside(path: Path, outside: Path) -> None:
    path.rename(path.with_name("real_" + path.name))
    path.symlink_to("real_" + path.name)


def dangling_link(path: Path, outside: Path) -> None:
    path.unlink()
    path.symlink_to("nowhere.py")


def link_loop(path: Path, outside: Path) -> None:
    path.unlink()
    path.symlink_to(path.name + ".b")
    path.with_name(path.name + ".b").symlink_to(path.name)


def parent_links_out(path: Path, outside: Path) -> None:
    shutil.move(path.parent, outside / path.parent.name)
    path.parent.symlink_to(outside / path.parent.name)


PATH_MUTATIONS: dict[str, Callable[[Path, Path], None]] = {
    f.__name__: f
    for f in (
        missing,
        directory,
        fifo,
        unix_socket,
        link_out,
        hard_link_out,
        link_inside,
        dangling_link,
        link_loop,
        parent_links_out,
    )  # fmt: skip
}


def variants() -> list[Variant]:
    found = []
    for version in RELEASES:
        tree = releases.unpacked(version, targets()) / "sglang"
        for target in sorted(engine.targets_in_order(p for p in all_patches().values() if p.applies_to(version))):
            if not (tree / target).is_file():
                continue  # a file dynspec adds
            for mutation in [*BYTE_MUTATIONS, *PATH_MUTATIONS]:
                if mutation == "parent_links_out" and "/" not in target.removeprefix("srt/"):
                    continue  # srt/ itself: the tree would not be an SGLang tree any more
                found.extend(Variant(version, target, mutation, seed) for seed in range(SEEDS))
    return found


# -- one variant, through the console entry point -----------------------------------------------


def run_cli(*args: str) -> Run:
    import patcher.cli

    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["dynspec", *args]
    code: object = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            patcher.cli.run()
        except SystemExit as done:
            code = done.code
    return Run(code if isinstance(code, int) else 1, out.getvalue(), err.getvalue())


def problems_of(variant: Variant, scratch: Path) -> tuple[list[str], list[int]]:
    """What is wrong with dynspec on this variant (nothing, one hopes), and the exit codes it gave."""
    shutil.rmtree(scratch, ignore_errors=True)
    package = releases.copy_tree(variant.version, targets(), scratch / "site")
    outside = scratch / "outside"
    outside.mkdir()
    (outside / "victim.py").write_text("untouched = True\n")
    path = package / variant.target
    rng = random.Random(variant.name)
    if variant.mutation in BYTE_MUTATIONS:
        path.write_bytes(
            BYTE_MUTATIONS[variant.mutation](path.read_bytes(), _anchor_words(variant.version, variant.target), rng)
        )
    else:
        PATH_MUTATIONS[variant.mutation](path, outside)
    start, outside_start = picture(package), picture(outside)
    problems: list[str] = []
    codes: list[int] = []

    def run(*args: str, changes: bool = False) -> Run:
        before = picture(package)
        done = run_cli(*args, "--sglang", str(package))
        codes.append(done.code)
        where = f"{' '.join(args)} exited {done.code}"
        if done.code not in KNOWN_EXIT_CODES or "Traceback" in done.err:
            problems.append(f"{where}: {done.err.strip()[-600:]}")
        elif done.code not in (0, 1) and not (len(done.lines) >= 1 and done.lines[-1].startswith("dynspec: error: ")
                                                and sum(line.startswith("dynspec: error: ") for line in done.lines) == 1):  # fmt: skip
            problems.append(f"{where} without a one-line error: {done.err!r}")
        if (not changes or done.code != 0) and picture(package) != before:
            problems.append(f"{where} changed the tree: {difference(before, picture(package))}")
        if picture(outside) != outside_start:
            problems.append(f"{where} changed a file outside the tree")
        return done

    status = run("status")
    run("diff")
    applied = run("apply", changes=True)
    if applied.code == 0:
        again = run("apply")
        if again.code != 0 or "already applied" not in again.err:
            problems.append(f"a second apply was not a no-op: {again.err!r}")
        reverted = run("revert", changes=True)
        if reverted.code != 0 or picture(package) != start:
            problems.append(f"revert did not give back the tree: {difference(start, picture(package))}")
    else:
        reverted = run("revert")  # nothing to revert, unless the tree is refused as a whole
        if reverted.code not in (0, status.code) or picture(package) != start:
            problems.append(f"revert after a refused apply: {reverted.err!r}")
    if Path("MARKER").exists() or (package / "MARKER").exists():
        problems.append("code from the tree ran")
    return [f"{variant.name}: {p}" for p in problems], codes


def run_all(chosen: list[Variant], workers: int) -> tuple[list[str], Counter[int]]:
    """Every variant, split over ``workers`` forked processes; returns the problems and exit codes."""
    slices = [chosen[i::workers] for i in range(workers)]
    with tempfile.TemporaryDirectory(prefix="dynspec-fuzz-") as scratch:
        pids = []
        for i, part in enumerate(slices):
            report = Path(scratch, f"report-{i}.json")
            pid = os.fork()
            if pid == 0:
                status = 1
                try:
                    # Not the user's cache: a thousand variants would leave a thousand results there.
                    engine._result_cache_dir = functools.partial(Path, scratch, f"results-{i}")  # type: ignore[assignment]
                    os.chdir(scratch)  # a MARKER from the tree's code would land here
                    found: list[str] = []
                    codes: list[int] = []
                    for variant in part:
                        Path(scratch, f"current-{i}").write_text(variant.name)  # named if the worker dies
                        problems, got = problems_of(variant, Path(scratch, f"tree-{i}"))
                        found += problems
                        codes += got
                    report.write_text(json.dumps({"problems": found, "codes": codes, "ran": len(part)}))
                    status = 0
                finally:
                    os._exit(status)
            pids.append(pid)
        problems: list[str] = []
        codes: Counter[int] = Counter()
        ran = 0
        for i, pid in enumerate(pids):
            _, status = os.waitpid(pid, 0)
            assert status == 0, f"fuzz worker {i} died ({status}) on {Path(scratch, f'current-{i}').read_text()}"
            report = json.loads(Path(scratch, f"report-{i}.json").read_text())
            problems += report["problems"]
            codes.update(report["codes"])
            ran += report["ran"]
        assert not Path(scratch, "MARKER").exists(), "code from a tree ran"
    assert ran == len(chosen)
    return problems, codes


def test_fuzzed_targets_are_refused_in_one_line_or_patched_and_reverted() -> None:
    every = variants()
    assert len(every) >= 1000, len(every)
    chosen = sample(every, SAMPLED, seed="fuzz")
    problems, codes = run_all(chosen, workers=os.cpu_count() or 1)
    assert not problems, "\n".join(problems[:20])
    assert 123 not in codes
    # The variants reach both sides: some are patched and reverted, some refused as drift or bad input.
    assert codes[0] and codes[3] + codes[4] > 0, codes
    if FULL:
        print(f"\n{len(chosen)} fuzzed variants, exit codes {dict(sorted(codes.items()))}")
