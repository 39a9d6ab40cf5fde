"""dynspec runtime: switch EAGLE / EAGLE-3 speculation off while the decode batch is large.

Installed by dynspec as ``sglang/srt/speculative/dynspec_runtime.py`` and called from the hooks
it adds to ``speculative/eagle_worker.py`` (the v1 ``EAGLEWorker``, non-overlap scheduler).
Nothing here runs unless ``--speculative-disable-batch-size`` is set.

How a fallback iteration works. It verifies a one-node tree whose root is the pending bonus
token, through the stock ``verify()`` and draft-extend, against a second target attention
backend and a TARGET_VERIFY CUDA graph captured for one token per request. To the scheduler,
the KV allocator, grammar, logprobs and the draft model this is a speculative iteration in
which every draft was rejected, so the state it leaves behind is one the speculative path can
resume from. Sending a plain DECODE batch through the target instead crashes: the target's
CUDA graphs and attention backend are built for ``speculative_num_draft_tokens`` tokens per
request and nothing checks the mode before replaying them.

The draft extend of a fallback iteration only writes the draft model's KV (``DraftKV``): in a
one-layer EAGLE-3 head the K/V at a position depend on that position's inputs alone, and the
rest of the step (attention, MLP, lm_head, top-k) feeds only the next proposal, which nobody
asks for while speculation is off. The iteration at which speculation comes back on
(``RESUME``) runs the full draft extend, so the first draft after it starts from exactly the
state a full extend in every iteration would have left.

On 0.5.12, where the draft KV is written directly (``kv-direct``), a greedy fallback iteration skips
the stock ``draft()`` / ``verify()`` / extend altogether (``LeanFallbackStep``): the verify's
preparation, the one-token target forward, the argmax, the direct write (queued before the wait),
one wait for the GPU and the verify's per-request bookkeeping, so it costs about a plain decode step.

The decision uses the decode batch size only, so every tensor-parallel rank decides the same.
Torch and SGLang are imported inside functions: the controller runs anywhere.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import inspect
import json
import logging
import os
import sys
import time
import types
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

# Relative: ``sglang.srt.speculative`` in a patched tree, ``patches.runtime`` in dynspec's own.
from .dynspec_settings import DEFAULT_MIN_STEPS, FLAG, auto_unavailable, getter_of, read_settings, unsupported_reason

logger = logging.getLogger(__name__)

SWITCH_LOG = "dynspec: speculation {state} at batch size {batch_size} (off above {off}, on at or below {on})"

# What one decode iteration runs (SwitchController.step).
SPECULATE = "speculate"
FALL_BACK = "fall back"  # no speculation; the draft extend writes the draft KV only
RESUME = "resume"  # no speculation yet, but the full draft extend: the next iteration drafts


class SwitchController:
    """Decide, once per decode iteration, whether the iteration speculates.

    Off when the batch has more than ``disable_above`` requests, back on when it has at most
    ``enable_at_or_below``; a switch is allowed no sooner than ``min_steps`` iterations after
    the previous one. The first switch may come at once. Each switch logs one INFO line. The
    iteration of a switch back on is a ``RESUME``: it runs without speculation, but with the
    draft model's full extend, so speculation starts at the iteration after it.
    """

    # The steps, reachable from a controller without an import in the decode loop.
    SPECULATE = SPECULATE
    FALL_BACK = FALL_BACK
    RESUME = RESUME

    def __init__(
        self,
        disable_above: int,
        enable_at_or_below: Optional[int] = None,
        min_steps: int = DEFAULT_MIN_STEPS,
        *,
        log: bool = True,
        metrics: Optional["DynspecMetrics"] = None,
    ) -> None:
        self.disable_above = disable_above
        self.enable_at_or_below = disable_above if enable_at_or_below is None else enable_at_or_below
        if self.enable_at_or_below > self.disable_above:
            raise ValueError(
                f"--speculative-enable-batch-size ({self.enable_at_or_below}) must not exceed "
                f"{FLAG} ({self.disable_above})"
            )
        self.min_steps = min_steps
        self.log = log
        self.metrics = metrics
        self.speculating = True
        self.iterations_since_switch = min_steps
        self.spec_iterations = 0
        self.fallback_iterations = 0
        self.switches = 0

    def step(self, batch_size: int) -> str:
        """Count one decode iteration of ``batch_size`` requests: ``SPECULATE``, ``FALL_BACK`` or ``RESUME``."""
        resuming = False
        if self.iterations_since_switch >= self.min_steps:
            if self.speculating and batch_size > self.disable_above:
                self._switch(False, batch_size)
            elif not self.speculating and batch_size <= self.enable_at_or_below:
                self._switch(True, batch_size)
                resuming = True
        self.iterations_since_switch += 1
        step = RESUME if resuming else SPECULATE if self.speculating else FALL_BACK
        if step == SPECULATE:
            self.spec_iterations += 1
        else:
            self.fallback_iterations += 1
        if self.metrics is not None:
            self.metrics.iteration(step == SPECULATE)
        return step

    def switch_off_at_admission(self, admitted: int) -> bool:
        """Before the draft prefill of ``admitted`` new requests that will decode: switch off now if
        they alone make the next decode batch larger than ``disable_above`` and the dwell allows,
        which the next iteration would do anyway. If fewer join it (retracted, aborted), the dwell's
        iterations fall back and a ``RESUME`` follows: slower, never wrong. Not an iteration. True
        when speculation is off after it."""
        if self.speculating and admitted > self.disable_above and self.iterations_since_switch >= self.min_steps:
            self._switch(False, admitted)
        return not self.speculating

    def _switch(self, speculating: bool, batch_size: int) -> None:
        self.speculating = speculating
        self.iterations_since_switch = 0
        self.switches += 1
        if self.metrics is not None:
            self.metrics.switch()
        if self.log:
            logger.info(self.describe(batch_size))

    def describe(self, batch_size: int) -> str:
        return SWITCH_LOG.format(
            state="ON" if self.speculating else "OFF",
            batch_size=batch_size,
            off=self.disable_above,
            on=self.enable_at_or_below,
        )


class DynspecMetrics:
    """Prometheus counters, created on first use (``--enable-metrics``); a no-op without the client."""

    NAMES = (
        ("spec", "sglang:dynspec_spec_iterations_total", "Decode iterations run with speculation."),
        ("fallback", "sglang:dynspec_fallback_iterations_total", "Decode iterations run without speculation."),
        ("switches", "sglang:dynspec_switches_total", "Times dynspec switched speculation on or off."),
    )
    # auto's latest decision (dynspec_auto.AutoDriver), created at its first: a fixed N exports none
    GAUGES = (
        ("disable_above", "sglang:dynspec_disable_above", "auto: speculation is off above this batch size."),
        (
            "enable_at_or_below",
            "sglang:dynspec_enable_at_or_below",
            "auto: speculation is back on at or below this batch size.",
        ),
        ("acceptance", "sglang:dynspec_acceptance", "auto: its estimate of accepted drafts + 1 per verify."),
    )
    _counters: Optional[Dict[str, Any]] = None  # one set per process: prometheus refuses duplicate names
    _gauges: Optional[Dict[str, Any]] = None

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self._bound: Optional[Dict[str, Any]] = None

    def iteration(self, speculating: bool) -> None:
        bound = self._counters_for_model()
        if bound:
            bound["spec" if speculating else "fallback"].inc()

    def switch(self) -> None:
        bound = self._counters_for_model()
        if bound:
            bound["switches"].inc()

    def auto_decision(self, disable_above: int, enable_at_or_below: int, acceptance: Optional[float]) -> None:
        """Export auto's thresholds and acceptance estimate (rank 0, at each decision)."""
        gauges = DynspecMetrics._create_gauges()
        values = {"disable_above": disable_above, "enable_at_or_below": enable_at_or_below, "acceptance": acceptance}
        for key, gauge in gauges.items():
            if values[key] is not None:
                gauge.labels(model_name=self.model_name).set(values[key])

    @classmethod
    def _create_gauges(cls) -> Dict[str, Any]:
        if cls._gauges is None:
            try:
                from prometheus_client import Gauge
            except ImportError:
                cls._gauges = {}
            else:
                # "mostrecent", as SGLang's own gauges: one value across its processes, none kept for dead ones
                cls._gauges = {
                    key: Gauge(name, doc, labelnames=["model_name"], multiprocess_mode="mostrecent")
                    for key, name, doc in cls.GAUGES
                }
        return cls._gauges

    def _counters_for_model(self) -> Dict[str, Any]:
        if self._bound is None:
            counters = DynspecMetrics._create_counters()
            self._bound = {key: c.labels(model_name=self.model_name) for key, c in counters.items()}
        return self._bound

    @classmethod
    def _create_counters(cls) -> Dict[str, Any]:
        if cls._counters is None:
            try:
                from prometheus_client import Counter
            except ImportError:
                logger.warning("dynspec: prometheus_client is not installed; dynspec metrics are off")
                cls._counters = {}
            else:
                cls._counters = {key: Counter(name, doc, labelnames=["model_name"]) for key, name, doc in cls.NAMES}
        return cls._counters


def fallback_capture_sizes(cuda_graph_bs: Any, enable_at_or_below: int) -> Optional[List[int]]:
    """CUDA-graph batch sizes worth capturing for the fallback: those above the switch-on size.

    Smaller fallback batches (right after a switch, before ``min_steps`` allow switching back)
    pad up to the smallest of these. None when SGLang has not resolved the list itself.
    """
    if not isinstance(cuda_graph_bs, (list, tuple)):
        return None
    return sorted({b for b in cuda_graph_bs if b > enable_at_or_below})


