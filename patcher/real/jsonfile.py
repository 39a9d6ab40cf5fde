"""Reading the JSON files of a model dir with dynspec real's exit codes (11 missing, 12 damaged)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from patcher.errors import ModelInvalid, ModelMissing


def read(path: Path, missing_hint: str = "") -> Any:
    """``path``'s JSON; ModelMissing (with ``missing_hint`` after the path) if absent, ModelInvalid if not JSON."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as error:
        raise ModelMissing(f"{path}: no such file{missing_hint}") from error
    except ValueError as error:  # a JSONDecodeError, or text that is not UTF-8
        raise ModelInvalid(f"{path}: not JSON ({error})") from error
