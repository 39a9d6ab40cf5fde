"""An EAGLE-3 head for a Llama target: data, training, SGLang's checkpoint format, offline acceptance.

The head is SGLang's ``LlamaForCausalLMEagle3`` (models/llama_eagle3.py) re-written in plain torch,
with the same names, so its state dict is the checkpoint SGLang loads:

* ``fc`` maps the target's hidden states after layers ``AUX_LAYERS`` (concatenated, 3 x hidden)
  to hidden; SGLang captures ``layers_to_capture = [l + 1 for l in ids]``, the residual stream
  before layer l + 1, which is ``output_hidden_states[l + 1]`` in transformers;
* ``midlayer`` is one decoder layer whose attention reads ``cat(input_layernorm(embed),
  hidden_norm(hidden))`` (2 x hidden); the residual is the un-normed hidden;
* ``norm`` then ``lm_head`` over a draft vocabulary of the ``draft_vocab`` most frequent target
  tokens; ``d2t[i]`` = target id - i (SGLang's ``hot_token_id = d2t + arange``), ``t2d`` a mask;
* the hidden handed to the next draft step is the pre-norm residual (``norm_output`` false).

Training data are the target's own continuations of real prompts (``patcher.real.prompts``), with
the target's hidden states recorded while it generates (``generate``: many prompts at once, left
padded, over a KV cache): the greedy one, and with ``continuations`` > 1 also sampled ones (a seeded
``torch.Generator``), whose hidden states are the target's own for the sampled tokens. Training unrolls the chain as at
inference ("training-time test"): step k at position i reads the hidden of step k - 1 and the token
k places on, and attends to the step-0 keys up to i and the keys of steps 1..k at i, as the chain's
query at position i + k attends to the extend's KV and the chain's own.

``acceptance`` plays SGLang's chain (topk 1, ``STEPS`` drafts, greedy verify) on held-out
continuations: from each round's position the drafts are accepted while they equal the target's
tokens, and the round advances by accepted + 1; the acceptance length is tokens / rounds.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from patcher.errors import ModelInvalid, ModelMissing, UsageError
from patcher.real import jsonfile
from patcher.real.heads import check_head

STEPS = 3  # --speculative-num-steps; drafts per round with topk 1
LM_HEAD_INITS = ("target", "random")  # Recipe.lm_head
MIN_QUERY = 4  # tokens: a shorter self-written query is dropped


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the head; its JSON goes into the head's config as ``dynspec_recipe``."""

    seed: int = 15
    new_tokens: int = 96  # continuation per training prompt
    eval_new_tokens: int = 128
    eval_prompts: int = 48  # held-out prompts measured (half code, half writing, where there are enough); 0: all
    # The target tokens the head predicts: the most frequent labels of the training data. On the CPU
    # recipe's samples 4096 cover 89 % of the held-out labels (96 - 98 % of the trained ones), 8192
    # 93 % (a label outside is never accepted); yet 8192 gave 1.557 held out against 4096's 1.556
    # (session 17, CPU, same samples): the head misses those tokens anyway, so 4096 stays.
    draft_vocab: int = 4096
    intermediate: int = 1024
    epochs: int = 8
    lr: float = 2e-3
    batch_tokens: int = 1024  # sequences per optimizer step are packed up to this many positions
    step_weight: float = 0.8  # loss weight of unrolled step k: step_weight ** k
    max_prompts: int = (
        320  # 0: every training prompt (594); else N of them, alternating sets (2 CPU cores: ~15 min to generate)
    )
    threads: int = 2
    gen_batch: int = 32  # sequences generated at once
    device: str = "cpu"  # cpu: the target in float32; cuda: in bfloat16, as SGLang serves it
    continuations: int = 1  # per training prompt: the greedy one, then continuations - 1 sampled ones
    temperature: float = 0.8  # of the sampled continuations
    eos: str = "generated"  # continuations run through EOS, as SGLang serves ignore_eos (until session 15: suppressed)
    # "random": lm_head learns from scratch. "target": lm_head and norm start as the target's (its output
    # rows of the draft vocabulary, its final norm). Session 16's CPU A/B on the same samples: held out
    # 1.524 with "target", 1.526 with "random" (trained 2.713 / 2.636): no gain, so the default stays.
    lm_head: str = "random"
    # Queries the target writes itself: sampled (temperature 1.0) from its chat template's user turn
    # (the Magpie recipe), cut at EOS, then continued like the real prompts. The head over-fits its 590
    # real prompts (session 16: 1.71 held out, 2.69 trained); these add prompts, not continuations.
    self_prompts: int = 0
    self_prompt_tokens: int = 96  # at most, per query

    def describe(self) -> dict[str, Any]:
        return asdict(self)


# The recipe on one H200 (docs/design/real-weights.md sizes it on paper: under a minute each to generate and train):
# every training prompt, 256 tokens, the greedy continuation and three sampled at 0.8, every held-out
# prompt measured.
CUDA_RECIPE = Recipe(
    device="cuda", max_prompts=0, new_tokens=256, continuations=4, temperature=0.8, gen_batch=512,
    batch_tokens=8192, epochs=8, eval_prompts=0,
)  # fmt: skip


def recipe_for(device: str) -> Recipe:
    """The recipe's defaults on ``device``: ``Recipe()`` on cpu, ``CUDA_RECIPE`` on cuda."""
    return CUDA_RECIPE if device == "cuda" else Recipe()


def check_draft_vocab(recipe: Recipe, vocab: int) -> None:
    """One-line ``UsageError`` for a draft vocabulary larger than the target's ``vocab``."""
    if recipe.draft_vocab > vocab:
        raise UsageError(f"--draft-vocab {recipe.draft_vocab}: at most the target's vocabulary, {vocab}")


