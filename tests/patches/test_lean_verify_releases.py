"""What ``LeanVerify``'s stand-ins assume about every SGLang release 0.5.14+, pinned against the real sources.

At zero steps ``LeanVerify`` (patches/runtime/dynspec_v2.py) swaps the module globals ``eagle_sample``
and ``fill_bonus_tokens_func`` of the verify's modules for lean stand-ins while the stock verify runs,
for greedy one-node-tree batches. The stand-ins return what they know the stock functions would: the
argmax of the sanitized logits as ``predict`` (int32), ones as ``accept_lens``, 0 .. bs-1 as
``accept_index``, and the accepted token as the bonus. That is right only while each release:

1. returns ``(predict, accept_lens, accept_index)`` from ``eagle_sample(verify_input, batch, logits_output, ...)``;
2. sanitizes the logits and takes their plain argmax, into an int32 ``predict``, whenever the batch is all greedy;
3. changes the logits before that only by the penalties ``LeanVerify`` refuses (or a mask or watermark it refuses);
4. gives ``eagle_sample`` no argument the stand-in has not seen (a new one might change the outcome);
5. has the verify read both names as module globals of a module in ``LeanVerify.VERIFY_MODULES``;
6. calls ``fill_bonus_tokens_func`` with the five positional arguments the stand-in takes;
7. keeps ``SGLANG_SIMULATE_ACC_*`` as ``LeanVerify.simulated_token_of`` reads them (fixed token 100);
8. never writes ``accept_lens`` or ``accept_index`` in place (the stand-in's are views of buffers kept
   across iterations);
9. gives ``EagleVerifyInput`` the three sizes ``takes`` checks (``draft_token_num``, ``max_tree_depth``,
   ``tree_topk``).

Each fact is a small checker taking source text and returning its problems: ``[]`` on every real
release, and non-empty on a mutated source (the negative controls at the end), so that a check that
cannot fail does not pass for one that holds.

No torch and no importing sglang: the sources come from the cached PyPI wheels (``patcher.releases``).
The fakes-based behaviour of the stand-ins is tested in test_lean_verify.py.
"""

from __future__ import annotations

import ast
import zipfile
from collections.abc import Callable, Iterator

import pytest
from packaging.version import Version

from patcher import releases
from patches.eagle_worker_v2_dynspec_zero_step import EagleWorkerV2DynspecZeroStep
from patches.runtime import dynspec_v2 as v2
from tests.conftest import releases_of
from tests.patches.real_release import release_file, release_source

LEAN = releases_of(EagleWorkerV2DynspecZeroStep)  # the zero-step policy installs LeanVerify

EAGLE_UTILS = "srt/speculative/eagle_utils.py"
COMMON = "srt/speculative/eagle_worker_common.py"  # the shared verify body, 0.5.16+
V2_WORKER = "srt/speculative/eagle_worker_v2.py"  # the verify inline, 0.5.14 - 0.5.15
SPEC_UTILS = "srt/speculative/spec_utils.py"
ENVIRON = "srt/environ.py"
EAGLE_INFO = "srt/speculative/eagle_info.py"
EAGLE_KERNELS = "kernels/ops/speculative/eagle.py"  # fill_bonus_tokens_func's home, 0.5.16+
SIMULATED_ACCEPT = "kernels/ops/speculative/simulated_accept.py"  # 0.5.23: SIMULATE_ACC_LEN on the GPU
MEMBERS = [EAGLE_UTILS, COMMON, V2_WORKER, SPEC_UTILS, ENVIRON, EAGLE_INFO, EAGLE_KERNELS, SIMULATED_ACCEPT]
# Where an in-place write to the verify's outputs could be: every consumer of a verify result (the
# workers, the scheduler and its result processing) and the kernels they launch.
SCANNED_DIRS = ("sglang/srt/speculative/", "sglang/srt/managers/", "sglang/kernels/ops/speculative/")

SAMPLE_ORIGIN = "sglang.srt.speculative.eagle_utils"
FILL_BONUS_ORIGIN = "sglang.kernels.ops.speculative.eagle"
SANITIZE_ORIGIN = "sglang.srt.utils.async_probe"  # where LeanVerify.build imports sanitize_nan_logits from
# eagle_sample's one argument LeanVerify knows but does not ignore: takes refuses a batch unless it is None.
WATERMARK = "watermark_state"


def has_member(version: str, member: str) -> bool:
    return release_file(version, MEMBERS, member).exists()


def source_of(version: str, member: str) -> str:
    return release_source(version, MEMBERS, member)


def module_name(member: str) -> str:
    return "sglang." + member.removesuffix(".py").replace("/", ".")


# -- small AST helpers ------------------------------------------------------------------------------


def module_function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def sample_def(source: str) -> ast.FunctionDef | None:
    """The module-level ``eagle_sample``: the function both verify modules import."""
    return module_function(ast.parse(source), v2.LeanVerify.SAMPLE)


