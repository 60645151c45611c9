"""A real `rmkit serve` in a child process on a free loopback port: what `rmkit parity`, the tests and the
serving benchmark talk to over HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """`python -m rmkit serve --model DIR --port P [extra ...]` bound to 127.0.0.1; a context manager
    that waits until `/health` answers and stops the server (SIGTERM, then SIGKILL) on exit.

    Args:
        model_dir: the model directory to serve.
        extra: more `rmkit serve` arguments.
        env: extra environment variables for the child (e.g. `PYTHONPATH`, `OMP_NUM_THREADS`).
        log_path: where the child's output goes (default: a temporary file).
        port: the port (default: a free one); a server restarted on its predecessor's port is the same URL.
    """

    def __init__(self, model_dir: str | Path, *extra: str, env: dict[str, str] | None = None,
                 log_path: str | Path | None = None, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_path, "w+") if log_path else tempfile.TemporaryFile("w+")  # noqa: SIM115
        cmd = [sys.executable, "-m", "rmkit", "serve", "--model", str(model_dir), "--host", "127.0.0.1",
               "--port", str(self.port), "--log-level", "warning", *extra]
        self.proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=self.log,
                                     stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120.0) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rmkit serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"rmkit serve was not ready after {timeout} s:\n{self.output()}")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __enter__(self) -> ServerProcess:
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
