"""``dynspec proof``: the click command. The only module of ``patcher.proof`` that imports click.

Register it with ``main.add_command(proof)``; ``python -m patcher.proof`` runs it on its own.
"""

from __future__ import annotations

import re
import shlex
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import click
from click.core import ParameterSource

from patcher.options import choice_option
from patcher.proof import combine, plot, report
from patcher.proof.errors import ProofUsageError
from patcher.proof.launch import ATTENTION_BACKENDS, AUTO, MAX_RUNNING_REQUESTS
from patcher.proof.run import ProofOptions, default_out, run_proof

DEFAULTS = ProofOptions(out=Path("."))


class IntList(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click; the GPU's may be older
    """A comma-separated list of positive integers, e.g. ``1,4,16,48``."""

    name = "LIST"

    def __init__(self, length: int | None = None) -> None:
        self.length = length

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        try:
            items = tuple(int(x) for x in str(value).split(",") if x.strip())
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of integers", param, ctx)
        if not items or any(x < 1 for x in items):
            self.fail(f"{value!r}: give positive integers", param, ctx)
        if self.length is not None and len(items) != self.length:
            self.fail(f"{value!r}: give exactly {self.length} integers", param, ctx)
        return items


class Threshold(click.ParamType):  # type: ignore[type-arg]
    """``--speculative-disable-batch-size``'s value: a positive integer, or ``auto``."""

    name = "N|auto"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        if isinstance(value, int) or value == AUTO:
            return value
        try:
            number = int(str(value))
        except ValueError:
            self.fail(f"{value!r} is neither a positive integer nor {AUTO}", param, ctx)
        if number < 1:
            self.fail(f"{value!r}: give a positive integer, or {AUTO}", param, ctx)
        return number


# With --threshold auto and nothing else said: levels and a ramp that reach past auto's ceiling
AUTO_LEVELS = (1, 4, 16, 48, MAX_RUNNING_REQUESTS)
AUTO_RAMP = (1, MAX_RUNNING_REQUESTS)


class EnvVariant(click.ParamType):  # type: ignore[type-arg]
    """``NAME:ENV=VALUE[+ENV=VALUE...]``, e.g. ``prefill-kv:DYNSPEC_PREFILL_KV=1``."""

    name = "NAME:ENV=V[+ENV=V]"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, tuple[tuple[str, str], ...]]:
        if isinstance(value, tuple):
            return value
        name, sep, assignments = str(value).partition(":")
        if not sep or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
            self.fail(f"{value!r}: start with a name of lower-case letters, digits and '-', then ':'", param, ctx)
        env = []
        for item in assignments.split("+"):
            key, eq, val = item.partition("=")
            if not eq or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", key):
                self.fail(f"{value!r}: {item!r} is not ENV=VALUE", param, ctx)
            env.append((key, val))
        return name, tuple(env)


class AcceptanceLength(click.ParamType):  # type: ignore[type-arg]
    """A simulated acceptance length (a number >= 1), or ``off``: the drafts' own acceptance."""

    name = "LENGTH|off"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float | None:
        if value is None or isinstance(value, float):
            return value
        if str(value).strip().lower() == "off":
            return None
        try:
            length = float(str(value))
        except ValueError:
            self.fail(f"{value!r} is neither a number nor off", param, ctx)
        if not length >= 1:
            self.fail(f"{value!r}: an acceptance length is at least 1 (the verified token)", param, ctx)
        return length


def _command_line(ctx: click.Context) -> str:
    """The invocation as typed, normalised: command path plus the options given on the command line."""
    words = []
    for param in ctx.command.params:
        name = param.name
        if not name or ctx.get_parameter_source(name) != ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[name]
        words.append(param.opts[0])
        if isinstance(param, click.Option) and param.is_flag:
            continue
        words.append(",".join(map(str, value)) if isinstance(value, tuple) else str(value))
    return f"{ctx.command_path} {shlex.join(words)}".strip()


def _progress(message: str) -> None:
    click.echo(f"[proof] {message}", err=True)


@contextmanager
def _stop_servers_on_sigterm() -> Iterator[None]:
    """Turn the first SIGTERM/SIGHUP into SystemExit, so ``finally`` blocks stop the servers."""
    fired = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if not fired:
            fired = True
            raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _plot_only(report_path: Path, out: Path | None) -> None:
    try:
        data = report.load(report_path)
    except (OSError, ValueError) as error:
        raise click.UsageError(f"--plot {report_path}: {error}") from error
    png = (out or report_path.parent) / report.PLOT_NAME
    why = plot.render(data, png)
    if why:
        click.echo(f"no plot: {why}", err=True)
        sys.exit(1)
    click.echo(str(png))


