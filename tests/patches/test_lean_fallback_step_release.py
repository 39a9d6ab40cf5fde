"""What ``LeanFallbackStep`` (v1, 0.5.12) assumes about SGLang 0.5.12, pinned against the real source.

The lean step replaces a fallback iteration's stock ``draft()`` / ``verify()`` / extend by the verify's
preparation, the target forward, the argmax and the verify's per-request bookkeeping for one accepted
token (``commit_one_token``). That is right only while 0.5.12:

1. does, per request in the verify's loop, what ``commit_one_token`` does, plus only the grammar (which
   the lean step refuses) and ``spec_num_correct_drafts += 0``;
2. prepares and runs the verify's forward as the lean step does (``prepare_for_verify``, the model worker
   batch with the verify input's CPU lengths, the target's ``forward_batch_generation(is_verify=True)``);
3. takes a greedy batch's tokens as the plain argmax, and under ``SGLANG_SIMULATE_ACC_LEN`` fills them
   with token 100 (what ``LeanVerify.simulated_token_of`` returns for 0.5.12's default method);
4. truncates the next draft input after a request finishes (``filter_batch`` with
   ``has_been_filtered``), so the lean step must hand it only the unfinished requests, in order.

Each checker takes source text and returns its problems: ``[]`` on 0.5.12, non-empty on a mutated
source (the negative controls). No torch, no importing sglang: the source is the cached PyPI wheel.
"""

from __future__ import annotations

import ast
from importlib import resources

import pytest

from patcher import releases
from patches.runtime import dynspec_runtime as rt

VERSION = "0.5.12"  # the one v1 release with the EagleDraftExtendInput the lean step needs (v1 ends there)
EAGLE_INFO = "srt/speculative/eagle_info.py"
SCHEDULE_BATCH = "srt/managers/schedule_batch.py"
SERVER_ARGS = "srt/server_args.py"
TOKENIZER_CONTROL = "srt/managers/tokenizer_control_mixin.py"
EAGLE_WORKER = "srt/speculative/eagle_worker.py"
SPEC_UTILS = "srt/speculative/spec_utils.py"
MEMBERS = [EAGLE_INFO, EAGLE_WORKER, SPEC_UTILS, SCHEDULE_BATCH, SERVER_ARGS, TOKENIZER_CONTROL]
# What the verify does per request that the lean step does not: grammar (refused) and adding 0.
NOT_MIRRORED = {"req.grammar", "req.spec_num_correct_drafts"}


def source_of(member: str) -> str:
    return (releases.unpacked(VERSION, MEMBERS) / "sglang" / member).read_text()


def method_of(source: str, cls: str, name: str) -> ast.FunctionDef | None:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    return None


def req_uses(node: ast.AST) -> set[str]:
    """Every ``req.<name>`` the code reads, writes or calls."""
    return {
        ast.unparse(n)
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "req"
    }


def runtime_function(name: str) -> ast.FunctionDef:
    """A module-level function of the runtime as shipped (the package data the patch installs), parsed
    from its file: other tests swap the imported module, so its objects' source is not to be trusted."""
    tree = ast.parse((resources.files("patches") / "runtime" / "dynspec_runtime.py").read_text(encoding="utf-8"))
    found = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    assert found is not None, f"the runtime has no {name}"
    return found


def verify_loop(source: str) -> ast.For | None:
    """The verify's loop over ``zip(batch.reqs, ...)``."""
    verify = method_of(source, "EagleVerifyInput", "verify")
    if verify is None:
        return None
    return next(
        (n for n in ast.walk(verify) if isinstance(n, ast.For) and "zip(batch.reqs" in ast.unparse(n.iter)),
        None,
    )


def bookkeeping_problems(source: str) -> list[str]:
    loop = verify_loop(source)
    if loop is None:
        return ["EagleVerifyInput.verify has no loop over batch.reqs"]
    mirrored = req_uses(runtime_function(rt.commit_one_token.__name__)) | req_uses(
        runtime_function(rt.count_one_verify.__name__)
    )
    stock = req_uses(loop)
    problems = [
        f"the verify does {use} per request, the lean step does not" for use in sorted(stock - mirrored - NOT_MIRRORED)
    ]
    problems += [f"the lean step does {use}, the verify does not" for use in sorted(mirrored - stock)]
    increments = {ast.unparse(n) for n in ast.walk(loop) if isinstance(n, ast.AugAssign)}
    if "req.spec_verify_ct += 1" not in increments:
        problems.append("the verify counts its verifies otherwise")
    return problems


