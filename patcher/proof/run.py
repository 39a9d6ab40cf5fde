"""Orchestration: which servers to start, in which order, and what each check concludes.

Correctness runs on the small shape by default: the dynspec server (c) first, since it is the
one most likely to fail, then always-on (b) and base (a). The crossing ramp runs inside the
dynspec server's lifetime, after its equivalence levels, and the levels are sent again after
the ramp so the state left by the switches is checked too. Throughput starts its own three
servers (8B shape by default) with simulated acceptance, which equivalence must never have.

A server that fails to start ends the run: the report says which, and the checks that could not
finish fail. Every server is stopped however the run ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from packaging.version import InvalidVersion, Version

from patcher.proof import acceptance, detect, exactkv, features, launch, logscan, metrics, mixed, steps
from patcher.proof import report as reports
from patcher.proof.client import (
    WARMUP_PROMPT,
    Client,
    LevelResult,
    Reply,
    Request,
    level_result,
    measure_level,
    run_batches,
    run_level,
    run_waves,
    take_turns,
)
from patcher.proof.equivalence import (
    BASE_REPEAT,
    first_difference,
    level_mode,
    level_states,
    references,
    unrepeated,
)
from patcher.proof.errors import ProofUsageError, ServerStartError
from patcher.proof.logscan import LogFollower, Transition
from patcher.proof.pools import eight_b_pool_tokens, real_servers_side_by_side, shared_gpu_8b_servers
from patcher.proof.ramp import RampSchedule, run_ramp
from patcher.proof.servers import Progress, Server, ServerSpec, free_port, stderr_progress

AUTO_SINCE = "0.5.14"  # auto needs the zero-step mode (dynspec_auto, ZeroStepPolicy)
REAL_ACCEPTANCE = "real"  # auto_threshold's key on real weights: the model's own acceptance, not a simulated one
# With --threshold auto: checks that compare dynspec servers which must switch alike (exact_kv,
# acceptance), or that sweep fixed thresholds themselves (auto_threshold); the features' phases need a
# batch surely on and one surely off, and above auto's ceiling no batch fits the running-request limit
AUTO_REFUSES = ("exact_kv", "acceptance", "auto_threshold", "refusals", *features.CHECKS)
# Checks that only time servers and compare no tokens across them: --deterministic auto leaves them
# on the kernels users serve with
TIMING_CHECKS = ("throughput", "mixed_load", "auto_threshold")


def since(version: str, first: str) -> bool:
    try:
        return Version(version) >= Version(first)
    except InvalidVersion:
        return False


def error_note(name: str, info: Mapping[str, Any]) -> str | None:
    """A stopped server's error lines as a problem: how many, and the first; None without any."""
    errors = info.get("errors")
    return f"{info.get('error_count')} error line(s) in {name}.log: {errors[0]}" if errors else None


SERVER_NAMES = {
    "base": "base",
    "always_on": "always-on",
    "dynspec": "dynspec",
    launch.UPSTREAM_ADAPTIVE: "upstream-adaptive",
    launch.BASE_NO_OVERLAP: "base-no-overlap",
}
# exact_kv's reference and control: dynspec servers with another DYNSPEC_DRAFT_KV
DRAFT_KV_VARIANTS = {"full": "dynspec-full", "skip": "dynspec-skip"}
# acceptance's always-on reference: a dynspec server that never turns speculation off, so its drafts are recorded
NEVER_OFF_NAME = "always-on-recorded"
DRAFT_KV_ENV = "DYNSPEC_DRAFT_KV"
RECORD_ENV = "DYNSPEC_RECORD_DRAFTS"
KV_BITS_ENV = "DYNSPEC_CHECK_KV_BITS"  # the runtime's KVBitCheck
# Which server compares the direct write's bits with its full extend's (--exact-kv-bits-on), and its file:
# the full-extend reference (the stock verify's rows) or the server under test (v1: the lean step's rows).
KV_BITS_FILES = {"reference": "bits-dynspec-full.jsonl", "tested": "bits-dynspec.jsonl"}
# exact_kv's full-extend reference runs the stock zero-step verify too: the fallback as it was, so
# that the lean verify's tokens and hidden states are under test with the KV-only extend
LEAN_VERIFY_ENV = "DYNSPEC_LEAN_VERIFY"
KV_ONLY_WORDS = "draft KV only while off"  # the runtime's start-up line when the KV-only extend is on
KV_ONLY_MODES = ("kv-direct", "kv-graph", "kv")  # DYNSPEC_DRAFT_KV values of the KV-only extend
KV_ONLY_MODE = "kv-direct"  # the one exact_kv proves unless the caller sets another: the runtime's default
ADAPTIVE_OFF = "speculative_adaptive disabled"  # SGLang's warning when it falls back to static params
MAX_LISTED = 50  # errors and mismatches kept in the report per check


@dataclass
class ProofOptions:
    """Everything ``dynspec proof`` can be told. Defaults are the CLI's defaults."""

    out: Path
    sglang: str = "auto"
    python: str = sys.executable
    path: str = "v2"
    threshold: int | str = 32  # --speculative-disable-batch-size: a number, or launch.AUTO
    enable_threshold: int | None = None
    switch_min_steps: int | None = None
    levels: tuple[int, ...] = (1, 4, 16, 48)
    new_tokens: int = 64
    shape: str = "auto"
    checks: tuple[str, ...] = ("equivalence", "crossings")
    throughput_levels: tuple[int, ...] = (1, 4, 16, 32, 64, 128)
    throughput_new_tokens: int = 256
    throughput_warmup: bool = True  # an untimed run of each level first
    throughput_repeats: int = 3  # timed runs per level; the median counts
    simulate_acc_len: float | None = 3.0  # None: the drafts' own acceptance (real weights only)
    min_envelope_ratio: float = 0.97  # issue 13's R(C) target (0.9 before session 14)
    upstream_adaptive: bool = False  # a 4th throughput server: always on + upstream's adaptive mode
    no_overlap_base: bool = False  # another throughput server: speculation off, non-overlap scheduler
    min_upstream_ratio: float = 2.0  # dynspec / upstream adaptive needed at every level > threshold
    ramp_low: int = 1
    ramp_high: int = 64
    ramp_new_tokens: int = 32
    min_crossings: int = 100
    ramp_max_waves: int = 400
    ramp_timeout: float = 300.0
    # 3 cycles left v1's control 0 - 3 differing proposals (sessions 11, 22); 5 gave 26 - 58 every time.
    exact_kv_cycles: int = 5
    exact_kv_long_tokens: int = 128
    exact_kv_short_tokens: int = 64
    exact_kv_min_steps: int = 100  # proposals compared after a fallback span, at least
    exact_kv_bits: bool = False  # a server compares the direct write's bits with its full extend's (v1, kv-direct)
    exact_kv_bits_on: str = "reference"  # which: a key of KV_BITS_FILES
    mixed_phases: tuple[int, ...] = mixed.DEFAULT_PHASES
    mixed_per_phase: int = 2  # requests per phase = this x its concurrency
    mixed_new_tokens: int = 128
    mixed_new_tokens_max: int | None = None  # outputs of mixed_new_tokens .. this, by prompt (mixed.Schedule)
    mixed_repeats: int = 3  # timed passes per server; the median counts
    max_mixed_ratio: float = 1.03  # dynspec's total / the per-phase oracle's, at most
    # more dynspec servers on the mixed load, each (name, its own env): an A/B in the same call
    mixed_variants: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    # auto_threshold: the simulated acceptances, and the fixed thresholds auto is compared with
    auto_acceptances: tuple[float, ...] = (2.0, 3.0, 4.0)
    auto_sweep: tuple[int, ...] = (8, 16, 32, 48, 64, 96)
    max_auto_ratio: float = 1.03  # auto's mixed-load total / the best fixed N's, at most
    parallel_starts: int = 1  # servers started at once (each measured alone); > 1 shares the GPU
    # throughput and mixed_load, where all their servers start at once, and auto_threshold's groups of
    # servers started at once: the servers take turns at every level and pass (rotating the order),
    # rather than one server's levels after another's
    interleave: bool = True
    # After each server's warm-up request, POST /freeze_gc: the objects alive then (the start-up's) leave
    # the garbage collector's reach, so a full collection over them cannot stall a timed run
    freeze_gc: bool = False
    acceptance_min_verifies: int = 50  # verifies after a switch back on, at least
    sampling_per_prompt: int = features.SAMPLING_PER_PROMPT  # the sampling check's requests per prompt and phase
    refusal_timeout: float = 300.0  # seconds a refused server has to exit (0.5.17 takes ~30 s to reach the check)
    model: str = "dummy"  # "dummy" (config-only dirs of this package) or "real" (model_dir)
    model_dir: Path | None = None  # dynspec real prepare's or own's: target/, draft/, prompts.json, model.json
    # SGLang's batch-invariant mode on every server: "auto" turns it on for --model real where the
    # release has it. Without it, real weights round near ties by batch (session 16: dynspec at 48
    # requests, off throughout, gave other tokens than base and than itself a minute later).
    deterministic: str = "auto"
    tp: int | None = None
    attention_backend: str = "triton"  # every server's; the backends check needs another
    port: int = 30000
    start_timeout: float = 600.0
    request_timeout: float = 300.0
    extra_args: tuple[str, ...] = ()
    command: str = ""
    # Knobs for the CPU tests; the defaults are right for real servers.
    stop_timeout: float = 60.0
    poll_interval: float = 1.0
    progress_every: float = 10.0
    settle: float = 0.5
    env: Mapping[str, str] | None = None

    @property
    def dynspec(self) -> launch.Dynspec:
        return launch.Dynspec(self.threshold, self.enable_threshold, self.switch_min_steps)

    @property
    def auto(self) -> bool:
        """The dynspec server finds its own switch point (``--threshold auto``)."""
        return self.threshold == launch.AUTO

    @property
    def surely_off_above(self) -> int:
        """Above this batch size the dynspec server is off whatever it decides: the fixed threshold,
        or auto's ceiling."""
        return launch.AUTO_CEILING if self.auto else int(self.threshold)

    @property
    def feature_sizes(self) -> dict[str, int]:
        """The feature checks' batch size in each phase (``features.phase_sizes``)."""
        return features.phase_sizes(self.surely_on_at_most, self.surely_off_above, launch.MAX_RUNNING_REQUESTS)

    @property
    def surely_on_at_most(self) -> int:
        """At or below this batch size it speculates again: the switch-on size, or auto's floor (the
        switch-on size if given, else 1)."""
        if self.auto:
            return self.enable_threshold or 1
        return self.dynspec.on_at_most

    def dummy_8b(self, shape: str) -> bool:
        """Whether servers of ``shape`` load the dummy 8B pair: started side by side, their KV pools
        are sized to the GPU's memory (eight_b_pool_tokens)."""
        return self.model_dir is None and shape.startswith("8b")

    def shape_for(self, check: str) -> str:
        if self.shape != "auto":
            return self.shape
        return "8b" if check in ("throughput", "mixed_load", "auto_threshold") else "small"

    def shape_named(self, check: str) -> str:
        """What a report calls the weights it ran: a dummy shape, or "real" (the shape then unused)."""
        return "real" if self.model_dir is not None else self.shape_for(check)

    @property
    def exact_kv_load(self) -> exactkv.Load:
        """Long requests that fit under the switch-on size, short ones that push the batch above the threshold."""
        long = max(1, min(4, self.dynspec.on_at_most))
        return exactkv.Load(
            cycles=self.exact_kv_cycles,
            long=long,
            short=int(self.threshold) + 8 - long,  # plan() refuses exact_kv with auto
            joiners=2,
            long_tokens=self.exact_kv_long_tokens,
            short_tokens=self.exact_kv_short_tokens,
        )

    @property
    def mixed_schedule(self) -> mixed.Schedule:
        return mixed.Schedule(self.mixed_phases, self.mixed_per_phase, self.mixed_new_tokens, self.mixed_new_tokens_max)


