#!/bin/bash
# scripts/gpu-prepare.sh VERSION: everything an H200 proof run of SGLang VERSION needs, under the
# git-ignored .gpu/: the two kit parts (../shared/gpu/build-kit.sh; only 0.5.11 - 0.5.17 run there)
# and .gpu/patched-VERSION/sglang/..., the files dynspec's default recipe writes into that release.
# Then, on the device (call 2 within ~30 s of call 1, which keeps /tmp):
#   call 1, carry .gpu/kit-V-a.tar.xz:  mkdir -p /tmp/site && tar -xJf .gpu/kit-V-a.tar.xz -C /tmp/site
#   call 2, carry .gpu/kit-V-b.tar.xz and .gpu/patched-V:
#     tar -xJf .gpu/kit-V-b.tar.xz -C /tmp/site && cp -r .gpu/patched-V/sglang/. /tmp/site/sglang/ &&
#     PYTHONPATH=/tmp/site:$PWD python3 -m patcher proof --sglang auto --path v2 --out $OUT/proof
set -euo pipefail
V=${1:?usage: scripts/gpu-prepare.sh VERSION}
cd "$(dirname "$0")/.."
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >> .git/info/exclude
mkdir -p .gpu/kit && cp -r ../shared/gpu/* .gpu/kit/
[ -f ".gpu/kit-$V-a.tar.xz" ] && [ -f ".gpu/kit-$V-b.tar.xz" ] || .gpu/kit/build-kit.sh "$V" .gpu
pristine=$(mktemp -d)
trap 'rm -rf "$pristine"' EXIT
tar -xJf ".gpu/kit-$V-b.tar.xz" -C "$pristine" sglang
.venv/bin/dynspec apply --sglang "$pristine/sglang"
rm -rf ".gpu/patched-$V"
.venv/bin/python - "$pristine/sglang" ".gpu/patched-$V/sglang" <<'PY'
import json, shutil, sys
from pathlib import Path

source, dest = Path(sys.argv[1]), Path(sys.argv[2])
for target in json.loads((source / ".dynspec" / "state.json").read_text())["files"]:
    (dest / target).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source / target, dest / target)
    print(f"  {dest / target}")
PY
du -sh ".gpu/kit-$V-a.tar.xz" ".gpu/kit-$V-b.tar.xz" ".gpu/patched-$V"