def self_uses(node: ast.AST) -> set[str]:
    """Every ``self.<name>`` the code reads, writes or calls."""
    return {
        n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
    }


def req_calls(node: ast.AST) -> set[str]:
    """The ``req.<name>(...)`` methods the code calls."""
    return {
        n.func.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "req"
    }


def early_count_problems(schedule_batch: str) -> list[str]:
    """``count_one_verify`` runs before the tokens are known, so before ``commit_one_token``'s calls
    on a request (and the methods of ``Req`` they call in turn): none of those may read what it
    changes, which is what it assigns and what the methods it calls write."""
    early = runtime_function(rt.count_one_verify.__name__)
    counted = {name.removeprefix("req.") for name in req_uses(early)} - req_calls(early)
    for name in req_calls(early):
        method = method_of(schedule_batch, "Req", name)
        if method is None:
            return [f"Req has no {name}"]
        counted |= {ast.unparse(t).removeprefix("self.").split("[")[0] for n in ast.walk(method) for t in assigned(n)}
    pending, seen, problems = sorted(req_calls(runtime_function(rt.commit_one_token.__name__))), set(), []
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        method = method_of(schedule_batch, "Req", name)
        if method is None:
            problems.append(f"Req has no {name}")
            continue
        uses = self_uses(method)
        problems += [
            f"Req.{name} reads {field}, which the lean step counts before it" for field in sorted(uses & counted)
        ]
        pending += [use for use in uses if method_of(schedule_batch, "Req", use) is not None]
    return problems


def assigned(node: ast.AST) -> list[ast.expr]:
    """What an assignment, an augmented one or a mutating call (``extend``, ``append``) writes."""
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, ast.AugAssign):
        return [node.target]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("extend", "append"):
        return [node.func.value]
    return []


def setting_problems(server_args: str) -> list[str]:
    """The settings ``LeanFallbackStep.build`` reads to keep the write after the wait: their names
    and off values in ``ServerArgs``."""
    wanted = {
        'disaggregation_mode: Literal["null", "prefill", "decode"] = "null"': "ServerArgs.disaggregation_mode is not the one whose off value is 'null'",
        "enable_streaming_session: bool = False": "ServerArgs has no enable_streaming_session, off by default",
    }
    return [problem for field, problem in wanted.items() if field not in server_args]


def streaming_flag_problems(tokenizer_control: str) -> list[str]:
    """That a streaming session needs ``--enable-streaming-session``, the flag ``build`` reads."""
    if "if not self.server_args.enable_streaming_session:" not in tokenizer_control:
        return ["a streaming session no longer needs --enable-streaming-session"]
    return []


def forward_problems(source: str) -> list[str]:
    verify = method_of(source, "EAGLEWorker", "verify")
    if verify is None:
        return ["EAGLEWorker has no verify"]
    text = ast.unparse(verify)
    wanted = (
        "spec_info.prepare_for_verify(batch, self.page_size)",
        "batch.get_model_worker_batch(seq_lens_cpu_cache=spec_info.seq_lens_cpu)",
        "self.target_worker.forward_batch_generation(model_worker_batch, is_verify=True)",
        "ForwardMode.TARGET_VERIFY",
    )
    return [f"EAGLEWorker.verify no longer has {w}" for w in wanted if w not in text]


def greedy_problems(info: str, spec_utils: str) -> list[str]:
    problems = []
    if "target_predict = torch.argmax(logits_output.next_token_logits, dim=-1)" not in info:
        problems.append("the greedy verify takes another argmax")
    if "predict.fill_(100)" not in spec_utils:
        problems.append("SIMULATE_ACC_LEN no longer fills the tokens with 100")
    return problems


def truncation_problems(info: str) -> list[str]:
    filter_batch = method_of(info, "EagleDraftInput", "filter_batch")
    if filter_batch is None:
        return ["EagleDraftInput has no filter_batch"]
    if "self.bonus_tokens = self.bonus_tokens[:len(new_indices)]" not in ast.unparse(filter_batch):
        return ["filter_batch no longer truncates the next draft input"]
    return []


@pytest.mark.releases
def test_the_verify_bookkeeping_is_what_commit_one_token_does() -> None:
    assert bookkeeping_problems(source_of(EAGLE_INFO)) == []


