"""Shared by the tensor-parallel tests: the worker processes this test process left."""

from __future__ import annotations

import os
from pathlib import Path


def leftover_workers() -> list[int]:
    """Pids of live (not zombie) tensor-parallel workers started by this process."""
    me, found = os.getpid(), []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, ppid = fields[0], int(fields[1])
        if ppid == me and state != "Z" and b"lmprog.runtime.parallel.worker" in cmdline:
            found.append(int(proc.name))
    return found
