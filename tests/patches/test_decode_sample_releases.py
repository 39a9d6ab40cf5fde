"""What ``DecodeSample`` assumes about every release whose one-node verify it draws for, pinned against the real sources.

While speculation is off, ``LeanVerify`` (0.5.14+), ``FallbackLeanSample`` (0.5.4 - 0.5.13) and v1's
``LeanFallbackStep`` (0.5.12) hand a sampled batch to the target model runner's ``Sampler``, as plain
decode does, instead of the verify's top-k-renormalising draw. That is plain decode's draw only while each release:

1. gives ``Sampler.forward`` the six parameters ``DecodeSample.PARAMETERS`` names, in that order;
2. keeps the sampler at ``ModelRunner.sampler`` and calls it for a decode step with the forward
   batch's sampling info, logprob flags and positions, in that order;
3. (0.5.14+) builds the zero-step verify input with the batch's ``seq_lens`` as positions (the input
   token's position, which a decode step's forward batch has too), in a buffer's first rows or alone;
4. computes no logprobs in the verify's sample (it may read ``return_logprob``), so that drawing with ``return_logprob`` off leaves
   the logprobs to the verify, as the stock sample does;
5. has ``Sampler.forward`` write to ``logits_output`` only under ``return_logprob`` (passed off) or
   ``return_sampling_mask`` (taken from ``sampling_info.return_sampling_masks``, from 0.5.20 from
   ``sampling_info.sampling_mask_batch_indices``: the draw refuses either), and never to
   ``sampling_info``: what the draw's shallow copy and its refusals rely on;
6. prepares a decode step's logits (``ModelRunner._preprocess_logits``) only with the grammar's mask
   and ``SamplingBatchInfo.apply_logits_bias``, which reads no field the draw's refusal does not
   (the penalties, the penalizer, the logit bias; the grammar's fields, refused with the grammar).

Each fact is a checker taking source text and returning its problems: ``[]`` on every real release,
and non-empty on a mutated source (the negative controls at the end). No torch and no importing
sglang: the sources come from the cached PyPI wheels. The behaviour is tested with fakes in
test_lean_verify.py; the distribution itself only a GPU shows (``dynspec proof --checks sampling``).
"""

from __future__ import annotations

import ast
from collections.abc import Callable

import pytest

from patches.eagle_worker_v2_dynspec_fallback import EagleWorkerV2DynspecFallback
from patches.eagle_worker_v2_dynspec_zero_step import EagleWorkerV2DynspecZeroStep
from patches.runtime import dynspec_v2 as v2
from tests.conftest import releases_of
from tests.patches.real_release import classes, methods, release_source

ZERO_STEP = releases_of(EagleWorkerV2DynspecZeroStep)
OWN_FALLBACK = releases_of(EagleWorkerV2DynspecFallback)
DRAWN_FOR = sorted(set(ZERO_STEP) | set(OWN_FALLBACK), key=lambda v: [int(x) for x in v.split(".")[:3]])

SAMPLER = "srt/layers/sampler.py"
MODEL_RUNNER = "srt/model_executor/model_runner.py"
V2_WORKER = "srt/speculative/eagle_worker_v2.py"
EAGLE_UTILS = "srt/speculative/eagle_utils.py"  # eagle_sample, 0.5.14+
EAGLE_INFO_V2 = "srt/speculative/eagle_info_v2.py"  # EagleVerifyInput.sample, 0.5.4 - 0.5.13
SAMPLING_INFO = "srt/sampling/sampling_batch_info.py"
MEMBERS = [SAMPLER, MODEL_RUNNER, V2_WORKER, EAGLE_UTILS, EAGLE_INFO_V2, SAMPLING_INFO]
# What plain decode hands the sampler (0.5.4 - 0.5.23), the sixth being the decode step's positions.
DECODE_CALL = (
    "logits_output",
    "forward_batch.sampling_info",
    "forward_batch.return_logprob",
    "forward_batch.top_logprobs_nums",
    "forward_batch.token_ids_logprobs",
)


def source_of(version: str, member: str) -> str:
    return release_source(version, MEMBERS, member)


def function(tree: ast.AST, name: str) -> ast.FunctionDef | None:
    return next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name), None)


# -- 1. the sampler's parameters ----------------------------------------------------------------------


