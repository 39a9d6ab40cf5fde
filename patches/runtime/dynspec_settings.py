"""dynspec settings: the one reading of its three flags, and the one list of what they refuse.

Installed by dynspec as ``sglang/srt/speculative/dynspec_settings.py``. The start-up check that
dynspec adds to ``ServerArgs.check_server_args`` calls ``check_server_args``; the v1 runtime
(``dynspec_runtime``) and the v2 runtime (``dynspec_v2``) call ``read_settings`` and
``unsupported_reason`` when their worker is built. Each caller reads a setting its own way (the
check from ``ServerArgs`` or, from 0.5.20, its resolving view; v1 from the worker's
``server_args``; v2 through ``get_spec()`` from 0.5.17) and hands that in as ``get(name,
default)``: what the values mean is decided here only.

Standard library only: the start-up check imports it before any of SGLang's speculative code.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple, Union

# The flag every refusal names.
FLAG = "--speculative-disable-batch-size"
AUTO = "auto"  # FLAG's value that lets the server find the switch point (dynspec_auto, 0.5.14+)
# --speculative-switch-min-steps when unset (patches/_flags.py gives ServerArgs the same default).
DEFAULT_MIN_STEPS = 8
ALGORITHMS = ("EAGLE", "EAGLE3")

Getter = Callable[[str, Any], Any]  # get(setting name, default) -> its value as the caller reads it

# What the fallback cannot serve: the refusal's words, the setting, its default, and when it is set.
UNSUPPORTED: Tuple[Tuple[str, str, Any, Callable[[Any], bool]], ...] = (
    ("--speculative-eagle-topk > 1", "speculative_eagle_topk", 1, lambda v: (v or 1) > 1),
    ("--enable-dp-attention", "enable_dp_attention", False, bool),
    ("--pp-size > 1", "pp_size", 1, lambda v: (v or 1) > 1),
    ("--enable-two-batch-overlap", "enable_two_batch_overlap", False, bool),
    ("--enable-pdmux", "enable_pdmux", False, bool),
    ("--enable-multi-layer-eagle", "enable_multi_layer_eagle", False, bool),
    ("--speculative-adaptive", "speculative_adaptive", False, bool),
)
# The decode CUDA-graph sizes under each release's name, newest first: 0.5.14 renamed them with a
# _decode suffix (the old flags stayed as aliases), and a check reading the old name alone skipped.
GRAPH_BATCH_SIZES = ("cuda_graph_bs_decode", "cuda_graph_bs")
GRAPH_MAX_BATCH_SIZE = ("cuda_graph_max_bs_decode", "cuda_graph_max_bs")
# Every SGLang setting the start-up check reads, as each release may name it: tests hold these
# against the releases' ServerArgs fields, so that a rename cannot turn a check off unseen.
SGLANG_SETTINGS_READ: Tuple[Tuple[str, ...], ...] = (
    ("speculative_algorithm",),
    *((name,) for _, name, _, _ in UNSUPPORTED),
    ("max_running_requests",),
    ("disable_cuda_graph",),
    GRAPH_BATCH_SIZES,
    GRAPH_MAX_BATCH_SIZE,
)


@dataclass(frozen=True)
class Settings:
    """The flags as a runtime uses them."""

    disable_above: Union[int, str]  # a positive int, or AUTO
    enable_at_or_below: int  # the switch-on size; with AUTO its floor: never off at or below it (1 unless given)
    min_steps: int  # decode iterations between two switches, at least

    @property
    def auto(self) -> bool:
        return self.disable_above == AUTO


def getter_of(owner: Any) -> Getter:
    """``get`` for settings that are attributes of ``owner`` (a ``ServerArgs``, or a view of one)."""
    return lambda name, default: getattr(owner, name, default)


def first_set(get: Getter, names: Tuple[str, ...]) -> Any:
    """The value of the first of ``names`` (one setting's names across releases) that is set."""
    for name in names:
        value = get(name, None)
        if value is not None:
            return value
    return None


def parse_threshold(value: object, flag: str = FLAG) -> Optional[Union[int, str]]:
    """A ``--speculative-disable-batch-size`` value: None (unset), ``AUTO``, or a positive int.

    The flag is a string on the command line (so that it can say ``auto``) and an int from
    Python callers; anything else is refused with a message that names the flag."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        if text == AUTO:
            return AUTO
        if text.isdigit() and int(text) >= 1:
            return int(text)
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ValueError(f"{flag} must be a positive integer or auto, got {value!r}")


def read_settings(get: Getter) -> Optional[Settings]:
    """The flags, or None while ``--speculative-disable-batch-size`` is unset; ValueError for a bad
    threshold. The switch-on size defaults to the threshold (with ``auto``, to 1)."""
    disable_above = parse_threshold(get("speculative_disable_batch_size", None))
    if disable_above is None:
        return None
    enable_at_or_below = get("speculative_enable_batch_size", None)
    if enable_at_or_below is None:
        enable_at_or_below = 1 if disable_above == AUTO else disable_above
    min_steps = get("speculative_switch_min_steps", DEFAULT_MIN_STEPS)
    return Settings(disable_above, enable_at_or_below, DEFAULT_MIN_STEPS if min_steps is None else min_steps)


def unsupported_reason(get: Getter) -> Optional[str]:
    """Why the fallback cannot run with these settings, naming the flag; None if it can."""
    algorithm = (get("speculative_algorithm", None) or "").upper()
    if algorithm not in ALGORITHMS:
        return f"{FLAG} works with --speculative-algorithm EAGLE or EAGLE3, not {algorithm or 'none'}"
    for words, name, default, is_set in UNSUPPORTED:
        if is_set(get(name, default)):
            return f"{FLAG} does not support {words}"
    return None


def auto_unavailable(where: str) -> ValueError:
    """The refusal of ``auto`` where it cannot run (before 0.5.14, v1, the own fallback): one text
    for the start-up check and both runtimes; ``where`` ends it before "give a number"."""
    return ValueError(f"{FLAG} auto needs SGLang 0.5.14 or later (its zero-step mode); {where}, give a number")


def zero_step_mode_here() -> bool:
    """Whether the SGLang this module was installed into has the zero-step mode auto runs on
    (0.5.14+: ``EAGLEWorkerV2._build_trivial_verify_input`` in ``eagle_worker_v2.py`` beside this
    file). Read as text, so that the start-up check imports none of the release's speculative code."""
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "eagle_worker_v2.py")
    try:
        with open(worker, encoding="utf-8") as f:
            return "def _build_trivial_verify_input(" in f.read()
    except OSError:
        return False