def _combine_only(paths: tuple[Path, ...], sweep: tuple[int, ...], out: Path | None) -> int:
    resolved = [p.resolve() for p in paths]
    twice = next((p for i, p in enumerate(paths) if resolved[i] in resolved[:i]), None)
    if twice is not None:
        raise click.UsageError(f"--combine: {twice} is given twice")
    if out is not None and (out / report.REPORT_NAME).resolve() in resolved:
        raise click.UsageError(f"--combine: --out {out} would overwrite a part's own {report.REPORT_NAME}")
    try:
        joined = combine.combine([(str(p), report.load(p)) for p in paths], sweep, DEFAULTS.max_auto_ratio)
    except (OSError, ValueError) as error:  # CombineError is a ValueError, as a report that is not JSON
        raise click.UsageError(f"--combine: {error}") from error
    text = report.summary(joined)
    if out is not None:
        report.write(joined, out)
        (out / report.SUMMARY_NAME).write_text(text)
    click.echo(text, nl=False)
    return report.exit_code(joined)


@click.command("proof", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--sglang",
    default="auto",
    show_default=True,
    help="SGLang under test: 'auto' (what --python imports) or a path to it (package, site dir or checkout), put first on the servers' PYTHONPATH.",
)
@click.option(
    "--python", "python", default=sys.executable, show_default=True, help="Interpreter that runs the servers."
)
@choice_option(
    "--path",
    "spec_path",
    choices=["v1", "v2"],
    default="v2",
    help="EAGLE worker: v1 adds --disable-overlap-schedule.",
)
@click.option(
    "--threshold",
    type=Threshold(),
    default=DEFAULTS.threshold,
    show_default=True,
    help="--speculative-disable-batch-size: speculation off above this batch size; auto (0.5.14+, v2; "
    f"equivalence, crossings, throughput and mixed_load): the server finds its own, and --levels and --ramp "
    f"default to {','.join(map(str, AUTO_LEVELS))} and {','.join(map(str, AUTO_RAMP))}, past its ceiling.",
)
@click.option(
    "--enable-threshold",
    type=click.IntRange(1),
    default=None,
    help="--speculative-enable-batch-size (server default: --threshold).",
)
@click.option(
    "--switch-min-steps",
    type=click.IntRange(0),
    default=None,
    help="--speculative-switch-min-steps (server default if unset).",
)
@click.option(
    "--levels",
    type=IntList(),
    default=",".join(map(str, DEFAULTS.levels)),
    show_default=True,
    help="Concurrency levels for equivalence.",
)
@click.option(
    "--new-tokens",
    type=click.IntRange(1),
    default=DEFAULTS.new_tokens,
    show_default=True,
    help="New tokens per equivalence request.",
)
@choice_option(
    "--shape",
    choices=["auto", "small", "8b", "8b-32k"],
    default="auto",
    help="Model shape; auto: small for equivalence and crossings, 8b for throughput; 8b-32k: 8b with a 32k draft vocabulary.",
)
@click.option(
    "--checks",
    default="equivalence,crossings,exact_kv",
    show_default=True,
    help=f"Comma list of {', '.join(report.CHECKS)}.",
)
@choice_option(
    "--attention-backend",
    choices=ATTENTION_BACKENDS,
    default=DEFAULTS.attention_backend,
    help="Every server's attention backend; the backends check judges equivalence and crossings on one other than triton.",
)
@choice_option(
    "--model",
    choices=["dummy", "real"],
    default="dummy",
    help="dummy: weight-free configs of this package; real: the weights and prompts in --model-dir.",
)
@click.option(
    "--model-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="With --model real: a dir made by `dynspec real prepare`, or by `dynspec real own` for your own target "
    "and EAGLE-3 head (target/, draft/, prompts.json, model.json).",
)
@choice_option(
    "--deterministic",
    choices=["auto", "on", "off"],
    default="auto",
    help="SGLang's --enable-deterministic-inference on every server. auto: with --model real, where the release "
    "has it, unless every check only times servers (throughput, mixed_load, auto_threshold).",
)
@click.option("--throughput", is_flag=True, help="Add the throughput check (3 more servers, simulated acceptance).")
@click.option(
    "--throughput-levels",
    type=IntList(),
    default=",".join(map(str, DEFAULTS.throughput_levels)),
    show_default=True,
    help="Concurrency levels for throughput.",
)
@click.option(
    "--throughput-new-tokens", type=click.IntRange(1), default=DEFAULTS.throughput_new_tokens, show_default=True
)
@click.option(
    "--throughput-warmup/--no-throughput-warmup",
    default=DEFAULTS.throughput_warmup,
    show_default=True,
    help="Run each throughput level once untimed first (first-batch costs would favour the later servers).",
)
@click.option(
    "--throughput-repeats",
    type=click.IntRange(1),
    default=DEFAULTS.throughput_repeats,
    show_default=True,
    help="Timed runs per throughput level; the median counts, all are in the report.",
)
@click.option(
    "--simulate-acc-len",
    type=AcceptanceLength(),
    default=DEFAULTS.simulate_acc_len,
    show_default=True,
    help="SGLANG_SIMULATE_ACC_LEN for throughput and mixed_load servers; off (with --model real): the head's "
    "own acceptance, reported per level as throughput.accept_length.",
)
@click.option(
    "--min-envelope-ratio",
    type=float,
    default=DEFAULTS.min_envelope_ratio,
    show_default=True,
    help="Throughput passes when dynspec / max(base, always-on) >= this at every level.",
)
@click.option(
    "--upstream-adaptive",
    is_flag=True,
    help="Throughput only: a 4th server, always-on EAGLE-3 with upstream's --speculative-adaptive "
    "(3 steps at batch size <= --threshold, 0 above; config written to --out). Needs an SGLang that has it.",
)
@click.option(
    "--min-upstream-ratio",
    type=float,
    default=DEFAULTS.min_upstream_ratio,
    show_default=True,
    help="With --upstream-adaptive, throughput passes when dynspec / upstream adaptive >= this at every level > --threshold.",
)
@click.option(
    "--no-overlap-base",
    is_flag=True,
    help="Throughput: one more server, speculation off with --disable-overlap-schedule, and R(C) and "
    "the per-step ratio against it too. With --path v1 (which never overlaps) R(C) is judged against it; "
    "with v2 it is information.",
)
@click.option(
    "--ramp",
    type=IntList(2),
    default=f"{DEFAULTS.ramp_low},{DEFAULTS.ramp_high}",
    show_default=True,
    help="LOW,HIGH concurrency of the alternating crossing waves.",
)
@click.option("--ramp-new-tokens", type=click.IntRange(1), default=DEFAULTS.ramp_new_tokens, show_default=True)
@click.option(
    "--min-crossings",
    type=click.IntRange(2),
    default=DEFAULTS.min_crossings,
    show_default=True,
    help="Switches (OFF+ON) the ramp must produce.",
)
@click.option("--ramp-max-waves", type=click.IntRange(2), default=DEFAULTS.ramp_max_waves, show_default=True)
@click.option(
    "--ramp-timeout", type=click.FloatRange(1), default=DEFAULTS.ramp_timeout, show_default=True, help="Seconds."
)
@click.option(
    "--sampling-per-prompt",
    type=click.IntRange(10),
    default=DEFAULTS.sampling_per_prompt,
    show_default=True,
    help="sampling: requests per prompt (4 prompts) and phase, on each server and the control.",
)
@click.option(
    "--exact-kv-cycles",
    type=click.IntRange(1),
    default=DEFAULTS.exact_kv_cycles,
    show_default=True,
    help="exact_kv: waves that take long requests through a fallback span and back.",
)
@click.option(
    "--exact-kv-tokens",
    type=(click.IntRange(2), click.IntRange(1)),
    default=(DEFAULTS.exact_kv_long_tokens, DEFAULTS.exact_kv_short_tokens),
    show_default=True,
    help="exact_kv and acceptance: new tokens of the long requests and of the short ones. The long ones fall "
    "back while the short ones run, so LONG SHORT = 384 256 makes a span off of ~256 tokens and ~128 after it.",
)
@click.option(
    "--exact-kv-bits",
    is_flag=True,
    help="exact_kv, v1 with kv-direct: the full-extend server also writes each fallback iteration's draft KV "
    "directly (and packed, as a control) and compares the bits with its full extend's (DYNSPEC_CHECK_KV_BITS); "
    "then proposals that differ only after a request's timeline parted from the reference's do not fail the check.",
)
@choice_option(
    "--exact-kv-bits-on",
    choices=["reference", "tested"],
    default=DEFAULTS.exact_kv_bits_on,
    help="--exact-kv-bits: the server that compares: the full-extend reference (the stock verify's rows) or the "
    "server under test (on v1 0.5.12 the lean fallback step's rows; it then keeps the full extend's draft KV).",
)
@click.option(
    "--mixed-phases",
    type=IntList(),
    default=",".join(map(str, DEFAULTS.mixed_phases)),
    show_default=True,
    help="mixed_load: the concurrency of each phase, in order.",
)
@click.option("--mixed-new-tokens", type=click.IntRange(1), default=DEFAULTS.mixed_new_tokens, show_default=True)
@click.option(
    "--mixed-new-tokens-max",
    type=click.IntRange(1),
    default=None,
    help="mixed_load, auto_threshold: draw each request's output length from --mixed-new-tokens to this, by its "
    "prompt, alike on every server (outputs that end apart, as real traffic's; unset: all --mixed-new-tokens).",
)
@click.option(
    "--mixed-repeats",
    type=click.IntRange(1),
    default=DEFAULTS.mixed_repeats,
    show_default=True,
    help="mixed_load: timed passes per server; per phase and in total the median counts.",
)
@click.option(
    "--mixed-variant",
    "mixed_variants",
    type=EnvVariant(),
    multiple=True,
    help="mixed_load: one more dynspec server with these environment variables, run right after dynspec "
    "(an A/B in one call; reported under mixed_load.variants, not judged), e.g. prefill-kv:DYNSPEC_PREFILL_KV=1. "
    "Repeatable.",
)
@click.option(
    "--auto-acceptance",
    "auto_acceptances",
    type=IntList(),
    default=",".join(f"{a:g}" for a in DEFAULTS.auto_acceptances),
    show_default=True,
    help="auto_threshold: the simulated acceptances (SGLANG_SIMULATE_ACC_LEN) it is run at, each with its "
    "own servers (always-on, auto and one per --auto-sweep N; base once). With --model real: not used, the "
    "model's own acceptance (reported as 'real').",
)
@click.option(
    "--auto-sweep",
    type=IntList(),
    default=",".join(map(str, DEFAULTS.auto_sweep)),
    show_default=True,
    help="auto_threshold: the fixed thresholds auto's mixed-load time is compared with (the best of them).",
)
@click.option(
    "--parallel-starts",
    type=click.IntRange(1, 16),
    default=DEFAULTS.parallel_starts,
    show_default=True,
    help="Start up to N servers at once (a check's next ones), wait for all, then measure them (see "
    "--interleave) while the others idle: fewer minutes of GPU time for server starts. With N > 1 every server gets "
    "--mem-fraction-static 0.85, --max-total-tokens 131072, an --nccl-port of its own and --sleep-on-idle "
    "so that they share the GPU (the 8B shape's pools smaller, with a fraction of 0.95, where the GPU's memory asks: "
    "an H100 80GB on Triton, 40960 slots for base and two speculating servers, 24576 for three speculating; "
    "a group that would leave pools too small for the loads starts fewer at once); with "
    "throughput, mixed_load or auto_threshold at most 3, as many as hold "
    "their loads, or on a real model as many as the GPU's memory holds (SmolLM2-135M on an H100: 15); "
    "--tp 1 only.",
)
@click.option(
    "--interleave/--one-after-another",
    default=DEFAULTS.interleave,
    show_default=True,
    help="throughput and mixed_load, where --parallel-starts starts all their servers at once (or, with "
    "--no-overlap-base, the three a verdict compares; the fourth follows alone), and auto_threshold, by "
    "the groups --parallel-starts starts (auto and the fixed N first): the servers take turns at "
    "every level and pass, the order rotated each run, so that the machine's drift over the call spreads "
    "over all of them; --one-after-another measures each server's levels and passes in one go.",
)
@click.option(
    "--freeze-gc",
    is_flag=True,
    help="After each server's warm-up request, POST /freeze_gc (SGLang takes the objects alive then out of "
    "the garbage collector's reach, as its long-collection warning advises), so that no full collection "
    "over them stalls a timed run. Off by default; scripts/h200-runs.sh's timed steps turn it on (session "
    "40: it kept v1's R(128) from the one collection that had cost it twice).",
)
@click.option("--tp", type=click.IntRange(1), default=None, help="Pass --tp-size N to every server.")
@click.option(
    "--port", type=click.IntRange(1024, 65000), default=DEFAULTS.port, show_default=True, help="First port to try."
)
@click.option(
    "--start-timeout",
    type=click.FloatRange(1),
    default=DEFAULTS.start_timeout,
    show_default=True,
    help="Seconds for a server to answer.",
)
@click.option(
    "--request-timeout",
    type=click.FloatRange(1),
    default=DEFAULTS.request_timeout,
    show_default=True,
    help="Seconds per request.",
)
@click.option("--extra-args", default="", help="Extra arguments for every server, as one shell-quoted string.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder for logs, report.json, summary.txt, throughput.png [default: ./dynspec-proof-DATE-TIME].",
)
@click.option(
    "--plot",
    "plot_report",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Only draw the PNG from an existing report.json (into --out, or beside it).",
)
@click.option(
    "--combine",
    "combine_reports",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    multiple=True,
    help="Only join the auto_threshold reports of device calls that each ran part of the sweep (give it "
    "once per report.json) and judge them as one sweep of --auto-sweep: report.json and summary.txt "
    "into --out, the summary to stdout.",
)
@click.pass_context
def proof(
    ctx: click.Context,
    sglang: str,
    python: str,
    spec_path: str,
    threshold: int | str,
    enable_threshold: int | None,
    switch_min_steps: int | None,
    levels: tuple[int, ...],
    new_tokens: int,
    shape: str,
    checks: str,
    model: str,
    model_dir: Path | None,
    deterministic: str,
    throughput: bool,
    throughput_levels: tuple[int, ...],
    throughput_new_tokens: int,
    throughput_warmup: bool,
    throughput_repeats: int,
    simulate_acc_len: float | None,
    min_envelope_ratio: float,
    upstream_adaptive: bool,
    min_upstream_ratio: float,
    no_overlap_base: bool,
    ramp: tuple[int, ...],
    ramp_new_tokens: int,
    min_crossings: int,
    ramp_max_waves: int,
    ramp_timeout: float,
    sampling_per_prompt: int,
    exact_kv_cycles: int,
    exact_kv_tokens: tuple[int, int],
    exact_kv_bits: bool,
    exact_kv_bits_on: str,
    mixed_phases: tuple[int, ...],
    mixed_new_tokens: int,
    mixed_new_tokens_max: int | None,
    mixed_repeats: int,
    mixed_variants: tuple[tuple[str, tuple[tuple[str, str], ...]], ...],
    auto_acceptances: tuple[int, ...],
    auto_sweep: tuple[int, ...],
    parallel_starts: int,
    interleave: bool,
    freeze_gc: bool,
    tp: int | None,
    attention_backend: str,
    port: int,
    start_timeout: float,
    request_timeout: float,
    extra_args: str,
    out: Path | None,
    plot_report: Path | None,
    combine_reports: tuple[Path, ...],
) -> None:
    """Start SGLang servers with weight-free models and prove dynspec on this GPU.

    \b
    equivalence  greedy outputs with speculation off, always on and dynspec are token-identical
                 at every level, below and above the threshold
    crossings    a 1 <-> 64 load ramp in one server switches speculation both ways at least
                 --min-crossings times, with no error in the log and every request answered
    exact_kv     after a fallback span, dynspec drafts exactly what a server running the full
                 draft extend in every iteration drafts (DYNSPEC_DRAFT_KV=full), and a server
                 that skips it while off (=skip, the control) drafts otherwise
    acceptance   (--model real) acceptance length after a switch back on equals
                 always-on's on the same requests (>= 0.99 x), and the control's drops
    throughput   (--throughput) tok/s of the three, and R(C) = dynspec / max(base, always-on);
                 --upstream-adaptive adds upstream's adaptive mode and dynspec / it above N;
                 from the logs, each server's speed per decode step / base's (information)
    mixed_load   concurrency rising and falling (--mixed-phases) on the three throughput
                 servers: dynspec's total time <= 1.03 x the per-phase faster of base and
                 always-on, and below both
    refusals     each combination dynspec refuses (topk > 1, DP attention, N >= the running or
                 CUDA-graph limit, a bad value, --speculative-adaptive, auto before 0.5.14) on a
                 server of its own: it exits before answering, with a line naming it, no traceback
    metrics      (with crossings) the dynspec server runs with --enable-metrics; around the
                 ramp /metrics has the three sglang:dynspec_* counters, the switches counted
                 equal the switch lines logged, both kinds of iteration rose
    auto_threshold the mixed load at each --auto-acceptance (with --model real, the model's
                 own) on dynspec with --speculative-disable-batch-size auto and with each
                 fixed N of --auto-sweep (0.5.14+, v2): auto's total <= 1.03 x the best
                 N's, not slower than both static servers

    Without dynspec applied to the SGLang under test, only speculation off vs always on is
    checked. Progress goes to stderr, the summary to stdout; logs, report.json and
    throughput.png go to --out.

    \b
    Exit codes: 0 every check passed, 1 a check failed, 2 bad usage.
    """
    if plot_report is not None:
        _plot_only(plot_report, out)
        return
    if combine_reports:
        ctx.exit(_combine_only(combine_reports, auto_sweep, out))
    chosen = tuple(c.strip() for c in checks.split(",") if c.strip())
    if throughput and "throughput" not in chosen:
        chosen += ("throughput",)
    try:
        extra = tuple(shlex.split(extra_args))
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--extra-args") from error
    out = out or default_out()
    if threshold == AUTO:
        if ctx.get_parameter_source("levels") == ParameterSource.DEFAULT:
            levels = AUTO_LEVELS
        if ctx.get_parameter_source("ramp") == ParameterSource.DEFAULT:
            ramp = AUTO_RAMP
    opts = ProofOptions(
        out=out,
        sglang=sglang,
        python=python,
        path=spec_path,
        threshold=threshold,
        enable_threshold=enable_threshold,
        switch_min_steps=switch_min_steps,
        levels=levels,
        new_tokens=new_tokens,
        shape=shape,
        checks=chosen,
        model=model,
        model_dir=model_dir,
        deterministic=deterministic,
        throughput_levels=throughput_levels,
        throughput_new_tokens=throughput_new_tokens,
        throughput_warmup=throughput_warmup,
        throughput_repeats=throughput_repeats,
        simulate_acc_len=simulate_acc_len,
        min_envelope_ratio=min_envelope_ratio,
        upstream_adaptive=upstream_adaptive,
        no_overlap_base=no_overlap_base,
        min_upstream_ratio=min_upstream_ratio,
        ramp_low=ramp[0],
        ramp_high=ramp[1],
        ramp_new_tokens=ramp_new_tokens,
        min_crossings=min_crossings,
        ramp_max_waves=ramp_max_waves,
        ramp_timeout=ramp_timeout,
        sampling_per_prompt=sampling_per_prompt,
        exact_kv_cycles=exact_kv_cycles,
        exact_kv_long_tokens=exact_kv_tokens[0],
        exact_kv_short_tokens=exact_kv_tokens[1],
        exact_kv_bits=exact_kv_bits,
        exact_kv_bits_on=exact_kv_bits_on,
        mixed_phases=mixed_phases,
        mixed_new_tokens=mixed_new_tokens,
        mixed_new_tokens_max=mixed_new_tokens_max,
        mixed_repeats=mixed_repeats,
        mixed_variants=mixed_variants,
        auto_acceptances=tuple(float(a) for a in auto_acceptances),
        auto_sweep=auto_sweep,
        parallel_starts=parallel_starts,
        interleave=interleave,
        freeze_gc=freeze_gc,
        tp=tp,
        attention_backend=attention_backend,
        port=port,
        start_timeout=start_timeout,
        request_timeout=request_timeout,
        extra_args=extra,
        command=_command_line(ctx),
    )
    try:
        with _stop_servers_on_sigterm():
            result = run_proof(opts, _progress)
    except ProofUsageError as error:
        raise click.UsageError(str(error), ctx) from error
    text = report.summary(result)
    (out / report.SUMMARY_NAME).write_text(text)
    click.echo(text, nl=False)
    if result.get("throughput", {}).get("levels"):
        try:
            why = plot.render(result, out / report.PLOT_NAME)
        except Exception as error:  # noqa: BLE001 - a plotting glitch must not hide the verdict
            why = f"matplotlib failed: {error!r}; retry with --plot {out / report.REPORT_NAME}"
        _progress(f"no plot: {why}" if why else f"plot: {out / report.PLOT_NAME}")
    ctx.exit(report.exit_code(result))
