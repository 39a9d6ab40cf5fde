"""dynspec for the spec-v2 EAGLE worker (``EAGLEWorkerV2``, overlap scheduler), SGLang 0.5.4+.

Installed by dynspec as ``sglang/srt/speculative/dynspec_v2.py`` and called from the hooks it adds
to ``speculative/eagle_worker_v2.py``. Nothing here runs unless ``--speculative-disable-batch-size``
is set; the version-independent parts (switch controller, metrics, the one-token target state)
come from ``dynspec_runtime``, the flags' reading and the refusals from ``dynspec_settings``.

Two eras, one idea: while the decode batch is large, verify a one-node tree rooted at the pending
bonus token against target attention and CUDA graphs built for one token per request, then run the
draft extend for that one token so the draft KV stays in sync. To the scheduler, the future map,
the KV allocator, grammar and logprobs this is a speculative iteration in which every draft was
rejected, so speculation can resume at the next iteration with nothing to flush.

* 0.5.4 to 0.5.13 (``attach_fallback``): SGLang has no zero-step mode, so dynspec brings its own.
  A fallback iteration re-enters ``forward_batch_generation`` with the one-token target state, the
  step counts of the worker and of its draft worker (each holds a copy) set to 0 steps / 1 token,
  and the draft-extend CUDA graph (built for N tokens per request) put aside for the full extend
  (the KV-only twin, which works row by row, replays in its place while off); the hook in
  ``EagleDraftWorker.draft`` then returns the trivial tree instead of drafting. Everything is put
  back in ``finally``. Up to 0.5.11 the scheduler slices the *previous* iteration's
  ``next_token_ids`` with the worker's N (``_resolve_spec_overlap_token_ids``), so the one token
  per request is padded back to stride N; 0.5.12 carries the stride in the result.
* 0.5.14 to 0.5.23 (``attach_zero_step_policy``): SGLang has a zero-step mode (its adaptive
  ``SpecRuntimeState`` for ``speculative_num_steps=0`` and ``_build_trivial_verify_input``), but
  chooses it by an EMA of acceptance within batch-size buckets. dynspec keeps that machinery and
  replaces only the decision: ``ZeroStepPolicy`` stands in for ``AdaptiveController`` and switches
  between the configured steps and 0 with dynspec's thresholds, hysteresis and minimum dwell.

The decision uses the decode batch size only (``batch.seq_lens.shape[0]``, a CPU shape), so every
tensor-parallel rank decides the same without communicating. With ``auto`` (0.5.14+) the thresholds
come from ``dynspec_auto``, from rank 0's timings, handed to every rank at the same iterations. Torch and SGLang are imported inside
functions: everything else runs anywhere.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import logging
import os
import time
from collections import deque
from types import SimpleNamespace
from typing import Any, Callable, Deque, Dict, Iterator, List, Mapping, Optional, Tuple

# Relative: ``sglang.srt.speculative`` in a patched tree, ``patches.runtime`` in dynspec's own.
from .dynspec_settings import FLAG, Getter, Settings, auto_unavailable, read_settings, unsupported_reason

logger = logging.getLogger(__name__)

# -- reading settings ----------------------------------------------------------------------------


def read_setting(worker: Any, name: str, default: Any = None) -> Any:
    """A server setting as this release resolves it.

    From 0.5.17 speculative settings are read through ``get_spec()`` (the resolved values; from
    0.5.20 ``ServerArgs`` only keeps the raw input); before, they are attributes of the worker's
    ``server_args``.
    """
    try:
        from sglang.srt.runtime_context import get_spec
    except ImportError:
        get_spec = None
    if get_spec is not None:
        try:
            return getattr(get_spec(), name)
        except Exception:  # not a speculative setting, or no context in this process
            pass
    return getattr(worker.server_args, name, default)


def _getter(worker: Any) -> Getter:
    """``get`` for ``dynspec_settings``: this release's reading of a setting (``read_setting``)."""
    return lambda name, default: read_setting(worker, name, default)


def settings_of(worker: Any) -> Optional[Settings]:
    """dynspec's flags as this worker's release resolves them; None while the flag is unset."""
    return read_settings(_getter(worker))


def _refuse_bit_check() -> None:
    """``DYNSPEC_CHECK_KV_BITS`` is v1's for now: ignored here, it would make exact_kv's
    full-extend reference server run a KV-only extend."""
    if os.environ.get(KV_BITS_ENV, "").strip():
        raise ValueError(f"{KV_BITS_ENV} is built for v1 (--disable-overlap-schedule) only; unset it")


def _refuse_unsupported(worker: Any) -> None:
    reason = unsupported_reason(_getter(worker))
    if reason is not None:
        raise ValueError(reason)


def _tensor_parallel(worker: Any) -> bool:
    """More than one tensor-parallel rank (``--tp-size``)."""
    return (read_setting(worker, "tp_size", 1) or 1) > 1


def _tensor_parallel_group() -> Any:
    """SGLang's tensor-parallel group where it has more than one rank; None on one GPU or where none
    can be had (the group is made before the worker that asks)."""
    try:
        from sglang.srt.distributed import get_tp_group

        group = get_tp_group()
    except (ImportError, AssertionError, AttributeError):
        return None
    return group if (getattr(group, "world_size", 1) or 1) > 1 else None


def _tp_rank(worker: Any) -> int:
    for owner in (worker, getattr(worker, "ps", None), getattr(worker, "_draft_worker", None)):
        rank = getattr(owner, "tp_rank", None)
        if isinstance(rank, int):
            return rank
    try:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_initialized() else 0
    except Exception:
        return 0


def _switch_controller(worker: Any, settings: Settings, rank0: bool) -> Any:
    from sglang.srt.speculative.dynspec_runtime import DynspecMetrics, SwitchController

    metrics = None
    if rank0 and read_setting(worker, "enable_metrics", False):
        name = read_setting(worker, "served_model_name") or str(read_setting(worker, "model_path"))
        metrics = DynspecMetrics(name)
    disable_above = settings.disable_above
    if not isinstance(disable_above, int):  # auto: its floor until AutoDriver sets the thresholds
        disable_above = settings.enable_at_or_below
    return SwitchController(disable_above, settings.enable_at_or_below, settings.min_steps, log=rank0, metrics=metrics)


def not_a_decode(batch: Any) -> bool:
    """A forward that is not a plain decode: a prefill, or a decode batch with an extend in it."""
    return not batch.forward_mode.is_decode() or bool(getattr(batch, "is_extend_in_batch", False))


def batch_size_of(batch: Any) -> int:
    """Requests in a decode batch: a CPU-side shape, identical on every tensor-parallel rank."""
    return int(batch.seq_lens.shape[0])


def admitted_to_decode(batch: Any) -> int:
    """Requests of a prefill batch that join the next decode batch: not a request whose prompt this
    chunk does not finish (chunked prefill). Read from the requests, which every tensor-parallel rank
    receives alike. A batch without them (0.5.4 - 0.5.5) counts none: its rows would include such a
    chunk, and the switch at admission is only a speed-up, which ``step`` makes at the next decode."""
    reqs = getattr(batch, "reqs", None)
    if reqs is None:
        return 0
    return sum(1 for req in reqs if _prompt_filled(req))


def _prompt_filled(req: Any) -> bool:
    fill = getattr(req, "fill_ids", None)  # up to 0.5.12; 0.5.13 keeps only its length
    filled = len(fill) if fill is not None else getattr(req, "fill_len", None)
    return filled is None or filled >= len(req.origin_input_ids) + len(req.output_ids)


# -- 0.5.4 to 0.5.13: dynspec's own fallback ---------------------------------------------------


def attach_fallback(worker: Any) -> Optional["V2Fallback"]:
    """Build the fallback at the end of ``EAGLEWorkerV2.__init__`` (0.5.4-0.5.13); None when off.

    The target's CUDA graphs already exist here (``ModelRunner`` captures them when it is built),
    so the one-token graphs are captured now, next to them.
    """
    settings = settings_of(worker)
    if settings is None:
        return None
    if settings.auto:
        raise auto_unavailable("on this release")
    _refuse_bit_check()
    from sglang.srt.speculative.dynspec_runtime import (
        DraftKV,
        DraftRecorder,
        SingleTokenTarget,
        capture_twin_of_stock_graph,
        describe_draft_kv,
        describe_one_token_attention,
    )

    _refuse_unsupported(worker)
    rank0 = _tp_rank(worker) == 0
    tic = time.perf_counter()
    controller = _switch_controller(worker, settings, rank0)
    # a default worked out (and said) only for auto: a mode the user set needs neither
    draft_kv = DraftKV.build(
        worker.draft_worker.draft_runner, log=rank0, auto=lambda: own_fallback_draft_kv_default(worker, rank0)
    )
    target = SingleTokenTarget.build(worker.target_worker.model_runner, controller.enable_at_or_below)
    # The stock runner is captured for the speculative width; the fallback's full extend (RESUME) runs
    # eagerly (_SavedSteps), but the KV-only twin computes row by row, so one token per request fits it.
    # After the target's graphs, as on v1 (capture_twin_of_stock_graph's callers).
    capture_twin_of_stock_graph(draft_kv, worker.draft_worker)
    if kv_batch_steps() > 1 and rank0:  # read here too, so that a bad value refuses to start on every release
        logger.info(f"dynspec: {KV_BATCH_ENV} applies to 0.5.14+ only; every fallback iteration writes its own rows")
    fallback = V2Fallback(controller, target, draft_kv, DraftRecorder.from_env(rank0))
    fallback.feed_twin_directly(worker, log=rank0)
    fallback.write_beside(worker, log=rank0)
    fallback.lean = FallbackLeanSample.install(worker.target_worker.model_runner, log=rank0)
    fallback.prefill_kv_only(
        worker.draft_worker, log=rank0, disaggregation=read_setting(worker, "disaggregation_mode", "null")
    )
    fallback.lean_step = V2LeanStep.build(worker, fallback, log=rank0)
    worker.draft_worker._dynspec = fallback
    if fallback.recorder is not None:
        fallback.recorder.watch_drafts(worker.draft_worker, lambda: fallback.in_fallback)
    if rank0:
        logger.info(
            f"dynspec: v2 fallback ready in {time.perf_counter() - tic:.2f} s: speculation off above "
            f"{controller.disable_above} requests, on at or below {controller.enable_at_or_below}, at least "
            f"{controller.min_steps} iterations between switches; one-token target CUDA graphs for batch "
            f"sizes {target.capture_bs or 'none (eager)'}; {describe_one_token_attention(target.attn_backend)}; "
            f"{describe_draft_kv(draft_kv)}"
        )
    return fallback


def own_fallback_draft_kv_default(worker: Any, log: bool) -> str:
    """``auto`` on dynspec's own fallback: ``kv-direct`` where the draft worker's stock draft-extend
    graph runner is one ``FallbackDirectWrite`` can feed (its KV-only twin is another instance of
    that class), else the eager ``kv``. Asked before the twin is captured: ``kv-graph`` alone has
    never run on this path, so a release the direct write cannot feed (0.5.4 - 0.5.10, a backend
    whose draft extend the release does not graph or the writer does not take) keeps the eager
    extend rather than capturing a graph nobody replays directly; so does tensor parallelism, with
    which no KV-only graph has run."""
    from sglang.srt.speculative.dynspec_runtime import (
        DRAFT_KV_DEFAULT_OWN_FALLBACK,
        DRAFT_KV_DEFAULT_OWN_FALLBACK_UNFED,
    )

    stock = getattr(worker.draft_worker, "cuda_graph_runner_for_draft_extend", None)
    if _tensor_parallel(worker):
        why_not: Optional[str] = "kv-direct has not run with tensor parallelism"
    elif stock is None:
        why_not = "the draft worker keeps no draft-extend CUDA graph"
    else:
        why_not = FallbackDirectWrite.unfit(stock, worker)
    if why_not is None:
        return str(DRAFT_KV_DEFAULT_OWN_FALLBACK)
    if log:
        logger.info(
            f"dynspec: {why_not}; by default the fallback writes the draft KV eagerly ({DRAFT_KV_DEFAULT_OWN_FALLBACK_UNFED})"
        )
    return str(DRAFT_KV_DEFAULT_OWN_FALLBACK_UNFED)


class _SavedSteps:
    """The step counts (the worker and its draft worker each hold a copy) and the draft-extend graph."""

    def __init__(self, worker: Any, draft: Any) -> None:
        self.worker = worker
        self.draft = draft
        self.values = (
            worker.speculative_num_steps,
            worker.speculative_num_draft_tokens,
            draft.speculative_num_steps,
            draft.speculative_num_draft_tokens,
            getattr(draft, "cuda_graph_runner_for_draft_extend", None),
        )

    def one_token(self) -> None:
        for owner in (self.worker, self.draft):
            owner.speculative_num_steps = 0
            owner.speculative_num_draft_tokens = 1
        # Its graphs hold N tokens per request, and its can_run() does not check the count.
        self.draft.cuda_graph_runner_for_draft_extend = None

    def restore(self) -> None:
        (
            self.worker.speculative_num_steps,
            self.worker.speculative_num_draft_tokens,
            self.draft.speculative_num_steps,
            self.draft.speculative_num_draft_tokens,
            self.draft.cuda_graph_runner_for_draft_extend,
        ) = self.values


