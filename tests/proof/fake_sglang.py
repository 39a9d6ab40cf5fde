"""A stand-in for ``python -m sglang.launch_server``, standard library only.

It serves ``/health``, ``/model_info``, ``/get_model_info`` and a ``/generate`` whose greedy
outputs are a fixed function of the prompt, and logs like SGLang (``[date TP0] ...`` lines and
uvicorn-style access lines) to stdout. With ``--speculative-disable-batch-size N`` it plays the
patched server: the batch size is the number of requests in flight, and it logs
``dynspec: speculation OFF at batch size B (off above N, on at or below M)`` when that exceeds N,
``... ON ...`` when it is back at or below the enable threshold M. With ``auto`` it starts at
auto's ceiling (``--max-running-requests`` - 1) both ways and, at its first switch off, moves
to ``FAKE_SGLANG_AUTO`` (``OFF,ON``, default 48,40), logging a ``dynspec auto:`` line in the
runtime's format, as its driver does once it has timed both modes. Like SGLang it starts a child process
("scheduler") in its own process group and logs its pid.

Faults, for the tests that must see the harness fail (``FAKE_SGLANG_FAULT``, comma list):
``diverge`` (outputs change while speculation is off), ``http500`` (every 5th /generate fails),
``traceback`` (a traceback in the log on the 3rd /generate), ``crash`` (exit before serving),
``short`` (one token too few; ``shortbatch``: only a batched request without a JSON schema), ``noswitch`` (never logs a switch), ``wrongside`` (switch OFF
logged with the enable threshold's batch size), ``noflush`` (``/flush_cache`` answers 400),
``adaptiveoff`` (with ``--speculative-adaptive``, log SGLang's warning that it turned it off),
``kvdrift`` (a KV-only dynspec server's drafts after a fallback span differ from
``DYNSPEC_DRAFT_KV=full``'s), ``nocontrol`` (``DYNSPEC_DRAFT_KV=skip`` drafts what full does),
``kvoff`` (a KV-only dynspec server's start-up line says it runs the full draft extend),
``autowrong`` (with ``auto``, each switch off names its own batch size as the size it is off above),
``smallpool`` (its start-up line names a KV pool half the ``--max-total-tokens`` asked for),
``thresholdlie`` (with a number N, switch lines name N + 1 as the size speculation is off above),
``refusaltraceback`` (a refused start raises the ValueError, as dynspec did before session 27: a
traceback), ``norefusal`` (nothing is refused), ``metricsdrift`` (the switch counter misses every
other switch), ``nometrics`` (``/metrics`` holds none of dynspec's counters), and for a request
that arrives at a dynspec server while speculation is off (others are never affected):
``skewsampling`` (it samples, and reports logprobs, at 0.7x the requested temperature),
``logprobdrift`` (every logprob it reports is 0.2 higher, beyond bf16 rounding), ``droppenalty`` (its frequency and
presence penalties are ignored), ``nologprobs`` (its meta_info lacks ``output_token_logprobs``),
``grammarbreak`` (its JSON-schema output loses the closing brace); ``nofreeze`` (``/freeze_gc``
answers 404, as a release without the route would), ``freezedrop`` (it closes the connection unanswered).
With ``--gc-warning-threshold-secs`` it logs SGLang's long-collection line once, on its 3rd /generate,
unless ``/freeze_gc`` came first (``LONG_GC_SECONDS``).

Started without ``--skip-tokenizer-init`` it has a "tokenizer": every reply carries ``text``, a
character per token id, and a request with a ``json_schema`` gets compact JSON of the proof's schema
(``constrained_json``), a token per character; with ``--skip-tokenizer-init`` the schema is ignored.
Sent in a batch, such a request ends at its EOS: it leaves the batch at its admission, and the fake
switches as the batch shrinks.

A request with ``temperature`` > 0, ``top_p``, ``top_k``, ``frequency_penalty`` or
``presence_penalty`` in its sampling parameters, or with ``return_logprob`` true, decodes with a
token model instead (``decode``); other requests get ``outputs()``. The next token's distribution is a
function of the context: 64 distinct candidate ids from a hash of the prompt and the context's
length modulo 4 (``candidates``), with logits 3.0 - 0.05 j, so greedy decoding repeats its 4 tokens
and a penalty of 0.5 changes it at the 5th. As in SGLang, penalties come off the logits (frequency x
count in the output + presence if counted; a server without ``--disable-overlap-schedule`` counts
late, as the overlap scheduler does), the temperature divides them (greedy: argmax, logprobs
at temperature 1; an absent temperature is 1.0), top_k then top_p (on the untruncated mass) truncate,
and a ``random.Random`` samples (seeded by the request's ``sampling_seed`` where it has one). ``return_logprob`` adds ``output_token_logprobs``
(``[[logprob, id, null], ...]``, under the full distribution) and ``top_logprobs_num`` k > 0
``output_top_logprobs`` (k such triples per token, most likely first) to meta_info.

With ``--enable-metrics`` it serves ``/metrics`` with the runtime's three counters: a switch per
switch line, and per request a speculative or a fallback iteration (the mode it arrived in).

Playing dynspec, it runs the real start-up check (``patches/runtime/dynspec_settings.py``) on its
flags before serving, as SGLang's ``check_server_args`` calls it, with the zero-step mode present
from 0.5.14 (the fake site's version).

With ``FAKE_SGLANG_ACCEPT=A`` a recorded request's speculative step advances A tokens (accepted + 1)
while its draft KV is exact and one token once it is stale (after an off span under ``skip``, or
under ``kvdrift``), so the ``acceptance`` check sees a control that drops; unset, every step is one token.

Playing dynspec, it logs the runtime's start-up line (``dynspec: v2 fallback ready in ...``, with
the words of ``describe_draft_kv`` for ``DYNSPEC_DRAFT_KV`` as the runtime resolves it on v2: unset
or ``auto`` is kv (the own fallback's), ``kv``, ``kv-graph`` and ``kv-direct`` the KV-only one, the last two from a
captured CUDA graph). A KV-only server is one with any of those three. With ``DYNSPEC_RECORD_DRAFTS`` set,
a request whose rid (from the ``/generate`` body) starts with ``RECORD_RID_PREFIX`` decodes one
token per ``FAKE_SGLANG_STEP_DELAY`` seconds, deciding at each step like dynspec, and appends one
line per step in the runtime's format: ``fall back`` while off, ``resume`` at the first step back
on, else ``speculate`` with three drafts that are a fixed function of (prompt, position). Under
``DYNSPEC_DRAFT_KV=skip`` (no draft extend while off) they differ after an off span, as a stale
draft KV makes them. With ``DYNSPEC_CHECK_KV_BITS`` too it drafts as the full extend does (the
runtime keeps the full extend's K/V) and appends a line per fallback step to that file as
``KVBitCheck`` does: its one row exact, its packed control not (faults ``bitsdrift``: the direct
write differs; ``nobitscontrol``: the control does not).

Once up it logs three ``Decode batch`` lines at 8 running requests, 40 iterations apart, as SGLang
does every ``decode_log_interval``: plain decode at 1000 tok/s, dynspec's fallback at 0.85x that,
upstream's adaptive mode at 0.4x, and always-on speculation 3 tokens per request and step (a
speculative server's lines carry its acceptance length). With ``FAKE_SGLANG_SPECULATING_SPEED`` a
dynspec server logs three lines more, speculating as always-on does at that fraction of its speed.

With ``--speculative-adaptive`` it logs the config file given by ``--speculative-adaptive-config``
and waits ``FAKE_SGLANG_ADAPTIVE_DELAY`` seconds per request (default: ``FAKE_SGLANG_DELAY``), so
tests can make upstream's adaptive mode faster or slower than the other servers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

RECORD_RID_PREFIX = "dynspec-record-"  # dynspec_runtime.RECORD_RID_PREFIX
DRAFT_KV_WORDS = {  # dynspec_runtime.describe_draft_kv; kv-graph with its graph captured
    "full": "full draft extend in every fallback iteration",
    "kv": "draft KV only while off (eagerly), full draft extend at resume",
    "kv-graph": "draft KV only while off (from a CUDA graph), full draft extend at resume",
    "kv-direct": "draft KV only while off (from a CUDA graph, replayed directly), full draft extend at resume",
    "skip": "no draft extend while off (negative control)",
}
KV_ONLY_MODES = ("kv", "kv-graph", "kv-direct")
DRAFTS_PER_STEP = 3


_OUTPUT = threading.Lock()


def say(text: str) -> None:
    """Print ``text`` as one block: handler threads print at once, and print() writes the text and
    its newline separately, so a line could run into another thread's (``... 500INFO: ...``, where
    the error pattern finds no word boundary after the status)."""
    with _OUTPUT:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def log(message: str) -> None:
    say(f"[2026-11-29 12:00:00 TP0] {message}")


def log_decode_steps(speculative: bool, dynspec: bool, adaptive: bool) -> None:
    running, interval = 8, 40
    fallback = float(os.environ.get("FAKE_SGLANG_FALLBACK_SPEED", "0.85"))  # a fallback step / a plain one
    speed = 1000.0 * (fallback if dynspec else 0.4 if adaptive else 1.0)
    per_step = 3 if speculative and not (dynspec or adaptive) else 1
    steps = [(per_step, speed)]
    speculating = os.environ.get("FAKE_SGLANG_SPECULATING_SPEED")  # dynspec's speculative step / always-on's
    if dynspec and speculating:  # then three lines speculating, as always-on's
        steps.append((3, 1000.0 * float(speculating)))
    for accepted, tok_s in steps:
        accept = f"accept len: {accepted:.2f}, " if speculative else ""  # as SGLang logs a speculative server
        for k in range(3):
            tokens = 100 + k * running * interval * accepted
            log(
                f"Decode batch, #running-req: {running}, #token: {tokens}, token usage: 0.00, {accept}"
                f"cuda graph: True, gen throughput (token/s): {tok_s * accepted:.2f}, #queue-req: 0"
            )


def outputs(input_ids: list[int], n: int) -> list[int]:
    seed = sum(input_ids) + len(input_ids)
    return [(seed * 31 + k * 7919) % 32000 for k in range(n)]


VOCAB = 32000
CANDIDATES = 64  # the token model's candidates per position
TOP_LOGIT, LOGIT_STEP = 3.0, 0.05  # candidate j's logit: TOP_LOGIT - LOGIT_STEP * j
MODEL_PERIOD = 4  # the candidates depend on the context's length modulo this
SAMPLING_EPS = 1e-6  # SGLang's: a temperature below it is greedy
MODEL_FIELDS = ("top_p", "top_k", "frequency_penalty", "presence_penalty")


def candidates(input_ids: list[int], length: int) -> list[int]:
    """The token model's 64 distinct candidate ids, most likely first, after a context of ``length``
    tokens that starts with the prompt ``input_ids``."""
    key = f"{','.join(map(str, input_ids))}|{length % MODEL_PERIOD}".encode()
    digest = hashlib.sha256(key).digest()
    start = int.from_bytes(digest[:4], "big") % VOCAB
    step = int.from_bytes(digest[4:8], "big") % (VOCAB // 2) * 2 + 1
    while step % 5 == 0:  # coprime with 32000 = 2^8 5^3: 64 distinct ids
        step += 2
    return [(start + j * step) % VOCAB for j in range(CANDIDATES)]


def constrained_json(input_ids: list[int], broken: bool = False) -> str:
    """What a request constrained by the proof's JSON schema gets: compact JSON, its values a fixed
    function of the prompt; ``broken`` (fault ``grammarbreak``) loses the closing brace."""
    seed = sum(input_ids) + len(input_ids)
    value = {"color": ("red", "green", "blue")[seed % 3], "size": ("small", "large")[seed % 2], "ok": seed % 5 == 0}
    text = json.dumps(value, separators=(",", ":"))
    return text[:-1] if broken else text


def uses_token_model(params: dict[str, Any], return_logprob: bool) -> bool:
    """True when a request decodes with the token model: it samples, truncates, penalizes or asks
    for logprobs. A plain greedy request (temperature 0 or none) gets ``outputs()``."""
    temperature = params.get("temperature")
    sampled = temperature is not None and float(temperature) >= SAMPLING_EPS
    return sampled or return_logprob or any(name in params for name in MODEL_FIELDS)


def logit_step(length: int) -> float:
    """The logits' slope after a context of ``length`` tokens: it varies with the position, so that
    each position's logprobs differ (the logprobs check's control compares neighbours)."""
    return LOGIT_STEP * (1 + (length % MODEL_PERIOD) / 2)


def distribution(
    cands: list[int],
    counts: dict[int, int],
    temperature: float,
    frequency: float,
    presence: float,
    step: float = LOGIT_STEP,
) -> list[tuple[float, int]]:
    """(logprob, id) of every candidate, most likely first: penalties off the logits, then the
    temperature, as SGLang's penalizers and sampler do."""
    logits = []
    for j, token in enumerate(cands):
        count = counts.get(token, 0)
        logit = TOP_LOGIT - step * j - frequency * count - presence * (count > 0)
        logits.append(logit / temperature)
    top = max(logits)
    norm = top + math.log(sum(math.exp(x - top) for x in logits))
    ranked = sorted(range(len(cands)), key=lambda j: -logits[j])  # stable: ties keep candidate order
    return [(logits[j] - norm, cands[j]) for j in ranked]