def sampler_parameter_problems(source: str) -> list[str]:
    sampler = classes(source).get("Sampler")
    if sampler is None:
        return ["no class Sampler"]
    forward = methods(sampler).get("forward")
    if forward is None:
        return ["Sampler has no forward"]
    names = tuple(a.arg for a in [*forward.args.posonlyargs, *forward.args.args][1:])  # without self
    head = names[: len(v2.DecodeSample.PARAMETERS)]
    if head != v2.DecodeSample.PARAMETERS:
        return [f"Sampler.forward takes {names}"]
    required_keywords = [a.arg for a, d in zip(forward.args.kwonlyargs, forward.args.kw_defaults) if d is None]
    if required_keywords or len(names) > len(head):
        return [f"Sampler.forward needs more: {names[len(head) :] + tuple(required_keywords)}"]
    return []


# -- 2. where plain decode finds the sampler and what it hands it --------------------------------------


def decode_call_problems(source: str) -> list[str]:
    runner = classes(source).get("ModelRunner")
    if runner is None:
        return ["no class ModelRunner"]
    assigned = any(
        ast.unparse(t) == "self.sampler" for n in ast.walk(runner) if isinstance(n, ast.Assign) for t in n.targets
    )
    calls = [n for n in ast.walk(runner) if isinstance(n, ast.Call) and ast.unparse(n.func) == "self.sampler"]
    problems = [] if assigned else ["ModelRunner never sets self.sampler"]
    if len(calls) != 1:
        return [*problems, f"ModelRunner calls self.sampler {len(calls)} times"]
    args = [ast.unparse(a) for a in calls[0].args]
    if tuple(args[:5]) != DECODE_CALL or len(args) != 6:
        problems.append(f"plain decode calls the sampler with ({', '.join(args)})")
        return problems
    # a decode step's positions: the forward batch's, chosen by its mode (a prefill's are seq_lens - 1)
    positions = calls[0].args[5]
    if not (
        isinstance(positions, ast.IfExp)
        and ast.unparse(positions.test) == "forward_batch.forward_mode.is_decode()"
        and ast.unparse(positions.body) == "forward_batch.positions"
    ):
        problems.append(f"plain decode's positions are {args[5]}")
    return problems


# -- 3. the zero-step verify input's positions (0.5.14+) ----------------------------------------------


# The writes 0.5.14 - 0.5.23 make: the seq_lens alone, or into the first rows of the graph's buffer.
SEQ_LENS_WRITES = ("batch.seq_lens.to(torch.int64)", "position_buf", "positions[:bs].copy_(batch.seq_lens)")


def trivial_positions_problems(source: str) -> list[str]:
    build = function(ast.parse(source), "_build_trivial_verify_input")
    if build is None:
        return ["no _build_trivial_verify_input"]
    writes = []
    for node in ast.walk(build):
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["positions"]:
            writes.append(ast.unparse(node.value))
        elif isinstance(node, ast.Call) and ast.unparse(node.func).startswith("positions[:bs].copy_"):
            writes.append(ast.unparse(node))
    problems = [f"positions are also {w}" for w in writes if w not in SEQ_LENS_WRITES]
    if not any(w in SEQ_LENS_WRITES and "seq_lens" in w for w in writes):
        problems.append("positions are never the batch's seq_lens")
    passed = [k for n in ast.walk(build) if isinstance(n, ast.Call) for k in n.keywords if k.arg == "positions"]
    if [ast.unparse(k.value) for k in passed] != ["positions"]:
        problems.append("the verify input is not built with those positions")
    return problems


# -- 4. the verify's sample computes no logprobs ------------------------------------------------------


def sample_logprob_problems(sample: ast.FunctionDef | None, name: str) -> list[str]:
    if sample is None:
        return [f"no {name}"]
    # Reading the flag is not computing them (0.5.22+ reads it to copy the logits for a watermark).
    words = {n.attr for n in ast.walk(sample) if isinstance(n, ast.Attribute)}
    words |= {n.id for n in ast.walk(sample) if isinstance(n, ast.Name)}
    mentions = sorted(w for w in words if "logprob" in w and w != "return_logprob")
    return [f"{name} reads or writes {', '.join(mentions)}"] if mentions else []


def verify_sample_of(version: str) -> tuple[ast.FunctionDef | None, str]:
    if version in ZERO_STEP:
        return function(ast.parse(source_of(version, EAGLE_UTILS)), "eagle_sample"), "eagle_sample"
    verify_input = classes(source_of(version, EAGLE_INFO_V2)).get("EagleVerifyInputV2Mixin")
    sample = methods(verify_input).get("sample") if verify_input is not None else None
    return sample, "EagleVerifyInputV2Mixin.sample"