def check_recipe(recipe: Recipe, cuda_available: bool | None = None) -> None:
    """One-line ``UsageError`` (exit 2) naming the flag, before anything is loaded."""
    if recipe.device not in ("cpu", "cuda"):
        raise UsageError(f"--device {recipe.device}: cpu or cuda")
    for flag, value, least in (
        ("--new-tokens", recipe.new_tokens, STEPS + 1), ("--eval-new-tokens", recipe.eval_new_tokens, STEPS + 1),
        ("--continuations", recipe.continuations, 1), ("--gen-batch", recipe.gen_batch, 1),
        ("--batch-tokens", recipe.batch_tokens, 1), ("--epochs", recipe.epochs, 1), ("--threads", recipe.threads, 1),
        ("--eval-prompts", recipe.eval_prompts, 0), ("--max-prompts", recipe.max_prompts, 0),
        ("--self-prompts", recipe.self_prompts, 0), ("--self-prompt-tokens", recipe.self_prompt_tokens, MIN_QUERY),
        ("--draft-vocab", recipe.draft_vocab, 1),
    ):  # fmt: skip
        if value < least:
            raise UsageError(f"{flag} {value}: at least {least}")
    if recipe.lm_head not in LM_HEAD_INITS:
        raise UsageError(f"--lm-head {recipe.lm_head}: one of {', '.join(LM_HEAD_INITS)}")
    if not (0.0 <= recipe.temperature <= 2.0):
        raise UsageError(f"--temperature {recipe.temperature}: between 0 and 2")
    if recipe.continuations > 1 and recipe.temperature == 0:
        raise UsageError(
            f"--continuations {recipe.continuations} needs --temperature > 0: sampled at 0 they repeat the greedy one"
        )
    if recipe.device == "cuda":
        if cuda_available is None:
            cuda_available = torch.cuda.is_available()
        if not cuda_available:
            raise UsageError(f"--device cuda: torch {torch.__version__} sees no CUDA device")


@dataclass
class Sample:
    """One prompt and a continuation: tokens, target features, target argmax per position.

    A sampled continuation's id is the prompt's with ``#c`` (c = 1, 2, ...); its prompt positions are
    labelled -1, so that a prompt trains once whatever the number of its continuations."""

    id: str
    tokens: torch.Tensor  # [n] int64: prompt + continuation
    prompt_len: int
    aux: torch.Tensor  # [n, 3 * hidden] float16 (cpu) or bfloat16 (cuda): features of every position
    labels: torch.Tensor  # [n] int64: the target's argmax at each position (its next token); -1: not trained

    @property
    def greedy(self) -> bool:
        return "#" not in self.id


@dataclass
class Target:
    """The target as transformers loads it, with what the head needs from it."""

    model: Any
    config: dict[str, Any]
    aux_layers: tuple[int, ...]

    @property
    def hidden(self) -> int:
        return int(self.config["hidden_size"])

    @property
    def device(self) -> torch.device:
        return next(iter(self.model.parameters())).device

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 embeddings (the head trains in float32 whatever the target's dtype)."""
        out: torch.Tensor = self.model.get_input_embeddings()(ids)
        return out.float()


def default_aux_layers(layers: int) -> tuple[int, ...]:
    """SGLang's default capture [2, L // 2, L - 3], as the layer ids its eagle_config names (minus one)."""
    return (1, layers // 2 - 1, layers - 4)


def load_target(path: Path, device: str = "cpu") -> Target:
    """The target in float32 on cpu; in bfloat16 (its checkpoint's dtype, as SGLang serves it) on cuda."""
    from transformers import AutoModelForCausalLM

    from patcher.real.convert import check_checkpoint

    config = check_checkpoint(path)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device)
    model.train(False)
    for p in model.parameters():
        p.requires_grad_(False)
    return Target(model, config, default_aux_layers(int(config["num_hidden_layers"])))


def tokenizer(path: Path) -> Any:
    from tokenizers import Tokenizer

    file = path / "tokenizer.json"
    if not file.is_file():
        raise ModelMissing(f"{file}: no such file")
    return Tokenizer.from_file(str(file))


def generate(
    target: Target,
    prompts: Sequence[tuple[str, list[int]]],
    new_tokens: int,
    batch: int,
    log: Callable[[str], None],
    continuations: int = 1,
    temperature: float = 0.8,
    seed: int = 15,
) -> list[Sample]:
    """Continuations (EOS ignored, as the proof's requests do) with the features of every position.

    ``batch`` sequences at once, left padded, over the target's KV cache, on the target's device.
    Per prompt: the greedy continuation, then ``continuations - 1`` sampled at ``temperature`` from
    a ``torch.Generator`` seeded with ``seed`` (deterministic for a given batch and device). The
    samples come in prompt order, each prompt's greedy one first."""
    with torch.no_grad():
        pad = int(target.config.get("pad_token_id") or 0)
        device = target.device
        store = torch.float16 if device.type == "cpu" else torch.bfloat16
        if any(not ids for _, ids in prompts):
            raise ModelInvalid("an empty prompt: nothing to continue")
        items = [(i, c) for i in range(len(prompts)) for c in range(continuations)]
        order = sorted(items, key=lambda ic: (len(prompts[ic[0]][1]), ic))  # similar lengths pad less
        generator = torch.Generator(device=device).manual_seed(seed)
        out: dict[tuple[int, int], Sample] = {}
        start = time.perf_counter()
        for b in range(0, len(order), batch):
            chunk = order[b : b + batch]
            rows = [prompts[i][1] for i, _ in chunk]
            tokens, aux, labels, width = _continue(
                target, rows, [c == 0 for _, c in chunk], new_tokens, generator, temperature, pad, store
            )
            for row, (i, c) in enumerate(chunk):
                p = len(prompts[i][1])
                lo = width - p
                row_labels = labels[row, lo:].clone()
                if c:
                    row_labels[:p] = -1
                name = prompts[i][0] if c == 0 else f"{prompts[i][0]}#{c}"
                out[(i, c)] = Sample(name, tokens[row, lo:].clone(), p, aux[row, lo:].clone(), row_labels)
            log(f"  generated {min(b + batch, len(order))}/{len(order)} ({time.perf_counter() - start:.0f} s)")
        return [out[key] for key in items]


def left_pad(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B, W], attention mask [B, W]), left padded: every prompt ends where generation starts."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, r in enumerate(rows):
        ids[row, width - len(r) :] = torch.tensor(list(r), dtype=torch.long)
        mask[row, width - len(r) :] = 1
    return ids, mask


