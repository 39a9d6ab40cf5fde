"""Code dynspec ships into SGLang trees as whole files (see the ``NewFilePatch`` that names each)."""
