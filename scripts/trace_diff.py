"""scripts/trace_diff.py REF.txt OTHER.txt [ROWS]: what one server's step does more than another's.

Reads two of ``scripts/trace_sum.py``'s summaries (the ``prof`` step's ``NAME-gpu.txt`` /
``NAME-all.txt``) and prints, table by table (GPU work, CUDA runtime calls, CPU ops, Python
functions), the ROWS rows (default 25) whose time per step differs most, OTHER minus REF, with both
sides' time and count. A row in one summary's table only (each lists its longest rows) shows the
other side as ``-``: at most that table's shortest row. Host rows longer than the summary's step
span per step are left out: a thread or loop that spans the whole window, not a step's work. The
numbers are the profiler's, inflated by its per-call overhead where the trace has Python stacks:
they rank, they do not add up.
"""

import re
import sys

TITLE = re.compile(r"^-- (?P<title>[^:]+): (?P<count>[\d.]+) per step, (?P<us>[\d.]+) us per step$")
ROW = re.compile(r"^\s*(?P<us>[\d.]+) us x\s*(?P<count>[\d.]+)  (?P<name>.*)$")
SPAN = re.compile(r"^per step: span (?P<us>[\d.]+) us")
ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def tables(text):
    """{title: {name: (us per step, count per step)}} of one summary; the gap listing is not a table,
    and host rows longer than a step (see above) are not rows. Object addresses, which differ from
    process to process, are left out of the names, and rows that then share a name are summed."""
    found, rows, host, span = {}, None, False, float("inf")
    for line in text.splitlines():
        head, title, row = SPAN.match(line), TITLE.match(line), ROW.match(line)
        if head:
            span = float(head["us"])
        elif title:
            rows, host = found.setdefault(title["title"], {}), "host" in title["title"]
        elif line.startswith("--"):  # "-- longest idle gaps": not a table
            rows = None
        elif row and rows is not None and not (host and float(row["us"]) > span):
            name, us, count = ADDRESS.sub("", row["name"]), float(row["us"]), float(row["count"])
            before = rows.get(name, (0.0, 0.0))  # two native functions can share a name without address
            rows[name] = (before[0] + us, before[1] + count)
    return found


def differences(ref, other, rows):
    """[(title, [(delta, name, ref row or None, other row or None)])], largest |delta| first."""
    out = []
    for title in [t for t in ref if t in other] + [t for t in other if t not in ref]:
        a, b = ref.get(title, {}), other.get(title, {})
        deltas = [
            ((b[n][0] if n in b else 0.0) - (a[n][0] if n in a else 0.0), n, a.get(n), b.get(n))
            for n in set(a) | set(b)
        ]
        deltas = sorted((d for d in deltas if d[0] != 0), key=lambda d: (-abs(d[0]), d[1]))[:rows]
        if deltas:
            out.append((title, deltas))
    return out


def side(row):
    return f"{row[0]:9.1f} x{row[1]:6.2f}" if row is not None else f"{'-':>9} {'':>7}"


def main(ref_path, other_path, rows=25):
    with open(ref_path) as handle:
        ref = tables(handle.read())
    with open(other_path) as handle:
        other = tables(handle.read())
    print(f"{other_path} minus {ref_path}, us per step (the profiler's)")
    for title, deltas in differences(ref, other, rows):
        print(f"-- {title}: {'delta':>9} | {'ref us':>9} {'x n':>7} | {'other us':>9} {'x n':>7}")
        for delta, name, a, b in deltas:
            print(f"{delta:+12.1f} | {side(a)} | {side(b)}  {name}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:4]))