def _argmax(lm_head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, rows: int = 4096) -> torch.Tensor:
    """argmax of ``lm_head(hidden)`` over the vocabulary, ``rows`` positions at a time ([B, N, V] at once
    is 15 GB for 512 prompts of 300 tokens)."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    out = torch.cat([lm_head(flat[i : i + rows]).float().argmax(-1) for i in range(0, flat.shape[0], rows)])
    return out.view(hidden.shape[:-1])


def _continue(
    target: Target,
    rows: Sequence[Sequence[int]],
    greedy: Sequence[bool],
    new_tokens: int,
    generator: torch.Generator,
    temperature: float,
    pad: int,
    store: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """One batch: (tokens [B, W + new], aux [B, W + new, 3H], labels [B, W + new], W), left padded.

    The prefill covers the prompts; each decode step feeds the last token over the KV cache. The
    features of a position are those the target computed for its own token there; the last token is
    never fed (its features stay zero, its label -1). No host sync inside the loop."""
    model, device = target.model, target.device
    decoder, lm_head = model.get_decoder(), model.get_output_embeddings()
    ids, mask = left_pad(rows, pad)
    ids, mask = ids.to(device), mask.to(device)
    count, width = ids.shape
    total = width + new_tokens
    tokens = torch.full((count, total), pad, dtype=torch.long, device=device)
    tokens[:, :width] = ids
    aux = torch.zeros(count, total, len(target.aux_layers) * target.hidden, dtype=store, device=device)
    labels = torch.full((count, total), -1, dtype=torch.long, device=device)
    sampled_rows = [not g for g in greedy]
    sample = temperature > 0 and any(sampled_rows)
    keep_greedy = torch.tensor(list(greedy), dtype=torch.bool, device=device)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # as transformers' generate
    cache = _cache_kwargs(decoder, model.config)  # grows in place
    out = decoder(
        input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, output_hidden_states=True, **cache
    )
    held = next(iter(cache.values())).get_seq_length()
    if held != width:  # a decoder that took the cache under another name would decode without context
        raise RuntimeError(
            f"the KV cache holds {held} positions after a prefill of {width}: not the cache the decoder used"
        )
    at = 0
    for t in range(new_tokens):
        n = out.last_hidden_state.shape[1]
        aux[:, at : at + n] = torch.cat([out.hidden_states[layer + 1] for layer in target.aux_layers], -1).to(store)
        labels[:, at : at + n] = _argmax(lm_head, out.last_hidden_state)  # last_hidden_state is normed
        at += n
        # EOS is generated where it is the argmax and the text goes on after it, as SGLang serves a
        # request with ignore_eos (it skips only the finish check): the head trains on what it will see
        logits = lm_head(out.last_hidden_state[:, -1]).float()
        choice = logits.argmax(-1)
        if sample:
            drawn = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)[:, 0]
            choice = torch.where(keep_greedy, choice, drawn)
        tokens[:, width + t] = choice
        if t + 1 == new_tokens:
            break
        mask = torch.cat([mask, mask.new_ones(count, 1)], 1)
        positions = positions[:, -1:] + 1
        out = decoder(
            input_ids=choice[:, None], attention_mask=mask, position_ids=positions, use_cache=True,
            output_hidden_states=True, **cache,
        )  # fmt: skip
    return tokens, aux, labels, width


def _cache_kwargs(decoder: Any, config: Any) -> dict[str, Any]:
    """A fresh DynamicCache under the name the decoder takes: ``cache`` (transformers >= 5.2x) or
    ``past_key_values`` (earlier; the GPU machine's image has 5.17)."""
    import inspect

    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=config)
    except TypeError:  # before the config argument
        cache = DynamicCache()
    name = "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"
    return {name: cache}


def generate_hf(
    target: Target, prompts: Sequence[tuple[str, list[int]]], new_tokens: int, batch: int, log: Callable[[str], None]
) -> list[Sample]:
    """The first generation (transformers' ``generate``, greedy only, all hidden states kept): the
    reference ``generate`` is tested against, one prompt at a time."""
    with torch.no_grad():
        return _generate_hf(target, prompts, new_tokens, batch, log)


