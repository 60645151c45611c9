"""`rmkit grpo` against a real `rmkit serve` that goes away mid-run (SIGKILL): restarted on the same port within
`env.reward_model.retry_deadline`, the run waits and ends exactly as a run whose server stayed up; gone past it,
the run stops (exit 1) naming the URL and the last checkpoint. Both runs are real processes on 127.0.0.1."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rmkit import cli
from rmkit.serve.process import ServerProcess, free_port
from tests.recipes.conftest import grpo_overrides
from tests.support.launch import CHILD_ENV
from tests.support.runs import logged_metrics, logged_step, wait_for_step

STEPS = 8
VARYING = ("timing/", "train/generated_tokens_per_s")  # wall-clock numbers differ between runs
# A 300 ms batch window makes every scoring request take that long, so the run is still going when it is killed.
SERVE_ARGS = ("--batch-window-ms", "300")


def _args(policy, prompt_files, out: Path, url: str, *extra: str) -> list[str]:
    train, val = prompt_files
    args = grpo_overrides(policy, "x", train, val, out, steps=STEPS)
    return [*[a for a in args if not a.startswith("env.")], f"env.reward_model.url={url}", "grpo.val_period=4",
            "logger.plots=false", "checkpointing.save_period=2", "grpo.max_num_epochs=2", *extra]


def _start_grpo(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rmkit", "grpo", *args], env=CHILD_ENV,
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"))  # noqa: SIM115 (closed with the child)


@pytest.mark.slow
def test_a_server_restarted_mid_run_changes_nothing(tiny_policy, tiny_reward_model, prompt_files, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = ServerProcess(tiny_reward_model, *SERVE_ARGS, env=CHILD_ENV, port=port).wait_ready()
    try:
        outage, log = tmp_path / "outage", tmp_path / "outage.log"
        proc = _start_grpo(_args(tiny_policy, prompt_files, outage, url), log)
        wait_for_step(proc, outage, 2, log)
        server.proc.kill()  # gone mid-run, its requests in flight with it
        server.stop()
        time.sleep(2.0)
        assert proc.poll() is None, log.read_text()[-4000:]  # the run waits
        server = ServerProcess(tiny_reward_model, *SERVE_ARGS, env=CHILD_ENV, port=port).wait_ready()
        assert proc.wait(timeout=300) == 0, log.read_text()[-4000:]
        err = log.read_text()
        assert f"rmkit: reward server {url} did not answer" in err and f"{url} answers again after" in err

        reference = tmp_path / "reference"
        assert cli.main(["grpo", *_args(tiny_policy, prompt_files, reference, url)]) == 0
    finally:
        server.stop()
    assert logged_step(outage) == STEPS and logged_metrics(outage, VARYING) == logged_metrics(reference, VARYING)
    expected, got = load_file(reference / "final" / "model.safetensors"), load_file(outage / "final" / "model.safetensors")
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)
    assert (outage / "logs" / "samples.jsonl").read_text() == (reference / "logs" / "samples.jsonl").read_text()


@pytest.mark.slow
def test_a_server_gone_past_the_deadline_stops_the_run_naming_url_and_checkpoint(tiny_policy, tiny_reward_model,
                                                                                  prompt_files, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    out, log = tmp_path / "run", tmp_path / "run.log"
    with ServerProcess(tiny_reward_model, *SERVE_ARGS, env=CHILD_ENV, port=port) as server:
        proc = _start_grpo(_args(tiny_policy, prompt_files, out, url, "env.reward_model.retry_deadline=3"), log)
        wait_for_step(proc, out, 2, log)
        server.proc.kill()
    start = time.monotonic()
    assert proc.wait(timeout=120) == 1, log.read_text()[-4000:]
    assert time.monotonic() - start < 60  # stopped at its deadline (3 s, plus the step's own work)
    err = log.read_text()
    assert "rmkit grpo: stopped: the reward server failed at step" in err and "no update was applied" in err
    assert f"{url}/v1/score failed after" in err and "retry deadline 3 s" in err
    assert "Traceback" not in err and not (out / "final").exists()
    last = max(out.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    assert f"rmkit grpo: last checkpoint: {last} (continue from it with --resume)" in err