def attach_dynspec(worker: Any) -> Optional["DynspecFallback"]:
    """Build the fallback for an ``EAGLEWorker`` at the end of its ``__init__``; None when off."""
    args = worker.server_args
    settings = read_settings(getter_of(args))
    if settings is None:
        return None
    if not isinstance(settings.disable_above, int):  # auto
        raise auto_unavailable("with --disable-overlap-schedule")
    reason = unsupported_reason(getter_of(args))
    if reason is not None:
        raise ValueError(reason)
    disable_above, enable_at_or_below, min_steps = (
        settings.disable_above,
        settings.enable_at_or_below,
        settings.min_steps,
    )
    rank0 = getattr(worker, "tp_rank", 0) == 0

    tic = time.perf_counter()
    draft_kv = DraftKV.build(worker.draft_model_runner, log=rank0, auto=v1_draft_kv_default(worker))
    target = SingleTokenTarget.build(worker.target_worker.model_runner, enable_at_or_below)
    # After the target's graphs: the twin replays after them in an iteration, so it is captured
    # after them from the shared graph pool and cannot reuse memory their outputs live in.
    capture_twin_of_stock_graph(draft_kv, worker)
    metrics = None
    if rank0 and getattr(args, "enable_metrics", False):
        metrics = DynspecMetrics(getattr(args, "served_model_name", None) or str(args.model_path))
    controller = SwitchController(disable_above, enable_at_or_below, min_steps, log=rank0, metrics=metrics)
    fallback = DynspecFallback(controller, target, draft_kv, DraftRecorder.from_env(rank0))
    fallback.feed_twin_directly(worker, rank0)
    if os.environ.get(KV_BITS_ENV, "").strip() and fallback.bit_check is None:
        # Else the server meant as exact_kv's full-extend reference would run a KV-only extend.
        raise ValueError(f"{KV_BITS_ENV} needs {DRAFT_KV_ENV}=kv-direct fed directly (its start-up line says why not)")
    if fallback.recorder is not None:
        fallback.recorder.watch_drafts(worker, lambda: fallback.in_fallback)
    if rank0:
        logger.info(
            f"dynspec: fallback ready in {time.perf_counter() - tic:.2f} s: speculation off above "
            f"{disable_above} requests, on at or below {enable_at_or_below}, at least {min_steps} "
            f"iterations between switches; one-token CUDA graphs for batch sizes {target.capture_bs}; "
            f"{describe_one_token_attention(target.attn_backend)}; {describe_draft_kv(draft_kv)}"
        )
    return fallback


def capture_twin_of_stock_graph(draft_kv: "DraftKV", owner: Any) -> None:
    """``kv-graph``'s twin for v1's worker or v2's (0.5.4 - 0.5.13) draft worker: a new instance of the
    draft-extend graph runner that ``owner`` built for itself, made the same way (``type(stock)(owner)``).
    Without a stock graph (CUDA graphs off) there is nothing to copy and the KV-only extend is eager."""
    stock_graph = getattr(owner, _WORKER_GRAPH, None)
    if stock_graph is None:
        return
    backend = getattr(stock_graph, "draft_extend_attn_backend", None) or getattr(
        owner, "draft_extend_attn_backend", None
    )
    draft_kv.capture_graph(lambda: type(stock_graph)(owner), backend)


def describe_draft_kv(draft_kv: "DraftKV") -> str:
    """The start-up log's words for what a fallback iteration does with the draft model."""
    if draft_kv.mode == DRAFT_KV_FULL:
        return "full draft extend in every fallback iteration"
    if draft_kv.mode == DRAFT_KV_SKIP:
        return "no draft extend while off (negative control)"
    if draft_kv.graph is None:
        how = "eagerly"
    else:
        how = "from a CUDA graph, replayed directly" if draft_kv.direct is not None else "from a CUDA graph"
    return f"draft KV only while off ({how}), full draft extend at resume"


@dataclasses.dataclass
class SingleTokenTarget:
    """The target model runner's verify state for one token per request (attention + graphs)."""

    model_runner: Any
    attn_backend: Any
    graph_runner: Any  # None: eager (CUDA graphs disabled, or no batch size above the switch-on size)
    graph_attr: str  # ModelRunner.graph_runner, or cuda_graph_runner before 0.5.1
    capture_bs: Optional[List[int]]

    @classmethod
    def build(cls, model_runner: Any, enable_at_or_below: int) -> "SingleTokenTarget":
        args = model_runner.server_args
        graph_attr = "graph_runner" if hasattr(model_runner, "graph_runner") else "cuda_graph_runner"
        live_graph = getattr(model_runner, graph_attr, None)
        capture_bs = fallback_capture_sizes(getattr(args, "cuda_graph_bs", None), enable_at_or_below)
        saved = (
            model_runner.attn_backend,
            model_runner.__dict__.get("init_new_workspace"),
            args.speculative_num_steps,
            args.speculative_num_draft_tokens,
            getattr(args, "cuda_graph_bs", None),
        )
        # Backends and graph runners read N from server_args when they are built (triton and FA3
        # size their buffers with it); older graph runners also read the backend off the runner.
        args.speculative_num_steps = 0
        args.speculative_num_draft_tokens = 1
        if capture_bs is not None:
            args.cuda_graph_bs = list(capture_bs)  # a new list: SGLang appends to it in place
        try:
            attn_backend = _new_attention_backend(model_runner)
            model_runner.attn_backend = attn_backend
            graph_runner = None
            if live_graph is not None and capture_bs != []:
                graph_runner = _new_graph_runner(type(live_graph), model_runner, attn_backend)
                capture_bs = list(getattr(graph_runner, "capture_bs", capture_bs) or [])
        finally:
            (
                model_runner.attn_backend,
                init_new_workspace,
                args.speculative_num_steps,
                args.speculative_num_draft_tokens,
                args.cuda_graph_bs,
            ) = saved
            if init_new_workspace is not None:
                model_runner.init_new_workspace = init_new_workspace
        if graph_runner is None:
            capture_bs = []
        return cls(model_runner, attn_backend, graph_runner, graph_attr, capture_bs)

    def swap_in(self) -> Tuple[Any, Any]:
        """Install this state on the model runner; returns what was there."""
        runner = self.model_runner
        previous = (runner.attn_backend, getattr(runner, self.graph_attr))
        runner.attn_backend = self.attn_backend
        setattr(runner, self.graph_attr, self.graph_runner)
        return previous

    def swap_out(self, previous: Tuple[Any, Any]) -> None:
        self.model_runner.attn_backend, graph_runner = previous
        setattr(self.model_runner, self.graph_attr, graph_runner)


def _new_attention_backend(model_runner: Any) -> Any:
    # 0.5.5 added init_new_workspace; a private workspace is what upstream's adaptive states use.
    if "init_new_workspace" in inspect.signature(model_runner._get_attention_backend).parameters:
        backend = model_runner._get_attention_backend(init_new_workspace=True)
    else:
        backend = model_runner._get_attention_backend()
    return one_token_attention(backend)


# -- one-token verify through the decode attention kernel ---------------------------------------

ATTENTION_ENV = "DYNSPEC_ONE_TOKEN_ATTENTION"

# Backends whose decode kernel serves the one-token verify under ``auto``. Triton: since r2, in
# every GPU proof. FlashInfer (r30): its verify path re-plans a paged prefill on the host at every
# replay, which ran the fallback step at 0.55 of a plain one (session 38, an H100); its decode path
# is the wrapper and plan plain decode replays (``fast_decode_plan``); session 39 ran it on 0.5.17
# (an H200: 0.976 / 0.991 of a plain step at 64 / 128, exact_kv intact).
# ``DYNSPEC_ONE_TOKEN_ATTENTION=decode`` opts any other backend in, ``=verify`` opts out.
DECODE_KERNEL_BACKENDS = ("TritonAttnBackend", "FlashInferAttnBackend")
# A backend whose decode kernel reads a dequantised copy of the KV sized by the batch's own
# ``seq_lens_cpu`` (FlashInfer with an FP4 KV cache): the layers see the verify batch, whose lengths
# lack the new token, so its decode path would attend to one key too few. Always the verify path.
_DEQUANT_WORKSPACE = "decode_uses_dequant_workspace"


def one_token_attention_choice(backend: Any) -> Tuple[str, str]:
    """``("decode" | "verify", why)``: how the one-token target backend computes attention, and the
    start-up line's words for it."""
    name = type(backend).__name__
    setting = os.environ.get(ATTENTION_ENV, "auto").strip().lower() or "auto"
    if setting not in ("auto", "decode", "verify"):
        raise ValueError(f"{ATTENTION_ENV} must be auto, decode or verify, not {setting!r}")
    if getattr(backend, _DEQUANT_WORKSPACE, False):
        return "verify", f"{name}'s verify path (its decode kernel reads an FP4 dequant workspace)"
    if setting == "verify":
        return "verify", f"{name}'s verify path ({ATTENTION_ENV}=verify)"
    if setting == "decode":
        return "decode", f"{name}'s decode kernel ({ATTENTION_ENV}=decode)"
    if name in DECODE_KERNEL_BACKENDS:
        return "decode", f"{name}'s decode kernel"
    return "verify", f"{name}'s verify path ({ATTENTION_ENV}=decode would try its decode kernel)"


_ATTENTION_WORDS = "_dynspec_attention_words"  # one_token_attention's reason, kept for the start-up line


def one_token_attention(backend: Any) -> Any:
    """The one-token target backend, set to serve TARGET_VERIFY as a DECODE when that is on; it keeps
    the words of its choice for ``describe_one_token_attention``."""
    mode, words = one_token_attention_choice(backend)
    if mode == "decode":
        backend = serve_verify_as_decode(backend)
    with contextlib.suppress(AttributeError):  # no instance dict: the line says the mode, not the reason
        setattr(backend, _ATTENTION_WORDS, words)
    return backend


def describe_one_token_attention(backend: Any) -> str:
    """The start-up line's words for how ``backend`` verifies: the reason ``one_token_attention``
    kept, else the mode the backend's class says it runs. Reads no setting, so it cannot raise."""
    words = getattr(backend, _ATTENTION_WORDS, None)
    if not isinstance(words, str):
        kernel = "decode kernel" if verifies_as_decode(backend) else "verify path"
        words = f"{type(backend).__name__}'s {kernel}"
    return f"one-token verify through {words}"