def _generate_hf(
    target: Target, prompts: Sequence[tuple[str, list[int]]], new_tokens: int, batch: int, log: Callable[[str], None]
) -> list[Sample]:
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i][1]), i))  # similar lengths pad less
    out: dict[int, Sample] = {}
    start = time.perf_counter()
    for b in range(0, len(order), batch):
        chunk = order[b : b + batch]
        width = max(len(prompts[i][1]) for i in chunk)
        pad = int(target.config.get("pad_token_id") or 0)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, i in enumerate(chunk):  # left padding: every prompt ends where generation starts
            ids_i = prompts[i][1]
            ids[row, width - len(ids_i) :] = torch.tensor(ids_i)
            mask[row, width - len(ids_i) :] = 1
        result = target.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,  # never stop: past an EOS too, as SGLang with ignore_eos
            output_hidden_states=True,
            return_dict_in_generate=True,
            pad_token_id=pad,
        )
        # hidden_states: one tuple per generated token; the first covers the whole prompt
        steps = result.hidden_states
        aux = torch.cat(
            [torch.cat([step[layer + 1] for layer in target.aux_layers], dim=-1) for step in steps], dim=1
        )  # [B, width + new_tokens - 1, 3H]
        final = torch.cat([step[-1] for step in steps], dim=1)  # normed last hidden
        labels = target.model.get_output_embeddings()(final).argmax(-1)
        sequences = result.sequences
        for row, i in enumerate(chunk):
            p = len(prompts[i][1])
            lo = width - p
            tokens = sequences[row, lo:]
            out[i] = Sample(
                prompts[i][0],
                tokens.clone(),
                p,
                F.pad(aux[row, lo:], (0, 0, 0, 1)).to(torch.float16),  # the last token's features are never needed
                torch.cat([labels[row, lo:], torch.tensor([-1])]).clone(),  # the last token's successor is unknown
            )
        log(f"  generated {min(b + batch, len(order))}/{len(order)} ({time.perf_counter() - start:.0f} s)")
    return [out[i] for i in range(len(prompts))]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(2 * hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(2 * hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class MidLayer(nn.Module):
    def __init__(self, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int, eps: float) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.hidden_norm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim)
        self.mlp = MLP(hidden, intermediate)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama's rotate-half RoPE; x [B, heads, N, D], positions [N] or [B, N]."""
    dim = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=x.device) / dim))
    angles = positions.to(torch.float32)[..., None] * inv  # [..., N, D/2]
    if angles.dim() == 3:
        angles = angles[:, None]
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class Eagle3Head(nn.Module):
    """State dict names are the checkpoint's: fc, midlayer.*, norm, lm_head (plus buffers d2t, t2d)."""

    d2t: torch.Tensor
    t2d: torch.Tensor

    def __init__(self, config: dict[str, Any], target_vocab: int) -> None:
        super().__init__()
        hidden = int(config["hidden_size"])
        self.hidden = hidden
        self.heads = int(config["num_attention_heads"])
        self.kv_heads = int(config["num_key_value_heads"])
        self.head_dim = int(config.get("head_dim", hidden // self.heads))
        self.theta = rope_theta(config)
        eps = float(config["rms_norm_eps"])
        aux = len(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
        draft_vocab = int(config["draft_vocab_size"])
        self.fc = nn.Linear(aux * hidden, hidden, bias=False)
        self.midlayer = MidLayer(
            hidden, int(config["intermediate_size"]), self.heads, self.kv_heads, self.head_dim, eps
        )
        self.norm = RMSNorm(hidden, eps)
        self.lm_head = nn.Linear(hidden, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(target_vocab, dtype=torch.bool))

    def draft_to_target(self, ids: torch.Tensor) -> torch.Tensor:
        return ids + self.d2t[ids]

    def target_to_draft(self) -> torch.Tensor:
        """[target vocab] -> draft id, -1 where the draft vocabulary lacks the token."""
        table = torch.full((self.t2d.shape[0],), -1, dtype=torch.long, device=self.d2t.device)
        ids = torch.arange(self.lm_head.out_features, device=self.d2t.device)
        table[ids + self.d2t] = ids
        return table

    def unroll(
        self,
        embeds: Callable[[int, torch.Tensor | None], torch.Tensor],
        aux: torch.Tensor,
        valid: torch.Tensor,
        steps: int,
        stale: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """The draft logits of ``steps`` chained steps at every position at once.

        ``embeds(k, previous_logits)`` gives step k's input embeddings [B, N, H]; ``aux`` [B, N, 3H]
        the target features; ``valid`` [B, N] marks real positions (right padding); ``stale`` [B, N]
        positions whose draft K/V were never written (zero, as a fresh KV pool holds): what a
        fallback that skips the draft extend leaves behind.
        """
        layer, attn = self.midlayer, self.midlayer.self_attn
        batch, n, _ = aux.shape
        positions = torch.arange(n, device=aux.device)
        causal = torch.ones(n, n, dtype=torch.bool, device=aux.device).tril()[None, None] & valid[:, None, None, :]
        hidden = self.fc(aux)
        group = self.heads // self.kv_heads
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        out: list[torch.Tensor] = []
        logits: torch.Tensor | None = None
        for k in range(steps):
            residual = hidden
            x = torch.cat([layer.input_layernorm(embeds(k, logits)), layer.hidden_norm(hidden)], -1)
            q = attn.q_proj(x).view(batch, n, self.heads, self.head_dim).transpose(1, 2)
            key = attn.k_proj(x).view(batch, n, self.kv_heads, self.head_dim).transpose(1, 2)
            value = attn.v_proj(x).view(batch, n, self.kv_heads, self.head_dim).transpose(1, 2)
            q, key = rope(q, positions + k, self.theta), rope(key, positions + k, self.theta)
            if stale is not None and k == 0:
                key = key.masked_fill(stale[:, None, :, None], 0.0)
                value = value.masked_fill(stale[:, None, :, None], 0.0)
            keys.append(_repeat_heads(key, group))
            values.append(_repeat_heads(value, group))
            scale = 1.0 / math.sqrt(self.head_dim)
            first = (q @ keys[0].transpose(-1, -2)) * scale  # step 0's keys, causal
            first = first.masked_fill(~causal, float("-inf"))
            diag = [(q * kk).sum(-1, keepdim=True) * scale for kk in keys[1:]]  # steps 1..k at the same position
            probs = torch.softmax(torch.cat([first, *diag], -1), -1)
            mixed = probs[..., :n] @ values[0]
            for m, vv in enumerate(values[1:]):
                mixed = mixed + probs[..., n + m : n + m + 1] * vv
            o = attn.o_proj(mixed.transpose(1, 2).reshape(batch, n, -1))
            residual = o + residual
            h = layer.mlp(layer.post_attention_layernorm(residual))
            hidden = h + residual
            logits = self.lm_head(self.norm(hidden))
            out.append(logits)
        return out


def _repeat_heads(x: torch.Tensor, group: int) -> torch.Tensor:
    """``x.repeat_interleave(group, 1)`` by expand: its backward is a sum, not CUDA's atomic index_add."""
    b, heads, n, d = x.shape
    return x[:, :, None].expand(b, heads, group, n, d).reshape(b, heads * group, n, d)


def rope_theta(config: dict[str, Any]) -> float:
    """``rope_theta``, or transformers 5's ``rope_parameters.rope_theta``."""
    theta = config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta") or 10000.0
    return float(theta)


def head_config(target_config: dict[str, Any], recipe: Recipe, aux_layers: Sequence[int]) -> dict[str, Any]:
    keep = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
            "max_position_embeddings", "rms_norm_eps", "bos_token_id", "eos_token_id")  # fmt: skip
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        **{k: target_config[k] for k in keep if k in target_config},
        "intermediate_size": recipe.intermediate,
        "num_hidden_layers": 1,
        "rope_theta": rope_theta(target_config),
        "draft_vocab_size": recipe.draft_vocab,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_layers)},
        "dynspec_recipe": recipe.describe(),
    }


