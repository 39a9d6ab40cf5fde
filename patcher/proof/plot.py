"""The throughput plot: tok/s against concurrency, one line per server kind.

matplotlib is optional. Without it the plot is skipped with a message, and can be drawn later on
any machine that has it from the JSON report alone: ``dynspec proof --plot report.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SERIES = (
    ("base", "speculation off", "o"),
    ("always_on", "EAGLE-3 always on", "s"),
    ("dynspec", "dynspec", "^"),
    ("upstream_adaptive", "upstream --speculative-adaptive", "D"),  # only with --upstream-adaptive
    ("base_no_overlap", "speculation off, no overlap", "v"),  # only with --no-overlap-base
)


def render(report: dict[str, Any], png: Path) -> str | None:
    """Draw ``png`` from ``report``; return None when drawn, or the reason it was not."""
    tp = report.get("throughput")
    if not tp or not tp.get("levels"):
        return "the report has no throughput measurements"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"matplotlib is not installed here; draw it elsewhere with: dynspec proof --plot {png.parent / 'report.json'}"

    levels = tp["levels"]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for key, label, marker in SERIES:
        values = tp.get(key)
        if values:
            points = [(c, v) for c, v in zip(levels, values) if v is not None]
            ax.plot([c for c, _ in points], [v for _, v in points], marker=marker, label=label)
    threshold = report.get("threshold")
    if report.get("dynspec_applied") and threshold:
        ax.axvline(threshold, linestyle=":", color="grey", label=f"threshold {threshold}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels)
    ax.set_xticklabels([str(c) for c in levels])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tokens / s")
    ax.set_title(
        f"SGLang {report.get('sglang_version')} {report.get('path')}, {tp.get('shape')} shape, {report.get('gpu')}",
        fontsize=10,
    )
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return None
