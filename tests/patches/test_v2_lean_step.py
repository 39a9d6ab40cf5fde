"""``V2LeanStep`` (0.5.12's own fallback, on unless ``DYNSPEC_LEAN_STEP=0``): what it assumes of 0.5.12, and what it does.

The lean step replaces a fallback iteration's stock decode branch (``draft()``, ``verify()``, the
draft extend) by the verify's preparation, the target forward, the argmax, the result 0.5.12's
verify builds, and the direct write. That is right only while 0.5.12:

1. calls in its verify nothing but what the lean step calls, or what a batch it takes never reaches
   (grammar, logprobs, a hybrid target, the plan stream, an idle batch) or what a one-node tree
   makes needless (the tree sample, the gather and the Triton launch of the bonus tokens);
2. builds its result and next draft input with exactly the fields the lean step sets, and runs the
   target forward with the same arguments;
3. runs, in the decode branch, ``draft()``, ``verify()`` and the draft extend and nothing else a
   lean batch reaches;
4. has the shapes ``lean_step_unfit`` recognises, which 0.5.11 and 0.5.13 do not;
5. writes none of ``next_token_ids``, ``bonus_tokens`` and ``accept_lens`` in place (the argmax is
   both the first two, the third is views of one buffer);
6. is the verify whose tokens ``VERIFY_FINGERPRINT`` holds, as the server reads them (``inspect.getsource``).

Each checker takes source text and returns its problems: ``[]`` on 0.5.12, non-empty on a mutated
source (the negative controls). The behaviour tests run the step on stand-ins for SGLang's objects.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib.util
import inspect
import logging
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from patcher.releases import unpacked
from patches.runtime import dynspec_runtime as runtime
from patches.runtime import dynspec_v2 as v2
from tests.patches.fake_draft import EagleDraftInput
from tests.patches.patched_package import install_patched_package
from tests.patches.test_lean_verify_releases import inplace_write_problems, scanned_sources

VERSION = "0.5.12"
WORKER = "srt/speculative/eagle_worker_v2.py"
EAGLE_INFO = "srt/speculative/eagle_info.py"
RESULTS = "srt/managers/utils.py"
TP_WORKER = "srt/managers/tp_worker.py"


def source_of(version: str, member: str) -> str:
    return (unpacked(version, [member]) / "sglang" / member).read_text()


def method_of(source: str, cls: str, name: str) -> ast.FunctionDef:
    classdef = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(n for n in classdef.body if isinstance(n, ast.FunctionDef) and n.name == name)


def calls_in(nodes: list[ast.AST]) -> set[str]:
    return {ast.unparse(n.func) for node in nodes for n in ast.walk(node) if isinstance(n, ast.Call)}


def call_problems(calls: set[str], mirrored: set[str], skipped: dict[str, str]) -> list[str]:
    """Calls neither mirrored nor skipped for a reason, and mirrored calls that are gone."""
    return sorted(f"calls {c}" for c in calls - mirrored - set(skipped)) + sorted(f"no {c}" for c in mirrored - calls)


# -- 1. the verify's calls ---------------------------------------------------------------------------

VERIFY_MIRRORED = {
    "batch.seq_lens.record_stream",
    "torch.get_device_module",
    "torch.get_device_module(self.device).current_stream",
    "verify_input.prepare_for_v2_verify",
    "self.target_worker.forward_batch_generation",
    "verify_input.sample",  # the argmax (LeanVerify.simulated_token_of for SGLANG_SIMULATE_ACC_LEN)
    "torch.get_device_module(self.device).Event",
    "verify_done.record",  # or the early fence's
    "EagleDraftInput",
    "GenerationBatchResult",
    "len",
    "maybe_detect_nan",  # the module's, on the target's logits
}
GRAMMAR, PLAN_STREAM = "grammar: refused", "the plan stream: refused (unfit)"
VERIFY_SKIPPED = {
    "batch.forward_mode.is_idle": "an idle batch never falls back (should_fall_back)",
    "torch.empty": "an idle batch's bonus tokens",
    "torch.empty_like": "the bonus tokens' buffer: the argmax is a one-node tree's bonus token",
    "fill_bonus_tokens[bs,]": "the same",
    "compute_spec_v2_logprobs": "logprobs: refused",
    "self._mamba_verify_update": "a hybrid target: refused (unfit)",
    "generate_token_bitmask": GRAMMAR,
    "vocab_mask.to": GRAMMAR,
    "verify_input.retrieve_next_token.cpu": GRAMMAR,
    "verify_input.retrieve_next_sibling.cpu": GRAMMAR,
    "verify_input.draft_token.view": GRAMMAR,
    "verify_input.draft_token.view(verify_input.retrieve_next_token.shape).cpu": GRAMMAR,
    "self.plan_stream.wait_event": PLAN_STREAM,
    "hasattr": PLAN_STREAM,
    "getattr": PLAN_STREAM,
    "torch.get_device_module(self.device).current_stream().wait_stream": PLAN_STREAM,
    "self.target_worker.model_runner.attn_backend.update_verify_buffers_to_fill_after_draft": PLAN_STREAM,
    "verify_forward_batch.compute_spec_mrope_positions": PLAN_STREAM,
}


def verify_call_problems(source: str) -> list[str]:
    return call_problems(calls_in([method_of(source, "EAGLEWorkerV2", "verify")]), VERIFY_MIRRORED, VERIFY_SKIPPED)


# -- 2. what the verify builds and how it runs the target ---------------------------------------------


def keywords_of(source: str, func: str) -> list[dict[str, str]]:
    verify = method_of(source, "EAGLEWorkerV2", "verify")
    return [
        {k.arg or "**": ast.unparse(k.value) for k in n.keywords}
        for n in ast.walk(verify)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == func
    ]


def build_problems(source: str) -> list[str]:
    problems = []
    results = [set(k) for k in keywords_of(source, "GenerationBatchResult")]
    if results != [set(v2.V2LeanStep.RESULT_FIELDS)]:
        problems.append(f"GenerationBatchResult with {results}")
    inputs = [set(k) for k in keywords_of(source, "EagleDraftInput")]
    if inputs != [set(v2.V2LeanStep.DRAFT_INPUT_FIELDS)]:
        problems.append(f"EagleDraftInput with {inputs}")
    forward = keywords_of(source, "self.target_worker.forward_batch_generation")
    expected = {
        "model_worker_batch": "None",
        "forward_batch": "verify_forward_batch",
        "is_verify": "True",
        "skip_attn_backend_init": "True",
    }
    if forward != [expected]:
        problems.append(f"the target forward with {forward}")
    verify = method_of(source, "EAGLEWorkerV2", "verify")
    prepare = [
        [ast.unparse(a) for a in n.args]
        for n in ast.walk(verify)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "verify_input.prepare_for_v2_verify"
    ]
    if prepare != [["self.req_to_token_pool", "batch", "self.target_worker"]]:
        problems.append(f"prepare_for_v2_verify with {prepare}")
    steps = [
        ast.unparse(n)
        for n in ast.walk(verify)
        if isinstance(n, ast.Assign) and "num_tokens_per_req" in ast.unparse(n.targets[0])
    ]
    if steps != ["verify_input.num_tokens_per_req = self.speculative_num_steps + 1"]:  # 1 in a fallback iteration
        problems.append(f"num_tokens_per_req set by {steps}")
    return problems


# -- 3. the decode branch ----------------------------------------------------------------------------

BRANCH_MIRRORED = {
    "self.draft_worker.draft",  # the hook returns the one-node tree: trivial_verify_input
    "self.verify",
    "self.draft_worker._draft_extend_for_decode",  # the direct write, else this KV-only
    "self.draft_worker.draft_tp_context",  # around the stock extend only
    "speculative_moe_backend_context",
    "speculative_moe_a2a_backend_context",
    "verify_input.is_verify_input",
}
NO_DRAFT_INPUT = "a batch without a draft input never falls back (should_fall_back)"
BRANCH_SKIPPED = {
    "EagleDraftInput.create_idle_input": NO_DRAFT_INPUT,
    "EagleDraftInput.dtype_for": NO_DRAFT_INPUT,
    "EagleDraftInput.hidden_size_for": NO_DRAFT_INPUT,
    "self.speculative_algorithm.is_standalone": NO_DRAFT_INPUT,
    "self._draft_done_event.record": PLAN_STREAM,
    "torch.get_device_module": PLAN_STREAM,
    "torch.get_device_module(self.device).Event": PLAN_STREAM,
}


def branch_problems(source: str) -> list[str]:
    """The decode branch: the ``else`` of ``forward_batch_generation``'s first ``if`` (extend or not)."""
    function = method_of(source, "EAGLEWorkerV2", "forward_batch_generation")
    branch = next(n for n in function.body if isinstance(n, ast.If))
    if "is_extend" not in ast.unparse(branch.test):
        return [f"the first branch tests {ast.unparse(branch.test)}"]
    return call_problems(calls_in(list(branch.orelse)), BRANCH_MIRRORED, BRANCH_SKIPPED)


