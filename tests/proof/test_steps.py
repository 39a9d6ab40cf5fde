"""Per-step speed from ``Decode batch`` log lines: hand-written logs, then the real H200 logs in docs/proof."""

from __future__ import annotations

import gzip
import json
import tarfile
from pathlib import Path

import pytest

from patcher.proof import steps

PROOF = Path(__file__).resolve().parents[2] / "docs" / "proof"


def decode(running: int, tokens: int, tok_s: float, accept: str = "") -> str:
    return (
        f"[2026-12-01 11:00:00] Decode batch, #running-req: {running}, #token: {tokens}, token usage: 0.01, "
        f"{accept}cuda graph: True, gen throughput (token/s): {tok_s:.2f}, #queue-req: 0"
    )


def test_the_log_interval_comes_from_server_args_and_defaults_to_sglangs() -> None:
    assert steps.log_interval("server_args=ServerArgs(model_path='m', decode_log_interval=10, x=1)") == 10
    assert steps.log_interval("no server args here") == 40


def test_only_intervals_of_one_token_per_request_and_no_admission_are_steady() -> None:
    log = "\n".join(
        [
            "server_args=ServerArgs(decode_log_interval=10)",
            decode(4, 100, 50.0),  # nothing before it
            decode(4, 140, 400.0),  # +4 x 10: steady
            "Prefill batch, #new-seq: 2, #new-token: 60",
            decode(6, 260, 300.0),  # running changed
            decode(6, 320, 600.0),  # +6 x 10: steady
            decode(6, 500, 1800.0, "accept len: 3.00, "),  # +6 x 30: speculating
            decode(6, 520, 500.0),  # +20: requests finished and others joined
            "[2026-11-29 12:00:09 TP0] Decode batch. #running-req: 6, #token: 580, gen throughput (token/s): 610.0",
        ]
    )
    assert steps.steady_steps(log) == [steps.Step(4, 140, 400.0), steps.Step(6, 320, 600.0), steps.Step(6, 580, 610.0)]


def test_admissions_count_prefills_per_thousand_tokens_in_each_mode() -> None:
    """Every interval counts, steady or not, with the prefills logged since the line before it; a
    speculating interval generated its acceptance times one token a request an iteration."""
    log = "\n".join(
        [
            "server_args=ServerArgs(decode_log_interval=10)",
            "Prefill batch, #new-seq: 64, #new-token: 128",  # a wave, before the first line
            decode(64, 1000, 30000.0),
            decode(64, 1640, 32000.0),
            decode(64, 2000, 9000.0, "accept len: 1.50, "),
            "Prefill batch, #new-seq: 1, #new-token: 2",
            "Prefill batch, #new-seq: 1, #new-token: 2",
            decode(64, 2900, 8000.0, "accept len: 1.70, "),
            decode(64, 3900, 20000.0, "accept len: 1.60, "),
            decode(64, 4000, 30000.0, "accept len: 1.00, "),  # a zero-step server's line: not speculating
            decode(8, 4100, 9000.0),  # outside the sizes asked
        ]
    )
    assert steps.admissions(log, 56, 64, speculating=False) == {
        "intervals": 3,
        "prefills_per_1000_tokens": round(1000 / (3 * 640), 3),
        "tok_s": round(3 * 640 / (640 / 30000 + 640 / 32000 + 640 / 30000)),  # 30638: tokens over time
        "tok_s_with_prefills": 30000,
        "tok_s_without": 31000,
    }
    made = [640 * a for a in (1.5, 1.7, 1.6)]  # each speculating interval's tokens
    assert steps.admissions(log, 56, 64, speculating=True) == {
        "intervals": 3,
        "prefills_per_1000_tokens": round(1000 * 2 / sum(made), 3),
        # over all three (10454), not their median (9000): each interval counts by its time
        "tok_s": round(sum(made) / (made[0] / 9000 + made[1] / 8000 + made[2] / 20000)),
        "tok_s_with_prefills": 8000,
        "tok_s_without": 14500,
    }
    # the control: no interval of that mode at those sizes
    assert steps.admissions(log, 100, 128, speculating=True) is None


