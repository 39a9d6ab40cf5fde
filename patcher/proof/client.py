"""A small HTTP client for an SGLang server started with ``--skip-tokenizer-init``.

Standard library only (``http.client`` and threads): the GPU machine has no aiohttp guarantee.
Requests are greedy ``/generate`` calls with fixed ``input_ids``, as in shared/gpu/client.py, and
the digest of a level is computed the same way, so digests from both tools can be compared.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

WARMUP_PROMPT = 9999


def prompt(i: int) -> list[int]:
    """The fixed prompt number ``i``: 32 to 47 token ids in [100, 31100), valid for both vocabularies."""
    return [(i * 7919 + j * 104729) % 31000 + 100 for j in range(32 + i % 16)]


@dataclass
class Reply:
    """One ``/generate`` call. ``error`` is None only for an HTTP 200 with the expected tokens."""

    index: int
    status: int  # 0 when no HTTP status was received
    output_ids: list[int]
    meta: dict[str, Any]
    seconds: float
    error: str | None = None
    text: str | None = None  # a server with its tokenizer (grammar) says what the tokens read


@dataclass
class LevelResult:
    """All replies of one concurrency level, sent at once."""

    concurrency: int
    new_tokens: int
    seconds: float
    replies: list[Reply] = field(default_factory=list)
    samples: tuple[float, ...] = ()  # tok/s of every timed run when the level was measured repeatedly

    @property
    def tokens(self) -> int:
        return sum(len(r.output_ids) for r in self.replies if r.error is None)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def outputs(self) -> dict[int, list[int]]:
        return {r.index: r.output_ids for r in self.replies}

    @property
    def failures(self) -> list[str]:
        return [f"prompt {r.index}: {r.error}" for r in self.replies if r.error is not None]

    @property
    def digest(self) -> str:
        return digest(self.outputs)

    @property
    def accept_length(self) -> float | None:
        """Mean tokens per verify step (``completion_tokens / spec_verify_ct``), None without speculation."""
        verify = sum(int(r.meta.get("spec_verify_ct") or 0) for r in self.replies)
        if verify == 0:
            return None
        done = sum(int(r.meta.get("completion_tokens") or len(r.output_ids)) for r in self.replies)
        return done / verify


def digest(outputs: dict[int, list[int]]) -> str:
    """12 hex digits over all outputs of a level; equal digests mean token-identical outputs."""
    blob = json.dumps(sorted(outputs.items()))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


class Client:
    """Talks to one server. Every call opens its own connection, so calls may run in parallel."""

    def __init__(self, host: str, port: int, timeout: float = 300.0, prompts: Sequence[list[int]] = ()) -> None:
        """``prompts``: real tokenized prompts, prompt ``i`` being ``prompts[i % len]``; none: ``prompt(i)``."""
        self.host, self.port, self.timeout = host, port, timeout
        self.prompts = prompts

    def prompt(self, index: int) -> list[int]:
        return list(self.prompts[index % len(self.prompts)]) if self.prompts else prompt(index)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def request(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> tuple[int, bytes]:
        """Send one request; return (status, body). Raises OSError when there is no answer."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)
        try:
            conn.connect()
            if conn.sock is not None and conn.sock.getsockname() == conn.sock.getpeername():
                # Nothing listens on a port of the ephemeral range, and the kernel joined the socket
                # to itself (TCP simultaneous open): its "answer" would be the request read back.
                raise ConnectionRefusedError(f"nothing listens on port {self.port} (the socket connected to itself)")
            headers = {"Connection": "close"}
            payload = None
            if body is not None:
                payload = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        except http.client.HTTPException as error:  # not HTTP that answered: no answer, as the docstring says
            raise ConnectionError(f"no HTTP answer on port {self.port}: {error!r}") from error
        finally:
            conn.close()

    def generate(
        self,
        index: int,
        new_tokens: int,
        rid: str | None = None,
        sampling: Mapping[str, Any] | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> Reply:
        """Greedy ``/generate`` of ``prompt(index)``; never raises, failures are in ``Reply.error``.

        ``rid`` names the request in the server (SGLang's ``rid`` field), e.g. to find it in a recording.
        ``sampling`` overrides sampling parameters (e.g. a temperature), ``fields`` adds top-level
        ones (e.g. ``return_logprob``); ``Reply.meta`` keeps what they bring back.
        """
        body: dict[str, Any] = {
            **(fields or {}),
            "input_ids": self.prompt(index),
            "sampling_params": {**greedy(new_tokens), **(sampling or {})},
        }
        if rid is not None:
            body["rid"] = rid
        start = time.perf_counter()
        try:
            status, raw = self.request("POST", "/generate", body)
        except (OSError, http.client.HTTPException) as error:
            return Reply(index, 0, [], {}, time.perf_counter() - start, f"no answer: {error!r}")
        seconds = time.perf_counter() - start
        data = parse_json(raw)
        if status != 200:
            return Reply(index, status, [], {}, seconds, f"HTTP {status}: {raw[:200]!r}")
        if isinstance(data, list) and len(data) == 1:  # some versions wrap a single request
            data = data[0]
        return reply_of(index, new_tokens, status, data, seconds, raw, exact=body["sampling_params"]["ignore_eos"])

    def generate_batch(self, requests: Sequence[Request]) -> list[Reply]:
        """All ``requests`` in one greedy ``/generate`` call (lists of prompts, sampling parameters
        and rids), a reply each, in order; a server's failure is in each ``Reply.error``.

        SGLang 0.5.4+ hands a pre-tokenized batch to its scheduler as one message, so the requests
        are admitted in one prefill whatever the timing. Sent one by one, the same 16 requests were
        prefilled 1 + 15 by one server and 2 + 14 by another (session 15), and prefill graphs of
        other sizes round apart.
        """
        if not requests:
            return []
        fields = requests[0].fields
        if any(r.fields != fields for r in requests):
            raise ValueError("a batch's requests share their top-level fields")
        body: dict[str, Any] = {
            **fields,
            "input_ids": [self.prompt(r.index) for r in requests],
            "sampling_params": [{**greedy(r.new_tokens), **r.sampling} for r in requests],
        }
        rids = [r.rid for r in requests]
        if any(rid is not None for rid in rids):
            if None in rids:
                raise ValueError("a batch names every request's rid or none")
            body["rid"] = rids
        start = time.perf_counter()
        try:
            status, raw = self.request("POST", "/generate", body)
        except (OSError, http.client.HTTPException) as error:
            seconds = time.perf_counter() - start
            return [Reply(r.index, 0, [], {}, seconds, f"no answer: {error!r}") for r in requests]
        seconds = time.perf_counter() - start
        data = parse_json(raw)
        if status != 200:
            return [Reply(r.index, status, [], {}, seconds, f"HTTP {status}: {raw[:200]!r}") for r in requests]
        if not isinstance(data, list) or len(data) != len(requests):
            problem = f"HTTP 200 without {len(requests)} replies: {raw[:200]!r}"
            return [Reply(r.index, status, [], {}, seconds, problem) for r in requests]
        return [
            reply_of(r.index, r.new_tokens, status, d, seconds, raw, exact=params["ignore_eos"])
            for r, d, params in zip(requests, data, body["sampling_params"])
        ]


def greedy(new_tokens: int) -> dict[str, Any]:
    """Sampling parameters of every proof request: greedy, exactly ``new_tokens`` of them."""
    return {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}


def parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def reply_of(
    index: int, new_tokens: int, status: int, data: Any, seconds: float, raw: bytes, exact: bool = True
) -> Reply:
    """One request's reply from its decoded JSON ``data`` (an HTTP 200's); ``exact``: it must have
    ``new_tokens`` (``ignore_eos``), else at most that many (a grammar's request ends at its EOS)."""
    if not isinstance(data, dict) or not isinstance(data.get("output_ids"), list):
        return Reply(index, status, [], {}, seconds, f"HTTP 200 without output_ids: {raw[:200]!r}")
    output_ids = [int(t) for t in data["output_ids"]]
    found = data.get("meta_info")
    meta: dict[str, Any] = found if isinstance(found, dict) else {}
    problem = None
    if exact and len(output_ids) != new_tokens:
        problem = f"{len(output_ids)} tokens instead of {new_tokens} (ignore_eos is set)"
    elif len(output_ids) > new_tokens:
        problem = f"{len(output_ids)} tokens, more than max_new_tokens {new_tokens}"
    text = data.get("text")
    return Reply(index, status, output_ids, meta, seconds, problem, text if isinstance(text, str) else None)


@dataclass(frozen=True)
class Request:
    """One request of a load: ``prompt(index)``, ``new_tokens`` of it, sent ``delay`` s after the start."""

    index: int
    new_tokens: int
    rid: str | None = None
    delay: float = 0.0
    sampling: Mapping[str, Any] = field(default_factory=dict)  # over ``greedy``'s parameters
    fields: Mapping[str, Any] = field(default_factory=dict)  # top-level ones, e.g. return_logprob


def run_level(client: Client, indices: Sequence[int], new_tokens: int) -> LevelResult:
    """Send one request per index, all at once (one thread each), and time the whole level."""
    return run_requests(client, [Request(i, new_tokens) for i in indices], concurrency=len(indices))


def run_requests(client: Client, requests: Sequence[Request], concurrency: int) -> LevelResult:
    """Send ``requests`` with at most ``concurrency`` in flight (a closed loop: each reply frees a
    slot for the next request in order), and time them all. ``Request.delay`` holds a request
    back from the start that long. The result's ``concurrency`` is ``concurrency``; its
    ``new_tokens`` that of the first request."""
    calls = [
        (r.delay, lambda r=r: [client.generate(r.index, r.new_tokens, r.rid, r.sampling, r.fields)]) for r in requests
    ]
    replies, seconds = _timed(calls, min(concurrency, len(requests)), "proof-client")
    return LevelResult(concurrency, requests[0].new_tokens if requests else 0, seconds, replies)


def run_batches(client: Client, requests: Sequence[Request]) -> LevelResult:
    """Send ``requests`` as one ``Client.generate_batch`` call per ``Request.delay`` (each held back
    from the start that long), so each group is admitted together; time them all."""
    groups: dict[float, list[Request]] = {}
    for r in requests:
        groups.setdefault(r.delay, []).append(r)
    calls = [(delay, lambda g=group: client.generate_batch(g)) for delay, group in sorted(groups.items())]
    replies, seconds = _timed(calls, len(calls), "proof-batch")
    return LevelResult(len(requests), requests[0].new_tokens if requests else 0, seconds, replies)


def run_waves(client: Client, requests: Sequence[Request], size: int) -> LevelResult:
    """``requests`` in waves of ``size``, each one ``Client.generate_batch`` call after the last has
    answered: every wave is admitted together and decodes as one batch of ``size``."""
    replies: list[Reply] = []
    start = time.perf_counter()
    for i in range(0, len(requests), size):
        replies += client.generate_batch(requests[i : i + size])
    return LevelResult(size, requests[0].new_tokens if requests else 0, time.perf_counter() - start, replies)


def _timed(
    calls: Sequence[tuple[float, Callable[[], list[Reply]]]], workers: int, name: str
) -> tuple[list[Reply], float]:
    """Run ``calls`` (each ``delay`` s after the start at the earliest) on ``workers`` threads, in
    order as threads free up; their replies sorted by prompt, and the seconds from start to the
    last. An interrupt does not wait for the calls in flight."""
    replies: list[Reply] = []
    lock = threading.Lock()
    go = threading.Event()
    start = 0.0

    def one(delay: float, call: Callable[[], list[Reply]]) -> None:
        go.wait()
        wait = start + delay - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        got = call()
        with lock:
            replies.extend(got)

    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix=name)
    try:
        futures = [pool.submit(one, delay, call) for delay, call in calls]
        start = time.perf_counter()
        go.set()
        for f in futures:
            f.result()
        seconds = time.perf_counter() - start
    except BaseException:
        go.set()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    replies.sort(key=lambda r: r.index)
    return replies, seconds


