"""Real prompts, from two PyPI packages: code (HumanEval) and English writing requests (WritingBench).

HumanEval's 164 prompts are Python function heads the target continues as code. WritingBench
(shipped in inspect-evals) has 1000 human-written writing requests in six domains, 545 of them in
English: real instructions, unlike random token ids, which inflate acceptance. They go through the
target's chat template, cut to ``MAX_CHARS`` at a word boundary (the requests run to thousands of
characters; the head needs many prompts more than long ones).

The split is by a hash of each prompt's id, so it is fixed whatever the order or the machine: one
prompt in ``EVAL_EVERY`` is held out for evaluation, the rest train the head.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MAX_CHARS = 700
EVAL_EVERY = 5
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"  # the GGUF's chat template default
CJK = re.compile(r"[\u3000-\u9fff\uff00-\uffef]")


@dataclass(frozen=True)
class Prompt:
    id: str  # "humaneval/HumanEval/0", "writingbench/17"
    text: str  # what is tokenized, chat template applied where it applies

    @property
    def held_out(self) -> bool:
        return int(hashlib.sha256(self.id.encode()).hexdigest(), 16) % EVAL_EVERY == 0


# The GGUF's chat template (ChatML with SmolLM's default system turn) around a user turn
CHAT_PREFIX = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
CHAT_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"  # the generation prompt included


def chat(user: str) -> str:
    return f"{CHAT_PREFIX}{user}{CHAT_SUFFIX}"


def cut(text: str, limit: int = MAX_CHARS) -> str:
    if len(text) <= limit:
        return text.strip()
    head = text[:limit]
    return head[: head.rfind(" ")].rstrip() if " " in head else head


def humaneval(path: Path) -> list[Prompt]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [Prompt(f"humaneval/{row['task_id']}", row["prompt"]) for row in rows]


WRITINGBENCH_ID = "writingbench/"


def writingbench(path: Path, template: Callable[[str], str] | None = chat) -> list[Prompt]:
    """The English requests, each cut and put through ``template`` (SmolLM2's chat; None: the bare
    request, for a caller that applies another model's template)."""
    out = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            if CJK.search(row["query"]):  # the Chinese half of the benchmark
                continue
            query = cut(row["query"])
            out.append(Prompt(f"{WRITINGBENCH_ID}{row['index']}", query if template is None else template(query)))
    return out


def split(prompts: list[Prompt]) -> tuple[list[Prompt], list[Prompt]]:
    """(train, held out)."""
    return [p for p in prompts if not p.held_out], [p for p in prompts if p.held_out]