def names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def is_not_none(node: ast.AST) -> ast.expr | None:
    """``X`` of a ``X is not None`` comparison, else None."""
    if (
        isinstance(node, ast.Compare)
        and len(node.ops) == 1
        and isinstance(node.ops[0], ast.IsNot)
        and isinstance(node.comparators[0], ast.Constant)
        and node.comparators[0].value is None
    ):
        return node.left
    return None


def conjuncts(test: ast.expr) -> list[ast.expr]:
    return list(test.values) if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]


def gated_by_watermark(test: ast.expr) -> bool:
    """True for a condition that holds only with ``watermark_state is not None`` (which the stand-in refuses)."""
    return any(ast.unparse(is_not_none(c) or ast.Constant(0)) == WATERMARK for c in conjuncts(test))


def greedy_branch(sample: ast.FunctionDef) -> tuple[int, ast.If] | None:
    """``(index, node)`` of the top-level ``if`` that picks the greedy path: its condition reads
    ``sampling_info.is_all_greedy``."""
    for i, node in enumerate(sample.body):
        if isinstance(node, ast.If) and "sampling_info.is_all_greedy" in ast.unparse(node.test):
            return i, node
    return None


def sample_and_greedy_branch(source: str) -> tuple[ast.FunctionDef, tuple[int, ast.If]] | str:
    """``eagle_sample`` and its greedy branch, or which of the two the source lacks."""
    sample = sample_def(source)
    if sample is None:
        return "no module-level eagle_sample"
    branch = greedy_branch(sample)
    return "no greedy branch" if branch is None else (sample, branch)


def mask_parameter(sample: ast.FunctionDef) -> str | None:
    positional = [*sample.args.posonlyargs, *sample.args.args]
    return positional[3].arg if len(positional) > 3 else None


def is_sanitize_call(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and ast.unparse(node.value.func) == "sanitize_nan_logits"
        and bool(node.value.args)
        and ast.unparse(node.value.args[0]) == "next_token_logits"
    )


