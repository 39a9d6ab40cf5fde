"""``LeanVerify`` (0.5.14+): the zero-step verify without the one-node tree's sampling kernels.

No torch: tensors are ``T`` (values, dtype, device). The release modules the stand-ins go into are
fakes in ``sys.modules`` whose ``verify`` reads ``eagle_sample`` and ``fill_bonus_tokens_func`` as
module globals, as 0.5.16+'s ``run_eagle_verify`` does, and whose stock ``eagle_sample`` is a
step-by-step transcription of the release's (buffers, the greedy tree kernel's walk, the simulated
acceptance), so that the lean shortcut is compared with the stock algorithm, not with itself. What only a GPU shows (the served tokens equal stock's) is ``dynspec proof``'s
equivalence; the release facts the stand-ins rely on are pinned in test_lean_verify_releases.py.
"""

from __future__ import annotations

import logging
import sys
import types
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from patches.runtime import dynspec_v2 as v2
from tests.patches.fake_sampler import SixParameterSampler

COMMON = "sglang.srt.speculative.eagle_worker_common"
WORKER = "sglang.srt.speculative.eagle_worker_v2"
SPEC_UTILS = "sglang.srt.speculative.spec_utils"
PROBE = "sglang.srt.utils.async_probe"


@dataclass
class T:
    """A tensor: a list of values (rows of lists for 2-D), its dtype and device."""

    values: list[Any]
    dtype: str = "torch.int64"
    device: str = "cuda:0"

    @property
    def shape(self) -> tuple[int, ...]:
        if self.values and isinstance(self.values[0], list):
            return (len(self.values), len(self.values[0]))
        return (len(self.values),)

    def to(self, dtype: str) -> T:
        return T(list(self.values), dtype, self.device)

    def clone(self) -> T:
        return T([list(v) if isinstance(v, list) else v for v in self.values], self.dtype, self.device)

    def fill_(self, value: Any) -> T:
        self.values[:] = [value] * len(self.values)
        return self

    def copy_(self, source: T) -> T:
        assert len(source.values) == len(self.values), "copy_ of a different row count"
        self.values[:] = list(source.values)
        return self

    def view(self, *shape: int) -> T:
        if shape == (-1,):
            flat = [x for v in self.values for x in (v if isinstance(v, list) else [v])]
            return T(flat, self.dtype, self.device)
        rows, width = shape
        assert width == 1 and rows == len(self.values)
        return T([[v] for v in self.values], self.dtype, self.device)

    def __getitem__(self, key: Any) -> T:
        if isinstance(key, slice):  # rows, as torch slices a tensor's first dimension
            return T(self.values[key], self.dtype, self.device)
        index = key.values  # predict[accept_index]: a gather by a (bs, width) index (-1 wraps, as in torch)
        return T([[self.values[j] for j in row] for row in index], self.dtype, self.device)


def fake_torch() -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.int32 = "torch.int32"  # type: ignore[attr-defined]
    torch.int64 = "torch.int64"  # type: ignore[attr-defined]

    def argmax(t: T, dim: int) -> T:
        assert dim == -1
        return T([row.index(max(row)) for row in t.values], "torch.int64", t.device)

    torch.argmax = argmax  # type: ignore[attr-defined]
    torch.ones = lambda shape, dtype, device: T([1] * shape[0], dtype, device)  # type: ignore[attr-defined]
    torch.arange = lambda n, dtype, device: T(list(range(n)), dtype, device)  # type: ignore[attr-defined]
    torch.empty_like = lambda t, dtype: T([None] * len(t.values), dtype, t.device)  # type: ignore[attr-defined]
    return torch


@dataclass
class Release:
    """The fake release modules, and what ran in them."""

    common: types.ModuleType
    worker_module: types.ModuleType
    spec_utils: types.ModuleType
    calls: list[str] = field(default_factory=list)


def stock_eagle_sample(calls: list[str], simulated: Any) -> Any:
    """The release's ``eagle_sample`` for a greedy batch, transcribed step by step (0.5.17
    ``eagle_utils.py:672-878``; the tree kernel as sgl-kernel's ``VerifyTreeGreedy`` walks it), not
    from the lean sample's shortcut: its outcome is what the shortcut must reproduce."""

    def eagle_sample(verify_input: Any, batch: Any, logits_output: Any, grammar_mask: Any = None, **kwargs: Any) -> Any:
        calls.append("stock sample")
        logits = logits_output.next_token_logits.values
        bs, n = len(batch.seq_lens.values), verify_input.draft_token_num
        depth = verify_input.max_tree_depth
        predict = [0] * (bs * n)  # torch.zeros(..., int32).flatten()
        accept_index = [[-1] * depth for _ in range(bs)]  # torch.full((bs, depth), -1)
        num_correct = [0] * bs
        target = [[row.index(max(row)) for row in logits[b * n : (b + 1) * n]] for b in range(bs)]
        retrieve_index = [[b * n + i for i in range(n)] for b in range(bs)]  # the trivial input's arange
        retrieve_next_token = [[-1] * n for _ in range(bs)]
        for b in range(bs):  # VerifyTreeGreedy
            last = retrieve_index[b][0]
            accept_index[b][0] = last
            j, node = 1, 0
            while j < depth and retrieve_next_token[b][node] != -1:  # a one-node tree has no child
                node = retrieve_next_token[b][node]
                j += 1
            predict[last] = target[b][node]
            num_correct[b] = j - 1
        if simulated is not None:  # generate_simulated_accept_index, fixed mode, length clamped to 1
            accept_index = [[row[0]] + [-1] * (depth - 1) for row in accept_index]
            num_correct = [0] * bs
            predict = [simulated] * len(predict)
        accept_lens = [c + 1 for c in num_correct]
        return T(predict, "torch.int32"), T(accept_lens, "torch.int32"), T(accept_index, "torch.int32")

    return eagle_sample