def truncate(ranked: list[tuple[float, int]], top_k: int, top_p: float) -> list[tuple[float, int]]:
    """SGLang's top-k then top-p: keep the first ``top_k`` (<= 0: all) and, of those, each whose
    preceding mass (of the untruncated distribution) is at most ``top_p``."""
    kept = ranked[:top_k] if top_k > 0 else ranked
    out, before = [], 0.0
    for logprob, token in kept:
        if before > top_p:
            break
        out.append((logprob, token))
        before += math.exp(logprob)
    return out


def decode(
    input_ids: list[int],
    n: int,
    params: dict[str, Any],
    *,
    skew: float = 1.0,
    penalties: bool = True,
    late_penalties: bool = False,
    rng: random.Random | None = None,
) -> tuple[list[int], list[tuple[float, int]], list[list[tuple[float, int]]]]:
    """``n`` tokens of the token model: (tokens, (logprob, id) of each, its ranked distribution).

    ``skew`` scales the temperature, ``penalties`` False ignores them (the faults' servers).
    ``late_penalties``: a token is counted ``MODEL_PERIOD`` steps after it was drawn. SGLang's overlap
    scheduler counts it one step late (0.5.12's ``prepare_for_decode`` cumulates ``req.output_ids[-1]``
    while the newest token is still in flight); here a step's candidates are those of a period before,
    so only a lag of a whole period changes the tokens, as one step does now and then on real weights."""
    temperature = float(params.get("temperature", 1.0))
    greedy = temperature < SAMPLING_EPS
    temperature = 1.0 if greedy else temperature * skew  # SGLang: greedy is temperature 1, top_k 1
    top_k = int(params.get("top_k", -1))
    top_p = float(params.get("top_p", 1.0))
    frequency = float(params.get("frequency_penalty", 0.0)) if penalties else 0.0
    presence = float(params.get("presence_penalty", 0.0)) if penalties else 0.0
    # a request's sampling_seed seeds its draws (as deterministic inference does): the tests' p-values
    # are then the same on every run; without one, unseeded
    rng = rng or random.Random(params.get("sampling_seed"))
    tokens: list[int] = []
    chosen: list[tuple[float, int]] = []
    ranked_all: list[list[tuple[float, int]]] = []
    counts: dict[int, int] = {}
    for k in range(n):
        drawn = k - 1 - (MODEL_PERIOD if late_penalties else 0)  # the token the penalties count from now on
        if drawn >= 0:
            counts[tokens[drawn]] = counts.get(tokens[drawn], 0) + 1
        length = len(input_ids) + k
        ranked = distribution(
            candidates(input_ids, length), counts, temperature, frequency, presence, logit_step(length)
        )
        if greedy:
            pick = ranked[0]
        else:
            kept = truncate(ranked, top_k, top_p)
            pick = rng.choices(kept, weights=[math.exp(lp) for lp, _ in kept])[0]
        tokens.append(pick[1])
        chosen.append(pick)
        ranked_all.append(ranked)
    return tokens, chosen, ranked_all


