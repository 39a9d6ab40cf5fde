"""`dynspec remote` and `dynspec bundle`: the engine's plan, written into SGLang trees of other machines.

A server needs nothing but python3 >= 3.9: what runs there is shipped to it, over the ssh pipe or
inside a zipapp, under the names it has always had there (``client.SHIPPED``, in load order:
``dynspec_txn``, ``dynspec_treefacts``, ``dynspec_applier``). The modules, each importing only those
listed before it:

``applier``   the server side, standard library only: finds the tree, sends a snapshot, checks
              every pre-image and writes through ``txn.Tree.commit``; ``bundle_main`` runs a zipapp;
``client``    the local side: ssh, the conversation with the applier, the snapshot as a tree the
              engine reads, one command on one host or many;
``bundle``    `dynspec bundle`: the plan for one release and the zipapp that carries it;
``command``   the click commands ``remote`` and ``bundle``, which patcher/cli.py registers.

Nothing here imports click or rich but ``command``, and nothing outside this package imports it but
patcher/cli.py: the engine knows no tool. This module hands on the public names of ``client`` and
``bundle``, imported when one of them is first used: ``dynspec`` imports ``command`` at every
start, and that imports this package, not the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from patcher.faces import lazy_names

if TYPE_CHECKING:
    from patcher.remote.bundle import MAIN, PLAN_FORMAT, Built, archive, build, make_plan, pristine_package
    from patcher.remote.client import (
        BOOTSTRAP,
        OPS,
        SHIPPED,
        TOO_OLD,
        Connection,
        HostResult,
        RemoteCrash,
        RemoteTree,
        SnapshotTree,
        Ssh,
        classify,
        exit_code,
        open_snapshot,
        program,
        run,
        run_many,
        shipped_sources,
    )

__all__ = [
    "BOOTSTRAP",
    "MAIN",
    "OPS",
    "PLAN_FORMAT",
    "SHIPPED",
    "TOO_OLD",
    "Built",
    "Connection",
    "HostResult",
    "RemoteCrash",
    "RemoteTree",
    "SnapshotTree",
    "Ssh",
    "archive",
    "build",
    "classify",
    "exit_code",
    "make_plan",
    "open_snapshot",
    "pristine_package",
    "program",
    "run",
    "run_many",
    "shipped_sources",
]

if not TYPE_CHECKING:  # mypy reads the imports above instead, so it still knows each name and its type
    __getattr__ = lazy_names(__name__, ("client", "bundle"), __all__)