@pytest.fixture
def release(monkeypatch: pytest.MonkeyPatch) -> Release:
    """0.5.16+'s layout: the verify body in eagle_worker_common, SIMULATE off."""
    monkeypatch.setitem(sys.modules, "torch", fake_torch())
    for name in ("sglang", "sglang.srt", "sglang.srt.speculative", "sglang.srt.utils"):
        package = types.ModuleType(name)
        package.__path__ = []  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, name, package)
    common, worker_module, spec_utils, probe = (types.ModuleType(n) for n in (COMMON, WORKER, SPEC_UTILS, PROBE))
    out = Release(common, worker_module, spec_utils)
    common.eagle_sample = stock_eagle_sample(out.calls, None)  # type: ignore[attr-defined]

    def fill_bonus_tokens_func(accept_tokens: T, accept_lens: T, bonus_tokens: T, stride: int, bs: int) -> None:
        out.calls.append("stock fill")
        flat = accept_tokens.view(-1).values
        bonus_tokens.values[:] = [flat[b * stride + accept_lens.values[b] - 1] for b in range(bs)]

    common.fill_bonus_tokens_func = fill_bonus_tokens_func  # type: ignore[attr-defined]
    spec_utils.SIMULATE_ACC_LEN = -1.0  # type: ignore[attr-defined]
    spec_utils.SIMULATE_ACC_METHOD = "match-expected"  # type: ignore[attr-defined]
    spec_utils.SIMULATE_ACC_TOKEN_MODE = "fixed"  # type: ignore[attr-defined]

    def sanitize_nan_logits(logits: T, where: str) -> None:
        out.calls.append(f"sanitize {where}")

    probe.sanitize_nan_logits = sanitize_nan_logits  # type: ignore[attr-defined]
    for module in (common, worker_module, spec_utils, probe):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.delenv(v2.LEAN_VERIFY_ENV, raising=False)
    return out


class Worker:
    """``EAGLEWorkerV2`` as far as the verify goes: ``verify`` runs the release's verify body."""

    def __init__(self, common: types.ModuleType, steps: int = 0, tp_size: int = 1, sampler: Any = None) -> None:
        self.common = common
        self.speculative_num_steps = steps
        self.server_args = SimpleNamespace(tp_size=tp_size)
        self.target_worker = SimpleNamespace(model_runner=SimpleNamespace(sampler=sampler))
        self.seen_in_verify: list[Any] = []

    def verify(self, batch: Any, grammar_barrier: Any = None) -> Any:
        # run_eagle_verify's sampling tail (0.5.17 eagle_worker_common.py:583-623), names looked up at call time
        common = self.common
        self.seen_in_verify.append(common.eagle_sample)
        predict, accept_lens, accept_index = common.eagle_sample(batch.spec_info, batch, batch.logits_output, None)
        accept_tokens = predict[accept_index]
        bonus_tokens = T([None] * len(accept_lens.values), "torch.int32")
        common.fill_bonus_tokens_func(
            accept_tokens, accept_lens, bonus_tokens, accept_index.shape[1], len(batch.seq_lens.values)
        )
        return SimpleNamespace(
            next_token_ids=predict, accept_lens=accept_lens, accept_index=accept_index, bonus_tokens=bonus_tokens
        )


def batch_of(logits: list[list[float]], *, greedy: bool = True, idle: bool = False, **fields: Any) -> Any:
    # Each of the penalties None, no custom logit processor, no sampling masks (0.5.17+: a list of flags).
    info = SimpleNamespace(is_all_greedy=greedy, has_custom_logit_processor=False, return_sampling_masks=None)
    for name in v2.LeanVerify.PENALTIES:
        setattr(info, name, None)
    for name in (
        *v2.LeanVerify.PENALTIES,
        *v2.DecodeSample.PLAIN_DECODE_BIASES,
        "penalizer_orchestrator",
        "has_custom_logit_processor",
        "return_sampling_masks",
        "sampling_mask_batch_indices",
    ):
        if name in fields:
            setattr(info, name, fields.pop(name))
    seq_lens = [10 + i for i in range(len(logits))]
    # positions: seq_lens, as every release's one-node verify input has them (0.5.14 - 0.5.16: a longer graph buffer's first rows)
    spec_info = SimpleNamespace(draft_token_num=1, max_tree_depth=1, tree_topk=1, positions=T(seq_lens + [0]))
    for name in ("draft_token_num", "max_tree_depth", "tree_topk", "positions"):
        if name in fields:
            setattr(spec_info, name, fields.pop(name))
    return SimpleNamespace(
        forward_mode=SimpleNamespace(is_idle=lambda: idle),
        seq_lens=T(seq_lens),
        top_logprobs_nums=[0] * len(logits),
        token_ids_logprobs=[None] * len(logits),
        sampling_info=info,
        spec_info=spec_info,
        logits_output=SimpleNamespace(next_token_logits=T(logits, "torch.float32")),
        has_grammar=fields.pop("has_grammar", False),
        return_logprob=fields.pop("return_logprob", False),
    )