def drafts(input_ids: list[int], position: int) -> list[int]:
    """What an exact draft KV proposes at ``position``: a function of the prompt and the position."""
    seed = sum(input_ids) + len(input_ids)
    return [(seed * 131 + position * 17 + j * 7) % 32000 for j in range(DRAFTS_PER_STEP)]


def draft_kv_mode(setting: str | None) -> str:
    """``DYNSPEC_DRAFT_KV`` as the runtime resolves it on the path the fake plays, dynspec's own v2
    fallback on a release whose stock graph runner it feeds: ``auto`` is ``DRAFT_KV_DEFAULT_OWN_FALLBACK``,
    kv-direct."""
    setting = (setting or "auto").strip().lower() or "auto"
    return "kv-direct" if setting == "auto" else setting


class State:
    def __init__(
        self,
        disable: int | None,
        enable: int | None,
        speculative: bool,
        faults: set[str],
        found: tuple[int, int] | None = None,
    ) -> None:
        self.disable = disable
        self.enable = enable if enable is not None else (disable or 0)
        self.found = found  # auto: the thresholds it moves to at its first switch off
        self.auto = found is not None
        self.speculative = speculative
        self.faults = faults
        self.on = True
        self.inflight = 0
        self.max_inflight = 0
        self.generates = 0
        self.lock = threading.Lock()
        self.delay = float(os.environ.get("FAKE_SGLANG_DELAY", "0.05"))
        self.acc = float(os.environ.get("SGLANG_SIMULATE_ACC_LEN", "-1"))
        self.quiet = False
        self.tokenizer = False  # started without --skip-tokenizer-init: replies carry text, grammars apply
        # without --disable-overlap-schedule, speculating or not: penalties counted a token late (decode's
        # late_penalties); the proof needs only that a plain server there penalizes unlike v1's scheduler
        self.overlap = True
        self.flushes = 0
        # FAKE_SGLANG_PREFIX_CACHE=1: log a prefill line per request, its prompt cached if sent before
        self.prefix_cache = os.environ.get("FAKE_SGLANG_PREFIX_CACHE") == "1"
        self.cached: set[tuple[int, ...]] = set()
        self.rids: list[str | None] = []  # the rid of every /generate, in arrival order
        self.draft_kv = draft_kv_mode(os.environ.get("DYNSPEC_DRAFT_KV"))
        self.configured_kv = self.draft_kv  # what its start-up line names, as the runtime's does
        self.record_path = os.environ.get("DYNSPEC_RECORD_DRAFTS", "").strip() if disable is not None else ""
        self.bits_path = os.environ.get("DYNSPEC_CHECK_KV_BITS", "").strip() if disable is not None else ""
        if self.bits_path:
            self.draft_kv = "full"  # the check keeps the full extend's K/V
        self.step_delay = float(os.environ.get("FAKE_SGLANG_STEP_DELAY", "0.002"))
        self.record_lock = threading.Lock()
        self.accept = max(1, int(os.environ.get("FAKE_SGLANG_ACCEPT", "1")))
        self.counted = {"spec": 0, "fallback": 0, "switches": 0}  # dynspec_runtime.DynspecMetrics's
        self.switch_lines = 0
        self.metrics = False  # --enable-metrics
        self.gc_warning = 0.0  # --gc-warning-threshold-secs (SGLang's default: 0, no line)
        self.gc_frozen = False  # /freeze_gc answered

    def prefill(self, input_ids: list[int]) -> None:
        """SGLang's prefill line for one request, as a radix cache would count its prompt."""
        if not self.prefix_cache:
            return
        with self.lock:
            hit = tuple(input_ids) in self.cached
            self.cached.add(tuple(input_ids))
        new, cached = (0, len(input_ids)) if hit else (len(input_ids), 0)
        log(
            f"Prefill batch, #new-seq: 1, #new-token: {new}, #cached-token: {cached}, token usage: 0.00, #running-req: 0"
        )

    def arrive(self, rid: str | None = None) -> tuple[int, bool]:
        """Count a request in; switch like dynspec. Returns (its number, speculation on)."""
        with self.lock:
            self.inflight += 1
            self.generates += 1
            self.rids.append(rid)
            self.max_inflight = max(self.max_inflight, self.inflight)
            self._switch()
            self.counted["spec" if self.on else "fallback"] += 1
            return self.generates, self.on

    def decide(self) -> bool:
        """One decode iteration of a recorded request: switch like dynspec; True while speculating."""
        with self.lock:
            self._switch()
            return self.on

    def _count_switch(self) -> None:
        self.switch_lines += 1
        if "metricsdrift" not in self.faults or self.switch_lines % 2:
            self.counted["switches"] += 1

    def metrics_text(self) -> str:
        """``/metrics`` as prometheus_client writes the runtime's counters (plus one of SGLang's own)."""
        lines = ['sglang:num_running_reqs{model_name="fake"} 0.0']
        if "nometrics" not in self.faults:
            for key, name in (
                ("spec", "spec_iterations"),
                ("fallback", "fallback_iterations"),
                ("switches", "switches"),
            ):
                lines += [
                    f"# TYPE sglang:dynspec_{name}_total counter",
                    f'sglang:dynspec_{name}_total{{model_name="fake"}} {float(self.counted[key])}',
                ]
        return "\n".join(lines) + "\n"

    def _switch(self) -> None:
        if self.disable is not None and "noswitch" not in self.faults:
            if self.on and self.inflight > self.disable:
                self.on = False
                size = self.enable if "wrongside" in self.faults else self.inflight
                off = (
                    size if "autowrong" in self.faults and self.auto else self.disable + ("thresholdlie" in self.faults)
                )
                log(f"dynspec: speculation OFF at batch size {size} (off above {off}, on at or below {self.enable})")
                self._count_switch()
                if self.found is not None:
                    self.disable, self.enable = self.found
                    self.found = None
                    accept = f"{self.acc:.2f}" if self.acc > 0 else "unknown"
                    log(
                        f"dynspec auto: off above {self.disable}, on at or below {self.enable} (estimated; "
                        f"acceptance {accept}; speculative / fallback tokens/s by batch size 16: 1.50, 64: 0.87)"
                    )
            elif not self.on and self.inflight <= self.enable:
                self.on = True
                log(
                    f"dynspec: speculation ON at batch size {self.inflight} (off above {self.disable}, on at or below {self.enable})"
                )
                self._count_switch()

    def records(self, rid: Any) -> bool:
        return bool(self.record_path) and isinstance(rid, str) and rid.startswith(RECORD_RID_PREFIX)

    def decode_recorded(self, rid: str, input_ids: list[int], n: int) -> None:
        """Decode ``n`` tokens one step at a time, recording each step as DraftRecorder does."""
        if self.draft_kv == "skip":
            stale = "nocontrol" not in self.faults
        else:
            stale = self.draft_kv in KV_ONLY_MODES and "kvdrift" in self.faults
        was_off = had_off = False
        k = 0
        while k < n:
            time.sleep(self.step_delay)
            on = self.decide()
            position = len(input_ids) + k
            k += 1 if not on or was_off or (stale and had_off) else self.accept
            record: dict[str, Any] = {"step": "speculate", "rid": [rid], "pos": [position]}
            if not on:
                record["step"] = "fall back"
            elif was_off:
                record["step"] = "resume"
            else:
                proposed = drafts(input_ids, position)
                if stale and had_off:
                    proposed[0] = (proposed[0] + 1) % 32000  # what a draft KV with holes proposes
                record["draft"] = [proposed]
            was_off, had_off = not on, had_off or not on
            with self.record_lock, open(self.record_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, separators=(",", ":")) + "\n")
            if self.bits_path and not on:
                bits = {
                    "rows": 1,
                    "direct": int("bitsdrift" in self.faults),
                    "packed": int("nobitscontrol" not in self.faults),
                }
                with self.record_lock, open(self.bits_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(bits, separators=(",", ":")) + "\n")

    def admit(self, rids: list[Any]) -> list[tuple[int, bool]]:
        """Count a batch's requests in together, as SGLang admits a pre-tokenized batch in one
        prefill, switching once for the batch; (number, speculation on) for each."""
        with self.lock:
            self.inflight += len(rids)
            self.max_inflight = max(self.max_inflight, self.inflight)
            self._switch()
            out = []
            for rid in rids:
                self.generates += 1
                self.rids.append(rid)
                self.counted["spec" if self.on else "fallback"] += 1
                out.append((self.generates, self.on))
            return out

    def leave(self) -> None:
        with self.lock:
            self.inflight -= 1

    def leave_early(self) -> None:
        """A request that ended at its EOS leaves while its batch decodes on: switch like dynspec
        (requests that run to their max_new_tokens leave with their batch, at no iteration of its)."""
        with self.lock:
            self.inflight -= 1
            self._switch()

    def draft_kv_words(self) -> str:
        """The start-up line's words for the draft extend while off (``kvoff``: a KV-only server's say full)."""
        kv_only = self.configured_kv in KV_ONLY_MODES
        return DRAFT_KV_WORDS["full" if kv_only and "kvoff" in self.faults else self.configured_kv]