def serve_verify_as_decode(backend: Any) -> Any:
    """Make ``backend`` answer one-token TARGET_VERIFY batches with its DECODE metadata and kernel.

    A one-node tree with an all-True mask attends to the prefix and itself: the ``seq_len + 1``
    keys a plain decode step attends to, the new one written first by both paths. Most
    backends' verify path is an extend kernel with a custom mask, which (Triton) walks each
    request's prefix serially and grows with context; the decode kernel splits the KV. So the
    metadata is built for DECODE with ``seq_lens + 1`` and no spec input, and the layers call
    ``forward_decode``. The worker, graph runner, logits and verify code still see TARGET_VERIFY.

    Re-classes the instance (a subclass, not a wrapper object) so that ``isinstance`` checks on
    the backend keep working. Only for a backend built for one token per request.
    """
    base = type(backend)
    if verifies_as_decode(backend):
        return backend
    # Single inheritance: CPython refuses __class__ assignment when a mixin changes the layout
    # chain (AttentionBackend derives from ABC). The methods therefore call super(type(self), self).
    namespace = {
        name: value
        for name, value in vars(VerifyAsDecode).items()
        if not (name.startswith("__") and name.endswith("__"))
    }
    namespace.update(__module__=base.__module__, __qualname__=base.__qualname__, __doc__=base.__doc__)
    metaclass: Any = type(base)  # ABCMeta for SGLang's backends
    backend.__class__ = metaclass(base.__name__, (base,), namespace)
    backend._dynspec_plus_one = None
    return backend


def verifies_as_decode(backend: Any) -> bool:
    return bool(getattr(type(backend), "dynspec_verify_as_decode", False))