def draft_vocabulary(samples: Sequence[Sample], size: int, vocab: int) -> torch.Tensor:
    """The ``size`` target tokens the target predicts most often (ties by id), sorted by id."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for s in samples:
        labels = s.labels.cpu()
        counts += torch.bincount(labels[labels >= 0], minlength=vocab)
    # stable: a count sorted descending, ties by ascending id
    order = sorted(range(vocab), key=lambda t: (-int(counts[t]), t))[:size]
    return torch.tensor(sorted(order), dtype=torch.long)


def draft_vocab_coverage(head: Any, samples: Sequence[Sample]) -> float:
    """The share of the samples' trained labels inside the head's draft vocabulary (``t2d``): a
    position whose label lies outside can never be accepted, whatever the head learned."""
    labels = torch.cat([s.labels[s.labels >= 0].cpu() for s in samples])
    if labels.numel() == 0:
        return 0.0
    return round(float(head.t2d.cpu()[labels].float().mean()), 4)


def pack(samples: Sequence[Sample], budget: int) -> list[list[int]]:
    """Batches of sample indices, in order, each up to ``budget`` padded positions."""
    batches: list[list[int]] = []
    current: list[int] = []
    width = 0
    for i, s in enumerate(samples):
        n = int(s.tokens.shape[0])
        if current and max(width, n) * (len(current) + 1) > budget:
            batches.append(current)
            current, width = [], 0
        current.append(i)
        width = max(width, n)
    if current:
        batches.append(current)
    return batches


def collate(
    samples: Sequence[Sample], device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens [B, N] padded with 0, aux [B, N, 3H] float32, labels [B, N] with -1, valid [B, N]) on ``device``."""
    n = max(int(s.tokens.shape[0]) for s in samples)
    width = samples[0].aux.shape[-1]
    tokens = torch.zeros(len(samples), n, dtype=torch.long, device=device)
    aux = torch.zeros(len(samples), n, width, device=device)
    labels = torch.full((len(samples), n), -1, dtype=torch.long, device=device)
    valid = torch.zeros(len(samples), n, dtype=torch.bool, device=device)
    for row, s in enumerate(samples):
        m = int(s.tokens.shape[0])
        tokens[row, :m], aux[row, :m], labels[row, :m], valid[row, :m] = s.tokens, s.aux.float(), s.labels, True
    return tokens, aux, labels, valid


def shifted(x: torch.Tensor, by: int, fill: int) -> torch.Tensor:
    """x[:, i + by] at i (``fill`` past the end)."""
    out = torch.full_like(x, fill)
    if by < x.shape[1]:
        out[:, : x.shape[1] - by] = x[:, by:]
    return out


def step_inputs(tokens: torch.Tensor, k: int) -> torch.Tensor:
    """Step k at position i reads token i + 1 + k (teacher forcing; the chain feeds its own draft there)."""
    return shifted(tokens, k + 1, 0)


def step_labels(labels: torch.Tensor, k: int) -> torch.Tensor:
    """What step k at i must predict: the token after its input, the target's argmax at i + 1 + k."""
    return shifted(labels, k + 1, -1)


def train(
    target: Target, samples: Sequence[Sample], recipe: Recipe, log: Callable[[str], None]
) -> tuple[Eagle3Head, dict[str, Any], dict[str, Any]]:
    """Train a head on ``samples`` on the target's device (the head is initialised on the CPU, so
    the same on any device); returns it, its config, and the loss / accuracy per epoch."""
    torch.manual_seed(recipe.seed)
    config = head_config(target.config, recipe, target.aux_layers)
    vocab = int(target.config["vocab_size"])
    head = Eagle3Head(config, vocab)
    hot = draft_vocabulary(samples, recipe.draft_vocab, vocab)
    head.d2t.copy_(hot - torch.arange(recipe.draft_vocab))
    head.t2d.zero_()
    head.t2d[hot] = True
    if recipe.lm_head == "target":
        start_from_target(head, target, hot)
    device = target.device
    head.to(device)
    to_draft = head.target_to_draft()
    batches = pack(samples, recipe.batch_tokens)
    total = recipe.epochs * len(batches)
    opt = torch.optim.AdamW(head.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s, total) / total))
    )
    history: list[dict[str, Any]] = []
    generator = torch.Generator().manual_seed(recipe.seed)
    start = time.perf_counter()
    for epoch in range(recipe.epochs):
        losses, right, seen = [0.0] * STEPS, [0] * STEPS, [0] * STEPS
        for b in torch.randperm(len(batches), generator=generator).tolist():
            tokens, aux, labels, valid = collate([samples[i] for i in batches[b]], device)

            def embeds(k: int, _previous: torch.Tensor | None, tokens: torch.Tensor = tokens) -> torch.Tensor:
                return target.embed(step_inputs(tokens, k))

            logits = head.unroll(embeds, aux, valid, STEPS)
            loss = torch.zeros((), device=device)
            for k, lk in enumerate(logits):
                want = step_labels(labels, k)
                want = torch.where(want >= 0, to_draft[want.clamp(min=0)], want)
                mask = want >= 0
                if not mask.any():
                    continue
                step_loss = F.cross_entropy(lk[mask], want[mask])
                loss = loss + recipe.step_weight**k * step_loss
                losses[k] += float(step_loss.detach()) * int(mask.sum())
                right[k] += int((lk[mask].argmax(-1) == want[mask]).sum())
                seen[k] += int(mask.sum())
            opt.zero_grad(set_to_none=True)
            torch.autograd.backward(loss)
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            sched.step()
        row = {
            "epoch": epoch + 1,
            "loss": [round(losses[k] / max(1, seen[k]), 4) for k in range(STEPS)],
            "accuracy": [round(right[k] / max(1, seen[k]), 4) for k in range(STEPS)],
            "seconds": round(time.perf_counter() - start, 1),
        }
        history.append(row)
        log(f"  epoch {row['epoch']}: loss {row['loss']} accuracy {row['accuracy']} ({row['seconds']} s)")
    return (
        head,
        config,
        {"epochs": history, "batches": len(batches), "positions": sum(int(s.tokens.shape[0]) for s in samples)},
    )