def plan(
    opts: ProofOptions, sglang: detect.SGLang, gpu_memory_mib: int | None = None
) -> tuple[list[str], dict[str, str]]:
    """The checks to run and the reasons for those skipped; ``gpu_memory_mib``: the GPU's memory
    (``detect.gpu_memory_mib``), None where unknown. Raises ProofUsageError."""
    unknown = [c for c in opts.checks if c not in reports.CHECKS]
    if unknown:
        raise ProofUsageError(f"unknown check(s) {', '.join(unknown)}; choose from {', '.join(reports.CHECKS)}")
    if not sglang.has_worker(opts.path):
        raise ProofUsageError(
            f"SGLang {sglang.version} at {sglang.package} has no {opts.path} EAGLE worker "
            f"(srt/{detect.WORKERS[opts.path]}); try --path {'v2' if opts.path == 'v1' else 'v1'}"
        )
    checks = [c for c in reports.CHECKS if c in opts.checks]
    skipped: dict[str, str] = {c: "not asked for" for c in reports.CHECKS if c not in checks}
    if not sglang.dynspec_applied:
        for check in (
            "crossings",
            "exact_kv",
            "acceptance",
            "mixed_load",
            "auto_threshold",
            "refusals",
            "metrics",
            *features.CHECKS,
            "backends",
        ):
            if check in checks:
                checks.remove(check)
                skipped[check] = f"dynspec is not applied to {sglang.package} (no --speculative-disable-batch-size)"
    if not checks:
        raise ProofUsageError(
            "nothing to check: crossings, exact_kv, acceptance and mixed_load need an SGLang with dynspec applied"
        )
    if opts.model not in ("dummy", "real"):
        raise ProofUsageError(f"--model {opts.model!r}: choose dummy or real")
    if (opts.model == "real") != (opts.model_dir is not None):
        raise ProofUsageError(
            "--model real needs --model-dir (the output of `dynspec real prepare` or `dynspec real own`), and only it"
        )
    if opts.simulate_acc_len is None and opts.model_dir is None:
        raise ProofUsageError("--simulate-acc-len off needs --model real: dummy weights' drafts are all rejected")
    if opts.mixed_new_tokens_max is not None and opts.mixed_new_tokens_max < opts.mixed_new_tokens:
        raise ProofUsageError(
            f"--mixed-new-tokens-max ({opts.mixed_new_tokens_max}) is below --mixed-new-tokens "
            f"({opts.mixed_new_tokens}): give the shortest output, then the longest"
        )
    if opts.deterministic not in ("auto", "on", "off"):
        raise ProofUsageError(f"--deterministic {opts.deterministic!r}: choose auto, on or off")
    if opts.deterministic == "on" and not sglang.deterministic_supported:
        raise ProofUsageError(f"--deterministic on: SGLang {sglang.version} has no --enable-deterministic-inference")
    blind = [c for c in checks if c in features.REAL_WEIGHTS_ONLY]
    if opts.model == "dummy" and blind:
        raise ProofUsageError(
            f"{', '.join(blind)} need{'s' if len(blind) == 1 else ''} --model real: "
            + "; ".join(f"{c}: {features.REAL_WEIGHTS_ONLY[c]}" for c in blind)
            + " (penalties run on either)"
        )
    if "grammar" in checks:
        wave = features.grammar_wave_problem(opts.feature_sizes, launch.MAX_RUNNING_REQUESTS)
        if wave is not None:
            raise ProofUsageError(wave)
    if opts.model == "real" and "exact_kv" in opts.checks:
        # its skip control accepts otherwise, so on real weights its outputs may round apart: the acceptance check covers it
        raise ProofUsageError(
            "exact_kv runs on dummy weights; with --model real the acceptance check measures the same load"
        )
    if opts.exact_kv_short_tokens >= opts.exact_kv_long_tokens:
        raise ProofUsageError(
            f"--exact-kv-tokens {opts.exact_kv_long_tokens} {opts.exact_kv_short_tokens}: the long requests must "
            "outlive the short ones, or none speculates again after its span off"
        )
    for name, values in (("--levels", opts.levels), ("--throughput-levels", opts.throughput_levels)):
        if not values or any(v < 1 for v in values) or len(set(values)) != len(values):
            raise ProofUsageError(f"{name} needs distinct positive integers, got {values}")
    if opts.auto:
        refused = [c for c in checks if c in AUTO_REFUSES] + (["--upstream-adaptive"] if opts.upstream_adaptive else [])
        if refused:
            raise ProofUsageError(
                f"--threshold auto with {', '.join(refused)}: each compares servers that must switch at "
                "the same batch sizes (or sweeps fixed ones); run it with a number"
            )
        if opts.path != "v2" or not since(sglang.version, AUTO_SINCE):
            raise ProofUsageError(
                f"--threshold auto needs --path v2 on SGLang {AUTO_SINCE} or later (its zero-step mode); "
                f"this is {opts.path} on {sglang.version}"
            )
    if sglang.dynspec_applied:
        # With auto: from its floor up past its ceiling, so every level, ramp and phase that must
        # test a mode does so whatever it decides.
        n, m = opts.surely_off_above, opts.surely_on_at_most
        above = f"auto's ceiling {n}" if opts.auto else "the threshold"
        if not 1 <= m <= n < launch.MAX_RUNNING_REQUESTS:
            raise ProofUsageError(
                f"need 1 <= --enable-threshold ({m}) <= --threshold ({opts.threshold}) < {launch.MAX_RUNNING_REQUESTS} "
                f"(the servers' --max-running-requests{'; auto switches at most at ' + str(n) if opts.auto else ''})"
            )
        if "equivalence" in checks and not (min(opts.levels) <= m and max(opts.levels) > n):
            raise ProofUsageError(
                f"--levels {','.join(map(str, opts.levels))} must have a level <= {m} and one > {n}, "
                f"so equivalence is checked below {'its floor' if opts.auto else 'the threshold'} and above {above}"
            )
        if "crossings" in checks and not (opts.ramp_low <= m and opts.ramp_high > n):
            raise ProofUsageError(f"--ramp {opts.ramp_low},{opts.ramp_high} must go from <= {m} to > {n}")
        if "mixed_load" in checks and not (min(opts.mixed_phases) <= m and max(opts.mixed_phases) > n):
            raise ProofUsageError(
                f"--mixed-phases {','.join(map(str, opts.mixed_phases))} must have a phase <= {m} and one > {n}"
            )
    if "auto_threshold" in checks:
        if opts.path != "v2" or not since(sglang.version, AUTO_SINCE):
            raise ProofUsageError(
                f"auto_threshold needs --path v2 on SGLang {AUTO_SINCE} or later (its zero-step mode); "
                f"this is {opts.path} on {sglang.version}"
            )
        if not opts.auto_sweep or any(not 1 <= n < launch.MAX_RUNNING_REQUESTS for n in opts.auto_sweep):
            raise ProofUsageError(
                f"--auto-sweep needs thresholds in 1 .. {launch.MAX_RUNNING_REQUESTS - 1}, got {opts.auto_sweep}"
            )
        if not opts.auto_acceptances or any(a < 1 for a in opts.auto_acceptances):
            raise ProofUsageError(
                f"--auto-acceptance needs simulated acceptances of at least 1, got {opts.auto_acceptances}"
            )
    if opts.attention_backend not in launch.ATTENTION_BACKENDS:
        raise ProofUsageError(
            f"--attention-backend {opts.attention_backend!r}: choose {', '.join(launch.ATTENTION_BACKENDS)}"
        )
    if "backends" in checks and (opts.attention_backend == "triton" or not {"equivalence", "crossings"} <= set(checks)):
        raise ProofUsageError(
            "backends judges equivalence and crossings on another attention backend than Triton: "
            "add --attention-backend flashinfer (or fa3) and equivalence,crossings to --checks"
        )
    if "metrics" in checks and "crossings" not in checks:
        raise ProofUsageError("metrics are read around the crossings' ramp: add crossings to --checks")
    if opts.mixed_variants and "mixed_load" not in checks:
        raise ProofUsageError("--mixed-variant needs the mixed_load check (--checks mixed_load) and dynspec applied")
    if opts.parallel_starts > 1:
        if (opts.tp or 1) > 1:
            raise ProofUsageError(
                "--parallel-starts needs --tp 1: SGLang checks that its GPUs' free memory is balanced"
            )
        # The GPU's memory limits the dummy 8B shape's servers, whichever checks run them (their pools
        # are sized from it: eight_b_pool_tokens), and a real model's timed ones (real_servers_side_by_side);
        # the timed servers of another model, at most 3.
        eight_b = any(opts.dummy_8b(opts.shape_for(c)) for c in checks)
        memory = gpu_memory_mib if eight_b or opts.model_dir is not None else None
        need = eight_b_slots_needed(opts)
        if opts.model_dir is not None and not eight_b:
            fit = real_servers_side_by_side(memory, *launch.real_dirs(opts.model_dir))
            held = "" if memory is None else f" in this GPU's {memory / 1024:.0f} GiB"
        else:
            fit = shared_gpu_8b_servers(memory, need, opts.attention_backend)
            held = (
                ""
                if memory is None
                else f" in this GPU's {memory / 1024:.0f} GiB, with pools of the {need} KV slots the loads need"
            )
        if (eight_b or {"throughput", "mixed_load", "auto_threshold"} & set(checks)) and opts.parallel_starts > fit:
            whose = "the 8B shape's servers" if eight_b else "throughput's, mixed_load's and auto_threshold's servers"
            raise ProofUsageError(
                f"--parallel-starts {opts.parallel_starts}: at most {fit} of {whose} start side by side{held}"
                + ("; with fewer, they run one after another" if fit > 1 else "")
            )
    names = [name for name, _ in opts.mixed_variants]
    if len(set(names)) != len(names):
        raise ProofUsageError(f"--mixed-variant names must differ, got {', '.join(names)}")
    if opts.upstream_adaptive:
        if "throughput" not in checks:
            raise ProofUsageError("--upstream-adaptive needs the throughput check (--checks throughput)")
        if not sglang.adaptive_supported:
            raise ProofUsageError(
                f"--upstream-adaptive: SGLang {sglang.version} at {sglang.package} has no --speculative-adaptive "
                "(no speculative_adaptive_config in its ServerArgs)"
            )
        if opts.path == "v2" and sglang.adaptive_v1_only:
            raise ProofUsageError(
                f"--upstream-adaptive: SGLang {sglang.version} turns --speculative-adaptive off under the "
                "overlap scheduler (path v2); use --path v1"
            )
        if sglang.dynspec_applied and not any(c > opts.surely_off_above for c in opts.throughput_levels):
            raise ProofUsageError(
                f"--upstream-adaptive compares at levels above --threshold {opts.threshold}; "
                f"--throughput-levels {','.join(map(str, opts.throughput_levels))} has none"
            )
    if "crossings" in checks and opts.ramp_high > launch.MAX_RUNNING_REQUESTS:
        raise ProofUsageError(f"--ramp high ({opts.ramp_high}) is above --max-running-requests 128")
    return checks, skipped


# The fallback step's bar against plain decode's (issue 13 item 2), which ``backends`` holds every
# attention backend to where throughput ran beside it: v2 against the overlapping base, v1 against
# the non-overlapping one (``per_step_no_overlap``, --no-overlap-base; without it v1's is not judged).
# Session 38: FlashInfer's fallback step ran at 0.55 of a plain one, equivalence and crossings intact.
MIN_STEP_RATIO = {"v2": 0.98, "v1": 0.97}


def judge_backends(report: Mapping[str, Any], backend: str) -> dict[str, Any]:
    """Issue 17's ``backends``: equivalence and crossings, run on ``backend`` (every server's), and
    the fallback step's speed against plain decode where throughput ran too."""
    eq, cr = report.get("equivalence", {}), report.get("crossings", {})
    problems = [f"equivalence: {p}" for p in eq.get("problems", [])[:3]] if not eq.get("passed") else []
    problems += [f"crossings: {p}" for p in cr.get("problems", [])[:3]] if not cr.get("passed") else []
    if not eq or not cr:
        problems.append("equivalence or crossings did not run")
    entry: dict[str, Any] = {
        "passed": False,  # set below, once the step is judged too
        "attention_backend": backend,
        "equivalence": eq.get("passed"),
        "crossings": cr.get("count"),
        "detail": f"{backend}: equivalence {'✓' if eq.get('passed') else '✗'}, {cr.get('count', 0)} crossings",
    }
    if "throughput" in report:
        tp, path = report["throughput"], str(report.get("path"))
        entry["per_step"] = tp.get("per_step")
        # the base throughput judged against: v1 is held to its bar against the non-overlapping one only
        no_overlap = tp.get("judged_against") == launch.BASE_NO_OVERLAP
        steps_of = (tp.get("per_step_no_overlap" if no_overlap else "per_step") or {}).get("dynspec") or {}
        if path == "v1" and not no_overlap:
            entry["detail"] += (
                ", fallback step not judged (v1's bar is against plain decode without overlap: --no-overlap-base)"
            )
        elif not steps_of:
            entry["detail"] += ", fallback step not judged (no steady fallback steps beside plain decode's)"
        else:
            bar = MIN_STEP_RATIO["v1" if path == "v1" else "v2"]
            entry["min_step_ratio"] = bar
            ordered = sorted(steps_of.items(), key=lambda item: int(item[0]))
            for level, ratios in ordered:
                if ratios["median"] < bar:
                    problems.append(
                        f"per_step: dynspec's fallback step at C={level} runs at {ratios['median']} of a plain one "
                        f"(at least {bar})"
                    )
            entry["detail"] += ", fallback step " + ", ".join(f"{r['median']} at C={c}" for c, r in ordered)
    entry.update(passed=not problems, problems=problems)
    return entry