def changes_logits(node: ast.AST) -> bool:
    """True where ``node`` may change or rebind ``next_token_logits``: an in-place method on it, a
    call it is handed to, or an assignment to it. Reading ``next_token_logits.shape`` does not count."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            func = n.func
            if (
                isinstance(func, ast.Attribute)
                and ast.unparse(func.value) == "next_token_logits"
                and func.attr.endswith("_")
            ):
                return True
            if any(ast.unparse(a) == "next_token_logits" for a in [*n.args, *(k.value for k in n.keywords)]):
                return True
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any("next_token_logits" in names_in(t) for t in targets):
                return True
    return False


# -- 1. eagle_sample's signature head and what it returns -------------------------------------------


def sample_return_problems(source: str) -> list[str]:
    """``eagle_sample(verify_input, batch, logits_output, ...)`` returns ``(predict, num_correct_drafts + 1,
    accept_index)`` (the ``+ 1`` maybe bound to a name first), the order ``LeanVerify.sample`` returns in;
    and between the sampling branches and that return only the blocks the stand-in mirrors or refuses run."""
    sample = sample_def(source)
    if sample is None:
        return ["no module-level eagle_sample"]
    problems = []
    head = [a.arg for a in [*sample.args.posonlyargs, *sample.args.args][:3]]
    if head != ["verify_input", "batch", "logits_output"]:
        problems.append(f"the first three parameters are {head}")
    last = sample.body[-1]
    if not (isinstance(last, ast.Return) and isinstance(last.value, ast.Tuple) and len(last.value.elts) == 3):
        return [*problems, f"the last statement is not a 3-tuple return: {ast.unparse(last)}"]
    first, middle, third = (ast.unparse(e) for e in last.value.elts)
    # the accept lengths: `num_correct_drafts + 1` in the return, or a top-level name bound to it
    bound = {ast.unparse(t): ast.unparse(n.value) for n in sample.body if isinstance(n, ast.Assign) for t in n.targets}
    if first != "predict" or third != "accept_index":
        problems.append(f"returns ({first}, {middle}, {third}), not (predict, ..., accept_index)")
    if middle != "num_correct_drafts + 1" and bound.get(middle) != "num_correct_drafts + 1":
        problems.append(f"the accept lengths returned are {middle}, not num_correct_drafts + 1")
    branch = greedy_branch(sample)
    if branch is None:
        return [*problems, "no greedy branch"]
    for node in sample.body[branch[0] + 1 : -1]:
        text = ast.unparse(node)
        if isinstance(node, ast.If) and (
            ast.unparse(node.test) == "SIMULATE_ACC_LEN > 0" or gated_by_watermark(node.test)
        ):
            continue  # SIMULATE_ACC_LEN: simulated_token_of mirrors it; the watermark: refused
        if isinstance(node, ast.Assign) and ast.unparse(node.value) == "num_correct_drafts + 1":
            continue  # the accept lengths' name
        problems.append(f"after the sampling branches: {text.splitlines()[0]}")
    return problems


# -- 2. the greedy branch: the sanitized logits' argmax, into an int32 predict ----------------------


def greedy_implies_branch(test: ast.expr, tree: ast.Module) -> bool:
    """True where ``is_all_greedy`` alone takes the branch: ``sampling_info.is_all_greedy or ...``, or
    (0.5.21+) a module helper handed ``is_all_greedy=sampling_info.is_all_greedy`` returning ``is_all_greedy or ...``."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        return any(ast.unparse(v) == "sampling_info.is_all_greedy" for v in test.values)
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Name):
        passed = {k.arg: ast.unparse(k.value) for k in test.keywords}
        helper = module_function(tree, test.func.id)
        if helper is None or passed.get("is_all_greedy") != "sampling_info.is_all_greedy":
            return False
        body = [n for n in helper.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        result = body[0].value if len(body) == 1 and isinstance(body[0], ast.Return) else None
        return (
            isinstance(result, ast.BoolOp)
            and isinstance(result.op, ast.Or)
            and any(isinstance(v, ast.Name) and v.id == "is_all_greedy" for v in result.values)
        )
    return False


def greedy_branch_problems(source: str) -> list[str]:
    tree = ast.parse(source)
    sample = module_function(tree, v2.LeanVerify.SAMPLE)
    if sample is None:
        return ["no module-level eagle_sample"]
    branch = greedy_branch(sample)
    if branch is None:
        return ["no top-level branch on sampling_info.is_all_greedy"]
    at, node = branch
    problems = []
    if not greedy_implies_branch(node.test, tree):
        problems.append(f"an all-greedy batch may not take the greedy branch: {ast.unparse(node.test)}")
    if "torch.argmax(next_token_logits, dim=-1)" not in "\n".join(ast.unparse(s) for s in node.body):
        problems.append("the greedy branch takes no torch.argmax(next_token_logits, dim=-1)")
    # the stand-in sanitizes, then takes the argmax: the stock sample must sanitize before the branch ...
    sanitized = [i for i, n in enumerate(sample.body[:at]) if is_sanitize_call(n)]
    if not sanitized:
        problems.append("no sanitize_nan_logits(next_token_logits, ...) before the greedy branch")
    # ... with the function LeanVerify.build imports
    origins = {
        n.module
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and any(a.name == "sanitize_nan_logits" and a.asname is None for a in n.names)
    }
    if origins != {SANITIZE_ORIGIN}:
        problems.append(f"sanitize_nan_logits comes from {sorted(o or '' for o in origins)}, not {SANITIZE_ORIGIN}")
    # between the sanitize and the branch, nothing ungated changes the logits (gated blocks: fact 3)
    for n in sample.body[(sanitized[0] + 1 if sanitized else 0) : at]:
        if not isinstance(n, ast.If) and changes_logits(n):
            problems.append(f"the logits change before the argmax: {ast.unparse(n).splitlines()[0]}")
    predicts = [
        n.value
        for n in sample.body[:at]
        if isinstance(n, ast.Assign) and [ast.unparse(t) for t in n.targets] == ["predict"]
    ]
    made = [ast.unparse(p) for p in predicts]
    if not any("torch.zeros(" in m and "dtype=torch.int32" in m for m in made):
        problems.append(f"predict is not made by torch.zeros(..., dtype=torch.int32): {made}")
    return problems


# -- 3. the penalties applied before the greedy branch ----------------------------------------------


def penalty_problems(source: str) -> list[str]:
    """Every top-level ``if`` before the greedy branch that changes the logits is gated by what the stand-in
    refuses: ``sampling_info.<penalty> is not None`` with the penalty in ``LeanVerify.PENALTIES``, the mask
    argument, or ``watermark_state``. An unknown gate, or a penalty LeanVerify does not check, is a problem."""
    found = sample_and_greedy_branch(source)
    if isinstance(found, str):
        return [found]
    sample, branch = found
    mask = mask_parameter(sample)
    problems = []
    for node in sample.body[: branch[0]]:
        if not isinstance(node, ast.If):
            continue
        test = ast.unparse(node.test)
        if test == "batch.forward_mode.is_idle()":
            continue  # the idle return: takes refuses an idle batch
        if not changes_logits(node):
            continue  # a gate that leaves the logits alone does not change the argmax
        gated = is_not_none(node.test)
        if gated is not None and isinstance(gated, ast.Attribute) and ast.unparse(gated.value) == "sampling_info":
            if gated.attr not in v2.LeanVerify.PENALTIES:
                problems.append(f"a logits change LeanVerify does not check: sampling_info.{gated.attr}")
        elif gated is not None and isinstance(gated, ast.Name) and gated.id == mask:
            continue  # the grammar mask: takes refuses any positional argument not None
        elif gated_by_watermark(node.test):
            continue  # takes refuses watermark_state unless None
        else:
            problems.append(f"a logits change under an unknown gate: if {test}")
    return problems


# -- 4. eagle_sample's arguments beyond the mask ----------------------------------------------------


def parameter_problems(source: str) -> list[str]:
    """After ``(verify_input, batch, logits_output, <mask>=None)`` only what the stand-in knows:
    ``IGNORED_KWARGS`` and ``watermark_state``. A new argument would reach the stand-in unchecked
    whenever the verify leaves it at its default."""
    sample = sample_def(source)
    if sample is None:
        return ["no module-level eagle_sample"]
    args = sample.args
    positional = [*args.posonlyargs, *args.args]
    problems = []
    if len(positional) < 4 or positional[3].arg not in ("vocab_mask", "grammar_mask"):
        problems.append(f"the 4th parameter is not the grammar/vocab mask: {[a.arg for a in positional]}")
    else:
        defaults = dict(zip([a.arg for a in positional][-len(args.defaults) :], args.defaults)) if args.defaults else {}
        if ast.unparse(defaults.get(positional[3].arg, ast.Name("required"))) != "None":
            problems.append(f"the mask {positional[3].arg} does not default to None")
    known = {*v2.LeanVerify.IGNORED_KWARGS, WATERMARK}
    for extra in [*positional[4:], *args.kwonlyargs]:
        if extra.arg not in known:
            problems.append(f"an argument the stand-in has not seen: {extra.arg}")
    if args.vararg or args.kwarg:
        problems.append("takes *args or **kwargs")
    return problems


def ignored_kwarg_problems(source: str) -> list[str]:
    """The arguments ``LeanVerify.IGNORED_KWARGS`` lets through are read only where a greedy one-node
    batch with no watermark never goes: the branches after the greedy one, or under ``watermark_state``."""
    found = sample_and_greedy_branch(source)
    if isinstance(found, str):
        return [found]
    sample, branch = found
    allowed: set[int] = set()  # ids of the Name nodes in places the stand-in's batches never reach
    for later in branch[1].orelse:  # the branches after the greedy one (sparse sampling, sampling)
        allowed |= {id(n) for n in ast.walk(later)}
    for gate in ast.walk(sample):
        if isinstance(gate, ast.If) and gated_by_watermark(gate.test):
            allowed |= {id(n) for n in ast.walk(gate)}
    return [
        f"{n.id} is read where a greedy batch goes (line {n.lineno})"
        for n in ast.walk(sample)
        if isinstance(n, ast.Name) and n.id in v2.LeanVerify.IGNORED_KWARGS and id(n) not in allowed
    ]


# -- 5, 6. the verify reads both names as module globals ---------------------------------------------


def calls_of(tree: ast.AST, name: str) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef | None, ast.Call]]:
    """``(enclosing function, call)`` for every call of the bare name ``name``."""

    def walk(
        node: ast.AST, function: ast.FunctionDef | ast.AsyncFunctionDef | None
    ) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef | None, ast.Call]]:
        for child in ast.iter_child_nodes(node):
            inner = child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id == name:
                yield function, child
            yield from walk(child, inner)

    yield from walk(tree, None)