class V2Fallback:
    """Per-worker dynspec state for 0.5.4-0.5.13, reached from the hooks in ``eagle_worker_v2.py``."""

    def __init__(self, controller: Any, target: Any, draft_kv: Any, recorder: Any = None) -> None:
        from sglang.srt.speculative.dynspec_runtime import TreeIndices

        self.controller = controller
        self.target = target  # dynspec_runtime.SingleTokenTarget
        self.draft_kv = draft_kv  # dynspec_runtime.DraftKV
        self.recorder = recorder  # dynspec_runtime.DraftRecorder, or None
        self.in_fallback = False
        self._step = controller.SPECULATE
        self._tree_indices = TreeIndices()
        self._batch: Any = None
        self._early_fence = early_fence_enabled()  # read once: a bad value refuses at start-up
        self._early_publish = early_fence_enabled(proven=False)  # 0.5.13's callback (publish_early)
        self.lean: Optional[FallbackLeanSample] = None  # the one-node tree's sample (attach_fallback)
        self.lean_step: Optional[V2LeanStep] = None  # on 0.5.12 unless DYNSPEC_LEAN_STEP=0 (attach_fallback)
        self.stock_extend: Optional[Callable[..., Any]] = None  # the draft worker's own, under feed_twin_directly's

    def should_fall_back(self, batch: Any) -> bool:
        """Called at the top of the decode branch; counts the iteration unless re-entered.

        Idle batches (data-parallel attention, refused at start-up) and batches without a draft
        input keep the stock path and are not counted.
        """
        if self.in_fallback or batch.forward_mode.is_idle() or batch.spec_info is None:
            return False
        self._step = self.controller.step(batch_size_of(batch))
        if self._step == self.controller.SPECULATE:
            return False
        self._batch = batch  # for fall_back, which the hook calls next
        return True

    def fall_back(self, worker: Any, run: Callable[[], Any]) -> Any:
        """Run the stock decode branch once more (``run``) with the one-token state swapped in.

        Its draft extend writes only the draft KV, except at ``RESUME``, where it is the stock one.
        """
        stride = worker.speculative_num_draft_tokens
        batch, self._batch = self._batch, None
        if self.recorder is not None and batch is not None:
            self.recorder.iteration(self._step, batch)
        fence = early_fence(batch) if batch is not None and self._early_fence else None
        kv_only = self._step == self.controller.FALL_BACK
        # Decided before anything is swapped: nothing that may raise runs outside the try below.
        lean = (
            self.lean_step
            if kv_only and batch is not None and self.lean_step is not None and self.lean_step.takes(batch)
            else None
        )
        draft_kv_only = (
            self.draft_kv.kv_only(worker.draft_worker) if kv_only and lean is None else contextlib.nullcontext()
        )
        saved = _SavedSteps(worker, worker.draft_worker)
        previous = self.target.swap_in()
        try:
            saved.one_token()
            self.in_fallback = True
            if lean is not None:
                result = lean.step(worker, batch, self, fence)
            else:
                with draft_kv_only:
                    result = run()
        finally:
            self.in_fallback = False
            saved.restore()
            self.target.swap_out(previous)
        if fence is not None:
            publish_early(result, *fence)
        if needs_stride_padding(result):
            result.next_token_ids = pad_to_stride(result.next_token_ids, stride)
        return result

    def feed_twin_directly(self, worker: Any, log: bool) -> None:
        """``kv-direct`` on 0.5.10 - 0.5.13: a fallback iteration's draft extend becomes a
        ``FallbackDirectWrite`` of the twin, where the twin allows it (else it stays kv-graph, said once)."""
        if not feed_directly(
            self.draft_kv, lambda twin: FallbackDirectWrite.build(twin, worker, self.draft_kv, log), log
        ):
            return
        draft_worker = worker.draft_worker
        stock = draft_worker._draft_extend_for_decode
        self.stock_extend = stock

        def draft_extend_for_decode(*args: Any, **kwargs: Any) -> Any:
            writer = self.draft_kv.direct  # None once given up
            # The release calls it as (batch, batch_result); RESUME and speculation run the stock one.
            fall_back = self.in_fallback and self._step == self.controller.FALL_BACK
            if fall_back and writer is not None and len(args) == 2 and writer.write(*args):
                return None
            return stock(*args, **kwargs)

        draft_worker._draft_extend_for_decode = draft_extend_for_decode

    def write_beside(self, worker: Any, log: bool) -> None:
        """``DYNSPEC_KV_STREAM`` (on unless set to 0 on 0.5.10 - 0.5.13; session 17 measured it on
        0.5.12): the direct write on a stream of its own (``write_beside``). With the lean sample, a
        fallback step at 64 requests went from 0.980 to 0.990 of a plain decode step in one call."""
        wanted = on_off_setting(KV_STREAM_ENV, True)  # read first: a bad value refuses to start
        direct = self.draft_kv.direct
        if wanted and isinstance(direct, FallbackDirectWrite):
            write_beside(worker, direct, log)

    def prefill_kv_only(self, draft_worker: Any, log: bool, disaggregation: Optional[str] = "null") -> None:
        """``DYNSPEC_PREFILL_KV`` (on unless set to 0; session 15 measured it on 0.5.12): while speculation is off, the
        draft model's prefill extend of newly admitted requests writes only their draft KV, eagerly
        (``DraftKV.kv_only``), as a fallback iteration's extend does. The draft K/V at a prompt position
        depend on that position's inputs alone; the top-k and hidden states the prefill leaves for the
        request's first draft are never read, since speculation comes back on only through ``RESUME``,
        whose full extend makes them for every request. A prefill that alone brings more than the
        threshold's requests switches speculation off first (``SwitchController.switch_off_at_admission``):
        the first wave of a burst is admitted while still speculating, and would otherwise pay the full
        draft prefill that plain decode never does. Session 12's logs put about 30 ms per admission of
        64 requests in the speculative server's prefill, which plain decode does not pay; with it, session
        15's mixed load took 0.993x and 1.006x the per-phase oracle on 0.5.12 (1.102x without). What it saves
        depends on the backend: Triton and FA3 write the KV before the attention, FlashInfer's ragged
        prefill after it (only o_proj, the MLP and the lm_head are saved there)."""
        # Only where the forward stops after the KV write: skip (the negative control) would leave
        # the prompts without draft KV.
        if not on_off_setting(PREFILL_KV_ENV, True) or not self.draft_kv.writes_kv_only:
            return
        if disaggregation not in (None, "null"):
            # A PD prefill server never decodes, so never resumes: it would hand the decode server
            # the placeholder top-k and hidden states of every request after its first large wave.
            if log:
                logger.info(
                    f"dynspec: the KV-only prefill ({PREFILL_KV_ENV}) is not used with PD disaggregation ({disaggregation})"
                )
            return
        stock = getattr(draft_worker, "_draft_extend_for_prefill", None)
        if stock is None:  # every release 0.5.4 - 0.5.13 has it (pinned in the tests); a patched tree may not
            if log:
                logger.info(
                    "dynspec: this draft worker has no _draft_extend_for_prefill; prefills write the full draft state"
                )
            return
        draft_kv = self.draft_kv
        lean = LeanKVPrefill.build(
            draft_worker, stock, log
        )  # on 0.5.12 unless DYNSPEC_LEAN_PREFILL / _STEP=0, else None
        kv_only_extend = stock if lean is None else lean.extend

        def draft_extend_for_prefill(batch: Any, *args: Any, **kwargs: Any) -> Any:
            if batch.forward_mode.is_idle() or not draft_kv.writes_kv_only:
                return stock(batch, *args, **kwargs)  # (writes_kv_only: not after the stand-in gave up)
            # A wave of requests arriving together at a speculating server (a closed loop's, a burst)
            # is where the draft prefill costs most: switched off first, it writes only their KV too.
            if self.controller.speculating and not self.controller.switch_off_at_admission(admitted_to_decode(batch)):
                return stock(batch, *args, **kwargs)
            with draft_kv.kv_only(draft_worker, counted=False):
                return kv_only_extend(batch, *args, **kwargs)

        draft_worker._draft_extend_for_prefill = draft_extend_for_prefill
        if log:
            logger.info(
                f"dynspec: while off, a prefill's draft extend writes only the draft KV ({PREFILL_KV_ENV}=0 turns it off)"
            )

    def publish_early(self, batch: Any, on_publish: Any) -> Any:
        """0.5.13: called by the hook before ``fall_back``; returns the callback the re-run gets.

        0.5.13 publishes the next ``seq_lens`` through ``on_publish`` after the verify, and the
        scheduler's next batch waits for that. A one-node tree accepts exactly its root, so they
        are ``seq_lens + 1`` before the forward; publishing them here and passing ``None`` on
        does what ``early_fence`` does for 0.5.4 - 0.5.12 and ``ZeroStepPolicy.publish_early``
        for 0.5.14+. Opt-in (``DYNSPEC_EARLY_FENCE=1``) until a GPU proof has run with it.
        """
        if on_publish is None or not self._early_publish:
            return on_publish
        on_publish(batch.seq_lens + 1)
        return None

    def trivial_verify_input(self, batch: Any, verify_input_cls: Any) -> Any:
        """What ``EagleDraftWorker.draft`` returns in a fallback iteration: a one-node tree.

        The root is the bonus token the previous verify produced; the target then verifies one
        token per request at position ``seq_lens`` (the slot ``prepare_for_decode`` reserved) and
        samples the next token from its logits, exactly as a plain decode would. Mirrors
        ``EAGLEWorkerV2._build_trivial_verify_input`` of SGLang 0.5.14+.
        """
        import torch
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.dynspec_runtime import tree_field_prefix, trivial_tree_fields

        spec_info = batch.spec_info
        bonus = getattr(spec_info, "bonus_tokens", None)  # 0.5.12 renamed verified_id
        if bonus is None:
            bonus = spec_info.verified_id
        seq_lens = batch.seq_lens
        bs = batch_size_of(batch)
        root_index, no_child = self._tree_indices(bs, seq_lens.device)
        fields = trivial_tree_fields(
            tree_field_prefix(verify_input_cls),
            # The speculative path concatenates int32 bonus tokens with int64 drafts.
            draft_token=bonus.to(torch.int64),
            custom_mask=self._custom_mask(batch, bs),
            positions=seq_lens.to(torch.int64, copy=True),
            root_index=root_index,
            no_child=no_child,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            seq_lens_sum=None,  # as the v2 draft() leaves them
            seq_lens_cpu=None,
        )
        verify_input = verify_input_cls(**fields)
        return verify_input if self.lean is None else self.lean.bind(verify_input)

    def _custom_mask(self, batch: Any, bs: int) -> Any:
        """All True: a node sees the whole prefix and itself, ``seq_len + 1`` entries per request.

        Sized exactly when the batch carries its length sum (always up to 0.5.12). Otherwise the
        one-token backend's own graph mask buffer (Triton; the draft only ever fills the live
        backend's), but only for batches its graphs cover: an eager verify of a larger batch can
        need more entries than the buffer holds.
        """
        import torch

        seq_lens_sum = getattr(batch, "seq_lens_sum", None)
        if seq_lens_sum is None and getattr(batch, "seq_lens_cpu", None) is not None:
            seq_lens_sum = int(batch.seq_lens_cpu.sum())
        backend = self.target.attn_backend
        if seq_lens_sum is None and self.target.capture_bs and bs <= max(self.target.capture_bs):
            buffers = getattr(backend, "get_verify_buffers_to_fill_after_draft", lambda: (None, None))()
            if buffers[0] is not None:
                return buffers[0].fill_(True)
        length = mask_length(bs, seq_lens_sum, getattr(backend, "max_context_len", None))
        if length is None:
            length = int(batch.seq_lens.sum().item()) + bs
        return torch.ones(length, dtype=torch.bool, device=batch.seq_lens.device)


EARLY_FENCE_ENV = "DYNSPEC_EARLY_FENCE"


def on_off_setting(env: str, default: bool) -> bool:
    """An on/off switch in the environment: 1 on, 0 off, unset ``default``; anything else refuses to start."""
    setting = os.environ.get(env, "").strip()
    if setting not in ("0", "1", ""):
        raise ValueError(f"{env} must be 0 or 1, not {setting!r}")
    return default if setting == "" else setting == "1"


def early_fence_enabled(proven: bool = True) -> bool:
    """``DYNSPEC_EARLY_FENCE``: 1 on, 0 off; unset, on where a GPU proof ran with it (``proven``:
    0.5.4 - 0.5.12 and 0.5.14+; not yet 0.5.13's publish callback)."""
    return on_off_setting(EARLY_FENCE_ENV, proven)


def early_fence(batch: Any) -> Tuple[Any, Any]:
    """Next ``seq_lens`` and an event marking them ready, recorded before the target forward.

    A one-node tree accepts exactly its root, so the verify's result is known in advance:
    ``seq_lens + 1``. The scheduler waits on the draft input's ``verify_done`` event before it
    prepares the next batch (``maybe_wait_verify_done``); recorded at the end of verify, that
    serialises scheduling behind the whole forward, which plain decode does not.
    """
    import torch

    new_seq_lens = batch.seq_lens + 1
    ready = torch.get_device_module(new_seq_lens.device).Event()
    ready.record()
    return new_seq_lens, ready


def publish_early(result: Any, new_seq_lens: Any, ready: Any) -> None:
    """Hand the scheduler the early ``seq_lens`` and event, where the release has them (≤0.5.12)."""
    draft_input = getattr(result, "next_draft_input", None)
    if draft_input is None or getattr(draft_input, "verify_done", None) is None:
        return  # 0.5.13 publishes through a callback instead; left as is
    draft_input.new_seq_lens = new_seq_lens
    draft_input.verify_done = ready


def mask_length(bs: int, seq_lens_sum: Optional[int], max_context_len: Optional[int]) -> Optional[int]:
    """Entries of a one-node tree mask: ``sum(seq_lens) + bs``; an upper bound when the sum is not on the CPU."""
    if seq_lens_sum is not None:
        return seq_lens_sum + bs
    if max_context_len:
        return bs * max_context_len + bs
    return None


def needs_stride_padding(result: Any) -> bool:
    """True up to 0.5.11, where the scheduler slices ``next_token_ids`` with the worker's N.

    From 0.5.12 ``GenerationBatchResult.speculative_num_draft_tokens`` carries the stride of its
    own iteration (1 in a fallback), and the scheduler uses that.
    """
    return getattr(result, "speculative_num_draft_tokens", None) is None


def pad_to_stride(tokens: Any, stride: int) -> Any:
    """``(bs,)`` tokens -> ``(bs * stride,)`` with token i at ``i * stride``.

    With every ``accept_lens[i] == 1`` the scheduler takes ``next_token_ids[i*stride : i*stride+1]``.
    """
    if stride == 1:
        return tokens
    padded = tokens.new_zeros((tokens.shape[0] * stride,))
    padded[::stride] = tokens
    return padded


# -- 0.5.14 to 0.5.23: a threshold policy on SGLang's zero-step runtime state ------------------


def attach_zero_step_policy(worker: Any) -> Optional["ZeroStepPolicy"]:
    """Install ``ZeroStepPolicy`` as the worker's ``adaptive_controller`` (0.5.14+); None when off.

    Called at the end of ``EAGLEWorkerV2.__init__``. The worker's own ``init_cuda_graphs`` (run
    by the scheduler once the target's graphs exist) then registers the configured state and
    calls ``init_states``, which builds the zero-step state; every decode iteration calls
    ``activate_step_by_batch`` before drafting.
    """
    settings = settings_of(worker)
    if settings is None:
        return None
    _refuse_bit_check()
    _refuse_unsupported(worker)  # includes --speculative-adaptive: one controller per worker
    missing = [
        name
        for name in ("build_adaptive_runtime_state", "apply_runtime_state", "_build_trivial_verify_input")
        if not hasattr(worker, name)
    ]
    if missing:
        raise RuntimeError(f"dynspec: this EAGLEWorkerV2 lacks {', '.join(missing)}; {FLAG} cannot work here")
    if getattr(worker, "adaptive_controller", None) is not None:
        raise ValueError(f"{FLAG} does not support --speculative-adaptive")
    from sglang.srt.speculative.dynspec_runtime import DraftKV, DraftRecorder

    rank0 = _tp_rank(worker) == 0
    controller = _switch_controller(worker, settings, rank0)
    draft_worker = worker.draft_worker
    draft_kv = DraftKV.build(draft_worker.draft_runner, log=rank0)
    policy = ZeroStepPolicy(worker, controller, draft_kv, DraftRecorder.from_env(rank0), log=rank0)
    policy.auto = settings.auto
    worker.adaptive_controller = policy
    if draft_kv.saves_work:
        policy.watch_draft_extend(draft_worker)
    if policy.recorder is not None:
        policy.recorder.watch_drafts(draft_worker, lambda: False)  # draft() is not called at zero steps
    policy.lean_verify = LeanVerify.install(worker, log=rank0)
    lean_prefill_enabled()  # read here too: a bad value refuses to start on every release
    if rank0 and any(os.environ.get(env, "").strip() for env in (LEAN_STEP_ENV, LEAN_PREFILL_ENV)):
        logger.info(
            f"dynspec: {LEAN_STEP_ENV} and {LEAN_PREFILL_ENV} apply to 0.5.12's own fallback only; here the zero-step verify is the lean one"
        )
    return policy


@contextlib.contextmanager
def one_token_backends_from(model_runner: Any) -> Iterator[List[Any]]:
    """While building the zero-step state, the target backends it makes verify as a decode where
    ``one_token_attention`` says so; yields the list they are added to, for the start-up line.

    ``build_adaptive_runtime_state`` takes its target backend from the model runner's
    ``_get_attention_backend``; shadowing that on the instance reaches it without a new anchor.
    """
    from sglang.srt.speculative.dynspec_runtime import one_token_attention

    made: List[Any] = []
    if model_runner is None:
        yield made
        return
    make_backend = model_runner._get_attention_backend
    shadowed = "_get_attention_backend" in vars(model_runner)

    def one_token_backend(*args: Any, **kwargs: Any) -> Any:
        backend = one_token_attention(make_backend(*args, **kwargs))
        made.append(backend)
        return backend

    model_runner._get_attention_backend = one_token_backend
    try:
        yield made
    finally:
        if shadowed:
            model_runner._get_attention_backend = make_backend
        else:
            del model_runner._get_attention_backend


def _target_model_runner(worker: Any) -> Any:
    target = getattr(worker, "_target_worker", None) or getattr(worker, "target_worker", None)
    return getattr(target, "model_runner", None)


