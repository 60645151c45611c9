"""Launching `torchrun` from tests: a free port, and a run that cannot leave ranks behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args: list[str], env: dict, nproc: int = 2, timeout: float = 300, returncode: int = 0) -> str:
    """`python -m torch.distributed.run --nproc-per-node N ... ARGS` on 127.0.0.1; returns its stderr once it
    exits with `returncode`.

    The launcher gets a session of its own, so on a timeout it dies together with its ranks.
    """
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *args,
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"torchrun did not finish in {timeout} s:\n{err[-5000:]}")
    assert proc.returncode == returncode, err[-5000:]
    return err