def binds_locally(function: ast.AST, name: str) -> bool:
    """True where ``function`` makes ``name`` local (an import, assignment or parameter of that name),
    which would hide the module global the stand-in replaces."""
    for n in ast.walk(function):
        if isinstance(n, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in n.names):
            return True
        if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store):
            return True
        if isinstance(n, ast.arg) and n.arg == name:
            return True
    return False


def global_call_problems(source: str, name: str, origin: str) -> list[str]:
    """Where the module calls ``name``, it imports it at module level from ``origin`` (so the call reads
    the module global the stand-in is put in) and no calling function binds it locally."""
    tree = ast.parse(source)
    calls = list(calls_of(tree, name))
    if not calls:
        return []
    problems = []
    imported = [
        n.module
        for n in tree.body  # module level only: not in a function, nor under `if TYPE_CHECKING:`
        if isinstance(n, ast.ImportFrom)
        for a in n.names
        if a.name == name and a.asname is None
    ]
    if imported != [origin]:
        problems.append(f"{name} is called but imported at module level from {imported}, not [{origin}]")
    for function, call in calls:
        if function is not None and binds_locally(function, name):
            problems.append(f"{function.name} binds {name} locally (line {call.lineno})")
    return problems


def fill_bonus_call_problems(source: str) -> list[str]:
    """Every ``fill_bonus_tokens_func(accept_tokens, accept_lens, bonus_tokens, <stride>, bs)``: five
    positional arguments, no keywords, as ``LeanVerify.fill_bonus`` takes them; ``accept_tokens`` is
    ``predict[accept_index]`` (so a one-node tree's are the predicted tokens)."""
    problems = []
    for function, call in calls_of(ast.parse(source), v2.LeanVerify.FILL_BONUS):
        text = ast.unparse(call)
        names = [ast.unparse(a) for a in call.args]
        if len(call.args) != 5 or call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
            problems.append(f"not five positional arguments: {text}")
        elif [names[0], names[1], names[2], names[4]] != ["accept_tokens", "accept_lens", "bonus_tokens", "bs"]:
            problems.append(f"not (accept_tokens, accept_lens, bonus_tokens, <stride>, bs): {text}")
        made = [
            ast.unparse(n.value)
            for n in ast.walk(function or ast.Module(body=[], type_ignores=[]))
            if isinstance(n, ast.Assign) and [ast.unparse(t) for t in n.targets] == ["accept_tokens"]
        ]
        if made != ["predict[accept_index]"]:
            problems.append(f"accept_tokens is {made}, not predict[accept_index]")
    return problems


