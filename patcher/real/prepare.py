"""The model dir ``dynspec proof --model real`` serves: the converted target, the head, real prompts.

``OUT/target`` (``convert``), ``OUT/draft`` (the head, checked against the target before it is
copied), ``OUT/prompts.json`` (the held-out prompts, tokenized with the target's tokenizer) and
``OUT/model.json`` (the name the report shows, the sources and their digests). Without a head the
dir has no ``draft`` (the proof refuses it) until ``install_head`` puts one there: a head trained on
the GPU machine from ``OUT/target``.

``own`` makes the same layout for a user's own target and EAGLE-3 head (``dynspec real own``):
``target`` and ``draft`` are links to them, not copies, and nothing of them is converted or trained.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from patcher.errors import ModelInvalid, ModelMissing
from patcher.real import convert, fetch, heads, jsonfile, prompts

SPLITS = ("held_out", "train")
# The layout `dynspec proof --model-dir` reads (its launch module's REAL_* names; tools import no
# tool, so a test holds the two equal).
TARGET, DRAFT, PROMPTS, INFO = "target", "draft", "prompts.json", "model.json"


def write_prompts(target: Path, out: Path, split: str = "held_out") -> int:
    """The held-out (or training) prompts of both sets, tokenized with ``target``'s tokenizer.json."""
    data = tokenized_prompts(target, split)
    out.write_text(json.dumps(data) + "\n")
    return len(data["prompts"])


def tokenized_prompts(target: Path, split: str = "held_out") -> dict[str, Any]:
    """``write_prompts``' file as data: written by the caller once everything else is checked."""
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
    return data


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
    converted = convert.convert(gguf_file, out / TARGET)
    target_config = convert.check_checkpoint(out / TARGET)
    head_config = heads.check_head(head, target_config) if head is not None else {}
    if (out / DRAFT).exists():
        shutil.rmtree(out / DRAFT)
    if head is not None:
        shutil.copytree(head, out / DRAFT)
    if prompts_file is None:
        write_prompts(out / TARGET, out / PROMPTS)
    else:
        check_prompts_file(prompts_file)
        shutil.copyfile(prompts_file, out / PROMPTS)
    info = {
        "name": f"SmolLM2-135M-Instruct ({gguf_file.name}) + dynspec EAGLE-3 head",
        "gguf": gguf_file.name,
        "gguf_sha256": fetch.sha256(gguf_file),
        "target": converted.describe(),
        **_head_info(head, head_config),
    }
    (out / INFO).write_text(json.dumps(info, indent=1) + "\n")
    return {k: info[k] for k in ("name", "gguf_sha256", "head_sha256")}


def check_prompts_file(prompts_file: Path) -> None:
    """A prompts.json of ``dynspec real prompts`` with at least one prompt; else ModelMissing / ModelInvalid."""
    try:
        data = json.loads(prompts_file.read_text())
        count = len(data["prompts"])
    except FileNotFoundError as error:
        raise ModelMissing(f"{prompts_file}: no such file") from error
    except (ValueError, KeyError, TypeError) as error:
        raise ModelInvalid(f"{prompts_file}: not a prompts.json of `dynspec real prompts` ({error})") from error
    if not count:
        raise ModelInvalid(f"{prompts_file}: no prompts")


# Every EAGLE-3 draft class of SGLang has it in its name (LlamaForCausalLMEagle3,
# Eagle3DeepseekV2ForCausalLM, ...); dynspec proof starts its speculating servers with EAGLE3.
EAGLE3_MARK = "Eagle3"