def start_from_target(head: Eagle3Head, target: Target, hot: torch.Tensor) -> None:
    """The head's lm_head := the target's output rows of the draft vocabulary ``hot``, its norm := the
    target's final norm (both float32 copies, trained further)."""
    with torch.no_grad():
        rows = target.model.get_output_embeddings().weight[hot.to(target.device)]
        head.lm_head.weight.copy_(rows.float().cpu())
        norm = getattr(target.model.get_decoder(), "norm", None)
        if norm is None or tuple(norm.weight.shape) != tuple(head.norm.weight.shape):
            raise ModelInvalid("the target has no final norm of its hidden size to start the head's norm from")
        head.norm.weight.copy_(norm.weight.float().cpu())


def chain_drafts(
    head: Eagle3Head, target: Target, samples: Sequence[Sample], stale_span: int = 0
) -> list[torch.Tensor]:
    """[n, STEPS] target-vocabulary drafts of the round whose extend ends at each position; with
    ``stale_span``, as drafted over a draft KV missing the continuation's first ``stale_span`` positions."""
    with torch.no_grad():
        return _chain_drafts(head, target, samples, stale_span)


def _chain_drafts(head: Eagle3Head, target: Target, samples: Sequence[Sample], stale_span: int) -> list[torch.Tensor]:
    out = []
    for s in samples:
        tokens, aux, _, valid = collate([s], target.device)
        stale = None
        if stale_span:
            stale = torch.zeros_like(valid)
            stale[:, s.prompt_len : s.prompt_len + stale_span] = True

        def embeds(k: int, previous: torch.Tensor | None, tokens: torch.Tensor = tokens) -> torch.Tensor:
            if k == 0:
                return target.embed(shifted(tokens, 1, 0))
            assert previous is not None
            return target.embed(head.draft_to_target(previous.argmax(-1)))  # the chain feeds its own draft

        logits = head.unroll(embeds, aux, valid, STEPS, stale)
        out.append(torch.stack([head.draft_to_target(lk.argmax(-1))[0] for lk in logits], -1).cpu())
    return out


def accept_walk(tokens: torch.Tensor, drafts: torch.Tensor, prompt_len: int) -> tuple[int, int]:
    """(tokens advanced, verify rounds) of greedy chain speculation over the continuation from
    ``prompt_len`` (where speculation starts: after the prompt, or after a span off)."""
    n = int(tokens.shape[0])
    t, advanced, rounds = prompt_len, 0, 0  # tokens[prompt_len] came from the prefill
    while t + STEPS < n:
        row = drafts[t - 1]
        accepted = 0
        while accepted < STEPS and int(row[accepted]) == int(tokens[t + 1 + accepted]):
            accepted += 1
        advanced += accepted + 1
        rounds += 1
        t += accepted + 1
    return advanced, rounds


def acceptance(
    head: Eagle3Head, target: Target, samples: Sequence[Sample], drafts: Sequence[torch.Tensor] | None = None
) -> dict[str, Any]:
    """Held-out acceptance of greedy chain speculation; ``drafts``: ``chain_drafts`` of ``samples``, if made already."""
    per: dict[str, list[int]] = {}
    if drafts is None:
        drafts = chain_drafts(head, target, samples)
    for s, d in zip(samples, drafts):
        advanced, rounds = accept_walk(s.tokens.cpu(), d, s.prompt_len)
        kind = s.id.split("/", 1)[0]
        acc = per.setdefault(kind, [0, 0])
        acc[0] += advanced
        acc[1] += rounds
    total = [sum(v[0] for v in per.values()), sum(v[1] for v in per.values())]
    return {
        "accept_length": round(total[0] / max(1, total[1]), 3),
        "by_set": {k: round(v[0] / max(1, v[1]), 3) for k, v in sorted(per.items())},
        "rounds": total[1],
        "prompts": len(samples),
        "steps": STEPS,
        "topk": 1,
    }


STALE_SPANS = (32, 64, 96)  # continuation tokens decoded while off, before speculation resumes


def stale_kv_cost(
    head: Eagle3Head,
    target: Target,
    samples: Sequence[Sample],
    spans: Sequence[int] = STALE_SPANS,
    exact: Sequence[torch.Tensor] | None = None,
) -> dict[str, Any]:
    """What a draft KV left stale by a span off costs this head, offline: per span, the acceptance
    from the span's end on with the span's draft K/V zero (skip's control) and with them exact
    (``exact``: ``chain_drafts`` of ``samples``, if made already).
    The acceptance check's skip control can only fail a load whose spans cost more than its margin."""
    out: dict[str, Any] = {}
    if exact is None:
        exact = chain_drafts(head, target, samples)
    for span in spans:
        kept = [(i, s) for i, s in enumerate(samples) if int(s.tokens.shape[0]) - s.prompt_len > span + 2 * STEPS]
        if not kept:
            continue
        stale = chain_drafts(head, target, [s for _, s in kept], span)
        walks = {"exact": [0, 0], "stale": [0, 0]}
        for (i, s), d in zip(kept, stale):
            for name, drafts in (("exact", exact[i]), ("stale", d)):
                advanced, rounds = accept_walk(s.tokens.cpu(), drafts, s.prompt_len + span)
                walks[name][0] += advanced
                walks[name][1] += rounds
        lengths = {name: round(a / max(1, r), 3) for name, (a, r) in walks.items()}
        out[str(span)] = {**lengths, "ratio": round(lengths["stale"] / lengths["exact"], 4) if lengths["exact"] else None,
                          "prompts": len(kept), "rounds": walks["exact"][1]}  # fmt: skip
    return out