# -- 4. the shapes the runtime recognises ------------------------------------------------------------


def dataclass_fields(source: str, cls: str) -> set[str]:
    classdef = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls)
    return {ast.unparse(n.target) for n in classdef.body if isinstance(n, ast.AnnAssign)}


def release_shapes(version: str) -> tuple[set[str], set[str], list[str]]:
    forward = method_of(source_of(version, TP_WORKER), "TpModelWorker", "forward_batch_generation")
    return (
        dataclass_fields(source_of(version, EAGLE_INFO), "EagleDraftInput"),
        dataclass_fields(source_of(version, RESULTS), "GenerationBatchResult"),
        [a.arg for a in forward.args.args[1:]],
    )


@pytest.mark.releases
def test_the_verify_calls_only_what_the_lean_step_calls_or_never_reaches() -> None:
    assert verify_call_problems(source_of(VERSION, WORKER)) == []


@pytest.mark.releases
def test_the_verify_builds_what_the_lean_step_builds() -> None:
    assert build_problems(source_of(VERSION, WORKER)) == []


@pytest.mark.releases
def test_the_decode_branch_runs_draft_verify_and_the_extend() -> None:
    assert branch_problems(source_of(VERSION, WORKER)) == []


@pytest.mark.releases
@pytest.mark.parametrize(
    ("version", "why_not"),
    [
        ("0.5.11", "this release's EagleDraftInput has no bonus_tokens"),
        ("0.5.12", None),
        (
            "0.5.13",
            "this release's EagleDraftInput has no new_seq_lens",
        ),  # and its target forward takes the schedule batch
    ],
)
def test_only_0512s_shapes_are_taken(version: str, why_not: str | None) -> None:
    assert v2.lean_step_unfit(*release_shapes(version)) == why_not


def method_lines(source: str, cls: str = "EAGLEWorkerV2", name: str = "verify") -> str:
    """A method of 0.5.12 as its file holds it: the lines ``inspect.getsource`` returns."""
    node = method_of(source, cls, name)
    return "".join(source.splitlines(keepends=True)[node.lineno - 1 : node.end_lineno])


def verify_lines(source: str) -> str:
    return method_lines(source)


