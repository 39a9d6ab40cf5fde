"""scripts/gpu-prepare.sh's test for a kit part c: does the release's ``jit_kernel/dsa`` package
import the CuTe DSL module when it is imported (0.5.15, whose EAGLE worker then needs
nvidia-cutlass-dsl to capture its draft graphs: session 32), or only inside a function (0.5.16)?
The script's own Python, cut out of it, run on package files written as those releases wrote them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-prepare.sh"

# sglang/jit_kernel/dsa/__init__.py as 0.5.15 and 0.5.16 have it (the imports that matter)
EAGER_0_5_15 = """\
from sglang.srt.utils import is_hip

from .paged_mqa_logits import cutedsl_paged_mqa_logits

if not is_hip():
    # Preserve the original eager import behavior on non-ROCm platforms.
    from .cutedsl_paged_mqa_logits import CuteDSLPagedMQALogitsRunner, pick_dsl_expand
"""
DEFERRED_0_5_16 = """\
from .paged_mqa_logits import cutedsl_paged_mqa_logits


def pick_dsl_expand(*args, **kwargs):
    from .cutedsl_paged_mqa_logits import pick_dsl_expand as _pick_dsl_expand

    return _pick_dsl_expand(*args, **kwargs)
"""
UNDER_TRY = """\
try:
    pass
except ImportError:
    from .cutedsl_paged_mqa_logits import CuteDSLPagedMQALogitsRunner
"""


def eager_check() -> str:
    """The Python between ``eager=$(.venv/bin/python - "$dsa" <<'PY'`` and its closing ``PY``."""
    text = SCRIPT.read_text()
    start = text.index("eager=$(.venv/bin/python - \"$dsa\" <<'PY'\n") + len(
        "eager=$(.venv/bin/python - \"$dsa\" <<'PY'\n"
    )
    return text[start : text.index("\nPY\n", start)]


@pytest.mark.parametrize(
    ("source", "answer"),
    [(EAGER_0_5_15, "yes"), (UNDER_TRY, "yes"), (DEFERRED_0_5_16, "no"), (None, "no")],
    ids=["0.5.15-eager", "under-try", "0.5.16-deferred", "no-such-package"],
)
def test_part_c_is_built_where_the_package_imports_the_cute_dsl_eagerly(tmp_path, source, answer):
    dsa = tmp_path / "dsa" / "__init__.py"
    if source is not None:
        dsa.parent.mkdir()
        dsa.write_text(source)
    done = subprocess.run(
        [sys.executable, "-c", eager_check(), str(dsa)], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == answer