def save(head: Eagle3Head, config: dict[str, Any], out: Path, extra: dict[str, Any] | None = None) -> None:
    """config.json + model.safetensors in SGLang's EAGLE-3 layout (bf16 weights, int64 d2t, bool t2d)."""
    from patcher.real import tensorfile

    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, value in head.state_dict().items():
        dtype = "I64" if name == "d2t" else "BOOL" if name == "t2d" else "BF16"
        value = value.detach().cpu()
        tensors[name] = (value.float().numpy() if dtype == "BF16" else value.numpy(), dtype)
    tensorfile.write(out / "model.safetensors", tensors)
    (out / "config.json").write_text(json.dumps({**config, **(extra or {})}, indent=1) + "\n")


@dataclass
class Build:
    """What ``build`` made and measured."""

    head: Path
    acceptance: dict[str, Any]
    training: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Tokenized:
    """A prompt as the target reads it; ``text`` where it was tokenized here (the samples cache keys on it)."""

    id: str
    ids: list[int]
    text: str | None = None


def tokenized(target_dir: Path, prompts: Sequence[Any]) -> list[Tokenized]:
    tok = tokenizer(target_dir)
    return [Tokenized(p.id, list(tok.encode(p.text, add_special_tokens=False).ids), p.text) for p in prompts]


def load_prompts(path: Path, split: str) -> list[Tokenized]:
    """The prompts of ``dynspec real prompts [--split train]``; ``split`` is the one expected
    (``held_out`` also takes a file without a ``split``: those of before the training split)."""
    try:
        data = jsonfile.read(path)
    except OSError as error:  # unreadable; a missing file is ModelMissing already
        raise ModelInvalid(f"{path}: not JSON ({error})") from error
    try:
        rows = [Tokenized(str(r["id"]), [int(t) for t in r["input_ids"]]) for r in data["prompts"]]
    except (KeyError, TypeError, ValueError) as error:
        raise ModelInvalid(f"{path}: not a prompts file of `dynspec real prompts` ({error!r})") from error
    found = data.get("split", "held_out")
    if found != split:
        raise ModelInvalid(f"{path}: holds the {found} prompts, not the {split} ones")
    if not rows:
        raise ModelInvalid(f"{path}: no prompts")
    empty = [r.id for r in rows if not r.ids]
    if empty:
        raise ModelInvalid(f"{path}: prompt {empty[0]} has no tokens")
    return rows


def load_chat(path: Path) -> tuple[list[int], list[int]] | None:
    """The chat template's (prefix, suffix) ids in a training prompts file (session 16+), else None."""
    chat = jsonfile.read(path).get("chat")
    if chat is None:
        return None
    try:
        return [int(t) for t in chat["prefix"]], [int(t) for t in chat["suffix"]]
    except (KeyError, TypeError, ValueError) as error:
        raise ModelInvalid(f"{path}: its chat ids are not a prefix and a suffix ({error!r})") from error


def self_prompts(
    target: Target, chat: tuple[list[int], list[int]], recipe: Recipe, log: Callable[[str], None]
) -> list[Tokenized]:
    """``recipe.self_prompts`` queries the target writes itself after the chat template's prefix
    (sampled at temperature 1.0 with the recipe's seed + 1), each cut at its first EOS, shorter ones
    than ``MIN_QUERY`` and repeats dropped, wrapped as ``prefix + query + suffix``."""
    prefix, suffix = chat
    eos = target.config.get("eos_token_id")
    stops = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    drawn = generate(
        target,
        [("self", prefix)],
        recipe.self_prompt_tokens,
        recipe.gen_batch,
        log,
        recipe.self_prompts + 1,
        1.0,
        recipe.seed + 1,
    )[1:]  # the first is the greedy one
    seen: set[tuple[int, ...]] = set()
    out: list[Tokenized] = []
    for sample in drawn:
        query = [int(t) for t in sample.tokens[sample.prompt_len :]]
        ends = [i for i, t in enumerate(query) if t in stops]
        query = query[: ends[0]] if ends else query
        if len(query) < MIN_QUERY or tuple(query) in seen:
            continue
        seen.add(tuple(query))
        out.append(Tokenized(f"self/{len(out)}", prefix + query + suffix))
    log(f"  {len(out)} self-written queries kept of {len(drawn)}")
    return out


def pick_eval(held_out: Sequence[Any], count: int) -> list[Any]:
    """Up to ``count`` (0: all) held-out prompts, alternating between the sets, in id order within each."""
    count = count or len(held_out)
    by_set: dict[str, list[Any]] = {}
    for p in sorted(held_out, key=lambda p: p.id):
        by_set.setdefault(p.id.split("/", 1)[0], []).append(p)
    out: list[Any] = []
    queues = [list(v) for _, v in sorted(by_set.items())]
    while len(out) < count and any(queues):
        for q in queues:
            if q and len(out) < count:
                out.append(q.pop(0))
    return out