def class_with(lines: str, directory: Path, cls: str = "EAGLEWorkerV2") -> type:
    """A class ``cls``, imported from a file, whose one method is ``lines`` (never called)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "lean_step_worker.py"
    path.write_text(
        f"from __future__ import annotations\n\n\nclass {cls}:\n"
        + lines
        + "\n    # a comment after it\n\n    def after(self):\n        pass\n"
    )
    spec = importlib.util.spec_from_file_location(f"lean_step_worker_{abs(hash(lines))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, cls)


def worker_class_with(verify: str, directory: Path) -> type:
    return class_with(verify, directory)


@pytest.mark.releases
def test_the_fingerprint_is_0512s_verify_as_the_server_reads_it(tmp_path: Path) -> None:
    lines = verify_lines(source_of(VERSION, WORKER))
    assert v2.source_fingerprint(lines) == v2.V2LeanStep.VERIFY_FINGERPRINT
    # inspect.getsource, as unfit() reads it in the server, sees the same tokens
    assert (
        v2.source_fingerprint(inspect.getsource(worker_class_with(lines, tmp_path).verify))
        == v2.V2LeanStep.VERIFY_FINGERPRINT
    )


@pytest.mark.releases
def test_the_fingerprint_sees_code_not_layout() -> None:
    """The control: a changed statement changes it; comments, blank lines and indentation do not."""
    lines = verify_lines(source_of(VERSION, WORKER))
    relaid = lines.replace("        # Parse args\n", "\n        # parse the arguments\n\n")
    assert relaid != lines and v2.source_fingerprint(relaid) == v2.V2LeanStep.VERIFY_FINGERPRINT
    changed = lines.replace("verify_done.record()", "verify_done.record(stream)")
    assert changed != lines and v2.source_fingerprint(changed) != v2.V2LeanStep.VERIFY_FINGERPRINT
    assert v2.source_fingerprint(verify_lines(source_of("0.5.11", WORKER))) != v2.V2LeanStep.VERIFY_FINGERPRINT


@pytest.mark.releases
def test_0512_writes_none_of_the_shared_outputs_in_place() -> None:
    names = {"next_token_ids", "bonus_tokens", "accept_lens"}
    sources = scanned_sources(VERSION)
    assert any(name.endswith("speculative/eagle_worker_v2.py") for name in sources)
    writes = {name: found for name, source in sources.items() if (found := inplace_write_problems(source, names))}
    assert writes == {}


# -- negative controls: each checker reports the change it exists to catch ---------------------------


def mutated(source: str, old: str, new: str) -> str:
    assert old in source, f"the control's anchor is not in {VERSION}: {old!r}"
    return source.replace(old, new, 1)


@pytest.mark.releases
@pytest.mark.parametrize(
    ("checker", "old", "new"),
    [
        (
            verify_call_problems,
            "        verify_done.record()\n",
            "        verify_done.record()\n        self.new_step(batch)\n",
        ),
        (verify_call_problems, "batch.seq_lens.record_stream(", "batch.seq_lens.keep_for("),
        (
            build_problems,
            "            accept_lens=accept_lens,\n",
            "            accept_lens=accept_lens,\n            new_field=1,\n",
        ),
        (
            build_problems,
            "            verify_done=verify_done,\n        )",
            "            verify_done=verify_done,\n            hidden_states=None,\n        )",
        ),
        (build_problems, "            skip_attn_backend_init=True,\n", "            skip_attn_backend_init=False,\n"),
        (
            build_problems,
            "verify_input.num_tokens_per_req = self.speculative_num_steps + 1",
            "verify_input.num_tokens_per_req = 1",
        ),
        (
            branch_problems,
            "            return batch_output\n\n    def on_verify",
            "            self.after_extend(batch_output)\n            return batch_output\n\n    def on_verify",
        ),
    ],
    ids=[
        "a-new-call",
        "record-stream-gone",
        "a-result-field",
        "a-draft-input-field",
        "the-forward-inits",
        "tokens-per-request",
        "a-branch-call",
    ],
)
def test_each_checker_reports_its_change(checker: Any, old: str, new: str) -> None:
    assert checker(mutated(source_of(VERSION, WORKER), old, new)) != []


def test_the_shape_check_names_what_is_missing() -> None:
    draft, result, forward = (
        set(v2.V2LeanStep.DRAFT_INPUT_FIELDS),
        set(v2.V2LeanStep.RESULT_FIELDS),
        list(v2.V2LeanStep.TARGET_FORWARD_PARAMETERS),
    )
    assert v2.lean_step_unfit(draft, result, forward) is None
    assert (
        v2.lean_step_unfit(draft - {"verify_done"}, result, forward)
        == "this release's EagleDraftInput has no verify_done"
    )
    assert (
        v2.lean_step_unfit(draft, result - {"indexer_topk_output"}, forward)
        == "this release's GenerationBatchResult has no indexer_topk_output"
    )
    assert v2.lean_step_unfit(draft, result, forward[1:]) == "this release's target forward takes no model_worker_batch"


# -- the step on stand-ins ---------------------------------------------------------------------------


class Tensor:
    """A 1-D tensor on a list: what the step does to its tensors, recorded."""

    def __init__(self, values: list[Any], dtype: str = "torch.int64", device: str = "cuda:0", of: Any = None) -> None:
        self.values, self.dtype, self.device, self.of = list(values), dtype, device, of
        self.recorded_on: list[Any] = []

    @property
    def shape(self) -> tuple[int]:
        return (len(self.values),)

    def to(self, dtype: str) -> Tensor:
        return Tensor(self.values, dtype, self.device)

    def fill_(self, value: Any) -> Tensor:
        self.values = [value] * len(self.values)
        return self

    def record_stream(self, stream: Any) -> None:
        self.recorded_on.append(stream)

    def __add__(self, other: int) -> Tensor:
        return Tensor([v + other for v in self.values], self.dtype, self.device)

    def __getitem__(self, rows: slice) -> Tensor:
        return Tensor(self.values[rows], self.dtype, self.device, self.of or self)


class Logits:
    def __init__(self, rows: list[list[float]]) -> None:
        self.rows = rows


@pytest.fixture
def timeline(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``torch`` as the step uses it; events and the forward note themselves in the timeline."""
    events: list[str] = []

    class Event:
        def record(self) -> None:
            events.append("event recorded")

    device_module = SimpleNamespace(Event=Event, current_stream=lambda: "the forward stream")
    torch = types.ModuleType("torch")
    torch.int32 = "torch.int32"  # type: ignore[attr-defined]
    torch.get_device_module = lambda device: device_module  # type: ignore[attr-defined]
    torch.argmax = lambda logits, dim: Tensor([max(range(len(r)), key=r.__getitem__) for r in logits.rows])  # type: ignore[attr-defined]
    torch.ones = lambda shape, dtype=None, device=None: Tensor([1] * shape[0], dtype, device)  # type: ignore[attr-defined]
    torch.zeros = lambda shape, dtype=None, device=None: Tensor([0] * shape[0], dtype, device)  # type: ignore[attr-defined]
    torch.float32, torch.int64 = "torch.float32", "torch.int64"  # type: ignore[attr-defined]
    torch.softmax = lambda logits, dim: ("softmax of", logits)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    spec_utils = types.ModuleType("sglang.srt.speculative.spec_utils")
    spec_utils.SIMULATE_ACC_LEN = -1  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, spec_utils.__name__, spec_utils)
    install_patched_package(monkeypatch)
    for name in (v2.LEAN_STEP_ENV, v2.LEAN_PREFILL_ENV, v2.EARLY_FENCE_ENV, runtime.RECORD_ENV):
        monkeypatch.delenv(name, raising=False)
    return events


