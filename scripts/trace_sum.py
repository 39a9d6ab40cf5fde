"""scripts/trace_sum.py DIR STEPS: where one scheduler iteration's time goes, from a torch profiler trace.

DIR holds the ``*.trace.json.gz`` SGLang's ``/start_profile`` wrote for STEPS forward steps. Prints,
per step: the GPU's span, busy and idle time, the idle gaps by size, the kernels (and copies) by
name with their count and time, the CUDA runtime calls by name (launches, graph launches, syncs)
and the user annotations. Used by ``scripts/h200-runs.sh prof``; run two servers' traces side by
side to see what a fallback step does that a plain decode step does not.

Then the longest idle gaps, longest first: where each sits (ms from the first GPU
event), the kernels either side, and what the host did between launching them. The GPU idles
when the host launches late, so the host window is from the launch of the kernel before the gap
to the launch of the one after (linked by the trace's correlation ids, runtime or driver API: Triton
launches through cuLaunchKernel): the longest Python functions inside it (traces taken ``with_stack``)
and the CUDA calls, which show waits.

After the tables, three sections that the averages above cannot give:

* forward steps, a row each (traces with CPU activity: SGLang's scheduler annotates its stages;
  0.5.17 has no ProfilerStep#): wall span, GPU busy and idle, the host's time in CUDA syncs and
  outside them, the scheduler's stages and the forward mode and batch size of its ``step[...]``
  annotation, then the mean per forward mode. Burst, prefill and each decode step after it compare
  row by row between two servers.
* Python functions by exclusive (self) time over the whole trace (``with_stack``).
* Python functions by exclusive time while the GPU idled in every gap of 100 us or more: from the
  gap's start to the launch of the kernel after it, on the thread that launched it. That is the
  host work the GPU waited on; the rest of a gap the kernel was already launched (a wait on another
  stream or an event), and the section says how much that was.
"""

import collections
import glob
import gzip
import json
import sys

LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")  # Triton kernels are launched with the driver API


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
    idle = []  # (gap, where it starts, the kernel before it, the kernel after it)
    if gpu:
        busy, end, last, gaps = 0.0, gpu[0]["ts"], gpu[0], collections.Counter()
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
    table([e for e in evs if e.get("cat") == "cuda_driver"], steps, "CUDA driver calls (host)", 15)
    table([e for e in evs if e.get("cat") in ("user_annotation", "gpu_user_annotation")], steps, "annotations", 20)
    table([e for e in evs if e.get("cat") in ("cpu_op",)], steps, "CPU ops (host, inclusive)", 30)
    table([e for e in evs if e.get("cat") == "python_function"], steps, "Python functions (host, inclusive)", 120)
    if gpu:
        forward_steps(evs, busy_intervals(gpu), gpu[0]["ts"])
    python_own_time(evs, idle, steps)


GAPS_SHOWN = 12
GAP_MIN_US = 100


def launches_by_correlation(evs):
    """correlation id -> the runtime or driver call that launched the GPU event of that id"""
    return {
        e["args"]["correlation"]: e
        for e in evs
        if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {})
    }


def longest_gaps(idle, first, evs, shown):
    """The ``shown`` longest of ``idle`` (``main``'s gaps, ``first`` the first GPU event's time) of at
    least GAP_MIN_US, each with its host window (see above)."""
    gaps = [g for g in idle if g[0] >= GAP_MIN_US]
    if not gaps:
        return
    launches = launches_by_correlation(evs)
    host = [e for e in evs if e.get("cat") in ("python_function", *LAUNCH_CATEGORIES)]
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
    print_table(time, count, steps, title, rows)


def print_table(time, count, steps, title, rows, note=None):
    print(f"-- {title}: {sum(count.values()) / steps:.1f} per step, {sum(time.values()) / steps:.0f} us per step")
    if note:
        print(f"   ({note})")
    for name, us in time.most_common(rows):
        print(f"{us / steps:9.1f} us x{count[name] / steps:6.2f}  {name}")