# How throughput's and mixed_load's servers were measured (their reports' ``order``)
ORDER_TOGETHER = "interleaved: the servers took turns at each level and pass, the order rotated each run"
ORDER_ALONE = "one server after another"
ORDER_FIRST_TOGETHER = "interleaved: {} took turns at each level and pass, the order rotated each run; then {} alone"
# auto_threshold's, by group of servers up at once
ORDER_GROUPS = "interleaved: the servers of a group took turns at each pass, the order rotated each pass; groups: "
NCCL_PORT_OFFSET = 500  # --parallel-starts: torch.distributed ports from --port + this on
PROMPT_TOKENS_MAX = 47  # client.prompt's longest
DRAFT_SLOTS_PER_REQUEST = 8  # slots a speculative request holds beyond its tokens (its draft tree, with room)


def plain_reference(path: str) -> str:
    """The plain-decode server the feature checks judge dynspec against while off (their ``base``):
    on v1, which never overlaps, plain decode on the non-overlap scheduler, since SGLang penalizes a
    token late under overlap (0.5.12's ``prepare_for_decode``; session 44: 1 of 16 requests apart)."""
    return launch.BASE_NO_OVERLAP if path == "v1" else "base"


def informational_modes(opts: ProofOptions, throughput: bool, mixed_load: bool) -> tuple[str, ...]:
    """The plain-decode servers of throughput and mixed_load that no verdict compares: with
    --no-overlap-base, the non-overlapping one (information), except where throughput alone judges v1:
    v1's throughput is judged against it, so there the overlapping one is told only (mixed_load judges
    v1 against the overlapping one, so with both checks each base is compared)."""
    if not opts.no_overlap_base:
        return ()
    if opts.path == "v1" and throughput:
        return () if mixed_load else ("base",)
    return (launch.BASE_NO_OVERLAP,)


def groups_order(groups: Sequence[Sequence[str]]) -> str:
    """How auto_threshold's servers were measured: each of ``groups`` (server names) up at once,
    taking turns, one group after another."""
    if all(len(g) == 1 for g in groups):
        return ORDER_ALONE
    return ORDER_GROUPS + "; ".join(", ".join(g) for g in groups)


def measuring_order(names: Sequence[str], together: int) -> str:
    """How throughput's and mixed_load's servers were measured: the first ``together`` of ``names`` up
    at once, taking turns, the rest one after another."""
    if together == len(names):
        return ORDER_TOGETHER
    if not together:
        return ORDER_ALONE
    return ORDER_FIRST_TOGETHER.format(", ".join(names[:together]), ", ".join(names[together:]))


def eight_b_slots_needed(opts: ProofOptions) -> int:
    """The most KV slots one server's 8B loads hold at once, each request with the longest prompt, its
    new tokens and its draft's slots: the largest load among the checks asked (metrics rides on the
    crossings' ramp; refusals never start an 8B server; a check this does not know: the largest of all)."""
    mixed = (max(opts.mixed_phases), opts.mixed_new_tokens_max or opts.mixed_new_tokens)
    loads = {
        "throughput": (max(opts.throughput_levels), opts.throughput_new_tokens),
        "mixed_load": mixed,
        "auto_threshold": mixed,
        "equivalence": (max(opts.levels), opts.new_tokens),
        "crossings": (opts.ramp_high, opts.ramp_new_tokens),
        "metrics": (opts.ramp_high, opts.ramp_new_tokens),
    }
    if not opts.auto:  # (plan() refuses exact_kv with auto)
        kv = opts.exact_kv_load
        loads["exact_kv"] = (kv.long + kv.short + kv.joiners, kv.long_tokens)
    asked = [c for c in opts.checks if c != "refusals"]
    chosen = [loads[c] for c in asked if c in loads]
    if len(chosen) < len(asked):
        chosen = list(loads.values())
    return max((c * (PROMPT_TOKENS_MAX + new + DRAFT_SLOTS_PER_REQUEST) for c, new in chosen), default=0)


@dataclass(frozen=True)
class Plan:
    """One server a check will start: its mode, model shape, simulated acceptance (None: off),
    name in logs and the report, its own environment, and dynspec flags other than the run's."""

    mode: str
    shape: str
    simulate: float | None
    name: str
    env: Mapping[str, str] = field(default_factory=dict)
    dynspec: launch.Dynspec | None = None
    extra: tuple[str, ...] = ()  # server flags after the run's (the last of a flag given twice wins)
    tokenizer: bool = False  # loads the model's tokenizer (launch.server_args)

    def entry(self) -> dict[str, Any]:
        """The start of its entry in the report's ``servers``."""
        return {"name": self.name, "mode": self.mode, "shape": self.shape}


@dataclass(frozen=True)
class Refusal:
    """A combination dynspec refuses at start-up: the flags a dynspec server gets on top of the
    run's, and the words its one-line error must hold (the start-up check's, dynspec_settings)."""

    name: str
    args: tuple[str, ...]
    says: str
    dynspec: launch.Dynspec | None = None  # other dynspec flags than the run's

    def judge(self, code: int | None, log: str, seconds: float) -> dict[str, Any]:
        """Its report row: refused means exited (not killed, not up), non-zero, the words, no traceback."""
        problems = []
        if code is None:
            problems.append(f"still running after {seconds:.0f} s: it did not refuse to start")
        elif code == 0:
            problems.append("exited with code 0")
        said = [line for line in log.splitlines() if self.says in line]
        if code is not None and not said:
            problems.append(f"its log has no line with {self.says!r}")
        if logscan.TRACEBACK in log:
            problems.append("its log has a Python traceback")
        return {
            "name": self.name,
            "args": [*(self.dynspec.flags() if self.dynspec else ()), *self.args],
            "says": self.says,
            "exit_code": code,
            "seconds": round(seconds, 1),
            "line": said[-1].strip()[:300] if said else None,
            "problems": problems,
        }


def refusal_cases(sglang: detect.SGLang, path: str) -> list[Refusal]:
    """What the start-up check refuses on this release (issue 18's list, and a bad value)."""
    flag = launch.THRESHOLD_FLAG
    cases = [
        Refusal("topk", ("--speculative-eagle-topk", "2"), f"{flag} does not support --speculative-eagle-topk > 1"),
        # With one DP rank SGLang turns DP attention off itself and serves (0.5.17 did): two ranks keep it.
        # The check refuses before any rank starts, so one GPU is enough.
        Refusal(
            "dp-attention",
            ("--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"),
            f"{flag} does not support --enable-dp-attention",
        ),
        Refusal(
            "max-running",
            (),
            f"{flag} {launch.MAX_RUNNING_REQUESTS} can never trigger",
            launch.Dynspec(launch.MAX_RUNNING_REQUESTS),
        ),
        Refusal(
            "graph-size",
            ("--cuda-graph-max-bs", "16"),
            f"{flag} 16 is not below the largest CUDA-graph batch size",
            launch.Dynspec(16),
        ),
        Refusal("bad-value", (), f"{flag} must be a positive integer or auto, got '0'", launch.Dynspec("0")),
    ]
    if sglang.adaptive_supported and (path == "v1" or not sglang.adaptive_v1_only):  # else SGLang turns it off
        cases.append(
            Refusal("adaptive", ("--speculative-adaptive",), f"{flag} does not support --speculative-adaptive")
        )
    if path == "v1" or not since(sglang.version, AUTO_SINCE):
        cases.append(
            Refusal("auto", (), f"{flag} auto needs SGLang {AUTO_SINCE} or later", launch.Dynspec(launch.AUTO))
        )
    return cases


