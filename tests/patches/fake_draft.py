"""A pure-Python draft side for the runtime tests, with SGLang's call structure.

``DraftWorker.draft_extend`` is the stock draft extend after a decode (v1's
``forward_draft_extend_after_decode``, v2's ``_draft_extend_for_decode``): it replays
``cuda_graph_runner_for_draft_extend`` when there is one, else calls the draft model runner,
whose ``forward`` replays its own prefill / piecewise graph or calls ``model.forward(input_ids,
positions, forward_batch)``. The model (named ``LlamaForCausalLMEagle3``) embeds, and each layer
computes K/V from (token, position, target hidden state) and calls its ``RadixAttention``, which
calls the attention backend; the backend first writes the K/V with the pool's ``set_kv_buffer``,
then runs "attention"; the layer then runs "mlp", the model "lm_head". Every stage is logged,
so a test sees how far a forward got. A replayed graph computes everything, but never through
the model's Python ``forward`` (as a CUDA graph does). ``EAGLEDraftExtendCudaGraphRunner(worker)``
is made as the release's is: it captures by calling ``model.forward`` once, and a replay runs only
the stages that capture ran (a capture through ``DraftKV``'s stand-in: up to the KV write).

No torch: tensors are ``Rows`` (a list with ``shape`` and ``device``). ``install_fake_torch``
puts the two modules ``DraftKV.placeholder`` imports into ``sys.modules``.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

DEVICE = "cuda:0"
HIDDEN = 8
SPEC_HIDDEN = 24
VOCAB = 32


@dataclass
class Rows:
    """A 1-D tensor as a list: what the draft stack reads of one (shape, device, the values)."""

    values: list[Any]
    device: str = DEVICE

    @property
    def shape(self) -> tuple[int]:
        return (len(self.values),)


@dataclass
class Zeros:
    """What the fake ``torch.zeros`` returns; a slice of rows is one too, that knows what it was cut from."""

    shape: tuple[int, ...]
    dtype: Any
    device: Any
    of: Any = field(default=None, compare=False, repr=False)

    def __getitem__(self, rows: slice) -> Zeros:
        return Zeros(
            (len(range(*rows.indices(self.shape[0]))), *self.shape[1:]), self.dtype, self.device, self.of or self
        )


@dataclass
class EagleDraftInput:
    """0.5.12's next-draft input (v1's and v2's), as far as the fallbacks and the lean step set it."""

    bonus_tokens: Any = None
    hidden_states: Any = None
    topk_p: Any = None
    topk_index: Any = None
    capture_hidden_mode: Any = None
    new_seq_lens: Any = None  # v2's early fence: the lengths after the verify, and its event
    verify_done: Any = None


@dataclass
class LogitsProcessorOutput:
    """SGLang's, as far as the draft extend reads it (its other fields have defaults)."""

    next_token_logits: Any
    hidden_states: Any = None
    next_token_logprobs: Any = None


def install_fake_torch(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """``torch`` (``zeros``, ``float32``) and ``sglang.srt.layers.logits_processor`` in ``sys.modules``.

    An existing fake ``torch`` (e.g. one with ``get_device_module``) is extended, not replaced.
    """
    torch = sys.modules.get("torch")
    if not isinstance(torch, types.ModuleType):
        torch = types.ModuleType("torch")
        monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(torch, "float32", "torch.float32", raising=False)
    monkeypatch.setattr(torch, "bfloat16", "torch.bfloat16", raising=False)
    monkeypatch.setattr(
        torch, "zeros", lambda shape, dtype=None, device=None: Zeros(tuple(shape), dtype, device), raising=False
    )
    for name in ("sglang", "sglang.srt", "sglang.srt.layers"):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = []
            monkeypatch.setitem(sys.modules, name, package)
    logits = types.ModuleType("sglang.srt.layers.logits_processor")
    logits.LogitsProcessorOutput = LogitsProcessorOutput  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, logits.__name__, logits)
    return torch


def kv_of(token: int, position: int, hidden: int, layer_id: int = 0) -> tuple[int, int]:
    """The K and V a draft layer writes for one token: a function of that position's inputs alone."""
    k = (token * 1009 + position * 31 + hidden * 7 + layer_id) % 65521
    return k, (k * 17 + 3) % 65521


