#!/bin/bash
# scripts/gpu-prepare.sh VERSION: everything an H200 proof run of SGLang VERSION needs, under the
# git-ignored .gpu/: the two kit parts (../shared/gpu/build-kit.sh; only 0.5.11 - 0.5.17 run there)
# and .gpu/patched-VERSION/sglang/..., the files dynspec's default recipe writes into that release.
# Then, on the device (call 2 within ~30 s of call 1, which keeps /tmp):
#   call 1, carry .gpu/kit-V-a.tar.xz:  mkdir -p /tmp/site && tar -xJf .gpu/kit-V-a.tar.xz -C /tmp/site
#   call 2, carry .gpu/kit-V-b.tar.xz and .gpu/patched-V:
#     tar -xJf .gpu/kit-V-b.tar.xz -C /tmp/site && cp -r .gpu/patched-V/sglang/. /tmp/site/sglang/ &&
#     PYTHONPATH=/tmp/site:$PWD python3 -m patcher proof --sglang auto --path v2 --out $OUT/proof
# Part b is repacked once without what a server never loads (UNLOADED below), at xz -9e (~2 min).
# Also .gpu/kit-V.tar.xz, the kit in one part, where it fits one call with .gpu/patched-V and the
# working tree: both parts less the same, at xz -9e (~2 min). A call that carries it and
# .gpu/patched-V needs no earlier kit-a, so a machine that went back costs its start and nothing
# else (scripts/h200-runs.sh's steps take either).
set -euo pipefail
V=${1:?usage: scripts/gpu-prepare.sh VERSION}
cd "$(dirname "$0")/.."
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >> .git/info/exclude
mkdir -p .gpu/kit && cp -r ../shared/gpu/* .gpu/kit/
[ -f ".gpu/kit-$V-a.tar.xz" ] && [ -f ".gpu/kit-$V-b.tar.xz" ] || .gpu/kit/build-kit.sh "$V" .gpu
# What a server never loads, left out of part b and of the one-part kit below: xgrammar's static
# library, the diffusion runtime, the native gRPC server, sgl_kernel's InfLLM-V2 attention (29 MB
# from 0.5.16, loaded only when that attention runs: sgl_kernel/infllm_v2/_loader.py, inside its
# kernels' calls), 0.5.17's two Rust extensions, each imported only behind an opt-in switch (the
# embedded server, SGLANG_RUST_SERVER, managers/rust_server.py; Inkling's image processor,
# SGLANG_INKLING_RS_MM_PREPROCESS), and PyCryptodome, which only blobfile's signing for a GCS
# service account imports (blobfile/_gcp.py).
UNLOADED=(--anchored --exclude=xgrammar/lib --exclude=sglang/multimodal_gen --exclude='sglang/srt/grpc/_core*.so'
  --exclude='sgl_kernel/infllm_ops*.so' --exclude='sglang/srt/server/_core*.so'
  --exclude='sglang/srt/multimodal/_core*.so' --exclude=Cryptodome)
# lean_xz DIR: DIR's contents less UNLOADED, at xz -9e (~2 min), members named as build-kit.sh names
# them (sglang/..., not ./sglang/...), so that every reader of one member below and in gpu-fa3.sh
# works on a part however it was packed
lean_xz() { (cd "$1" && tar -cf - "${UNLOADED[@]}" -- $(ls -A) | xz -T0 -9e); }
# Part b without them, once, before anything reads it: 0.5.17's from 48.5 to 34.6 MB, so that the call
# that carries it, the patched files and the tree (16.3 MB in session 46) keeps room to spare.
# (Session 46's stamp, .lean, marked a packing that named its members ./...: this stamp is new, so
# those are packed again.)
lean=".gpu/kit-$V-b.unloaded"  # stamp: part b is repacked
if ! [ "$lean" -nt ".gpu/kit-$V-b.tar.xz" ]; then
  site=$(mktemp -d)
  tar -xJf ".gpu/kit-$V-b.tar.xz" -C "$site"
  lean_xz "$site" > ".gpu/kit-$V-b.tar.xz.tmp" && mv ".gpu/kit-$V-b.tar.xz.tmp" ".gpu/kit-$V-b.tar.xz" && touch "$lean"
  rm -rf "$site" ".gpu/kit-$V-b.tar.xz.tmp"
fi
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
# Part c, only where the release's EAGLE worker needs it: 0.5.15's imports the DSA attention backend
# while it captures the draft's CUDA graphs, and that package imports the CuTe DSL (nvidia-cutlass-dsl,
# a 74 MB wheel the kit leaves out) at module level; 0.5.16 defers it (session 32's first 0.5.15 start
# died there). It fills a call of its own: `kit-c V` unpacks it outside /tmp/site, which kits replace.
dsa="$pristine/sglang/jit_kernel/dsa/__init__.py"
eager=$(.venv/bin/python - "$dsa" <<'PY'
import ast, sys
from pathlib import Path

path = Path(sys.argv[1])


def eager(body):
    """An import of the CuTe DSL module run when the package is: at module level or under if / try."""
    for node in body:
        if isinstance(node, ast.ImportFrom) and node.module == "cutedsl_paged_mqa_logits":
            return True
        if isinstance(node, ast.If) and eager(node.body + node.orelse):
            return True
        if isinstance(node, ast.Try) and eager(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]):
            return True
    return False


print("yes" if path.is_file() and eager(ast.parse(path.read_text()).body) else "no")
PY
)
if [ "$eager" = yes ] && ! [ -f ".gpu/kit-$V-c.tar.xz" ]; then
  tar -xJf ".gpu/kit-$V-b.tar.xz" -C "$pristine" "sglang-$V.dist-info/METADATA"
  pin=$(grep -i '^Requires-Dist: nvidia-cutlass-dsl' "$pristine/sglang-$V.dist-info/METADATA" | head -1 | sed 's/^Requires-Dist: //; s/\[[^]]*\]//; s/;.*//; s/ //g')
  cutlass=$(mktemp -d)
  python3 -m pip --disable-pip-version-check -q install --target "$cutlass" --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform any \
    "$pin" "$(sed 's/nvidia-cutlass-dsl/nvidia-cutlass-dsl-libs-base/' <<<"$pin")"
  (cd "$cutlass" && tar -cf - nvidia_cutlass_dsl | xz -T0 -9e) > ".gpu/kit-$V-c.tar.xz.tmp" && mv ".gpu/kit-$V-c.tar.xz.tmp" ".gpu/kit-$V-c.tar.xz"
  rm -rf "$cutlass"
