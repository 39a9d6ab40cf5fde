"""Benchmark for issue 6 (prints numbers; nothing here is a pass/fail test).

Wall time of `dynspec matrix` over every release in matrix.json, process start to exit, releases in
parallel (one worker per core), download cache warm (target: <= 30 s on a 2-core machine), once with
an empty result cache (every release checked from scratch) and then with it warm.
CPU time (user + sys of the process and its workers) is printed too: on a shared machine it is the
steadier number, and wall ~= CPU / cores when the machine is otherwise idle.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENTRY = "from patcher.matrix.command import matrix; matrix(prog_name='dynspec matrix')"


def timed_matrix(*args: str) -> tuple[float, float, int]:
    """(wall s, CPU s of the command and its workers, exit code)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", ENTRY, *args], capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode not in (0, 1):
        sys.exit(f"dynspec matrix failed ({done.returncode}):\n{done.stderr}")
    return wall, cpu, done.returncode


def main() -> None:
    from patcher import matrix

    baseline = matrix.load_baseline(matrix.DEFAULT_BASELINE)
    assert baseline is not None, "no matrix.json"
    count, patches = len(baseline["releases"]), len(baseline["patches"])
    timed_matrix()  # warms the download cache; not measured
    from patcher import releases

    shutil.rmtree(releases.cache_dir() / "results", ignore_errors=True)
    wall, cpu, code = timed_matrix()  # every release checked from scratch, downloads cached
    print(
        f"dynspec matrix, {count} releases x {patches} patches, {os.cpu_count()} cores, empty result cache: "
        f"{wall:.1f} s wall, {cpu:.1f} s CPU; exit {code}"
    )
    runs = [timed_matrix() for _ in range(3)]
    walls, cpus = [r[0] for r in runs], [r[1] for r in runs]
    print(
        f"dynspec matrix, {count} releases x {patches} patches, {os.cpu_count()} cores, warm caches: "
        f"median {statistics.median(walls):.1f} s wall (min {min(walls):.1f}), "
        f"{statistics.median(cpus):.1f} s CPU; exit {runs[-1][2]}"
    )


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
