"""scripts/trace_sum.py DIR STEPS: where one scheduler iteration's time goes, from a torch profiler trace.

DIR holds the ``*.trace.json.gz`` SGLang's ``/start_profile`` wrote for STEPS forward steps. Prints,
per step: the GPU's span, busy and idle time, the idle gaps by size, the kernels (and copies) by
name with their count and time, the CUDA runtime calls by name (launches, graph launches, syncs)
and the user annotations. Used by ``scripts/h200-runs.sh prof``; run two servers' traces side by
side to see what a fallback step does that a plain decode step does not.

Then the longest idle gaps, longest first: where each sits (ms from the first GPU
event), the kernels either side, and what the host did between launching them. The GPU idles
when the host launches late, so the host window is from the launch of the kernel before the gap
to the launch of the one after (linked by the trace's correlation ids): the longest Python
functions inside it (traces taken ``with_stack``) and the CUDA runtime calls, which show waits.
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
        busy, end, last, gaps = 0.0, gpu[0]["ts"], gpu[0], collections.Counter()
        idle = []  # (gap, where it starts, the kernel before it, the kernel after it)
        for e in gpu:
            start, stop = e["ts"], e["ts"] + e["dur"]
            if start > end:
                gap = start - end
                gaps["<5us" if gap < 5 else "5-20us" if gap < 20 else "20-100us" if gap < 100 else ">=100us"] += gap
                idle.append((gap, end, last, e))
            if stop >= end:
                busy, end, last = busy + stop - max(start, end), stop, e
        span = end - gpu[0]["ts"]
        print(f"per step: span {per(span):.0f} us, busy {per(busy):.0f} us, idle {per(span - busy):.0f} us")
        print("idle by gap size (us/step): " + ", ".join(f"{k} {per(v):.0f}" for k, v in sorted(gaps.items())))
        print(f"GPU events per step: {len(gpu) / steps:.1f}")
        table(gpu, steps, "GPU work", 40)
        longest_gaps(idle, gpu[0]["ts"], evs, GAPS_SHOWN)
    table([e for e in evs if e.get("cat") == "cuda_runtime"], steps, "CUDA runtime calls (host)", 15)
    table([e for e in evs if e.get("cat") in ("user_annotation", "gpu_user_annotation")], steps, "annotations", 20)
    table([e for e in evs if e.get("cat") in ("cpu_op",)], steps, "CPU ops (host, inclusive)", 30)
    table([e for e in evs if e.get("cat") == "python_function"], steps, "Python functions (host, inclusive)", 120)


GAPS_SHOWN = 12
GAP_MIN_US = 100


def longest_gaps(idle, first, evs, shown):
    """The ``shown`` longest of ``idle`` (``main``'s gaps, ``first`` the first GPU event's time) of at
    least GAP_MIN_US, each with its host window (see above)."""
    gaps = [g for g in idle if g[0] >= GAP_MIN_US]
    if not gaps:
        return
    launches = {}  # correlation id -> the runtime call that launched it
    for e in evs:
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {}):
            launches[e["args"]["correlation"]] = e
    host = [e for e in evs if e.get("cat") in ("python_function", "cuda_runtime")]
    print(f"-- longest idle gaps (of {len(gaps)} >= {GAP_MIN_US} us)")
    for gap, at, before, after in sorted(gaps, key=lambda g: -g[0])[:shown]:
        print(f"{gap:9.0f} us at {(at - first) / 1000:8.2f} ms  {short(before)} -> {short(after)}")
        window = [launches.get(k.get("args", {}).get("correlation")) for k in (before, after)]
        if None in window:
            continue
        start, stop = window[0]["ts"], window[1]["ts"]
        print(f"          host {(stop - start):.0f} us between the two launches:")
        inside = [e for e in host if e["ts"] >= start and e["ts"] + e["dur"] <= stop and e is not window[0]]
        for e in sorted(inside, key=lambda e: -e["dur"])[:4]:
            print(f"          {e['dur']:9.0f} us  {short(e)}")


def short(e, width=70):
    return e["name"][-width:]


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
