from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from patcher.proof import command, mixed
from patcher.proof.command import proof

from .conftest import alive, some_port

REPO = Path(__file__).resolve().parents[2]
PROOF = REPO / "patcher" / "proof"


def env_for(root: Path, **extra: str) -> dict[str, str | None]:
    """The environment for CliRunner (None unsets): the fake site first, no simulated acceptance."""
    return {"PYTHONPATH": str(root), "FAKE_SGLANG_DELAY": "0.05", "SGLANG_SIMULATE_ACC_LEN": None, **extra}


def test_the_command_runs_the_proof_and_exits_0(site, tmp_path):
    out = tmp_path / "out"
    args = ["--python", sys.executable, "--threshold", "4", "--levels", "1,8", "--new-tokens", "4",
            "--checks", "equivalence", "--port", str(some_port()), "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(proof, args, env=env_for(site()))
    assert result.exit_code == 0, result.output
    assert result.stdout.endswith("RESULT: PASS (exit 0)\n")
    assert "[proof] starting dynspec server" in result.stderr
    assert (out / "summary.txt").read_text() == result.stdout
    saved = json.loads((out / "report.json").read_text())
    assert saved["equivalence"]["levels"] == [1, 8] and saved["complete"]
    assert saved["command"] == "proof " + shlex.join(args)  # as typed, in the command's option order
    assert sorted(p.name for p in out.glob("*.log")) == ["always-on.log", "base.log", "dynspec.log"]


def test_a_failed_check_exits_1(site, tmp_path):
    args = ["--threshold", "4", "--levels", "1,8", "--new-tokens", "4", "--checks", "equivalence",
            "--port", str(some_port()), "--out", str(tmp_path / "o"), "--python", sys.executable]  # fmt: skip
    result = CliRunner().invoke(proof, args, env=env_for(site(), FAKE_SGLANG_FAULT="diverge"))
    assert result.exit_code == 1
    assert "equivalence  FAIL" in result.stdout and result.stdout.endswith("RESULT: FAIL (exit 1)\n")


def test_usage_errors_exit_2_before_starting_anything(site, tmp_path):
    runner = CliRunner()
    root = site()
    cases = [
        (["--levels", "1,x"], "not a comma-separated list"),
        (["--ramp", "1,2,3"], "exactly 2 integers"),
        (["--path", "v3"], "'v3' is not one of"),
        (["--threshold", "32", "--levels", "1,4"], "must have a level <= 32 and one > 32"),
        (["--sglang", str(tmp_path / "nowhere")], "no sglang/srt/server_args.py"),
        (["--extra-args", "'unclosed"], "No closing quotation"),
        (["--checks", "throughput", "--upstream-adaptive"], "has no --speculative-adaptive"),
        (["--upstream-adaptive"], "--upstream-adaptive needs the throughput check"),
        (
            ["--checks", "mixed_load", "--mixed-phases", "1,4"],
            "--mixed-phases 1,4 must have a phase <= 32 and one > 32",
        ),
        (["--mixed-phases", "1,x"], "not a comma-separated list"),
        (["--exact-kv-cycles", "0"], "0 is not in the range x>=1"),
        (["--exact-kv-tokens", "64", "64"], "--exact-kv-tokens 64 64: the long requests must outlive the short ones"),
        (["--deterministic", "maybe"], "'maybe' is not one of"),
        (
            ["--checks", "mixed_load", "--parallel-starts", "4"],
            "--parallel-starts 4: at most 3 of the 8B shape's servers start side by side",
        ),
        (["--parallel-starts", "2", "--tp", "2"], "--parallel-starts needs --tp 1"),
        (["--parallel-starts", "17"], "17 is not in the range 1<=x<=16"),
        (["--mixed-variant", "prefill-kv"], "start with a name"),
        (["--mixed-variant", "Up:A=1"], "start with a name"),
        (["--mixed-variant", "x:lower=1"], "'lower=1' is not ENV=VALUE"),
        (["--mixed-variant", "x:A=1+B"], "'B' is not ENV=VALUE"),
        (["--checks", "equivalence", "--mixed-variant", "x:A=1"], "--mixed-variant needs the mixed_load check"),
        (["--threshold", "many"], "'many' is neither a positive integer nor auto"),
        (["--threshold", "0"], "'0': give a positive integer, or auto"),
        (["--threshold", "auto"], "--threshold auto with exact_kv"),  # in the default checks
        (["--threshold", "auto", "--checks", "equivalence"], "--threshold auto needs --path v2 on SGLang 0.5.14"),
        (["--checks", "mixed_load", "--mixed-variant", "x:A=1", "--mixed-variant", "x:B=2"], "names must differ"),
        (["--checks", "mixed_load", "--mixed-new-tokens-max", "64"], "--mixed-new-tokens-max (64) is below"),
    ]
    for args, message in cases:
        result = runner.invoke(proof, [*args, "--out", str(tmp_path / "o")], env=env_for(root))
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)
    assert not (tmp_path / "o").exists()


