"""A process tree for the process-group tests: leader -> child -> grandchild.

``python fake_procs.py PIDFILE MODE``; MODE ``polite`` (everyone dies on SIGTERM) or
``stubborn`` (the child and grandchild ignore SIGTERM). Writes all three pids to PIDFILE,
one a line, then sleeps. Nobody calls setsid, so all stay in the leader's process group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def main() -> None:
    pidfile, mode, role = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "leader"
    if mode == "stubborn" and role != "leader":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if role == "leader":
        subprocess.Popen([sys.executable, __file__, pidfile, mode, "child"])
    elif role == "child":
        subprocess.Popen([sys.executable, __file__, pidfile, mode, "grandchild"])
    with open(pidfile, "a") as f:
        f.write(f"{os.getpid()}\n")
    print(f"{role} {os.getpid()} up", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
