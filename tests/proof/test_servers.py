from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

from patcher.proof.errors import ServerStartError
from patcher.proof.servers import Server, ServerSpec, free_port, group_listens_on, group_members, port_is_free

from .conftest import HERE, alive, some_port

FAKE_PROCS = str(HERE / "fake_procs.py")


def spec(tmp_path: Path, argv: list[str], port: int = 1, name: str = "s") -> ServerSpec:
    return ServerSpec(name, tuple(argv), dict(os.environ), tmp_path / f"{name}.log", port)


def wait_for_pids(pidfile: Path, n: int) -> list[int]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if pidfile.exists():
            pids = [int(x) for x in pidfile.read_text().split()]
            if len(pids) == n:
                return pids
        time.sleep(0.05)
    raise AssertionError(f"{pidfile} did not list {n} pids")


def test_a_polite_group_stops_on_sigterm_and_nothing_survives(tmp_path):
    pidfile = tmp_path / "pids"
    server = Server(spec(tmp_path, [sys.executable, FAKE_PROCS, str(pidfile), "polite"]), stop_timeout=10)
    with server:
        pids = wait_for_pids(pidfile, 3)
        assert all(alive(p) for p in pids)
        assert sorted(group_members(server.pgid)) == sorted(pids)
        assert os.getpgid(pids[0]) == os.getpgid(pids[2]) != os.getpgid(0)  # own group, not ours
    assert server.stopped_by == "SIGTERM"
    assert not any(alive(p) for p in pids)
    assert "leader" in (tmp_path / "s.log").read_text()  # the log is kept


def test_children_that_ignore_sigterm_are_killed_after_the_grace_period(tmp_path):
    pidfile = tmp_path / "pids"
    server = Server(spec(tmp_path, [sys.executable, FAKE_PROCS, str(pidfile), "stubborn"]), stop_timeout=1)
    server.start()
    pids = wait_for_pids(pidfile, 3)
    start = time.monotonic()
    assert server.stop() == "SIGKILL"
    assert 1 <= time.monotonic() - start < 10
    assert not any(alive(p) for p in pids)
    assert group_members(server.pgid) == []
    assert server.stop() == "SIGKILL"  # idempotent


def test_servers_asked_to_stop_together_all_get_sigterm_before_any_is_waited_for(tmp_path):
    """A group measured together is stopped together: ``begin_stop`` sends each its SIGTERM at once
    (every leader gone before the first ``stop`` waits), and ``stop`` then waits and says what it
    took. A server not asked (the control) keeps running until its own ``stop``."""
    servers = {}
    for name, mode in (("a", "polite"), ("b", "stubborn"), ("c", "polite")):
        servers[name] = Server(
            spec(tmp_path, [sys.executable, FAKE_PROCS, str(tmp_path / name), mode], name=name), stop_timeout=1
        )
        servers[name].start()
    pids = {name: wait_for_pids(tmp_path / name, 3) for name in servers}
    servers["a"].begin_stop()
    servers["b"].begin_stop()
    servers["b"].begin_stop()  # once is enough: no second signal, no error
    deadline = time.monotonic() + 10
    while (alive(pids["a"][0]) or alive(pids["b"][0])) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pids["a"][0]) and not alive(pids["b"][0])  # both leaders took SIGTERM, no stop() yet
    assert all(alive(p) for p in pids["c"]) and all(
        alive(p) for p in pids["b"][1:]
    )  # c unasked; b's children ignore it
    assert [servers[n].stop() for n in "abc"] == ["SIGTERM", "SIGKILL", "SIGTERM"]
    assert not any(alive(p) for group in pids.values() for p in group)


def test_a_server_gone_before_begin_stop_is_said_to_have_exited(tmp_path):
    server = Server(spec(tmp_path, [sys.executable, "-c", "pass"]))
    server.start()
    assert server.popen is not None and server.popen.wait(timeout=10) == 0
    server.begin_stop()
    assert server.stop() == "exited"


def test_leaving_the_block_by_an_exception_stops_the_group(tmp_path):
    pidfile = tmp_path / "pids"
    server = Server(spec(tmp_path, [sys.executable, FAKE_PROCS, str(pidfile), "polite"]), stop_timeout=5)
    with pytest.raises(KeyboardInterrupt), server:
        pids = wait_for_pids(pidfile, 3)
        raise KeyboardInterrupt
    assert not any(alive(p) for p in pids)


def test_a_server_that_dies_while_starting_is_reported_with_its_log(tmp_path):
    argv = [sys.executable, "-c", "print('loading'); print('RuntimeError: no GPU', flush=True); raise SystemExit(3)"]
    server = Server(spec(tmp_path, argv, port=some_port()))
    with (
        pytest.raises(ServerStartError, match=r"exited with code 3 before answering(.|\n)*RuntimeError: no GPU"),
        server,
    ):
        server.wait_ready(timeout=30, poll_interval=0.05)
    assert server.stopped_by == "exited"


def test_a_server_that_never_answers_times_out_with_progress_and_is_stopped(tmp_path):
    pidfile = tmp_path / "pids"
    notes: list[str] = []
    argv = [sys.executable, FAKE_PROCS, str(pidfile), "polite"]
    server = Server(spec(tmp_path, argv, port=some_port()), stop_timeout=5, progress=notes.append)
    with pytest.raises(ServerStartError, match="did not answer within 1 s"), server:
        server.wait_ready(timeout=1, poll_interval=0.05, progress_every=0.3)
    assert notes and "starting" in notes[0] and "up" in notes[-1]  # last log line is quoted
    assert not any(alive(p) for p in wait_for_pids(pidfile, 3))


def test_ready_is_when_health_answers(tmp_path, site):
    root = site()
    port = some_port()
    env = {**os.environ, "PYTHONPATH": str(root), "FAKE_SGLANG_START_DELAY": "0.5"}
    s = ServerSpec(
        "fake", (sys.executable, "-m", "sglang.launch_server", "--port", str(port)), env, tmp_path / "f.log", port
    )
    with Server(s, stop_timeout=5) as server:
        seconds = server.wait_ready(timeout=30, poll_interval=0.05)
        assert seconds >= 0.5
        assert server.client.request("GET", "/health")[0] == 200
        assert group_listens_on(server.pgid, port) is True
        text = (tmp_path / "f.log").read_text()
        assert server.ready_offset > 0 and "ready to roll" in text
        scheduler = int(text.split("scheduler pid ")[1].split()[0])
        assert alive(scheduler)
    assert not alive(scheduler)


def test_busy_ports_are_skipped():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        assert not port_is_free(busy)
        assert free_port(busy) > busy


def test_an_answer_from_someone_elses_server_on_the_port_is_refused(tmp_path, fake_server):
    port, _ = fake_server()  # listens in this test process, not in the server's process group
    pidfile = tmp_path / "pids"
    server = Server(spec(tmp_path, [sys.executable, FAKE_PROCS, str(pidfile), "polite"], port=port), stop_timeout=5)
    with pytest.raises(ServerStartError, match=f"port {port} answers, but not from the s server"), server:
        server.wait_ready(timeout=30, poll_interval=0.05)