def test_the_exact_kv_and_mixed_load_options_reach_the_proof(tmp_path, monkeypatch):
    seen = []

    def fake_run_proof(opts, progress):
        seen.append(opts)
        opts.out.mkdir(parents=True, exist_ok=True)  # as the real one does
        return {"exact_kv": {"passed": True, "problems": [], "detail": "ok"}}

    monkeypatch.setattr(command, "run_proof", fake_run_proof)
    result = CliRunner().invoke(proof, ["--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert seen[0].checks == ("equivalence", "crossings", "exact_kv")  # exact_kv is on by default
    args = ["--checks", "exact_kv,mixed_load", "--exact-kv-cycles", "7", "--mixed-phases", "1,64,1",
            "--mixed-new-tokens", "16", "--mixed-repeats", "2", "--out", str(tmp_path / "o")]  # fmt: skip
    assert CliRunner().invoke(proof, args).exit_code == 0
    opts = seen[1]
    assert opts.checks == ("exact_kv", "mixed_load")
    assert (opts.exact_kv_cycles, opts.exact_kv_load.cycles) == (7, 7)
    assert (opts.exact_kv_load.long_tokens, opts.exact_kv_load.short_tokens) == (128, 64)
    assert CliRunner().invoke(proof, [*args, "--exact-kv-tokens", "384", "256"]).exit_code == 0
    load = seen.pop().exact_kv_load
    assert (load.long_tokens, load.short_tokens) == (384, 256)
    assert opts.mixed_schedule == mixed.Schedule((1, 64, 1), opts.mixed_per_phase, 16) and opts.mixed_repeats == 2
    assert CliRunner().invoke(proof, [*args, "--mixed-new-tokens-max", "48"]).exit_code == 0
    assert seen.pop().mixed_schedule == mixed.Schedule((1, 64, 1), opts.mixed_per_phase, 16, 48)
    assert opts.mixed_variants == ()
    args += ["--mixed-variant", "prefill-kv:DYNSPEC_PREFILL_KV=1+DYNSPEC_DRAFT_KV=kv-direct", "--mixed-variant", "b:X="]
    assert CliRunner().invoke(proof, args).exit_code == 0
    assert seen[2].mixed_variants == (
        ("prefill-kv", (("DYNSPEC_PREFILL_KV", "1"), ("DYNSPEC_DRAFT_KV", "kv-direct"))),
        ("b", (("X", ""),)),
    )


def test_auto_brings_levels_and_a_ramp_past_its_ceiling_unless_told_otherwise(tmp_path, monkeypatch):
    seen = []

    def fake_run_proof(opts, progress):
        seen.append(opts)
        opts.out.mkdir(parents=True, exist_ok=True)
        return {"crossings": {"passed": True, "problems": [], "detail": "ok"}}

    monkeypatch.setattr(command, "run_proof", fake_run_proof)
    out = ["--out", str(tmp_path / "o"), "--checks", "equivalence,crossings"]
    for args in (
        ["--threshold", "auto"],
        ["--threshold", "auto", "--levels", "1,200", "--ramp", "2,150"],
        ["--threshold", "8"],
    ):
        assert CliRunner().invoke(proof, [*args, *out]).exit_code == 0
    auto, told, fixed = seen
    assert (auto.threshold, auto.levels, auto.ramp_low, auto.ramp_high) == ("auto", (1, 4, 16, 48, 128), 1, 128)
    assert (told.levels, told.ramp_low, told.ramp_high) == ((1, 200), 2, 150)
    assert (fixed.threshold, fixed.levels, fixed.ramp_high) == (8, (1, 4, 16, 48), 64)


def test_plot_only_reads_a_report_and_says_why_it_cannot_draw(tmp_path, monkeypatch):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"throughput": {"levels": [1], "base": [1.0], "always_on": [2.0], "dynspec": None}}))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = CliRunner().invoke(proof, ["--plot", str(report), "--out", str(tmp_path / "png")])
    assert result.exit_code == 1
    assert "no plot: matplotlib is not installed" in result.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert CliRunner().invoke(proof, ["--plot", str(bad)]).exit_code == 2