BACKEND_CLASSES = {"triton": "TritonAttnBackend", "flashinfer": "FlashInferAttnBackend"}  # what its line names

# The one collection it logs, on its 3rd /generate where --gc-warning-threshold-secs is at most this
# and /freeze_gc has not been called: session 38's generation-2 collection of the start-up's objects.
LONG_GC_SECONDS = 0.4592


def make_handler(state: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # uvicorn's access-log shape
            if not state.quiet:
                say(f'INFO:     127.0.0.1:1 - "{self.command} {self.path} HTTP/1.1" {args[1]}')

        def reply(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self.reply(200, {})
            elif self.path in ("/model_info", "/get_model_info"):
                self.reply(200, {"model_path": "fake", "is_generation": True})
            elif self.path == "/metrics" and state.metrics:
                data = state.metrics_text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                self.reply(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            raw = self.rfile.read(length)
            if self.path == "/flush_cache":
                state.flushes += 1
                state.cached.clear()
                self.reply(400 if "noflush" in state.faults else 200, {})
                return
            if self.path == "/freeze_gc":  # as SGLang's scheduler logs it; a release without the route: 404
                if "nofreeze" in state.faults:
                    self.reply(404, {"detail": "Not Found"})
                    return
                if "freezedrop" in state.faults:  # the connection closes with no answer
                    self.close_connection = True
                    return
                log("Freezing GC in scheduler process. gen0: 120->0, gen1: 40->0, gen2: 9000->0")
                state.gc_frozen = True
                self.reply(200, {})
                return
            body = json.loads(raw)
            if self.path != "/generate":
                self.reply(404, {"error": "not found"})
                return
            if body.get("input_ids") and isinstance(body["input_ids"][0], list):  # a batch, as SGLang takes one
                self.batch(body)
                return
            fields = {name: body[name] for name in ("return_logprob", "top_logprobs_num") if name in body}
            status, reply = self.one(body["input_ids"], body["sampling_params"], body.get("rid"), fields)
            self.reply(status, reply)

        def batch(self, body: dict[str, Any]) -> None:
            """Every request of the batch at once, each as its own; one failure fails the call, as in SGLang."""
            n = len(body["input_ids"])
            params = (
                body["sampling_params"] if isinstance(body["sampling_params"], list) else [body["sampling_params"]] * n
            )
            rids = body.get("rid") or [None] * n
            results: list[tuple[int, Any]] = [(0, None)] * n

            def fields(i: int) -> dict[str, Any]:  # a top-level field is one for all or a list, one each
                named = {name: body[name] for name in ("return_logprob", "top_logprobs_num") if name in body}
                return {name: value[i] if isinstance(value, list) else value for name, value in named.items()}

            arrivals = state.admit(list(rids))
            # A constrained request ends at its EOS, before the rest of its batch: it leaves at once
            # (here, not in its thread, so that no other request of the batch can have left first).
            early = {i for i in range(n) if "json_schema" in params[i] and state.tokenizer}
            for _ in early:
                state.leave_early()

            def run(i: int) -> None:
                try:
                    results[i] = self.one(
                        body["input_ids"][i], params[i], rids[i], fields(i), arrivals[i], left=i in early
                    )
                except Exception as error:  # a thread's exception would otherwise leave no status
                    results[i] = (500, {"error": repr(error)})

            threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            failed = [r for r in results if r[0] != 200]
            self.reply(*(failed[0] if failed else (200, [r[1] for r in results])))

        def one(
            self,
            input_ids: list[int],
            params: dict[str, Any],
            rid: Any,
            fields: dict[str, Any] | None = None,
            arrival: tuple[int, bool] | None = None,  # (number, on) of a batch's request, admitted with it
            left: bool = False,  # it has left the batch already (a batch's constrained request)
        ) -> tuple[int, Any]:
            fields = fields or {}
            number, on = arrival or state.arrive(rid)
            state.prefill(input_ids)
            faulty = state.disable is not None and not on  # the sampling faults' requests
            try:
                time.sleep(state.delay)
                n = int(params["max_new_tokens"])
                if state.records(rid):
                    state.decode_recorded(rid, input_ids, n)
                if "http500" in state.faults and number % 5 == 0:
                    return 500, {"error": "injected"}
                if "traceback" in state.faults and number == 3:
                    say('Traceback (most recent call last):\n  File "x.py", line 1\nRuntimeError: injected')
                if number == 3 and not state.gc_frozen and 0 < state.gc_warning <= LONG_GC_SECONDS:
                    log(  # SGLang's line; the collection that scans the start-up's objects, unless frozen
                        f"LONG GARBAGE COLLECTION DETECTED | Generation 2 | Duration: {LONG_GC_SECONDS:.4f}s | # Objects: "
                        "gen0=3, gen1=0, gen2=765481 | This may cause latency jitter. Consider calling the freeze_gc API "
                        "after sending a few warmup requests."
                    )
                return_logprob = bool(fields.get("return_logprob"))
                top_num = int(fields.get("top_logprobs_num") or 0)
                chosen: list[tuple[float, int]] = []
                ranked: list[list[tuple[float, int]]] = []
                if "json_schema" in params and state.tokenizer:
                    tokens = [
                        ord(c) for c in constrained_json(input_ids, broken=faulty and "grammarbreak" in state.faults)
                    ]
                elif uses_token_model(params, return_logprob):
                    tokens, chosen, ranked = decode(
                        input_ids,
                        n,
                        params,
                        skew=0.7 if faulty and "skewsampling" in state.faults else 1.0,
                        penalties=not (faulty and "droppenalty" in state.faults),
                        late_penalties=state.overlap,
                    )
                else:
                    tokens = [100] * n if state.acc > 0 else outputs(input_ids, n)
                if "diverge" in state.faults and not on and n > 2:
                    tokens[2] = (tokens[2] + 1) % 32000
                if "short" in state.faults or (
                    "shortbatch" in state.faults and arrival and "json_schema" not in params
                ):
                    tokens = tokens[:-1]
                meta: dict[str, Any] = {"completion_tokens": len(tokens)}
                if return_logprob:
                    drift = 0.2 if faulty and "logprobdrift" in state.faults else 0.0
                    if not (faulty and "nologprobs" in state.faults):
                        meta["output_token_logprobs"] = [[lp + drift, t, None] for lp, t in chosen[: len(tokens)]]
                    if top_num > 0:
                        meta["output_top_logprobs"] = [
                            [[lp + drift, t, None] for lp, t in dist[:top_num]] for dist in ranked[: len(tokens)]
                        ]
                if state.speculative:
                    per_step = max(1.0, state.acc) if on else 1.0
                    meta["spec_verify_ct"] = max(1, round(len(tokens) / per_step))
                reply: dict[str, Any] = {"output_ids": tokens, "meta_info": meta}
                if state.tokenizer:  # a token per character, as the grammar's output is written
                    reply["text"] = "".join(chr(t) if t < 0x110000 else "?" for t in tokens)
                return 200, reply
            finally:
                if not left:
                    state.leave()

    return Handler


class HTTPServer(ThreadingHTTPServer):
    request_queue_size = 256  # the default backlog of 5 drops bursts of connects
    daemon_threads = True


def serve(state: State, port: int = 0) -> HTTPServer:
    return HTTPServer(("127.0.0.1", port), make_handler(state))


def check_server_args(args: argparse.Namespace, refuse_with_traceback: bool) -> None:
    """dynspec's real start-up check on these flags (it exits 2 with one line from the server command)."""
    from importlib.util import module_from_spec, spec_from_file_location
    from pathlib import Path

    from packaging.version import Version
    from sglang._version import __version__  # the fake site's release

    spec = spec_from_file_location(
        "dynspec_settings", Path(__file__).resolve().parents[2] / "patches/runtime/dynspec_settings.py"
    )
    assert spec is not None and spec.loader is not None
    settings = module_from_spec(spec)
    sys.modules["dynspec_settings"] = settings  # its dataclass looks itself up there
    spec.loader.exec_module(settings)
    settings.zero_step_mode_here = lambda: Version(__version__) >= Version("0.5.14")
    if refuse_with_traceback:
        settings.started_as_launch_server = lambda: False
    settings.check_server_args(args)


def main(argv: list[str]) -> None:
    from packaging.version import Version
    from sglang._version import __version__  # the fake site's release

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--speculative-algorithm")
    parser.add_argument("--speculative-disable-batch-size")  # a number, or auto
    parser.add_argument("--max-running-requests", type=int, default=128)
    # 0.5.14 renamed the field (the flag stayed, an alias), as the real releases do
    graph_max = "cuda_graph_max_bs_decode" if Version(__version__) >= Version("0.5.14") else "cuda_graph_max_bs"
    parser.add_argument("--cuda-graph-max-bs", type=int, dest=graph_max)
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--dp-size", type=int, default=1)
    parser.add_argument("--speculative-eagle-topk", type=int, default=1)
    parser.add_argument("--enable-dp-attention", action="store_true")
    parser.add_argument("--enable-metrics", action="store_true")
    parser.add_argument("--skip-tokenizer-init", action="store_true")
    parser.add_argument("--speculative-switch-min-steps", type=int, default=8)
    parser.add_argument("--speculative-enable-batch-size", type=int)
    parser.add_argument("--speculative-adaptive", action="store_true")
    parser.add_argument("--speculative-adaptive-config")
    parser.add_argument("--max-total-tokens", type=int)
    parser.add_argument("--gc-warning-threshold-secs", type=float, default=0.0)
    parser.add_argument("--attention-backend", default="triton")
    parser.add_argument("--disable-overlap-schedule", action="store_true")
    args, _ = parser.parse_known_args(argv)
    if args.dp_size == 1:  # every release turns DP attention off with one DP rank, and serves
        args.enable_dp_attention = False
    faults = set(filter(None, os.environ.get("FAKE_SGLANG_FAULT", "").split(",")))
    log(f"server_args={argv}")
    log("Ignore import error when loading sglang.srt.models.fake: ModuleNotFoundError: No module named 'x'")
    log(
        f"env SGLANG_SIMULATE_ACC_LEN={os.environ.get('SGLANG_SIMULATE_ACC_LEN')} HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE')}"
    )
    if "crash" in faults:
        say("Traceback (most recent call last):\nRuntimeError: CUDA error: injected")
        sys.exit(1)
    if args.speculative_disable_batch_size is not None and "norefusal" not in faults:
        check_server_args(args, refuse_with_traceback="refusaltraceback" in faults)
    if args.speculative_adaptive:
        with open(args.speculative_adaptive_config) as f:
            log(f"adaptive config {json.dumps(json.load(f))}")
        if "adaptiveoff" in faults:
            log("speculative_adaptive disabled: injected. Falling back to static speculative params.")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    log(f"scheduler pid {child.pid}")
    pool = args.max_total_tokens or 131072  # SGLang's line; smallpool: the memory it found was short
    log(f"max_total_num_tokens={pool // 2 if 'smallpool' in faults else pool}, chunked_prefill_size=8192")
    time.sleep(float(os.environ.get("FAKE_SGLANG_START_DELAY", "0.2")))
    threshold = args.speculative_disable_batch_size
    ceiling = args.max_running_requests - 1
    found: tuple[int, int] | None = None
    if threshold == "auto":  # speculating everywhere until both modes are timed, as the runtime's driver
        off, on = (int(x) for x in os.environ.get("FAKE_SGLANG_AUTO", "48,40").split(","))
        found = (off, max(on, args.speculative_enable_batch_size or 1))
    state = State(
        None if threshold is None else ceiling if threshold == "auto" else int(threshold),
        ceiling if threshold == "auto" else args.speculative_enable_batch_size,
        bool(args.speculative_algorithm),
        faults,
        found,
    )
    state.metrics = args.enable_metrics
    state.gc_warning = args.gc_warning_threshold_secs
    state.tokenizer = not args.skip_tokenizer_init
    state.overlap = not args.disable_overlap_schedule
    if state.disable is not None:
        log(
            f"dynspec: v2 fallback ready in 0.01 s: speculation off above {state.disable} requests, on at or "
            f"below {state.enable}, at least 8 iterations between switches; one-token target CUDA graphs for "
            f"batch sizes none (eager); one-token verify through {BACKEND_CLASSES.get(args.attention_backend, '?')}'s "
            "decode kernel; "
            f"{state.draft_kv_words()}"
        )
    if args.speculative_adaptive:
        state.delay = float(os.environ.get("FAKE_SGLANG_ADAPTIVE_DELAY", state.delay))
    server = serve(state, args.port)
    log(f"The server is fired up and ready to roll! port {args.port}")
    log_decode_steps(
        bool(args.speculative_algorithm), args.speculative_disable_batch_size is not None, args.speculative_adaptive
    )
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
