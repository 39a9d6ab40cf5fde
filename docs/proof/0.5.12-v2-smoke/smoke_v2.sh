#!/bin/bash
# GPU: SGLang 0.5.12 with the full default recipe; one v2 (overlap) dynspec server, N=8:
# greedy digests at 1,4,16,48 (compare with docs/proof/0.5.12-v1: identical across base/v1/dynspec)
# and waves.py (plain decode gave d82ae498c526 with these arguments), then count switches and errors.
set -u
test -d /tmp/site/transformers || { echo "NO KIT A"; exit 7; }
[ -d /tmp/site/sglang ] || tar -xJf .gpu/kit-0.5.12-b.tar.xz -C /tmp/site
cp -r .gpu/patched-full/sglang/. /tmp/site/sglang/
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
K=$PWD/.gpu/kit
S="--speculative-algorithm EAGLE3 --speculative-draft-model-path $K/models/draft --speculative-draft-load-format dummy --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
bash $K/serve.sh dynspec-v2 $S --max-running-requests 128 --cuda-graph-max-bs 128 --speculative-disable-batch-size 8 || { tail -80 $OUT/dynspec-v2.log; exit 1; }
timeout 120 python3 $K/client.py http://127.0.0.1:30000 1,4,16,48 64 /tmp/levels.json
timeout 200 python3 .gpu/waves.py http://127.0.0.1:30000 17 3 64 200 16 /tmp/waves.json | tail -2
bash $K/stop.sh
echo "switch lines: $(grep -c 'dynspec: speculation' $OUT/dynspec-v2.log)"
grep 'dynspec' $OUT/dynspec-v2.log | head -5
grep -iE 'traceback|error' $OUT/dynspec-v2.log | grep -vE 'flash_attn|fa3|FA3|harmony' | head -20
gzip -f $OUT/dynspec-v2.log