# -- 5. what the sampler writes -------------------------------------------------------------------

SAMPLER_WRITE_GATES = ("return_logprob", "return_sampling_mask")
MASK_FIELDS = (
    "sampling_info.return_sampling_masks",
    "sampling_info.sampling_mask_batch_indices",
)  # DecodeSample.refusal's


def enclosing_tests(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[str]:
    tests, at = [], parents.get(node)
    while at is not None:
        if isinstance(at, ast.If):
            tests.append(ast.unparse(at.test))
        at = parents.get(at)
    return tests


def sampler_write_problems(source: str) -> list[str]:
    sampler = classes(source).get("Sampler")
    forward = methods(sampler).get("forward") if sampler is not None else None
    if forward is None:
        return ["no Sampler.forward"]
    parents = {child: parent for parent in ast.walk(forward) for child in ast.iter_child_nodes(parent)}
    # a local bound to a sampling-info field reads as that field (0.5.20+: sampling_mask_batch_indices)
    bound = {
        n.targets[0].id: ast.unparse(n.value)
        for n in ast.walk(forward)
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
        and ast.unparse(n.value).startswith("sampling_info.")
    }  # fmt: skip
    problems = []
    for node in ast.walk(forward):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        )
        written = [ast.unparse(t) for t in targets]
        if any(w.startswith("sampling_info.") for w in written):
            problems.append(f"writes {', '.join(written)}")
        writes_output = any(w.startswith("logits_output.") for w in written) or (
            isinstance(node, ast.Call) and any(ast.unparse(a) == "logits_output" for a in node.args)
        )
        if writes_output and not set(enclosing_tests(node, parents)) & set(SAMPLER_WRITE_GATES):
            problems.append(
                f"writes the logits output outside {' / '.join(SAMPLER_WRITE_GATES)}: {ast.unparse(node)[:60]}"
            )
        if written == ["return_sampling_mask"]:
            read = {ast.unparse(n) for n in ast.walk(node.value)}  # type: ignore[union-attr]
            read |= {bound[name] for name in read if name in bound}
            if not read & set(MASK_FIELDS):
                problems.append(f"the mask flag is not read from {' or '.join(MASK_FIELDS)}: {ast.unparse(node)}")
    return problems


# -- 6. how plain decode prepares the logits it samples ----------------------------------------------

# What ``_preprocess_logits`` may call on the sampling info: the grammar's mask (a batch with grammar is
# refused) and the bias (0.5.23 with an observer too).
PREPARES = ("update_regex_vocab_mask", "apply_logits_bias", "apply_logits_bias_with_observer")
# The grammar's mask, by release: a batch with a grammar is refused before these are read.
GRAMMAR_FIELDS = ("vocab_mask", "apply_mask_func", "grammar_mask")


def refused_fields() -> set[str]:
    """The sampling-info fields whose being set makes ``DecodeSample.refusal`` leave a batch to the verify."""
    return {*v2.LeanVerify.PENALTIES, *v2.DecodeSample.PLAIN_DECODE_BIASES, "penalizer_orchestrator", *GRAMMAR_FIELDS}


def self_reads(cls: ast.ClassDef, name: str, seen: set[str]) -> set[str]:
    """The ``self.`` fields method ``name`` of ``cls`` reads, with those of the methods it calls on self."""
    seen.add(name)
    own = methods(cls)
    if name not in own:
        return {f"<no method {name}>"}
    read: set[str] = set()
    for node in ast.walk(own[name]):
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"):
            continue
        if node.attr not in own:
            read.add(node.attr)
        elif node.attr not in seen:
            read |= self_reads(cls, node.attr, seen)
    return read


def logit_bias_problems(runner_source: str, info_source: str) -> list[str]:
    runner = classes(runner_source).get("ModelRunner")
    preprocess = methods(runner).get("_preprocess_logits") if runner is not None else None
    if preprocess is None:
        return ["no ModelRunner._preprocess_logits"]
    called = {
        ast.unparse(n.func).removeprefix("sampling_info.")
        for n in ast.walk(preprocess)
        if isinstance(n, ast.Call) and ast.unparse(n.func).startswith("sampling_info.")
    }
    problems = [f"plain decode's logits go through sampling_info.{c}" for c in sorted(called - set(PREPARES))]
    info = classes(info_source).get("SamplingBatchInfo")
    if info is None:
        return [*problems, "no class SamplingBatchInfo"]
    unrefused = self_reads(info, "apply_logits_bias", set()) - refused_fields()
    problems += [f"apply_logits_bias reads {f}, which the draw does not refuse" for f in sorted(unrefused)]
    return problems


