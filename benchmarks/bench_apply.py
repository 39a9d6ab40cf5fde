"""Benchmarks for issue 2 (prints numbers; nothing here is a pass/fail test).

1. Wall time of `dynspec apply` on a fresh SGLang 0.5.12 tree, process start to exit, with cold and
   warm dynspec caches (checked results; target: <= 1.5 s on a 2-core machine).
2. Wall time of the whole static round trip (apply, re-apply, status, revert, byte compare) over
   every release in tests/releases.txt, releases in parallel, download cache warm (target: <= 30 s).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from patcher import releases
from patcher.registry import all_patches

ROOT = Path(__file__).resolve().parent.parent
RELEASES = [v for v in (ROOT / "tests" / "releases.txt").read_text().splitlines() if v and not v.startswith("#")]
TARGETS = sorted({p.TARGET for p in all_patches().values()})


def timed_apply(version: str, cache: str) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        package = releases.copy_tree(version, TARGETS, Path(scratch))
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "patcher", "apply", "--sglang", str(package)],
            check=True,
            capture_output=True,
            env={**os.environ, "DYNSPEC_CACHE": cache},
        )
        return time.perf_counter() - start


def round_trip(version: str) -> tuple[str, float, int]:
    from patcher.session import Session
    from tests.conftest import snapshot

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        package = releases.copy_tree(version, TARGETS, Path(scratch))
        before = snapshot(package)
        written = len(Session.open(str(package)).apply().pending)
        assert not Session.open(str(package)).apply().pending
        Session.open(str(package)).status()
        Session.open(str(package)).revert()
        assert snapshot(package) == before
    return version, time.perf_counter() - start, written


def main() -> None:
    for version in RELEASES:  # warm the download cache first; downloads are not what is measured
        releases.unpacked(version, TARGETS)
    warm_cache = str(releases.cache_dir())
    cold = []
    for _ in range(3):
        scratch_cache = tempfile.mkdtemp()
        cold.append(timed_apply("0.5.12", scratch_cache))
        shutil.rmtree(scratch_cache)
    timed_apply("0.5.12", warm_cache)
    warm = [timed_apply("0.5.12", warm_cache) for _ in range(5)]
    print(
        f"dynspec apply, SGLang 0.5.12, cold dynspec caches: median {statistics.median(cold):.2f} s (min {min(cold):.2f})"
    )
    print(
        f"dynspec apply, SGLang 0.5.12, warm dynspec caches: median {statistics.median(warm):.2f} s (min {min(warm):.2f})"
    )

    workers = os.cpu_count() or 2
    for label in ("cold dynspec caches", "warm dynspec caches"):
        if label.startswith("cold"):  # downloads stay cached; parses and checked results do not
            for cached in [releases.cache_dir() / "results"]:
                shutil.rmtree(cached, ignore_errors=True)
        start = time.perf_counter()
        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(round_trip, RELEASES))
        total = time.perf_counter() - start
        slowest = max(results, key=lambda r: r[1])
        print(
            f"static round trip, {len(results)} releases, {workers} processes, {label}: {total:.1f} s wall "
            f"(slowest {slowest[0]} {slowest[1]:.1f} s; {sum(r[2] for r in results)} files patched in all)"
        )


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
