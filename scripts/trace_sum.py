"""scripts/trace_sum.py DIR STEPS: where one scheduler iteration's time goes, from a torch profiler trace.

DIR holds the ``*.trace.json.gz`` SGLang's ``/start_profile`` wrote for STEPS forward steps. Prints,
per step: the GPU's span, busy and idle time, the idle gaps by size, the kernels (and copies) by
name with their count and time, the CUDA runtime calls by name (launches, graph launches, syncs)
and the user annotations. Used by ``scripts/h200-runs.sh prof``; run two servers' traces side by
side to see what a fallback step does that a plain decode step does not.
"""

import collections
import glob
import gzip
import json
import sys


def events(directory):
    found = []
    for path in sorted(glob.glob(f"{directory}/**/*.trace.json*", recursive=True)):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as handle:
            found.extend(json.load(handle).get("traceEvents", []))
    return found


def main(directory, steps):
    evs = [e for e in events(directory) if e.get("ph") == "X" and "dur" in e]
    if not evs:
        print(f"{directory}: no trace events")
        return
    per = lambda us: us / steps  # noqa: E731  (µs per step)
    gpu = sorted((e for e in evs if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    if gpu:
        busy, end, gaps = 0.0, gpu[0]["ts"], collections.Counter()
        for e in gpu:
            start, stop = e["ts"], e["ts"] + e["dur"]
            if start > end:
                gap = start - end
                gaps["<5us" if gap < 5 else "5-20us" if gap < 20 else "20-100us" if gap < 100 else ">=100us"] += gap
            if stop > end:
                busy, end = busy + stop - max(start, end), stop
        span = end - gpu[0]["ts"]
        print(f"per step: span {per(span):.0f} us, busy {per(busy):.0f} us, idle {per(span - busy):.0f} us")
        print("idle by gap size (us/step): " + ", ".join(f"{k} {per(v):.0f}" for k, v in sorted(gaps.items())))
        print(f"GPU events per step: {len(gpu) / steps:.1f}")
        table(gpu, steps, "GPU work", 40)
    table([e for e in evs if e.get("cat") == "cuda_runtime"], steps, "CUDA runtime calls (host)", 15)
    table([e for e in evs if e.get("cat") in ("user_annotation", "gpu_user_annotation")], steps, "annotations", 20)
    table([e for e in evs if e.get("cat") in ("cpu_op",)], steps, "CPU ops (host, inclusive)", 30)
    table([e for e in evs if e.get("cat") == "python_function"], steps, "Python functions (host, inclusive)", 120)


def table(evs, steps, title, rows):
    time, count = collections.Counter(), collections.Counter()
    for e in evs:
        name = e["name"][-110:]
        time[name] += e["dur"]
        count[name] += 1
    print(f"-- {title}: {sum(count.values()) / steps:.1f} per step, {sum(time.values()) / steps:.0f} us per step")
    for name, us in time.most_common(rows):
        print(f"{us / steps:9.1f} us x{count[name] / steps:6.2f}  {name}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
