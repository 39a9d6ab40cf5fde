"""Facts about the machine and the SGLang under test, found without importing SGLang.

Importing SGLang would pull in torch and CUDA; all that is needed is its package directory
(``importlib.util.find_spec`` run by the server's interpreter, with the server's environment, so
it finds the same SGLang the servers will import), its version and whether dynspec's flags are
in its ``ServerArgs``. Where the package is and which version it states are ``patcher.treefacts``'
rules, the same as for `dynspec apply`.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from patcher import treefacts
from patcher.proof.errors import ProofUsageError

FLAG_FIELD = "speculative_disable_batch_size"
# Upstream's adaptive mode (0.5.17 has it): the ServerArgs field declaration, not any mention; a
# patched older tree mentions ``speculative_adaptive`` in dynspec's own start-up check.
ADAPTIVE_FIELD = re.compile(r"^\s*speculative_adaptive_config\s*:", re.M)
# Where a release says why it turns adaptive off: 0.5.11's refuses the overlap scheduler (v2)
ADAPTIVE_REASONS = ("srt/speculative/adaptive_spec_params.py", "adaptive_unsupported_reason")
# SGLang's batch-invariant mode: a request's greedy tokens then do not depend on what it is batched with
DETERMINISTIC_FIELD = re.compile(r"^\s*enable_deterministic_inference\s*:", re.M)
# SGLang logs each garbage collection longer than --gc-warning-threshold-secs (every release since
# 0.5.1; 0.4.10.post2 lacks it): a stall of a timed run the report can then name (session 38)
GC_WARNING_FIELD = re.compile(r"^\s*gc_warning_threshold_secs\s*:", re.M)
WORKERS = {"v1": "speculative/eagle_worker.py", "v2": "speculative/eagle_worker_v2.py"}
FIND_SPEC = (
    "import importlib.util, json\n"
    "s = importlib.util.find_spec('sglang')\n"
    "print(json.dumps(list(s.submodule_search_locations or []) if s else None))\n"
)


@dataclass(frozen=True)
class SGLang:
    package: Path  # the directory holding srt/
    version: str
    dynspec_applied: bool
    pythonpath: str | None  # what servers need on PYTHONPATH to import this package, if anything
    adaptive_supported: bool = False  # ServerArgs has --speculative-adaptive(-config)
    adaptive_v1_only: bool = False  # and SGLang turns it off itself under the overlap scheduler (v2)
    deterministic_supported: bool = False  # ServerArgs has --enable-deterministic-inference (0.5.3+)
    gc_warning_supported: bool = False  # ServerArgs has --gc-warning-threshold-secs

    def has_worker(self, path: str) -> bool:
        return (self.package / "srt" / WORKERS[path]).is_file()


def find_spec_dir(python: str, env: Mapping[str, str]) -> Path | None:
    try:
        done = subprocess.run(
            [python, "-c", FIND_SPEC], env=dict(env), capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ProofUsageError(f"cannot run {python}: {error}") from error
    if done.returncode != 0:
        raise ProofUsageError(f"{python} failed to look for sglang: {done.stderr.strip()[-500:]}")
    locations = json.loads(done.stdout.strip().splitlines()[-1])
    try:
        return Path(treefacts.package_among(locations or []))
    except (treefacts.NotATree, treefacts.NothingImportable):
        return None


def _server_args_texts(package: Path) -> list[str]:
    """ServerArgs' source: the monolithic file, or 0.5.20+'s arg_groups."""
    srt = package / "srt"
    files = [srt / "server_args.py", *sorted((srt / "arg_groups").rglob("*.py"))]
    return [f.read_text(errors="replace") for f in files if f.is_file()]


def dynspec_applied(package: Path) -> bool:
    """True when ServerArgs declares dynspec's flag."""
    return any(FLAG_FIELD in text for text in _server_args_texts(package))


# ``Patch.marker()``'s comment, read back without the engine (libcst is not on GPU servers).
MARKER = re.compile(r"^[ \t]*# dynspec: (\w+) r(\d+)[ \t]*$", re.M)


def applied_revisions(package: Path) -> dict[str, int]:
    """Each dynspec patch whose marker is in a file under ``package``'s ``srt``, with the revision
    the marker names (the highest, if several): what the servers under test run, for the report."""
    found: dict[str, int] = {}
    for path in sorted((package / "srt").rglob("*.py")):
        text = path.read_text(errors="replace")
        if "# dynspec: " not in text:
            continue
        for patch_id, revision in MARKER.findall(text):
            found[patch_id] = max(found.get(patch_id, 0), int(revision))
    return dict(sorted(found.items()))


