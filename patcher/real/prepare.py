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

from patcher.errors import ModelInvalid, ModelMissing, UsageError
from patcher.real import convert, fetch, heads, jsonfile, prompts

SPLITS = ("held_out", "train")
# The layout `dynspec proof --model-dir` reads (its launch module's REAL_* names; tools import no
# tool, so a test holds the two equal).
TARGET, DRAFT, PROMPTS, INFO = "target", "draft", "prompts.json", "model.json"


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
        check_prompts_file(prompts_file, target_config.get("vocab_size"))
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


def check_prompts_file(prompts_file: Path, vocab_size: Any = None) -> dict[str, Any]:
    """A prompts.json of ``dynspec real prompts``: at least one prompt, each a non-empty list of
    token ids (below ``vocab_size`` where it is known); its data, else ModelMissing / ModelInvalid."""
    try:
        data = json.loads(prompts_file.read_text())
        rows = data["prompts"]
        ids = [row["input_ids"] for row in rows]
    except FileNotFoundError as error:
        raise ModelMissing(f"{prompts_file}: no such file") from error
    except (ValueError, KeyError, TypeError) as error:
        raise ModelInvalid(f"{prompts_file}: not a prompts.json of `dynspec real prompts` ({error!r})") from error
    if not ids:
        raise ModelInvalid(f"{prompts_file}: no prompts")
    limit = vocab_size if isinstance(vocab_size, int) else None
    for n, one in enumerate(ids):
        if not isinstance(one, list) or not one or not all(isinstance(t, int) and t >= 0 for t in one):
            raise ModelInvalid(f"{prompts_file}: prompt {n} is not a list of token ids")
        if limit is not None and max(one) >= limit:
            raise ModelInvalid(
                f"{prompts_file}: prompt {n} has token {max(one)}, past the target's vocabulary ({limit}): "
                "tokenized for another model?"
            )
    return dict(data)


# Every EAGLE-3 draft class of SGLang has it in its name (LlamaForCausalLMEagle3,
# Eagle3DeepseekV2ForCausalLM, ...); dynspec proof starts its speculating servers with EAGLE3.
EAGLE3_MARK = "Eagle3"


def own(out: Path, target: Path, head: Path, prompts_file: Path | None, name: str | None = None) -> dict[str, Any]:
    """``out`` as ``prepare`` makes it, for the user's own ``target`` (an HF checkpoint dir SGLang
    serves) and EAGLE-3 ``head``: ``out/target`` and ``out/draft`` link to them, the prompts are the
    held-out ones through the target's own chat template (``own_prompts``), or ``prompts_file``'s.
    Everything is checked and made before ``out`` changes; then each file goes in by a rename, the
    links last. ``out`` must be new, empty, or an earlier ``own``'s. No digests (a large checkpoint's
    would take minutes): model.json and the report name the paths instead."""
    target, head = target.resolve(), head.resolve()
    target_config = _config(target, "TARGET: an HF checkpoint dir SGLang serves")
    head_config = _config(head, "HEAD: an EAGLE-3 draft model dir")
    architectures = head_config.get("architectures")
    if not isinstance(architectures, list) or not any(EAGLE3_MARK in str(a) for a in architectures):
        raise ModelInvalid(
            f"{head / 'config.json'}: architectures {architectures!r} name no EAGLE-3 draft class "
            f"(dynspec proof runs --speculative-algorithm EAGLE3)"
        )
    nested = target_config.get("text_config")  # a multimodal target keeps its language model's here
    text: dict[str, Any] = nested if isinstance(nested, dict) else {}
    vocab = target_config.get("vocab_size", text.get("vocab_size"))
    for key, ours, theirs in (
        ("vocab_size", head_config.get("vocab_size"), vocab),
        # SGLang's EAGLE-3 head reads the target's hidden states at target_hidden_size where it has one
        ("hidden_size", head_config.get("target_hidden_size", head_config.get("hidden_size")),
         target_config.get("hidden_size", text.get("hidden_size"))),
    ):  # fmt: skip
        if ours is not None and theirs is not None and ours != theirs:
            raise ModelInvalid(f"{head / 'config.json'}: {key} {ours!r} does not match the target's {theirs!r}")
    _check_out(out, (target, head))
    data = own_prompts(target) if prompts_file is None else check_prompts_file(prompts_file, vocab)
    info = {
        "name": name or f"{_model_name(target)} + {_model_name(head)}",
        "own": True,  # made by own: a later own may replace it (_check_out)
        "target": str(target),
        "head": str(head),
        "head_architectures": architectures,
        "gguf_sha256": None,
        "head_sha256": None,
    }
    out.mkdir(parents=True, exist_ok=True)
    staged = [(out / _staged(PROMPTS), out / PROMPTS), (out / _staged(INFO), out / INFO)]
    staged[0][0].write_text(json.dumps(data) + "\n")
    staged[1][0].write_text(json.dumps(info, indent=1) + "\n")
    for link, to in ((TARGET, target), (DRAFT, head)):
        fresh = out / _staged(link)
        fresh.unlink(missing_ok=True)
        fresh.symlink_to(to, target_is_directory=True)
        staged.append((fresh, out / link))
    for fresh, final in staged:
        fresh.replace(final)  # each at once: never a name missing, the links (what the servers load) last
    return {k: info[k] for k in ("name", "target", "head")}