def own(out: Path, target: Path, head: Path, prompts_file: Path | None, name: str | None = None) -> dict[str, Any]:
    """``out`` as ``prepare`` makes it, for the user's own ``target`` (an HF checkpoint dir SGLang
    serves) and EAGLE-3 ``head``: ``out/target`` and ``out/draft`` link to them, the prompts are
    tokenized with the target's tokenizer (or copied from ``prompts_file``). Everything is checked
    before ``out`` is touched; ``out``'s own links are replaced, any other ``target`` or ``draft``
    there is refused. Digests are not taken (a large checkpoint's would take minutes)."""
    target, head = target.resolve(), head.resolve()
    target_config = _config(target, "TARGET: an HF checkpoint dir SGLang serves")
    head_config = _config(head, "HEAD: an EAGLE-3 draft model dir")
    architectures = head_config.get("architectures")
    if not isinstance(architectures, list) or not any(EAGLE3_MARK in str(a) for a in architectures):
        raise ModelInvalid(
            f"{head / 'config.json'}: architectures {architectures!r} name no EAGLE-3 draft class "
            f"(dynspec proof runs --speculative-algorithm EAGLE3)"
        )
    vocab, head_vocab = target_config.get("vocab_size"), head_config.get("vocab_size")
    if vocab is not None and head_vocab is not None and vocab != head_vocab:
        raise ModelInvalid(f"{head / 'config.json'}: vocab_size {head_vocab} does not match the target's {vocab}")
    where = out.resolve()
    for model in (target, head):
        if where == model or model in where.parents:
            raise ModelInvalid(f"{out}: inside {model} (OUT gets files of its own: choose a dir outside the weights)")
    if out.exists() and not out.is_dir():
        raise ModelInvalid(f"{out}: not a directory")
    for link in (out / TARGET, out / DRAFT):
        if link.exists() and not link.is_symlink():
            raise ModelInvalid(f"{link}: not a link of `dynspec real own` (choose another OUT)")
    if prompts_file is None:
        prompt_data = tokenized_prompts(target)
    else:
        check_prompts_file(prompts_file)
    out.mkdir(parents=True, exist_ok=True)
    for link, to in ((out / TARGET, target), (out / DRAFT, head)):
        fresh = link.with_name(link.name + ".new")
        fresh.unlink(missing_ok=True)
        fresh.symlink_to(to, target_is_directory=True)
        fresh.replace(link)  # the old link, if any, goes at once: never a dir without one
    if prompts_file is None:
        (out / PROMPTS).write_text(json.dumps(prompt_data) + "\n")
    else:
        shutil.copyfile(prompts_file, out / PROMPTS)
    info = {
        "name": name or f"{target.name} + {head.name}",
        "own": True,  # linked, not converted: the report names what ran by these paths
        "target": str(target),
        "head": str(head),
        "head_architectures": architectures,
        "gguf_sha256": None,
        "head_sha256": None,
    }
    (out / INFO).write_text(json.dumps(info, indent=1) + "\n")
    return {k: info[k] for k in ("name", "target", "head")}


def _config(model: Path, what: str) -> dict[str, Any]:
    config = jsonfile.read(model / "config.json", f" ({what}, with its config.json)")
    if not isinstance(config, dict):
        raise ModelInvalid(f"{model / 'config.json'}: not a JSON object")
    return config


def _head_info(head: Path | None, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "head_acceptance_offline": config.get("dynspec_acceptance"),
        "head_recipe": config.get("dynspec_recipe"),
        "head_sha256": fetch.sha256(head / "model.safetensors") if head is not None else None,
    }


def install_head(model_dir: Path, head: Path) -> dict[str, Any]:
    """Make ``head`` (checked against ``model_dir/target``) the dir's draft; model.json says which head."""
    info_file = model_dir / INFO
    info = jsonfile.read(info_file, f" (make {model_dir} with `dynspec real prepare`)")
    head_config = heads.check_head(head, convert.check_checkpoint(model_dir / TARGET))
    if (model_dir / DRAFT).exists():
        shutil.rmtree(model_dir / DRAFT)
    shutil.copytree(head, model_dir / DRAFT)
    info.update(_head_info(head, head_config))
    info_file.write_text(json.dumps(info, indent=1) + "\n")
    return {k: info[k] for k in ("name", "head_sha256", "head_acceptance_offline")}
