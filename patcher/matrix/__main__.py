"""``python -m patcher.matrix`` (``make docs``): regenerate README's supported-releases table from ``matrix.json``."""

from patcher.matrix.command import matrix_docs

matrix_docs()
