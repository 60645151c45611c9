"""A recipe run from tests as a user runs it: its logged metrics read back, and the run killed with SIGKILL once its
log reaches a step (the resume tests)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.launch import CHILD_ENV


def logged_step(out: Path) -> int:
    """The highest step in `<out>/logs/metrics.jsonl`, 0 before it exists; its last line is left out (it may be half
    written)."""
    try:
        lines = (out / "logs" / "metrics.jsonl").read_text().splitlines()[:-1]
    except FileNotFoundError:
        return 0
    return max((json.loads(line)["step"] for line in lines), default=0)


def logged_metrics(out: Path, varying: tuple[str, ...] = ()) -> list[dict]:
    """Every record of `<out>/logs/metrics.jsonl`, less the keys that start with one of `varying` (the wall-clock
    figures, which differ between two runs of the same computation)."""
    records = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not (varying and k.startswith(varying))} for r in records]


def wait_for_step(proc: subprocess.Popen, out: Path, step: int, log: Path | None = None, timeout: float = 300) -> None:
    """Return once `proc`, a run writing `out`, has logged `step`; fail with the end of its stderr (the pipe, or the
    file `log`) if it ends first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while logged_step(out) < step:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before step {step}: {_stderr_tail(proc, log)}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the run logged no step {step} within {timeout:.0f} s: {_stderr_tail(proc, log)}")
        time.sleep(0.002)


def kill_at_step(args: list[str], out: Path, step: int) -> None:
    """`python -m rmkit ARGS` (a run writing `out`) started as a process of its own and SIGKILLed once it has logged
    `step`; checks that the signal ended it before it wrote `final/`."""
    proc = subprocess.Popen([sys.executable, "-m", "rmkit", *map(str, args)], env=CHILD_ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_step(proc, out, step)
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err[-3000:]
    assert not (out / "final").exists(), f"the run finished before it was killed at step >= {step}"


def _stderr_tail(proc: subprocess.Popen, log: Path | None) -> str:
    if log is not None:
        return log.read_text()[-4000:]
    return proc.stderr.read()[-4000:] if proc.stderr is not None else ""