def verify_sample_problems(version: str) -> list[str]:
    sample, name = verify_sample_of(version)
    return sample_logprob_problems(sample, name)


# fact: (its checker of a version, the versions it is pinned on)
FACTS: dict[str, tuple[Callable[[str], list[str]], list[str]]] = {
    "1 the sampler's parameters": (lambda v: sampler_parameter_problems(source_of(v, SAMPLER)), DRAWN_FOR),
    "2 plain decode's call": (lambda v: decode_call_problems(source_of(v, MODEL_RUNNER)), DRAWN_FOR),
    "3 the zero-step positions": (lambda v: trivial_positions_problems(source_of(v, V2_WORKER)), ZERO_STEP),
    "4 no logprobs in the sample": (verify_sample_problems, DRAWN_FOR),
    "5 the sampler's writes": (lambda v: sampler_write_problems(source_of(v, SAMPLER)), DRAWN_FOR),
    "6 plain decode's logits": (
        lambda v: logit_bias_problems(source_of(v, MODEL_RUNNER), source_of(v, SAMPLING_INFO)),
        DRAWN_FOR,
    ),
}


@pytest.mark.releases
@pytest.mark.parametrize(("fact", "version"), [(fact, v) for fact, (_, versions) in FACTS.items() for v in versions])
def test_every_release_holds_what_the_draw_assumes(fact: str, version: str) -> None:
    check, _ = FACTS[fact]
    assert check(version) == [], f"{version}, fact {fact}"


# -- negative controls: each checker reports the change it exists to catch ---------------------------

NEWEST = ZERO_STEP[-1]
OLDEST = OWN_FALLBACK[0]


def mutated(source: str, old: str, new: str) -> str:
    assert old in source, f"the control's anchor is not in the source: {old!r}"  # else the control tests nothing
    return source.replace(old, new, 1)


# a check over one member's source: the checker and the member it reads
SOURCE_CHECKS: dict[str, tuple[Callable[[str], list[str]], str]] = {
    "parameters": (sampler_parameter_problems, SAMPLER),
    "decode call": (decode_call_problems, MODEL_RUNNER),
    "positions": (trivial_positions_problems, V2_WORKER),
    "writes": (sampler_write_problems, SAMPLER),
}
SYNC = "        self._sync_token_ids_across_tp(batch_next_token_ids, sampling_info)\n"
CHANGES = [
    # Sampler.forward: a parameter gone (the draw's arguments shift), one more without a default, a keyword-only one
    ("parameters", NEWEST, "        return_logprob: bool,\n", ""),
    ("parameters", NEWEST, "        positions: torch.Tensor,\n", "        positions: torch.Tensor,\n        extra: int,\n"),
    ("parameters", NEWEST, "        positions: torch.Tensor,\n        *,\n", "        positions: torch.Tensor,\n        *,\n        mode,\n"),
    # plain decode's call: two arguments swapped, the sampler renamed, other positions
    ("decode call", NEWEST,
     "            forward_batch.return_logprob,\n            forward_batch.top_logprobs_nums,\n",
     "            forward_batch.top_logprobs_nums,\n            forward_batch.return_logprob,\n"),
    ("decode call", NEWEST, "        self.sampler = create_sampler()", "        self.token_sampler = create_sampler()"),
    ("decode call", NEWEST, "                forward_batch.positions\n", "                forward_batch.seq_lens\n"),
    # the branches swapped: a decode step would get seq_lens - 1
    ("decode call", NEWEST,
     "                forward_batch.positions\n                if forward_batch.forward_mode.is_decode()\n"
     "                else forward_batch.seq_lens - 1\n",
     "                forward_batch.seq_lens - 1\n                if forward_batch.forward_mode.is_decode()\n"
     "                else forward_batch.positions\n"),
    # the zero-step verify input's positions
    ("positions", NEWEST, "positions = batch.seq_lens.to(torch.int64)", "positions = batch.seq_lens.to(torch.int64) + 1"),
    ("positions", NEWEST, "positions = batch.seq_lens.to(torch.int64)", "positions = torch.zeros_like(batch.input_ids)"),
    ("positions", ZERO_STEP[0], "positions[:bs].copy_(batch.seq_lens)", "positions[:bs].copy_(batch.seq_lens + 1)"),
    ("positions", NEWEST, "            positions=positions,\n", "            positions=None,\n"),
    # the sampler: a write to the logits output that every call makes, one to the sampling info, and
    # the mask flag from another field than the one the draw refuses
    ("writes", NEWEST, SYNC, SYNC + "        logits_output.next_token_ids = batch_next_token_ids\n"),
    ("writes", NEWEST, SYNC, SYNC + "        sampling_info.last_tokens = batch_next_token_ids\n"),
    ("writes", NEWEST,
     "sampling_mask_batch_indices = sampling_info.sampling_mask_batch_indices",
     "sampling_mask_batch_indices = sampling_info.mask_rows"),
]  # fmt: skip