@dataclasses.dataclass
class GenerationBatchResult:
    logits_output: Any = None
    next_token_ids: Any = None
    can_run_cuda_graph: bool = False
    speculative_num_draft_tokens: Any = None
    next_draft_input: Any = None
    accept_lens: Any = None
    routed_experts_output: Any = None
    indexer_topk_output: Any = None


class EagleVerifyInput:
    """The one-node tree's class: its preparation notes the batch it prepared."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def prepare_for_v2_verify(self, req_to_token_pool: Any, batch: Any, target_worker: Any) -> tuple[str, bool]:
        batch.out_cache_loc = Tensor([500 + i for i in range(batch.seq_lens.shape[0])])
        target_worker.prepared.append((req_to_token_pool, batch.spec_info is self, self.num_tokens_per_req))
        return "verify forward batch", True


class TargetWorker:
    def __init__(self, events: list[str], logits: list[list[float]]) -> None:
        self.events, self.logits = events, logits
        self.prepared: list[Any] = []
        self.forwards: list[dict] = []
        self.model_runner = SimpleNamespace()

    def forward_batch_generation(
        self,
        model_worker_batch: Any,
        forward_batch: Any = None,
        pp_proxy_tensors: Any = None,
        is_verify: bool = False,
        skip_attn_backend_init: bool = False,
    ) -> SimpleNamespace:
        self.events.append("target forward")
        self.forwards.append(
            {
                "model_worker_batch": model_worker_batch,
                "forward_batch": forward_batch,
                "is_verify": is_verify,
                "skip_attn_backend_init": skip_attn_backend_init,
            }
        )
        output = SimpleNamespace(next_token_logits=Logits(self.logits), hidden_states="target hidden states")
        return SimpleNamespace(logits_output=output, routed_experts_output="routed", indexer_topk_output="indexer")


class Writer(v2.FallbackDirectWrite):
    """The direct write, taking rows or not; what it was handed, kept."""

    def __init__(self, takes: bool = True) -> None:  # noqa: D107 - no twin: write() is all the step calls
        self.takes, self.written = takes, []

    def write(self, batch: Any, batch_result: Any) -> bool:
        self.written.append((list(batch.seq_lens.values), list(batch.out_cache_loc.values), batch_result))
        if self.takes:
            batch_result.next_draft_input.topk_p = "stand-in"
        return self.takes


def draft_worker_and_module() -> tuple[SimpleNamespace, types.ModuleType]:
    module = types.ModuleType("fake_eagle_worker_v2")
    module.EagleVerifyInput = EagleVerifyInput  # type: ignore[attr-defined]
    module.EagleDraftInput = EagleDraftInput  # type: ignore[attr-defined]
    module.GenerationBatchResult = GenerationBatchResult  # type: ignore[attr-defined]
    entered: list[str] = []

    @contextlib.contextmanager
    def context(name: str) -> Iterator[None]:
        entered.append(name)
        yield

    module.speculative_moe_backend_context = lambda: context("moe")  # type: ignore[attr-defined]
    module.speculative_moe_a2a_backend_context = lambda: context("a2a")  # type: ignore[attr-defined]
    module.checked_for_nan = []  # type: ignore[attr-defined]
    module.maybe_detect_nan = lambda tensor, where: module.checked_for_nan.append(where)  # type: ignore[attr-defined]
    draft = SimpleNamespace(
        speculative_num_steps=3,
        speculative_num_draft_tokens=4,
        cuda_graph_runner_for_draft_extend="extend graph",
        draft_runner=SimpleNamespace(tp_group="draft tp"),
        draft_tp_context=lambda group: context(f"tp {group}"),
        entered=entered,
        extended=[],
    )
    draft._draft_extend_for_decode = lambda batch, result: draft.extended.append(result)
    return draft, module


def lean_stack(
    events: list[str], writer: Writer, disable_above: int = 2, logits: list[list[float]] | None = None
) -> tuple[Any, v2.V2Fallback, types.ModuleType]:
    draft, module = draft_worker_and_module()
    target = TargetWorker(events, logits or [[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    worker = SimpleNamespace(
        device="cuda",
        speculative_num_steps=3,
        speculative_num_draft_tokens=4,
        draft_worker=draft,
        target_worker=target,
        req_to_token_pool="req_to_token",
        plan_stream=None,
    )
    kv_windows: list[str] = []

    @contextlib.contextmanager
    def kv_only(owner: Any, counted: bool = True) -> Iterator[None]:
        kv_windows.append("kv-only")
        yield

    draft_kv = SimpleNamespace(direct=writer, kv_only=kv_only, windows=kv_windows)
    fallback = v2.V2Fallback(runtime.SwitchController(disable_above, min_steps=1, log=False), SwapTarget(), draft_kv)
    return worker, fallback, module


def stock_result() -> SimpleNamespace:
    """What the stock branch returns on 0.5.12, as far as ``fall_back`` reads it afterwards."""
    return SimpleNamespace(speculative_num_draft_tokens=1, next_draft_input=None, origin="stock")


class SwapTarget:
    """The one-token target state: whether it is installed now."""

    def __init__(self) -> None:
        self.installed = False

    def swap_in(self) -> str:
        self.installed = True
        return "live"

    def swap_out(self, previous: str) -> None:
        self.installed = False


def greedy_batch(size: int = 3, **sampling: Any) -> SimpleNamespace:
    info = SimpleNamespace(
        is_all_greedy=True,
        acc_additive_penalties=None,
        acc_scaling_penalties=None,
        logit_bias=None,
        has_custom_logit_processor=False,
    )
    info.__dict__.update(sampling)
    return SimpleNamespace(
        seq_lens=Tensor(list(range(100, 100 + size))),
        seq_lens_sum=sum(range(100, 100 + size)),
        forward_mode=SimpleNamespace(is_idle=lambda: False),
        spec_info=SimpleNamespace(bonus_tokens=Tensor([7] * size, "torch.int32")),
        sampling_info=info,
        has_grammar=False,
        return_logprob=False,
        capture_hidden_mode=None,
    )


def lean_of(fallback: v2.V2Fallback, module: types.ModuleType, simulated: int | None = None) -> v2.V2LeanStep:
    fallback.lean_step = v2.V2LeanStep(module, simulated, log=True)
    return fallback.lean_step


@pytest.fixture
def trivial_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-node tree without its mask and tree-index kernels (``trivial_verify_input``'s own tests cover them)."""
    monkeypatch.setattr(
        v2.V2Fallback,
        "trivial_verify_input",
        lambda self, batch, cls: cls(positions=batch.seq_lens, draft_token=batch.spec_info.bonus_tokens),
    )