class ZeroStepPolicy:
    """Stands in for SGLang's ``AdaptiveController`` (0.5.14+), with dynspec's decision.

    Implements the calls ``EAGLEWorkerV2`` makes on its controller: ``register`` and
    ``init_states`` from ``init_cuda_graphs``, ``activate_step_by_batch`` at the top of each
    decode iteration, ``on_verify_complete`` from the scheduler (ignored: the decision does not
    depend on acceptance). States are built by the worker's ``build_adaptive_runtime_state`` and
    switched by its ``apply_runtime_state``, as upstream's adaptive mode does.
    """

    def __init__(self, worker: Any, controller: Any, draft_kv: Any, recorder: Any = None, log: bool = True) -> None:
        self.worker = worker
        self.controller = controller  # dynspec_runtime.SwitchController
        self.draft_kv = draft_kv  # dynspec_runtime.DraftKV
        self.recorder = recorder  # dynspec_runtime.DraftRecorder, or None
        self.log = log
        self.speculative_num_steps = worker.speculative_num_steps
        self._step = controller.SPECULATE
        self._states: Dict[int, Any] = {}
        self._warned_missing = False
        self._early_publish = early_fence_enabled()  # read once, at start-up
        # On unless 0, as on the own fallback: session 22 measured it on 0.5.17 (exact_kv, and per step
        # 0.976 / 0.997 at 64 / 128 against 0.974 / 0.988 without). Read now, so a bad value refuses even without kv-direct.
        self._kv_stream = on_off_setting(KV_STREAM_ENV, True)
        self.lean_verify: Optional[LeanVerify] = None  # set by attach_zero_step_policy
        self.auto = False  # --speculative-disable-batch-size auto: init_states builds the driver
        self.driver: Any = None  # dynspec_auto.AutoDriver, or None with a fixed N
        self.one_token_backends: List[Any] = []  # the target backends init_states had made, for its line
        # (speculated, batch size) of the decode iterations whose verify the scheduler has not
        # handed back yet (it does one iteration late, in order): the acceptance comes from those.
        self._unverified: Deque[Tuple[bool, int]] = deque(maxlen=4)

    @property
    def candidate_steps(self) -> List[int]:
        return sorted({0, self.speculative_num_steps})

    def register(self, state: Any, steps: Optional[int] = None) -> None:
        self._states[state.speculative_num_steps if steps is None else steps] = state

    def init_states(self, cuda_graph_bs: Optional[List[int]] = None) -> None:
        """Build the zero-step state: one-token target graphs for the batch sizes above the switch-on size."""
        from sglang.srt.speculative.dynspec_runtime import fallback_capture_sizes

        tic = time.perf_counter()
        capture_bs = fallback_capture_sizes(cuda_graph_bs, self.controller.enable_at_or_below)
        if 0 not in self._states:
            with one_token_backends_from(_target_model_runner(self.worker)) as made:
                self._states[0] = self.worker.build_adaptive_runtime_state(
                    speculative_num_steps=0, speculative_num_draft_tokens=1, cuda_graph_bs=capture_bs
                )
            self.one_token_backends = made
            zero = self._states[0]
            stock_graph = getattr(zero, "cuda_graph_runner_for_draft_extend", None)
            if stock_graph is not None:
                build = lambda: self._graph_like(zero, stock_graph, capture_bs)  # noqa: E731
                self.draft_kv.capture_graph(build, zero.draft_extend_attn_backend)
            self._build_direct()
        if self.auto and self.driver is None:
            self.driver = self._auto_driver(cuda_graph_bs)
        if self.log:
            from sglang.srt.speculative.dynspec_runtime import describe_draft_kv, describe_one_token_attention

            graphs = getattr(getattr(self._states[0], "target_graph_runner", None), "capture_bs", None)
            # the release's state builder made one target backend here; none: it kept the server's own
            attention = (
                describe_one_token_attention(self.one_token_backends[0])
                if self.one_token_backends
                else "one-token verify through the server's own target backend (no one-token backend made)"
            )
            logger.info(
                f"dynspec: zero-step state ready in {time.perf_counter() - tic:.2f} s: speculation off above "
                f"{self.controller.disable_above} requests, on at or below {self.controller.enable_at_or_below}, "
                f"at least {self.controller.min_steps} iterations between switches; one-token target CUDA graphs "
                f"for batch sizes {list(graphs) if graphs else 'none (eager)'}; {attention}; "
                f"{describe_draft_kv(self.draft_kv)}"
            )

    def _auto_driver(self, cuda_graph_bs: Optional[List[int]]) -> Any:
        """``auto``'s driver: thresholds between the floor and the largest size the fallback can
        serve on a CUDA graph below the running-request limit; rank 0's decisions on every rank."""
        from sglang.srt.speculative.dynspec_auto import BUCKETS, AutoDriver, AutoThreshold

        floor = self.controller.enable_at_or_below
        limits = [max(cuda_graph_bs) - 1] if cuda_graph_bs else []
        max_running = read_setting(self.worker, "max_running_requests")
        if isinstance(max_running, int):
            limits.append(max_running - 1)
        ceiling = max(floor, min(limits) if limits else BUCKETS[-1])
        share = None
        if _tensor_parallel(self.worker):
            from sglang.srt.distributed import get_tp_group

            group = get_tp_group()
            share = lambda ours: group.broadcast_object(ours, src=0)  # noqa: E731
        driver = AutoDriver(
            self.controller, AutoThreshold(floor, ceiling), rank0=_tp_rank(self.worker) == 0, share=share, log=self.log
        )
        stock = self.worker.forward_batch_generation

        def forward_batch_generation(batch: Any, *args: Any, **kwargs: Any) -> Any:
            if not_a_decode(batch):
                driver.auto.interrupted()  # the period to the next decode is not a decode step
            return stock(batch, *args, **kwargs)

        self.worker.forward_batch_generation = forward_batch_generation
        if self.log:
            logger.info(
                f"dynspec: {FLAG} auto: the switch point between {floor} and {ceiling} requests, found from this "
                f"server's step timings and acceptance (speculating everywhere until both modes are timed)"
            )
        return driver

    def _build_direct(self) -> None:
        """``kv-direct``: feed the captured twin straight from the verify, where it allows it."""
        feed_directly(self.draft_kv, lambda twin: ZeroStepDirectWrite.build(twin, self.worker, self.log), self.log)
        direct = self.draft_kv.direct
        if direct is None:
            return
        if direct.batch_steps > 1:
            why_not = direct.check_rounding_unless(kv_batch_unsafe(self.worker))
            if why_not is not None:  # serve with one iteration per replay rather than not at all
                direct.batch_steps = 1
                if self.log:
                    logger.info(
                        f"dynspec: {KV_BATCH_ENV} is not used with {why_not}; every fallback iteration writes its own rows"
                    )
        # After the rounding check, whose replays must finish at start-up; before the flush hook,
        # which then wraps the join.
        if self._kv_stream:
            write_beside(self.worker, direct, self.log)
        if direct.batch_steps == 1:
            return
        self._flush_before_other_forwards()
        if self.log:
            logger.info(
                f"dynspec: kv-direct writes the draft KV of up to {direct.batch_steps} fallback iterations per "
                f"replay, in graphs that round the K/V as one iteration's ({KV_BATCH_ENV}; the KV-only graphs, by "
                f"requests of {direct.width} rows, that round alike, checked at start-up: {direct.rounding_groups()})"
            )

    def _flush_before_other_forwards(self) -> None:
        """Shadow the worker's ``forward_batch_generation``: a forward that is not a decode (a
        prefill reads cached draft KV and may be given slots freed since) first writes the staged rows."""
        stock = self.worker.forward_batch_generation

        def forward_batch_generation(batch: Any, *args: Any, **kwargs: Any) -> Any:
            direct = self.draft_kv.direct
            if direct is not None and direct.pending and not_a_decode(batch):
                direct.flush()
            return stock(batch, *args, **kwargs)

        self.worker.forward_batch_generation = forward_batch_generation

    def _graph_like(self, state: Any, stock_graph: Any, capture_bs: Optional[List[int]]) -> Any:
        """A new instance of ``stock_graph``'s runner class, made as the zero-step state made its
        own: under the worker's ``_override_worker_state`` for 0 steps, with the state's backend."""
        draft_worker = self.worker.draft_worker
        with self.worker._override_worker_state(
            state.speculative_num_steps, state.speculative_num_draft_tokens, cuda_graph_bs=capture_bs
        ):
            draft_worker.draft_extend_attn_backend = state.draft_extend_attn_backend
            draft_worker.draft_runner.attn_backend = state.draft_extend_attn_backend
            return type(stock_graph)(draft_worker)

    def activate_step_by_batch(self, batch_size: int) -> None:
        if batch_size <= 0:  # an idle batch: keep the current state, count nothing
            return
        self._step = (self.driver or self.controller).step(batch_size)
        if self.driver is not None:
            self._unverified.append((self._step == self.controller.SPECULATE, batch_size))
        direct = self.draft_kv.direct
        if direct is not None and direct.pending and self._step != self.controller.FALL_BACK:
            direct.flush()  # staged rows go in before this iteration drafts or extends from the KV
        steps = self.speculative_num_steps if self._step == self.controller.SPECULATE else 0
        if steps == self.worker.speculative_num_steps:
            return
        state = self._states.get(steps)
        if state is None:
            if not self._warned_missing:
                logger.error(f"dynspec: no runtime state for {steps} steps (init_states never ran); not switching")
                self._warned_missing = True
            return
        self.worker.apply_runtime_state(state)

    def on_verify_complete(
        self, num_correct_drafts_per_req: Any = None, *args: Any, batch_size: int = 0, **kwargs: Any
    ) -> None:
        """The scheduler's copy of a verify's accepted drafts per request, one iteration late:
        ``auto``'s acceptance, from the iterations that speculated; ignored with a fixed N."""
        if self.driver is None or not self._unverified or num_correct_drafts_per_req is None:
            return
        speculated, size = self._unverified.popleft()
        if size != len(num_correct_drafts_per_req):
            self._unverified.clear()  # out of step (a batch without a verify): start again
            return
        if speculated:
            self.driver.auto.verified(num_correct_drafts_per_req)

    def publish_early(self, batch: Any, on_publish: Any) -> Any:
        """Called just before the decode branch's verify; returns the callback the stock code keeps.

        With zero steps every request accepts exactly its root, so the next ``seq_lens`` are
        ``seq_lens + 1`` before the forward starts. Publishing them here moves the scheduler's
        fence from the end of the verify to its start, as the 0.5.4 - 0.5.12 fallback does; the
        stock publication after the verify is then skipped (``None``). ``DYNSPEC_EARLY_FENCE=0``
        turns it off.
        """
        if self.worker.speculative_num_steps != 0:
            return on_publish
        if self.recorder is not None:
            self.recorder.iteration(self._step, batch)
        if on_publish is None or not self._early_publish:
            return on_publish
        on_publish(batch.seq_lens + 1)
        return None

    def watch_draft_extend(self, draft_worker: Any) -> None:
        """Shadow the draft worker's ``_draft_extend_for_decode``: at zero steps, except at
        ``RESUME``, it runs under ``DraftKV.kv_only`` and writes only the draft KV."""
        stock = draft_worker._draft_extend_for_decode

        def draft_extend_for_decode(*args: Any, **kwargs: Any) -> Any:
            fall_back = self._step == self.controller.FALL_BACK and self.worker.speculative_num_steps == 0
            direct = self.draft_kv.direct  # None unless kv-direct was built, and once given up
            # The release calls it as (batch, batch_output).
            if fall_back and direct is not None and len(args) == 2 and direct.write(*args):
                return None  # the stubs upstream's skip switch leaves stand in for its outputs
            if direct is not None:
                direct.flush()  # rows staged by earlier iterations go in before the stock extend reads the KV
            if not fall_back:
                return stock(*args, **kwargs)
            with self.draft_kv.kv_only(draft_worker):
                return stock(*args, **kwargs)

        draft_worker._draft_extend_for_decode = draft_extend_for_decode


LEAN_VERIFY_ENV = "DYNSPEC_LEAN_VERIFY"
DECODE_SAMPLE_ENV = "DYNSPEC_DECODE_SAMPLE"  # DecodeSample: on unless 0 (A/B runs of the sampled draw while off)
PREFILL_KV_ENV = "DYNSPEC_PREFILL_KV"  # V2Fallback.prefill_kv_only (0.5.4 - 0.5.13; on unless 0)
KV_BATCH_ENV = "DYNSPEC_KV_BATCH"
KV_STREAM_ENV = "DYNSPEC_KV_STREAM"  # write_beside, with kv-direct: on unless 0 (0.5.10 - 0.5.13 and 0.5.14+)
KV_BATCH_MAX = 8  # beyond a few iterations the GEMMs of one replay stop being bound by the weight read


def kv_batch_unsafe(worker: Any) -> Optional[str]:
    """Why rows may not wait (``DYNSPEC_KV_BATCH``) or replay beside the worker (``write_beside``):
    PD disaggregation (transferred KV lands in new slots without a forward) and a hierarchical cache
    (loads and backs up device slots on its own) touch the draft KV outside the forwards the rows
    are written before; tensor parallelism has not run."""
    if read_setting(worker, "disaggregation_mode", "null") not in (None, "null"):
        return "PD disaggregation"
    if read_setting(worker, "enable_hierarchical_cache", False):
        return "a hierarchical cache"
    if _tensor_parallel(worker):
        return "tensor parallelism (the twin's collectives need every rank to replay alike; not run with TP > 1)"
    return None


def kv_batch_steps() -> int:
    """``DYNSPEC_KV_BATCH``: fallback iterations whose draft KV one direct-write replay writes
    (0.5.14+); unset or 1: every iteration replays its own rows, as before."""
    setting = os.environ.get(KV_BATCH_ENV, "").strip() or "1"
    if not setting.isdigit() or not 1 <= int(setting) <= KV_BATCH_MAX:
        raise ValueError(f"{KV_BATCH_ENV} must be a whole number from 1 to {KV_BATCH_MAX}, not {setting!r}")
    return int(setting)


def lean_verify_enabled() -> bool:
    """``DYNSPEC_LEAN_VERIFY``: 1 or unset on, 0 off (the stock verify at zero steps, for A/B runs
    and for exact_kv's full-extend reference)."""
    return on_off_setting(LEAN_VERIFY_ENV, True)


def _is_hip() -> bool:
    import torch

    return getattr(getattr(torch, "version", None), "hip", None) is not None


def greedy_batch_refusal(batch: Any, penalties: Tuple[str, ...]) -> Optional[str]:
    """Why a one-node verify of ``batch`` may not be the argmax of the target's logits (host checks):
    grammar, logprobs, sampling, or one of the sampling info's ``penalties`` set; None where it is."""
    if getattr(batch, "has_grammar", False):
        return "grammar"
    if getattr(batch, "return_logprob", False):
        return "logprobs"
    info = batch.sampling_info
    if not info.is_all_greedy:
        return "sampling"
    return next((name for name in penalties if getattr(info, name, None) is not None), None)