def fill_bonus_def_problems(source: str) -> list[str]:
    """The stock ``fill_bonus_tokens_func`` the stand-in hands refused calls to takes what it passes."""
    found = module_function(ast.parse(source), v2.LeanVerify.FILL_BONUS)
    if found is None:
        return [f"no module-level {v2.LeanVerify.FILL_BONUS}"]
    names = [a.arg for a in [*found.args.posonlyargs, *found.args.args]]
    if names != ["accept_tokens", "accept_lens", "bonus_tokens", "accept_stride", "batch_size"]:
        return [f"its parameters are {names}"]
    return []


# -- 7. SGLANG_SIMULATE_ACC_* as simulated_token_of reads them --------------------------------------


def simulate_names_problems(source: str, with_token_mode: bool) -> list[str]:
    """spec_utils binds the settings at module level, under the names ``simulated_token_of`` reads."""
    bound = {
        t.id: ast.unparse(n.value)
        for n in ast.parse(source).body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    wanted = ["SIMULATE_ACC_LEN", "SIMULATE_ACC_METHOD", *(["SIMULATE_ACC_TOKEN_MODE"] if with_token_mode else [])]
    return [
        f"{name} is {bound.get(name)}, not envs.SGLANG_{name}.get()"
        for name in wanted
        if bound.get(name) != f"envs.SGLANG_{name}.get()"
    ]


def simulate_defaults_problems(source: str, with_token_mode: bool) -> list[str]:
    """environ.py's defaults: off (-1), ``match-expected`` (the one method LeanVerify mirrors), ``fixed``."""
    defaults = {
        t.id: ast.unparse(s.value)
        for c in ast.walk(ast.parse(source))
        if isinstance(c, ast.ClassDef)  # the settings are class attributes of ``Envs``
        for s in c.body
        if isinstance(s, ast.Assign)
        for t in s.targets
        if isinstance(t, ast.Name) and t.id.startswith("SGLANG_SIMULATE_ACC_")
    }
    wanted = {"SGLANG_SIMULATE_ACC_LEN": "EnvFloat(-1)", "SGLANG_SIMULATE_ACC_METHOD": "EnvStr('match-expected')"}
    if with_token_mode:
        wanted["SGLANG_SIMULATE_ACC_TOKEN_MODE"] = "EnvStr('fixed')"
    return [f"{k} is {defaults.get(k)}, not {v}" for k, v in wanted.items() if defaults.get(k) != v]


def simulated_token_problems(spec_utils: str, kernel: str | None) -> list[str]:
    """The token the fixed mode writes is ``LeanVerify.SIMULATED_TOKEN``, in every place that writes it:
    ``predict.fill_(...)`` in spec_utils and, where spec_utils launches it, the Triton kernel's store."""
    token = v2.LeanVerify.SIMULATED_TOKEN
    simulate = module_function(ast.parse(spec_utils), "generate_simulated_accept_index")
    if simulate is None:
        return ["no generate_simulated_accept_index"]
    problems = []
    fills = [
        n.args[0].value
        for n in ast.walk(simulate)
        if isinstance(n, ast.Call)
        and ast.unparse(n.func) == "predict.fill_"
        and len(n.args) == 1
        and isinstance(n.args[0], ast.Constant)
    ]
    if fills != [token]:
        problems.append(f"predict.fill_ writes {fills}, not [{token}]")
    uses_kernel = "simulated_accept(" in ast.unparse(simulate)
    if uses_kernel and kernel is None:
        problems.append(f"spec_utils launches simulated_accept, but there is no {SIMULATED_ACCEPT}")
    if uses_kernel and kernel is not None:
        # the fixed branch's store into the predicted tokens: tl.store(predict_tokens + ..., <token>, ...)
        stores = [
            ast.unparse(n.args[1])
            for n in ast.walk(ast.parse(kernel))
            if isinstance(n, ast.Call)
            and ast.unparse(n.func) == "tl.store"
            and len(n.args) >= 2
            and "predict_tokens" in names_in(n.args[0])
            and isinstance(n.args[1], ast.Constant)
        ]
        if stores != [str(token)]:
            problems.append(f"the kernel stores {stores} into predict_tokens, not [{token}]")
    return problems


def match_expected_problems(spec_utils: str) -> list[str]:
    """``match-expected`` clamps the length to the tree's depth (1 at zero steps) and draws only
    between two different lengths: a one-node tree accepts one without touching the CPU generator,
    which is why ``simulated_token_of`` takes that method and refuses ``multinomial``."""
    text = spec_utils
    problems = []
    for line in (
        'simulate_acc_method == "match-expected"',
        "simulate_acc_len = max(1.0, min(max_len, simulate_acc_len))",
        "upper = lower + 1 if lower < max_len else lower",
        "if lower == upper:",
    ):
        if line not in text:
            problems.append(f"no `{line}`")
    return problems


# -- 8. no in-place write to the verify's outputs ----------------------------------------------------

OUTPUTS = {"accept_lens", "accept_index"}  # exactly these names: sim_accept_index, prev_accept_lens are others


def output_named(node: ast.AST, names: frozenset[str] | set[str] = OUTPUTS) -> str | None:
    """The output in ``names`` that ``node`` names (``accept_lens``, ``result.accept_lens``,
    ``accept_lens[...]``), or None."""
    while isinstance(node, ast.Subscript):
        node = node.value
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name if name in names else None


def inplace_write_problems(source: str, names: frozenset[str] | set[str] = OUTPUTS) -> list[str]:
    """In-place writes to ``accept_lens`` / ``accept_index`` (bare, as an attribute, or sliced): a method
    ending in ``_`` (``add_``, ``copy_``, ``fill_``, ``masked_fill_``, ``index_put_``, ...), an item
    assignment, an augmented assignment (in place on a tensor), ``out=``, or a Triton ``tl.store``
    through them. AST, not a regex, so a call split over lines is seen too."""
    problems = []
    for n in ast.walk(ast.parse(source)):
        hit = False
        if isinstance(n, ast.Call):
            func = n.func
            hit = (
                isinstance(func, ast.Attribute)
                and func.attr.endswith("_")
                and not func.attr.startswith("_")
                and output_named(func.value, names) is not None
            )
            hit = hit or any(k.arg == "out" and output_named(k.value, names) is not None for k in n.keywords)
            hit = hit or (ast.unparse(func) == "tl.store" and bool(n.args) and bool(names_in(n.args[0]) & set(names)))
        elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            for target in targets:
                for t in target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]:
                    if output_named(t, names) is not None and (
                        isinstance(t, ast.Subscript) or isinstance(n, ast.AugAssign)
                    ):
                        hit = True
        if hit:
            problems.append(f"line {getattr(n, 'lineno', '?')}: {ast.unparse(n).splitlines()[0]}")
    return problems