@pytest.mark.usefixtures("trivial_inputs")
def test_a_lean_iteration_builds_the_verifys_result_and_writes_the_draft_kv_directly(timeline: list[str]) -> None:
    writer = Writer()
    worker, fallback, module = lean_stack(timeline, writer)
    lean_of(fallback, module)
    batch = greedy_batch()
    assert fallback.should_fall_back(batch)
    result = fallback.fall_back(worker, lambda: pytest.fail("the stock branch ran"))
    assert timeline == ["event recorded", "target forward"]  # the early fence, then the forward
    assert result.next_token_ids.values == [1, 0, 1] and result.next_token_ids.dtype == "torch.int32"
    draft_input = result.next_draft_input
    assert draft_input.bonus_tokens is result.next_token_ids  # a one-node tree's bonus token is its argmax
    assert draft_input.new_seq_lens.values == [101, 102, 103] and draft_input.verify_done is not None
    assert draft_input.topk_p == "stand-in"
    assert result.accept_lens.values == [1, 1, 1] and result.accept_lens.dtype == "torch.int32"
    assert (result.speculative_num_draft_tokens, result.can_run_cuda_graph) == (1, True)
    assert (result.routed_experts_output, result.indexer_topk_output) == ("routed", "indexer")
    assert worker.target_worker.forwards == [
        {
            "model_worker_batch": None,
            "forward_batch": "verify forward batch",
            "is_verify": True,
            "skip_attn_backend_init": True,
        }
    ]
    assert worker.target_worker.prepared == [("req_to_token", True, 1)]
    assert batch.seq_lens.recorded_on == ["the forward stream"]
    # the write gets the pre-verify lengths (the positions), the verify's slots and its result
    assert writer.written == [([100, 101, 102], [500, 501, 502], result)]
    assert worker.draft_worker.extended == [] and fallback.draft_kv.windows == []
    assert module.checked_for_nan == ["verify: target model logits"]  # as the stock verify, where that is on
    assert (worker.speculative_num_steps, worker.speculative_num_draft_tokens) == (3, 4)  # restored
    assert not fallback.target.installed