class DecodeSample:
    """A sampled batch of a one-node verify, drawn as plain decode draws it: by the model runner's ``Sampler``.

    With top-k and top-p both set, the verify's ``eagle_sample`` keeps the top k, renormalises them,
    then cuts top-p on that renormalised mass; plain decode cuts top-p on the original mass (the
    pytorch backend; FlashInfer's ``joint`` order), and the verify ignores min-p. Left to it, a sampled request would
    follow always-on speculation's distribution while speculation is off, not the server's without
    it. So a sampled batch goes to the sampler plain decode calls, with the arguments it passes
    (the positions that seed deterministic sampling are the one node's, the input token's, as a
    decode step's). The sampler scales and normalises the logits in place, as in plain decode; where
    the batch returns logprobs, which the verify computes from the logits afterwards, it gets a copy.
    With tensor parallelism rank 0's tokens are broadcast, as the verify's draw does (plain decode
    relies on every rank drawing alike). A batch whose logits the verify and plain decode prepare
    differently (penalties, a logit bias, grammar, a custom logit processor) or whose sampler writes
    more than tokens (sampling masks) stays with the verify, as does every sampled batch on ROCm,
    where the verify takes their argmax. ``DYNSPEC_DECODE_SAMPLE=0`` leaves them all to it (A/B runs).
    """

    # Sampler.forward's parameters, 0.5.4 - 0.5.23 (pinned in the tests): anything else is not the sampler this calls.
    PARAMETERS = (
        "logits_output",
        "sampling_info",
        "return_logprob",
        "top_logprobs_nums",
        "token_ids_logprobs",
        "positions",
    )
    # What plain decode's logits preparation (``SamplingBatchInfo.apply_logits_bias``) reads besides the
    # caller's penalties and the grammar's mask: 0.5.4 - 0.5.10 keep frequency / presence penalties in
    # acc_linear_penalties, which their verify never applies (pinned in the tests).
    PLAIN_DECODE_BIASES = ("acc_linear_penalties",)

    def __init__(self, sampler: Callable[..., Any], tp_group: Any = None) -> None:
        self.sampler = sampler
        self.tp_group = tp_group  # the tensor-parallel group where it has more than one rank, else None

    @classmethod
    def of(cls, model_runner: Any) -> Tuple[Optional["DecodeSample"], str]:
        """The model runner's sampler, or None and why not (no sampler, one called otherwise, ROCm)."""
        import inspect

        sampler = getattr(model_runner, "sampler", None)
        if sampler is None:
            return None, "the target's model runner has no sampler"
        try:
            parameters = inspect.signature(sampler.forward).parameters
        except (AttributeError, TypeError, ValueError):
            return None, "the target's sampler has no forward to read"
        names = tuple(parameters)
        # More parameters are fine only where they have defaults: the call passes the six alone.
        required = [p.name for p in list(parameters.values())[len(cls.PARAMETERS) :] if p.default is p.empty]
        if names[: len(cls.PARAMETERS)] != cls.PARAMETERS or required:
            return None, f"the target's sampler takes ({', '.join(names)})"
        if _is_hip():
            return None, "on ROCm the verify takes the argmax of a sampled batch, as always-on speculation does"
        return cls(sampler, _tensor_parallel_group()), ""

    @classmethod
    def for_runner(cls, model_runner: Any, simulating: bool, what: str, log: bool) -> Optional["DecodeSample"]:
        """The draw for ``what`` (a one-node sample's name in the log), or None: the stock draw, said once.
        ``simulating``: ``SGLANG_SIMULATE_ACC_LEN`` is on, whose simulation decides every token."""
        if not on_off_setting(DECODE_SAMPLE_ENV, True):  # read first: a bad value refuses to start
            decode_sample, why_not = None, f"{DECODE_SAMPLE_ENV}=0"
        elif simulating:
            decode_sample, why_not = None, "SGLANG_SIMULATE_ACC_LEN decides their tokens"
        else:
            decode_sample, why_not = cls.of(model_runner)
        if log:
            if decode_sample is None:
                logger.info(f"dynspec: {what} leaves sampled batches to the stock sample ({why_not})")
            else:
                logger.info(f"dynspec: {what} draws sampled batches with the target's sampler, as plain decode does")
        return decode_sample

    def refusal(self, batch: Any, penalties: Tuple[str, ...]) -> Optional[str]:
        """Why this sampled batch stays with the verify's sample; None if the sampler draws it (host checks)."""
        if getattr(batch, "has_grammar", False):
            return "grammar"
        info = batch.sampling_info
        for name in (*penalties, *self.PLAIN_DECODE_BIASES):
            if getattr(info, name, None) is not None:
                return name
        orchestrator = getattr(info, "penalizer_orchestrator", None)  # plain decode applies a required one itself
        if orchestrator is not None and getattr(orchestrator, "is_required", False):
            return "penalties"
        if getattr(info, "has_custom_logit_processor", False):  # plain decode applies it, the verify does not
            return "a custom logit processor"
        # 0.5.16+: the sampler would write them; from 0.5.20 it reads the rows from the indices made of the flags
        masks = any(getattr(info, "return_sampling_masks", None) or ())
        if masks or getattr(info, "sampling_mask_batch_indices", None) is not None:
            return "sampling masks"
        return None

    @staticmethod
    def unplaced(verify_input: Any, rows: int) -> Optional[str]:
        """Why the verify input gives no position per request (which seeds a deterministic draw); None if it does."""
        positions = getattr(verify_input, "positions", None)  # 0.5.14 - 0.5.16 allow a longer buffer's first rows
        if positions is None or len(positions.shape) != 1 or positions.shape[0] < rows:
            return "positions not one per request"
        return None

    def draw(self, batch: Any, verify_input: Any, logits_output: Any) -> Any:
        """The sampler's tokens for the batch (int32, one per request); the logits left as they were
        where the batch returns logprobs (the scheduler reads them only for those)."""
        import copy

        import torch

        scratch = logits_output
        if getattr(batch, "return_logprob", False):
            # the sampler writes only what return_logprob asks, which is nothing here
            scratch = copy.copy(logits_output)
            scratch.next_token_logits = logits_output.next_token_logits.clone()
        tokens = self.sampler(
            scratch,
            batch.sampling_info,
            False,  # the verify computes the logprobs, from the untouched logits
            getattr(batch, "top_logprobs_nums", None),
            getattr(batch, "token_ids_logprobs", None),
            verify_input.positions[: logits_output.next_token_logits.shape[0]],
        )
        tokens = tokens.to(torch.int32)
        if self.tp_group is not None:  # as the verify's draw: every rank commits rank 0's tokens
            self.tp_group.broadcast(tokens, src=0)
        return tokens