@pytest.mark.parametrize("parallel", [1, 3], ids=["one-at-a-time", "parallel-starts"])
def test_sigterm_stops_the_servers_and_leaves_a_report(site, tmp_path, parallel):
    """With --parallel-starts 3 the servers waiting their turn (always-on, base) are up too: stopped as well."""
    out = tmp_path / "out"
    given = {**os.environ, **env_for(site(), FAKE_SGLANG_DELAY="30")}
    env = {k: v for k, v in given.items() if v is not None}
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}{os.pathsep}{REPO}"
    cmd = [sys.executable, "-m", "patcher.proof", "--threshold", "4", "--levels", "1,8", "--checks", "equivalence",
           "--port", str(some_port()), "--out", str(out), "--parallel-starts", str(parallel)]  # fmt: skip
    run = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    log = out / "dynspec.log"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "ready to roll" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.1)
    time.sleep(0.5)  # a level is in flight now
    logs = [out / f"{name}.log" for name in ("dynspec", "always-on", "base")[:parallel]]
    pids = [int(re.findall(r"scheduler pid (\d+)", f.read_text())[0]) for f in logs]
    assert all(alive(pid) for pid in pids)
    assert (out / "always-on.log").exists() is (parallel > 1)  # one at a time: not started yet
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 128 + signal.SIGTERM, err
    assert not [pid for pid in pids if alive(pid)]
    saved = json.loads((out / "report.json").read_text())
    assert saved["complete"] is False
    assert [s["stopped_by"] for s in saved["servers"]] == ["SIGTERM"] * parallel


def test_the_package_imports_neither_click_nor_the_engines_libraries():
    code = (
        "import sys\n"
        "import patcher.proof, patcher.proof.run, patcher.proof.plot, patcher.proof.report\n"
        "bad = [m for m in ('click', 'libcst', 'git', 'rich', 'matplotlib') if m in sys.modules]\n"
        "import patcher.proof.command\n"
        "worse = [m for m in ('libcst', 'git', 'rich') if m in sys.modules]\n"
        "print(bad, worse)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[] []"


def test_only_the_command_module_imports_click():
    importers = sorted(
        p.name for p in PROOF.glob("*.py") if re.search(r"^\s*(import click|from click)", p.read_text(), re.M)
    )
    assert importers == ["command.py"]


def test_python_m_patcher_proof_shows_help():
    done = subprocess.run(
        [sys.executable, "-m", "patcher.proof", "--help"], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert "Exit codes: 0 every check passed, 1 a check failed, 2 bad usage." in done.stdout