@pytest.mark.usefixtures("trivial_inputs")
def test_without_the_early_fence_the_lengths_and_event_follow_the_forward(
    timeline: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(v2.EARLY_FENCE_ENV, "0")
    worker, fallback, module = lean_stack(timeline, Writer())
    lean_of(fallback, module)
    assert fallback.should_fall_back(greedy_batch())
    result = fallback.fall_back(worker, lambda: pytest.fail("the stock branch ran"))
    assert timeline == ["target forward", "event recorded"]
    assert result.next_draft_input.new_seq_lens.values == [101, 102, 103]


@pytest.mark.usefixtures("trivial_inputs")
def test_rows_the_writer_cannot_take_go_to_the_stock_extend_kv_only_in_the_drafts_contexts(timeline: list[str]) -> None:
    worker, fallback, module = lean_stack(timeline, Writer(takes=False))
    lean_of(fallback, module)
    assert fallback.should_fall_back(greedy_batch())
    result = fallback.fall_back(worker, lambda: pytest.fail("the stock branch ran"))
    assert worker.draft_worker.extended == [result]
    assert fallback.draft_kv.windows == ["kv-only"]
    assert worker.draft_worker.entered == ["tp draft tp", "moe", "a2a"]


@pytest.mark.usefixtures("trivial_inputs")
def test_the_stock_extend_it_falls_back_to_is_the_draft_workers_own(timeline: list[str]) -> None:
    """Not feed_twin_directly's wrapper, which would hand the rows to the writer a second time."""
    writer = Writer(takes=False)
    worker, fallback, module = lean_stack(timeline, writer)
    lean_of(fallback, module)
    own: list[Any] = []
    fallback.stock_extend = lambda batch, result: own.append(result)
    assert fallback.should_fall_back(greedy_batch())
    result = fallback.fall_back(worker, lambda: pytest.fail("the stock branch ran"))
    assert own == [result] and worker.draft_worker.extended == [] and len(writer.written) == 1


@pytest.mark.usefixtures("trivial_inputs")
def test_a_batch_the_refusal_cannot_read_leaves_the_target_as_it_was(timeline: list[str]) -> None:
    """The lean step is chosen before the one-token state goes in: an error there swaps nothing."""
    worker, fallback, module = lean_stack(timeline, Writer())
    lean_of(fallback, module)
    batch = greedy_batch()
    del batch.sampling_info.is_all_greedy
    assert fallback.should_fall_back(batch)
    with pytest.raises(AttributeError):
        fallback.fall_back(worker, lambda: pytest.fail("the stock branch ran"))
    assert not fallback.target.installed and not fallback.in_fallback
    assert (worker.speculative_num_steps, worker.speculative_num_draft_tokens) == (3, 4)


@pytest.mark.usefixtures("trivial_inputs")
def test_the_simulated_acceptance_token_stands_for_every_argmax(timeline: list[str]) -> None:
    worker, fallback, module = lean_stack(timeline, Writer())
    lean_of(fallback, module, simulated=100)
    assert fallback.should_fall_back(greedy_batch())
    assert fallback.fall_back(worker, lambda: None).next_token_ids.values == [100, 100, 100]


@pytest.mark.parametrize(
    ("sampling", "why"),
    [
        ({"is_all_greedy": False}, "sampling"),
        ({"logit_bias": "bias"}, "logit_bias"),
        ({"acc_additive_penalties": "penalties"}, "acc_additive_penalties"),
    ],
)
@pytest.mark.usefixtures("trivial_inputs")
def test_a_batch_the_step_does_not_take_runs_the_stock_branch_and_says_so_once(
    timeline: list[str], caplog: pytest.LogCaptureFixture, sampling: dict, why: str
) -> None:
    worker, fallback, module = lean_stack(timeline, Writer())
    lean_of(fallback, module)
    stock = []
    caplog.set_level(logging.INFO)
    for _ in range(2):
        assert fallback.should_fall_back(greedy_batch(**sampling))
        fallback.fall_back(worker, lambda: stock.append("stock") or stock_result())
    assert stock == ["stock", "stock"] and worker.target_worker.forwards == []
    assert fallback.draft_kv.windows == ["kv-only", "kv-only"]  # the stock extend, KV-only as ever
    said = [r.getMessage() for r in caplog.records if "stock decode branch" in r.getMessage()]
    assert said == [f"dynspec: a fallback batch ran the stock decode branch ({why}); said once"]


@pytest.mark.parametrize("batch_change", [{"has_grammar": True}, {"return_logprob": True}], ids=["grammar", "logprobs"])
@pytest.mark.usefixtures("trivial_inputs")
def test_grammar_and_logprobs_run_the_stock_branch(timeline: list[str], batch_change: dict) -> None:
    worker, fallback, module = lean_stack(timeline, Writer())
    lean_of(fallback, module)
    batch = greedy_batch()
    batch.__dict__.update(batch_change)
    assert fallback.should_fall_back(batch)
    assert fallback.fall_back(worker, stock_result).origin == "stock"


@pytest.mark.usefixtures("trivial_inputs")
def test_the_iteration_that_switches_back_on_runs_the_stock_branch(timeline: list[str]) -> None:
    worker, fallback, module = lean_stack(timeline, Writer(), disable_above=2)
    lean_of(fallback, module)
    assert fallback.should_fall_back(greedy_batch(3))  # off
    fallback.fall_back(worker, lambda: pytest.fail("the stock branch ran"))
    assert fallback.should_fall_back(greedy_batch(2))  # RESUME: the full extend
    assert fallback._step == runtime.RESUME
    assert fallback.fall_back(worker, stock_result).origin == "stock"


# -- building it -------------------------------------------------------------------------------------


@pytest.fixture
def worker_class(tmp_path: Path) -> type:
    """An ``EAGLEWorkerV2`` class whose ``verify`` is 0.5.12's (its source is what unfit() checks)."""
    return worker_class_with(verify_lines(source_of(VERSION, WORKER)), tmp_path)


def worker_for_build(
    cls: type, module: types.ModuleType, timeline: list[str], writer: Any
) -> tuple[Any, v2.V2Fallback]:
    worker, fallback, _ = lean_stack(timeline, writer)
    cls.__module__ = module.__name__  # where build() looks the release's classes up
    built = cls()
    built.__dict__.update(worker.__dict__)
    return built, fallback


@pytest.fixture
def worker_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    _, module = draft_worker_and_module()
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


@pytest.mark.releases
def test_the_lean_step_is_on_unless_turned_off_and_a_bad_setting_refuses_to_start(
    timeline: list[str], worker_class: type, worker_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker, fallback = worker_for_build(worker_class, worker_module, timeline, Writer())
    assert isinstance(v2.V2LeanStep.build(worker, fallback, log=False), v2.V2LeanStep)  # unset: on (session 25's proof)
    monkeypatch.setenv(v2.LEAN_STEP_ENV, "0")
    assert v2.V2LeanStep.build(worker, fallback, log=False) is None
    monkeypatch.setenv(v2.LEAN_STEP_ENV, "1")
    assert isinstance(v2.V2LeanStep.build(worker, fallback, log=False), v2.V2LeanStep)
    monkeypatch.setenv(v2.LEAN_STEP_ENV, "on")
    with pytest.raises(ValueError, match="DYNSPEC_LEAN_STEP must be 0 or 1, not 'on'"):
        v2.V2LeanStep.build(worker, fallback, log=False)


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        ("no-direct-write", "kv-direct does not write this server's draft KV"),
        ("0.5.11-draft-input", "this release's EagleDraftInput has no bonus_tokens"),
        ("0.5.13-forward", "this release's target forward takes no model_worker_batch"),
        ("plan-stream", "SGLANG_ENABLE_OVERLAP_PLAN_STREAM"),
        ("hybrid", "a hybrid (mamba) target, whose verify updates its state"),
        ("a-changed-verify", "this EAGLEWorkerV2.verify is not 0.5.12's, the one the lean step mirrors"),
        ("no-verify-source", "EAGLEWorkerV2.verify's source cannot be read"),
    ],
)
@pytest.mark.releases
def test_where_the_step_does_not_fit_it_says_why_once_and_stays_off(
    timeline: list[str],
    worker_class: type,
    worker_module: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    damage: str,
    why: str,
) -> None:
    monkeypatch.setenv(v2.LEAN_STEP_ENV, "1")
    if damage == "a-changed-verify":
        worker_class = worker_class_with(
            verify_lines(source_of(VERSION, WORKER)).replace("verify_done.record()", "pass"), tmp_path / "changed"
        )
    elif damage == "no-verify-source":
        worker_class = types.new_class("EAGLEWorkerV2", exec_body=lambda ns: ns.update(verify=exec_made_verify()))
    worker, fallback = worker_for_build(worker_class, worker_module, timeline, Writer())
    if damage == "no-direct-write":
        fallback.draft_kv.direct = None
    elif damage == "0.5.11-draft-input":

        @dataclasses.dataclass
        class OldDraftInput:
            verified_id: Any = None
            new_seq_lens: Any = None
            verify_done: Any = None

        monkeypatch.setattr(worker_module, "EagleDraftInput", OldDraftInput)
    elif damage == "0.5.13-forward":
        worker.target_worker.forward_batch_generation = (
            lambda batch, forward_batch=None, is_verify=False, skip_attn_backend_init=None: None
        )
    elif damage == "plan-stream":
        worker.plan_stream = "a stream"
    elif damage == "hybrid":
        worker.target_worker.model_runner.mamba2_config = "mamba"
    caplog.set_level(logging.INFO)
    assert v2.V2LeanStep.build(worker, fallback, log=True) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"dynspec: the lean fallback step does not apply, a fallback iteration runs the stock decode branch ({why})"
    ]