class LeanVerify:
    """0.5.14+: the zero-step verify without the one-node tree's sampling machinery.

    At zero steps the stock verify checks a tree of one node per request. ``eagle_sample``
    allocates a predict buffer and an accept index, runs the greedy tree kernel (whose loop has
    nothing to walk), and under ``SGLANG_SIMULATE_ACC_LEN`` rebuilds both (six more launches);
    then ``fill_bonus_tokens_func`` launches a Triton kernel to pick each request's last accepted
    token, which is its only one. For a greedy batch the outcome is known in advance: the argmax
    of the target's logits is both the accepted and the bonus token, and every request accepts
    one. So while the stock verify runs at zero steps, ``sample`` and ``fill_bonus`` stand in for
    those two names in the modules the verify's code reads them from; its preparation, target
    forward, bookkeeping and result stay the release's own. A sampled batch is drawn by the
    target's sampler, as plain decode draws it (``DecodeSample``: the verify's own draw follows
    speculation's top-k/top-p rule). A batch ``sample`` does not know (penalties, grammar, greedy
    logprobs, other trees, arguments it has not seen) goes to the stock function unchanged, as does
    every call outside that window.

    The tensors equal the stock ones in value, dtype and shape; ``accept_lens`` (ones) and
    ``accept_index`` (0 .. bs-1) are views of buffers kept across iterations, which is safe because
    no release 0.5.14 - 0.5.23 writes either in place (pinned in the tests).
    """

    SAMPLE = "eagle_sample"
    FILL_BONUS = "fill_bonus_tokens_func"
    # Where the verify's code looks the two names up: the shared verify body (0.5.16+) and the
    # worker (0.5.14 - 0.5.15 verify inline).
    VERIFY_MODULES = ("sglang.srt.speculative.eagle_worker_common", "sglang.srt.speculative.eagle_worker_v2")
    # Keyword arguments of ``eagle_sample`` that a greedy one-node tree does not read: the sparse
    # target sampling of 0.5.20+ (the sampling branch only) and the mask layout of a watermark,
    # which ``watermark_state`` (refused unless None) gates.
    IGNORED_KWARGS = ("uno_target_max_top_k", "watermark_full_mask")
    PENALTIES = ("acc_additive_penalties", "acc_scaling_penalties", "logit_bias")
    TREE: Tuple[str, ...] = ("draft_token_num", "max_tree_depth", "tree_topk")  # a one-node tree has 1 of each
    WHAT = "the lean zero-step verify"  # in the log lines
    SIMULATED_TOKEN = 100  # what SIMULATE_ACC_LEN's "fixed" mode writes as every accepted token

    def __init__(
        self,
        stock_sample: Callable[..., Tuple[Any, Any, Any]],
        sanitize: Optional[Callable[..., Any]],
        simulated_token: Optional[int],
    ) -> None:
        self.stock_sample = stock_sample
        self.sanitize = sanitize  # the release's sanitize_nan_logits where the stock sample calls it first
        self.simulated_token = simulated_token  # fill predict with it (SIMULATE_ACC_LEN, fixed mode), or None
        self.simulating = False  # SIMULATE_ACC_LEN on, in any mode: sampled batches stay with the stock sample
        self.stock_fill: Optional[Callable[..., None]] = None
        self.shadows: List[Tuple[Any, str, Any, Any]] = []  # (module, name, stand-in, stock) per verify
        self._ones: Any = None  # int32 ones and 0 .. n-1, grown to the largest batch seen
        self._indices: Any = None
        self.decode_sample: Optional[DecodeSample] = None  # sampled batches: plain decode's draw (install sets it)
        self.taken = 0  # batches sampled here (those the sampler drew among them), and those left to the stock sample
        self.drawn = 0
        self.refused = 0
        self.log = False  # rank 0: say when the first batch is taken (install sets it)

    @classmethod
    def install(cls, worker: Any, log: bool = True) -> Optional["LeanVerify"]:
        """Shadow ``worker.verify`` so that zero-step verifies run with the lean stand-ins; None
        (the stock verify everywhere, said once) when switched off or not applicable here."""
        if not lean_verify_enabled():
            return None
        lean, why_not = cls.build()
        if lean is not None and _tensor_parallel(worker) and _is_hip():
            # From 0.5.20 the greedy branch broadcasts rank 0's tokens on ROCm, which the lean sample does not.
            lean, why_not = None, "ROCm with tensor parallelism: the stock sample broadcasts rank 0's tokens there"
        if lean is None:
            if log:
                logger.info(f"dynspec: the zero-step verify runs stock ({why_not})")
            return None
        lean.decode_sample = DecodeSample.for_runner(_target_model_runner(worker), lean.simulating, lean.WHAT, log)
        stock_verify = worker.verify

        def verify(*args: Any, **kwargs: Any) -> Any:
            if worker.speculative_num_steps != 0:
                return stock_verify(*args, **kwargs)
            with lean.in_place():
                return stock_verify(*args, **kwargs)

        worker.verify = verify
        lean.log = log
        if log:
            logger.info("dynspec: the zero-step verify samples greedy batches without the one-node tree kernels")
        return lean

    @classmethod
    def build(cls) -> Tuple[Optional["LeanVerify"], str]:
        import importlib

        modules = []
        for name in cls.VERIFY_MODULES:
            try:
                modules.append(importlib.import_module(name))
            except ImportError:
                continue
        samplers = [m for m in modules if callable(getattr(m, cls.SAMPLE, None))]
        if not samplers:
            return None, f"no module of {', '.join(cls.VERIFY_MODULES)} calls {cls.SAMPLE}"
        stock_sample = getattr(samplers[0], cls.SAMPLE)
        if any(getattr(m, cls.SAMPLE) is not stock_sample for m in samplers):
            return None, f"the verify modules hold different {cls.SAMPLE} functions"
        try:
            from sglang.srt.utils.async_probe import sanitize_nan_logits
        except ImportError:
            return None, "this release has no sanitize_nan_logits"
        spec_utils = importlib.import_module("sglang.srt.speculative.spec_utils")
        simulated, why_not = cls.simulated_token_of(spec_utils)
        if why_not:
            return None, why_not
        lean = cls(stock_sample, sanitize_nan_logits, simulated)
        lean.simulating = cls.simulates(spec_utils)
        lean.shadows = [(m, cls.SAMPLE, lean.sample, stock_sample) for m in samplers]
        fillers = [m for m in modules if callable(getattr(m, cls.FILL_BONUS, None))]
        if fillers:  # 0.5.16+; before, the verify launches the Triton kernel itself
            lean.stock_fill = getattr(fillers[0], cls.FILL_BONUS)
            fill = lean.stock_fill
            lean.shadows += [
                (m, cls.FILL_BONUS, lean.fill_bonus, fill) for m in fillers if getattr(m, cls.FILL_BONUS) is fill
            ]
        return lean, ""

    @staticmethod
    def simulates(spec_utils: Any) -> bool:
        """Whether ``SGLANG_SIMULATE_ACC_LEN`` is on: the verify's simulation then decides every token."""
        length = getattr(spec_utils, "SIMULATE_ACC_LEN", -1)
        return isinstance(length, (int, float)) and length > 0

    @classmethod
    def simulated_token_of(cls, spec_utils: Any) -> Tuple[Optional[int], str]:
        """What ``SGLANG_SIMULATE_ACC_LEN`` does to a one-node tree: the token every accepted one
        becomes (fixed mode), None (off, or real-draft-token mode: the argmax stands), or why the
        lean sample cannot mirror it. Its length clamps to the tree's depth, 1, which
        ``match-expected`` reaches without drawing; ``multinomial`` draws from the CPU generator."""
        if not cls.simulates(spec_utils):
            return None, ""
        method = getattr(spec_utils, "SIMULATE_ACC_METHOD", None)
        mode = getattr(spec_utils, "SIMULATE_ACC_TOKEN_MODE", "fixed")  # 0.5.14 has only fixed
        if method != "match-expected":
            return None, f"SGLANG_SIMULATE_ACC_METHOD={method} draws from the CPU generator in every verify"
        if mode == "fixed":
            return cls.SIMULATED_TOKEN, ""
        if mode == "real-draft-token":
            return None, ""
        return None, f"SGLANG_SIMULATE_ACC_TOKEN_MODE={mode} is not one this dynspec knows"

    @contextlib.contextmanager
    def in_place(self) -> Iterator[None]:
        """The stand-ins in the verify's modules for one call; the stock functions after it."""
        for module, name, stand_in, _ in self.shadows:
            setattr(module, name, stand_in)
        try:
            yield
        finally:
            for module, name, _, stock in self.shadows:
                setattr(module, name, stock)

    IDLE = "an idle batch"

    def refusal(
        self, verify_input: Any, batch: Any, logits: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]
    ) -> Optional[str]:
        """Why this batch's one-node verify may not have the known outcome; None if it has (host checks only)."""
        if batch.forward_mode.is_idle():
            return self.IDLE
        if any(a is not None for a in args):
            return "a grammar mask"
        other = sorted(k for k, v in kwargs.items() if v is not None and k not in self.IGNORED_KWARGS)
        if other:
            return f"the argument {other[0]}"
        tree = [getattr(verify_input, name, None) for name in self.TREE]
        if any(size != 1 for size in tree):
            return "a tree of " + ", ".join(f"{name} {size}" for name, size in zip(self.TREE, tree))
        rows = batch.seq_lens.shape[0]
        if len(logits.shape) != 2 or logits.shape[0] != rows:
            return f"logits of shape {tuple(logits.shape)} for {rows} requests"
        if not batch.sampling_info.is_all_greedy and self.decode_sample is not None:
            return self.decode_sample.refusal(batch, self.PENALTIES) or DecodeSample.unplaced(verify_input, rows)
        return greedy_batch_refusal(batch, self.PENALTIES)

    def sample(
        self, verify_input: Any, batch: Any, logits_output: Any, *args: Any, **kwargs: Any
    ) -> Tuple[Any, Any, Any]:
        """``eagle_sample`` of a one-node tree: (predict, accept_lens, accept_index)."""
        logits = logits_output.next_token_logits
        why = self.refusal(verify_input, batch, logits, args, kwargs)
        if why is not None:
            if why != self.IDLE:
                self.refused += 1
                if self.refused == 1 and self.log:  # once: why batches take the stock sample
                    logger.info(f"dynspec: {self.WHAT} left a batch to the stock sample ({why})")
            return self.stock_sample(verify_input, batch, logits_output, *args, **kwargs)
        import torch

        if self.sanitize is not None:
            self.sanitize(logits, "verify: target model logits")  # in place, before the argmax or the draw, as stock
        if batch.sampling_info.is_all_greedy:
            predict = torch.argmax(logits, dim=-1).to(torch.int32)
            if self.simulated_token is not None:
                predict.fill_(self.simulated_token)
        else:
            assert self.decode_sample is not None  # refusal lets a sampled batch through only with one
            predict = self.decode_sample.draw(batch, verify_input, logits_output)
            self.drawn += 1
            if self.drawn == 1 and self.log:  # once: the evidence that the sampler draws them
                logger.info(f"dynspec: {self.WHAT} drew its first sampled batch with the target's sampler")
        rows = int(predict.shape[0])
        self.taken += 1
        if self.taken == 1 and self.log:  # once: the evidence that it runs, in the server's log
            logger.info(f"dynspec: {self.WHAT} took its first batch ({rows} requests)")
        return self.outputs(predict, rows)

    def outputs(self, predict: Any, rows: int) -> Tuple[Any, Any, Any]:
        """(predict, accept_lens, accept_index): every request accepts its one token, at its own row."""
        import torch

        if self._ones is None or self._ones.shape[0] < rows:
            size = max(rows, 2 * (0 if self._ones is None else self._ones.shape[0]))
            self._ones = torch.ones((size,), dtype=torch.int32, device=predict.device)
            self._indices = torch.arange(size, dtype=torch.int32, device=predict.device)
        return predict, self._ones[:rows], self._indices[:rows].view(rows, 1)

    def fill_bonus(
        self,
        accept_tokens: Any,
        accept_lens: Any,
        bonus_tokens: Any,
        accept_stride: int,
        batch_size: int,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """``fill_bonus_tokens_func`` where each request accepted one token: that token."""
        if accept_stride != 1 or args or kwargs or bonus_tokens.shape[0] != batch_size:
            assert self.stock_fill is not None
            return self.stock_fill(accept_tokens, accept_lens, bonus_tokens, accept_stride, batch_size, *args, **kwargs)
        bonus_tokens.copy_(accept_tokens.view(-1))
        return None


class FallbackLeanSample(LeanVerify):
    """0.5.4 - 0.5.13: ``LeanVerify``'s sample for the own fallback's one-node tree.

    The stock verify calls ``verify_input.sample(batch, logits_output, vocab_mask)``, a method of
    the release's ``EagleVerifyInput``; ``bind`` makes this sample that method of the fallback's own
    verify inputs only (``V2Fallback.trivial_verify_input``), so nothing else is shadowed. These
    releases check for NaN logits in the verify, not in the sample, so nothing is sanitized here.
    The tensors returned are made per call: the verifies of 0.5.4 - 0.5.13 were not checked for
    in-place writes to them, which ``LeanVerify``'s kept buffers rely on.
    """

    TREE = ("draft_token_num",)  # the fallback builds the tree (trivial_tree_fields); its own size is the check
    WHAT = "the lean one-node verify"

    @classmethod
    def install(
        cls, model_runner: Any, log: bool = True
    ) -> Optional["FallbackLeanSample"]:  # it binds per verify input
        """The lean sample, or None (the stock one, said once) when switched off or not applicable;
        sampled batches are drawn by ``model_runner``'s sampler, the target's."""
        if not lean_verify_enabled():
            return None
        import importlib

        try:
            spec_utils = importlib.import_module("sglang.srt.speculative.spec_utils")
        except ImportError:  # every release 0.5.4 - 0.5.13 has it; a patched tree may not
            simulated, why_not = None, "no sglang.srt.speculative.spec_utils to read SGLANG_SIMULATE_ACC_LEN from"
        else:
            simulated, why_not = cls.simulated_token_of(spec_utils)
        if why_not:
            if log:
                logger.info(f"dynspec: the one-node verify samples with the stock sample ({why_not})")
            return None
        lean = cls(cls.stock_sample_of, None, simulated)
        lean.log = log
        lean.simulating = cls.simulates(spec_utils)
        if log:
            logger.info(
                f"dynspec: the one-node verify samples greedy batches without the tree kernels ({LEAN_VERIFY_ENV}=0 turns it off)"
            )
        lean.decode_sample = DecodeSample.for_runner(model_runner, lean.simulating, lean.WHAT, log)
        return lean

    @staticmethod
    def stock_sample_of(verify_input: Any, *args: Any, **kwargs: Any) -> Any:
        return type(verify_input).sample(verify_input, *args, **kwargs)

    def bind(self, verify_input: Any) -> Any:
        verify_input.sample = lambda *args, **kwargs: self.sample(verify_input, *args, **kwargs)
        return verify_input

    def outputs(self, predict: Any, rows: int) -> Tuple[Any, Any, Any]:
        import torch

        ones = torch.ones((rows,), dtype=torch.int32, device=predict.device)
        index = torch.arange(rows, dtype=torch.int32, device=predict.device).view(rows, 1)
        return predict, ones, index


LEAN_STEP_ENV = "DYNSPEC_LEAN_STEP"  # V2LeanStep on 0.5.12's own fallback: unset or 1 on (proven, session 25), 0 off
LEAN_PREFILL_ENV = "DYNSPEC_LEAN_PREFILL"  # LeanKVPrefill: 0 or 1; unset, as DYNSPEC_LEAN_STEP


def lean_step_enabled() -> bool:
    """``DYNSPEC_LEAN_STEP``: on unless 0 (a bad value refuses to start)."""
    return on_off_setting(LEAN_STEP_ENV, True)


def lean_prefill_enabled() -> bool:
    """``DYNSPEC_LEAN_PREFILL``, which follows ``DYNSPEC_LEAN_STEP`` unless set: one switch turns both
    halves of the lean fallback off, and either can be turned off alone (a bad value refuses to start)."""
    return on_off_setting(LEAN_PREFILL_ENV, lean_step_enabled())


def source_fingerprint(source: str) -> str:
    """A digest of Python source that ignores layout: its tokens, without comments, blank lines and
    indentation. The same for a method read from its file at run time (``inspect.getsource``) and
    for the same lines cut from the release's file in the tests, on any Python version."""
    import hashlib
    import io
    import textwrap
    import tokenize

    skipped = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    tokens = tokenize.generate_tokens(io.StringIO(textwrap.dedent(source)).readline)
    return hashlib.sha256(" ".join(t.string for t in tokens if t.type not in skipped).encode()).hexdigest()


def method_fingerprint(cls: Any, name: str) -> Optional[str]:
    """``source_fingerprint`` of ``cls``'s own ``name`` as its file holds it (not an instance's
    wrapper); None where the source cannot be read (no file, no such method)."""
    import inspect

    try:
        return source_fingerprint(inspect.getsource(getattr(cls, name)))
    except (AttributeError, OSError, TypeError, SyntaxError):
        return None


def lean_step_unfit(draft_input_fields: Any, result_fields: Any, forward_parameters: Any) -> Optional[str]:
    """Why a release's shapes are not 0.5.12's, the one verify ``V2LeanStep`` mirrors; None if they
    are. 0.5.11's draft input has ``verified_id``; 0.5.13's target forward takes the schedule batch
    (and its verify publishes through a callback). Named fields and parameters, not a version
    string, so that a patched 0.5.12 tree of any name is recognised."""
    missing = [name for name in V2LeanStep.DRAFT_INPUT_FIELDS if name not in draft_input_fields]
    if missing:
        return f"this release's EagleDraftInput has no {missing[0]}"
    missing = [name for name in V2LeanStep.RESULT_FIELDS if name not in result_fields]
    if missing:
        return f"this release's GenerationBatchResult has no {missing[0]}"
    missing = [name for name in V2LeanStep.TARGET_FORWARD_PARAMETERS if name not in forward_parameters]
    if missing:
        return f"this release's target forward takes no {missing[0]}"
    return None


class V2LeanStep:
    """0.5.12's own fallback, ``kv-direct`` fed directly: a fallback iteration as a plain decode step.

    The fallback re-enters the stock decode branch with the one-token state, which around the
    target forward runs ``draft()`` (the one-node tree) and the draft extend, each inside the draft's
    TP and MoE contexts, and the verify's tree plumbing: the tree sample, a gather of the accepted
    tokens, a Triton launch that picks each request's bonus token, a second event. Session 17's
    stack profile put ≈ 80 % of the fallback's extra host time there, against ≈ 20 % in the
    scheduler. For a greedy batch the outcome is known in advance: every request accepts its root,
    and the argmax of the target's logits is both its next token and its bonus token. So this step
    keeps the release's verify preparation (``prepare_for_v2_verify``: the slot per request, the
    forward batch, the graph's inputs) and its target forward, takes the argmax, and hands the
    scheduler the result 0.5.12's verify builds (``RESULT_FIELDS``, the draft input's
    ``DRAFT_INPUT_FIELDS``; the seq_lens and event of the early fence where it is on), then writes
    the draft KV directly, or runs the stock extend KV-only where the writer cannot take the rows.

    The argmax is the result's next tokens and the draft input's bonus tokens at once, and
    ``accept_lens`` are views of one buffer of ones: no 0.5.12 file writes any of them in place
    (pinned in the tests). A batch it does not take (``greedy_batch_refusal``: sampling, penalties,
    a logit bias, grammar, logprobs) runs the stock branch, and the first is logged with the reason.
    Which release it mirrors is checked at start-up: the fields and parameters (``lean_step_unfit``)
    and the tokens of the worker's own ``verify`` (``VERIFY_FINGERPRINT``), so that a tree whose
    verify was changed, by a fix or by hand, runs the stock branch instead, and says so.
    On by default since a GPU proof ran it (session 25: equivalence, crossings, exact_kv and the
    throughput of 0.5.12 v2); ``DYNSPEC_LEAN_STEP=0`` runs the stock branch, for A/B runs.
    """

    DRAFT_INPUT_FIELDS = ("bonus_tokens", "new_seq_lens", "verify_done")
    RESULT_FIELDS = (
        "logits_output",
        "next_token_ids",
        "can_run_cuda_graph",
        "speculative_num_draft_tokens",
        "next_draft_input",
        "accept_lens",
        "routed_experts_output",
        "indexer_topk_output",
    )
    TARGET_FORWARD_PARAMETERS = ("model_worker_batch", "forward_batch", "is_verify", "skip_attn_backend_init")
    # ``source_fingerprint`` of 0.5.12's ``EAGLEWorkerV2.verify``, the body this step mirrors (pinned
    # in the tests against the release): a tree whose verify differs (a fix, a local change) runs stock.
    VERIFY_FINGERPRINT = "dff8702beb4a030faf7d394d99c49a4ed38d590b562103c6f625220119c65c22"

    def __init__(self, module: Any, simulated_token: Optional[int], log: bool) -> None:
        self.module = module  # the release's eagle_worker_v2: its input and result classes and contexts
        self.simulated_token = simulated_token  # SGLANG_SIMULATE_ACC_LEN's token for every accepted one, or None
        self.log = log  # rank 0
        self.said_no = False  # the first batch left to the stock branch has been logged
        self.taken = 0
        self._ones: Any = None  # int32 ones, grown to the largest batch seen: accept_lens

    @classmethod
    def build(cls, worker: Any, fallback: "V2Fallback", log: bool) -> Optional["V2LeanStep"]:
        """The lean step for this worker, or None: turned off (``DYNSPEC_LEAN_STEP=0``), or not applicable (said once)."""
        if not lean_step_enabled():  # read first: a bad value refuses to start
            return None
        import sys

        module: Any = sys.modules.get(type(worker).__module__)
        why_not = cls.unfit(worker, module, fallback)
        simulated: Optional[int] = None
        if why_not is None:
            import importlib

            simulated, why_not = LeanVerify.simulated_token_of(
                importlib.import_module("sglang.srt.speculative.spec_utils")
            )
        if why_not:
            if log:
                logger.info(
                    f"dynspec: the lean fallback step does not apply, a fallback iteration runs the stock decode branch ({why_not})"
                )
            return None
        if log:
            logger.info(
                "dynspec: a fallback iteration of a greedy batch runs as a plain decode step (the release's verify "
                f"preparation and target forward, the argmax, the draft KV written directly; {LEAN_STEP_ENV}=0 turns it off)"
            )
        return cls(module, simulated, log)

    @classmethod
    def unfit(cls, worker: Any, module: Any, fallback: "V2Fallback") -> Optional[str]:
        """Why this release or server may not take the lean step (static checks); None if it may."""
        import inspect

        if not isinstance(fallback.draft_kv.direct, FallbackDirectWrite):
            return "kv-direct does not write this server's draft KV"
        classes = [
            getattr(module, name, None) for name in ("EagleVerifyInput", "EagleDraftInput", "GenerationBatchResult")
        ]
        if any(c is None for c in classes):
            return "the worker's module lacks EagleVerifyInput, EagleDraftInput or GenerationBatchResult"
        verify_input_cls, draft_input_cls, result_cls = classes
        if not callable(getattr(verify_input_cls, "prepare_for_v2_verify", None)):
            return "this release's EagleVerifyInput has no prepare_for_v2_verify"
        stock_forward = getattr(getattr(worker, "target_worker", None), "forward_batch_generation", None)
        forward: Mapping[str, Any] = {}
        try:  # on by default on every own-fallback release: a tree without these reads as unfit, not a crash
            if callable(stock_forward):
                forward = inspect.signature(stock_forward).parameters
        except (TypeError, ValueError):
            pass
        fields = [getattr(c, "__dataclass_fields__", {}) for c in (draft_input_cls, result_cls)]
        why_not = lean_step_unfit(fields[0], fields[1], forward)
        if why_not is not None:
            return why_not
        verify = method_fingerprint(type(worker), "verify")
        if verify is None:
            return "EAGLEWorkerV2.verify's source cannot be read"
        if verify != cls.VERIFY_FINGERPRINT:
            return "this EAGLEWorkerV2.verify is not 0.5.12's, the one the lean step mirrors"
        if getattr(worker, "plan_stream", None) is not None:
            return "SGLANG_ENABLE_OVERLAP_PLAN_STREAM"
        runner = worker.target_worker.model_runner
        if any(getattr(runner, name, None) is not None for name in ("hybrid_gdn_config", "mamba2_config")):
            return "a hybrid (mamba) target, whose verify updates its state"
        return None

    def refusal(self, batch: Any) -> Optional[str]:
        """Why this batch's fallback iteration must run the stock branch; None if the lean step takes it
        (0.5.12's verify sample reads the same penalties as 0.5.14+'s ``eagle_sample``)."""
        return greedy_batch_refusal(batch, LeanVerify.PENALTIES)

    def takes(self, batch: Any) -> bool:
        why_not = self.refusal(batch)
        if why_not is not None and self.log and not self.said_no:
            self.said_no = True
            logger.info(f"dynspec: a fallback batch ran the stock decode branch ({why_not}); said once")
        return why_not is None

    def step(self, worker: Any, batch: Any, fallback: "V2Fallback", fence: Optional[Tuple[Any, Any]]) -> Any:
        """One fallback iteration of ``batch`` (the ``ModelWorkerBatch``); returns the release's result."""
        import torch

        module = self.module
        device = torch.get_device_module(worker.device)
        verify_input = fallback.trivial_verify_input(batch, module.EagleVerifyInput)
        # As the stock verify: seq_lens was made on the scheduler's stream and is read on this one.
        batch.seq_lens.record_stream(device.current_stream())
        verify_input.num_tokens_per_req = 1
        batch.spec_info = verify_input
        forward_batch, can_run_cuda_graph = verify_input.prepare_for_v2_verify(
            worker.req_to_token_pool, batch, worker.target_worker
        )
        output = worker.target_worker.forward_batch_generation(
            model_worker_batch=None, forward_batch=forward_batch, is_verify=True, skip_attn_backend_init=True
        )
        logits_output = output.logits_output
        detect_nan = getattr(module, "maybe_detect_nan", None)  # as the stock verify: on with SGLANG_SPEC_NAN_DETECTION
        if callable(detect_nan):
            detect_nan(logits_output.next_token_logits, "verify: target model logits")
        predict = torch.argmax(logits_output.next_token_logits, dim=-1).to(torch.int32)
        if self.simulated_token is not None:
            predict.fill_(self.simulated_token)
        if fence is None:  # DYNSPEC_EARLY_FENCE=0: after the forward, as the stock verify
            new_seq_lens = batch.seq_lens + 1
            verify_done = device.Event()
            verify_done.record()
        else:
            new_seq_lens, verify_done = fence
        result = module.GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=predict,
            can_run_cuda_graph=can_run_cuda_graph,
            speculative_num_draft_tokens=worker.speculative_num_draft_tokens,  # 1 here (_SavedSteps)
            next_draft_input=module.EagleDraftInput(
                bonus_tokens=predict, new_seq_lens=new_seq_lens, verify_done=verify_done
            ),
            accept_lens=self.ones(int(predict.shape[0]), predict.device),
            routed_experts_output=output.routed_experts_output,
            indexer_topk_output=output.indexer_topk_output,
        )
        writer = fallback.draft_kv.direct  # None once given up
        if writer is None or not writer.write(batch, result):
            # The draft worker's own extend: feed_twin_directly's would try the writer again.
            from sglang.srt.speculative.dynspec_runtime import draft_extend_contexts

            extend = fallback.stock_extend or worker.draft_worker._draft_extend_for_decode
            with (
                draft_extend_contexts(worker.draft_worker, "draft_runner", self.module),
                fallback.draft_kv.kv_only(worker.draft_worker),
            ):
                extend(batch, result)
        self.taken += 1
        if self.taken == 1 and self.log:  # once: the evidence that it runs, in the server's log
            logger.info(f"dynspec: the lean fallback step took its first batch ({int(predict.shape[0])} requests)")
        return result

    def ones(self, rows: int, device: Any) -> Any:
        """``accept_lens`` of a one-node tree: int32 ones, a view of one buffer."""
        if self._ones is None or self._ones.shape[0] < rows:
            import torch

            size = max(rows, 2 * (0 if self._ones is None else self._ones.shape[0]))
            self._ones = torch.ones((size,), dtype=torch.int32, device=device)
        return self._ones[:rows]