def test_refills_read_admissions_in_each_large_phases_band_by_mode() -> None:
    """``refills``: for each concurrency of 16 or more, the band C / 2 + 1 to C and each mode the log
    has there; phases below 16, and bands or modes with no interval, give nothing."""
    log = "\n".join(
        [
            "server_args=ServerArgs(decode_log_interval=10)",
            decode(12, 100, 5000.0),  # 9-16, one token a request
            "Prefill batch, #new-seq: 1, #new-token: 2",
            decode(12, 280, 5000.0, "accept len: 1.50, "),  # 9-16, speculating
            "Prefill batch, #new-seq: 1, #new-token: 2",
            decode(64, 1000, 30000.0),  # 33-64
            decode(64, 1640, 32000.0),
            decode(20, 1840, 9000.0),  # between the bands: nobody's
        ]
    )
    assert steps.refills(log, (1, 4, 16, 64, 128, 64, 16, 4, 1)) == {
        "9-16": {"speculating": round(1000 / (12 * 10 * 1.5), 3), "not_speculating": 0.0},
        "33-64": {"not_speculating": round(1000 / (2 * 640), 3)},
    }
    # the controls: no phase of 16 or more, and a log with no interval in any band
    assert steps.refills(log, (1, 4, 8)) == {}
    assert steps.refills("\n".join(log.splitlines()[-1:]), (16, 64)) == {}


def test_fallback_steps_are_the_median_steady_step_at_each_large_phases_concurrency() -> None:
    """``fallback_steps``: at each concurrency of 16 or more, the median of at least three steady
    steps without speculation there, in ms; a speculating interval is not one, and a level with two
    steady steps, or below 16, gives nothing (the controls)."""
    log = "\n".join(
        [
            "server_args=ServerArgs(decode_log_interval=10)",
            decode(64, 1000, 30000.0),
            decode(64, 1640, 32000.0),  # steady: 2.0 ms
            decode(64, 2280, 25600.0),  # steady: 2.5 ms
            decode(64, 2920, 16000.0),  # steady: 4.0 ms
            decode(64, 4840, 64000.0, "accept len: 3.00, "),  # speculating: not a step without it
            decode(16, 5000, 8000.0),
            decode(16, 5160, 8000.0),  # steady, but only two at 16
            decode(16, 5320, 8000.0),
            decode(8, 5400, 4000.0),
            decode(8, 5480, 4000.0),
            decode(8, 5560, 4000.0),
            decode(8, 5640, 4000.0),  # below 16: no phase of the comparison
        ]
    )
    assert steps.fallback_steps(log, (1, 4, 8, 16, 64, 16, 8)) == {"64": 2.5}
    assert steps.fallback_steps(log, (1, 4, 8)) == {}


@pytest.mark.skipif(
    not (PROOF / "real-0.5.17-v2-s50-r30-auto-prefill-graphs" / "logs.tar.xz").exists(), reason="no logs"
)
def test_on_a_135m_model_one_fallback_step_runs_up_to_30_percent_apart_between_servers() -> None:
    """Session 50's real-weights sweep, read as the auto_threshold report now reads each server: at 64
    and 128 running requests every dynspec server falls back, the same code, and their steps lie 1.30x
    apart; plain decode's are 1.41 and 1.61 ms. The control: session 46's 8B sweep, within 1.02x."""
    phases = (1, 4, 16, 64, 128, 64, 16, 4, 1)

    def read(folder: str, names: tuple[str, ...]) -> dict[str, dict[str, float]]:
        with tarfile.open(PROOF / folder / "logs.tar.xz") as tar:
            return {n: steps.fallback_steps(tar.extractfile(f"{n}.log").read().decode(), phases) for n in names}  # type: ignore[union-attr]

    real = read(
        "real-0.5.17-v2-s50-r30-auto-prefill-graphs",
        ("base-auto", "dynspec-auto-real", "dynspec-n8-real", "dynspec-n32-real"),
    )
    assert {n: (r["64"], r["128"]) for n, r in real.items()} == {
        "base-auto": (1.412, 1.614),
        "dynspec-auto-real": (2.689, 3.419),
        "dynspec-n8-real": (2.38, 2.88),
        "dynspec-n32-real": (3.096, 3.727),
    }
    eight_b = read("0.5.17-v2-s46-r30-auto-acc2-n8-16-32", ("dynspec-auto-acc2", "dynspec-n8-acc2", "dynspec-n32-acc2"))
    for level in ("64", "128"):
        ms = [r[level] for r in eight_b.values()]
        assert max(ms) / min(ms) < 1.02, level
    assert real["dynspec-n32-real"]["64"] / real["dynspec-n8-real"]["64"] > 1.29


