"""The three dynspec server flags, spelled once for every ServerArgs layout SGLang has had, and where
the flag patches put them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import libcst as cst

from patcher.anchors import (
    Anchor,
    annotation_head,
    body_of,
    find_class,
    insert_after,
    is_field,
    replace_class,
    subscript_calls,
    with_body,
)
from patcher.patch import CstPatch
from patches.runtime.dynspec_settings import DEFAULT_MIN_STEPS  # the runtime's, so ServerArgs' default is the same


@dataclass(frozen=True)
class Flag:
    field: str
    type: str  # the annotation, as SGLang spells it
    default: str
    help: str

    @property
    def option(self) -> str:
        return "--" + self.field.replace("_", "-")

    @property
    def parser_type(self) -> str:
        """What ``add_argument(type=...)`` converts the command line with: the annotation's type."""
        return "str" if "str" in self.type else "int"


FLAGS = (
    Flag(
        "speculative_disable_batch_size",
        "Optional[str]",  # a number, or auto (dynspec_settings.parse_threshold reads it)
        "None",
        "dynspec: switch speculative decoding off while the decode batch has more than this many "
        "requests (unset: always speculate); auto: the server finds the switch point from its own "
        "step timings and acceptance (SGLang 0.5.14+).",
    ),
    Flag(
        "speculative_enable_batch_size",
        "Optional[int]",
        "None",
        "dynspec: switch speculative decoding back on when the decode batch has at most this many "
        "requests (default: --speculative-disable-batch-size; with auto, speculation is never "
        "switched off at or below it).",
    ),
    Flag(
        "speculative_switch_min_steps",
        "int",
        str(DEFAULT_MIN_STEPS),
        "dynspec: minimum number of decode iterations between two speculation on/off switches.",
    ),
)

# The field every layout has had, next to which the new ones go.
NEIGHBOUR = "speculative_num_draft_tokens"

# The patches that add the flags, one a layout; a patch that reads the flags requires them (each binds
# only on the releases it applies to).
FLAG_PATCHES = ("server_args_dynspec_flags_legacy", "server_args_dynspec_flags", "spec_fields_dynspec_flags")


def plain_fields() -> str:
    """Dataclass fields as in SGLang <= 0.5.13."""
    return "".join(f"{f.field}: {f.type} = {f.default}\n" for f in FLAGS)


def annotated_fields(namespace: str | None) -> str:
    """``A[...]`` fields as in SGLang >= 0.5.14 (the CLI flag is derived from the name)."""
    ns = f'    NS("{namespace}"),\n' if namespace else ""
    return "".join(f"{f.field}: A[\n    {f.type},\n    {json.dumps(f.help)},\n{ns}] = {f.default}\n" for f in FLAGS)


def add_argument_calls() -> str:
    """``parser.add_argument`` calls as ``ServerArgs.add_cli_args`` spells them up to 0.5.13."""
    return "".join(
        f"parser.add_argument(\n"
        f"    {json.dumps(f.option)},\n"
        f"    type={f.parser_type},\n"
        f"    default=ServerArgs.{f.field},\n"
        f"    help={json.dumps(f.help)},\n"
        f")\n"
        for f in FLAGS
    )


def annotated_neighbour(class_name: str) -> Anchor:
    """``NEIGHBOUR`` declared as ``A[...]``: pins the layout this patch writes."""

    def find(module: cst.Module) -> bool:
        classdef = find_class(module, class_name)
        return classdef is not None and any(
            is_field(s, NEIGHBOUR) and annotation_head(s) == "A" for s in body_of(classdef)
        )

    return Anchor(find)


def insert_annotated_fields(patch: CstPatch, module: cst.Module, class_name: str) -> cst.Module:
    classdef = find_class(module, class_name)
    assert classdef is not None
    neighbour = next(s for s in body_of(classdef) if is_field(s, NEIGHBOUR))
    fields = patch.parse_statements(module, annotated_fields("spec" if "NS" in subscript_calls(neighbour) else None))
    return replace_class(
        module,
        class_name,
        lambda c: with_body(c, insert_after(body_of(c), lambda s: is_field(s, NEIGHBOUR), fields)),
    )