def shift_for_the_draft(input_ids: Any, extend_seq_lens: Any, next_token_ids: Any) -> None:
    """In place, each request's prompt tokens one to the left and its last slot the target's next
    token: the draft reads token i + 1 beside the target's hidden state of token i. What 0.5.12's
    ``_draft_extend_for_prefill`` does with a ``torch.cat`` and a copy per request (two launches each:
    ≈ 130 for a wave of 64), in at most six for any wave. ``extend_seq_lens``: the forward batch's
    device copy of the requests' lengths, each at least 1 (a prefill extends every request it holds)."""
    import torch

    last = torch.cumsum(extend_seq_lens, dim=0) - 1  # each request's last slot (int64)
    input_ids[:-1] = input_ids[1:].clone()  # the slot before every token takes it, across requests too ...
    input_ids[last] = next_token_ids.to(input_ids.dtype)  # ... and each request's last slot is its own


class LeanKVPrefill:
    """0.5.12's own fallback (``DYNSPEC_LEAN_PREFILL``, on as ``DYNSPEC_LEAN_STEP``): the KV-only draft prefill without the per-request loop.

    While speculation is off, a prefill's draft extend runs KV-only (``V2Fallback.prefill_kv_only``):
    the draft model stops after its KV write and leaves placeholder logits (one column) and hidden
    states. The stock body still shifts the prompt tokens with a loop per request (≈ 130 launches
    for a wave of 64: the most launches a step at admission, which session 22's profile found
    host-bound) and takes a softmax and top-k of the placeholder. ``extend`` is that body with the
    shift done at once (``shift_for_the_draft``, the same ids, so the same draft KV) and the top-k
    of a single column (p 1, index 0) written directly. Only for 0.5.12's body (its tokens are
    checked at start-up, ``PREFILL_FINGERPRINT``) and drafts whose forward batch takes the ids alone
    (no n-gram embedding, no multimodal rope positions).
    """

    # ``source_fingerprint`` of 0.5.12's ``EagleDraftWorker._draft_extend_for_prefill`` (pinned in the tests).
    PREFILL_FINGERPRINT = "bb1216ed24e49432c538f5c4f3fab24110619bf729a6aee28ed57dc2a39ff7f2"

    def __init__(self, draft_worker: Any, stock: Callable[..., Any], module: Any, log: bool) -> None:
        self.draft_worker = draft_worker
        self.stock = stock  # the release's body, for a wave the one-pass shift is not known to fit
        self.module = (
            module  # the release's eagle_worker_v2: EagleDraftInput, ForwardBatch, fast_topk, maybe_detect_nan
        )
        self.log = log
        self.taken = 0

    @classmethod
    def build(cls, draft_worker: Any, stock: Callable[..., Any], log: bool) -> Optional["LeanKVPrefill"]:
        """The lean prefill for this draft worker (``stock``: its own body), or None: turned off, or
        not applicable (said once)."""
        if not lean_prefill_enabled():
            return None
        import sys

        module: Any = sys.modules.get(type(draft_worker).__module__)
        runner = getattr(draft_worker, "draft_runner", None)
        why_not: Optional[str] = None
        if any(getattr(module, name, None) is None for name in ("EagleDraftInput", "ForwardBatch", "fast_topk")):
            why_not = "the draft worker's module lacks EagleDraftInput, ForwardBatch or fast_topk"
        elif getattr(runner, "use_ngram_embedding", False) or getattr(runner, "model_is_mrope", False):
            why_not = "a draft whose forward batch reads more than the ids (n-gram embedding, multimodal rope)"
        elif method_fingerprint(type(draft_worker), "_draft_extend_for_prefill") != cls.PREFILL_FINGERPRINT:
            why_not = (
                "this EagleDraftWorker._draft_extend_for_prefill is not 0.5.12's, the one the lean prefill mirrors"
            )
        if why_not is not None:
            if log:
                logger.info(
                    f"dynspec: the lean KV-only prefill does not apply, a KV-only prefill runs the stock body ({why_not})"
                )
            return None
        if log:
            logger.info(
                f"dynspec: a KV-only prefill shifts its prompts in one pass ({LEAN_PREFILL_ENV}, as {LEAN_STEP_ENV} unless set)"
            )
        return cls(draft_worker, stock, module, log)

    def extend(self, batch: Any, target_hidden_states: Any, next_token_ids: Any, mm_input_embeds: Any = None) -> Any:
        """0.5.12's ``_draft_extend_for_prefill`` inside ``DraftKV.kv_only`` (the draft forward stops after
        its KV write): the same draft input, forward batch and KV; the placeholder's top-k made directly."""
        import torch

        if (
            min(batch.extend_seq_lens, default=0) < 1
        ):  # never in 0.5.12; the stock body would fail loudly, the shift not
            return self.stock(batch, target_hidden_states, next_token_ids, mm_input_embeds)
        module, runner = self.module, self.draft_worker.draft_runner
        next_draft_input = module.EagleDraftInput(
            hidden_states=target_hidden_states,
            bonus_tokens=next_token_ids,
            new_seq_lens=batch.seq_lens,
            num_tokens_per_req=1,  # the draft's decode mode: one token per request
            num_tokens_for_logprob_per_req=1,
        )
        batch.spec_info = next_draft_input
        forward_batch = module.ForwardBatch.init_new(batch, runner)
        forward_batch.return_logprob = False
        if mm_input_embeds is not None:
            forward_batch.mm_input_embeds = mm_input_embeds
        # After init_new, which keeps the same ids tensor and makes the lengths' device copy.
        shift_for_the_draft(forward_batch.input_ids, forward_batch.extend_seq_lens, next_token_ids)
        logits_output = runner.forward(forward_batch).logits_output
        detect_nan = getattr(module, "maybe_detect_nan", None)
        if callable(detect_nan):
            detect_nan(logits_output.next_token_logits, "draft_extend_for_prefill")
        logits = logits_output.next_token_logits
        rows = int(logits.shape[0])
        if logits.shape[-1] == 1:  # the placeholder: softmax of one logit is 1, its top-1 index 0
            next_draft_input.topk_p = torch.ones((rows, 1), dtype=torch.float32, device=logits.device)
            next_draft_input.topk_index = torch.zeros((rows, 1), dtype=torch.int64, device=logits.device)
        else:  # real logits (the stand-in gave up mid-forward): the stock body's top-k
            next_draft_input.topk_p, next_draft_input.topk_index = module.fast_topk(
                torch.softmax(logits, dim=-1), self.draft_worker.topk, dim=-1
            )
        next_draft_input.hidden_states = logits_output.hidden_states
        self.taken += 1
        if self.taken == 1 and self.log:
            logger.info(f"dynspec: the lean KV-only prefill took its first wave ({rows} requests)")
        return next_draft_input


def write_beside(worker: Any, direct: "DirectKVWrite", log: bool) -> bool:
    """Replay ``direct``'s graphs on a stream of its own (``SideStream``), and make every forward of
    the worker first wait for the last replay; False (said once) where that is not safe:

    * what ``kv_batch_unsafe`` names: PD disaggregation and a hierarchical cache move draft KV on
      streams of their own, ordered only by the scheduler's host sync on the forward's results,
      which no longer covers the write (a backup could read a row before it is written); tensor
      parallelism (the KV-only graph's collectives would run beside the target's, in an order
      each rank picks alone);
    * SGLang's plan stream, which fills pooled graph inputs without waiting for the worker's stream.

    Call it after any start-up replay (``check_rounding``), which must finish before the server
    takes requests. Left open (session 17's review): work the scheduler does while idle outside a
    forward (``release_memory_occupation``, weight updates) is not ordered after the last replay by
    anything but time: the replay takes ~0.1 ms, the host's result processing longer."""
    why_not = kv_batch_unsafe(worker)
    if why_not is None and getattr(worker, "plan_stream", None) is not None:
        why_not = "SGLANG_ENABLE_OVERLAP_PLAN_STREAM"
    if why_not is not None:
        if log:
            logger.info(
                f"dynspec: {KV_STREAM_ENV} is not used with {why_not}; the draft KV is written in the worker's stream"
            )
        return False
    import torch

    side = SideStream(torch.get_device_module(worker.device))
    direct.side = side
    stock = worker.forward_batch_generation

    def forward_batch_generation(*args: Any, **kwargs: Any) -> Any:
        side.join()
        return stock(*args, **kwargs)

    worker.forward_batch_generation = forward_batch_generation
    if log:
        logger.info(f"dynspec: kv-direct writes the draft KV on a stream of its own ({KV_STREAM_ENV}=0 turns it off)")
    return True


def feed_directly(draft_kv: Any, build: Callable[[Any], Tuple[Optional["DirectKVWrite"], str]], log: bool) -> bool:
    """``kv-direct``: make ``draft_kv.direct`` the writer ``build`` makes of its captured twin.
    False (kv-graph, and why said once) for another mode, no twin, or a twin it cannot feed."""
    from sglang.srt.speculative.dynspec_runtime import DRAFT_KV_DIRECT

    if draft_kv.mode != DRAFT_KV_DIRECT or draft_kv.graph is None:
        return False
    direct, why_not = build(draft_kv.graph)
    if direct is None:
        if log:
            logger.info(f"dynspec: {why_not}; kv-direct replays the KV-only graph through the stock extend")
        return False
    draft_kv.direct = direct
    return True


class RoundingProbe:
    """``DirectKVWrite.check_rounding``'s probe rows and the K/V they leave, as torch tensors on
    the twin's device: one block of seeded random tokens, positions and hidden states (any values
    show a different kernel), repeated to fill the largest graph, in slots 1, 2, ...; every layer's
    K and V at those slots, bit for bit."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool  # the draft runner's MHATokenToKVPool: k_buffer, v_buffer, one per layer

    @classmethod
    def of(cls, twin: Any) -> Optional["RoundingProbe"]:
        """None for a pool whose bits it would not read whole: no per-layer buffers, scales kept
        beside them (FP4), or pages laid out head-first."""
        pool = getattr(getattr(twin, "model_runner", None), "token_to_kv_pool", None)
        buffers = (getattr(pool, "k_buffer", None), getattr(pool, "v_buffer", None))
        if not all(isinstance(b, list) and b for b in buffers):
            return None
        if getattr(pool, "k_scale_buffer", None) is not None or getattr(pool, "kv_cache_layout", "nhd") != "nhd":
            return None
        return cls(pool)

    @staticmethod
    def inputs(buffers: Any, block: int, blocks: int) -> Any:
        import torch

        device = buffers.input_ids.device
        generator = torch.Generator(device=device).manual_seed(0)

        def ints(like: Any) -> Any:
            return torch.randint(0, 100, (block,), generator=generator, device=device, dtype=like.dtype)

        hidden = torch.randn((block, buffers.hidden_states.shape[1]), generator=generator, device=device)
        return SimpleNamespace(
            input_ids=ints(buffers.input_ids).repeat(blocks),  # below any vocabulary's size
            positions=ints(buffers.positions).repeat(blocks),  # below any context length
            out_cache_loc=torch.arange(1, block * blocks + 1, device=device, dtype=buffers.out_cache_loc.dtype),
            hidden_states=hidden.to(buffers.hidden_states.dtype).repeat(blocks, 1),
        )

    def slots(self) -> int:
        """The pool's slots per layer; the probe writes slots 1 to the largest graph's rows."""
        return int(min(layer.shape[0] for layer in self._layers()))

    def _layers(self) -> Tuple[Any, ...]:
        return (*self.pool.k_buffer, *self.pool.v_buffer)

    def clear(self, slots: Any) -> None:
        """Zero the slots, so that a graph that writes nothing there cannot pass for one that does."""
        for layer in self._layers():
            layer[slots] = 0

    def signature(self, slots: Any, block: int) -> Optional[List[Any]]:
        """The first block's K/V, if every block's equals it bit for bit; None if a row's bits
        depend on where in the graph it sits."""
        import torch

        first = []
        for layer in self._layers():
            rows = layer[slots].view(torch.uint8).reshape(slots.shape[0] // block, block, -1)
            if not bool((rows == rows[:1]).all()):
                return None
            first.append(rows[0].clone())
        return first

    @staticmethod
    def same(kv: List[Any], other: List[Any]) -> bool:
        import torch

        return all(torch.equal(a, b) for a, b in zip(kv, other))

    def rows(self, slots: Any) -> List[Any]:
        """Every layer's K and V at ``slots``, a row of bytes per slot (copies)."""
        import torch

        return [layer[slots].view(torch.uint8).reshape(slots.shape[0], -1).clone() for layer in self._layers()]

    @staticmethod
    def rows_differing(kv: List[Any], other: List[Any]) -> int:
        """How many slots hold other bits in ``other`` than in ``kv``, in any layer."""
        differ = None
        for a, b in zip(kv, other):
            rows = (a != b).any(dim=1)
            differ = rows if differ is None else differ | rows
        return 0 if differ is None else int(differ.sum())


KV_BITS_ENV = "DYNSPEC_CHECK_KV_BITS"


class KVBitCheck:
    """``DYNSPEC_CHECK_KV_BITS=<file>``: does the direct write leave the full extend's K/V, bit for
    bit? For ``dynspec proof``'s exact_kv, whose proposal comparison across servers cannot judge a
    write where the servers' timelines part (session 12, v1). Off by default; unset, nothing runs.

    In every fallback iteration the iteration's slots are zeroed and written directly, their K/V
    kept; zeroed again and written by the graph that packs the rows (r17's write, which on v1 can
    round apart: the check's negative control, so that a check that never sees a difference says
    so); zeroed again, and the stock (full) extend runs and stays: the server drafts as
    ``DYNSPEC_DRAFT_KV=full`` does. One JSON line per iteration (rank 0): the rows, and per write
    how many slots' bits differ from the full extend's. v1 with ``kv-direct`` only for now.
    """

    def __init__(self, probe: RoundingProbe, path: Optional[str]) -> None:
        self.probe = probe
        self.path = path  # None on ranks other than 0: they compare, rank 0 writes

    @classmethod
    def from_env(cls, twin: Any, rank0: bool) -> Optional["KVBitCheck"]:
        """None when unset; a pool whose bits it cannot read refuses to start (ValueError)."""
        path = os.environ.get(KV_BITS_ENV, "").strip()
        if not path:
            return None
        probe = RoundingProbe.of(twin) if twin is not None else None
        if probe is None:
            raise ValueError(
                f"{KV_BITS_ENV}: no KV-only graph fed directly, or a draft KV pool whose bits it cannot read"
            )
        if rank0:
            logger.warning(
                f"dynspec: {KV_BITS_ENV}: every fallback iteration writes the draft KV directly, then runs the full extend and compares their bits (a check, not for serving)"
            )
        return cls(probe, path if rank0 else None)

    def compare(self, slots: Any, writes: List[Tuple[str, Callable[[], bool]]], full_extend: Callable[[], Any]) -> Any:
        """``writes``: (name, write into ``slots``, False if it did not take the batch); then the full
        extend, whose result is returned."""
        slots = slots.clone()  # the extends may hand the batch other tensors
        kept = {}
        for name, write in writes:
            self.probe.clear(slots)
            if write():
                kept[name] = self.probe.rows(slots)
        self.probe.clear(slots)
        result = full_extend()
        if kept and self.path is not None:
            full = self.probe.rows(slots)
            entry = {
                "rows": int(slots.shape[0]),
                **{name: RoundingProbe.rows_differing(kv, full) for name, kv in kept.items()},
            }
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(entry, separators=(",", ":")) + "\n")
        return result