def measure_level(
    client: Client, indices: Sequence[int], new_tokens: int, *, warmup: bool, repeats: int
) -> LevelResult:
    """The level's median run of ``repeats`` timed ones, after an untimed warm-up run if asked.

    The warm-up pays for what the first batch of a new size costs once (Triton compiles, first
    CUDA-graph replays), which would otherwise land on whichever server the harness runs first.
    A failing run is returned as is, so failures are never hidden behind a good median.
    """
    runs = take_turns({"": lambda: run_level(client, indices, new_tokens)}, warmup=warmup, repeats=repeats)
    return level_result(runs[""])


class Failing(Protocol):
    @property
    def failures(self) -> list[str]: ...


Outcome = TypeVar("Outcome", bound=Failing)


def take_turns(runs: Mapping[str, Callable[[], Outcome]], *, warmup: bool, repeats: int) -> dict[str, list[Outcome]]:
    """Each of ``runs``' untimed warm-up run if asked, then ``repeats`` timed ones, each going to
    every name in turn, the order rotated by one name each time (``rotated``): where several
    servers are up at once, a drift of the machine's speed over the call then spreads over all of
    them alike instead of landing on whichever ran last. A name's runs stop at its first failing
    one, which ends its list; a failed warm-up is its list's only entry."""
    names = list(runs)
    done: dict[str, list[Outcome]] = {name: [] for name in names}
    stopped: set[str] = set()
    for name in names if warmup else ():
        first = runs[name]()
        if first.failures:
            done[name] = [first]
            stopped.add(name)
    for turn in range(max(1, repeats)):
        for name in rotated(names, turn):
            if name in stopped:
                continue
            outcome = runs[name]()
            done[name].append(outcome)
            if outcome.failures:
                stopped.add(name)
    return done


def level_result(runs: Sequence[LevelResult]) -> LevelResult:
    """A level's result from its ``take_turns`` runs: a failing run as is, else the median."""
    return runs[-1] if runs[-1].failures else median_run(runs)


def median_run(runs: Sequence[LevelResult]) -> LevelResult:
    """The median of timed runs by tok/s (the lower middle of an even count), with every run's tok/s
    as its ``samples``."""
    median = sorted(runs, key=lambda r: r.tok_s)[(len(runs) - 1) // 2]
    median.samples = tuple(round(r.tok_s, 1) for r in runs)
    return median


def rotated(names: Sequence[str], turn: int) -> list[str]:
    """``names`` starting at ``turn`` (modulo their count): the order of a pass when servers take
    turns, so that over as many passes as servers each runs once in every position."""
    k = turn % len(names) if names else 0
    return [*names[k:], *names[:k]]
