"""The three dynspec server flags, spelled once for every ServerArgs layout SGLang has had."""

from __future__ import annotations

import json
from dataclasses import dataclass


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
        "Optional[str]",  # a number, or auto (dynspec_auto.parse_threshold reads it)
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
        "8",
        "dynspec: minimum number of decode iterations between two speculation on/off switches.",
    ),
)

# The field every layout has had, next to which the new ones go.
NEIGHBOUR = "speculative_num_draft_tokens"


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