LOGITS = [[0.1, 0.9, 0.0], [0.7, 0.2, 0.1], [0.0, 0.1, 0.8]]  # argmax 1, 0, 2


def outcome(result: Any) -> tuple[Any, ...]:
    r = result
    return (r.next_token_ids.values, r.next_token_ids.dtype, r.accept_lens.values, r.accept_lens.dtype,
            r.accept_index.values, r.accept_index.dtype, r.bonus_tokens.values)  # fmt: skip


def stock_outcome(release: Release, batch: Any) -> tuple[Any, ...]:
    return outcome(Worker(release.common).verify(batch))


def test_a_greedy_zero_step_batch_skips_the_tree_kernels_and_gets_the_stock_outcome(release: Release) -> None:
    expected = stock_outcome(release, batch_of(LOGITS))
    release.calls.clear()
    worker = Worker(release.common)
    lean = v2.LeanVerify.install(worker)
    assert lean is not None and "verify" in vars(worker)
    got = outcome(worker.verify(batch_of(LOGITS)))
    assert got == expected
    assert got[0] == [1, 0, 2] and got[6] == [1, 0, 2]  # the argmax is accepted and is the bonus token
    # the release's sanitize ran (before the argmax), neither stock kernel did
    assert release.calls == ["sanitize verify: target model logits"]
    assert (lean.taken, lean.refused) == (1, 0)
    # outside the verify the release's own functions are back
    assert release.common.eagle_sample is lean.stock_sample
    assert release.common.fill_bonus_tokens_func is lean.stock_fill


