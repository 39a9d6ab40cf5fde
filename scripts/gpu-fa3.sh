#!/bin/bash
# scripts/gpu-fa3.sh VERSION: FA3 for the device, in parts that each fit a call. The kit leaves out
# sgl-kernel's flash_ops (FA3, 1.1 GB; ../shared/gpu/build-kit.sh), so `--attention-backend fa3`
# cannot start from it. At xz -9e it is 52 MB (0.5.12) to 127 MB (0.5.17): this packs it from the
# wheel that SGLang VERSION pins into .gpu/fa3-VERSION.part-I-of-K, each as large as one call
# carries beside the working tree as it is now (run it again once commits have grown the tree).
# Then, on one warm machine, one call a part (any order; the last one unpacks them):
#   carry .gpu/fa3-V.part-I-of-K:  bash scripts/h200-runs.sh fa3 V
# The parts land in /tmp/fa3-V, outside /tmp/site, so a later kit keeps them: every step that
# unpacks V's kit puts flash_ops beside it, and PROOF_FLAGS="--attention-backend fa3" then runs.
# Needs the kit's part b (scripts/gpu-prepare.sh VERSION) to read the pin from.
set -euo pipefail
V=${1:?usage: scripts/gpu-fa3.sh VERSION}
cd "$(dirname "$0")/.."
[ -f ".gpu/kit-$V-b.tar.xz" ] || { echo "no .gpu/kit-$V-b.tar.xz: run scripts/gpu-prepare.sh $V first" >&2; exit 2; }
meta=$(tar -xJOf ".gpu/kit-$V-b.tar.xz" --wildcards "sglang-$V.dist-info/METADATA")
pin=$(grep -iE '^Requires-Dist: (sgl-kernel|sglang-kernel)==' <<<"$meta" | head -1 | sed 's/^Requires-Dist: //; s/;.*//; s/ //g')
[ -n "$pin" ] || { echo "sglang $V's METADATA pins no sgl-kernel / sglang-kernel" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip --disable-pip-version-check -q download --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 -d "$work" "$pin"
unzip -q -d "$work/site" "$work"/*.whl 'sgl_kernel/flash_ops.abi3.so'
# Each part fills what a call carries beside the tree.
. scripts/call-size.sh
part=$(( (CALL_MAX_BYTES - $(tree_bytes)) / 1024 / 1024 ))
(cd "$work/site" && tar -cf - sgl_kernel/flash_ops.abi3.so | xz -T0 -9e) > "$work/fa3.tar.xz"
rm -f ".gpu/fa3-$V".part-*
split -b "${part}M" -d -a 1 "$work/fa3.tar.xz" "$work/part-"
parts=("$work"/part-*)
for i in "${!parts[@]}"; do mv "${parts[$i]}" ".gpu/fa3-$V.part-$((i + 1))-of-${#parts[@]}"; done
echo "FA3 of $pin: $(du -h "$work/fa3.tar.xz" | cut -f1) in ${#parts[@]} parts of at most $part MiB:"
ls -la ".gpu/fa3-$V".part-*
