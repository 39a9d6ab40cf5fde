"""A tool package's face: the public names of its modules, each module imported on first use.

``dynspec`` imports every tool's ``command`` at each start, and that imports the tool's package:
a face that imported its modules up front would load the engine (libcst) for ``dynspec --help``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any


def lazy_names(package: str, modules: Sequence[str], public: Sequence[str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: a name of ``public`` from the first of ``modules``
    (submodules of ``package``) that defines it, imported when first asked for and kept."""

    def getattr_(name: str) -> Any:
        if name in public:
            for module in modules:
                found = vars(importlib.import_module(f"{package}.{module}"))
                if name in found:
                    vars(importlib.import_module(package))[name] = found[name]
                    return found[name]
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return getattr_
