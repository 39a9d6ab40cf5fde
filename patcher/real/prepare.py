"""The model dir ``dynspec proof --model real`` serves: the converted target, the head, real prompts.

``OUT/target`` (``convert``), ``OUT/draft`` (the head, checked against the target before it is
copied), ``OUT/prompts.json`` (the held-out prompts, tokenized with the target's tokenizer) and
``OUT/model.json`` (the name the report shows, the sources and their digests). Without a head the
dir has no ``draft`` (the proof refuses it) until ``install_head`` puts one there: a head trained on
the GPU machine from ``OUT/target``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from patcher.errors import ModelInvalid, ModelMissing
from patcher.real import convert, fetch, heads, jsonfile, prompts

SPLITS = ("held_out", "train")


def write_prompts(target: Path, out: Path, split: str = "held_out") -> int:
    """The held-out (or training) prompts of both sets, tokenized with ``target``'s tokenizer.json."""
    if split not in SPLITS:
        raise ValueError(split)
    from tokenizers import Tokenizer

    file = target / "tokenizer.json"
    if not file.is_file():
        raise ModelMissing(f"{file}: no such file")
    tok = Tokenizer.from_file(str(file))
    everything = prompts.humaneval(fetch.extracted(fetch.HUMANEVAL)) + prompts.writingbench(
        fetch.extracted(fetch.WRITINGBENCH)
    )
    train, held_out = prompts.split(everything)
    chosen = held_out if split == "held_out" else train
    rows = [{"id": p.id, "input_ids": tok.encode(p.text, add_special_tokens=False).ids} for p in chosen]
    data = {"tokenizer": str(file), "split": split, f"{split}_of": len(everything), "prompts": rows}
    if split == "train":  # the chat template's two halves, for queries the target writes itself (--self-prompts)
        data["chat"] = chat_ids(tok)
    out.write_text(json.dumps(data) + "\n")
    return len(rows)


def chat_ids(tok: Any) -> dict[str, list[int]]:
    """The token ids of the chat template before and after a user turn, checked to tokenize a whole
    chat prompt as its parts do (else a query spliced between them would not read as one)."""
    ids = {
        part: tok.encode(text, add_special_tokens=False).ids
        for part, text in (("prefix", prompts.CHAT_PREFIX), ("suffix", prompts.CHAT_SUFFIX))
    }
    user = "Write a short note."
    whole = tok.encode(prompts.chat(user), add_special_tokens=False).ids
    if whole != ids["prefix"] + tok.encode(user, add_special_tokens=False).ids + ids["suffix"]:
        raise ModelInvalid("the tokenizer joins the chat template's parts with a user turn: no prefix / suffix ids")
    return ids


def prepare(out: Path, gguf_file: Path, head: Path | None, prompts_file: Path | None) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    converted = convert.convert(gguf_file, out / "target")
    target_config = convert.check_checkpoint(out / "target")
    head_config = heads.check_head(head, target_config) if head is not None else {}
    if (out / "draft").exists():
        shutil.rmtree(out / "draft")
    if head is not None:
        shutil.copytree(head, out / "draft")
    if prompts_file is None:
        write_prompts(out / "target", out / "prompts.json")
    else:
        try:
            data = json.loads(prompts_file.read_text())
            count = len(data["prompts"])
        except FileNotFoundError as error:
            raise ModelMissing(f"{prompts_file}: no such file") from error
        except (ValueError, KeyError, TypeError) as error:
            raise ModelInvalid(f"{prompts_file}: not a prompts.json of `dynspec real prompts` ({error})") from error
        if not count:
            raise ModelInvalid(f"{prompts_file}: no prompts")
        shutil.copyfile(prompts_file, out / "prompts.json")
    info = {
        "name": f"SmolLM2-135M-Instruct ({gguf_file.name}) + dynspec EAGLE-3 head",
        "gguf": gguf_file.name,
        "gguf_sha256": fetch.sha256(gguf_file),
        "target": converted.describe(),
        **_head_info(head, head_config),
    }
    (out / "model.json").write_text(json.dumps(info, indent=1) + "\n")
    return {k: info[k] for k in ("name", "gguf_sha256", "head_sha256")}


def _head_info(head: Path | None, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "head_acceptance_offline": config.get("dynspec_acceptance"),
        "head_recipe": config.get("dynspec_recipe"),
        "head_sha256": fetch.sha256(head / "model.safetensors") if head is not None else None,
    }


def install_head(model_dir: Path, head: Path) -> dict[str, Any]:
    """Make ``head`` (checked against ``model_dir/target``) the dir's draft; model.json says which head."""
    info_file = model_dir / "model.json"
    info = jsonfile.read(info_file, f" (make {model_dir} with `dynspec real prepare`)")
    head_config = heads.check_head(head, convert.check_checkpoint(model_dir / "target"))
    if (model_dir / "draft").exists():
        shutil.rmtree(model_dir / "draft")
    shutil.copytree(head, model_dir / "draft")
    info.update(_head_info(head, head_config))
    info_file.write_text(json.dumps(info, indent=1) + "\n")
    return {k: info[k] for k in ("name", "head_sha256", "head_acceptance_offline")}