fi
[ "$eager" = yes ] && echo "part c: .gpu/kit-$V-c.tar.xz ($(du -h ".gpu/kit-$V-c.tar.xz" | cut -f1), the CuTe DSL): call \`kit-c $V\` first" || true
# The one-part kit, kept only where it fits one call (64 MiB) with the patched files and the tree.
one=".gpu/kit-$V.tar.xz"
if ! [ "$one" -nt ".gpu/kit-$V-a.tar.xz" ] || ! [ "$one" -nt ".gpu/kit-$V-b.tar.xz" ]; then  # missing or older than a part
  site=$(mktemp -d)
  tar -xJf ".gpu/kit-$V-a.tar.xz" -C "$site" && tar -xJf ".gpu/kit-$V-b.tar.xz" -C "$site"
  lean_xz "$site" > "$one.tmp" && mv "$one.tmp" "$one"
  rm -rf "$site" "$one.tmp"
fi
# A packing that failed or was stopped leaves no one-part kit: the two parts still serve.
[ -f "$one" ] || { echo "one-part kit: not made; use kit-a and part b"; exit 0; }
. scripts/call-size.sh
total=$(( $(stat -c %s "$one") + $(du -s --block-size=1 ".gpu/patched-$V" | cut -f1) + $(tree_bytes) ))
if [ "$total" -le "$CALL_MAX_BYTES" ]; then
  echo "one-part kit: $one ($(( total / 1024 / 1024 )) MiB with .gpu/patched-$V and the tree): one call, no kit-a"
else
  echo "one-part kit: $(( total / 1024 / 1024 )) MiB with the tree is over a call's 64 MiB; use kit-a and part b"
  rm -f "$one"
fi