def scanned_sources(version: str) -> dict[str, str]:
    """Every .py file under ``SCANNED_DIRS`` of the release, read from its cached wheel (far more files
    than the small trees ``releases.unpacked`` keeps for the patch tests)."""
    with zipfile.ZipFile(releases.wheel(version)) as archive:
        return {
            name: archive.read(name).decode()
            for name in sorted(archive.namelist())
            if name.endswith(".py") and name.startswith(SCANNED_DIRS)
        }


# -- 9. the tree sizes takes checks ---------------------------------------------------------------


def verify_input_problems(source: str) -> list[str]:
    found = next(
        (n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "EagleVerifyInput"), None
    )
    if found is None:
        return ["no EagleVerifyInput"]
    fields = {ast.unparse(n.target) for n in found.body if isinstance(n, ast.AnnAssign)}
    properties = {
        n.name
        for n in found.body
        if isinstance(n, ast.FunctionDef) and any(ast.unparse(d) == "property" for d in n.decorator_list)
    }
    problems = [] if "draft_token_num" in fields else ["no draft_token_num field"]
    problems += [f"no {name} property" for name in ("max_tree_depth", "tree_topk") if name not in properties]
    return problems


# -- the pins, per release ---------------------------------------------------------------------------


def verify_member(version: str) -> str:
    """Where the verify calls eagle_sample: the shared body from 0.5.16, the worker before."""
    return COMMON if Version(version) >= Version("0.5.16") else V2_WORKER


# eagle_sample's own facts: (checker, what it pins)
SAMPLE_FACTS = [
    (sample_return_problems, "eagle_sample's signature head / return order (fact 1)"),
    (greedy_branch_problems, "eagle_sample's greedy branch (fact 2)"),
    (penalty_problems, "eagle_sample's penalties vs LeanVerify.PENALTIES (fact 3)"),
    (parameter_problems, "eagle_sample's arguments vs LeanVerify.IGNORED_KWARGS (fact 4)"),
    (ignored_kwarg_problems, "where eagle_sample reads IGNORED_KWARGS (fact 4)"),
]