def started_as_launch_server() -> bool:
    """The process is SGLang's server command (``python -m sglang.launch_server``), not a program
    that builds a ``ServerArgs`` itself."""
    main = sys.modules.get("__main__")
    return getattr(getattr(main, "__spec__", None), "name", None) == "sglang.launch_server"


def check_server_args(args: Any) -> None:
    """The start-up check: refuse flag values and combinations the fallback cannot serve, naming
    the fix, before a crash at the first crossing could. From the server command a refusal is one
    line on stderr and exit code 2, as for a bad command line; elsewhere a ValueError."""
    try:
        refuse_what_cannot_serve(args)
    except ValueError as error:
        if not started_as_launch_server():
            raise
        print(f"error: {error}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def refuse_what_cannot_serve(args: Any) -> None:
    """ValueError naming the flag and the fix for what the fallback cannot serve."""
    get = getter_of(args)
    disable = parse_threshold(get("speculative_disable_batch_size", None))
    if disable == AUTO and not zero_step_mode_here():
        raise auto_unavailable("on this release")
    enable = get("speculative_enable_batch_size", None)
    min_steps = get("speculative_switch_min_steps", DEFAULT_MIN_STEPS)
    if disable is None:
        if enable is not None:
            raise ValueError(f"--speculative-enable-batch-size needs {FLAG}")
        return
    for flag, value in (("--speculative-enable-batch-size", enable), ("--speculative-switch-min-steps", min_steps)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{flag} must be a positive integer, got {value!r}")
    if enable is not None and isinstance(disable, int) and enable > disable:
        raise ValueError(f"--speculative-enable-batch-size ({enable}) must not exceed {FLAG} ({disable})")
    reason = unsupported_reason(get)
    if reason is not None:
        raise ValueError(reason)
    # With auto the floor (the enable size, if given) is the size that must leave room above it.
    if isinstance(disable, int):
        threshold, named = disable, f"{FLAG} {disable}"
    elif enable is None:
        return
    else:
        threshold, named = enable, f"--speculative-enable-batch-size {enable} (auto's floor)"
    max_running = get("max_running_requests", None)
    if max_running is not None and threshold >= max_running:
        raise ValueError(
            f"{named} can never trigger: at most {max_running} requests run at once; "
            "lower it or raise --max-running-requests"
        )
    if not get("disable_cuda_graph", False):
        graph_sizes = first_set(get, GRAPH_BATCH_SIZES)
        largest = max(graph_sizes) if graph_sizes else first_set(get, GRAPH_MAX_BATCH_SIZE)
        if largest is not None and threshold >= largest:
            raise ValueError(
                f"{named} is not below the largest CUDA-graph batch size ({largest}), so the fallback "
                f"would never run on a graph; raise --cuda-graph-max-bs above {threshold} or lower the threshold"
            )