def cached_samples(
    target: Target,
    target_dir: Path,
    chosen: Sequence[Tokenized],
    new_tokens: int,
    recipe: Recipe,
    log: Callable[[str], None],
    continuations: int = 1,
) -> list[Sample]:
    """``generate``'s samples. On the CPU they are kept in ``<cache>/real/samples`` under a digest of
    the target's weights, the prompts and the length (and the sampling, where there is any):
    generation is most of a build's time there. On a GPU they are made afresh."""
    rows = [(p.id, p.ids) for p in chosen]
    if recipe.device != "cpu":
        return generate(target, rows, new_tokens, recipe.gen_batch, log, continuations, recipe.temperature, recipe.seed)
    import hashlib

    from patcher.real.fetch import sha256
    from patcher.releases import cache_dir

    weights = sha256(target_dir / "model.safetensors")
    what: list[Any] = [weights, [[p.id, p.text if p.text is not None else p.ids] for p in chosen], new_tokens]
    what.append({"eos": recipe.eos})  # until session 15 EOS was suppressed: those continuations are not reused
    if continuations > 1:
        what.append(
            {
                "continuations": continuations,
                "temperature": recipe.temperature,
                "seed": recipe.seed,
                "batch": recipe.gen_batch,
            }
        )
    key = hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]
    path = cache_dir() / "real" / "samples" / f"{key}.pt"
    if path.is_file():
        log(f"  {len(chosen)} prompts' continuations from {path}")
        cached = torch.load(path, weights_only=True)
        return [Sample(r["id"], r["tokens"], int(r["prompt_len"]), r["aux"], r["labels"]) for r in cached]
    samples = generate(target, rows, new_tokens, recipe.gen_batch, log, continuations, recipe.temperature, recipe.seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = [
        {"id": s.id, "tokens": s.tokens, "prompt_len": s.prompt_len, "aux": s.aux, "labels": s.labels} for s in samples
    ]
    torch.save(kept, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)
    return samples


def training_prompts(
    target_dir: Path, recipe: Recipe, files: tuple[Path, Path] | None
) -> tuple[list[Tokenized], list[Tokenized], int, tuple[list[int], list[int]] | None]:
    """(training prompts, held-out prompts measured, held-out prompts there are, the chat template's
    prefix and suffix ids): from the prompt files of `dynspec real prompts` (a machine without
    network), else from the two sets (fetched)."""
    chat: tuple[list[int], list[int]] | None = None
    if files is not None:
        chat = load_chat(files[0])
        train_prompts, held_out = load_prompts(files[0], "train"), load_prompts(files[1], "held_out")
        shared = sorted({p.id for p in train_prompts} & {p.id for p in held_out})
        if shared:
            raise ModelInvalid(f"{files[0]} and {files[1]} share prompt {shared[0]}: the held-out ones must not train")
    else:
        from patcher.real import fetch, prompts

        everything = prompts.humaneval(fetch.extracted(fetch.HUMANEVAL)) + prompts.writingbench(
            fetch.extracted(fetch.WRITINGBENCH)
        )
        train_raw, held_raw = prompts.split(everything)
        train_prompts, held_out = tokenized(target_dir, train_raw), tokenized(target_dir, held_raw)
        from patcher.real.prepare import chat_ids

        ids = chat_ids(tokenizer(target_dir))
        chat = ids["prefix"], ids["suffix"]
    if recipe.max_prompts:
        train_prompts = pick_eval(train_prompts, recipe.max_prompts)
    return train_prompts, pick_eval(held_out, recipe.eval_prompts), len(held_out), chat


def build(
    target_dir: Path,
    out: Path,
    recipe: Recipe,
    log: Callable[[str], None],
    prompt_files: tuple[Path, Path] | None = None,
) -> Build:
    """Prompts -> continuations -> head -> acceptance on held-out prompts; writes the head to ``out``.

    ``prompt_files``: (training, held-out) prompts made by `dynspec real prompts`; else fetched."""
    check_recipe(recipe)
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    if recipe.device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; before its first use
        torch.backends.cuda.matmul.allow_tf32 = True  # the head trains in float32 on TF32 tensor cores
        torch.backends.cudnn.allow_tf32 = True
        torch.use_deterministic_algorithms(
            True, warn_only=True
        )  # an op without a deterministic kernel warns, not stops
    else:
        torch.use_deterministic_algorithms(True)
    train_prompts, eval_prompts, held_count, chat = training_prompts(target_dir, recipe, prompt_files)
    if recipe.self_prompts and chat is None:
        raise UsageError(
            "--self-prompts needs the chat template's ids: make the training prompts again with `dynspec real prompts --split train`"
        )
    target = load_target(target_dir, recipe.device)
    check_draft_vocab(recipe, int(target.config["vocab_size"]))
    timings["load"] = time.perf_counter() - clock
    if recipe.self_prompts:
        assert chat is not None
        train_prompts = [*train_prompts, *self_prompts(target, chat, recipe, log)]
        timings["self_prompts"] = time.perf_counter() - clock - sum(timings.values())
    log(f"{len(train_prompts)} training prompts x {recipe.continuations} continuations of {recipe.new_tokens} tokens, "
        f"{len(eval_prompts)} held out of {held_count}; on {recipe.device}")  # fmt: skip
    train_samples = cached_samples(
        target, target_dir, train_prompts, recipe.new_tokens, recipe, log, recipe.continuations
    )
    timings["generate_train"] = time.perf_counter() - clock - sum(timings.values())
    eval_samples = cached_samples(target, target_dir, eval_prompts, recipe.eval_new_tokens, recipe, log)
    timings["generate_eval"] = time.perf_counter() - clock - sum(timings.values())
    head, config, training = train(target, train_samples, recipe, log)
    timings["train"] = time.perf_counter() - clock - sum(timings.values())
    drafts = chain_drafts(head, target, eval_samples)  # once, for the acceptance and the stale spans' reference
    measured = acceptance(head, target, eval_samples, drafts)
    greedy_train = [s for s in train_samples if s.greedy][: len(eval_samples)]
    measured["train_accept_length"] = acceptance(head, target, greedy_train)["accept_length"]
    measured["stale_kv"] = stale_kv_cost(head, target, eval_samples, exact=drafts)
    measured["draft_vocab_coverage"] = draft_vocab_coverage(head, eval_samples)
    timings["measure"] = time.perf_counter() - clock - sum(timings.values())
    if recipe.device == "cuda":
        training["cuda_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    extra = {"dynspec_acceptance": measured, "dynspec_training": training}
    save(head, config, out, extra)
    check_head(out, target.config)
    return Build(out, measured, training, {k: round(v, 1) for k, v in timings.items()})