OWN_NAMES = (TARGET, DRAFT, PROMPTS, INFO)


def _staged(name: str) -> str:
    """Where ``own`` makes ``name`` before renaming it in (an interrupted own leaves it behind)."""
    return f".{name}.new"


def _check_out(out: Path, weights: tuple[Path, ...]) -> None:
    """``out`` may be new, empty, or what an earlier ``own`` left there: nothing of anyone else's is
    replaced, and nothing lands in the weights' dirs."""
    if out.is_symlink() and not out.exists():
        raise UsageError(f"{out}: a link to nothing")
    where = out.resolve()
    for model in weights:
        if where == model or model in where.parents:
            raise UsageError(f"{out}: inside {model} (OUT gets files of its own: choose a dir outside the weights)")
    if not out.exists():
        return
    if not out.is_dir():
        raise UsageError(f"{out}: not a directory")
    staging = {_staged(n) for n in OWN_NAMES}
    entries = list(out.iterdir())
    names = sorted(p.name for p in entries if not (p.name in staging and (p.is_symlink() or p.is_file())))
    foreign = [n for n in names if n not in OWN_NAMES]
    if foreign:
        raise UsageError(
            f"{out}: holds {foreign[0]}, which `dynspec real own` did not make (choose an empty or new OUT)"
        )
    if not names:
        return
    info = out / INFO
    try:
        made_by_own = json.loads(info.read_text()).get("own") is True
    except (OSError, ValueError, AttributeError):
        made_by_own = False
    linked = not any((out / n).exists() and not (out / n).is_symlink() for n in (TARGET, DRAFT))
    if not made_by_own or not linked:
        raise UsageError(f"{out}: not made by `dynspec real own` (a `dynspec real prepare` dir?): choose another OUT")


def _model_name(path: Path) -> str:
    """A model dir's name for people: Hugging Face's cache keeps it as models--ORG--NAME above the
    snapshot dir, whose own name is a commit hash."""
    for part in reversed(path.parts):
        if part.startswith("models--"):
            return part[len("models--") :].replace("--", "/")
    return path.name


def own_prompts(target: Path) -> dict[str, Any]:
    """The held-out prompts for a target of the user's: WritingBench's requests through the target's
    own chat template (transformers renders it, as SGLang's chat endpoint would), HumanEval's function
    heads as they are, with the tokenizer's special tokens (its BOS)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(target))
    if not getattr(tok, "chat_template", None):
        raise ModelInvalid(
            f"{target}: its tokenizer has no chat template (give --prompts: your own prompts as token ids)"
        )
    everything = prompts.humaneval(fetch.extracted(fetch.HUMANEVAL)) + prompts.writingbench(
        fetch.extracted(fetch.WRITINGBENCH), template=None
    )
    _, held_out = prompts.split(everything)
    rows = []
    for prompt in held_out:
        if prompt.id.startswith(prompts.WRITINGBENCH_ID):
            turn = [{"role": "user", "content": prompt.text}]
            text = tok.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
            ids = tok(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tok(prompt.text)["input_ids"]
        rows.append({"id": prompt.id, "input_ids": [int(t) for t in ids]})
    return {"tokenizer": str(target), "chat_template": "the target's", "held_out_of": len(everything), "prompts": rows}


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