class Module:
    """``torch.nn.Module`` as far as ``kv_only_unsupported`` looks: ``modules()`` walks the children."""

    def children(self) -> Iterator[Module]:
        for value in vars(self).values():
            if isinstance(value, Module):
                yield value
            elif isinstance(value, list):
                yield from (v for v in value if isinstance(v, Module))

    def modules(self) -> Iterator[Module]:
        yield self
        for child in self.children():
            yield from child.modules()


class RadixAttention(Module):
    def __init__(self, layer_id: int) -> None:
        self.layer_id = layer_id
        self.k_scale = self.v_scale = None

    def __call__(self, q: Any, k: Any, v: Any, forward_batch: Any, save_kv_cache: bool = True) -> Any:
        return forward_batch.attn_backend.forward(q, k, v, self, forward_batch, save_kv_cache)


class LlamaDecoderLayer(Module):
    """The EAGLE-3 midlayer: K/V projections (and rope) of the inputs, attention, MLP."""

    def __init__(self, layer_id: int, log: list[str]) -> None:
        self.layer_id = layer_id
        self.attn = RadixAttention(layer_id)
        self.log = log

    def __call__(self, positions: Rows, input_ids: Rows, hidden: list[int], forward_batch: Any) -> list[int]:
        self.log.append(f"qkv {self.layer_id}")
        kv = [kv_of(t, p, h, self.layer_id) for t, p, h in zip(input_ids.values, positions.values, hidden)]
        out = self.attn(list(hidden), [k for k, _ in kv], [v for _, v in kv], forward_batch)
        self.log.append(f"mlp {self.layer_id}")
        return [x + 1 for x in out]


class LlamaForCausalLMEagle3(Module):
    """Named like the one-layer EAGLE-3 head whose K/V depend on their position's inputs only."""

    def __init__(self, log: list[str], layers: int = 1) -> None:
        self.layers = [LlamaDecoderLayer(i, log) for i in range(layers)]
        self.log = log

    def forward(self, input_ids: Rows, positions: Rows, forward_batch: Any) -> LogitsProcessorOutput:
        self.log.append("embed")
        hidden = list(forward_batch.spec_info.hidden_states)
        for layer in self.layers:
            hidden = layer(positions, input_ids, hidden, forward_batch)
        self.log.append("lm_head")
        rows = input_ids.shape[0]
        return LogitsProcessorOutput(next_token_logits=("logits", rows, VOCAB), hidden_states=("hidden", rows, hidden))


class LlamaForCausalLMEagle(LlamaForCausalLMEagle3):
    """A draft class the KV-only extend does not know (EAGLE-1/2)."""


class MHATokenToKVPool:
    """The draft KV pool: ``(layer_id, loc) -> (k, v)``."""

    def __init__(self, log: list[str]) -> None:
        self.kv: dict[tuple[int, int], tuple[int, int]] = {}
        self.log = log

    def set_kv_buffer(
        self, layer: Any, loc: Rows, cache_k: list[int], cache_v: list[int], k_scale: Any = None, v_scale: Any = None
    ) -> None:
        self.log.append("set_kv_buffer")
        self.store(layer.layer_id, loc, cache_k, cache_v)

    def store(self, layer_id: int, loc: Rows, cache_k: list[int], cache_v: list[int]) -> None:
        for slot, k, v in zip(loc.values, cache_k, cache_v):
            self.kv[(layer_id, slot)] = (k, v)


class TritonAttnBackend:
    """Writes the K/V through the pool, then attends. ``pool_from``: ``forward_batch`` (up to 0.5.16) or
    ``self`` (0.5.17+ keep the pool on the backend); both are the draft runner's pool object."""

    def __init__(self, pool: MHATokenToKVPool, log: list[str], pool_from: str = "forward_batch") -> None:
        self.token_to_kv_pool = pool
        self.pool_from = pool_from
        self.log = log
        self.cuda_graph_buffers: object | None = None
        self.cuda_graph_state_inits = 0

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """A graph runner calls it when it is built: a new set of the buffers its graphs read their metadata from."""
        self.cuda_graph_buffers = object()
        self.cuda_graph_state_inits += 1

    def forward(
        self, q: list[int], k: list[int], v: list[int], layer: Any, forward_batch: Any, save_kv_cache: bool = True
    ) -> list[int]:
        if save_kv_cache:
            self.write(layer, forward_batch, k, v)
        self.log.append("attention")
        return [a + b for a, b in zip(q, k)]

    def write(self, layer: Any, forward_batch: Any, k: list[int], v: list[int]) -> None:
        pool = forward_batch.token_to_kv_pool if self.pool_from == "forward_batch" else self.token_to_kv_pool
        pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v, layer.k_scale, layer.v_scale)


