from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from patcher.proof import launch
from patcher.proof.servers import free_port

from .fake_sglang import State, serve

HERE = Path(__file__).resolve().parent

LAUNCH_SERVER = f"""\
import sys
sys.path.insert(0, {str(HERE)!r})
import fake_sglang
fake_sglang.main(sys.argv[1:])
"""

SiteFactory = Callable[..., Path]


def make_site(
    root: Path,
    *,
    applied: bool = True,
    workers: tuple[str, ...] = ("v1", "v2"),
    version: str = "0.5.12",
    adaptive: bool = False,
    deterministic: bool = True,
    gc_warning: bool = False,
) -> Path:
    """A site dir holding a fake ``sglang`` package whose launch_server is fake_sglang."""
    pkg = root / "sglang"
    (pkg / "srt" / "speculative").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_version.py").write_text(f"__version__ = version = {version!r}\n")
    (pkg / "launch_server.py").write_text(LAUNCH_SERVER)
    field = "    speculative_disable_batch_size: Optional[int] = None\n" if applied else ""
    if adaptive:
        field += "    speculative_adaptive: bool = False\n    speculative_adaptive_config: Optional[str] = None\n"
    if deterministic:  # 0.5.3+
        field += "    enable_deterministic_inference: bool = False\n"
    if gc_warning:  # 0.5.11 - 0.5.17
        field += "    gc_warning_threshold_secs: float = 0.0\n"
    (pkg / "srt" / "server_args.py").write_text(
        f"class ServerArgs:\n    speculative_num_draft_tokens: Optional[int] = None\n{field}"
    )
    names = {"v1": "eagle_worker.py", "v2": "eagle_worker_v2.py"}
    for w in workers:
        (pkg / "srt" / "speculative" / names[w]).write_text("")
    return root


@pytest.fixture
def site(tmp_path: Path) -> SiteFactory:
    count = iter(range(100))

    def factory(**kwargs: object) -> Path:
        return make_site(tmp_path / f"site{next(count)}", **kwargs)  # type: ignore[arg-type]

    return factory


def some_port() -> int:
    """A free port at a random place, so test runs side by side rarely race for one."""
    return free_port(random.randrange(20000, 60000))


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


@pytest.fixture
def fake_server() -> Iterator[Callable[..., tuple[int, State]]]:
    """Start fake SGLang HTTP servers in threads: ``port, state = fake_server(disable=4)``."""
    servers = []

    def start(
        disable: int | None = None,
        enable: int | None = None,
        speculative: bool = False,
        faults: str = "",
        delay: float = 0.05,
    ) -> tuple[int, State]:
        state = State(disable, enable, speculative, set(filter(None, faults.split(","))))
        state.delay = delay
        state.quiet = True
        server = serve(state)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server.server_address[1], state

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def real_dir(root: Path) -> Path:
    """A ``dynspec real prepare`` dir the fake server can serve: configs, five prompts, model.json."""
    for sub in (launch.REAL_TARGET, launch.REAL_DRAFT):
        (root / sub).mkdir(parents=True)
        (root / sub / "config.json").write_text("{}")
    prompts = [{"id": f"p{i}", "input_ids": [1, 2 + i, 3, 4 + i]} for i in range(5)]
    (root / launch.REAL_PROMPTS).write_text(json.dumps({"prompts": prompts}))
    (root / launch.REAL_INFO).write_text(
        json.dumps({"name": "tiny-real", "gguf_sha256": "ab" * 32, "head_sha256": None})
    )
    return root