@pytest.mark.releases
@pytest.mark.parametrize("version", LEAN)
@pytest.mark.parametrize(("checker", "fact"), SAMPLE_FACTS, ids=[c.__name__ for c, _ in SAMPLE_FACTS])
def test_eagle_sample_is_what_the_stand_in_assumes(
    version: str, checker: Callable[[str], list[str]], fact: str
) -> None:
    problems = checker(source_of(version, EAGLE_UTILS))
    assert problems == [], f"{version}: {fact}: {problems}"


@pytest.mark.releases
@pytest.mark.parametrize("version", LEAN)
def test_the_verify_reads_both_names_as_globals_of_a_verify_module(version: str) -> None:
    callers = [
        m
        for m in (COMMON, V2_WORKER)
        if has_member(version, m) and any(calls_of(ast.parse(source_of(version, m)), v2.LeanVerify.SAMPLE))
    ]
    assert callers == [verify_member(version)], f"{version}: the verify calls eagle_sample in {callers} (fact 5)"
    assert module_name(callers[0]) in v2.LeanVerify.VERIFY_MODULES, (
        f"{version}: {callers[0]} is not in VERIFY_MODULES (fact 5)"
    )
    source = source_of(version, callers[0])
    sample = global_call_problems(source, v2.LeanVerify.SAMPLE, SAMPLE_ORIGIN)
    assert sample == [], f"{version}: {callers[0]} reads eagle_sample as a module global (fact 5): {sample}"
    fill = global_call_problems(source, v2.LeanVerify.FILL_BONUS, FILL_BONUS_ORIGIN)
    assert fill == [], f"{version}: {callers[0]} reads fill_bonus_tokens_func as a module global (fact 5): {fill}"
    # 0.5.16+ call it (before, the worker launches the Triton kernel itself and LeanVerify shadows no filler)
    calls_fill = any(calls_of(ast.parse(source), v2.LeanVerify.FILL_BONUS))
    assert calls_fill == (Version(version) >= Version("0.5.16")), (
        f"{version}: the verify calls fill_bonus_tokens_func: {calls_fill} (fact 5)"
    )


@pytest.mark.releases
@pytest.mark.parametrize("version", LEAN)
def test_the_verify_calls_fill_bonus_as_the_stand_in_takes_it(version: str) -> None:
    problems = fill_bonus_call_problems(source_of(version, verify_member(version)))
    assert problems == [], f"{version}: the verify's fill_bonus_tokens_func call (fact 6): {problems}"
    if Version(version) >= Version("0.5.16"):
        stock = fill_bonus_def_problems(source_of(version, EAGLE_KERNELS))
        assert stock == [], f"{version}: {EAGLE_KERNELS}'s fill_bonus_tokens_func (fact 6): {stock}"


@pytest.mark.releases
@pytest.mark.parametrize("version", LEAN)
def test_simulate_acc_is_what_simulated_token_of_reads(version: str) -> None:
    with_mode = Version(version) >= Version("0.5.15")  # SIMULATE_ACC_TOKEN_MODE came in 0.5.15
    spec_utils = source_of(version, SPEC_UTILS)
    names = simulate_names_problems(spec_utils, with_mode)
    assert names == [], f"{version}: {SPEC_UTILS}'s SIMULATE_ACC_* (fact 7): {names}"
    defaults = simulate_defaults_problems(source_of(version, ENVIRON), with_mode)
    assert defaults == [], f"{version}: {ENVIRON}'s SGLANG_SIMULATE_ACC_* defaults (fact 7): {defaults}"
    kernel = source_of(version, SIMULATED_ACCEPT) if has_member(version, SIMULATED_ACCEPT) else None
    token = simulated_token_problems(spec_utils, kernel)
    assert token == [], f"{version}: the fixed mode's token vs LeanVerify.SIMULATED_TOKEN (fact 7): {token}"
    clamp = match_expected_problems(spec_utils)
    assert clamp == [], f"{version}: match-expected's clamp to the tree's depth (fact 7): {clamp}"


@pytest.mark.releases
@pytest.mark.parametrize("version", LEAN)
def test_no_release_writes_accept_lens_or_accept_index_in_place(version: str) -> None:
    sources = scanned_sources(version)
    assert any(name.endswith(EAGLE_UTILS) for name in sources), f"{version}: the scan found no {EAGLE_UTILS}"
    writes = {name: found for name, source in sources.items() if (found := inplace_write_problems(source))}
    assert writes == {}, f"{version}: in-place writes to accept_lens / accept_index (fact 8): {writes}"