def _declares(package: Path, field: re.Pattern[str]) -> bool:
    """True when ServerArgs declares ``field`` (its declaration, not any mention)."""
    return any(field.search(text) for text in _server_args_texts(package))


def adaptive_supported(package: Path) -> bool:
    """True when ServerArgs declares upstream's ``speculative_adaptive_config`` field."""
    return _declares(package, ADAPTIVE_FIELD)


def adaptive_v1_only(package: Path) -> bool:
    """True when the release's ``adaptive_unsupported_reason`` returns a reason for the overlap
    scheduler (``if not server_args.disable_overlap_schedule: return ...``, 0.5.11): SGLang then
    turns ``--speculative-adaptive`` off on path v2 with a warning, before dynspec's check sees it."""
    path, function = ADAPTIVE_REASONS
    try:
        tree = ast.parse((package / path).read_text(errors="replace"))
    except (OSError, SyntaxError):
        return False
    return any(
        isinstance(node, ast.If)
        and ast.unparse(node.test) == "not server_args.disable_overlap_schedule"
        and isinstance(node.body[-1], ast.Return)
        for top in tree.body
        if isinstance(top, ast.FunctionDef) and top.name == function
        for node in ast.walk(top)
    )


def deterministic_supported(package: Path) -> bool:
    """True when ServerArgs declares ``enable_deterministic_inference`` (batch-invariant kernels)."""
    return _declares(package, DETERMINISTIC_FIELD)


def gc_warning_supported(package: Path) -> bool:
    """True when ServerArgs declares ``gc_warning_threshold_secs``."""
    return _declares(package, GC_WARNING_FIELD)


def locate(sglang: str, python: str, env: Mapping[str, str]) -> SGLang:
    """Resolve ``--sglang``: ``auto`` (what ``python`` imports) or a path to put first on PYTHONPATH."""
    pythonpath = None
    if sglang == "auto":
        package = find_spec_dir(python, env)
        if package is None:
            raise ProofUsageError(
                f"{python} cannot find an SGLang package (with srt/server_args.py); "
                "set PYTHONPATH or pass --sglang PATH"
            )
    else:
        try:
            package = Path(treefacts.locate_path(sglang).package_dir)
        except treefacts.NotATree:
            raise ProofUsageError(f"--sglang {sglang}: no sglang/srt/server_args.py there") from None
        pythonpath = str(package.parent)
        old = env.get("PYTHONPATH")
        seen = find_spec_dir(python, {**env, "PYTHONPATH": f"{pythonpath}{os.pathsep}{old}" if old else pythonpath})
        if seen is None or seen.resolve() != package.resolve():
            raise ProofUsageError(f"--sglang {sglang}: {python} would import sglang from {seen}, not {package}")
    version = treefacts.read_version(str(package)) or "unknown"
    return SGLang(
        package, version, dynspec_applied(package), pythonpath, adaptive_supported(package),
        adaptive_v1_only(package), deterministic_supported(package), gc_warning_supported(package),
    )  # fmt: skip


NO_SMI, SMI_FAILED = "no nvidia-smi", "nvidia-smi failed"


def query_gpus(field: str) -> list[str] | str:
    """One value per GPU of ``nvidia-smi --query-gpu=FIELD`` (without units), or why there is none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return NO_SMI
    try:
        done = subprocess.run(
            [smi, f"--query-gpu={field}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return SMI_FAILED
    values = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return values if done.returncode == 0 and values else SMI_FAILED


def gpu_memory_mib() -> int | None:
    """The smallest GPU's total memory in MiB (an H100 80GB: 81559, an H200: 143771); None where
    nvidia-smi is missing, fails or says something else."""
    sizes = query_gpus("memory.total")
    if isinstance(sizes, str) or not all(s.isdigit() for s in sizes):
        return None
    return min(int(s) for s in sizes)


def gpu_name() -> str:
    """The GPU model(s) as nvidia-smi names them, e.g. ``NVIDIA H200`` or ``2x NVIDIA H200``."""
    names = query_gpus("name")
    if isinstance(names, str):
        return f"unknown ({names})"
    distinct = sorted(set(names))
    return ", ".join(n if names.count(n) == 1 else f"{names.count(n)}x {n}" for n in distinct)