@pytest.mark.skipif(not (PROOF / "real-0.5.17-v2-s48-r30-auto-a" / "logs.tar.xz").exists(), reason="no logs here")
def test_on_real_weights_speculation_refills_each_large_phase_four_to_five_times_as_often() -> None:
    """Session 48's real-weights sweep, read as the auto_threshold report now reads each server: in
    every large phase always-on ran 3.9 - 5.3 x the prefills per token that plain decode (base) did, and
    N = 8, which speculates only below 9, ran about base's once it fell back. The control: N = 8's
    fallback against base's plain decode, 0.79 - 0.86 x in each band."""
    phases = (1, 4, 16, 64, 128, 64, 16, 4, 1)
    with tarfile.open(PROOF / "real-0.5.17-v2-s48-r30-auto-a" / "logs.tar.xz") as tar:
        read = {
            name: steps.refills(tar.extractfile(f"{name}.log").read().decode(), phases)  # type: ignore[union-attr]
            for name in ("always-on-real", "base-auto", "dynspec-n8-real")
        }
    bands = ("9-16", "33-64", "65-128")
    assert all(set(read[name]) == set(bands) for name in read)
    for band in bands:
        spec = read["always-on-real"][band]["speculating"]
        plain = read["base-auto"][band]["not_speculating"]
        fallback = read["dynspec-n8-real"][band]["not_speculating"]
        assert 3.5 < spec / plain < 6, (band, spec, plain)
        assert 0.75 < fallback / plain < 0.9, (band, fallback, plain)


def test_each_step_is_paired_with_the_base_step_nearest_in_kv_size_within_half_an_interval() -> None:
    base = [steps.Step(64, 5000, 1000.0), steps.Step(64, 7560, 900.0), steps.Step(32, 5000, 700.0)]
    fallback = [
        steps.Step(64, 5100, 850.0),  # nearest: 5000
        steps.Step(64, 7000, 720.0),  # nearest: 7560, 560 away, within 64 x 40 / 2
        steps.Step(64, 12000, 10.0),  # nothing within 1280 tokens
        steps.Step(128, 5000, 10.0),  # no base step at 128 requests
    ]
    assert steps.paired_ratios(fallback, base, 64, 40) == [0.85, 0.8]


def test_per_step_summarises_each_server_against_base_at_each_level() -> None:
    def log(*speeds: float) -> str:
        return "\n".join(decode(8, 100 + k * 320, s) for k, s in enumerate(speeds))

    logs = {"base": log(1.0, 1000.0, 1000.0, 1000.0), "dynspec": log(1.0, 800.0, 900.0, 850.0), "other": log(5.0)}
    result = steps.per_step(logs, "base", [1, 8])
    assert result == {"dynspec": {"8": {"pairs": 3, "min": 0.8, "median": 0.85, "max": 0.9}}}  # "other": no pairs
    assert steps.describe(result) == ["dynspec: C=8 0.80-0.90 (median 0.85, 3 pairs)"]
    assert steps.per_step({"dynspec": logs["dynspec"]}, "base", [8]) == {}


