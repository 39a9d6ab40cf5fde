#!/bin/bash
# scripts/gpu-prepare.sh VERSION: everything an H200 proof run of SGLang VERSION needs, under the
# git-ignored .gpu/: the two kit parts (../shared/gpu/build-kit.sh; only 0.5.11 - 0.5.17 run there)
# and .gpu/patched-VERSION/sglang/..., the files dynspec's default recipe writes into that release.
# Then, on the device (call 2 within ~30 s of call 1, which keeps /tmp):
#   call 1, carry .gpu/kit-V-a.tar.xz:  mkdir -p /tmp/site && tar -xJf .gpu/kit-V-a.tar.xz -C /tmp/site
#   call 2, carry .gpu/kit-V-b.tar.xz and .gpu/patched-V:
#     tar -xJf .gpu/kit-V-b.tar.xz -C /tmp/site && cp -r .gpu/patched-V/sglang/. /tmp/site/sglang/ &&
#     PYTHONPATH=/tmp/site:$PWD python3 -m patcher proof --sglang auto --path v2 --out $OUT/proof
# Also .gpu/kit-V.tar.xz, the kit in one part, where it fits one call with .gpu/patched-V and the
# working tree: both parts less what a server never loads (xgrammar's static library, the diffusion
# runtime, the native gRPC server), at xz -9e (~2 min). A call that carries it and .gpu/patched-V
# needs no earlier kit-a, so a machine that went back costs its start and nothing else
# (scripts/h200-runs.sh's steps take either).
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
# The one-part kit, kept only where it fits one call (64 MiB) with the patched files and the tree.
one=".gpu/kit-$V.tar.xz"
if ! [ "$one" -nt ".gpu/kit-$V-a.tar.xz" ] || ! [ "$one" -nt ".gpu/kit-$V-b.tar.xz" ]; then  # missing or older than a part
  site=$(mktemp -d)
  tar -xJf ".gpu/kit-$V-a.tar.xz" -C "$site" && tar -xJf ".gpu/kit-$V-b.tar.xz" -C "$site"
  (cd "$site" && tar -cf - --exclude=./xgrammar/lib --exclude=./sglang/multimodal_gen \
    --exclude='./sglang/srt/grpc/_core*.so' . | xz -T0 -9e) > "$one.tmp" && mv "$one.tmp" "$one"
  rm -rf "$site" "$one.tmp"
fi
# A packing that failed or was stopped leaves no one-part kit: the two parts still serve.
[ -f "$one" ] || { echo "one-part kit: not made; use kit-a and part b"; exit 0; }
# (a tracked file deleted in the work tree does not travel: du's complaint about it is not an error here)
tree=$( (git ls-files -z | xargs -0 du -cb 2>/dev/null || true) | tail -1 | cut -f1)
total=$(( $(stat -c %s "$one") + $(du -sb ".gpu/patched-$V" | cut -f1) + tree ))
if [ "$total" -le $(( 64 * 1024 * 1024 - 512 * 1024 )) ]; then
  echo "one-part kit: $one ($(( total / 1024 / 1024 )) MiB with .gpu/patched-$V and the tree): one call, no kit-a"
else
  echo "one-part kit: $(( total / 1024 / 1024 )) MiB with the tree is over a call's 64 MiB; use kit-a and part b"
  rm -f "$one"
fi