@pytest.mark.releases
@pytest.mark.parametrize(("check", "version", "old", "new"), CHANGES)
def test_each_source_check_reports_the_change_it_exists_to_catch(check: str, version: str, old: str, new: str) -> None:
    problems, member = SOURCE_CHECKS[check]
    source = source_of(version, member)
    assert problems(source) == []  # the control: the real source passes
    assert problems(mutated(source, old, new)) != []


@pytest.mark.releases
def test_the_logprob_check_reports_a_sample_that_computes_them() -> None:
    for version, old in (
        (NEWEST, "    candidates = verify_input.draft_token"),
        (OLDEST, "        candidates = self.draft_token"),
    ):
        sample, name = verify_sample_of(version)
        assert sample_logprob_problems(sample, name) == []
        source = source_of(version, EAGLE_UTILS if version in ZERO_STEP else EAGLE_INFO_V2)
        indent = old[: len(old) - len(old.lstrip())]
        changed = mutated(source, old, f"{indent}logits_output.next_token_logprobs = None\n{old}")
        tree = ast.parse(changed)
        if version in ZERO_STEP:
            changed_sample = function(tree, "eagle_sample")
        else:
            changed_sample = methods(classes(changed)["EagleVerifyInputV2Mixin"]).get("sample")
        assert sample_logprob_problems(changed_sample, name) != [], version


BIAS_CHANGES = [
    # a new bias plain decode adds and the draw does not refuse, directly and in a helper (0.5.23's split)
    (OLDEST, SAMPLING_INFO, "        if self.logit_bias is not None:\n",
     "        if self.temperature_bias is not None:\n            logits.add_(self.temperature_bias)\n"
     "        if self.logit_bias is not None:\n"),
    (NEWEST, SAMPLING_INFO, "        if self.logit_bias is not None:\n",
     "        if self.repetition_bias is not None:\n            logits.add_(self.repetition_bias)\n"
     "        if self.logit_bias is not None:\n"),
    # another preparation of the logits before plain decode samples them
    (NEWEST, MODEL_RUNNER, "        sampling_info.update_regex_vocab_mask()\n",
     "        sampling_info.update_regex_vocab_mask()\n        sampling_info.apply_temperature_floor(logits_output)\n"),
]  # fmt: skip


@pytest.mark.releases
@pytest.mark.parametrize(("version", "member", "old", "new"), BIAS_CHANGES)
def test_the_logit_bias_check_reports_what_the_draw_would_miss(version: str, member: str, old: str, new: str) -> None:
    sources = {m: source_of(version, m) for m in (MODEL_RUNNER, SAMPLING_INFO)}
    assert logit_bias_problems(sources[MODEL_RUNNER], sources[SAMPLING_INFO]) == []  # the control
    sources[member] = mutated(sources[member], old, new)
    assert logit_bias_problems(sources[MODEL_RUNNER], sources[SAMPLING_INFO]) != []


@pytest.mark.releases
def test_without_the_old_penalties_in_the_refusal_the_check_fails_where_they_live(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """0.5.4 - 0.5.10 keep the penalties in acc_linear_penalties: the refusal without it fails the check there."""
    oldest = source_of(OLDEST, MODEL_RUNNER), source_of(OLDEST, SAMPLING_INFO)
    newest = source_of(NEWEST, MODEL_RUNNER), source_of(NEWEST, SAMPLING_INFO)
    monkeypatch.setattr(v2.DecodeSample, "PLAIN_DECODE_BIASES", ())
    assert logit_bias_problems(*oldest) == [
        "apply_logits_bias reads acc_linear_penalties, which the draw does not refuse"
    ]
    assert logit_bias_problems(*newest) == []