def exec_made_verify() -> Any:
    """A function with no file behind it: ``inspect.getsource`` cannot read it."""
    namespace: dict = {}
    exec("def verify(self, batch):\n    return batch\n", namespace)  # noqa: S102 - a fixed string, for the test
    return namespace["verify"]


# -- LeanKVPrefill: the KV-only prefill without its per-request loop ----------------------------------


def prefill_lines() -> str:
    return method_lines(source_of(VERSION, WORKER), "EagleDraftWorker", "_draft_extend_for_prefill")


@pytest.mark.releases
def test_the_prefill_fingerprint_is_0512s_body_as_the_server_reads_it(tmp_path: Path) -> None:
    lines = prefill_lines()
    assert v2.source_fingerprint(lines) == v2.LeanKVPrefill.PREFILL_FINGERPRINT
    cls = class_with(lines, tmp_path, "EagleDraftWorker")
    assert (
        v2.source_fingerprint(inspect.getsource(cls._draft_extend_for_prefill)) == v2.LeanKVPrefill.PREFILL_FINGERPRINT
    )
    for version in ("0.5.11", "0.5.13"):  # the control: the neighbours' bodies differ
        other = method_lines(source_of(version, WORKER), "EagleDraftWorker", "_draft_extend_for_prefill")
        assert v2.source_fingerprint(other) != v2.LeanKVPrefill.PREFILL_FINGERPRINT, version


class ForwardBatchClass:
    """``ForwardBatch.init_new`` as the lean prefill reads it: the batch's ids, the lengths' device copy."""

    made: list[Any] = []

    @classmethod
    def init_new(cls, batch: Any, runner: Any) -> SimpleNamespace:
        made = SimpleNamespace(
            input_ids=batch.input_ids,
            extend_seq_lens=Tensor(batch.extend_seq_lens, "torch.int32"),
            spec_info=batch.spec_info,
            return_logprob=True,
        )
        cls.made.append(made)
        return made


def prefill_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, width: int = 1, **runner: Any
) -> tuple[Any, types.ModuleType]:
    cls = class_with(prefill_lines(), tmp_path, "EagleDraftWorker")
    module = types.ModuleType("fake_eagle_worker_v2_prefill")
    module.EagleDraftInput = EagleDraftInputWide  # type: ignore[attr-defined]
    module.ForwardBatch = ForwardBatchClass  # type: ignore[attr-defined]
    module.fast_topk = lambda probs, topk, dim: (("top", topk, "p"), ("top", topk, "index"))  # type: ignore[attr-defined]
    module.checked_for_nan = []  # type: ignore[attr-defined]
    module.maybe_detect_nan = lambda tensor, where: module.checked_for_nan.append(where)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    cls.__module__ = module.__name__
    worker = cls()
    forwards: list[Any] = []

    def forward(forward_batch: Any) -> SimpleNamespace:
        forwards.append(list(forward_batch.input_ids.values))  # what the draft reads: the ids after the shift
        logits = SimpleNamespace(shape=(2, width), device="cuda:0")
        return SimpleNamespace(
            logits_output=SimpleNamespace(next_token_logits=logits, hidden_states="placeholder hidden states")
        )

    worker.draft_runner = SimpleNamespace(forward=forward, forwards=forwards, **runner)
    worker.topk = 1
    return worker, module


@dataclasses.dataclass
class EagleDraftInputWide(EagleDraftInput):
    num_tokens_per_req: Any = None
    num_tokens_for_logprob_per_req: Any = None


def STOCK_PREFILL(batch: Any, *args: Any) -> str:  # noqa: N802 - a constant-like stand-in
    return "the stock body"


def prefill_batch() -> SimpleNamespace:
    return SimpleNamespace(
        input_ids=Tensor([11, 12, 13, 21, 22]), extend_seq_lens=[3, 2], seq_lens=Tensor([3, 2]), spec_info=None
    )


@pytest.mark.releases
def test_the_lean_prefill_builds_the_stock_draft_input_with_the_ids_shifted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timeline: list[str]
) -> None:
    monkeypatch.setenv(v2.LEAN_STEP_ENV, "1")
    shifted: list[Any] = []

    def shift(input_ids: Tensor, lens: Tensor, next_tokens: Tensor) -> None:  # its exactness: the torch tests
        shifted.append((lens.values, next_tokens.values))
        input_ids.values = [12, 13, 7, 22, 8]

    monkeypatch.setattr(v2, "shift_for_the_draft", shift)
    worker, module = prefill_worker(tmp_path, monkeypatch)
    lean = v2.LeanKVPrefill.build(worker, STOCK_PREFILL, log=False)
    assert lean is not None
    batch = prefill_batch()
    made = lean.extend(batch, "target hidden states", Tensor([7, 8]))
    assert shifted == [([3, 2], [7, 8])] and worker.draft_runner.forwards == [[12, 13, 7, 22, 8]]
    assert batch.spec_info is made and ForwardBatchClass.made[-1].return_logprob is False
    assert (made.hidden_states, made.bonus_tokens.values, made.new_seq_lens is batch.seq_lens) == (
        "placeholder hidden states",
        [7, 8],
        True,
    )
    assert (made.num_tokens_per_req, made.num_tokens_for_logprob_per_req) == (1, 1)
    assert (made.topk_p.values, made.topk_p.dtype, made.topk_index.values, made.topk_index.dtype) == (
        [1, 1],
        "torch.float32",
        [0, 0],
        "torch.int64",
    )
    assert module.checked_for_nan == ["draft_extend_for_prefill"]