class FusedWriteBackend(TritonAttnBackend):
    """Writes the K/V in its own kernel, never through ``set_kv_buffer``."""

    def write(self, layer: Any, forward_batch: Any, k: list[int], v: list[int]) -> None:
        self.log.append("fused kv write")
        forward_batch.token_to_kv_pool.store(layer.layer_id, forward_batch.out_cache_loc, k, v)


class PreboundWriteBackend(TritonAttnBackend):
    """Took the pool's bound ``set_kv_buffer`` once, at start-up: a shadow on the pool cannot reach it."""

    def __init__(self, pool: MHATokenToKVPool, log: list[str]) -> None:
        super().__init__(pool, log)
        self._set_kv_buffer = pool.set_kv_buffer

    def write(self, layer: Any, forward_batch: Any, k: list[int], v: list[int]) -> None:
        self._set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)


class LazyBoundBackend(TritonAttnBackend):
    """Keeps the ``set_kv_buffer`` it finds at its first write: inside a ``kv_only`` window, the stand-in's."""

    def __init__(self, pool: MHATokenToKVPool, log: list[str]) -> None:
        super().__init__(pool, log)
        self._set_kv_buffer: Any = None

    def write(self, layer: Any, forward_batch: Any, k: list[int], v: list[int]) -> None:
        if self._set_kv_buffer is None:
            self._set_kv_buffer = forward_batch.token_to_kv_pool.set_kv_buffer
        self._set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)


class GraphRunner:
    """A captured graph: replay runs every captured kernel, but not the model's Python ``forward``."""

    def __init__(self, name: str, model: LlamaForCausalLMEagle3, log: list[str]) -> None:
        self.name, self.model, self.log = name, model, log

    def can_run(self, forward_batch: Any) -> bool:
        return True

    def replay(self, forward_batch: Any) -> LogitsProcessorOutput:
        self.log.append(f"{self.name} replay")
        return type(self.model).forward(self.model, forward_batch.input_ids, forward_batch.positions, forward_batch)


class DraftRunner:
    """The draft ``ModelRunner``: ``forward`` replays its prefill graph if it has one, else runs the model."""

    def __init__(
        self,
        model: LlamaForCausalLMEagle3,
        pool: Any,
        backend: Any,
        log: list[str],
        spec_hidden_size: int | None = SPEC_HIDDEN,
    ) -> None:
        self.model = model
        self.token_to_kv_pool = pool
        self.attn_backend = backend
        self.model_config = SimpleNamespace(
            hidden_size=HIDDEN, spec_hidden_size=spec_hidden_size, dtype="torch.bfloat16"
        )
        self.log = log

    def forward(self, forward_batch: Any) -> LogitsProcessorOutput:
        for name in ("prefill_cuda_graph_runner", "piecewise_cuda_graph_runner"):
            graph = getattr(self, name, None)
            if graph is not None and graph.can_run(forward_batch):
                return graph.replay(forward_batch)
        return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)


@dataclass
class Extend:
    """One draft extend's inputs: a token per request at its position, with the target's hidden state."""

    tokens: list[int]
    positions: list[int]
    slots: list[int]
    hidden: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.hidden = self.hidden or [t * 3 + p for t, p in zip(self.tokens, self.positions)]


