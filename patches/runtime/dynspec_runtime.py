"""dynspec runtime: switch EAGLE / EAGLE-3 speculation off while the decode batch is large.

Installed by dynspec as ``sglang/srt/speculative/dynspec_runtime.py`` and called from the hooks
it adds to ``speculative/eagle_worker.py`` (the v1 ``EAGLEWorker``, non-overlap scheduler).
Nothing here runs unless ``--speculative-disable-batch-size`` is set.

How a fallback iteration works. It verifies a one-node tree whose root is the pending bonus
token, through the stock ``verify()`` and draft-extend, against a second target attention
backend and a TARGET_VERIFY CUDA graph captured for one token per request. To the scheduler,
the KV allocator, grammar, logprobs and the draft model this is a speculative iteration in
which every draft was rejected, so the state it leaves behind is one the speculative path can
resume from at once. Sending a plain DECODE batch through the target instead crashes: the
target's CUDA graphs and attention backend are built for ``speculative_num_draft_tokens``
tokens per request and nothing checks the mode before replaying them.

The decision uses the decode batch size only, so every tensor-parallel rank decides the same.
Torch and SGLang are imported inside functions: the controller runs anywhere.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import logging
import os
import time
from typing import Any, Callable, List, Optional, Tuple

logger = logging.getLogger(__name__)

SWITCH_LOG = "dynspec: speculation {state} at batch size {batch_size} (off above {off}, on at or below {on})"

# The flag every refusal names.
_FLAG = "--speculative-disable-batch-size"


class SwitchController:
    """Decide, once per decode iteration, whether the iteration speculates.

    Off when the batch has more than ``disable_above`` requests, back on when it has at most
    ``enable_at_or_below``; a switch is allowed no sooner than ``min_steps`` iterations after
    the previous one. The first switch may come at once. Each switch logs one INFO line.
    """

    def __init__(
        self,
        disable_above: int,
        enable_at_or_below: Optional[int] = None,
        min_steps: int = 8,
        *,
        log: bool = True,
        metrics: Optional["DynspecMetrics"] = None,
    ) -> None:
        self.disable_above = disable_above
        self.enable_at_or_below = disable_above if enable_at_or_below is None else enable_at_or_below
        if self.enable_at_or_below > self.disable_above:
            raise ValueError(
                f"--speculative-enable-batch-size ({self.enable_at_or_below}) must not exceed "
                f"{_FLAG} ({self.disable_above})"
            )
        self.min_steps = min_steps
        self.log = log
        self.metrics = metrics
        self.speculating = True
        self.iterations_since_switch = min_steps
        self.spec_iterations = 0
        self.fallback_iterations = 0
        self.switches = 0

    def speculate(self, batch_size: int) -> bool:
        """Count one decode iteration of ``batch_size`` requests; True if it should speculate."""
        if self.iterations_since_switch >= self.min_steps:
            if self.speculating and batch_size > self.disable_above:
                self._switch(False, batch_size)
            elif not self.speculating and batch_size <= self.enable_at_or_below:
                self._switch(True, batch_size)
        self.iterations_since_switch += 1
        if self.speculating:
            self.spec_iterations += 1
        else:
            self.fallback_iterations += 1
        if self.metrics is not None:
            self.metrics.iteration(self.speculating)
        return self.speculating

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
    _counters: Optional[dict] = None  # one set per process: prometheus refuses duplicate names

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self._bound: Optional[dict] = None

    def iteration(self, speculating: bool) -> None:
        bound = self._counters_for_model()
        if bound:
            bound["spec" if speculating else "fallback"].inc()

    def switch(self) -> None:
        bound = self._counters_for_model()
        if bound:
            bound["switches"].inc()

    def _counters_for_model(self) -> dict:
        if self._bound is None:
            counters = DynspecMetrics._create_counters()
            self._bound = {key: c.labels(model_name=self.model_name) for key, c in counters.items()}
        return self._bound

    @classmethod
    def _create_counters(cls) -> dict:
        if cls._counters is None:
            try:
                from prometheus_client import Counter
            except ImportError:
                logger.warning("dynspec: prometheus_client is not installed; dynspec metrics are off")
                cls._counters = {}
            else:
                cls._counters = {
                    key: Counter(name, doc, labelnames=["model_name"]) for key, name, doc in cls.NAMES
                }
        return cls._counters


def unsupported_reason(server_args: Any) -> Optional[str]:
    """Why the fallback cannot run with these server arguments, naming the flag; None if it can."""
    algorithm = (getattr(server_args, "speculative_algorithm", None) or "").upper()
    if algorithm not in ("EAGLE", "EAGLE3"):
        return f"{_FLAG} works with --speculative-algorithm EAGLE or EAGLE3, not {algorithm or 'none'}"
    checks = (
        ("--speculative-eagle-topk > 1", (getattr(server_args, "speculative_eagle_topk", 1) or 1) > 1),
        ("--enable-dp-attention", getattr(server_args, "enable_dp_attention", False)),
        ("--pp-size > 1", (getattr(server_args, "pp_size", 1) or 1) > 1),
        ("--enable-two-batch-overlap", getattr(server_args, "enable_two_batch_overlap", False)),
        ("--enable-pdmux", getattr(server_args, "enable_pdmux", False)),
        ("--enable-multi-layer-eagle", getattr(server_args, "enable_multi_layer_eagle", False)),
        ("--speculative-adaptive", getattr(server_args, "speculative_adaptive", False)),
    )
    for flag, present in checks:
        if present:
            return f"{_FLAG} does not support {flag}"
    return None


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
    disable_above = getattr(args, "speculative_disable_batch_size", None)
    if disable_above is None:
        return None
    reason = unsupported_reason(args)
    if reason is not None:
        raise ValueError(reason)
    enable_at_or_below = getattr(args, "speculative_enable_batch_size", None)
    if enable_at_or_below is None:
        enable_at_or_below = disable_above
    min_steps = getattr(args, "speculative_switch_min_steps", 8)
    rank0 = getattr(worker, "tp_rank", 0) == 0

    tic = time.perf_counter()
    target = SingleTokenTarget.build(worker.target_worker.model_runner, enable_at_or_below)
    metrics = None
    if rank0 and getattr(args, "enable_metrics", False):
        metrics = DynspecMetrics(getattr(args, "served_model_name", None) or str(args.model_path))
    controller = SwitchController(disable_above, enable_at_or_below, min_steps, log=rank0, metrics=metrics)
    if rank0:
        logger.info(
            f"dynspec: fallback ready in {time.perf_counter() - tic:.2f} s: speculation off above "
            f"{disable_above} requests, on at or below {enable_at_or_below}, at least {min_steps} "
            f"iterations between switches; one-token CUDA graphs for batch sizes {target.capture_bs}"
        )
    return DynspecFallback(controller, target)


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

# Backends whose decode path dynspec has run a one-token verify through on a GPU (``dynspec
# proof``). ``DYNSPEC_ONE_TOKEN_ATTENTION=decode`` opts any other backend in, ``=verify`` opts out.
DECODE_PROVEN_BACKENDS = ("TritonAttnBackend",)


def one_token_attention_mode(backend: Any) -> str:
    """``decode`` or ``verify``: how the one-token target backend computes attention."""
    setting = os.environ.get(ATTENTION_ENV, "auto").strip().lower() or "auto"
    if setting in ("decode", "verify"):
        return setting
    if setting != "auto":
        raise ValueError(f"{ATTENTION_ENV} must be auto, decode or verify, not {setting!r}")
    return "decode" if type(backend).__name__ in DECODE_PROVEN_BACKENDS else "verify"


def one_token_attention(backend: Any) -> Any:
    """The one-token target backend, set to serve TARGET_VERIFY as a DECODE when that is on."""
    if one_token_attention_mode(backend) == "decode":
        return serve_verify_as_decode(backend)
    return backend


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
    backend.__class__ = type(base)(base.__name__, (base,), namespace)
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
        call = inspect.signature(method).bind(*args, **kwargs)
        _decode_arguments(call.arguments, self._plus_one_persistent)
        return method(*call.args, **call.kwargs)

    def init_forward_metadata_replay_cuda_graph(self, *args: Any, **kwargs: Any) -> Any:
        method = super(type(self), self).init_forward_metadata_replay_cuda_graph  # type: ignore[misc]
        call = inspect.signature(method).bind(*args, **kwargs)
        _decode_arguments(call.arguments, self._plus_one_persistent)
        return method(*call.args, **call.kwargs)

    def forward(self, q: Any, k: Any, v: Any, layer: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
        if forward_batch.forward_mode.is_target_verify():
            return self.forward_decode(q, k, v, layer, forward_batch, *args, **kwargs)  # type: ignore[attr-defined]
        return super(type(self), self).forward(q, k, v, layer, forward_batch, *args, **kwargs)  # type: ignore[misc]

    @staticmethod
    def _plus_one_eager(seq_lens: Any) -> Any:
        return seq_lens + 1

    def _plus_one_persistent(self, seq_lens: Any) -> Any:
        """``seq_lens + 1`` in a buffer that outlives the call: backends keep views of it in graphs."""
        n = seq_lens.shape[0]
        buffer = self._dynspec_plus_one
        if buffer is None or buffer.shape[0] < n or buffer.dtype != seq_lens.dtype or buffer.device != seq_lens.device:
            # Graph runners capture the largest batch first; later, smaller batches reuse it.
            buffer = seq_lens.new_empty((max(n, 256),))
            self._dynspec_plus_one = buffer
        out = buffer[:n]
        out.copy_(seq_lens + 1)
        return out


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


def _decode_arguments(arguments: dict, plus_one: Callable[[Any], Any]) -> None:
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


class DynspecFallback:
    """Per-worker dynspec state, reached from the hooks in ``eagle_worker.py``."""

    def __init__(self, controller: SwitchController, target: SingleTokenTarget) -> None:
        self.controller = controller
        self.target = target
        self.in_fallback = False
        self._tree_indices = TreeIndices()

    def should_fall_back(self, batch: Any) -> bool:
        """Called at the top of the decode branch; counts the iteration unless re-entered."""
        if self.in_fallback or batch.forward_mode.is_idle():
            return False
        return not self.controller.speculate(batch.batch_size())

    def fall_back(self, worker: Any, batch: Any, entry: Callable[[Any], Any]) -> Any:
        """Run the stock decode branch once more with N=1 state; ``draft()`` then returns the trivial tree."""
        saved_steps = (worker.speculative_num_steps, worker.speculative_num_draft_tokens)
        previous = self.target.swap_in()
        worker.speculative_num_steps, worker.speculative_num_draft_tokens = 0, 1
        self.in_fallback = True
        try:
            return entry(batch)
        finally:
            self.in_fallback = False
            worker.speculative_num_steps, worker.speculative_num_draft_tokens = saved_steps
            self.target.swap_out(previous)

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
) -> dict:
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