@pytest.mark.releases
def test_real_logits_get_the_stock_top_k(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timeline: list[str]) -> None:
    """Where the KV-only forward gave up mid-way and returned the full logits, the top-k is the stock body's."""
    monkeypatch.setenv(v2.LEAN_STEP_ENV, "1")
    monkeypatch.setattr(v2, "shift_for_the_draft", lambda *args: None)
    worker, _ = prefill_worker(tmp_path, monkeypatch, width=32000)
    lean = v2.LeanKVPrefill.build(worker, STOCK_PREFILL, log=False)
    assert lean is not None
    made = lean.extend(prefill_batch(), "target hidden states", Tensor([7, 8]))
    assert (made.topk_p, made.topk_index) == (("top", 1, "p"), ("top", 1, "index"))


@pytest.mark.releases
@pytest.mark.parametrize(
    ("damage", "why"),
    [
        ("", None),
        (
            "a-changed-body",
            "this EagleDraftWorker._draft_extend_for_prefill is not 0.5.12's, the one the lean prefill mirrors",
        ),
        ("ngram", "a draft whose forward batch reads more than the ids (n-gram embedding, multimodal rope)"),
        ("no-fast-topk", "the draft worker's module lacks EagleDraftInput, ForwardBatch or fast_topk"),
    ],
)
def test_the_lean_prefill_is_built_only_where_it_fits_and_says_why_not(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    timeline: list[str],
    damage: str,
    why: str | None,
) -> None:
    worker, module = prefill_worker(tmp_path, monkeypatch, use_ngram_embedding=damage == "ngram")
    monkeypatch.setenv(v2.LEAN_STEP_ENV, "0")
    assert v2.LeanKVPrefill.build(worker, STOCK_PREFILL, log=True) is None  # turned off: nothing said
    monkeypatch.delenv(v2.LEAN_STEP_ENV)  # unset: on
    if damage == "a-changed-body":
        changed = class_with(
            prefill_lines().replace("num_tokens_per_req=1", "num_tokens_per_req=2"),
            tmp_path / "changed",
            "EagleDraftWorker",
        )
        changed.__module__ = module.__name__
        runner = worker.draft_runner
        worker = changed()
        worker.draft_runner = runner
    elif damage == "no-fast-topk":
        del module.fast_topk
    caplog.set_level(logging.INFO)
    built = v2.LeanKVPrefill.build(worker, STOCK_PREFILL, log=True)
    said = [r.getMessage() for r in caplog.records]
    if why is None:
        assert isinstance(built, v2.LeanKVPrefill)
        assert said == [
            "dynspec: a KV-only prefill shifts its prompts in one pass (DYNSPEC_LEAN_PREFILL, as DYNSPEC_LEAN_STEP unless set)"
        ]
    else:
        assert built is None and said == [
            f"dynspec: the lean KV-only prefill does not apply, a KV-only prefill runs the stock body ({why})"
        ]


@pytest.mark.releases
def test_the_prefill_hook_runs_the_lean_body_only_inside_the_kv_only_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timeline: list[str]
) -> None:
    monkeypatch.setenv(v2.LEAN_STEP_ENV, "1")
    monkeypatch.setattr(v2, "shift_for_the_draft", lambda *args: None)
    draft, module = prefill_worker(tmp_path, monkeypatch)
    stock: list[Any] = []
    draft._draft_extend_for_prefill = lambda batch, *args, **kwargs: stock.append(batch) or "stock draft input"
    windows: list[str] = []

    @contextlib.contextmanager
    def kv_only(owner: Any, counted: bool = True) -> Iterator[None]:
        windows.append("kv-only")
        yield

    draft_kv = SimpleNamespace(writes_kv_only=True, kv_only=kv_only)
    controller = runtime.SwitchController(2, min_steps=1, log=False)
    fallback = v2.V2Fallback(controller, SwapTarget(), draft_kv)
    fallback.prefill_kv_only(draft, log=False)
    batch = prefill_batch()
    batch.forward_mode = SimpleNamespace(is_idle=lambda: False)
    batch.reqs = []
    assert (
        draft._draft_extend_for_prefill(batch, "hidden", Tensor([7, 8])) == "stock draft input"
    )  # speculating, a small wave
    assert windows == []
    controller.step(9)  # off
    made = draft._draft_extend_for_prefill(batch, "hidden", Tensor([7, 8]))
    assert windows == ["kv-only"] and isinstance(made, EagleDraftInputWide) and len(stock) == 1


@pytest.mark.releases
@pytest.mark.parametrize(
    ("step", "prefill", "built"),
    [
        ("1", None, True),
        ("1", "0", False),
        (None, "1", True),
        ("0", None, False),
        (None, None, True),
        (None, "0", False),
        ("0", "1", True),
    ],
)
def test_the_lean_prefill_follows_the_lean_step_unless_set(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    timeline: list[str],
    step: str | None,
    prefill: str | None,
    built: bool,
) -> None:
    for name, value in ((v2.LEAN_STEP_ENV, step), (v2.LEAN_PREFILL_ENV, prefill)):
        if value is not None:
            monkeypatch.setenv(name, value)
    worker, _ = prefill_worker(tmp_path, monkeypatch)
    assert isinstance(v2.LeanKVPrefill.build(worker, STOCK_PREFILL, log=False), v2.LeanKVPrefill) == built


@pytest.mark.releases
def test_a_wave_with_an_empty_request_goes_to_the_stock_body(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timeline: list[str]
) -> None:
    """Never in 0.5.12, but the stock body would fail loudly where the one-pass shift would write the neighbour's slot."""
    monkeypatch.setenv(v2.LEAN_STEP_ENV, "1")
    monkeypatch.setattr(v2, "shift_for_the_draft", lambda *args: pytest.fail("shifted"))
    worker, _ = prefill_worker(tmp_path, monkeypatch)
    lean = v2.LeanKVPrefill.build(worker, STOCK_PREFILL, log=False)
    assert lean is not None
    batch = prefill_batch()
    batch.extend_seq_lens = [3, 0, 2]
    assert lean.extend(batch, "hidden", Tensor([7, 8, 9])) == "the stock body"
