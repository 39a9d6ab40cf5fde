"""The main job on an embedded default: a real SGLang release, patched and restored.

Fetches SGLang VERSION (default 0.5.12) from PyPI into a temp dir, then runs what a user runs:
`dynspec diff`, `dynspec apply`, `dynspec status`, `dynspec revert`, and checks that revert gave
back every byte.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

from patcher import releases
from patcher.registry import all_patches


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return h.hexdigest()


def dynspec(*args: str) -> None:
    print(f"\n$ dynspec {' '.join(args)}", flush=True)
    done = subprocess.run([sys.executable, "-m", "patcher", *args])
    if done.returncode != 0:
        sys.exit(f"dynspec {args[0]} exited with {done.returncode}")


def main() -> None:
    version = sys.argv[1] if len(sys.argv) > 1 else "0.5.12"
    targets = sorted({p.TARGET for p in all_patches().values()})
    with tempfile.TemporaryDirectory(prefix="dynspec-demo-") as scratch:
        print(f"fetching SGLang {version} from PyPI (cached in {releases.cache_dir()}) ...", flush=True)
        try:
            package = releases.copy_tree(version, targets, Path(scratch) / "site-packages")
        except RuntimeError as error:  # no such release, or PyPI unreachable
            sys.exit(f"make run: {error}")
        before = digest(package)
        dynspec("diff", "--sglang", str(package))
        dynspec("apply", "--sglang", str(package))
        dynspec("status", "--sglang", str(package))
        dynspec("apply", "--sglang", str(package))
        dynspec("revert", "--sglang", str(package))
        if digest(package) != before:
            sys.exit("revert did not restore the original bytes")
        print(f"\nSGLang {version}: patched, checked and restored byte for byte.")


if __name__ == "__main__":
    main()
