export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 DYNSPEC_DRAFT_KV=kv-graph SGLANG_SIMULATE_ACC_LEN=3
M=$PWD/patcher/proof/models
python3 -m sglang.launch_server --model-path $M/target --load-format dummy --skip-tokenizer-init --attention-backend triton --sampling-backend pytorch --mem-fraction-static 0.5 --port 30000 --disable-overlap-schedule --speculative-algorithm EAGLE3 --speculative-draft-model-path $M/draft --speculative-draft-load-format dummy --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --speculative-disable-batch-size 8 > $OUT/v1.log 2>&1 &
for i in $(seq 130); do curl -sf localhost:30000/health >/dev/null && break; sleep 1; done
python3 - <<'PY'
import json, urllib.request, concurrent.futures as cf
def gen(i):
    body = json.dumps({"input_ids": [1 + (i * 7 + k) % 500 for k in range(20)], "sampling_params": {"max_new_tokens": 48, "temperature": 0}}).encode()
    r = urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:30000/generate", body, {"Content-Type": "application/json"}), timeout=60)
    return len(json.loads(r.read())["output_ids"])
for c in (1, 32, 2, 32, 1):
    with cf.ThreadPoolExecutor(c) as ex:
        print(c, list(ex.map(gen, range(c)))[:4], flush=True)
PY
grep -E "dynspec|Traceback|Error" $OUT/v1.log | head -20; pkill -f launch_server; gzip $OUT/v1.log