class VerifyAsDecode:
    """Methods copied onto a generated subclass of the backend's class by ``serve_verify_as_decode``.

    Both metadata APIs are covered: capture/replay methods up to 0.5.12, ``out_graph`` and
    ``in_graph`` from 0.5.13. Arguments are rebound by name, so positional and keyword calls
    from any release land the same way.
    """

    dynspec_verify_as_decode = True
    _dynspec_plus_one: Any

    def init_forward_metadata(self, forward_batch: Any) -> Any:
        return super(type(self), self).init_forward_metadata(_decode_view(forward_batch, self._plus_one_eager))  # type: ignore[misc]

    def init_forward_metadata_out_graph(self, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
        view = _decode_view(forward_batch, self._plus_one_persistent)
        return super(type(self), self).init_forward_metadata_out_graph(view, *args, **kwargs)  # type: ignore[misc]

    def init_forward_metadata_in_graph(self, forward_batch: Any) -> Any:
        # Graph-recorded: seq_lens + 1 must live in a buffer the replay sees too.
        view = _decode_view(forward_batch, self._plus_one_persistent)
        return super(type(self), self).init_forward_metadata_in_graph(view)  # type: ignore[misc]

    def init_forward_metadata_capture_cuda_graph(self, *args: Any, **kwargs: Any) -> Any:
        method = super(type(self), self).init_forward_metadata_capture_cuda_graph  # type: ignore[misc]
        return _call_as_decode(method, self._plus_one_persistent, args, kwargs)

    def init_forward_metadata_replay_cuda_graph(self, *args: Any, **kwargs: Any) -> Any:
        method = super(type(self), self).init_forward_metadata_replay_cuda_graph  # type: ignore[misc]
        return _call_as_decode(method, self._plus_one_persistent, args, kwargs)

    def forward(self, q: Any, k: Any, v: Any, layer: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
        if forward_batch.forward_mode.is_target_verify():
            return self.forward_decode(q, k, v, layer, forward_batch, *args, **kwargs)  # type: ignore[attr-defined]
        return super(type(self), self).forward(q, k, v, layer, forward_batch, *args, **kwargs)  # type: ignore[misc]

    @staticmethod
    def _plus_one_eager(seq_lens: Any) -> Any:
        return seq_lens + 1

    def _plus_one_persistent(self, seq_lens: Any) -> Any:
        """``seq_lens + 1`` in a buffer that outlives the call: backends keep views of it in graphs."""
        import torch

        n = seq_lens.shape[0]
        buffer = self._dynspec_plus_one
        if buffer is None or buffer.shape[0] < n or buffer.dtype != seq_lens.dtype or buffer.device != seq_lens.device:
            # Graph runners capture the largest batch first; later, smaller batches reuse it.
            buffer = seq_lens.new_empty((max(n, 256),))
            self._dynspec_plus_one = buffer
        out = buffer[:n]
        torch.add(seq_lens, 1, out=out)  # one kernel; ``out.copy_(seq_lens + 1)`` was two
        return out


@functools.lru_cache(maxsize=None)
def _signature_of(function: Callable[..., Any]) -> inspect.Signature:
    # Every graph replay binds its arguments: inspect.signature took about as long as the rest of
    # the replay's preparation in session 13's v1 profile, so it is read once per method.
    return inspect.signature(function)


@functools.lru_cache(maxsize=None)
def _names_by_position(function: Callable[..., Any]) -> Optional[Tuple[Tuple[str, ...], Tuple[str, ...]]]:
    """The names ``function``'s positional parameters bind to, and those it requires, when every
    parameter may be passed by name (no ``*args``, ``**kwargs`` or positional-only ones); None for
    any other signature."""
    parameters = tuple(_signature_of(function).parameters.values())
    if any(p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in parameters):
        return None
    positional = tuple(p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD)
    return positional, tuple(p.name for p in parameters if p.default is p.empty)


def _call_as_decode(method: Any, plus_one: Callable[[Any], Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """Call a bound metadata ``method`` with its TARGET_VERIFY arguments rebound by name as DECODE's.

    Every one-token replay comes here. Where the signature allows, the arguments are named with a
    zip (``Signature.bind`` costs about as much again, for the same dict); a call the zip cannot
    name exactly (more positional arguments than parameters, one named twice, another signature)
    goes through ``bind``, which also raises what a wrong call raises."""
    function = method.__func__
    positional = (method.__self__, *args)
    plan = _names_by_position(function)
    arguments: Optional[Dict[str, Any]] = None
    if plan is not None and len(positional) <= len(plan[0]) and kwargs.keys().isdisjoint(plan[0][: len(positional)]):
        arguments = dict(zip(plan[0], positional))
        arguments.update(kwargs)
        if not all(name in arguments for name in plan[1]):
            arguments = None
    if arguments is None:
        call = _signature_of(function).bind(*positional, **kwargs)
        _decode_arguments(call.arguments, plus_one)
        return function(*call.args, **call.kwargs)
    _decode_arguments(arguments, plus_one)
    return function(**arguments)


def _decode_view(forward_batch: Any, plus_one: Callable[[Any], Any]) -> Any:
    """A shallow copy of a TARGET_VERIFY batch (or runner view) that reads as its DECODE twin."""
    mode = forward_batch.forward_mode
    if not mode.is_target_verify():
        return forward_batch
    view = copy.copy(forward_batch)
    fields = {
        "forward_mode": mode,
        "seq_lens": forward_batch.seq_lens,
        "seq_lens_sum": getattr(forward_batch, "seq_lens_sum", None),
        "seq_lens_cpu": getattr(forward_batch, "seq_lens_cpu", None),
        "spec_info": forward_batch.spec_info,
    }
    _decode_arguments(fields, plus_one)
    for name, value in fields.items():
        setattr(view, name, value)
    return view


def _decode_arguments(arguments: Dict[str, Any], plus_one: Callable[[Any], Any]) -> None:
    """Rewrite TARGET_VERIFY metadata arguments, in place, into their one-token DECODE equivalent."""
    mode = arguments.get("forward_mode")
    if mode is None or not mode.is_target_verify():
        return
    seq_lens = arguments["seq_lens"]
    arguments["forward_mode"] = type(mode).DECODE
    arguments["seq_lens"] = plus_one(seq_lens)
    arguments["spec_info"] = None  # decode paths take a spec input to mean draft decoding
    if arguments.get("seq_lens_sum") is not None:
        arguments["seq_lens_sum"] = arguments["seq_lens_sum"] + seq_lens.shape[0]
    if arguments.get("seq_lens_cpu") is not None:
        arguments["seq_lens_cpu"] = arguments["seq_lens_cpu"] + 1


def _new_graph_runner(runner_cls: Any, model_runner: Any, attn_backend: Any) -> Any:
    # From 0.5.11 the runner takes its backend and N as arguments; before, it reads both from
    # the model runner and server_args, which build() has overridden for the duration.
    parameters = inspect.signature(runner_cls.__init__).parameters
    kwargs = {}
    if "attn_backend" in parameters:
        kwargs["attn_backend"] = attn_backend
    if "speculative_num_steps" in parameters:
        kwargs["speculative_num_steps"] = 0
    if "speculative_num_draft_tokens" in parameters:
        kwargs["speculative_num_draft_tokens"] = 1
    return runner_cls(model_runner, **kwargs)


# -- the draft model's KV while speculation is off -------------------------------------------

DRAFT_KV_ENV = "DYNSPEC_DRAFT_KV"
DRAFT_KV_FULL = "full"  # the stock draft extend every iteration
DRAFT_KV_ONLY = "kv"  # write the draft KV, skip the rest of the draft step (eager)
DRAFT_KV_GRAPH = "kv-graph"  # the same, replayed from a CUDA graph where the release's runner allows it
DRAFT_KV_DIRECT = (
    "kv-direct"  # kv-graph; v2 0.5.10+ and v1 0.5.12 feed the graph straight from the verify (dynspec_v2.DirectKVWrite)
)
DRAFT_KV_SKIP = "skip"  # no draft KV written while off (the extend's host side still runs): a negative control
DRAFT_KV_SETTINGS = ("auto", DRAFT_KV_FULL, DRAFT_KV_ONLY, DRAFT_KV_GRAPH, DRAFT_KV_DIRECT, DRAFT_KV_SKIP)
_KV_ONLY_MODES = (DRAFT_KV_ONLY, DRAFT_KV_GRAPH, DRAFT_KV_DIRECT)  # the stand-in stops the forward at the KV write
_GRAPH_MODES = (DRAFT_KV_GRAPH, DRAFT_KV_DIRECT)  # a KV-only twin graph is captured at start-up
# What ``auto`` means on each path: what exact_kv has run there on the H200. The zero-step state
# (0.5.14+; 0.5.17 fed directly and from a graph): kv-direct, per decode step 0.97 / 0.99 of plain
# decode at 64 / 128 requests on 0.5.17 (0.96 / 0.97 through the stock extend, 0.86 / 0.87 for the
# full one); where the release cannot be fed directly it is kv-graph, said once at start-up.
# dynspec's own v2 fallback (0.5.4 - 0.5.13): kv-direct where its stock draft-extend graph runner
# is one the direct write can feed (0.5.11+; exact_kv on 0.5.12 in sessions 8 - 18 and on 0.5.13,
# and every throughput and mixed_load of this path ran it), else kv, eagerly (dynspec_v2's
# own_fallback_draft_kv_default). v1: kv-direct on 0.5.12, full on older releases.
DRAFT_KV_DEFAULT = DRAFT_KV_DIRECT
DRAFT_KV_DEFAULT_OWN_FALLBACK = DRAFT_KV_DIRECT
DRAFT_KV_DEFAULT_OWN_FALLBACK_UNFED = DRAFT_KV_ONLY  # where the stock runner cannot be fed directly
DRAFT_KV_DEFAULT_V1 = DRAFT_KV_DIRECT  # where v1 feeds it directly (0.5.12); full on older v1 releases

# Draft model classes whose K/V at a position depend only on that position's inputs: the token's
# embedding and the target's hidden states there, through ``fc``, the two input norms, the K/V
# projections and rope. True of a one-layer EAGLE-3 head; DraftKV also checks there is one layer.
KV_ONLY_DRAFTS = ("LlamaForCausalLMEagle3",)

# Where releases keep a graph runner that would replay the draft extend without calling the
# model's forward: per worker, and on the draft model runner (piecewise / breakable prefill graphs).
_WORKER_GRAPH = "cuda_graph_runner_for_draft_extend"
_RUNNER_GRAPHS = ("prefill_cuda_graph_runner", "piecewise_cuda_graph_runner")
_WINDOWS_BEFORE_VERDICT = 64


class _DraftKVWritten(BaseException):
    """Raised from the draft KV pool's write to end the draft forward early. A BaseException, so
    that no ``except Exception`` on the way up to ``DraftKV._forward`` can swallow it."""


class DraftKV:
    """How a fallback iteration keeps the draft model's KV cache exact, for a fraction of a step.

    ``kv_only(worker)`` wraps the stock draft extend of one fallback iteration. Inside it the
    draft model's ``forward`` is a stand-in that runs the real one up to the draft layer's KV
    write (the pool's ``set_kv_buffer``, called by the attention backend with the backend's own
    locations and scales), then stops: the K/V written are exactly those of a full extend, and
    attention, MLP, lm_head and top-k are skipped. The stock code carries on with placeholder
    logits (one column) and hidden states: shape-valid, never drafted from, because the
    iteration that switches speculation back on runs the full extend (``RESUME``).

    The extend then runs eagerly, or (``kv-graph``) replays a CUDA graph that a second instance
    of the release's own draft-extend graph runner captured through the stand-in (``capture_graph``):
    the same shapes as the stock graph, without the kernels after the KV write. ``kv-direct`` is
    ``kv-graph`` where v2 (0.5.10+) lets dynspec feed that graph's four inputs itself instead of
    through the stock extend's preparation (``dynspec_v2.DirectKVWrite``).

    Modes (``DYNSPEC_DRAFT_KV``): ``auto`` (default) is the path's proven mode (``DRAFT_KV_DEFAULT``
    for the zero-step state, ``DRAFT_KV_DEFAULT_OWN_FALLBACK``, ``DRAFT_KV_DEFAULT_V1``); ``full`` is the stock extend every iteration; ``kv``, ``kv-graph`` and ``kv-direct`` need a
    draft class in ``KV_ONLY_DRAFTS`` with one attention layer (else start-up refuses them); ``skip`` runs no draft extend while off,
    which leaves the draft KV with holes: a negative control for ``dynspec proof``, never for
    serving. A backend that writes the KV without ``set_kv_buffer`` (a fused kernel), or eager
    windows that never reach the stand-in, turn the saving modes into ``full``, with a warning.
    """

    def __init__(self, mode: str, draft_runner: Any, *, log: bool = True) -> None:
        self.mode = mode
        self.runner = draft_runner
        self.log = log
        self.graph: Any = None  # the KV-only draft-extend graph runner (kv-graph), once captured
        self.direct: Any = None  # kv-direct: the writer that feeds ``graph`` itself (dynspec_v2.DirectKVWrite)
        self._active = False  # True while the stand-in forward runs the real one
        self._real_forward: Optional[Callable[..., Any]] = None  # the model's own, while shadowed
        self._called = False  # the stand-in ran in the current kv_only window
        self._windows = 0  # eager kv_only windows so far, and those in which the stand-in ran
        self._windows_called = 0

    @classmethod
    def build(
        cls, draft_runner: Any, *, log: bool = True, auto: Union[str, Callable[[], str]] = DRAFT_KV_DEFAULT
    ) -> "DraftKV":
        """The mode from ``DYNSPEC_DRAFT_KV`` and the draft model; a bad setting raises ValueError.
        ``auto`` is the mode exact_kv has proven on the caller's path, or what works it out (asked
        only when the setting is ``auto``)."""
        setting = os.environ.get(DRAFT_KV_ENV, "auto").strip().lower() or "auto"
        if setting not in DRAFT_KV_SETTINGS:
            raise ValueError(f"{DRAFT_KV_ENV} must be one of {', '.join(DRAFT_KV_SETTINGS)}, not {setting!r}")
        if setting == "auto":
            mode = auto() if callable(auto) else auto
        else:
            mode = setting
        if mode in _KV_ONLY_MODES:
            why_not = kv_only_unsupported(getattr(draft_runner, "model", None))
            if why_not is not None and setting != "auto":
                raise ValueError(f"{DRAFT_KV_ENV}={mode}: {why_not}")
            if why_not is not None:  # a default the draft cannot take: today's extend, said once
                mode = DRAFT_KV_FULL
                if log:
                    logger.info(f"dynspec: {why_not}; the fallback runs the full draft extend in every iteration")
        if mode == DRAFT_KV_SKIP and log:
            logger.warning(
                f"dynspec: {DRAFT_KV_ENV}=skip: no draft extend while speculation is off; the draft KV keeps "
                "holes and acceptance drops after resume (a negative control, not for serving)"
            )
        return cls(mode, draft_runner, log=log)

    @property
    def saves_work(self) -> bool:
        """True when a fallback iteration's draft extend does less than the stock one."""
        return self.mode != DRAFT_KV_FULL

    @property
    def writes_kv_only(self) -> bool:
        """True when the draft forward is stopped right after its KV write (not ``full``, not ``skip``)."""
        return self.mode in _KV_ONLY_MODES

    def capture_graph(self, build: Callable[[], Any], backend: Any) -> None:
        """``kv-graph``: build the KV-only twin of the draft-extend graph runner (``build`` makes a
        new instance of the release's runner class); it captures through the stand-in forward.
        Without it (``build`` fails or returns None), the KV-only extend runs eagerly.

        ``backend`` is the draft-extend attention backend both runners use. A runner allocates
        the backend's CUDA-graph buffers when it is built, and the stock graph was captured on
        the ones there now: the twin must capture on those too (same sizes), not replace them.
        A backend may also keep per-size planning objects (FlashInfer's ``*_cuda_graph_metadata``
        wrappers): the twin's capture would put its own in their place, and the stock graph's next
        replay would plan into wrappers its captured kernels never read. The twin's go into copies.
        """
        if self.mode not in _GRAPH_MODES:
            return
        tic = time.perf_counter()
        keep_buffers = contextlib.ExitStack()
        if backend is not None:
            keep_buffers.enter_context(shadowed(backend, "init_cuda_graph_state", _already_done))
            for name, value in list(getattr(backend, "__dict__", {}).items()):
                if name.endswith(_PER_SIZE_PLANS) and isinstance(value, dict):
                    keep_buffers.enter_context(shadowed(backend, name, dict(value)))
        try:
            with self._stand_in(), keep_buffers:
                graph = build()
        except Exception as error:  # noqa: BLE001 - serve eagerly rather than not at all
            self.graph = None
            if self.log:
                logger.warning(
                    f"dynspec: no KV-only draft-extend CUDA graph ({error!r}); the KV-only extend runs eagerly"
                )
            return
        if self.mode not in _GRAPH_MODES:  # given up while capturing (_give_up): that graph ran the full forward
            return
        self.graph = graph
        if self.log and self.graph is not None:
            logger.info(f"dynspec: KV-only draft-extend CUDA graph captured in {time.perf_counter() - tic:.2f} s")

    @contextlib.contextmanager
    def kv_only(self, worker: Any, counted: bool = True) -> Iterator[None]:
        """Around one fallback iteration's draft extend (``worker`` holds its CUDA graph runner).
        ``counted``: the window counts toward the verdict that the stand-in is reached (a prefill's,
        which always reaches it, does not: it would hide a decode path that never does)."""
        if not self.saves_work:
            yield
            return
        graph = self.graph if self.mode in _GRAPH_MODES else None
        swaps = [(worker, _WORKER_GRAPH, graph)] if hasattr(worker, _WORKER_GRAPH) else []
        # A prefill graph of the draft runner would replay the full forward instead of the stand-in.
        swaps += [(self.runner, name, None) for name in _RUNNER_GRAPHS if getattr(self.runner, name, None) is not None]
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in swaps]
        for owner, name, value in swaps:
            setattr(owner, name, value)
        self._called = False
        try:
            with self._stand_in():
                yield
        finally:
            for owner, name, value in saved:
                setattr(owner, name, value)
        if graph is None and counted:
            # A window whose requests all finished runs no extend; a path that never calls the
            # stand-in (a graph this module does not know) shows as none of the first windows doing so.
            self._windows += 1
            self._windows_called += self._called
            if self._windows == _WINDOWS_BEFORE_VERDICT and self._windows_called == 0:
                self._give_up(f"the draft model's forward was not called in {self._windows} fallback iterations")

    @contextlib.contextmanager
    def _stand_in(self) -> Iterator[None]:
        model = self.runner.model
        self._real_forward = model.forward
        try:
            with shadowed(model, "forward", self._forward):
                yield
        finally:
            self._real_forward = None

    def _forward(self, input_ids: Any, positions: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
        """Stands in for the draft model's ``forward`` inside ``kv_only`` and ``capture_graph``."""
        self._called = True
        assert self._real_forward is not None
        if self.mode in _KV_ONLY_MODES:
            # Read here, not at start-up: 0.5.14+ allocate the draft pool after the worker is built.
            pool = self.runner.token_to_kv_pool
            if not hasattr(pool, "__dict__") or not callable(getattr(pool, "set_kv_buffer", None)):
                self._give_up(f"the draft KV pool ({type(pool).__name__}) cannot be watched for its KV write")
                return self._real_forward(input_ids, positions, forward_batch, *args, **kwargs)
            self._active = True
            try:
                with shadowed(pool, "set_kv_buffer", functools.partial(self._write_and_stop, pool.set_kv_buffer)):
                    output = self._real_forward(input_ids, positions, forward_batch, *args, **kwargs)
            except _DraftKVWritten:
                pass
            else:
                # The KV went in some other way; this was a full extend, and its output is valid.
                self._give_up(f"{type(pool).__name__}.set_kv_buffer was not called by the draft layer")
                return output
            finally:
                self._active = False
        return self.placeholder(placeholder_rows(input_ids, forward_batch), input_ids.device)

    def _write_and_stop(self, write: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        result = write(*args, **kwargs)
        if self._active:
            raise _DraftKVWritten()
        return result

    def placeholder(self, rows: int, device: Any) -> Any:
        """Logits and hidden states of the right row count, width and dtype, never drafted from."""
        import torch
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        width, dtype = self.hidden_states_of_a_row()
        return LogitsProcessorOutput(
            next_token_logits=torch.zeros((rows, 1), dtype=torch.float32, device=device),
            hidden_states=torch.zeros((rows, width), dtype=dtype, device=device),
        )

    def hidden_states_of_a_row(self) -> Tuple[int, Any]:
        """Width and dtype of the draft model's output hidden states (what the next draft reads)."""
        config = self.runner.model_config
        return getattr(config, "spec_hidden_size", None) or config.hidden_size, config.dtype

    def _give_up(self, why: str) -> None:
        if self.saves_work:
            if self.log:
                logger.warning(
                    f"dynspec: {DRAFT_KV_ENV}={self.mode} cannot work here ({why}); running the full draft extend"
                )
            self.mode = DRAFT_KV_FULL
            self.graph = None
            self.direct = None


def _already_done(*args: Any, **kwargs: Any) -> None:
    """``init_cuda_graph_state`` while the KV-only twin is built: the stock runner's call stands."""


def placeholder_rows(input_ids: Any, forward_batch: Any) -> int:
    """Rows the stock draft forward returns: one per request for v1's DRAFT_EXTEND and for a
    prefill's EXTEND (their logits keep each request's last token), one per token for v2's
    DRAFT_EXTEND_V2."""
    mode = getattr(forward_batch, "forward_mode", None)
    is_v1_extend = getattr(mode, "is_draft_extend", None)
    if (callable(is_v1_extend) and is_v1_extend()) or getattr(mode, "name", None) == "EXTEND":
        return int(forward_batch.batch_size)
    return int(input_ids.shape[0])


@contextlib.contextmanager
def shadowed(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` is ``value`` inside the block (an instance attribute over the class's)."""
    own = owner.__dict__.get(name, _MISSING)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if own is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, own)


_MISSING = object()
# Where attention backends keep objects planned per captured batch size (FlashInfer's decode, verify
# and draft-extend wrappers); Triton keeps none.
_PER_SIZE_PLANS = "_cuda_graph_metadata"


def kv_only_unsupported(model: Any) -> Optional[str]:
    """Why the KV-only draft extend cannot serve this draft model; None if it can."""
    name = type(model).__name__
    if name not in KV_ONLY_DRAFTS:
        return f"the KV-only draft extend does not know the draft model class {name}"
    attention = [m for m in model.modules() if type(m).__name__ == "RadixAttention"]
    if len(attention) != 1:
        return f"the KV-only draft extend needs a one-layer draft; {name} has {len(attention)} attention layers"
    return None


# -- recording the drafts, for dynspec proof's exact_kv check -----------------------------------

RECORD_ENV = "DYNSPEC_RECORD_DRAFTS"
KV_BITS_ENV = "DYNSPEC_CHECK_KV_BITS"  # dynspec_v2.KVBitCheck (v1 only)
RECORD_RID_PREFIX = "dynspec-record-"  # only requests named so are recorded (dynspec proof names them)


class DraftRecorder:
    """Appends one JSON line per decode iteration to ``$DYNSPEC_RECORD_DRAFTS`` (opt-in, rank 0).

    ``{"step": "speculate", "rid": [...], "pos": [...], "draft": [[...], ...]}`` for a speculative
    iteration (the tokens drafted after each request's root) and ``{"step": "fall back" | "resume",
    "rid": [...], "pos": [...]}`` otherwise; ``pos`` is each request's ``seq_lens`` entry. Only
    requests whose rid starts with ``RECORD_RID_PREFIX`` are written; an iteration with one of
    them reads its tensors to the CPU and so waits for the GPU: for proofs only. Unset, nothing
    is built.
    """

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - open while the server runs

    @classmethod
    def from_env(cls, rank0: bool) -> Optional["DraftRecorder"]:
        path = os.environ.get(RECORD_ENV, "").strip()
        return cls(path) if path and rank0 else None

    def iteration(self, step: str, batch: Any, verify_input: Any = None) -> None:
        rids = [str(getattr(r, "rid", "")) for r in getattr(batch, "reqs", None) or []]
        rows = [i for i, rid in enumerate(rids) if rid.startswith(RECORD_RID_PREFIX)]
        if not rows:
            return
        positions = batch.seq_lens.tolist()
        record: Dict[str, Any] = {
            "step": step,
            "rid": [rids[i] for i in rows],
            "pos": [int(positions[i]) for i in rows],
        }
        if verify_input is not None:
            drafts = verify_input.draft_token.reshape(len(positions), -1)[:, 1:].tolist()
            record["draft"] = [drafts[i] for i in rows]
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def watch_drafts(self, draft_owner: Any, in_fallback: Callable[[], bool]) -> None:
        """Shadow ``draft_owner.draft`` so that each speculative iteration's drafts are recorded."""
        draft = draft_owner.draft

        def recording_draft(batch: Any, *args: Any, **kwargs: Any) -> Any:
            verify_input = draft(batch, *args, **kwargs)
            if not in_fallback():
                self.iteration(SPECULATE, batch, verify_input)
            return verify_input

        draft_owner.draft = recording_draft


class DynspecFallback:
    """Per-worker dynspec state, reached from the hooks in ``eagle_worker.py``."""

    def __init__(
        self,
        controller: SwitchController,
        target: SingleTokenTarget,
        draft_kv: "DraftKV",
        recorder: Optional["DraftRecorder"] = None,
    ) -> None:
        self.controller = controller
        self.target = target
        self.draft_kv = draft_kv
        self.recorder = recorder
        self.in_fallback = False
        self._step = SPECULATE
        self._tree_indices = TreeIndices()
        self.bit_check: Any = None  # dynspec_v2.KVBitCheck, with DYNSPEC_CHECK_KV_BITS
        self.lean: Optional["LeanFallbackStep"] = None  # kv-direct fed directly, unless switched off
        self.stock_extend: Optional[Callable[[Any], Any]] = None  # the release's extend after the verify (kv-direct)

    def should_fall_back(self, batch: Any) -> bool:
        """Called at the top of the decode branch; counts the iteration unless re-entered."""
        if self.in_fallback or batch.forward_mode.is_idle():
            return False
        self._step = self.controller.step(batch.batch_size())
        return self._step != SPECULATE

    def fall_back(self, worker: Any, batch: Any, entry: Callable[[Any], Any]) -> Any:
        """Run the stock decode branch once more with N=1 state; ``draft()`` then returns the trivial tree.

        Its draft extend writes only the draft KV, except at ``RESUME``, where it is the stock one.
        """
        if self.recorder is not None:
            self.recorder.iteration(self._step, batch)
        saved_steps = (worker.speculative_num_steps, worker.speculative_num_draft_tokens)
        previous = self.target.swap_in()
        worker.speculative_num_steps, worker.speculative_num_draft_tokens = 0, 1
        self.in_fallback = True
        try:
            if self._step == FALL_BACK and self.lean is not None and self.lean.takes(batch):
                return self.lean.step(worker, batch, self)
            # The bit check runs the full extend (after its direct writes): no KV-only window then.
            kv_only = self._step == FALL_BACK and self.bit_check is None
            with self.draft_kv.kv_only(worker) if kv_only else contextlib.nullcontext():
                return entry(batch)
        finally:
            self.in_fallback = False
            worker.speculative_num_steps, worker.speculative_num_draft_tokens = saved_steps
            self.target.swap_out(previous)

    def feed_twin_directly(self, worker: Any, log: bool) -> None:
        """``kv-direct`` on v1: in a fallback iteration the draft extend after the verify becomes a
        ``dynspec_v2.StockGraphDirectWrite`` of the twin (v2's own fallback's writer, the same runner
        class, in graphs that round as v1's stock extend graph), where the release hands the extend
        what it reads (0.5.12's ``EagleDraftExtendInput``); elsewhere it stays kv-graph, said once.
        The v2 module ships with every release that has that input (0.5.4+), so it is imported only here."""
        if self.draft_kv.mode != DRAFT_KV_DIRECT or self.draft_kv.graph is None:
            return
        next_input_cls = v1_next_draft_input_class(worker)
        if next_input_cls is None:
            if log:
                logger.info(
                    "dynspec: this EAGLEWorker's draft extend takes no EagleDraftExtendInput; kv-direct is kv-graph"
                )
            return
        from sglang.srt.speculative.dynspec_v2 import KVBitCheck, StockGraphDirectWrite, feed_directly

        if not feed_directly(
            self.draft_kv, lambda twin: StockGraphDirectWrite.build(twin, worker, self.draft_kv, log), log
        ):
            return
        self.bit_check = KVBitCheck.from_env(self.draft_kv.graph, log)
        # With the bit check too: its lean iterations compare the lean rows' direct write with the full
        # extend (exact_kv's reference server turns the lean step off, DYNSPEC_LEAN_VERIFY=0).
        self.lean = LeanFallbackStep.build(worker, next_input_cls, log, checked=self.bit_check is not None)
        stock = worker.forward_draft_extend_after_decode
        self.stock_extend = stock

        def forward_draft_extend_after_decode(batch: Any) -> Any:
            writer = self.draft_kv.direct  # None once given up
            if self.in_fallback and self._step == FALL_BACK and writer is not None:
                if self.bit_check is not None:  # the full extend runs and stays, checked or not
                    if batch.spec_info.input_ids.shape[0] != batch.out_cache_loc.shape[0]:
                        return stock(batch)  # requests finished in the verify: their slots are not the extend's
                    return self.bit_check.compare(
                        batch.out_cache_loc, direct_writes(writer, worker, batch, next_input_cls), lambda: stock(batch)
                    )
                next_input = extend_after_decode_directly(writer, worker, batch, next_input_cls)
                if next_input is not None:
                    return next_input
            return stock(batch)

        worker.forward_draft_extend_after_decode = forward_draft_extend_after_decode

    def trivial_verify_input(self, worker: Any, batch: Any, verify_input_cls: Any) -> Any:
        """What ``draft()`` returns in fallback: a one-node tree rooted at the pending bonus token.

        Repeats the side effects of ``_draft_preprocess_decode`` that do not concern draft KV.
        """
        import torch
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

        spec_info = batch.spec_info
        bonus = getattr(spec_info, "bonus_tokens", None)  # 0.5.12 renamed verified_id
        if bonus is None:
            bonus = spec_info.verified_id

        _evict_sliding_window(batch)
        reqs = batch.reqs
        if reqs and hasattr(reqs[0], "decode_batch_idx"):  # 0.5.8+
            for req in reqs:
                req.decode_batch_idx += 1
        penalizer = batch.sampling_info.penalizer_orchestrator
        if penalizer.is_required:
            penalizer.cumulate_output_tokens(bonus.to(torch.int64))

        seq_lens_cpu = getattr(batch, "seq_lens_cpu", None)  # on ScheduleBatch from 0.5.3
        if seq_lens_cpu is not None:
            seq_lens_sum = int(seq_lens_cpu.sum())
        else:
            seq_lens_sum = int(batch.seq_lens.sum().item())
        batch.seq_lens_sum = seq_lens_sum
        batch.return_hidden_states = False

        bs = len(reqs)
        device = batch.seq_lens.device
        root_index, no_child = self._tree_indices(bs, device)
        fields = trivial_tree_fields(
            tree_field_prefix(verify_input_cls),
            draft_token=bonus.to(torch.int64),
            # A node sees the whole prefix and itself: seq_len + 1 mask entries per request.
            custom_mask=torch.ones(seq_lens_sum + bs, dtype=torch.bool, device=device),
            positions=batch.seq_lens.to(torch.int64, copy=True),
            root_index=root_index,
            no_child=no_child,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            seq_lens_sum=seq_lens_sum,
            seq_lens_cpu=seq_lens_cpu,
        )
        return verify_input_cls(**fields)


WRITE_AHEAD_ENV = "DYNSPEC_WRITE_AHEAD"  # LeanFallbackStep: 0 writes the draft KV after the step's wait, for A/B runs


class LeanFallbackStep:
    """v1 (0.5.12) with ``kv-direct`` fed directly: a fallback iteration as a plain decode step.

    The one-node verify through the stock ``draft()`` / ``verify()`` / extend does, around the same
    target forward, work a plain decode step does not: the tree kernel, boolean-index gathers,
    four host syncs, a gather of the logits, the extend's preparation kernel; on the H200 (session
    13's profile, 64 requests) 51 kernel launches and 12 host copies a step against plain decode's 11
    and 2, which left the GPU idle long enough to make the step 1.28x a plain one. For a greedy batch
    the outcome of that verify is known in advance: every request accepts its root, whose next token
    is the target's argmax. So this step keeps the release's verify preparation (the one-node tree,
    ``prepare_for_verify``: slots and ``req_to_token``) and the target forward through the one-token
    graphs, takes the argmax, waits once for it, does the verify's per-request bookkeeping for one
    accepted token, and hands the draft KV rows straight to the direct write, in the same rows and
    order as the stock extend would get them (the unfinished requests), so the same graph is
    replayed. The scheduler and the next iteration see what the stock verify and extend leave.

    Without the overlap scheduler the host's work after the wait is the GPU's idle time, and the
    write's host work (four copies into the graph's inputs, the padding, the replay) was most of
    what this step added after it. So the write is queued before the wait, for every request, while
    the target forward still runs, behind the tokens' copy to the host (``TokensToHost``), which is
    all the wait waits for; the write's GPU time then falls in the host's time after the wait too.
    The bookkeeping that needs no token (``count_one_verify``) runs before the wait as well.
    Where a request finished in this step the stock extend writes only the others, in the graph
    for their count, which may round their K/V apart from the graph for all: those rows are
    written again, as before (such a step costs what it did before r22). A finished
    request's row is written into its last slot, which nothing reads: with EAGLE the radix cache
    keys token pairs, so that slot is freed with the request (0.5.12's ``cache_finished_req``), and
    the next owner's forward writes it again, after the write in the same stream. Where that is
    not so, the write stays after the wait: PD disaggregation, whose transfers fill new slots
    unordered with the stream, and streaming sessions, whose next turn keeps and reads that slot
    (where the stock extend leaves what was there).

    A sampled batch is drawn by the target's sampler as plain decode draws it (``dynspec_v2.DecodeSample``,
    v2 module r45), where the verify's draw would renormalise the top k before cutting top-p; the
    rest of the step is the same. A batch it does not take (penalties, logit bias, a custom logit
    processor, grammar, logprobs, not a decode; sampling under ``SGLANG_SIMULATE_ACC_LEN`` or
    without a sampler it knows) runs the stock path, and the first is logged, with the reason. A batch
    the direct write cannot take (no graph for its row count) runs the stock extend KV-only.
    ``DYNSPEC_LEAN_VERIFY=0`` turns it off, for A/B runs. Not recorded for these iterations: the stock
    decode branch's tracing spans (``set_time_batch``, on only with request tracing) and the verify's
    ``maybe_detect_nan`` (a debug setting); ``extend_lens`` keeps its last value (no TARGET_VERIFY or
    decode batch reads it).
    """

    def __init__(
        self,
        worker_module: Any,
        extend_input_cls: Any,
        next_input_cls: Any,
        simulated_token: Optional[int],
        log: bool,
        ahead: bool = True,
    ) -> None:
        self.module = worker_module  # the release's eagle_worker module: its classes and contexts
        self.extend_input_cls = extend_input_cls
        self.next_input_cls = next_input_cls
        self.simulated_token = simulated_token  # SGLANG_SIMULATE_ACC_LEN's token for every accepted one, or None
        self.log = log  # rank 0
        self.said_no = False  # the first batch left to the stock path has been logged
        self.to_host = TokensToHost()
        self.decode_sample: Any = None  # dynspec_v2.DecodeSample: sampled batches, or None (the stock path)
        # The draft KV written before the step's wait (``DYNSPEC_WRITE_AHEAD``; ``build`` says where
        # not); never with the bit check, which writes after it, beside the full extend it compares with.
        self.ahead = ahead

    @classmethod
    def build(cls, worker: Any, next_input_cls: Any, log: bool, checked: bool = False) -> Optional["LeanFallbackStep"]:
        """The lean step for this worker, or None (the stock path; why is logged on rank 0).
        ``checked``: the KV bit check is on (``DYNSPEC_CHECK_KV_BITS``)."""
        from sglang.srt.speculative.dynspec_v2 import (
            DecodeSample,
            LeanVerify,
            lean_verify_enabled,
            on_off_setting,
            read_setting,
        )

        ahead = on_off_setting(WRITE_AHEAD_ENV, True)  # a bad value refuses to start, used or not
        if not lean_verify_enabled():
            return None
        module: Any = sys.modules.get(type(worker).__module__)
        why_not = cls.unfit(worker, module)
        simulated: Optional[int] = None
        simulating = False
        if why_not is None:
            import importlib

            spec_utils = importlib.import_module("sglang.srt.speculative.spec_utils")
            simulated, why_not = LeanVerify.simulated_token_of(spec_utils)
            simulating = LeanVerify.simulates(spec_utils)
        if why_not:
            if log:
                logger.info(f"dynspec: a fallback iteration runs the stock one-node verify ({why_not})")
            return None
        when = "before it" if ahead else f"after it, {WRITE_AHEAD_ENV}=0"
        # A finished request's row is written ahead too: where its last slot may be read or refilled
        # outside the worker's stream, the write stays after the wait.
        if ahead and checked:
            ahead, when = False, "after it, beside the KV bit check's full extend"
        elif ahead and read_setting(worker, "disaggregation_mode", "null") not in (None, "null"):
            # The slot is freed right after the step, and PD's transfers fill new slots unordered with the stream.
            ahead, when = False, "after it, as PD disaggregation moves KV into freed slots unordered with the write"
        elif ahead and read_setting(worker, "enable_streaming_session", False):
            # The stock extend leaves that slot's draft KV as it was, and a session's next turn keeps and reads it.
            ahead, when = False, "after it, as a streaming session's next turn reads a finished request's last slot"
        if log:
            logger.info(
                "dynspec: a fallback iteration of a greedy batch runs as a plain decode step (the target's argmax, "
                f"one host sync, the draft KV written directly, {when})"
            )
        step = cls(module, module.EagleDraftExtendInput, next_input_cls, simulated, log, ahead)
        runner = worker.target_worker.model_runner
        step.decode_sample = DecodeSample.for_runner(runner, simulating, "the lean fallback step", log)
        return step

    # What the per-request bookkeeping (``commit``) calls on a request, as 0.5.12's verify does.
    REQ_NEEDS = ("check_finished", "finished", "update_spec_correct_drafts_histogram", "update_reasoning_tokens")

    @classmethod
    def unfit(cls, worker: Any, module: Any) -> Optional[str]:
        """Why this release or server may not take the lean step (static checks); None if it may."""
        if not callable(getattr(getattr(module, "EagleVerifyInput", None), "prepare_for_verify", None)):
            return "the worker's module has no EagleVerifyInput.prepare_for_verify"
        if not callable(getattr(getattr(module, "EagleDraftExtendInput", None), "create_idle_input", None)):
            return "the worker's module has no EagleDraftExtendInput"
        req_cls = getattr(sys.modules.get("sglang.srt.managers.schedule_batch"), "Req", None)
        missing = [name for name in cls.REQ_NEEDS if not callable(getattr(req_cls, name, None))]
        if missing:
            return f"this release's Req has no {missing[0]}"
        runner = worker.target_worker.model_runner
        hybrid = ("hybrid_gdn_config", "mamba2_config", "hybrid_lightning_config")
        if any(getattr(runner, name, None) is not None for name in hybrid):
            return "a hybrid (mamba) target, whose verify updates its state"
        if not callable(getattr(module, "GenerationBatchResult", None)):
            return "the worker's module has no GenerationBatchResult"
        return None

    def refusal(self, batch: Any) -> Optional[str]:
        """Why this batch's fallback iteration must run the stock path; None if the lean step takes it."""
        if not batch.forward_mode.is_decode():
            return "not a decode batch"
        if batch.has_grammar:
            return "grammar"
        if batch.return_logprob:
            return "logprobs"
        info = batch.sampling_info
        if info.penalizer_orchestrator.is_required or getattr(info, "logit_bias", None) is not None:
            return "penalties or a logit bias"
        if getattr(info, "has_custom_logit_processor", False):
            return "a custom logit processor"
        if not info.is_all_greedy:
            # The one-node tree's positions are the batch's seq_lens, one per request: nothing to check there.
            return "sampling" if self.decode_sample is None else self.decode_sample.refusal(batch, ())
        return None

    def takes(self, batch: Any) -> bool:
        why_not = self.refusal(batch)
        if why_not is not None and self.log and not self.said_no:
            self.said_no = True
            logger.info(f"dynspec: a fallback batch ran the stock one-node verify ({why_not}); said once")
        return why_not is None

    def step(self, worker: Any, batch: Any, fallback: "DynspecFallback") -> Any:
        """One fallback iteration; returns the release's ``GenerationBatchResult``."""
        import torch
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        # The verify's preparation: the one-node tree, its slot per request, req_to_token.
        verify_input = fallback.trivial_verify_input(worker, batch, self.module.EagleVerifyInput)
        positions = verify_input.positions  # the pre-step seq_lens: where each bonus token goes
        verify_input.prepare_for_verify(batch, worker.page_size)
        verify_input.num_tokens_per_req = 1
        batch.spec_info = verify_input
        batch.forward_mode = ForwardMode.TARGET_VERIFY
        model_worker_batch = batch.get_model_worker_batch(seq_lens_cpu_cache=verify_input.seq_lens_cpu)
        result = worker.target_worker.forward_batch_generation(model_worker_batch, is_verify=True)
        logits_output = result.logits_output

        # A one-node tree's root is accepted; its next token is the argmax (verify_tree_greedy), or plain decode's draw.
        if batch.sampling_info.is_all_greedy:
            predict = torch.argmax(logits_output.next_token_logits, dim=-1).to(torch.int32)
            if self.simulated_token is not None:
                predict.fill_(self.simulated_token)
        else:
            predict = self.decode_sample.draw(model_worker_batch, verify_input, logits_output)
        bs = len(batch.reqs)
        self.to_host.start(predict)

        hidden = logits_output.hidden_states
        if fallback.bit_check is not None and hidden is not None:
            # The check replays the stock extend graph, captured before the one-token target graph from
            # the same pool, so it may reuse the memory these live in; the scheduler reads them after
            # (return_hidden_states). The stock verify gathers them into a copy too.
            logits_output.hidden_states = hidden.clone()
        rows = (positions, batch.out_cache_loc, predict, hidden)
        ahead = None  # the next draft input, where every request's row was written before the wait
        ahead_tried = self.ahead and fallback.draft_kv.direct is not None and fallback.bit_check is None
        if ahead_tried:  # queued before the wait (see the class)
            with draft_extend_contexts(worker, "draft_model_runner", self.module):
                ahead = self.written(fallback.draft_kv.direct, ForwardMode.DECODE, rows)
        count_one_verify(batch)  # needs no token: before the wait too
        unfinished = commit_one_token(batch, self.to_host.wait())  # the step's one wait for the GPU
        keep = None
        if len(unfinished) < bs:  # as the verify hands the extend only the unfinished requests
            keep = torch.tensor(unfinished, dtype=torch.int64, device=predict.device)
            # After the write's replay, and safe: the twin is captured after the target's graphs.
            rows = tuple(t[keep] for t in rows)
        batch.seq_lens.add_(1)
        batch.seq_lens_cpu.add_(1)
        batch.out_cache_loc, batch.input_ids = rows[1], rows[2]
        batch.forward_mode = ForwardMode.DECODE
        if ahead is not None and keep is None:
            batch.spec_info = ahead
        else:
            with draft_extend_contexts(worker, "draft_model_runner", self.module):
                if not unfinished:
                    worker._draft_preprocess_idle(batch)
                else:  # the kept rows again, or rows the write ahead did not take
                    declined = ahead_tried and ahead is None
                    batch.spec_info = self.next_draft_input(worker, batch, rows, keep, fallback, declined)
        return self.module.GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=predict,
            num_correct_drafts=0,
            num_correct_drafts_per_req_cpu=[0] * bs,
            can_run_cuda_graph=result.can_run_cuda_graph,
        )

    def written(self, writer: Any, mode: Any, rows: Tuple[Any, ...]) -> Any:
        """The next ``EagleDraftInput`` once ``writer`` took ``rows`` (positions, slots, tokens,
        hidden states): the direct write's stand-ins, never drafted from (``RESUME`` runs the full
        extend); None where it did not take them."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

        positions, slots, tokens, hidden = rows
        verified = types.SimpleNamespace(
            next_token_ids=tokens,
            logits_output=types.SimpleNamespace(hidden_states=hidden),
            next_draft_input=types.SimpleNamespace(),
        )
        if not writer.write(
            types.SimpleNamespace(forward_mode=mode, seq_lens=positions, out_cache_loc=slots), verified
        ):
            return None
        stand_in = verified.next_draft_input
        return self.next_input_cls(
            bonus_tokens=tokens,  # read only: the next iteration copies it (trivial_verify_input)
            hidden_states=stand_in.hidden_states,
            topk_p=stand_in.topk_p,
            topk_index=stand_in.topk_index,
            capture_hidden_mode=CaptureHiddenMode.LAST,
        )

    def next_draft_input(
        self,
        worker: Any,
        batch: Any,
        rows: Tuple[Any, ...],
        keep: Any,
        fallback: "DynspecFallback",
        declined: bool = False,
    ) -> Any:
        """Write the rows' draft KV and return the next iteration's ``EagleDraftInput``: the direct
        write's stand-ins, or, where the direct write cannot take the rows, what the stock extend
        returns, run KV-only. ``declined``: the writer did not take every request's row ahead of
        the wait; it is asked again only for fewer rows."""
        slots = rows[1]
        writer = fallback.draft_kv.direct
        if fallback.bit_check is not None and writer is not None and fallback.stock_extend is not None:
            # The check: these rows written directly, then the full extend of the input the verify would
            # have made, on the same slots; the full extend's draft KV and next input stay.
            batch.spec_info = self.extend_input(batch, rows, keep)
            full_extend = fallback.stock_extend
            writes = checked_writes(
                writer, int(slots.shape[0]), lambda: self.written(writer, batch.forward_mode, rows) is not None
            )
            return fallback.bit_check.compare(slots, writes, lambda: full_extend(batch))
        if writer is not None and not (declined and keep is None):
            next_input = self.written(writer, batch.forward_mode, rows)
            if next_input is not None:
                return next_input
        batch.spec_info = self.extend_input(batch, rows, keep)
        with fallback.draft_kv.kv_only(worker):
            return worker.forward_draft_extend_after_decode(batch)

    def extend_input(self, batch: Any, rows: Tuple[Any, ...], keep: Any) -> Any:
        """The ``EagleDraftExtendInput`` 0.5.12's verify makes for these rows: one accepted token each,
        the post-step lengths and pool indices of the requests kept."""
        import torch

        _, _, tokens, hidden = rows
        count = int(tokens.shape[0])
        accepted = torch.ones(count, dtype=torch.int32, device=tokens.device)
        seq_lens, seq_lens_cpu, req_pool_indices = batch.seq_lens, batch.seq_lens_cpu, batch.req_pool_indices
        if keep is not None:
            seq_lens, seq_lens_cpu, req_pool_indices = seq_lens[keep], seq_lens_cpu[keep.cpu()], req_pool_indices[keep]
        return self.extend_input_cls(
            hidden_states=hidden,
            num_correct_drafts=accepted - 1,
            num_accept_tokens=accepted,
            num_accept_tokens_cpu=[1] * count,
            input_ids=tokens,
            seq_lens=seq_lens,
            seq_lens_cpu=seq_lens_cpu,
            req_pool_indices=req_pool_indices,
        )


class TokensToHost:
    """A fallback step's one wait for the GPU: its tokens copied into pinned host memory behind an
    event, so that what the step queues after the copy (v1's lean step: the draft KV write) is not
    waited for, as ``tolist()``, which waits for the whole stream, would. CPU tensors (tests) are
    read as they are."""

    def __init__(self) -> None:
        self.host: Any = None  # pinned, room for the largest batch so far (grown by powers of two)
        self.copied: Any = None  # an event recorded after each copy, made with the buffer
        self.pending: Any = None  # the step's tokens: ``host``'s first rows, or a CPU tensor
        self.waits = False  # whether ``pending`` is a copy under way

    def start(self, tokens: Any) -> None:
        """Queue the copy of ``tokens`` (one dimension) to the host; ``wait`` reads them."""
        if tokens.device.type == "cpu":
            self.pending, self.waits = tokens, False
            return
        import torch

        count = int(tokens.shape[0])
        device = torch.get_device_module(tokens.device)
        if self.host is None or self.host.shape[0] < count or self.host.dtype != tokens.dtype:
            room = 1 << max(count - 1, 0).bit_length()
            self.host = torch.empty(room, dtype=tokens.dtype, pin_memory=True)
            self.copied = device.Event()
        pending = self.host[:count]
        pending.copy_(tokens, non_blocking=True)  # in the tokens' device's current stream
        self.copied.record(device.current_stream(tokens.device))
        self.pending, self.waits = pending, True

    def wait(self) -> List[int]:
        """The tokens ``start`` queued, once copied; the host buffer is free again when this returns."""
        pending, self.pending = self.pending, None
        if self.waits:
            self.copied.synchronize()
        tokens: List[int] = pending.tolist()
        return tokens


def draft_extend_contexts(owner: Any, runner: str, module: Any) -> contextlib.ExitStack:
    """The contexts a stock decode branch runs the draft extend in: the draft's TP group (``owner``'s
    ``draft_tp_context`` with the group of its ``runner`` attribute) and the worker module's MoE
    backends. v1's lean step (the worker holds them) and v2's (its draft worker does) enter them
    where they run a release's extend themselves."""
    stack = contextlib.ExitStack()
    if callable(getattr(owner, "draft_tp_context", None)):
        stack.enter_context(owner.draft_tp_context(getattr(owner, runner).tp_group))
    for name in ("speculative_moe_backend_context", "speculative_moe_a2a_backend_context"):
        context = getattr(module, name, None)
        if callable(context):
            stack.enter_context(context())
    return stack


def count_one_verify(batch: Any) -> None:
    """The half of 0.5.12's verify bookkeeping (``commit_one_token``) that needs no token: one KV
    slot committed, one verify counted with no draft accepted. The lean step runs it before its
    wait; nothing the other half calls reads these fields (pinned against 0.5.12's ``Req``)."""
    for req in batch.reqs:
        req.kv_committed_len += 1
        req.kv_allocated_len = req.kv_committed_len
        req.spec_verify_ct += 1
        req.update_spec_correct_drafts_histogram(0)


def commit_one_token(batch: Any, tokens: List[int]) -> List[int]:
    """0.5.12's verify bookkeeping for a one-node tree whose root every request accepted, after
    ``count_one_verify``: append the token, update reasoning, check finished; returns the indices
    of the requests that have not finished. Grammar is not here: the lean step refuses it."""
    think_end_id = getattr(batch.model_config, "think_end_id", None)
    unfinished = []
    for i, (req, token) in enumerate(zip(batch.reqs, tokens)):
        req.output_ids.append(token)
        if req.require_reasoning and think_end_id is not None:
            req.update_reasoning_tokens(token, think_end_id)
        req.check_finished()
        if not req.finished():
            unfinished.append(i)
    return unfinished


def v1_draft_kv_default(worker: Any) -> str:
    """``auto`` on v1: ``kv-direct`` where the worker's extend takes the input the direct write feeds
    from (0.5.12, whose direct write left the stock extend's bits on the H200, session 13), ``full``
    on older v1 releases, where no KV-only extend has run."""
    return DRAFT_KV_DEFAULT_V1 if v1_next_draft_input_class(worker) is not None else DRAFT_KV_FULL


def v1_next_draft_input_class(worker: Any) -> Any:
    """0.5.12's ``EagleDraftInput`` (the next draft's input, with ``bonus_tokens``) where the worker's
    module also has the ``EagleDraftExtendInput`` the verify hands the extend; else None."""
    module = sys.modules.get(type(worker).__module__)
    extend_input = getattr(module, "EagleDraftExtendInput", None)
    next_input = getattr(module, "EagleDraftInput", None)
    fields = getattr(next_input, "__dataclass_fields__", {})
    if not callable(getattr(extend_input, "prepare_extend_after_decode", None)) or "bonus_tokens" not in fields:
        return None
    return next_input


def direct_writes(writer: Any, worker: Any, batch: Any, next_input_cls: Any) -> List[Tuple[str, Callable[[], bool]]]:
    """``KVBitCheck``'s writes of one v1 fallback iteration through the stock verify (see ``checked_writes``)."""
    rows = int(batch.spec_info.input_ids.shape[0])
    return checked_writes(
        writer, rows, lambda: extend_after_decode_directly(writer, worker, batch, next_input_cls) is not None
    )


def checked_writes(writer: Any, rows: int, direct: Callable[[], bool]) -> List[Tuple[str, Callable[[], bool]]]:
    """``KVBitCheck``'s writes of ``rows`` rows: the direct write as it serves, and, as the check's
    control, the same rows in the graph that packs them, where that is another graph."""

    def packed() -> bool:
        with writer.packing():
            return direct()

    other = rows < len(writer.replay_index) and writer.packed_index(rows) != writer.replay_index[rows]
    return [("direct", direct), ("packed", packed)] if other else [("direct", direct)]


def extend_after_decode_directly(writer: Any, worker: Any, batch: Any, next_input_cls: Any) -> Any:
    """v1's ``forward_draft_extend_after_decode`` for a fallback iteration, with the KV-only twin fed
    directly; None (the stock extend runs) for a batch the writer cannot take.

    It keeps the stock function's own preparation (``prepare_extend_after_decode``: the batch's input
    ids, lengths and flags, and the positions and bonus tokens kernel), hands the writer the rows
    (each request accepted one token: its new token, at the position before it, in the slot the
    verify kept), restores the fields the stock function restores, and returns the next draft input
    with the writer's stand-ins for what only the full extend makes (never drafted from while off:
    ``RESUME`` runs the stock extend).
    """
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    extend_input = batch.spec_info
    if batch.forward_mode.is_idle() or type(extend_input).__name__ != "EagleDraftExtendInput":
        return None
    rows = int(extend_input.input_ids.shape[0])
    hidden = extend_input.hidden_states
    accepted = extend_input.num_accept_tokens_cpu
    if (
        not writer.fits(rows, hidden, rows, batch.out_cache_loc.shape[0])
        or len(accepted) != rows
        or sum(accepted) != rows
    ):
        return None  # (sum: one accepted token per request, as a one-node tree gives)
    saved = (batch.seq_lens, batch.seq_lens_cpu, batch.req_pool_indices, batch.return_logprob)
    extend_input.num_tokens_per_req = worker.speculative_num_steps + 1
    extend_input.num_tokens_for_logprob_per_req = 1
    extend_input.prepare_extend_after_decode(batch, speculative_num_steps=worker.speculative_num_steps)
    rows_in = types.SimpleNamespace(
        forward_mode=batch.forward_mode, seq_lens=extend_input.positions, out_cache_loc=batch.out_cache_loc
    )
    verified = types.SimpleNamespace(
        next_token_ids=batch.input_ids,
        logits_output=types.SimpleNamespace(hidden_states=hidden),
        next_draft_input=types.SimpleNamespace(),
    )
    written = writer.write(rows_in, verified)
    batch.seq_lens, batch.seq_lens_cpu, batch.req_pool_indices, batch.return_logprob = saved
    if not written:
        return None  # the stock function prepares again from the restored batch
    stand_in = verified.next_draft_input
    return next_input_cls(
        bonus_tokens=extend_input.bonus_tokens,
        hidden_states=stand_in.hidden_states,
        topk_p=stand_in.topk_p,
        topk_index=stand_in.topk_index,
        capture_hidden_mode=CaptureHiddenMode.LAST,
    )


@functools.lru_cache(maxsize=None)
def tree_field_prefix(verify_input_cls: Any) -> str:
    """``retrieve_`` from 0.5.11, ``retrive_`` before (``EagleVerifyInput``'s tree fields)."""
    names = {f.name for f in dataclasses.fields(verify_input_cls)}
    return "retrieve_" if "retrieve_index" in names else "retrive_"


class TreeIndices:
    """Views of cached ``(bs, 1)`` tensors for one-node trees: request i's node is token i; no
    node has a child. The verify kernels only read them."""

    def __init__(self) -> None:
        self._cache: Optional[Tuple[Any, Any]] = None

    def __call__(self, bs: int, device: Any) -> Tuple[Any, Any]:
        import torch

        cached = self._cache
        if cached is None or cached[0].shape[0] < bs or cached[0].device != device:
            size = max(bs, 2 * cached[0].shape[0] if cached is not None else 256)
            cached = (
                torch.arange(size, dtype=torch.int64, device=device).view(size, 1),
                torch.full((size, 1), -1, dtype=torch.int64, device=device),
            )
            self._cache = cached
        return cached[0][:bs], cached[1][:bs]


def trivial_tree_fields(
    prefix: str,
    *,
    draft_token: Any,
    custom_mask: Any,
    positions: Any,
    root_index: Any,
    no_child: Any,
    capture_hidden_mode: Any,
    seq_lens_sum: int,
    seq_lens_cpu: Any,
) -> Dict[str, Any]:
    """``EagleVerifyInput`` keyword arguments for a one-node tree (verify with 0 steps, 1 token)."""
    return {
        "draft_token": draft_token,
        "custom_mask": custom_mask,
        "positions": positions,
        prefix + "index": root_index,
        prefix + "next_token": no_child,
        prefix + "next_sibling": no_child,
        prefix + "cum_len": None,
        "spec_steps": 0,
        "topk": 1,
        "draft_token_num": 1,
        "capture_hidden_mode": capture_hidden_mode,
        "seq_lens_sum": seq_lens_sum,
        "seq_lens_cpu": seq_lens_cpu,
    }


def _evict_sliding_window(batch: Any) -> None:
    """The sliding-window eviction the draft preprocessing does first."""
    if hasattr(batch, "maybe_evict_swa"):  # 0.5.8+
        batch.maybe_evict_swa()
        return
    tree_cache = batch.tree_cache
    if type(tree_cache).__name__ == "SWAChunkCache":  # 0.5.7 spelled it out in the worker
        for req in batch.reqs:
            tree_cache.evict_swa(req, req.seqlen - 1)