def test_speculating_intervals_are_steady_when_every_iteration_verified_and_compare_per_step() -> None:
    """``speculating=True``: the token count grew by running x interval x the line's acceptance (to
    its rounding); the ratio is of steps a second, so a server accepting more is not called faster."""
    log = "\n".join(
        [
            "server_args=ServerArgs(decode_log_interval=10)",
            decode(4, 100, 50.0, "accept len: 3.00, "),  # nothing before it
            decode(4, 220, 1200.0, "accept len: 3.00, "),  # +4 x 10 x 3: steady
            decode(4, 315, 950.0, "accept len: 2.37, "),  # +95, 4 x 10 x 2.37 = 94.8: steady, to the rounding
            decode(4, 355, 400.0, "accept len: 1.00, "),  # +4 x 10 at acceptance 1: a fallback interval
            decode(4, 455, 900.0, "accept len: 2.00, "),  # +100, not 80: requests finished and others joined
            decode(4, 575, 1180.0),  # no acceptance logged: plain decode
        ]
    )
    assert steps.steady_steps(log, speculating=True) == [
        steps.Step(4, 220, 1200.0, 3.0),
        steps.Step(4, 315, 950.0, 2.37),
    ]
    assert steps.steady_steps(log) == [steps.Step(4, 355, 400.0)]  # control: the fallback reading keeps only that one
    assert steps.Step(4, 315, 950.0, 2.37).steps_s == pytest.approx(950.0 / 2.37)
    # per step: 1200 tok/s at 3 accepted against 900 at 2.25 is the same step rate
    on = "\n".join([decode(8, 340, 1.0, "accept len: 2.25, "), decode(8, 1060, 900.0, "accept len: 2.25, ")])
    dyn = "\n".join([decode(8, 100, 1.0, "accept len: 3.00, "), decode(8, 1060, 1200.0, "accept len: 3.00, ")])
    result = steps.per_step({"always_on": on, "dynspec": dyn}, "always_on", [8], speculating=True)
    assert result == {"dynspec": {"8": {"pairs": 1, "min": 1.0, "median": 1.0, "max": 1.0}}}
    assert steps.per_step({"always_on": on, "dynspec": dyn}, "always_on", [8]) == {}  # control: none steady as fallback


def read_logs(archive: Path) -> dict[str, str]:
    with tarfile.open(archive) as tar:
        return {
            Path(member.name).stem: tar.extractfile(member).read().decode(errors="replace")  # type: ignore[union-attr]
            for member in tar.getmembers()
            if member.name.endswith(".log")
        }


@pytest.mark.skipif(not (PROOF / "0.5.17-v2-throughput" / "logs.tar.xz").exists(), reason="no H200 logs here")
def test_the_0517_h200_logs_give_the_per_step_ratios_the_proof_readme_quotes() -> None:
    logs = read_logs(PROOF / "0.5.17-v2-throughput" / "logs.tar.xz")
    result = steps.per_step(logs, "base-sim", [64, 128])
    dynspec, upstream = result["dynspec-sim"], result["upstream-adaptive-sim"]
    assert 0.84 <= dynspec["64"]["median"] <= 0.88 and 0.84 <= dynspec["128"]["median"] <= 0.88
    assert upstream["64"]["median"] < 0.45 and upstream["128"]["median"] < 0.35  # the slow zero-step mode
    assert "always-on-sim" not in result  # speculating intervals are never steady
    skip = gzip.decompress((PROOF / "0.5.17-v2-skip-draft-extend" / "skipde.log.gz").read_bytes()).decode()
    without_draft_extend = steps.per_step({"base": logs["base-sim"], "skip": skip}, "base", [64])["skip"]["64"]
    assert without_draft_extend["median"] >= 0.97 and without_draft_extend["pairs"] >= 4


