"""Launching `torchrun` from tests: a free port, and a run that cannot leave ranks behind."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
# The environment of the rmkit processes tests start: the repository importable, one thread. A plain
# subprocess computes where the test's own process does (a GPU where one is visible); `start_torchrun` adds
# the CPU to it, so a comparison with torchrun's ranks starts its one-process side through torchrun too.
CHILD_ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", "RMKIT_NUM_THREADS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_torchrun(args: list[str], env: dict, nproc: int = 2) -> subprocess.Popen:
    """`python -m torch.distributed.run --nproc-per-node N ... ARGS` on 127.0.0.1, started, not awaited;
    stop it with `kill_all`."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *args,
    ]  # fmt: skip
    # gloo processes on the CPU, also where a GPU is visible. PYTHONFAULTHANDLER: a rank that dies of a signal
    # prints every thread's Python stack to the stderr a failing test shows (one 2-rank CI run in many aborted at
    # exit with "terminate called without an active exception", and nothing said where).
    env = {**env, "CUDA_VISIBLE_DEVICES": "", "PYTHONFAULTHANDLER": "1"}
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def torchrun(args: list[str], env: dict, nproc: int = 2, timeout: float = 300, returncode: int = 0) -> str:
    """`start_torchrun`, awaited; returns its stderr once it exits with `returncode`. On a timeout the launcher
    dies together with its ranks."""
    proc = start_torchrun(args, env, nproc)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_all(proc)
        _, err = proc.communicate()
        pytest.fail(f"torchrun did not finish in {timeout} s:\n{err[-5000:]}")
    assert proc.returncode == returncode, err[-5000:]
    return err


def kill_all(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and every process below it. torchrun starts each rank in a session of its own,
    out of reach of `os.killpg` on the launcher's; the parent links in /proc find them."""
    for pid in [*_descendants(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _descendants(root: int) -> list[int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "(comm)", which may hold spaces
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found