# -- forward steps --------------------------------------------------------------------------------

# The scheduler's stages a row splits its host time into (SGLang's scheduler_nvtx_method annotations).
STAGES = {
    "input": ("scheduler.recv_requests", "scheduler.process_input_requests"),
    "sched": ("scheduler.get_next_batch_to_run",),
    "run": ("scheduler.run_batch",),
    "result": ("scheduler.process_batch_result",),
}
COLUMNS = ("span", "busy", "idle", "sync", "unblocked", *STAGES)


def busy_intervals(gpu):
    """The GPU's busy time as sorted, disjoint [start, stop] intervals (``gpu`` sorted by start)."""
    merged = []
    for e in gpu:
        start, stop = e["ts"], e["ts"] + e["dur"]
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    return merged


def overlap(intervals, start, stop):
    return sum(max(0.0, min(b, stop) - max(a, start)) for a, b in intervals)


def end_of(e):
    return e["ts"] + e["dur"]


def forward_steps(evs, busy, first):
    """A row per scheduler iteration that ran a batch: from the scheduler.recv_requests that began it
    (the overlap loop receives, schedules, launches the batch, then processes the last one's result)
    to the next such iteration's."""
    marks = sorted((e for e in evs if e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    runs = [e for e in marks if e["name"] == "scheduler.run_batch"]
    print("-- forward steps, a row each (us; at: ms from the first GPU event)")
    if not runs:
        print("   none: no scheduler.run_batch annotation (a trace without CPU activity has none)")
        return
    print("   a scheduler iteration from its recv_requests to the next one's; sync: the host in CUDA *Synchronize")
    print("   calls; unblocked: span - sync; input: recv_requests + process_input_requests, sched:")
    print("   get_next_batch_to_run, run: run_batch, result: process_batch_result (the scheduler's annotations)")
    receives = [e["ts"] for e in marks if e["name"] == "scheduler.recv_requests"]
    starts, after = [], float("-inf")
    for run in runs:
        began = [t for t in receives if after <= t <= run["ts"]]
        starts.append(began[-1] if began else run["ts"])
        after = end_of(run)
    ends = starts[1:] + [max([end_of(e) for e in marks] + [busy[-1][1]])]
    syncs = [(e["ts"], end_of(e)) for e in evs if e.get("cat") in LAUNCH_CATEGORIES and "Synchronize" in e["name"]]
    rows = []
    for run, start, stop in zip(runs, starts, ends):
        row = {"span": stop - start, "busy": overlap(busy, start, stop), "sync": overlap(syncs, start, stop)}
        row["idle"], row["unblocked"] = row["span"] - row["busy"], row["span"] - row["sync"]
        inside = [e for e in marks if start <= e["ts"] < stop]
        for stage, names in STAGES.items():
            row[stage] = sum(e["dur"] for e in inside if e["name"] in names)
        forwards = [e["name"] for e in inside if e["name"].startswith("step[") and run["ts"] <= e["ts"] <= end_of(run)]
        row["forward"] = " + ".join(dict.fromkeys(n[5:-1] for n in forwards)) or "-"  # a draft's forward repeats it
        rows.append((start, row))
    print(f"{'step':>4} {'at ms':>8} " + " ".join(f"{c:>{max(6, len(c))}}" for c in COLUMNS) + "  forward")
    for number, (start, row) in enumerate(rows, 1):
        print(f"{number:4d} {(start - first) / 1000:8.2f} {cells(row)}  {row['forward']}")
    by_forward = collections.defaultdict(list)
    for _, row in rows:
        by_forward[row["forward"]].append(row)
    for forward, same in by_forward.items():
        mean = {c: sum(r[c] for r in same) / len(same) for c in COLUMNS}
        print(f"{'mean':>4} {f'x{len(same)}':>8} {cells(mean)}  {forward}")


def cells(row):
    return " ".join(f"{row[c]:{max(6, len(c))}.0f}" for c in COLUMNS)


# -- Python functions by exclusive time -----------------------------------------------------------


def own_pieces(frames):
    """One thread's Python frames cut into time-ordered (start, stop, frame) pieces, each the innermost
    open frame's own time: a frame's time less that of the frames it called."""
    pieces, stack, cursor = [], [], float("-inf")
    for frame in sorted(frames, key=lambda e: (e["ts"], -e["dur"])):
        while stack and end_of(stack[-1]) <= frame["ts"]:
            cursor = close(stack.pop(), cursor, pieces)
        if stack and frame["ts"] > cursor:
            pieces.append((cursor, frame["ts"], stack[-1]))
        stack.append(frame)
        cursor = max(cursor, frame["ts"])
    while stack:
        cursor = close(stack.pop(), cursor, pieces)
    return pieces


def close(frame, cursor, pieces):
    """The closing frame's last piece; a child that the profiler ended after its parent leaves none."""
    if end_of(frame) > cursor:
        pieces.append((cursor, end_of(frame), frame))
    return max(cursor, end_of(frame))


def own_time(pieces, windows, time, count, counted):
    """Adds to ``time`` / ``count`` (by frame name) the part of ``pieces`` inside ``windows`` (sorted,
    disjoint; None: all of it); ``counted`` holds the frames already counted."""
    first = 0
    for start, stop, frame in pieces:
        if windows is None:
            inside = stop - start
        else:
            while first < len(windows) and windows[first][1] <= start:
                first += 1
            inside, w = 0.0, first
            while w < len(windows) and windows[w][0] < stop:
                inside += min(stop, windows[w][1]) - max(start, windows[w][0])
                w += 1
        if inside > 0:
            name = frame["name"][-110:]
            time[name] += inside
            if id(frame) not in counted:
                counted.add(id(frame))
                count[name] += 1


def python_own_time(evs, idle, steps):
    """Python functions by exclusive time: over the whole trace, then while the GPU idled (see above)."""
    threads = collections.defaultdict(list)
    for e in evs:
        if e.get("cat") == "python_function":
            threads[(e.get("pid"), e.get("tid"))].append(e)
    if not threads:
        return
    pieces = {thread: own_pieces(frames) for thread, frames in threads.items()}
    time, count, counted = collections.Counter(), collections.Counter(), set()
    for thread_pieces in pieces.values():
        own_time(thread_pieces, None, time, count, counted)
    print_table(time, count, steps, "Python functions (host, exclusive)", 60)
    gaps = [g for g in idle if g[0] >= GAP_MIN_US]
    if not gaps:
        return
    launches = launches_by_correlation(evs)
    busiest = collections.Counter((e.get("pid"), e.get("tid")) for e in launches.values()).most_common(1)
    windows = collections.defaultdict(list)  # thread -> its windows, in time order as the gaps are
    for gap, at, _, after in gaps:
        launch = launches.get(after.get("args", {}).get("correlation"))
        if launch is None:  # not linked: the whole gap, on the thread that launches most
            windows[busiest[0][0] if busiest else None].append((at, at + gap))
        elif launch["ts"] > at:
            windows[(launch.get("pid"), launch.get("tid"))].append((at, min(at + gap, launch["ts"])))
    held = sum(stop - start for spans in windows.values() for start, stop in spans)
    time, count, counted = collections.Counter(), collections.Counter(), set()
    for thread, spans in windows.items():
        own_time(pieces.get(thread, []), spans, time, count, counted)
    waited = sum(g[0] for g in gaps) - held
    note = (
        f"{len(gaps)} gaps, {sum(g[0] for g in gaps) / steps:.0f} us per step idle: {held / steps:.0f} before the launch"
        f" of the kernel after the gap (shared out below), {waited / steps:.0f} after it"
    )
    print_table(
        time, count, steps, f"Python functions while the GPU idled >= {GAP_MIN_US} us (host, exclusive)", 40, note
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