def test_per_run_keeps_each_admission_apart() -> None:
    """Two runs of 4 requests, each admitted by a prefill: one fast, one slow. One median over
    both (per_step) would hide that; per_run gives each run's median steady speed, in order."""
    log = "\n".join(
        [
            "server_args=ServerArgs(decode_log_interval=10)",
            "Prefill batch, #new-seq: 4, #new-token: 120",
            decode(4, 140, 90.0),  # the interval with the prefill: not steady
            decode(4, 180, 400.0),
            decode(4, 220, 420.0),
            "Prefill batch, #new-seq: 4, #new-token: 120",
            decode(4, 140, 90.0),
            decode(4, 180, 300.0),
            decode(4, 220, 280.0),
            decode(4, 260, 290.0),
        ]
    )
    assert steps.per_run({"dynspec": log}, [4, 8]) == {"dynspec": {"4": [410, 290]}}
    assert steps.describe_runs(steps.per_run({"dynspec": log}, [4])) == ["dynspec: C=4 410 290"]
    # Negative control: without the prefill lines it is one run.
    one = "\n".join(line for line in log.splitlines() if "Prefill" not in line)
    assert steps.per_run({"dynspec": one}, [4]) == {"dynspec": {"4": [300]}}


def test_session_19s_small_model_fallback_runs_are_bimodal_and_base_is_not() -> None:
    logs = read_logs(PROOF / "real-0.5.17-v2-s19-r32-tput" / "logs.tar.xz")
    runs = steps.per_run({name: logs[name] for name in ("base-own", "dynspec-own")}, [32])
    assert runs == {"base-own": {"32": [12341, 12610, 12334, 12332]}, "dynspec-own": {"32": [11892, 9237, 11903, 9169]}}
    assert max(runs["base-own"]["32"]) / min(runs["base-own"]["32"]) < 1.03  # the negative control: base is steady


def test_outside_steady_is_each_timed_runs_time_beyond_its_tokens_at_its_own_steady_speed() -> None:
    per_run = {"dynspec": {"64": [10000, 10000, 8000]}, "base": {"64": [10000, 10000]}}
    samples = {"dynspec": [[], [8000, 4000]], "base": [[], [9000, 5000]]}
    out = steps.outside_steady(per_run, samples, [1, 64], 250)
    # 64 x 250 tokens: 2.0 s at 8000 tok/s against 1.6 s at 10000; 4.0 s against 2.0 s at 8000
    assert out == {"dynspec": {"64": [400, 2000]}}
    # base has no warm-up speed: its speeds cannot be told apart from its timed runs', so none is given
    assert steps.describe_outside(out) == ["dynspec: C=64 400 2000 ms"]
    # without a warm-up every speed is a timed run's
    assert steps.outside_steady(per_run, samples, [1, 64], 250, warmup=False) == {"base": {"64": [178, 1600]}}


def test_session_21s_0512_runs_spent_longer_than_base_outside_the_steady_steps() -> None:
    """0.5.12 v2 with its prefill graphs (session 21): at 64 and 128 requests, where dynspec is off and
    each run's steady speed is within 2 % of base's, a run spent 125 - 173 ms beyond its tokens at
    64 (base 96 - 137) and 223 - 240 at 128 (base 164 - 172; one run of each 615 - 646)."""
    evidence = Path(__file__).resolve().parents[2] / "docs/proof/0.5.12-v2-s21-r32-prefill-graph-tput/report.json"
    report = json.loads(evidence.read_text())
    tp = report["throughput"]
    out = steps.outside_steady(tp["per_run"], tp["samples"], tp["levels"], tp["new_tokens"])
    assert out["dynspec"] == {"64": [125, 161, 173], "128": [240, 223, 615]}
    assert out["base"]["64"] == [96, 137, 112] and out["base"]["128"] == [172, 164, 646]
    assert "1" not in out["dynspec"] and "always_on" not in out  # speculating levels have no steady speed
    shifted = {**tp["per_run"], "dynspec": {"64": tp["per_run"]["dynspec"]["64"][1:]}}  # negative control: no warm-up
    assert "dynspec" not in steps.outside_steady(shifted, tp["samples"], tp["levels"], tp["new_tokens"])
