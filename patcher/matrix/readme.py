"""README's "Supported releases" table, generated from the baseline between the matrix markers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from patcher.errors import UsageError
from patcher.matrix.model import glyph, span

README_BEGIN = "<!-- matrix:begin -->"
README_END = "<!-- matrix:end -->"


def readme_section(baseline: dict[str, Any]) -> str:
    """The generated part of README's "Supported releases": consecutive releases with equal rows merged."""
    patches = [p["id"] for p in baseline["patches"]]
    rows = baseline["releases"]
    lines = [
        README_BEGIN,
        "<!-- generated from matrix.json by `make docs`; edit matrix.json (`dynspec matrix --update-baseline`), not this -->",
        "",
        "| SGLang | " + " | ".join(f"`{p}`" for p in patches) + " |",
        "|---|" + "---|" * len(patches),
    ]
    groups: list[tuple[list[str], list[str]]] = []
    for row in rows:
        if "error" in row:
            states = [row["error"].split(":")[0]] * len(patches)
        else:
            states = [glyph(row["cells"].get(p, {}).get("state", "absent")) for p in patches]
        if groups and groups[-1][1] == states:
            groups[-1][0].append(row["version"])
        else:
            groups.append(([row["version"]], states))
    for versions, states in groups:
        lines.append(f"| {span(versions)} | " + " | ".join(states) + " |")
    lines += ["", "| patch | SGLang | target | what it adds |", "|---|---|---|---|"]
    for p in baseline["patches"]:
        summary = p["summary"].replace("|", "\\|")
        lines.append(f"| `{p['id']}` r{p['revision']} | `{p['sglang']}` | `{p['target']}` | {summary} |")
    versions = [r["version"] for r in rows]
    lines += [
        "",
        f"{len(versions)} releases checked: {', '.join(versions)}.",
        README_END,
    ]
    return "\n".join(lines)


def render_readme(readme: str, baseline: dict[str, Any]) -> str:
    """``readme`` with the text between the matrix markers replaced by ``readme_section``."""
    begin, end = readme.find(README_BEGIN), readme.find(README_END)
    if begin < 0 or end < begin:
        raise UsageError(f"README has no {README_BEGIN} … {README_END} block")
    return readme[:begin] + readme_section(baseline) + readme[end + len(README_END) :]


def write_readme(readme_path: Path, baseline: dict[str, Any]) -> bool:
    """Regenerate the README table; True if the file changed."""
    old = readme_path.read_text(encoding="utf-8")
    new = render_readme(old, baseline)
    if new != old:
        readme_path.write_text(new, encoding="utf-8")
    return new != old