@pytest.mark.releases
@pytest.mark.parametrize("version", LEAN)
def test_eagle_verify_input_has_the_sizes_takes_checks(version: str) -> None:
    problems = verify_input_problems(source_of(version, EAGLE_INFO))
    assert problems == [], f"{version}: EagleVerifyInput's tree sizes (fact 9): {problems}"


# -- negative controls: each checker reports the change it exists to catch ---------------------------

NEWEST = LEAN[-1]


def mutated(source: str, old: str, new: str) -> str:
    assert old in source, f"the control's anchor is not in {NEWEST}: {old!r}"  # else the control tests nothing
    return source.replace(old, new, 1)


SAMPLE_MUTATIONS = [
    # a new keyword argument the stand-in would ignore
    ("parameter", "    watermark_full_mask: bool = True,\n", "    watermark_full_mask: bool = True,\n    foo=None,\n"),
    # a new penalty on the logits, which takes does not check
    (
        "penalty",
        "    if sampling_info.logit_bias is not None:",
        "    if sampling_info.min_p_bias is not None:\n        next_token_logits.add_(sampling_info.min_p_bias)\n    if sampling_info.logit_bias is not None:",
    ),
    # an ungated change of the logits between the sanitize and the argmax
    (
        "greedy",
        "    candidates = verify_input.draft_token.reshape(",
        "    next_token_logits.div_(2)\n    candidates = verify_input.draft_token.reshape(",
    ),
    # the greedy path gated by more than is_all_greedy
    ("greedy", "return is_all_greedy or is_cpu", "return is_all_greedy and is_cpu"),
    # predict made in another dtype
    (
        "greedy",
        "predict = torch.zeros(predict_shape, dtype=torch.int32",
        "predict = torch.zeros(predict_shape, dtype=torch.int64",
    ),
    # the return order swapped
    ("return", "return predict, accept_lens, accept_index", "return predict, accept_index, accept_lens"),
    # the ignored sparse-sampling argument read on the greedy path
    (
        "ignored",
        "        target_predict = torch.argmax(next_token_logits, dim=-1)\n",
        "        target_predict = torch.argmax(next_token_logits, dim=-1)\n        assert uno_target_max_top_k is None\n",
    ),
]
CHECKERS = {
    "parameter": parameter_problems,
    "penalty": penalty_problems,
    "greedy": greedy_branch_problems,
    "return": sample_return_problems,
    "ignored": ignored_kwarg_problems,
}


@pytest.mark.releases
@pytest.mark.parametrize(("checker", "old", "new"), SAMPLE_MUTATIONS)
def test_the_eagle_sample_checkers_report_a_changed_release(checker: str, old: str, new: str) -> None:
    source = source_of(NEWEST, EAGLE_UTILS)
    assert CHECKERS[checker](source) == []  # the control: the real source passes
    assert CHECKERS[checker](mutated(source, old, new)) != [], f"{checker} missed {new!r}"


@pytest.mark.parametrize(
    "write",
    [
        "accept_lens.add_(1)",
        "batch_result.accept_lens.clamp_(max=1)",
        "accept_index[:, 0] = 3",
        "result.accept_lens -= 1",
        "torch.cumsum(x, 0, out=accept_lens)",
        "accept_lens[\n    :bs\n].copy_(\n    y\n)",  # split over lines, which a line regex would miss
        "tl.store(accept_lens + pid, 2)",
    ],
)
def test_the_in_place_scan_reports_a_write(write: str) -> None:
    reads = "x = accept_lens.tolist()\nsim_accept_index[:, 0] = 1\nprev_accept_lens.add_(1)\naccept_lens = accept_lens + 1\n"
    assert inplace_write_problems(reads) == []  # the control: reads, other names and rebinding are no writes
    assert inplace_write_problems(reads + write + "\n") != [], write


@pytest.mark.releases
def test_the_global_name_checks_report_a_verify_that_hides_the_global() -> None:
    source = source_of(NEWEST, COMMON)
    assert global_call_problems(source, v2.LeanVerify.SAMPLE, SAMPLE_ORIGIN) == []  # the control
    hidden = mutated(
        source,
        "    (\n        predict,\n        accept_lens,\n        accept_index,\n    ) = eagle_sample(",
        "    from sglang.srt.speculative.eagle_utils import eagle_sample\n\n    (\n        predict,\n        accept_lens,\n        accept_index,\n    ) = eagle_sample(",
    )
    assert global_call_problems(hidden, v2.LeanVerify.SAMPLE, SAMPLE_ORIGIN) != []
    keyword = mutated(
        source,
        "            bonus_tokens,\n            accept_index.shape[1],\n            bs,\n",
        "            bonus_tokens,\n            accept_stride=accept_index.shape[1],\n            batch_size=bs,\n",
    )
    assert fill_bonus_call_problems(source) == [] and fill_bonus_call_problems(keyword) != []