@pytest.mark.releases
def test_what_the_lean_step_counts_before_its_wait_is_read_by_nothing_it_calls_after() -> None:
    assert early_count_problems(source_of(SCHEDULE_BATCH)) == []


@pytest.mark.releases
def test_the_settings_that_keep_the_write_after_the_wait_are_read_by_their_names() -> None:
    assert (
        setting_problems(source_of(SERVER_ARGS)) == [] and streaming_flag_problems(source_of(TOKENIZER_CONTROL)) == []
    )


@pytest.mark.releases
def test_the_verify_forward_is_prepared_as_the_lean_step_prepares_it() -> None:
    assert forward_problems(source_of(EAGLE_WORKER)) == []


@pytest.mark.releases
def test_a_greedy_verify_takes_the_argmax_and_simulation_fills_100() -> None:
    assert greedy_problems(source_of(EAGLE_INFO), source_of(SPEC_UTILS)) == []


@pytest.mark.releases
def test_the_scheduler_truncates_the_next_draft_input() -> None:
    assert truncation_problems(source_of(EAGLE_INFO)) == []


# The lines of 0.5.12 the negative controls change.
VERIFY_COUNT = "req.spec_verify_ct += 1"
BOUNDARY_CHECK = "        if self._check_vocab_boundary_finish(new_accepted_tokens):"


def check_finished_returning_early_if(condition: str) -> tuple[object, str, str, str]:
    """A negative control: ``Req.check_finished`` reading ``condition`` just before the vocab-boundary check."""
    return (
        early_count_problems,
        SCHEDULE_BATCH,
        BOUNDARY_CHECK,
        f"        if {condition}:\n            return\n\n{BOUNDARY_CHECK}",
    )


@pytest.mark.releases
@pytest.mark.parametrize(
    ("checker", "member", "old", "new"),
    [
        (bookkeeping_problems, EAGLE_INFO, VERIFY_COUNT, f"{VERIFY_COUNT}\n            req.spec_seen = True"),
        (bookkeeping_problems, EAGLE_INFO, VERIFY_COUNT, "req.spec_verify_ct += 2"),
        (bookkeeping_problems, EAGLE_INFO, "            req.kv_allocated_len = req.kv_committed_len\n", ""),
        (forward_problems, EAGLE_WORKER, "model_worker_batch, is_verify=True", "model_worker_batch"),
        (
            setting_problems,
            SERVER_ARGS,
            'disaggregation_mode: Literal["null", "prefill", "decode"]',
            'disaggregation: Literal["null", "prefill", "decode"]',
        ),
        (setting_problems, SERVER_ARGS, "enable_streaming_session: bool = False", "streaming_sessions: bool = False"),
        (streaming_flag_problems, TOKENIZER_CONTROL, "if not self.server_args.enable_streaming_session:", "if False:"),
        check_finished_returning_early_if("self.kv_committed_len < 0"),
        # what a method count_one_verify calls writes counts too
        check_finished_returning_early_if("not self.spec_correct_drafts_histogram"),
        check_finished_returning_early_if("self.kv_allocated_len < 0"),
        (  # a method check_finished calls reads one: the walk follows the calls
            early_count_problems,
            SCHEDULE_BATCH,
            "        if self.sampling_params.ignore_eos:\n            return False\n",
            "        if self.sampling_params.ignore_eos or self.spec_verify_ct > 9:\n            return False\n",
        ),
        (truncation_problems, EAGLE_INFO, "self.bonus_tokens = self.bonus_tokens[: len(new_indices)]", "pass"),
    ],
)
def test_the_checkers_report_a_changed_release(checker: object, member: str, old: str, new: str) -> None:
    """Negative controls: each checker finds a problem in 0.5.12 changed where it looks."""
    source = source_of(member)
    assert old in source
    changed = source.replace(old, new, 1)
    assert callable(checker)
    assert checker(changed) != []


@pytest.mark.releases
def test_the_greedy_checker_reports_another_simulated_token() -> None:
    info, spec_utils = source_of(EAGLE_INFO), source_of(SPEC_UTILS)
    assert greedy_problems(info, spec_utils.replace("predict.fill_(100)", "predict.fill_(7)")) != []
    assert (
        greedy_problems(
            info.replace(
                "torch.argmax(logits_output.next_token_logits", "torch.argmin(logits_output.next_token_logits"
            ),
            spec_utils,
        )
        != []
    )