class DirectKVWrite:
    """``kv-direct``: the KV-only twin graph fed straight from a one-token verify's tensors.

    The stock draft extend builds a forward batch, attention metadata and top-k around the graph.
    The KV-only twin reads none of that: only four inputs, one row per request in a fallback
    iteration: the verified next tokens, their positions (the pre-verify ``seq_lens``, as the
    release's extend preparation makes them), their cache slots (the verify's ``out_cache_loc``) and
    the target's hidden states. ``write`` copies those into the twin's input buffers, pads to a
    captured size (padding rows write slot 0, the pool's reserved slot, as the stock replay pads),
    replays the graph and leaves shape-valid stand-ins where the extend's outputs would be (never
    read while off: RESUME runs the full extend). ``write`` returns False for a batch it cannot take
    (idle, above the largest captured size, other shapes); the caller then runs the stock extend
    under ``DraftKV.kv_only``.

    A release may capture the twin ``width`` tokens per request wide (0.5.10 - 0.5.13 and 0.5.17:
    the speculative width, 4 for 3 steps), and the stock replay pads each one-token request to that
    width. What the graph keeps (embedding, fc, norms, K/V projections, rope, the KV write) works
    row by row, so the direct write packs the rows instead: the graph of the smallest size whose
    ``size * width`` rows hold them, a quarter of the stock replay's rows at width 4.

    ``batch_steps`` > 1 (``DYNSPEC_KV_BATCH``, 0.5.14+) lets the rows of that many iterations wait and
    writes them in one replay: the graph's two GEMMs read their weights once for all of them. A
    replay holds only as many rows as a graph that rounds the K/V as the one-iteration replay's
    does (``check_rounding`` at start-up, ``same_rounding_rows``), so batching changes no bit. They
    wait in private copies of the four buffers, not in the twin's: a release pools graph runners'
    input buffers by name and size (``share_buffers``), so the next iteration's target replay may
    fill the same storage; ``flush`` copies them in just before the replay, as every runner does.
    Rows wait only as long as nothing could read their slots or hand them to another
    request: ``flush`` writes them before the stock extend runs (speculating, ``RESUME``), before any
    forward that is not a decode (a prefill reads cached draft KV and may take freed slots, which
    ``ZeroStepPolicy`` sees), as soon as the batch's requests change (a finished request's slots may
    go to the next step's joiner), and when the buffers are full.

    Two releases' worth of runners: ``ZeroStepDirectWrite`` (0.5.14+, the zero-step state) and
    ``FallbackDirectWrite`` (0.5.10 - 0.5.13, dynspec's own fallback). They differ in where the
    graphs and the width live, how a graph is replayed, and what stands in for the outputs.
    """

    INPUTS = ("input_ids", "positions", "out_cache_loc", "hidden_states")
    # Pools whose KV write goes to ``out_cache_loc`` as given. SWA and unified pools translate the
    # slots when the attention metadata is built, which the direct write does not rebuild.
    POOLS = ("MHATokenToKVPool",)
    # Draft-extend attention backends whose extend writes the KV with the slots as given, before any
    # kernel that reads the attention metadata the direct write does not rebuild. Triton's has run on
    # a GPU; FlashInfer's graphed draft extend writes, then attends paged (read in 0.5.12 - 0.5.23; its
    # graph exists on v1 0.5.12 and v2 0.5.14+ only; 0.5.17 ran it). Without it a fallback step
    # re-plans that extend on the host every iteration.
    BACKENDS = ("TritonAttnBackend", "FlashInferAttnBackend")
    WIDTHS: Tuple[str, ...] = ("captured_req_width", "num_tokens_per_bs")  # where runners keep it

    def __init__(self, twin: Any, log: bool = True, batch_steps: int = 1) -> None:
        self.twin = twin
        self.buffers = twin.buffers
        self.sizes = sorted(twin.capture_bs)
        self.width = int(self.width_of(twin) or 0)  # unfit() refused a twin without one
        self.capacity = self.sizes[-1] * self.width  # token rows of the largest graph
        self.log = log  # rank 0
        self.said_no = False  # a batch it could not take has been logged
        self.batch_steps = batch_steps  # iterations per replay
        self.pending = 0  # rows in the buffers not yet written, from ``pending_steps`` iterations
        self.pending_steps = 0
        self.members: List[Any] = []  # the requests those rows belong to (held, so no id is reused)
        self.staging: Any = None  # private copies of the four buffers where rows wait (batch_steps > 1)
        self.rounding: Optional[List[int]] = None  # per graph size, which graphs round alike (check_rounding)
        self.staged = False  # the pending rows are in ``staging``, not yet in the twin's buffers
        self.side: Optional[SideStream] = None  # where the graphs replay (write_beside), else the worker's stream

    @classmethod
    def width_of(cls, twin: Any) -> Optional[int]:
        """The twin's token rows per captured request; None where it says nothing of them."""
        return next((getattr(twin, name) for name in cls.WIDTHS if hasattr(twin, name)), None)

    @classmethod
    def unfit(cls, twin: Any, worker: Any) -> Optional[str]:
        """Why the direct write cannot feed ``twin`` (checks both kinds share); None if it can."""
        name = type(twin).__name__
        buffers = getattr(twin, "buffers", None)
        missing = [n for n in cls.INPUTS if getattr(buffers, n, None) is None]
        if missing:
            return f"{name} has no {missing[0]} buffer"
        width = cls.width_of(twin)
        if not isinstance(width, int) or width < 1:
            return f"{name} holds {width!r} tokens per request"  # rows past size * width would keep stale slots
        if not getattr(twin, "capture_bs", None):
            return f"{name} keeps no plain CUDA graph per batch size"
        gathers = ("require_mlp_tp_gather", "require_gathered_buffer", "require_mlp_sync")
        if any(getattr(twin, g, False) for g in gathers):
            return f"{name} gathers across data-parallel ranks"
        if read_setting(worker, "moe_a2a_backend", "none") not in (None, "none"):
            return "an all-to-all MoE backend runs hooks around the replay"
        runner = getattr(twin, "model_runner", None)
        # the runner's flag up to 0.5.13, its model config's from 0.5.14
        if getattr(runner, "model_is_mrope", False) or getattr(
            getattr(runner, "model_config", None), "model_is_mrope", False
        ):
            return "the draft takes multimodal rope positions (mrope_positions), which the direct write does not fill"
        pool = type(getattr(runner, "token_to_kv_pool", None)).__name__
        if pool not in cls.POOLS:
            return f"the draft KV pool {pool} may translate its cache slots with the attention metadata"
        backend = getattr(twin, "draft_extend_attn_backend", None)
        if backend is None:  # 0.5.10's runner reads its worker's; the write has not run there
            return f"{name} keeps no draft-extend attention backend of its own"
        if getattr(backend, "_translate_kv_loc", None) is not None:
            return "the draft-extend backend translates its cache slots with the attention metadata"
        if type(backend).__name__ not in cls.BACKENDS:
            return f"the direct write takes {', '.join(cls.BACKENDS)} only, not {type(backend).__name__}"
        return None

    def write(self, batch: Any, batch_result: Any) -> bool:
        """Write (or stage, see ``batch_steps``) the draft KV of one fallback iteration; False if
        this batch is not one it can take, after writing what was staged."""
        if self.side is not None:
            self.side.join()  # the last replay read the pooled inputs this write fills
        mode = getattr(batch, "forward_mode", None)
        if mode is None or mode.is_idle():
            self.flush()
            return False
        rows = int(batch.seq_lens.shape[0])
        hidden = getattr(batch_result.logits_output, "hidden_states", None)
        b = self.buffers
        if not self.fits(rows, hidden, batch_result.next_token_ids.shape[0], batch.out_cache_loc.shape[0]):
            self.flush()
            if self.log and not self.said_no:  # once: a release whose verify hands other shapes shows here
                self.said_no = True
                logger.info(
                    f"dynspec: kv-direct left a batch of {rows} requests to the stock extend (hidden states "
                    f"{None if hidden is None else tuple(hidden.shape)}, {batch_result.next_token_ids.shape[0]} "
                    f"tokens, {batch.out_cache_loc.shape[0]} slots; graphs up to {self.capacity} rows)"
                )
            return False
        steps, limit = self.batch_steps, 0
        if steps > 1:
            members = self.members_of(batch)
            limit = self.same_rounding_rows(rows)
            if members is None or limit < 2 * rows:
                steps = 1  # who the rows belong to is unknown, or two iterations would not round alike
            if self.pending and (
                steps == 1 or members is None or self.pending + rows > limit or not self._same(members)
            ):
                self.flush()
            self.members = members or []
        at = self.pending  # 0 unless rows wait in staging (steps > 1)
        # The last iteration of this replay: the steps are done, or the next would not fit.
        last = steps == 1 or self.pending_steps + 1 >= steps or at + 2 * rows > limit
        into = b if at == 0 and last else self._staging()
        into.input_ids[at : at + rows].copy_(batch_result.next_token_ids)
        into.positions[at : at + rows].copy_(batch.seq_lens)
        into.out_cache_loc[at : at + rows].copy_(batch.out_cache_loc)
        into.hidden_states[at : at + rows].copy_(hidden)
        self.staged = into is not b
        self.pending += rows
        self.pending_steps += 1
        self.inputs_read()
        if last:
            self._replay_pending()  # on the side stream, if any, not waited for: nothing reads it yet
        self.stand_in(batch, batch_result)
        return True

    def fits(self, rows: int, hidden: Any, tokens: int, slots: int) -> bool:
        """Whether an iteration of ``rows`` requests is one the writer takes: some rows, no more
        than the largest graph holds, one token, slot and hidden state of the twin's width each."""
        return (
            0 < rows <= self.capacity
            and hidden is not None
            and tuple(hidden.shape) == (rows, self.buffers.hidden_states.shape[1])
            and tokens == rows
            and slots == rows
        )

    def check_rounding_unless(self, why_not: Optional[str]) -> Optional[str]:
        """Run ``check_rounding`` at start-up unless ``why_not`` already says it may not run; what
        kept it from running or made it fail (``rounding`` then None), None once it ran."""
        probe = RoundingProbe.of(self.twin) if why_not is None else None
        if why_not is None and probe is None:
            why_not = "a draft KV pool without per-layer k_buffer and v_buffer (the start-up check reads them)"
        slots = probe.slots() if probe is not None else 0
        if probe is not None and slots <= self.capacity:
            why_not = f"a draft KV pool of {slots} slots (the start-up check writes slots 1 to {self.capacity})"
        elif probe is not None:
            try:
                self.check_rounding(probe)
            except Exception as error:  # noqa: BLE001 - the callers serve without the check's numbers
                self.rounding = None
                why_not = f"a start-up rounding check that failed ({error!r})"
        return why_not

    def check_rounding(self, probe: "RoundingProbe") -> List[int]:
        """Replay every graph on the same probe rows and number the K/V each leaves: graphs with one
        number (0, 1, ...) round alike (read by ``same_rounding_rows`` and by v1's
        ``StockGraphDirectWrite``). Run once at start-up, before any request: the probe block (as
        many rows as the smallest graph holds) fills each graph, repeated, in slots 1, 2, ..., free
        then; a graph in which the same block rounds differently at another row gets a number of
        its own below 0 and takes no batch.

        A GEMM's kernel may change with its row count, and with it the low bits of every row
        (session 9 on the H200: 8 iterations per replay, up to 160 rows where one iteration packs
        20, changed 2 of 1056 proposals); a kernel that splits its sums by tile could round a row
        by where it sits. A batched replay moves rows both ways, so both are checked.
        """
        block = self.sizes[0] * self.width
        probe_rows = probe.inputs(self.buffers, block, self.capacity // block)
        seen: List[Any] = []
        numbers: List[int] = []
        for index, size in enumerate(self.sizes):
            filled = size * self.width // block * block  # whole blocks; the rest pads to slot 0
            self._fill(filled, size * self.width, probe_rows)
            slots = probe_rows.out_cache_loc[:filled]
            probe.clear(slots)
            self.replay(size)
            kv = probe.signature(slots, block)
            if kv is None:
                numbers.append(-1 - index)
                continue
            number = next((n for n, other in enumerate(seen) if probe.same(kv, other)), len(seen))
            if number == len(seen):
                seen.append(kv)
            numbers.append(number)
        self.rounding = numbers
        return numbers

    def same_rounding_rows(self, rows: int) -> int:
        """The most token rows one replay may hold when one iteration brings ``rows``: those of the
        largest graph, from the one this iteration alone would replay upwards, that rounds as that
        one does (``check_rounding``); 0 where nothing was checked, no graph holds the rows, or
        that graph rounds rows by where they sit."""
        if self.rounding is None:
            return 0
        at = self._graph_for(rows)
        if at == len(self.sizes) or self.rounding[at] < 0:
            return 0
        end = at
        while end + 1 < len(self.sizes) and self.rounding[end + 1] == self.rounding[at]:
            end += 1
        return int(self.sizes[end] * self.width)

    def rounding_groups(self) -> str:
        """The checked graphs (by captured batch size) as runs, each with its number (``check_rounding``;
        ``by-row`` where rows round by where they sit), for the start-up log: ``1-12:0 | 14-128:1``."""
        if not self.rounding:
            return "unchecked"
        runs: List[Tuple[int, int, int]] = []  # (number, first size, last size)
        for size, number in zip(self.sizes, self.rounding):
            if runs and runs[-1][0] == number:
                runs[-1] = (number, runs[-1][1], size)
            else:
                runs.append((number, size, size))
        return " | ".join(
            f"{first if first == last else f'{first}-{last}'}:{number if number >= 0 else 'by-row'}"
            for number, first, last in runs
        )

    def flush(self) -> None:
        """Write the staged rows before something else runs: the worker's stream waits for them."""
        self._replay_pending()
        if self.side is not None:
            self.side.join()

    def _replay_pending(self) -> None:
        """The staged rows padded to the smallest graph that holds them (padding rows write slot 0,
        the pool's reserved slot, as the stock replay pads), and that graph replayed."""
        rows = self.pending
        if rows == 0:
            return
        size = self.sizes[self._replay_index(rows)]
        self._fill(rows, size * self.width, self.staging if self.staged else None)
        self.replay(size)
        self.pending = self.pending_steps = 0
        self.members = []
        self.staged = False

    def _graph_for(self, rows: int) -> int:
        """The index in ``sizes`` of the smallest graph whose ``size * width`` rows hold ``rows``
        (``len(sizes)`` when none does)."""
        return bisect.bisect_left(self.sizes, -(-rows // self.width))

    def _replay_index(self, rows: int) -> int:
        """The index in ``sizes`` of the graph a replay of ``rows`` rows uses: the smallest that
        holds them (``StockGraphDirectWrite`` picks by rounding)."""
        return self._graph_for(rows)

    def _fill(self, rows: int, padded: int, source: Any = None) -> None:
        """The twin's buffers for a replay of ``padded`` rows: the first ``rows`` copied from
        ``source`` (None: already there), the rest padding that writes slot 0, the pool's reserved
        slot, as the stock replay pads."""
        if source is not None:
            for name in self.INPUTS:
                getattr(self.buffers, name)[:rows].copy_(getattr(source, name)[:rows])
        if padded > rows:
            for name in ("input_ids", "positions", "out_cache_loc"):
                getattr(self.buffers, name)[rows:padded].zero_()

    def _staging(self) -> Any:
        if self.staging is None:  # once, at the first staged row: capacity rows of each input
            self.staging = SimpleNamespace(**{name: getattr(self.buffers, name).clone() for name in self.INPUTS})
        return self.staging

    @staticmethod
    def members_of(batch: Any) -> Optional[List[Any]]:
        """The batch's requests, in order (a ``ScheduleBatch``'s ``reqs``); None where the batch does
        not carry them (0.5.12's ``ModelWorkerBatch``): then nothing waits."""
        reqs = getattr(batch, "reqs", None)
        return list(reqs) if isinstance(reqs, list) else None

    def _same(self, members: List[Any]) -> bool:
        return len(members) == len(self.members) and all(a is b for a, b in zip(members, self.members))

    def inputs_read(self) -> None:
        """Called once an iteration's inputs are copied (they may be freed or rewritten after)."""

    def replay(self, size: int) -> None:
        if self.side is None:
            self.replay_graph(size)
        else:
            self.side.run(lambda: self.replay_graph(size))

    def replay_graph(self, size: int) -> None:
        raise NotImplementedError

    def stand_in(self, batch: Any, batch_result: Any) -> None:
        raise NotImplementedError


class ZeroStepDirectWrite(DirectKVWrite):
    """0.5.14+: graphs in a full-graph backend, upstream's skip stubs for the outputs.

    It also publishes the read-done event the scheduler's WAR barrier waits on, which the stock
    graph runner publishes once its inputs are copied; without it the barrier waits for the whole
    forward.
    """

    # Graph backends whose replay is the captured graph alone; a breakable graph runs eager pieces
    # between its parts, a piecewise one compiles: neither is only its buffers and a replay.
    GRAPH_BACKENDS = ("FullCudaGraphBackend",)
    # The draft runner's read-done mailbox: named so in 0.5.18+, and before that.
    READ_DONE_EVENTS = ("shared_read_done_event", "war_fastpath_read_done_event")

    def __init__(
        self, twin: Any, worker: Any, read_done: Optional[str], log: bool = True, batch_steps: int = 1
    ) -> None:
        super().__init__(twin, log, batch_steps)
        self.worker = worker  # its _stub_skipped_draft_extend stands in for the extend's outputs
        self.backend = twin.backend  # its replay(key, batch) replays that key's graph, batch unread
        self.runner = twin.model_runner
        self.read_done = read_done  # the runner's read-done attribute, or None: the coarse barrier
        self.new_event = twin.device_module.Event if read_done is not None else None
        self._stubs: Optional[Dict[str, Any]] = None  # name -> the stub made at capacity (stand_in), {} if it cannot be

    @classmethod
    def build(cls, twin: Any, worker: Any, log: bool = True) -> Tuple[Optional["ZeroStepDirectWrite"], str]:
        """The writer, or None and why not: the twin must hold plain CUDA graphs, one per batch size,
        fed from the four buffers, on a pool that writes where ``out_cache_loc`` says."""
        why_not = cls.unfit(twin, worker)
        if why_not is not None:
            return None, why_not
        name = type(twin).__name__
        backend = getattr(twin, "backend", None)
        if type(backend).__name__ not in cls.GRAPH_BACKENDS:
            return None, f"{name} replays through {type(backend).__name__}, not a plain CUDA graph per batch size"
        graphs = getattr(backend, "_graphs", None)
        if not isinstance(graphs, dict) or not hasattr(twin, "_make_graph_key"):
            return None, f"{name} keeps no plain CUDA graph per batch size"
        if any(twin._make_graph_key(size) not in graphs for size in twin.capture_bs):
            return None, f"{name} has not captured a graph for every batch size it lists"
        if not callable(getattr(worker, "_stub_skipped_draft_extend", None)):
            return None, "this EAGLEWorkerV2 has no _stub_skipped_draft_extend"
        # Outputs of the extend that the stubs do not stand in for.
        if getattr(getattr(worker, "draft_worker", None), "seed_dsa_topk_from_draft_extend", False):
            return None, "the draft extend seeds the DSA indexer's top-k"
        if read_setting(worker, "speculative_use_rejection_sampling", False):
            return None, "rejection sampling keeps the draft extend's probabilities"
        runner = twin.model_runner
        read_done = next((a for a in cls.READ_DONE_EVENTS if hasattr(runner, a)), None)
        if not callable(getattr(getattr(twin, "device_module", None), "Event", None)):
            read_done = None
        return cls(twin, worker, read_done, log, kv_batch_steps()), ""

    def inputs_read(self) -> None:
        if self.new_event is not None and self.read_done is not None:
            event = self.new_event()
            event.record()
            setattr(self.runner, self.read_done, event)

    def replay_graph(self, size: int) -> None:
        self.backend.replay(self.twin._make_graph_key(size), None)

    def stand_in(self, batch: Any, batch_result: Any) -> None:
        """The stubs of upstream's skip switch, as views of ones made once for the largest batch.

        The stub allocates and zero-fills three tensors of ``rows`` rows each, every iteration; they
        are only ever read (the future map copies them; nothing writes them in place, pinned in the
        tests), so rows of one set made at the capacity serve every batch size. Where the stub takes
        more than a batch size (a release that reads other fields), it runs every iteration as before.
        """
        rows = int(batch.seq_lens.shape[0])
        stubs = self._stubs if self._stubs is not None else self._make_stubs()
        if not stubs:
            self.worker._stub_skipped_draft_extend(batch, batch_result)
            return
        target = batch_result.next_draft_input
        for name, value in stubs.items():
            setattr(target, name, value[:rows])

    def _make_stubs(self) -> Dict[str, Any]:
        """Run the release's stub once for ``capacity`` rows, on stand-ins that carry only that size;
        {} (per-iteration stubs) if it wants more or makes something that is not rows of that size."""
        rows = self.capacity
        scratch = SimpleNamespace(next_draft_input=SimpleNamespace())
        try:
            self.worker._stub_skipped_draft_extend(SimpleNamespace(seq_lens=SimpleNamespace(shape=(rows,))), scratch)
        except Exception:  # noqa: BLE001 - the stock call per iteration still works
            self._stubs = {}
            return self._stubs
        made = dict(vars(scratch.next_draft_input))
        fit = all(len(getattr(v, "shape", ())) >= 1 and v.shape[0] == rows for v in made.values())
        self._stubs = made if made and fit else {}
        return self._stubs


class SideStream:
    """A stream beside the worker's for the one piece of a fallback iteration nothing waits for.

    A fallback iteration's draft KV write is its last GPU work, and nothing reads the draft KV
    before speculation resumes. In the worker's stream the next iteration's target forward queues
    behind it; here it can run in the gap while the host prepares that iteration (session 17's
    profile at 64 requests, 0.5.12: the GPU idles 0.4 ms a step, the write is about 0.1 ms).

    Ordering is kept with events, never by blocking the host: ``run`` makes this stream wait for
    the worker's copies into the graph's inputs, and ``join`` makes the worker's stream wait for
    the last replay before anything else runs there. That is needed before any later forward of
    the worker: the inputs are pooled with other runners' (``share_buffers``), the graphs share one
    memory pool, and a finished request's slots may go to a prefill that writes their draft KV.
    """

    def __init__(self, device_module: Any) -> None:
        self.device_module = device_module  # torch.cuda, or the release's device module
        self.stream = device_module.Stream()  # on the worker's device, current when it is built
        # Named, so that each step's look-up of the worker's stream skips resolving the current
        # device (torch's Python path for that reads the environment): twice a step, on the host.
        self.device: Optional[int] = getattr(self.stream, "device_index", None)
        self.done: Any = None  # an event after the last replay, until the worker's stream waits for it

    def run(self, work: Callable[[], None]) -> None:
        self.stream.wait_stream(self.device_module.current_stream(self.device))
        with self.device_module.stream(self.stream):
            work()
        done = self.device_module.Event()
        done.record(self.stream)
        self.done = done

    def join(self) -> None:
        done, self.done = self.done, None
        if done is not None:
            self.device_module.current_stream(self.device).wait_event(done)


class FallbackDirectWrite(DirectKVWrite):
    """0.5.10 - 0.5.13 (dynspec's own fallback): ``graphs[size]`` are ``torch.cuda.CUDAGraph``s.

    The stock ``_draft_extend_for_decode`` ends by setting ``next_draft_input``'s ``topk_p``,
    ``topk_index`` and ``hidden_states``; the scheduler copies them into its future map. The stand-ins
    are what the eager KV-only extend leaves there: top-k of one placeholder logit (p 1, index 0)
    and zero hidden states of the draft's width, one row per request. They are only ever read (the
    future map and v1's next iteration copy or index them; nothing writes them in place, pinned in
    the tests), so, as ``ZeroStepDirectWrite``'s, they are rows of one set made for the largest
    batch: three allocations and fills a step fewer on a host path that bounds the step at admission.
    """

    WIDTHS = ("num_tokens_per_bs",)

    def __init__(self, twin: Any, hidden: Tuple[int, Any], log: bool = True) -> None:
        super().__init__(twin, log)
        self.graphs = twin.graphs
        self.hidden_width, self.hidden_dtype = hidden  # of the draft model's hidden states
        self._stand_ins: Optional[Tuple[Any, Any, Any]] = None  # topk_p, topk_index, hidden_states: capacity rows

    @classmethod
    def build(
        cls, twin: Any, worker: Any, draft_kv: Any, log: bool = True
    ) -> Tuple[Optional["FallbackDirectWrite"], str]:
        why_not = cls.unfit(twin, worker)
        if why_not is not None:
            return None, why_not
        name = type(twin).__name__
        graphs = getattr(twin, "graphs", None)
        if not isinstance(graphs, dict) or any(size not in graphs for size in twin.capture_bs):
            return None, f"{name} has not captured a graph for every batch size it lists"
        return cls(twin, draft_kv.hidden_states_of_a_row(), log), ""

    def replay_graph(self, size: int) -> None:
        self.graphs[size].replay()

    def stand_in(self, batch: Any, batch_result: Any) -> None:
        rows = int(batch.seq_lens.shape[0])  # at most capacity: write() took the batch (fits)
        if self._stand_ins is None:
            import torch

            device = batch_result.next_token_ids.device  # the worker's, the same every iteration
            self._stand_ins = (
                torch.ones((self.capacity, 1), dtype=torch.float32, device=device),
                torch.zeros((self.capacity, 1), dtype=torch.int64, device=device),
                torch.zeros((self.capacity, self.hidden_width), dtype=self.hidden_dtype, device=device),
            )
        topk_p, topk_index, hidden_states = self._stand_ins
        stand_in = batch_result.next_draft_input
        stand_in.topk_p, stand_in.topk_index, stand_in.hidden_states = (
            topk_p[:rows],
            topk_index[:rows],
            hidden_states[:rows],
        )


class StockGraphDirectWrite(FallbackDirectWrite):
    """v1's (0.5.12) direct write: ``FallbackDirectWrite`` in graphs that round the K/V as the stock
    extend's graph does.

    The own fallback's stock extend runs eagerly while off (``_SavedSteps``), one row per request,
    and packing the rows into the smallest graph that holds them keeps about that row count. v1
    keeps its graph: a fallback iteration's stock extend replays the graph for the batch's request
    count, the tokens at the front of its ``size * width`` rows. Packed into a quarter of those
    rows, the twin's GEMMs run at another row count, where cuBLAS may take another kernel and round
    the K/V's low bits apart: on the H200 (session 11) 3 of 1038 proposals after resume differed
    from the full extend's, at near ties where the no-write control differed too.

    So a batch of ``n`` requests replays the smallest twin graph, from the packed one up to the
    stock one, that the start-up check (``check_rounding``) numbered as the stock one; its K/V are
    then those the stock extend writes, bit for bit. Without a check (tensor parallelism, where
    every rank must replay the same graph for the collectives in it; a pool the probe cannot read;
    a check that failed) it replays the stock graph itself. A batch the stock extend runs eagerly
    (more requests than the largest graph holds; with ``--disable-cuda-graph-padding``, a count with
    no graph of its own) goes to the stock extend (``DraftKV.kv_only``), eager too. The twin must
    have the stock graph's sizes and width, since it stands for it.
    """

    def __init__(self, twin: Any, hidden: Tuple[int, Any], log: bool = True) -> None:
        super().__init__(twin, hidden, log)
        self.replay_index: List[int] = [self.stock_index(n) for n in range(self.sizes[-1] + 1)]
        self.unpadded = bool(
            getattr(twin, "disable_padding", False)
        )  # the stock extend runs a count without a graph eagerly
        self.packed = False  # KVBitCheck's control: replay the graph that packs the rows instead

    @classmethod
    def build(
        cls, twin: Any, worker: Any, draft_kv: Any, log: bool = True
    ) -> Tuple[Optional["FallbackDirectWrite"], str]:
        direct, why_not = super().build(twin, worker, draft_kv, log)
        if not isinstance(direct, StockGraphDirectWrite):
            return direct, why_not
        stock = getattr(worker, "cuda_graph_runner_for_draft_extend", None)
        same = ("capture_bs", "disable_padding")
        if (
            any(getattr(stock, name, None) != getattr(twin, name, None) for name in same)
            or cls.width_of(stock) != direct.width
        ):
            return (
                None,
                f"the KV-only graphs differ from the stock draft-extend graphs in their sizes or width ({type(stock).__name__})",
            )
        direct.round_as_stock(worker)
        return direct, why_not

    def stock_index(self, requests: int) -> int:
        """The index in ``sizes`` of the graph the stock extend replays for ``requests`` requests."""
        return bisect.bisect_left(self.sizes, requests)

    def round_as_stock(self, worker: Any) -> None:
        """Run the start-up check where it may run, then fill ``replay_index``: per request count,
        the graph to replay (``stock_alike``). At start-up only: the probe writes free slots."""
        tp = _tensor_parallel(worker)
        # Without the check's numbers every batch replays the stock graph itself, which is exact.
        why_not = self.check_rounding_unless(
            "tensor parallelism (every rank must replay the same graph)" if tp else None
        )
        self.replay_index = [self.stock_alike(n) for n in range(self.sizes[-1] + 1)]
        if self.log:
            if why_not is None:
                how = f"checked at start-up, by requests of {self.width} rows: {self.rounding_groups()}"
            else:
                how = f"the stock graph itself: no start-up check with {why_not}"
            logger.info(
                f"dynspec: kv-direct replays, for n requests, the smallest KV-only graph that rounds as the stock extend's graph for n ({how})"
            )

    def stock_alike(self, requests: int) -> int:
        """The smallest graph, from the one that packs the rows up to the stock one, that
        ``check_rounding`` numbered as the stock one; the stock one where nothing was checked or
        it rounds rows by where they sit (then only the stock layout is known to be exact)."""
        stock = self.stock_index(requests)
        if self.rounding is None or self.rounding[stock] < 0:
            return stock
        return next(i for i in range(self._graph_for(requests), stock + 1) if self.rounding[i] == self.rounding[stock])

    def fits(self, rows: int, hidden: Any, tokens: int, slots: int) -> bool:
        eager = rows > self.sizes[-1] or (self.unpadded and rows not in self.graphs)
        return not eager and super().fits(rows, hidden, tokens, slots)

    def _replay_index(self, rows: int) -> int:
        if self.packed:
            return self.packed_index(rows)
        return self.replay_index[rows]  # one iteration's rows, one per request: fits() bounds them

    def packed_index(self, rows: int) -> int:
        """The graph that packs ``rows`` (r17's choice; ``packing``'s)."""
        return self._graph_for(rows)

    @contextlib.contextmanager
    def packing(self) -> Iterator[None]:
        """Writes in here replay the graph that packs the rows (``KVBitCheck``'s control)."""
        self.packed = True
        try:
            yield
        finally:
            self.packed = False