class DraftWorker:
    """The owner of the draft-extend graph and the draft runner (v1's ``EAGLEWorker``, v2's ``EagleDraftWorker``)."""

    def __init__(self, runner: DraftRunner, log: list[str], graph: bool = True) -> None:
        self.draft_runner = runner  # v2
        self.log = log
        self.cuda_graph_runner_for_draft_extend = (
            GraphRunner("draft extend graph", runner.model, log) if graph else None
        )
        self.outputs: list[Any] = []
        self.seen_inside: list[dict[str, Any]] = []  # what each extend saw of the graph attributes

    @property
    def draft_model_runner(self) -> DraftRunner:  # v1
        return self.draft_runner

    def forward_batch(self, extend: Extend) -> SimpleNamespace:
        runner = self.draft_runner
        return SimpleNamespace(
            forward_mode="DRAFT_EXTEND",
            input_ids=Rows(list(extend.tokens)),
            positions=Rows(list(extend.positions)),
            out_cache_loc=Rows(list(extend.slots)),
            spec_info=SimpleNamespace(hidden_states=list(extend.hidden)),
            attn_backend=runner.attn_backend,
            token_to_kv_pool=runner.token_to_kv_pool,
        )

    def draft_extend(self, extend: Extend) -> Any:
        """The stock draft extend: graph if it can, else eager; then top-k over the logits."""
        self.seen_inside.append(graph_attributes(self))
        forward_batch = self.forward_batch(extend)
        graph = self.cuda_graph_runner_for_draft_extend
        if graph is not None and graph.can_run(forward_batch):
            out = graph.replay(forward_batch)
        else:
            out = self.draft_runner.forward(forward_batch)
        rows = out.next_token_logits[1] if isinstance(out.next_token_logits, tuple) else out.next_token_logits.shape[0]
        assert rows == len(extend.tokens), "the stock code reads one row of logits per request"
        self.log.append("topk")
        self.outputs.append(out)
        return out

    _draft_extend_for_decode = draft_extend  # the v2 name

    def _draft_extend_for_prefill(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        """v2's prefill extend as the fallback sees it (0.5.4 - 0.5.13): one eager forward over every
        prompt token (mode EXTEND), then top-k over its logits: one row per request, as the logits
        processor keeps each request's last token (the fake model returns one per token on its own)."""
        prompt = batch.prompt
        forward_batch = SimpleNamespace(
            forward_mode=batch.forward_mode,
            batch_size=batch.batch_size,
            input_ids=Rows(list(prompt.tokens)),
            positions=Rows(list(prompt.positions)),
            out_cache_loc=Rows(list(prompt.slots)),
            spec_info=SimpleNamespace(hidden_states=list(prompt.hidden)),
            attn_backend=self.draft_runner.attn_backend,
            token_to_kv_pool=self.draft_runner.token_to_kv_pool,
        )
        out = self.draft_runner.forward(forward_batch)
        self.log.append("topk")
        self.outputs.append(out)
        return out


GRAPH_ATTRIBUTES = (
    "cuda_graph_runner_for_draft_extend",
    "runner.prefill_cuda_graph_runner",
    "runner.piecewise_cuda_graph_runner",
)


def graph_attributes(worker: DraftWorker) -> dict[str, Any]:
    """The graph runners ``kv_only`` sets aside, ``missing`` where the attribute does not exist."""
    out = {}
    for name in GRAPH_ATTRIBUTES:
        owner, attr = (worker.draft_runner, name[len("runner.") :]) if name.startswith("runner.") else (worker, name)
        out[name] = getattr(owner, attr, "missing")
    return out


@dataclass
class DraftStack:
    log: list[str]
    model: LlamaForCausalLMEagle3
    pool: MHATokenToKVPool
    backend: TritonAttnBackend
    runner: DraftRunner
    worker: DraftWorker

    def extend(self, extend: Extend | None = None) -> Any:
        return self.worker.draft_extend(extend or EXTEND)

    def clear(self) -> None:
        self.log.clear()


EXTEND = Extend(tokens=[11, 12, 13], positions=[40, 41, 57], slots=[900, 901, 902])
CAPTURE = Extend(tokens=[0, 0, 0], positions=[0, 0, 0], slots=[0, 0, 0])  # a capture's static batch: padding slot 0


class EAGLEDraftExtendCudaGraphRunner:
    """The release's draft-extend graph runner, made as ``EAGLEDraftExtendCudaGraphRunner(worker)``.

    Its constructor takes the worker's ``draft_extend_attn_backend`` (the draft runner's backend
    where the worker has none) and has it allocate its CUDA-graph buffers (``init_cuda_graph_state``);
    then it captures: it calls the draft model's ``forward`` on a static batch (``CAPTURE``), as the
    release's ``run_once`` calls ``self.model_runner.model.forward``, and keeps the stages that ran as
    the graph's kernels and the output as its output buffers. A replay reads the backend's buffers it
    was captured on (it fails if the backend holds others: nobody refills them), runs the kernels on
    the replayed batch (the K/V write straight into the pool's memory, as a kernel does) and returns
    the captured buffers, without calling ``forward``. Captured for one batch shape: ``CAPTURE``'s
    (3 tokens). 0.5.11+ keep the backend on the runner (``draft_extend_attn_backend``), earlier
    releases only use the worker's (``KEEPS_BACKEND``). What the constructor saw of the worker
    (steps, backend) is kept for the tests.
    """

    name = "draft extend graph"
    KEEPS_BACKEND = True

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.model_runner = worker.draft_runner
        self.log: list[str] = worker.log
        self.backend = getattr(worker, "draft_extend_attn_backend", None) or self.model_runner.attn_backend
        if self.KEEPS_BACKEND:
            self.draft_extend_attn_backend = self.backend
        self.runner_backend = self.model_runner.attn_backend
        self.steps = getattr(worker, "speculative_num_steps", None)
        self.backend.init_cuda_graph_state(len(CAPTURE.tokens), len(CAPTURE.tokens))
        self.buffers = self.backend.cuda_graph_buffers
        static = worker.forward_batch(CAPTURE)
        start = len(self.log)
        self.output = self.model_runner.model.forward(static.input_ids, static.positions, static)
        self.kernels = self.log[start:]

    def can_run(self, forward_batch: Any) -> bool:
        return bool(forward_batch.input_ids.shape[0] == len(CAPTURE.tokens))

    def replay(self, forward_batch: Any) -> Any:
        assert self.backend.cuda_graph_buffers is self.buffers, f"{self.name} replays on buffers nobody refills"
        self.log.append(f"{self.name} replay")
        self.log.extend(self.kernels)
        if "set_kv_buffer" in self.kernels:
            assert len(self.model_runner.model.layers) == 1, "the fake replays one-layer drafts"
            inputs = zip(
                forward_batch.input_ids.values, forward_batch.positions.values, forward_batch.spec_info.hidden_states
            )
            for slot, (t, p, h) in zip(forward_batch.out_cache_loc.values, inputs):
                forward_batch.token_to_kv_pool.kv[(0, slot)] = kv_of(t, p, h)
        return self.output


class EAGLEDraftExtendCudaGraphRunnerUpTo0510(EAGLEDraftExtendCudaGraphRunner):
    """0.4.10 - 0.5.10's: the backend is the worker's, not kept on the runner."""

    KEEPS_BACKEND = False


def draft_stack(
    *,
    model_class: type[LlamaForCausalLMEagle3] = LlamaForCausalLMEagle3,
    layers: int = 1,
    backend: str = "triton",
    graph: bool = True,
    runner_graphs: tuple[str, ...] = ("piecewise_cuda_graph_runner",),
    spec_hidden_size: int | None = SPEC_HIDDEN,
) -> DraftStack:
    """A draft worker, runner, model, pool and backend. ``backend``: ``triton``, ``triton-own-pool``
    (0.5.17+), ``fused``, ``prebound`` or ``lazy``; ``runner_graphs``: the graph attributes the runner has (live)."""
    log: list[str] = []
    model = model_class(log, layers)
    pool = MHATokenToKVPool(log)
    backends = {
        "triton": lambda: TritonAttnBackend(pool, log),
        "triton-own-pool": lambda: TritonAttnBackend(pool, log, pool_from="self"),
        "fused": lambda: FusedWriteBackend(pool, log),
        "prebound": lambda: PreboundWriteBackend(pool, log),
        "lazy": lambda: LazyBoundBackend(pool, log),
    }
    runner = DraftRunner(model, pool, backends[backend](), log, spec_hidden_size)
    for name in runner_graphs:
        setattr(runner, name, GraphRunner(name.replace("_cuda_graph_runner", " graph"), model, log))
    return DraftStack(log, model, pool, runner.attn_backend, runner, DraftWorker(runner, log, graph))


def full_forward_kv(extend: Extend = EXTEND, layers: int = 1) -> dict[tuple[int, int], tuple[int, int]]:
    """The K/V a full eager forward of ``extend`` writes, from a fresh stack without graphs."""
    stack = draft_stack(layers=layers, graph=False, runner_graphs=())
    stack.extend(extend)
    assert "lm_head" in stack.log
    return dict(stack.pool.kv)