def test_the_comparison_has_teeth(release: Release, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a stand-in that writes another token is told apart from stock."""
    expected = stock_outcome(release, batch_of(LOGITS))
    worker = Worker(release.common)
    lean = v2.LeanVerify.install(worker)
    assert lean is not None
    lean.simulated_token = 7  # as if it mirrored a SIMULATE mode that is not on
    assert outcome(worker.verify(batch_of(LOGITS))) != expected


def test_while_speculating_the_stock_verify_runs_untouched(release: Release) -> None:
    worker = Worker(release.common, steps=3)
    lean = v2.LeanVerify.install(worker)
    assert lean is not None
    worker.verify(batch_of(LOGITS))
    assert worker.seen_in_verify == [lean.stock_sample]
    assert release.calls == ["stock sample", "stock fill"]


@pytest.mark.parametrize(
    "why, fields",
    [
        ("a sampling batch", {"greedy": False}),
        ("a frequency penalty", {"acc_additive_penalties": T([0.5])}),
        ("a repetition penalty", {"acc_scaling_penalties": T([1.1])}),
        ("a logit bias", {"logit_bias": T([0.0])}),
        ("grammar", {"has_grammar": True}),
        ("logprobs", {"return_logprob": True}),
        ("an idle batch", {"idle": True}),
        ("a deeper tree", {"max_tree_depth": 2}),
        ("top-k > 1", {"tree_topk": 2}),
    ],
)
def test_batches_it_does_not_know_take_the_stock_sample(release: Release, why: str, fields: dict) -> None:
    worker = Worker(release.common)
    lean = v2.LeanVerify.install(worker)
    assert lean is not None
    worker.verify(batch_of(LOGITS, **fields))
    assert release.calls[0] == "stock sample", why
    assert (lean.taken, lean.refused) == (0, 0 if why == "an idle batch" else 1)  # idle: not counted


def test_arguments_decide_too(release: Release) -> None:
    lean, _ = v2.LeanVerify.build()
    assert lean is not None
    batch = batch_of(LOGITS)
    logits = batch.logits_output.next_token_logits
    assert (
        lean.refusal(batch.spec_info, batch, logits, (None,), {"uno_target_max_top_k": 8, "watermark_full_mask": True})
        is None
    )
    assert lean.refusal(batch.spec_info, batch, logits, (object(),), {}) == "a grammar mask"
    assert (
        lean.refusal(batch.spec_info, batch, logits, (), {"watermark_state": object()})
        == "the argument watermark_state"
    )
    assert lean.refusal(batch.spec_info, batch, logits, (), {"something_new": 1}) == "the argument something_new"
    assert lean.refusal(batch.spec_info, batch, logits, (), {"something_new": None}) is None


@pytest.mark.parametrize("mode, token", [("fixed", 100), ("real-draft-token", None)])
def test_simulated_acceptance_is_mirrored(release: Release, mode: str, token: int | None) -> None:
    release.spec_utils.SIMULATE_ACC_LEN = 3.0  # type: ignore[attr-defined]
    release.spec_utils.SIMULATE_ACC_TOKEN_MODE = mode  # type: ignore[attr-defined]
    release.common.eagle_sample = stock_eagle_sample(release.calls, token)  # type: ignore[attr-defined]
    expected = stock_outcome(release, batch_of(LOGITS))
    worker = Worker(release.common)
    lean = v2.LeanVerify.install(worker)
    assert lean is not None and lean.simulated_token == token
    assert outcome(worker.verify(batch_of(LOGITS))) == expected


def test_0_5_14_has_only_the_fixed_mode(release: Release) -> None:
    release.spec_utils.SIMULATE_ACC_LEN = 3.0  # type: ignore[attr-defined]
    del release.spec_utils.SIMULATE_ACC_TOKEN_MODE
    assert v2.LeanVerify.simulated_token_of(release.spec_utils) == (100, "")


@pytest.mark.parametrize(
    "method, mode, words",
    [
        ("multinomial", "fixed", "draws from the CPU generator"),
        ("match-expected", "other", "not one this dynspec knows"),
    ],
)
def test_a_simulation_it_cannot_mirror_keeps_the_stock_verify(
    release: Release, caplog: pytest.LogCaptureFixture, method: str, mode: str, words: str
) -> None:
    release.spec_utils.SIMULATE_ACC_LEN = 3.0  # type: ignore[attr-defined]
    release.spec_utils.SIMULATE_ACC_METHOD = method  # type: ignore[attr-defined]
    release.spec_utils.SIMULATE_ACC_TOKEN_MODE = mode  # type: ignore[attr-defined]
    worker = Worker(release.common)
    with caplog.at_level(logging.INFO, logger=v2.logger.name):
        assert v2.LeanVerify.install(worker) is None
    assert "verify" not in vars(worker)
    assert words in caplog.text and "zero-step verify runs stock" in caplog.text


def test_switched_off_by_the_environment(release: Release, monkeypatch: pytest.MonkeyPatch) -> None:
    worker = Worker(release.common)
    monkeypatch.setenv(v2.LEAN_VERIFY_ENV, "0")
    assert v2.LeanVerify.install(worker) is None and "verify" not in vars(worker)
    monkeypatch.setenv(v2.LEAN_VERIFY_ENV, "yes")
    with pytest.raises(ValueError, match="DYNSPEC_LEAN_VERIFY must be 0 or 1, not 'yes'"):
        v2.LeanVerify.install(worker)


def test_0_5_14_verifies_inline_and_launches_the_bonus_kernel_itself(release: Release) -> None:
    """The worker module holds ``eagle_sample``; there is no ``fill_bonus_tokens_func`` to shadow."""
    release.worker_module.eagle_sample = release.common.eagle_sample  # type: ignore[attr-defined]
    del release.common.eagle_sample, release.common.fill_bonus_tokens_func
    lean, why = v2.LeanVerify.build()
    assert lean is not None, why
    assert [(m.__name__, n) for m, n, _, _ in lean.shadows] == [(WORKER, "eagle_sample")]
    assert lean.stock_fill is None


def test_a_release_without_the_sample_keeps_the_stock_verify(release: Release) -> None:
    del release.common.eagle_sample
    assert v2.LeanVerify.build() == (None, f"no module of {', '.join(v2.LeanVerify.VERIFY_MODULES)} calls eagle_sample")


def test_an_error_in_the_verify_puts_the_stock_functions_back(release: Release) -> None:
    class Failing(Worker):
        def verify(self, batch: Any, grammar_barrier: Any = None) -> Any:
            super().verify(batch)
            raise RuntimeError("the target forward failed")

    worker = Failing(release.common)
    lean = v2.LeanVerify.install(worker)
    assert lean is not None
    with pytest.raises(RuntimeError, match="the target forward failed"):
        worker.verify(batch_of(LOGITS))
    assert worker.seen_in_verify == [lean.sample]  # the stand-in was in place, and is gone
    assert release.common.eagle_sample is lean.stock_sample
    assert release.common.fill_bonus_tokens_func is lean.stock_fill


def test_the_constant_tensors_grow_with_the_batch_and_keep_what_was_handed_out(release: Release) -> None:
    worker = Worker(release.common)
    lean = v2.LeanVerify.install(worker)
    assert lean is not None
    small = worker.verify(batch_of(LOGITS[:2]))
    big = worker.verify(batch_of(LOGITS * 2))
    assert small.accept_lens.values == [1, 1] and small.accept_index.values == [[0], [1]]
    assert big.accept_lens.values == [1] * 6 and big.accept_index.values == [[i] for i in range(6)]
    assert big.bonus_tokens.values == [1, 0, 2, 1, 0, 2]


def test_the_bonus_stand_in_leaves_wider_trees_to_the_kernel(release: Release) -> None:
    lean, _ = v2.LeanVerify.build()
    assert lean is not None
    bonus = T([None, None], "torch.int32")
    lean.fill_bonus(T([[5, 6], [7, 8]], "torch.int32"), T([2, 1], "torch.int32"), bonus, 2, 2)
    assert release.calls == ["stock fill"] and bonus.values == [6, 7]


def test_rocm_with_tensor_parallelism_keeps_the_stock_verify(
    release: Release, caplog: pytest.LogCaptureFixture
) -> None:
    """From 0.5.20 the greedy branch broadcasts rank 0's tokens on ROCm; the lean sample would not."""
    sys.modules["torch"].version = SimpleNamespace(hip="6.2")  # type: ignore[attr-defined]
    with caplog.at_level(logging.INFO, logger=v2.logger.name):
        assert v2.LeanVerify.install(Worker(release.common, tp_size=2)) is None
    assert "ROCm with tensor parallelism" in caplog.text
    assert v2.LeanVerify.install(Worker(release.common, tp_size=1)) is not None  # one GPU: nothing to broadcast
    sys.modules["torch"].version = SimpleNamespace(hip=None)  # type: ignore[attr-defined]
    assert v2.LeanVerify.install(Worker(release.common, tp_size=2)) is not None  # CUDA


def test_the_first_refusal_says_why_once(release: Release, caplog: pytest.LogCaptureFixture) -> None:
    worker = Worker(release.common)
    lean = v2.LeanVerify.install(worker, log=True)
    assert lean is not None
    with caplog.at_level(logging.INFO, logger=v2.logger.name):
        worker.verify(batch_of(LOGITS, idle=True))  # idle batches are not refusals worth a line
        worker.verify(batch_of(LOGITS, greedy=False))
        worker.verify(batch_of(LOGITS, return_logprob=True))
    said = [r.message for r in caplog.records if "left a batch to the stock sample" in r.message]
    assert said == ["dynspec: the lean zero-step verify left a batch to the stock sample (sampling)"]
    assert lean.refused == 2


# -- FallbackLeanSample (0.5.4 - 0.5.13): the own fallback's one-node tree ---------------------------


def own_verify_input_class(release: Release) -> type:
    """0.5.4 - 0.5.13's ``EagleVerifyInput`` as the verify calls it: ``sample`` is a method (the
    stock algorithm as ``stock_eagle_sample`` transcribes it; these releases' tree has depth
    ``spec_steps + 1``, 1 for the fallback's tree)."""
    stock = stock_eagle_sample(release.calls, None)

    class EagleVerifyInput:
        def __init__(self, draft_token_num: int = 1, positions: Any = None) -> None:
            self.draft_token_num, self.max_tree_depth = draft_token_num, 1
            self.positions = positions  # trivial_verify_input's: seq_lens

        def sample(self, batch: Any, logits_output: Any, vocab_mask: Any = None) -> Any:
            return stock(self, batch, logits_output, vocab_mask)

    return EagleVerifyInput


def own_verify(verify_input: Any, batch: Any) -> Any:
    """The own fallback's verify tail (0.5.12 ``eagle_worker_v2.py:1070-1095``): the method call, the
    gather of the accepted tokens, the bonus kernel (a request's last accepted token)."""
    predict, accept_lens, accept_index = verify_input.sample(batch, batch.logits_output, None)
    accept_tokens = predict[accept_index]
    bonus = [row[n - 1] for row, n in zip(accept_tokens.values, accept_lens.values)]
    return SimpleNamespace(
        next_token_ids=predict, accept_lens=accept_lens, accept_index=accept_index, bonus_tokens=T(bonus, "torch.int32")
    )


def test_the_own_fallbacks_verify_input_samples_lean_with_the_stock_outcome(release: Release) -> None:
    cls = own_verify_input_class(release)
    expected = outcome(own_verify(cls(), batch_of(LOGITS)))
    release.calls.clear()
    lean = v2.FallbackLeanSample.install(None, log=False)
    assert lean is not None
    bound = lean.bind(cls())
    assert outcome(own_verify(bound, batch_of(LOGITS))) == expected
    assert release.calls == [] and (lean.taken, lean.refused) == (1, 0)  # no stock sample, no sanitize
    assert outcome(own_verify(cls(), batch_of(LOGITS))) == expected and release.calls == [
        "stock sample"
    ]  # unbound: stock


@pytest.mark.parametrize(
    ("fields", "tree"),
    [({"greedy": False}, 1), ({"return_logprob": True}, 1), ({"logit_bias": T([0])}, 1), ({}, 4)],
)
def test_the_own_fallbacks_lean_sample_leaves_what_it_does_not_know_to_the_stock_method(
    release: Release, fields: dict, tree: int
) -> None:
    cls = own_verify_input_class(release)
    lean = v2.FallbackLeanSample.install(None, log=False)
    assert lean is not None
    verify_input = lean.bind(cls(draft_token_num=tree))
    batch = batch_of(LOGITS[:1] * tree if tree > 1 else LOGITS, **fields)
    batch.seq_lens = T([10] * (1 if tree > 1 else 3))
    own_verify(verify_input, batch)
    assert release.calls == ["stock sample"] and lean.refused == 1


def test_the_own_fallbacks_lean_sample_mirrors_the_simulated_token_and_says_when_it_cannot(release: Release) -> None:
    release.spec_utils.SIMULATE_ACC_LEN = 3.0  # type: ignore[attr-defined]
    lean = v2.FallbackLeanSample.install(None, log=False)
    assert lean is not None and lean.simulated_token == v2.LeanVerify.SIMULATED_TOKEN
    got = outcome(own_verify(lean.bind(own_verify_input_class(release)()), batch_of(LOGITS)))
    assert got[0] == [100, 100, 100] and got[6] == [100, 100, 100]
    release.spec_utils.SIMULATE_ACC_METHOD = "multinomial"  # type: ignore[attr-defined]
    assert v2.FallbackLeanSample.install(None, log=False) is None


def test_the_own_fallbacks_lean_sample_is_switched_off_by_the_environment(
    release: Release, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(v2.LEAN_VERIFY_ENV, "0")
    assert v2.FallbackLeanSample.install(None, log=False) is None


def test_the_own_fallback_binds_the_lean_sample_to_its_trivial_tree_only() -> None:
    """Pinned in the source: ``trivial_verify_input`` (which needs SGLang to run) returns the bound
    input, the plain one without a lean sample, and ``attach_fallback`` installs it."""
    import inspect

    source = inspect.getsource(v2.V2Fallback.trivial_verify_input)
    assert "return verify_input if self.lean is None else self.lean.bind(verify_input)" in source
    assert "fallback.lean = FallbackLeanSample.install(worker.target_worker.model_runner, log=rank0)" in (
        inspect.getsource(v2.attach_fallback)
    )


def test_without_spec_utils_the_own_fallback_samples_stock_and_says_why(
    release: Release, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert v2.FallbackLeanSample.install(None, log=False) is not None  # the control
    monkeypatch.delitem(sys.modules, SPEC_UTILS)
    with caplog.at_level(logging.INFO, logger=v2.logger.name):
        assert v2.FallbackLeanSample.install(None, log=True) is None
    assert "no sglang.srt.speculative.spec_utils" in caplog.text


# -- DecodeSample: sampled batches drawn by the target's sampler, as plain decode draws them -----------


class Sampler(SixParameterSampler):
    """Draws the token after each row's argmax, as int64, so that its tokens differ from the verify's;
    overwrites the rows it is given first, as the real sampler does."""

    def draw(self, logits: Any) -> T:
        rows = logits.values
        tokens = [(row.index(max(row)) + 1) % len(row) for row in rows]
        for row in rows:
            row[:] = [0.0] * len(row)
        return T(tokens, "torch.int64")


DRAWN = [2, 1, 0]  # the fake sampler's tokens for LOGITS (the verify's argmax is 1, 0, 2)


def logits() -> list[list[float]]:
    return [list(row) for row in LOGITS]  # a batch's own rows: the sampler writes into what it gets


def test_a_sampled_zero_step_batch_is_drawn_by_the_targets_sampler(release: Release) -> None:
    sampler = Sampler()
    worker = Worker(release.common, sampler=sampler)
    lean = v2.LeanVerify.install(worker)
    assert lean is not None and lean.decode_sample is not None
    batch = batch_of(logits(), greedy=False)
    got = outcome(worker.verify(batch))
    # the sampler's tokens are accepted and are the bonus tokens; one each, at its own row
    assert got == (DRAWN, "torch.int32", [1, 1, 1], "torch.int32", [[0], [1], [2]], "torch.int32", DRAWN)
    assert release.calls == ["sanitize verify: target model logits"]  # neither stock function ran
    (call,) = sampler.calls
    assert call.sampling_info is batch.sampling_info and call.return_logprob is False
    assert call.top_logprobs_nums is batch.top_logprobs_nums and call.token_ids_logprobs is batch.token_ids_logprobs
    assert call.positions.values == [10, 11, 12]  # the one node's: the first rows of the verify input's
    # without logprobs the sampler works on the verify's own logits, as plain decode's does: no copy
    assert batch.logits_output.next_token_logits.values != LOGITS
    assert (lean.taken, lean.drawn, lean.refused) == (1, 1, 0)


def test_a_sampled_batch_with_logprobs_is_drawn_on_a_copy(release: Release) -> None:
    """The verify computes logprobs after the sample, from the logits, which the draw leaves as they were."""
    worker = Worker(release.common, sampler=Sampler())
    lean = v2.LeanVerify.install(worker)
    assert lean is not None
    batch = batch_of(logits(), greedy=False, return_logprob=True)
    assert outcome(worker.verify(batch))[0] == DRAWN
    assert batch.logits_output.next_token_logits.values == LOGITS


def test_the_draw_has_teeth(release: Release, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative controls: left to the stock sample, the batch gets the verify's tokens; drawn on the
    verify's own logits (no copy) for a batch with logprobs, the logits they are read from are gone."""
    worker = Worker(release.common, sampler=Sampler())
    lean = v2.LeanVerify.install(worker)
    assert lean is not None
    decode_sample, lean.decode_sample = lean.decode_sample, None
    got = outcome(worker.verify(batch_of(logits(), greedy=False)))
    assert got[0] == [1, 0, 2] != DRAWN and release.calls[0] == "stock sample"
    lean.decode_sample = decode_sample
    monkeypatch.setattr(T, "clone", lambda self: self)
    batch = batch_of(logits(), greedy=False, return_logprob=True)
    worker.verify(batch)
    assert batch.logits_output.next_token_logits.values != LOGITS


@pytest.mark.parametrize(
    "why, fields",
    [
        ("acc_additive_penalties", {"acc_additive_penalties": T([0.5])}),
        ("acc_scaling_penalties", {"acc_scaling_penalties": T([1.1])}),
        ("logit_bias", {"logit_bias": T([0.0])}),
        # 0.5.4 - 0.5.10: the penalties' sum, which plain decode adds and their verify does not
        ("acc_linear_penalties", {"acc_linear_penalties": T([0.5])}),
        # a penalizer plain decode applies itself (min_new_tokens; every release)
        ("penalties", {"penalizer_orchestrator": SimpleNamespace(is_required=True)}),
        ("grammar", {"has_grammar": True}),
        ("a custom logit processor", {"has_custom_logit_processor": True}),
        ("sampling masks", {"return_sampling_masks": [False, True, False]}),
        ("sampling masks", {"sampling_mask_batch_indices": T([1])}),  # 0.5.20+: what the sampler reads
        ("positions not one per request", {"positions": T([10, 11])}),
        ("positions not one per request", {"positions": None}),
    ],
)
def test_sampled_batches_the_verify_and_plain_decode_prepare_apart_take_the_stock_sample(
    release: Release, why: str, fields: dict
) -> None:
    sampler = Sampler()
    worker = Worker(release.common, sampler=sampler)
    lean = v2.LeanVerify.install(worker)
    assert lean is not None and lean.decode_sample is not None
    batch = batch_of(logits(), greedy=False, **fields)
    assert lean.refusal(batch.spec_info, batch, batch.logits_output.next_token_logits, (), {}) == why
    worker.verify(batch)
    assert release.calls[0] == "stock sample" and sampler.calls == []
    assert (lean.taken, lean.drawn, lean.refused) == (0, 0, 1)


@pytest.mark.parametrize(
    "fields",
    [
        {"penalizer_orchestrator": SimpleNamespace(is_required=False)},  # an orchestrator with nothing to apply
        {"return_sampling_masks": [False] * 3},  # a flag per request, all off
    ],
)
def test_fields_present_but_off_do_not_refuse(release: Release, fields: dict) -> None:
    """The controls of the penalizer's and the masks' refusals: such a batch is drawn."""
    worker = Worker(release.common, sampler=Sampler())
    lean = v2.LeanVerify.install(worker)
    assert lean is not None
    assert outcome(worker.verify(batch_of(logits(), greedy=False, **fields)))[0] == DRAWN


def test_under_simulated_acceptance_sampled_batches_stay_with_the_stock_sample(
    release: Release, caplog: pytest.LogCaptureFixture
) -> None:
    release.spec_utils.SIMULATE_ACC_LEN = 3.0  # type: ignore[attr-defined]
    worker = Worker(release.common, sampler=Sampler())
    with caplog.at_level(logging.INFO, logger=v2.logger.name):
        lean = v2.LeanVerify.install(worker, log=True)
    assert lean is not None and lean.decode_sample is None and lean.simulated_token == 100
    assert "leaves sampled batches to the stock sample (SGLANG_SIMULATE_ACC_LEN decides their tokens)" in caplog.text
    worker.verify(batch_of(logits(), greedy=False))
    assert release.calls[0] == "stock sample"


class OtherSampler(Sampler):
    def forward(self, logits_output: Any, sampling_info: Any, positions: Any) -> T:  # type: ignore[override]
        raise AssertionError("not called")


@pytest.mark.parametrize(
    "runner, words",
    [
        (
            SimpleNamespace(sampler=OtherSampler()),
            "the target's sampler takes (logits_output, sampling_info, positions)",
        ),
        (SimpleNamespace(), "the target's model runner has no sampler"),
        (None, "the target's model runner has no sampler"),
        (SimpleNamespace(sampler=object()), "the target's sampler has no forward to read"),
    ],
)
def test_a_sampler_it_does_not_know_leaves_sampled_batches_to_the_stock_sample_and_says_so(
    release: Release, caplog: pytest.LogCaptureFixture, runner: Any, words: str
) -> None:
    assert v2.DecodeSample.of(runner) == (None, words)
    worker = Worker(release.common)
    worker.target_worker = SimpleNamespace(model_runner=runner)
    with caplog.at_level(logging.INFO, logger=v2.logger.name):
        lean = v2.LeanVerify.install(worker, log=True)
    assert lean is not None and lean.decode_sample is None
    assert f"the lean zero-step verify leaves sampled batches to the stock sample ({words})" in caplog.text
    assert outcome(worker.verify(batch_of(logits())))[0] == [1, 0, 2]  # greedy batches stay lean


def test_the_first_draw_is_said_once(release: Release, caplog: pytest.LogCaptureFixture) -> None:
    worker = Worker(release.common, sampler=Sampler())
    with caplog.at_level(logging.INFO, logger=v2.logger.name):
        lean = v2.LeanVerify.install(worker, log=True)
        for _ in range(3):
            worker.verify(batch_of(logits(), greedy=False))
    assert lean is not None and lean.drawn == 3
    said = [r.message for r in caplog.records if "sampled" in r.message]
    assert said == [
        "dynspec: the lean zero-step verify draws sampled batches with the target's sampler, as plain decode does",
        "dynspec: the lean zero-step verify drew its first sampled batch with the target's sampler",
    ]


def test_the_own_fallbacks_lean_sample_draws_sampled_batches_with_the_targets_sampler(release: Release) -> None:
    sampler = Sampler()
    lean = v2.FallbackLeanSample.install(SimpleNamespace(sampler=sampler), log=False)
    assert lean is not None and lean.decode_sample is not None
    cls = own_verify_input_class(release)
    got = outcome(own_verify(lean.bind(cls(positions=T([10, 11, 12]))), batch_of(logits(), greedy=False)))
    assert got == (DRAWN, "torch.int32", [1, 1, 1], "torch.int32", [[0], [1], [2]], "torch.int32", DRAWN)
    assert release.calls == [] and sampler.calls[0].positions.values == [10, 11, 12]  # no sanitize on 0.5.4 - 0.5.13
    # the control: an input without positions is left to the stock method, which takes the argmax here
    assert outcome(own_verify(lean.bind(cls()), batch_of(logits(), greedy=False)))[0] == [1, 0, 2]
    assert release.calls == ["stock sample"] and len(sampler.calls) == 1


def test_the_sampled_draw_is_switched_off_alone_by_the_environment(
    release: Release, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """DYNSPEC_DECODE_SAMPLE=0: sampled batches take the verify's draw, greedy ones stay lean (the A/B)."""
    monkeypatch.setenv(v2.DECODE_SAMPLE_ENV, "0")
    worker = Worker(release.common, sampler=Sampler())
    with caplog.at_level(logging.INFO, logger=v2.logger.name):
        lean = v2.LeanVerify.install(worker, log=True)
    assert lean is not None and lean.decode_sample is None
    assert "leaves sampled batches to the stock sample (DYNSPEC_DECODE_SAMPLE=0)" in caplog.text
    assert outcome(worker.verify(batch_of(logits())))[0] == [1, 0, 2] and release.calls[0].startswith("sanitize")
    monkeypatch.setenv(v2.DECODE_SAMPLE_ENV, "1")  # the control
    assert v2.LeanVerify.install(Worker(release.common, sampler=Sampler())).decode_sample is not None  # type: ignore[union-attr]
    monkeypatch.setenv(v2.DECODE_SAMPLE_ENV, "yes")
    with pytest.raises(ValueError, match="DYNSPEC_DECODE_SAMPLE must be 0 or 1, not 'yes'"):
        v2.LeanVerify.install(Worker(release.common, sampler=Sampler()))


class KeywordSampler(Sampler):
    """0.5.22+'s: a keyword-only parameter after the six, with a default."""

    def forward(  # type: ignore[override]
        self, logits_output: Any, sampling_info: Any, return_logprob: bool, top_logprobs_nums: Any,
        token_ids_logprobs: Any, positions: Any, *, logprob_logits: Any = None,
    ) -> T:  # fmt: skip
        return super().forward(
            logits_output, sampling_info, return_logprob, top_logprobs_nums, token_ids_logprobs, positions
        )


class NeedsMoreSampler(KeywordSampler):
    """A seventh parameter without a default: the draw's call would raise a TypeError."""

    def forward(  # type: ignore[override]
        self, logits_output: Any, sampling_info: Any, return_logprob: bool, top_logprobs_nums: Any,
        token_ids_logprobs: Any, positions: Any, mode: str,
    ) -> T:  # fmt: skip
        raise AssertionError("not called")


def test_a_sampler_is_taken_only_where_the_six_arguments_are_all_it_needs(release: Release) -> None:
    six = v2.DecodeSample.of(SimpleNamespace(sampler=Sampler()))[0]
    assert six is not None and six.tp_group is None  # one GPU here: no group to broadcast over
    assert v2.DecodeSample.of(SimpleNamespace(sampler=KeywordSampler()))[0] is not None
    refused, why = v2.DecodeSample.of(SimpleNamespace(sampler=NeedsMoreSampler()))
    assert refused is None and why.endswith("token_ids_logprobs, positions, mode)")


def test_on_rocm_sampled_batches_keep_the_verifys_argmax(release: Release) -> None:
    """ROCm's verify takes the argmax of a sampled batch (always-on speculation's output there)."""
    sys.modules["torch"].version = SimpleNamespace(hip="6.2")  # type: ignore[attr-defined]
    assert v2.DecodeSample.of(SimpleNamespace(sampler=Sampler())) == (
        None,
        "on ROCm the verify takes the argmax of a sampled batch, as always-on speculation does",
    )
    sys.modules["torch"].version = SimpleNamespace(hip=None)  # type: ignore[attr-defined]
    assert v2.DecodeSample.of(SimpleNamespace(sampler=Sampler()))[0] is not None  # the control: CUDA


def test_with_tensor_parallelism_every_rank_commits_rank_0s_tokens(release: Release) -> None:
    broadcasts: list[tuple[Any, int]] = []
    group = SimpleNamespace(broadcast=lambda tensor, src: broadcasts.append((tensor, src)))
    batch = batch_of(logits(), greedy=False)
    tokens = v2.DecodeSample(Sampler(), tp_group=group).draw(batch, batch.spec_info, batch.logits_output)
    assert tokens.values == DRAWN and broadcasts == [(tokens, 0)]  # the tokens returned, broadcast in place
    batch = batch_of(logits(), greedy=False)
    v2.DecodeSample(Sampler()).draw(batch, batch.spec_info, batch.logits_output)  # the control: one GPU
    assert len(broadcasts) == 1