class Proof:
    def __init__(self, opts: ProofOptions, progress: Progress = stderr_progress) -> None:
        self.opts = opts
        self.progress = progress
        self.env: Mapping[str, str] = dict(os.environ) if opts.env is None else opts.env
        self.report: dict[str, Any] = {}
        self.aborted: str | None = None
        self.sglang: detect.SGLang | None = None
        self.gpu_memory_mib: int | None = None  # detect.gpu_memory_mib(), read as the run starts
        self.checks: list[str] | None = None  # what plan() kept, set as the run starts
        self.server_info: dict[str, Any] = {}  # the report entry of the server served last
        self._queue: list[Plan] = []  # what ``starting`` was told will be served, not started yet
        self._started: dict[str, tuple[Server, dict[str, Any]]] = {}  # up or starting, not yet served
        self._start_errors: dict[str, ServerStartError] = {}  # started in a group, failed to come up
        self._serving: dict[str, dict[str, Any]] = {}  # served and not yet stopped (a check's servers up together)
        self._ports: set[int] = set()  # given to servers that may not listen yet
        self.ramp_final_state = "ON"
        self.prompts: list[list[int]] = []  # real tokenized prompts; none: the synthetic ids of client.prompt
        self.model_name = "dummy"
        self.model_sha256: dict[str, str | None] | None = None  # real weights: which GGUF and head ran
        self.model_paths: dict[str, str] | None = None  # the user's own weights (`dynspec real own`): where
        if opts.model_dir is not None:
            self.model_name, self.prompts, self.model_sha256, self.model_paths = load_real(opts.model_dir)

    # -- running ------------------------------------------------------------------------------

    @property
    def deterministic(self) -> bool:
        """Whether every server gets ``--enable-deterministic-inference`` (plan() has checked "on").
        ``auto``: on real weights, unless every check only times servers. Batch-invariant kernels
        are slower than the ones users serve with, and move the switch point those checks look for."""
        assert self.sglang is not None
        wanted = self.opts.deterministic == "on" or (
            self.opts.deterministic == "auto"
            and self.opts.model_dir is not None
            and not (self.checks is not None and set(self.checks) <= set(TIMING_CHECKS))
        )
        return wanted and self.sglang.deterministic_supported

    def run(self) -> dict[str, Any]:
        opts = self.opts
        self.sglang = sglang = detect.locate(opts.sglang, opts.python, self.env)
        self.gpu_memory_mib = detect.gpu_memory_mib()
        checks, skipped = plan(opts, sglang, self.gpu_memory_mib)
        self.checks = checks
        shared = bool(set(checks) - {"auto_threshold"})  # a check that runs the one dynspec server of --threshold
        opts.out.mkdir(parents=True, exist_ok=True)
        self.report = {
            "model": self.model_name,
            "model_sha256": self.model_sha256,
            "model_paths": self.model_paths,
            "sglang_version": sglang.version,
            "sglang_dir": str(sglang.package),
            "path": opts.path,
            "gpu": detect.gpu_name(),
            "gpu_memory_mib": self.gpu_memory_mib,
            "command": opts.command,
            "dynspec_applied": sglang.dynspec_applied,
            "dynspec_revisions": detect.applied_revisions(sglang.package),  # patch id -> revision in the tree
            "threshold": opts.threshold,
            # the one dynspec server the checks share; auto_threshold alone has none (its auto server
            # gets --enable-threshold as given, each fixed N its own)
            "enable_threshold": opts.enable_threshold if opts.auto or not shared else opts.dynspec.on_at_most,
            "switch_min_steps": opts.switch_min_steps,
            "dynspec_flags": " ".join(opts.dynspec.flags()) if shared else "",
            # the runtime's switches (DYNSPEC_ONE_TOKEN_ATTENTION, DYNSPEC_EARLY_FENCE), as the servers got them
            "dynspec_env": {k: v for k, v in sorted(self.env.items()) if k.startswith("DYNSPEC_")},
            "tp": opts.tp,
            "attention_backend": opts.attention_backend,
            "deterministic": self.deterministic,
            "checks": checks,
            "skipped": skipped,
            "out": str(opts.out),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "complete": False,
            "passed": False,
            "servers": [],
        }
        if not sglang.dynspec_applied:
            self.progress(f"dynspec is not applied to {sglang.package}: checking speculation off vs always on only")
        self._save()
        ran_through = False  # not stopped by a signal or an error on the way
        try:
            if {"equivalence", "crossings", "exact_kv", "acceptance"} & set(checks):
                self.correctness(
                    "equivalence" in checks,
                    "crossings" in checks,
                    "exact_kv" in checks,
                    "acceptance" in checks,
                    "metrics" in checks,
                )
            if "refusals" in checks:
                self.refusals()
            asked = [c for c in features.CHECKS if c in checks]
            if asked:
                if self.aborted:
                    for check in asked:
                        self.report[check] = {"passed": False, "problems": [f"not run: {self.aborted}"]}
                else:
                    self.features(asked)
            if "auto_threshold" in checks:
                if self.aborted:
                    self.report["auto_threshold"] = {"passed": False, "problems": [f"not run: {self.aborted}"]}
                else:
                    self.auto_threshold()
            simulated = [c for c in ("throughput", "mixed_load") if c in checks]
            if simulated:
                if self.aborted:
                    for check in simulated:
                        self.report[check] = {"passed": False, "problems": [f"not run: {self.aborted}"]}
                else:
                    self.simulated("throughput" in checks, "mixed_load" in checks)
            if "backends" in checks:
                self.report["backends"] = judge_backends(self.report, opts.attention_backend)
            ran_through = True
        finally:
            self.report["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            self.report["complete"] = ran_through and self.aborted is None and all(c in self.report for c in checks)
            self.report["passed"] = reports.verdict(self.report)
            self._save()
        return self.report

    def _save(self) -> None:
        reports.write(self.report, self.opts.out)

    @contextlib.contextmanager
    def starting(self, plans: Sequence[Plan]) -> Iterator[None]:
        """The servers the caller will ``serve``, in that order: with ``--parallel-starts N`` the
        first ``serve`` of a group starts N of them at once and waits for all; each is then measured
        alone, or the group together (``serve_in_groups``), while the others idle. On leaving, any still
        up are stopped."""
        self._queue = list(plans)
        try:
            yield
        finally:
            self._queue = []
            self._start_errors.clear()
            for server, _ in self._started.values():
                server.begin_stop()  # together: one after another took about 6 s each (session 51)
            for server, info in list(self._started.values()):
                self._finish(server, info)
            self._started.clear()

    @contextlib.contextmanager
    def serve(self, plan: Plan) -> Iterator[Server]:
        """The server of ``plan``, up and warmed up; stopped on leaving."""
        self.server_info = plan.entry()  # until it is launched
        if plan.name not in self._started:
            launch_error = self._start_errors.pop(plan.name, None)  # a group member that could not launch
            if launch_error is not None:
                raise launch_error
            self._start_group(plan)
        server, info = self._started.pop(plan.name)
        self.server_info = info
        self._serving[plan.name] = info
        try:
            error = self._start_errors.pop(plan.name, None)
            if error is not None:
                raise error
            assert server.popen is not None
            if server.popen.poll() is not None:  # came up, then died while others were measured
                raise ServerStartError(f"{plan.name} server exited with code {server.popen.returncode} before its turn")
            yield server
        except ServerStartError as error:
            info["start_error"] = str(error)
            raise
        finally:
            del self._serving[plan.name]
            self._finish(server, info)

    def _start_group(self, plan: Plan) -> None:
        """Start ``plan`` and the queued plans of its group (``_group``); wait for ``plan``, then for the
        others (a failure is raised when that plan is served). If ``plan``'s own pool cannot hold the
        loads beside the servers still up, nothing starts (raised now)."""
        group = self._group(plan)
        self._queue = [p for p in self._queue if p.name not in {g.name for g in group}]  # not started yet
        pool = self._group_pool(group)
        if self._short(group):
            raise ServerStartError(
                f"{plan.name}: beside the {len(self._up())} server(s) still up its pool would be {pool} slots "
                f"in this GPU's memory, fewer than the {eight_b_slots_needed(self.opts)} the 8B loads need: "
                "fewer --parallel-starts"
            )
        self._started[plan.name] = self._launch(plan, pool)
        for p in group[1:]:
            try:
                self._started[p.name] = self._launch(p, pool)
            except ServerStartError as error:  # (no free port) said when its turn comes
                self._start_errors[p.name] = error
        for p in group:
            if p.name not in self._started:
                continue  # did not launch
            server, info = self._started[p.name]
            try:
                self._wait(server, info)
            except ServerStartError as error:
                self._start_errors[p.name] = error
                if p is plan:
                    return  # the caller stops here: do not wait for the rest

    def _group(self, plan: Plan) -> list[Plan]:
        """``plan`` and, with --parallel-starts N, up to the next N - 1 queued plans: as many as leave
        8B pools that hold the loads (on an H100 three speculating 8B servers hold auto_threshold's
        mixed load, 24576 slots each, but not throughput's 39808); the rest start on their turn."""
        waiting = [p for p in self._queue if p.name != plan.name]
        group = [plan, *waiting[: self.opts.parallel_starts - 1]]
        while len(group) > 1 and self._short(group):
            group.pop()
        if len(group) < min(self.opts.parallel_starts, len(waiting) + 1):
            self.progress(f"starting {len(group)} at once: more would leave 8B pools too small for the loads")
        return group

    def _short(self, group: Sequence[Plan]) -> bool:
        """Whether ``group``, sharing the GPU, leaves its 8B servers pools under what the loads need
        (alone, a server's pool is SGLang's own: _wait reads it)."""
        return (
            self.opts.parallel_starts > 1
            and any(self.opts.dummy_8b(p.shape) for p in group)
            and self._group_pool(group) < eight_b_slots_needed(self.opts)
        )

    def _group_pool(self, group: Sequence[Plan]) -> int:
        """The KV pool of each 8B-shape server of ``group`` (the others keep SHARED_GPU_MAX_TOTAL_TOKENS):
        what the GPU's memory leaves each of its members and of the servers still up beside them,
        every one counted at an 8B server's size (eight_b_pool_tokens)."""
        up = [info["mode"] for info in self._up()]
        speculative = sum(launch.speculates(mode) for mode in (*(p.mode for p in group), *up))
        plain = len(group) + len(up) - speculative
        return eight_b_pool_tokens(self.gpu_memory_mib, speculative, plain, self.opts.attention_backend)

    def _up(self) -> list[dict[str, Any]]:
        """The report entries of the servers on the GPU: started and waiting their turn, or being served."""
        return [*(info for _, info in self._started.values()), *self._serving.values()]

    def _launch(self, plan: Plan, pool: int) -> tuple[Server, dict[str, Any]]:
        opts = self.opts
        shared = opts.parallel_starts > 1
        port = free_port(opts.port, taken=self._ports)
        # torch.distributed's port, chosen here so that servers starting together differ
        nccl_port = free_port(opts.port + NCCL_PORT_OFFSET, taken={*self._ports, port}) if shared else None
        self._ports.update(p for p in (port, nccl_port) if p is not None)
        try:
            return self._start(plan, port, nccl_port, pool)
        except BaseException:
            self._ports.difference_update({port, nccl_port})
            raise

    def _start(self, plan: Plan, port: int, nccl_port: int | None, pool: int) -> tuple[Server, dict[str, Any]]:
        opts = self.opts
        assert self.sglang is not None
        args = launch.server_args(
            plan.mode,
            shape=plan.shape,
            port=port,
            path=opts.path,
            dynspec=plan.dynspec or opts.dynspec,
            tp=opts.tp,
            extra=(  # the GC threshold before the caller's flags, so that theirs win
                *(launch.GC_WARNING_FLAGS if self.sglang.gc_warning_supported else ()),
                *opts.extra_args,
                *(launch.DETERMINISTIC_FLAGS if self.deterministic else ()),
                *plan.extra,
            ),
            adaptive_config_path=opts.out / launch.ADAPTIVE_CONFIG_NAME,
            real=opts.model_dir,
            shared_gpu_nccl_port=nccl_port,
            shared_gpu_pool_tokens=pool if opts.dummy_8b(plan.shape) else launch.SHARED_GPU_MAX_TOTAL_TOKENS,
            attention_backend=opts.attention_backend,
            tokenizer=plan.tokenizer,
        )
        argv = launch.server_argv(opts.python, args)
        changes = launch.env_changes(simulate_acc_len=plan.simulate, pythonpath=self.sglang.pythonpath, base=self.env)
        changes.update(plan.env)
        spec = ServerSpec(
            plan.name, tuple(argv), launch.apply_env(changes, self.env), opts.out / f"{plan.name}.log", port, changes
        )
        info = plan.entry()
        info.update(port=port, argv=argv, env=changes, log=str(spec.log))
        if nccl_port is not None:
            info["nccl_port"] = nccl_port
        self.report["servers"].append(info)
        self.progress(f"starting {plan.name} server on port {port} (takes 1-3 minutes; log {spec.log})")
        self.progress("  " + " ".join(argv))
        server = Server(spec, stop_timeout=opts.stop_timeout, progress=self.progress)
        try:
            server.start()
        except BaseException:
            info["stopped_by"] = server.stopped_by
            raise
        return server, info

    def _wait(self, server: Server, info: dict[str, Any]) -> None:
        opts = self.opts
        name = server.spec.name
        server.wait_ready(opts.start_timeout, opts.poll_interval, opts.progress_every)
        info["start_seconds"] = round(server.start_seconds, 1)
        self.progress(f"{name} is up after {server.start_seconds:.0f} s")
        # --max-total-tokens only caps the pool: SGLang makes it smaller, with a warning, where the
        # memory it found free as it started was short (neighbours loading beside it), and an 8B
        # server whose pool cannot hold its load would queue or retract and time something else.
        pool = logscan.kv_pool_tokens(logscan.read_window(server.spec.log, 0, server.ready_offset)[0])
        info["kv_pool_tokens"] = pool
        if pool is not None and opts.dummy_8b(str(info.get("shape", ""))):
            need = eight_b_slots_needed(opts)
            if pool < need:
                beside = " (it found the GPU's memory short, starting beside others: try fewer --parallel-starts)"
                raise ServerStartError(
                    f"{name}: SGLang made a KV pool of {pool} slots, fewer than the {need} its loads need"
                    + (beside if opts.parallel_starts > 1 else "")
                )
        client = self.client(server)
        warm = client.generate(WARMUP_PROMPT, 8)
        if warm.error:
            raise ServerStartError(f"{name}: the warm-up request failed: {warm.error}")
        if opts.freeze_gc:
            try:
                status, body = client.request("POST", "/freeze_gc", timeout=60)
            except OSError as error:
                raise ServerStartError(f"{name}: --freeze-gc: /freeze_gc did not answer: {error}") from error
            if status != 200:
                raise ServerStartError(f"{name}: --freeze-gc: /freeze_gc answered {status} {body[:100]!r}")
            info["gc_frozen"] = True

    def _finish(self, server: Server, info: dict[str, Any]) -> None:
        """Stop ``server`` and record in ``info`` how it ended and what its log holds."""
        spec = server.spec
        server.stop()
        self._ports.difference_update({spec.port, info.get("nccl_port")})
        info["stopped_by"] = server.stopped_by
        if server.popen is not None:
            startup = logscan.scan_file(spec.log, 0, server.ready_offset)
            serving = logscan.scan_file(spec.log, server.ready_offset, server.stop_offset)
            info["startup_notes"] = [str(e) for e in startup.errors[:10]]
            info["errors"] = [str(e) for e in serving.errors[:MAX_LISTED]]
            info["error_count"] = len(serving.errors)
            info["switches"] = {"off": serving.off, "on": serving.on}
            watched = launch.gc_warning_secs(spec.argv)  # the last flag wins, as in SGLang's parser
            if watched:  # else SGLang logs none: not "none seen"
                info[reports.LONG_GC] = [c.entry() for c in serving.collections]
                info[reports.LONG_GC_OVER] = watched
        self.progress(f"stopped {spec.name} ({server.stopped_by or 'never started'})")
        self._save()

    def client(self, server: Server) -> Client:
        return Client("127.0.0.1", server.spec.port, timeout=self.opts.request_timeout, prompts=self.prompts)

    def levels(
        self,
        server: Server,
        levels: Sequence[int],
        new_tokens: int,
        label: str,
        *,
        warmup: bool = False,
        repeats: int = 1,
        batched: bool = False,
    ) -> list[tuple[LevelResult, list[Transition]]]:
        """Each level once (or its median of ``repeats``), with the switch lines logged while it ran.

        ``batched`` (equivalence): a level's requests go in one call (``run_batches``), so every server
        prefills them together and decodes them in batches of the same sizes: graphs of other sizes
        round apart, and on real weights a near tie can flip a greedy token without any server being wrong."""
        out = []
        client = self.client(server)
        for c in levels:
            follower = LogFollower(server.spec.log, logscan.size(server.spec.log))
            if batched:
                result = run_batches(client, [Request(i, new_tokens) for i in range(c)])
            elif warmup or repeats > 1:
                result = measure_level(client, range(c), new_tokens, warmup=warmup, repeats=repeats)
            else:
                result = run_level(client, range(c), new_tokens)
            time.sleep(self.opts.settle if server.spec.name.startswith("dynspec") else 0)
            follower.poll()
            out.append((result, follower.transitions))
            self.tell_level(label, result)
        return out

    def tell_level(self, label: str, result: LevelResult) -> None:
        failed = f", {len(result.failures)} FAILED" if result.failures else ""
        spread = f" (median of {', '.join(f'{x:.0f}' for x in result.samples)})" if len(result.samples) > 1 else ""
        self.progress(
            f"  {label} C={result.concurrency}: {result.tokens} tokens in {result.seconds:.2f} s = {result.tok_s:.0f} tok/s{spread}, "
            f"digest {result.digest}{failed}"
        )

    def levels_together(
        self, servers: Sequence[Server], levels: Sequence[int], new_tokens: int, *, warmup: bool, repeats: int
    ) -> dict[str, list[tuple[LevelResult, list[Transition]]]]:
        """``levels`` with ``warmup`` and ``repeats`` on servers that are up at once, taking turns: at
        each level every server is warmed up, then each timed run goes to every server in turn, the
        order rotated by one server each run (``take_turns`` for why). A server's level
        ends at its first failing run, which is then its result, as in ``measure_level``."""
        names = [server.spec.name for server in servers]
        clients = {server.spec.name: self.client(server) for server in servers}
        out: dict[str, list[tuple[LevelResult, list[Transition]]]] = {name: [] for name in names}
        for c in levels:
            followers = {s.spec.name: LogFollower(s.spec.log, logscan.size(s.spec.log)) for s in servers}
            level = {name: partial(run_level, client, range(c), new_tokens) for name, client in clients.items()}
            runs = take_turns(level, warmup=warmup, repeats=repeats)
            time.sleep(self.opts.settle if any(name.startswith("dynspec") for name in names) else 0)
            for name in names:
                followers[name].poll()
                result = level_result(runs[name])
                out[name].append((result, followers[name].transitions))
                self.tell_level(name, result)
        return out

    # -- equivalence and crossings -----------------------------------------------------------

    def correctness(
        self, equivalence: bool, crossings: bool, exact_kv: bool = False, accept: bool = False, scrape: bool = False
    ) -> None:
        opts = self.opts
        assert self.sglang is not None
        applied = self.sglang.dynspec_applied
        shape = opts.shape_for("equivalence")
        # (mode, DYNSPEC_DRAFT_KV variant or None); the dynspec server with the caller's own setting first
        servers: list[tuple[str, str | None]] = [("dynspec", None)] if applied else []
        recorded = exact_kv or accept  # both read the drafts recorded under exact_kv's load
        if recorded:
            servers += [("dynspec", variant) for variant in DRAFT_KV_VARIANTS]
        if accept:
            servers.append(("dynspec", acceptance.NEVER_OFF))
        if equivalence:
            servers += [("always_on", None), ("base", None)]
        modes = [mode for mode, variant in servers if variant is None]
        runs: dict[str, list[tuple[LevelResult, list[Transition]]]] = {}
        eq_problems: list[str] = []
        kv_problems: list[str] = []
        recordings: dict[str, exactkv.Recording] = {}
        kv_digests: dict[str, list[str]] = {}
        kv_path: str | None = None
        acc_problems: list[str] = []
        traces: dict[str, acceptance.Trace] = {}
        cr: dict[str, Any] = {"passed": False, "count": 0, "off": 0, "on": 0, "errors": [], "problems": []}
        # Every server's plan first (and the files it will write removed), so that --parallel-starts
        # can start a group of them before the first is measured.
        planned: list[tuple[str, str | None, Plan]] = []
        for mode, variant in servers:
            never_off = variant == acceptance.NEVER_OFF
            name = NEVER_OFF_NAME if never_off else DRAFT_KV_VARIANTS[variant] if variant else SERVER_NAMES[mode]
            env: dict[str, str] = {}
            record = opts.out / f"drafts-{name}.jsonl"
            if recorded and mode == "dynspec":
                record.unlink(missing_ok=True)
                env[RECORD_ENV] = str(record)
                if not never_off:
                    env[DRAFT_KV_ENV] = variant or self.kv_mode(kv_problems if exact_kv else [])
                if variant == "full":
                    env[LEAN_VERIFY_ENV] = "0"
                checked = "reference" if variant == "full" else "tested" if variant is None and not never_off else None
                if opts.exact_kv_bits and exact_kv and checked == opts.exact_kv_bits_on:
                    # it writes directly first, then runs and keeps the full extend
                    (opts.out / KV_BITS_FILES[checked]).unlink(missing_ok=True)
                    env[DRAFT_KV_ENV] = KV_ONLY_MODE
                    env[KV_BITS_ENV] = str(opts.out / KV_BITS_FILES[checked])
            # above anything the load reaches, below --max-running-requests: speculation never turns off
            flags = launch.Dynspec(launch.MAX_RUNNING_REQUESTS - 1) if never_off else None
            extra = ("--enable-metrics",) if scrape and mode == "dynspec" and variant is None else ()
            planned.append((mode, variant, Plan(mode, shape, None, name, env, flags, extra)))
        with self.starting([plan for _, _, plan in planned]):
            for mode, variant, plan in planned:
                name, never_off = plan.name, variant == acceptance.NEVER_OFF
                record = opts.out / f"drafts-{name}.jsonl"
                try:
                    with self.serve(plan) as server:
                        if recorded and mode == "dynspec":
                            kv_digests[variant or "kv"] = self.exact_kv_load(server, name, kv_problems)
                        if variant:
                            continue
                        if equivalence:
                            runs[mode] = self.levels(server, opts.levels, opts.new_tokens, name, batched=True)
                            if mode == "base" and opts.model_dir is not None:
                                # the control of the comparison: real weights must give base's tokens twice
                                runs[BASE_REPEAT] = self.levels(
                                    server, opts.levels, opts.new_tokens, "base repeat", batched=True
                                )
                        if mode == "dynspec" and crossings:
                            before = metrics.parse(self.scrape(server)) if scrape else {}
                            self.crossings(server, cr)
                            if scrape:
                                after = metrics.parse(self.scrape(server))
                                self.report["metrics"] = metrics.judge(before, after, cr.get("count", 0))
                            if equivalence and self.flush_cache(server):
                                so_far = logscan.scan_file(server.spec.log, 0, logscan.size(server.spec.log))
                                self.ramp_final_state = so_far.transitions[-1].direction if so_far.transitions else "ON"
                                runs["dynspec_after_ramp"] = self.levels(
                                    server, opts.levels, opts.new_tokens, "after ramp", batched=True
                                )
                except ServerStartError as error:
                    self.aborted = f"the {name} server did not start"
                    first = str(error).splitlines()[0]
                    for problems in (eq_problems, cr["problems"], kv_problems, acc_problems):
                        problems.append(first)
                    self.progress(f"ERROR: {error}")
                    break
                finally:
                    info = self.server_info
                    errors = [f"{name}: {e}" for e in info.get("errors", [])]
                    if errors:
                        note = f"{info.get('error_count')} error line(s) in {name}.log: {errors[0]}"
                        (kv_problems if variant else eq_problems).append(note)
                        if mode == "dynspec" and not variant:
                            cr["errors"].extend(errors)
                            kv_problems.append(note)
                    if recorded and mode == "dynspec":
                        if not never_off:
                            recordings[variant or "kv"] = exactkv.read(record)
                        traces[variant or "kv"] = acceptance.read(record)
                        if not variant and exact_kv:
                            kv_path = self.check_kv_only_path(Path(info.get("log", "")), kv_problems)
        if equivalence:
            self.report["equivalence"] = self.judge_equivalence(
                runs, modes, opts.shape_named("equivalence"), eq_problems
            )
        if crossings:
            self.judge_crossings(cr)
            self.report["crossings"] = cr
        if scrape and "metrics" not in self.report:
            self.report["metrics"] = {"passed": False, "problems": [f"not run: {self.aborted or 'no ramp ran'}"]}
        if accept:
            real = opts.model_dir is not None
            differ = acceptance.outputs_differ(kv_digests, real)
            proposals: dict[str, Any] | None = None
            if real and {"kv", "full", "skip"} <= recordings.keys():
                proposals, differ = acceptance.proposals_apart(recordings)
            elif real:
                differ = f"no recording of {', '.join(sorted({'kv', 'full', 'skip'} - recordings.keys()))}: drafts not compared"
            if differ:
                acc_problems.append(differ)
            entry = acceptance.judge(traces, opts.acceptance_min_verifies, acc_problems)
            if proposals is not None:
                entry["proposals"] = proposals
            entry.update(load=opts.exact_kv_load.describe(), shape=opts.shape_named("acceptance"))
            entry["digests"] = dict(kv_digests)
            self.report["acceptance"] = entry
        if exact_kv:
            kv_digests.pop(acceptance.NEVER_OFF, None)
            bits_file = KV_BITS_FILES[opts.exact_kv_bits_on]
            bits = exactkv.read_bits(opts.out / bits_file) if opts.exact_kv_bits else None
            if opts.exact_kv_bits and bits is None:
                kv_problems.append(f"--exact-kv-bits: the {opts.exact_kv_bits_on} server wrote no {bits_file}")
            tested = self.kv_mode([])
            if opts.exact_kv_bits and tested != KV_ONLY_MODE:
                # the bits vouch for kv-direct's write; they cannot excuse another mode's mismatches
                kv_problems.append(
                    f"--exact-kv-bits checks {KV_ONLY_MODE}'s write, the server under test runs {tested}"
                )
                bits = None
            entry = exactkv.judge(recordings, kv_digests, opts.exact_kv_min_steps, kv_problems, bits)
            if entry["bits"] is not None:
                entry["bits"]["server"] = opts.exact_kv_bits_on
            # which KV-only extend was proven, as the server's start-up line says it ran it
            entry.update(
                load=opts.exact_kv_load.describe(),
                shape=opts.shape_named("exact_kv"),
                threshold=opts.threshold,
                kv_only_extend=kv_path,
            )
            self.report["exact_kv"] = entry

    def scrape(self, server: Server) -> str:
        """The server's ``/metrics`` text ("" when it answers otherwise)."""
        try:
            status, body = self.client(server).request("GET", "/metrics", timeout=30)
        except OSError:
            return ""
        return body.decode("utf-8", "replace") if status == 200 else ""

    def kv_mode(self, problems: list[str]) -> str:
        """The DYNSPEC_DRAFT_KV of the server exact_kv proves: the caller's, else ``KV_ONLY_MODE``."""
        mode = self.env.get(DRAFT_KV_ENV, "").strip().lower() or KV_ONLY_MODE
        if mode not in KV_ONLY_MODES:
            problems.append(
                f"exact_kv proves the KV-only draft extend: {DRAFT_KV_ENV} must be unset or one of "
                f"{', '.join(KV_ONLY_MODES)}, not {mode!r}"
            )
        return mode

    def exact_kv_load(self, server: Server, name: str, problems: list[str]) -> list[str]:
        """Send exact_kv's waves, one after the other, each group of a wave (its first requests, its
        joiners) in one call, so that every server prefills them alike; the digest of each wave's outputs."""
        client = self.client(server)
        digests = []
        for i, wave in enumerate(self.opts.exact_kv_load.waves()):
            result = run_batches(client, wave)
            digests.append(result.digest)
            problems += [f"{name} wave {i}: {f}" for f in result.failures[:3]]
        self.progress(f"  {name}: exact_kv load, {len(digests)} waves, digests {' '.join(digests)}")
        return digests

    def check_kv_only_path(self, log: Path, problems: list[str]) -> str | None:
        """exact_kv is about the KV-only draft extend: the dynspec server must have run it.
        Returns how the server said it runs it (e.g. "from a CUDA graph", "eagerly"), if it did."""
        try:
            text = log.read_text(errors="replace")
        except OSError:
            return None
        ready = [line for line in text.splitlines() if "dynspec:" in line and " ready in " in line]
        how = None
        if ready and KV_ONLY_WORDS not in ready[-1]:
            problems.append(f"the dynspec server did not run the KV-only draft extend: {ready[-1].strip()[-160:]}")
        elif ready:
            after = ready[-1].split(KV_ONLY_WORDS, 1)[1]
            how = after[after.find("(") + 1 : after.find(")")] if "(" in after else None
        gave_up = [
            line
            for line in text.splitlines()
            if any(f"{DRAFT_KV_ENV}={mode} cannot work here" in line for mode in KV_ONLY_MODES)
        ]
        if gave_up:
            problems.append(f"the dynspec server gave the KV-only draft extend up: {gave_up[0].strip()[-160:]}")
        return how

    def crossings(self, server: Server, cr: dict[str, Any]) -> None:
        opts = self.opts
        log = server.spec.log
        start = logscan.size(log)
        follower = LogFollower(log, start)
        schedule = RampSchedule(
            opts.ramp_low, opts.ramp_high, opts.ramp_new_tokens, opts.ramp_max_waves, opts.ramp_timeout
        )
        self.progress(
            f"ramp: waves of {opts.ramp_low} and {opts.ramp_high} requests until {opts.min_crossings} switches "
            f"(at most {opts.ramp_max_waves} waves, {opts.ramp_timeout:g} s)"
        )
        result = run_ramp(self.client(server), schedule, follower, opts.min_crossings, opts.settle, self.progress)
        scan = logscan.scan_file(log, start, logscan.size(log))
        cr.update(
            count=scan.count,
            off=scan.off,
            on=scan.on,
            waves=result.waves,
            requests=result.requests,
            ok_requests=result.ok,
            failed_requests=len(result.failures),
            seconds=round(result.seconds, 1),
            stop_reason=result.stop_reason,
            low=opts.ramp_low,
            high=opts.ramp_high,
            new_tokens=opts.ramp_new_tokens,
            target=opts.min_crossings,
            transitions_off_batch_sizes=sorted({t.batch_size for t in scan.transitions if t.direction == "OFF"}),
            transitions_on_batch_sizes=sorted({t.batch_size for t in scan.transitions if t.direction == "ON"}),
            # each switch against the thresholds its line says were in force (auto moves them)
            against_thresholds=[wrong for t in scan.transitions if (wrong := t.against_its_thresholds())][:MAX_LISTED],
            thresholds_logged=[
                list(pair)
                for pair in sorted(
                    {
                        (t.off_above, t.on_at_most)
                        for t in scan.transitions
                        if t.off_above is not None and t.on_at_most is not None
                    }
                )
            ],
        )
        cr["errors"].extend(result.failures[:MAX_LISTED])
        self.progress(
            f"ramp done: {scan.count} switches ({scan.off} OFF / {scan.on} ON) in {result.waves} waves, "
            f"{result.seconds:.0f} s, {len(result.failures)} failed requests ({result.stop_reason})"
        )

    def flush_cache(self, server: Server) -> bool:
        """Empty the radix cache, so the levels sent again after the ramp meet the same cache as the
        first time (a prompt whose prefix is cached is prefilled by other kernels, which may round
        differently and flip a greedy token in any server, dynspec or not)."""
        client = self.client(server)
        for _ in range(10):
            try:
                status, body = client.request("POST", "/flush_cache", timeout=30)
            except OSError as error:
                status, body = 0, repr(error).encode()
            if status == 200:
                return True
            time.sleep(self.opts.settle)  # the scheduler flushes only when idle
        self.report.setdefault("notes", []).append(
            f"/flush_cache answered {status} {body[:100]!r}: levels were not sent again after the ramp"
        )
        return False

    def judge_crossings(self, cr: dict[str, Any]) -> None:
        opts = self.opts
        # Never OFF at or below ``lowest_off``, never ON above ``highest_on``: a fixed threshold's
        # sizes, or with auto its floor and ceiling (its switch point moves between them).
        m, n = opts.surely_on_at_most, opts.surely_off_above
        lowest_off, highest_on = (m, n) if opts.auto else (n, m)
        problems: list[str] = cr["problems"]
        if "waves" in cr:
            if cr["count"] < opts.min_crossings:
                problems.append(f"only {cr['count']} switches logged, {opts.min_crossings} needed")
            if not cr["off"] or not cr["on"]:
                problems.append(f"switches one way only ({cr['off']} OFF, {cr['on']} ON)")
            wrong_off = [b for b in cr["transitions_off_batch_sizes"] if b <= lowest_off]
            wrong_on = [b for b in cr["transitions_on_batch_sizes"] if b > highest_on]
            if wrong_off:
                floor = "auto's floor" if opts.auto else "threshold"
                problems.append(f"switched OFF at batch size {wrong_off[0]} <= {floor} {lowest_off}")
            if wrong_on:
                problems.append(f"switched ON at batch size {wrong_on[0]} > {highest_on}")
            if cr.get("against_thresholds"):
                problems.append(
                    f"{len(cr['against_thresholds'])} switch(es) against the thresholds their own line names, "
                    f"first: {cr['against_thresholds'][0]}"
                )
            logged = [tuple(pair) for pair in cr.get("thresholds_logged", [])]
            if opts.auto:
                outside = [(off, on) for off, on in logged if not m <= on <= off <= n]
                if outside:
                    problems.append(
                        f"auto switched with thresholds {outside[0][0]} / {outside[0][1]}, outside its bounds {m} .. {n}"
                    )
            elif any(pair != (n, m) for pair in logged):
                other = next(pair for pair in logged if pair != (n, m))
                problems.append(f"switched with thresholds {other[0]} / {other[1]}, not the configured {n} / {m}")
        if cr["errors"]:
            problems.append(f"{len(cr['errors'])} error(s): {cr['errors'][0]}")
        cr["passed"] = not problems
        cr["detail"] = (
            f"{cr['count']} switches ({cr['off']} OFF, {cr['on']} ON) in {cr.get('waves', 0)} waves, "
            f"{cr.get('ok_requests', 0)}/{cr.get('requests', 0)} requests OK, no errors"
        )
        if opts.auto and cr.get("thresholds_logged"):  # where auto put its switch point during the ramp
            cr["detail"] += "; auto's thresholds (off above / on at or below): " + ", ".join(
                f"{off} / {on}" for off, on in cr["thresholds_logged"]
            )
        cr["errors"] = cr["errors"][:MAX_LISTED]

    def judge_equivalence(
        self,
        runs: dict[str, list[tuple[LevelResult, list[Transition]]]],
        modes: Sequence[str],
        shape: str,
        problems: list[str],
    ) -> dict[str, Any]:
        opts = self.opts
        real = opts.model_dir is not None
        n, m = opts.surely_off_above, opts.surely_on_at_most
        columns = [c for c in ("base", "always_on", "dynspec", "dynspec_after_ramp") if c in runs]
        mismatches: list[dict[str, Any]] = []
        modes_differ: list[dict[str, Any]] = []  # always-on's outputs other than base's
        failures: list[str] = []
        per_level: list[dict[str, Any]] = []
        state = {"dynspec": "ON", "dynspec_after_ramp": self.ramp_final_state}
        for i, c in enumerate(opts.levels):
            row: dict[str, Any] = {"C": c}
            ref = runs["base"][i][0].outputs if "base" in runs and i < len(runs["base"]) else None
            for col in columns:
                if i >= len(runs[col]):
                    continue
                result, transitions = runs[col][i]
                row[col] = result.digest
                failures += [f"{SERVER_NAMES.get(col, col)} C={c}: {f}" for f in result.failures]
                if col.startswith("dynspec"):
                    happened, state[col] = level_states(transitions, state[col])
                    row[f"{col}_state"] = happened
                    expect = "OFF" if c > n else "ON" if c <= m else None
                    if expect and state[col] != expect:
                        problems.append(
                            f"{col} C={c}: speculation was {state[col]} at the end of the level, expected {expect} "
                            f"({'auto, off above ' + str(n) + ' whatever it decides' if opts.auto else 'threshold ' + str(n)}); "
                            "this level did not test the switched path"
                        )
                if ref is not None and col != "base":
                    # On real weights SGLang's own two modes may round a near tie apart: there a dynspec
                    # output is held to the server of its mode. Dummy weights never showed it: base for all.
                    on = (
                        runs["always_on"][i][0].outputs
                        if real and col != "always_on" and i < len(runs.get("always_on", []))
                        else {}
                    )
                    mode = level_mode(transitions, c, row.get(f"{col}_state", ""), state.get(col, ""))
                    for prompt, tokens in result.outputs.items():
                        want = ref.get(prompt)
                        if want is None:
                            continue
                        if col == "always_on" and real:
                            if tokens != want:  # not dynspec's to answer for: reported
                                modes_differ.append(
                                    {"C": c, "prompt": prompt, "first_diff": first_difference(tokens, want)}
                                )
                            continue
                        allowed = references(want, on.get(prompt), mode)
                        if tokens not in [output for _, output in allowed]:
                            against, output = allowed[0]
                            mismatches.append(
                                {
                                    "C": c,
                                    "server": col,
                                    "prompt": prompt,
                                    "first_diff": first_difference(tokens, output),
                                    "against": against,
                                }
                            )
            row["identical"] = len({row[col] for col in columns if col in row}) == 1
            row["dynspec_state"] = " / ".join(row[k] for k in ("dynspec_state", "dynspec_after_ramp_state") if k in row)
            per_level.append(row)
        if "base" not in runs and "base" in modes:
            problems.append("no base outputs to compare with")
        repeat = unrepeated(opts.levels, runs.get("base", []), runs.get(BASE_REPEAT))
        if repeat:
            c, count = repeat[0]
            problems.insert(
                0,
                f"base gave other tokens on a second pass ({count} output(s) at C={c}, {sum(n for _, n in repeat)} in all): "
                f"its greedy outputs depend on the batch, so no server can be held to them "
                f"(deterministic inference {'on' if self.deterministic else 'off'})",
            )
        if mismatches:
            first = mismatches[0]
            problems.insert(
                0,
                f"{len(mismatches)} output(s) differ from {'base' if first.get('against', 'base') == 'base' else 'always-on'}, "
                f"first: {first['server']} C={first['C']} prompt {first['prompt']} at token {first['first_diff']}",
            )
        if failures:
            problems.append(f"{len(failures)} failed request(s): {failures[0]}")
        passed = not problems and bool(runs) and all(len(runs[c]) == len(opts.levels) for c in columns)
        compared = " = ".join(SERVER_NAMES.get(c, c.replace("_", " ")) for c in columns)
        detail = f"{len(opts.levels)} levels token-identical: {compared}"
        if modes_differ:
            detail = f"{len(opts.levels)} levels; always-on differs from base in {len(modes_differ)} output(s): dynspec judged by its mode there"
        return {
            "passed": passed,
            "levels": list(opts.levels),
            "new_tokens": opts.new_tokens,
            "shape": shape,
            "digests": {col: [row.get(col) for row in per_level] for col in columns},
            "per_level": per_level,
            "mismatches": mismatches[:MAX_LISTED],
            "mismatch_count": len(mismatches),
            "modes_differ": modes_differ[:MAX_LISTED],
            "modes_differ_count": len(modes_differ),
            **(
                {"base_repeat": [r.digest for r, _ in runs[BASE_REPEAT]], "base_repeatable": not repeat}
                if BASE_REPEAT in runs
                else {}
            ),
            "failures": failures[:MAX_LISTED],
            "problems": problems,
            "detail": detail,
        }

    # -- throughput ---------------------------------------------------------------------------

    def simulated(self, throughput: bool, mixed_load: bool) -> None:
        """The servers with simulated acceptance: the throughput levels, then the mixed load, on each."""
        opts = self.opts
        assert self.sglang is not None
        shape = opts.shape_for("throughput")
        modes = ["dynspec"] if self.sglang.dynspec_applied else []
        modes += ["always_on", "base"]
        adaptive_config = launch.adaptive_config(opts.surely_off_above)
        if opts.upstream_adaptive:
            modes.append(launch.UPSTREAM_ADAPTIVE)
            (opts.out / launch.ADAPTIVE_CONFIG_NAME).write_text(json.dumps(adaptive_config) + "\n")
        if opts.no_overlap_base:
            modes.append(launch.BASE_NO_OVERLAP)
        mixed_modes = [m for m in modes if m in ("dynspec", "always_on", "base", launch.BASE_NO_OVERLAP)]
        if not throughput:
            modes = mixed_modes
        # The servers a verdict compares come first; a plain-decode server only told about is measured
        # after them, so that with --parallel-starts 3 the compared three take turns (sequential runs
        # drift: session 37's v1 servers, one after another, differed by up to 8 % from run to run).
        told_only = informational_modes(opts, throughput, mixed_load)
        modes = [m for m in modes if m not in told_only] + [m for m in modes if m in told_only]
        tok_s: dict[str, list[float | None]] = {}
        accept: dict[str, list[float | None]] = {}
        samples: dict[str, list[list[float]]] = {}
        logs: dict[str, str] = {}  # each server's log text, read once it has stopped
        levels_end: dict[str, int] = {}  # where in it the throughput levels ended (the mixed load follows)
        problems: list[str] = []
        mixed_runs: dict[str, list[mixed.Run]] = {}
        mixed_problems: list[str] = []
        variant_runs: dict[str, list[mixed.Run]] = {}
        # Each variant right after the dynspec server it is compared with, on the mixed load only.
        servers: list[tuple[str, str | None]] = []
        for mode in modes:
            servers.append((mode, None))
            if mode == "dynspec" and mixed_load:
                servers += [(mode, variant) for variant, _ in opts.mixed_variants]
        variant_env = dict(opts.mixed_variants)
        plans = [
            Plan(
                mode,
                shape,
                opts.simulate_acc_len,
                (f"{SERVER_NAMES[mode]}-{variant}" if variant else SERVER_NAMES[mode])
                + ("-sim" if opts.simulate_acc_len else "-own"),
                dict(variant_env[variant]) if variant else {},
            )
            for mode, variant in servers
        ]
        # The check's servers up at once take turns at every level and pass: all of them, or the compared
        # ones when only those fit --parallel-starts (the rest are then measured one after another).
        compared = len([mode for mode, _ in servers if mode not in told_only])
        together = 0
        if opts.interleave and not opts.mixed_variants:  # a variant is measured right after its dynspec
            together = next((n for n in (len(plans), compared) if 1 < n <= opts.parallel_starts), 0)
        order = measuring_order([p.name for p in plans], together)

        def note_errors(name: str, info: dict[str, Any]) -> None:
            note = error_note(name, info)
            if note:
                problems.append(note)
                mixed_problems.append(note)

        def account(
            mode: str, name: str, info: dict[str, Any], results: list[tuple[LevelResult, list[Transition]]]
        ) -> None:
            """What a stopped server left: its log and, with throughput, its levels' numbers."""
            logs[mode] = Path(info["log"]).read_text(errors="replace")
            if not throughput:
                return
            if mode == launch.UPSTREAM_ADAPTIVE:
                off = [line for line in logs[mode].splitlines() if ADAPTIVE_OFF in line]
                if off:
                    problems.append(f"{name}: SGLang turned its adaptive mode off: {off[0].strip()[:200]}")
            tok_s[mode] = [round(r.tok_s, 1) if not r.failures else None for r, _ in results]
            samples[mode] = [list(r.samples) for r, _ in results]
            accept[mode] = [None if r.accept_length is None else round(r.accept_length, 2) for r, _ in results]
            for r, _ in results:
                if r.failures:
                    problems.append(f"{name} C={r.concurrency}: {len(r.failures)} failed request(s): {r.failures[0]}")

        def start_failed(name: str, error: ServerStartError) -> None:
            self.aborted = f"the {name} server did not start"
            problems.append(str(error).splitlines()[0])
            mixed_problems.append(str(error).splitlines()[0])
            self.progress(f"ERROR: {error}")

        served_ok = True
        with self.starting(plans):
            if together:
                served: list[tuple[str, Plan, dict[str, Any]]] = []
                level_runs: dict[str, list[tuple[LevelResult, list[Transition]]]] = {}
                passes: dict[str, list[mixed.Run]] = {}
                try:
                    with contextlib.ExitStack() as stack:
                        up: list[Server] = []
                        for (mode, _), plan in zip(servers[:together], plans[:together]):
                            try:
                                up.append(stack.enter_context(self.serve(plan)))
                            finally:
                                served.append((mode, plan, self.server_info))
                        if throughput:
                            level_runs = self.levels_together(
                                up, opts.throughput_levels, opts.throughput_new_tokens,
                                warmup=opts.throughput_warmup, repeats=opts.throughput_repeats,
                            )  # fmt: skip
                            for mode, _, info in served:
                                levels_end[mode] = len(Path(info["log"]).read_text(errors="replace"))
                        if mixed_load:
                            clients = {
                                s.spec.name: self.client(s)
                                for (mode, _, _), s in zip(served, up)
                                if mode in mixed_modes
                            }
                            starts = {s.spec.name: logscan.size(s.spec.log) for s in up}
                            passes = mixed.measure_together(
                                clients, opts.mixed_schedule, opts.mixed_repeats, warmup=not throughput
                            )
                            for (_, plan, info), s in zip(served, up):
                                if plan.name in passes:
                                    self.tell_mixed(plan.name, passes[plan.name])
                                    info[reports.MIXED_CACHED] = cached_since(s.spec.log, starts[plan.name])
                except ServerStartError as error:
                    start_failed(served[-1][1].name, error)  # the plan whose serve raised
                    served_ok = False
                for mode, plan, info in served:
                    note_errors(plan.name, info)
                    if served_ok:
                        account(mode, plan.name, info, level_runs.get(plan.name, []))
                        if plan.name in passes:
                            mixed_runs[mode] = passes[plan.name]
            if served_ok:
                for (mode, variant), plan in zip(servers[together:], plans[together:]):
                    name = plan.name
                    results: list[tuple[LevelResult, list[Transition]]] = []
                    try:
                        with self.serve(plan) as server:
                            if variant:
                                variant_runs[variant] = self.mixed_load(server, name, warmup=True)
                                continue
                            if throughput:
                                results = self.levels(
                                    server,
                                    opts.throughput_levels,
                                    opts.throughput_new_tokens,
                                    name,
                                    warmup=opts.throughput_warmup,
                                    repeats=opts.throughput_repeats,
                                )
                                levels_end[mode] = len(Path(self.server_info["log"]).read_text(errors="replace"))
                            if mixed_load and mode in mixed_modes:
                                mixed_runs[mode] = self.mixed_load(server, name, warmup=not throughput)
                    except ServerStartError as error:
                        start_failed(name, error)
                        break
                    finally:
                        note_errors(name, self.server_info)
                    account(mode, name, self.server_info, results)
        if mixed_load:
            self.report["mixed_load"] = self.judge_mixed(mixed_runs, mixed_problems, shape, variant_runs)
            self.report["mixed_load"]["order"] = order
        if not throughput:
            return
        levels = list(opts.throughput_levels)
        none = [None] * len(levels)
        tp: dict[str, Any] = {
            "levels": levels,
            "base": tok_s.get("base", none),
            "always_on": tok_s.get("always_on", none),
            "dynspec": tok_s.get("dynspec") if self.sglang.dynspec_applied else None,
            "envelope_ratio": None,
            "accept_length": accept,
            "samples": samples,
            "warmup": opts.throughput_warmup,
            "repeats": opts.throughput_repeats,
            "new_tokens": opts.throughput_new_tokens,
            "shape": opts.shape_named("throughput"),
            "simulate_acc_len": opts.simulate_acc_len,
            "min_envelope_ratio": opts.min_envelope_ratio,
            "order": order,
        }
        run_problems = list(problems)
        if opts.no_overlap_base:
            # What a server on v1's scheduler reaches: v1 is judged against it (below), v2 only told.
            tp[launch.BASE_NO_OVERLAP] = tok_s.get(launch.BASE_NO_OVERLAP, none)
            tp["envelope_ratio_no_overlap"] = (
                reports.envelope_ratio(tp[launch.BASE_NO_OVERLAP], tp["always_on"], tp["dynspec"] or none)
                if self.sglang.dynspec_applied
                else None
            )
            tp["per_step_no_overlap"] = steps.per_step(
                {m: logs[m] for m in ("dynspec", launch.BASE_NO_OVERLAP) if m in logs}, launch.BASE_NO_OVERLAP, levels
            )
        v1_on_its_scheduler = opts.path == "v1" and opts.no_overlap_base
        tp["judged_against"] = launch.BASE_NO_OVERLAP if v1_on_its_scheduler else "base"
        if self.sglang.dynspec_applied:
            ratio = reports.envelope_ratio(tp["base"], tp["always_on"], tp["dynspec"] or none)
            tp["envelope_ratio"] = ratio
            if v1_on_its_scheduler:
                ratio = tp["envelope_ratio_no_overlap"]
            against = " against max(non-overlap base, always-on)" if v1_on_its_scheduler else ""
            low = [(c, r) for c, r in zip(levels, ratio) if r is None or r < opts.min_envelope_ratio]
            if low and not problems:
                at, worst = low[0]
                problems.append(f"R(C){against} below {opts.min_envelope_ratio:g} at C={at}: {worst}")
            reach = (
                f"below {opts.min_envelope_ratio:g} at {len(low)} of"
                if low
                else f">= {opts.min_envelope_ratio:g} at all"
            )
            tp["detail"] = f"R(C){against} {reach} {len(levels)} levels" + (
                f" (min {min(x for x in ratio if x is not None):.2f})" if any(x is not None for x in ratio) else ""
            )
        else:
            tp["detail"] = f"base and always-on measured at {len(levels)} levels (dynspec not applied)"
        if opts.upstream_adaptive:
            self.judge_upstream(tp, adaptive_config, tok_s.get(launch.UPSTREAM_ADAPTIVE, none), run_problems, problems)
        # Information, not pass criteria: where N belongs on this GPU, and the servers' own speed per
        # decode step against base.
        tp["switch_point"] = reports.switch_point(levels, tp["base"], tp["always_on"])
        tp["per_step"] = steps.per_step(logs, "base", levels)
        # dynspec's speculating steps against always-on's: what dynspec costs where it leaves speculation on
        tp["per_step_speculating"] = steps.per_step(
            {m: logs[m] for m in ("dynspec", "always_on") if m in logs}, "always_on", levels, speculating=True
        )
        tp["per_run"] = steps.per_run({m: logs[m][:end] for m, end in levels_end.items() if m in logs}, levels)
        tp["outside_steady_ms"] = steps.outside_steady(
            tp["per_run"], tp.get("samples") or {}, levels, tp["new_tokens"], warmup=tp["warmup"]
        )
        tp["problems"] = problems
        tp["passed"] = not problems and len(tok_s) == len(modes)
        self.report["throughput"] = tp

    def refusals(self) -> None:
        """Each combination dynspec refuses, on a server of its own: it must exit before answering,
        with a line naming what it refuses, and without a Python traceback. The servers start
        together (each exits at ``ServerArgs.check_server_args``, before loading weights)."""
        opts = self.opts
        assert self.sglang is not None
        cases = refusal_cases(self.sglang, opts.path)
        self.progress(f"refusals: {len(cases)} servers that must refuse to start: {', '.join(c.name for c in cases)}")
        started: list[tuple[Refusal, Server, dict[str, Any]]] = []
        rows: list[dict[str, Any]] = []
        for case in cases:
            plan = Plan("dynspec", "small", None, f"refusal-{case.name}", dynspec=case.dynspec, extra=case.args)
            try:
                server, info = self._launch(plan, launch.SHARED_GPU_MAX_TOTAL_TOKENS)  # small: never sized
            except ServerStartError as error:
                rows.append(case.judge(None, "", 0.0) | {"problems": [f"could not launch: {error}"]})
                continue
            started.append((case, server, info))
        try:
            for case, server, _ in started:
                assert server.popen is not None
                # a refusal exits before answering (raised here); one that comes up or hangs fails below
                with contextlib.suppress(ServerStartError):
                    server.wait_ready(opts.refusal_timeout, opts.poll_interval, opts.progress_every)
                code = server.popen.poll()
                seconds = time.monotonic() - (server.started_at or time.monotonic())
                rows.append(case.judge(code, logscan.read_window(server.spec.log)[0], seconds))
        finally:  # every one stopped, also when the wait is cut short
            for _, server, info in started:
                self._finish(server, info)
        problems = [f"{row['name']}: {p}" for row in rows for p in row["problems"]]
        self.report["refusals"] = {
            "passed": bool(rows) and not problems,
            "cases": rows,
            "problems": problems,
            "detail": f"{sum(not r['problems'] for r in rows)} of {len(rows)} combinations refused at start-up "
            "with one line naming them, no traceback",
        }
        self._save()

    def serve_in_turn(self, plans: Sequence[Plan], measure: Callable[[Plan, Server], None]) -> list[str]:
        """Serve ``plans`` one after another (started as ``--parallel-starts`` allows) and ``measure``
        each alone. Returns the problems: a server that did not start (those after it are not served),
        and each served one's error lines."""
        return self.serve_in_groups(plans, lambda group: measure(*group[0]), together=False)

    def serve_in_groups(
        self, plans: Sequence[Plan], measure: Callable[[list[tuple[Plan, Server]]], None], *, together: bool
    ) -> list[str]:
        """Serve ``plans`` in their order and ``measure`` them a group at a time: with ``together``, the
        servers ``--parallel-starts`` started at once (``_group``), all up while measured; else each
        alone. Returns the problems, as ``serve_in_turn``'s: a server that did not start is named, the
        rest of its group is still measured, and no later group is served."""
        problems: list[str] = []
        with self.starting(plans):
            rest = list(plans)
            while rest:
                group: list[tuple[Plan, Server]] = []
                infos: dict[str, dict[str, Any]] = {}
                failed = False  # a server of the group did not start: measure the others, serve no later group
                with contextlib.ExitStack() as stack:
                    try:
                        for plan in rest:
                            if infos and not (together and self._started_with(plan)):
                                break
                            try:
                                group.append((plan, stack.enter_context(self.serve(plan))))
                            except ServerStartError as error:
                                problems.append(str(error).splitlines()[0])
                                self.progress(f"ERROR: {error}")
                                failed = True
                            finally:
                                infos[plan.name] = self.server_info
                        if group:
                            measure(group)
                    finally:
                        for _, server in group:
                            server.begin_stop()  # all of them now, however this ends; the stack waits for each
                for name, info in infos.items():
                    note = error_note(name, info)
                    if note:
                        problems.append(note)
                rest = [] if failed else rest[len(infos) :]
        return problems

    def _started_with(self, plan: Plan) -> bool:
        """Whether ``plan`` was started with the group being served (launched, or failed to)."""
        return plan.name in self._started or plan.name in self._start_errors

    def features(self, checks: Sequence[str]) -> None:
        """Sampling, logprobs, penalties and grammar (``features``) on base, always-on and dynspec,
        with the same requests in a phase where dynspec speculates and one where it is off."""
        opts = self.opts
        shape = opts.shape_for("equivalence")
        sizes = opts.feature_sizes
        plain = plain_reference(opts.path)
        # with grammar, all load the model's tokenizer (the other checks' requests are served alike)
        plans = [
            Plan(mode, shape, None, f"{SERVER_NAMES[mode]}-features", tokenizer="grammar" in checks)
            for mode in (plain, "always_on", "dynspec")
        ]
        got: dict[str, dict[str, dict[str, list[Reply]]]] = {c: {p: {} for p in features.PHASES} for c in checks}
        # by check, what went wrong while serving: dynspec not in its phase's mode, a ballast reply failed
        modes: dict[str, list[str]] = {c: [] for c in checks}
        problems = self.serve_in_turn(
            plans,
            lambda plan, server: self.feature_loads(
                server, "base" if plan.mode == plain else plan.mode, checks, sizes, got, modes
            ),
        )
        judges = {
            "sampling": features.judge_sampling,
            "logprobs": features.judge_logprobs,
            "penalties": features.judge_penalties,
            "grammar": features.judge_grammar,
        }
        for check in checks:
            entry = judges[check](got[check], sizes)
            entry["problems"] = problems + modes[check] + entry["problems"]
            entry.update(passed=not entry["problems"], shape=opts.shape_named("equivalence"), base_mode=plain)
            self.report[check] = entry
        self._save()

    def feature_loads(
        self,
        server: Server,
        mode: str,
        checks: Sequence[str],
        sizes: Mapping[str, int],
        got: dict[str, dict[str, dict[str, list[Reply]]]],
        modes: dict[str, list[str]],
    ) -> None:
        """One server's requests of every feature check, phase by phase (dynspec speculating first),
        in waves of the phase's batch size, each sent as one call: a wave is admitted together, so a
        wave above the threshold switches dynspec off at its first decode and none decodes at or
        below it (a closed loop's tail would switch it back on). The switches dynspec logs during a
        load say whether it was in the phase's mode throughout (``modes``)."""
        client = self.client(server)
        per_prompt = self.opts.sampling_per_prompt
        roles = [mode, "control"] if mode == "base" else [mode]
        state = "ON"  # a dynspec server starts speculating
        for phase in features.PHASES:
            size = sizes[phase]
            ballast = features.grammar_ballast(phase, size)
            # check, role, requests, and how many of them are ballast: the last, sent in the same wave, not judged
            loads: list[tuple[str, str, list[Request], int]] = []
            for role in roles:
                if "sampling" in checks:
                    loads.append(("sampling", role, features.sampling_requests(role, per_prompt), 0))
                    if role == "dynspec" and phase == "off":
                        with_base_seeds = features.sampling_requests(role, per_prompt, seeds_of="base")
                        loads.append(("sampling", features.SAME_SEEDS, with_base_seeds, 0))
                if "logprobs" in checks and role != "control":
                    loads.append(("logprobs", role, features.greedy_requests(size, logprobs=True), 0))
                if "penalties" in checks:
                    loads.append(("penalties", role, features.greedy_requests(size, penalties=role != "control"), 0))
                if "grammar" in checks:
                    grammar = features.grammar_requests(size, constrained=role != "control", ballast=ballast)
                    loads.append(("grammar", role, grammar, ballast))
            for check, role, requests, extra in loads:
                follower = LogFollower(server.spec.log, logscan.size(server.spec.log))
                result = run_waves(client, requests, size + extra)
                judged = len(requests) - extra
                got[check][phase][role] = result.replies[:judged]
                # a ballast reply cut short or failed would undo what it is there for
                modes[check] += features.failures(result.replies[judged:], f"{phase} {role} ballast")
                self.progress(
                    f"  {server.spec.name} {check} {role} {phase} (batch {size + extra}): {result.seconds:.1f} s"
                )
                time.sleep(self.opts.settle if mode == "dynspec" else 0)
                follower.poll()
                if mode == "dynspec":
                    switches = [t.direction for t in follower.transitions]
                    wrong = features.out_of_mode(phase, state, switches)
                    if wrong:
                        modes[check].append(f"{phase}: {wrong}")
                    state = switches[-1] if switches else state

    def auto_threshold(self) -> None:
        """``auto`` against fixed thresholds on the mixed load, at each simulated acceptance (on real
        weights, at the model's own, labelled ``real``): per acceptance always-on, dynspec with
        ``auto`` and one dynspec server per fixed N; base once. A warm-up pass, then ``mixed_repeats``
        on each server; the servers ``--parallel-starts`` starts at once take turns at every pass
        (``--one-after-another``: each measured alone). Auto and the fixed N come first, so that they
        share a group: one after another, the later servers of a call ran slower (session 50: N = 32's
        passes 7.35, 8.72, 11.61 s after N = 8's and 16's)."""
        opts = self.opts
        shape = opts.shape_for("mixed_load")
        acceptances: list[float | None] = [None] if opts.model_dir is not None else list(opts.auto_acceptances)
        labels = [REAL_ACCEPTANCE if a is None else f"{a:g}" for a in acceptances]
        plans: list[tuple[str, Plan]] = []
        for a, label in zip(acceptances, labels):
            suffix = label if a is None else f"acc{label}"
            auto = launch.Dynspec(launch.AUTO, opts.enable_threshold, opts.switch_min_steps)
            plans.append((f"auto@{label}", Plan("dynspec", shape, a, f"dynspec-auto-{suffix}", dynspec=auto)))
            for n in opts.auto_sweep:
                fixed = launch.Dynspec(n, None, opts.switch_min_steps)
                plans.append((f"{n}@{label}", Plan("dynspec", shape, a, f"dynspec-n{n}-{suffix}", dynspec=fixed)))
            plans.append((f"always_on@{label}", Plan("always_on", shape, a, f"always-on-{suffix}")))
        plans.append(("base", Plan("base", shape, acceptances[0], "base-auto")))
        runs: dict[str, list[mixed.Run]] = {}
        decisions: dict[str, list[logscan.AutoDecision]] = {}
        refills: dict[str, dict[str, dict[str, float]]] = {}
        fallback: dict[str, dict[str, float]] = {}
        keys = {plan.name: key for key, plan in plans}
        groups: list[list[str]] = []

        def judged(problems: list[str]) -> dict[str, Any]:
            entry = mixed.judge_auto(
                runs, opts.mixed_schedule, labels, opts.auto_sweep, opts.max_auto_ratio, decisions, refills, fallback
            )
            entry["problems"] = problems + entry["problems"]
            entry["passed"] = not entry["problems"]
            entry.update(shape=opts.shape_named("mixed_load"), repeats=opts.mixed_repeats, order=groups_order(groups))
            return entry

        def measure(group: list[tuple[Plan, Server]]) -> None:
            starts = {plan.name: logscan.size(server.spec.log) for plan, server in group}
            clients = {plan.name: self.client(server) for plan, server in group}
            groups.append(list(clients))
            passes = mixed.measure_together(clients, opts.mixed_schedule, opts.mixed_repeats, warmup=True)
            for plan, server in group:
                key = keys[plan.name]
                runs[key] = passes[plan.name]
                self.tell_mixed(plan.name, runs[key])
                self._serving[plan.name][reports.MIXED_CACHED] = cached_since(server.spec.log, starts[plan.name])
                window = logscan.read_window(server.spec.log, starts[plan.name])[0]
                refills[key] = steps.refills(window, opts.mixed_schedule.phases)
                fallback[key] = steps.fallback_steps(window, opts.mixed_schedule.phases)
                mode, _, label = key.partition("@")
                if mode == "auto":
                    decisions[label] = logscan.auto_decisions(logscan.read_window(server.spec.log)[0])
            # on disk before the group stops: a call's limit that kills the run (not SIGTERM) while
            # nine servers stop keeps what they measured (session 51 lost a report so)
            self.report["auto_threshold"] = judged([mixed.INTERRUPTED.format(len(runs), len(plans))])
            self._save()

        problems: list[str] | None = None
        together = opts.interleave and opts.parallel_starts > 1
        try:
            problems = self.serve_in_groups([plan for _, plan in plans], measure, together=together)
        finally:
            # A sweep is most of a device call: stopped by the call's time limit (SIGTERM, as
            # SystemExit) or Ctrl-C, it is judged on the servers it measured, which run() saves.
            if problems is None:
                problems = [mixed.INTERRUPTED.format(len(runs), len(plans))]
            self.report["auto_threshold"] = judged(problems)

    def mixed_load(self, server: Server, name: str, *, warmup: bool) -> list[mixed.Run]:
        opts = self.opts
        schedule = opts.mixed_schedule
        start = logscan.size(server.spec.log)
        runs = mixed.measure(self.client(server), schedule, opts.mixed_repeats, warmup)
        self.tell_mixed(name, runs)
        self.server_info[reports.MIXED_CACHED] = cached_since(server.spec.log, start)
        return runs

    def tell_mixed(self, name: str, runs: Sequence[mixed.Run]) -> None:
        for run in runs:
            failed = f", {len(run.failures)} FAILED" if run.failures else ""
            phases = " ".join(f"{p.seconds:.2f}" for p in run.phases)
            self.progress(f"  {name} mixed load: {run.seconds:.2f} s (phases {phases}){failed}")

    def judge_mixed(
        self,
        runs: dict[str, list[mixed.Run]],
        problems: list[str],
        shape: str,
        variant_runs: Mapping[str, list[mixed.Run]] | None = None,
    ) -> dict[str, Any]:
        opts = self.opts
        main = {m: r for m, r in runs.items() if m != launch.BASE_NO_OVERLAP}
        entry = mixed.judge(opts.mixed_schedule, main, opts.max_mixed_ratio, problems)
        entry.update(
            shape=opts.shape_named("mixed_load"), simulate_acc_len=opts.simulate_acc_len, repeats=opts.mixed_repeats
        )
        if launch.BASE_NO_OVERLAP in runs:
            # Information: a v1 server against plain decode on its own (non-overlap) scheduler.
            other = {**main, "base": runs[launch.BASE_NO_OVERLAP]}
            no_overlap = mixed.judge(opts.mixed_schedule, other, opts.max_mixed_ratio, [])
            entry["no_overlap"] = {
                k: no_overlap[k] for k in ("seconds", "oracle_seconds", "dynspec_over_oracle", "passed")
            }
        if variant_runs:
            # Information, not the verdict: each variant judged as dynspec would be, against the same
            # static servers, and its total against dynspec's own.
            entry["variants"] = {}
            dyn = entry["seconds"]["dynspec"]
            for variant, env in opts.mixed_variants:
                judged = mixed.judge(
                    opts.mixed_schedule, {**main, "dynspec": variant_runs.get(variant, [])}, opts.max_mixed_ratio, []
                )
                total = judged["seconds"]["dynspec"]
                entry["variants"][variant] = {
                    "env": dict(env),
                    "seconds": total,
                    "samples": judged["samples"].get("dynspec", []),
                    "phases_s": [row.get("dynspec_s") for row in judged["phases"]],
                    "dynspec_over_oracle": judged["dynspec_over_oracle"],
                    "over_dynspec": round(total / dyn, 4) if total is not None and dyn else None,
                    "passed": judged["passed"],
                    "problems": judged["problems"],
                }
        return entry

    def judge_upstream(
        self,
        tp: dict[str, Any],
        config: dict[str, Any],
        upstream: Sequence[float | None],
        run_problems: list[str],
        problems: list[str],
    ) -> None:
        """dynspec / upstream adaptive at each level; at levels above the threshold it must reach
        ``min_upstream_ratio``."""
        opts = self.opts
        assert self.sglang is not None
        tp["upstream_adaptive"] = list(upstream)
        tp["upstream_adaptive_config"] = config
        tp["min_upstream_ratio"] = opts.min_upstream_ratio
        if not self.sglang.dynspec_applied:
            tp["dynspec_over_upstream"] = None
            tp["upstream_failed_levels"] = []
            return
        ratios = reports.over(tp["dynspec"] or [None] * len(upstream), upstream)
        tp["dynspec_over_upstream"] = ratios
        checked = [(c, r) for c, r in zip(tp["levels"], ratios) if c > opts.surely_off_above]
        failed = [(c, r) for c, r in checked if r is None or r < opts.min_upstream_ratio]
        tp["upstream_failed_levels"] = [c for c, _ in failed]
        if failed and not run_problems:
            at = ", ".join(f"C={c} ({'-' if r is None else f'{r:.2f}'})" for c, r in failed)
            problems.append(f"dynspec / upstream adaptive below {opts.min_upstream_ratio:g} at {at}")
        tp["detail"] += f"; dynspec >= {opts.min_upstream_ratio:g}x upstream adaptive at C > {opts.surely_off_above}"


def cached_since(log: Path, start: int) -> int:
    """The prompt tokens a server's prefills found cached since byte ``start`` of its log."""
    return logscan.cached_prompt_tokens(logscan.read_window(log, start)[0])


class RealModel(NamedTuple):
    name: str
    prompts: list[list[int]]  # tokenized
    sha256: dict[str, str | None]  # the weights' digests, ``gguf`` and ``head`` (None: not taken)
    paths: dict[str, str] | None  # ``dynspec real own``'s: the ``target`` and ``head`` its links point to


def load_real(model_dir: Path) -> RealModel:
    """What a ``dynspec real prepare`` or ``dynspec real own`` dir serves; raises ProofUsageError."""
    try:
        info = json.loads((model_dir / launch.REAL_INFO).read_text())
        prompts = json.loads((model_dir / launch.REAL_PROMPTS).read_text())["prompts"]
        ids = [[int(t) for t in p["input_ids"]] for p in prompts]
        name = str(info["name"])
        digests = {part: info.get(f"{part}_sha256") for part in ("gguf", "head")}
        paths = {part: str(info[part]) for part in ("target", "head")} if info.get("own") is True else None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ProofUsageError(
            f"--model-dir {model_dir}: not made by `dynspec real prepare` or `real own` ({error})"
        ) from error
    missing = [str(d) for d in launch.real_dirs(model_dir) if not (d / "config.json").is_file()]
    if missing or not ids or not all(ids):
        raise ProofUsageError(
            f"--model-dir {model_dir}: no config.json in {', '.join(missing)}"
            if missing
            else f"--model-dir {model_dir}: no prompts"
        )
    return RealModel(name, ids, digests, paths)


def run_proof(opts: ProofOptions, progress: Progress = stderr_progress) -> dict[str, Any]:
    """Run the proof; return the report (also written to ``opts.out``). Raises ProofUsageError."""
    return Proof(opts, progress).run()


def default_out(now: Callable[[], datetime] = datetime.now) -> Path:
    return Path(f"dynspec-proof-{now().strftime('%Y%m%d-%H%M%S')}")
