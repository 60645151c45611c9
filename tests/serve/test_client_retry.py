"""A reward server that goes away: `RewardClient`'s retry schedule and deadline, a server that comes back, and
answers that are not rewards (a wrong count, a non-number, not JSON, NaN), over real HTTP on 127.0.0.1.

The answering server here is a plain `http.server` that returns a fixed body: what a broken proxy or a
different service on the port would send. `rmkit serve` itself never answers so.
"""

from __future__ import annotations

import inspect
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from rmkit.env import RewardModelEnvironment
from rmkit.errors import RolloutFailed
from rmkit.recipes.configs import RewardModelEnvConfig
from rmkit.rl.rollout import Rollout, score_rollout
from rmkit.serve import RewardClient, RewardServerError
from rmkit.serve.client import retry_delays
from rmkit.serve.process import free_port
from rmkit.trainer.datasets import PromptItem


class FixedAnswer:
    """`POST /v1/score` answered with `body` (a string sent as is) and `status`, on `port` (default: a free one)."""

    def __init__(self, body: str, status: int = 200, port: int | None = None):
        answer = body.encode()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port or 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_default_schedule_rides_out_a_60_s_outage():
    """Client and `env.reward_model` defaults agree, and their waits add up to the deadline (120 s >= 60 s),
    none longer than 10 s, so a server back after a minute is found within 10 s of its return."""
    defaults = {k: p.default for k, p in inspect.signature(RewardClient).parameters.items()}
    cfg = RewardModelEnvConfig()
    assert (cfg.retry_deadline, cfg.max_retries) == (defaults["retry_deadline"], defaults["max_retries"]) == (120.0, None)
    waits = list(retry_delays(defaults["backoff"], defaults["max_backoff"], defaults["retry_deadline"]))
    assert waits[:4] == [0.25, 0.5, 1.0, 2.0] and max(waits) == 10.0
    assert sum(waits) == pytest.approx(120.0) and sum(waits) >= 60
    assert list(retry_delays(0.25, 10.0, 1.0)) == [0.25, 0.5, 0.25]  # the last wait cut to end at the deadline
    assert list(retry_delays(0.01, 10.0, 120.0, max_retries=2)) == [0.01, 0.02]
    assert list(retry_delays(0.25, 10.0, 0.0)) == []


def test_a_server_that_stays_down_fails_at_the_deadline_naming_the_url(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    with RewardClient(url, retry_deadline=1.0, backoff=0.05) as client:
        start = time.monotonic()
        with pytest.raises(RewardServerError, match=r"failed after \d+ attempts: ConnectError.*\(retried for 1\.\d s; "
                                                    r"retry deadline 1 s\)") as err:
            client.score_texts(["a dog"])
    assert 1.0 <= time.monotonic() - start < 3.0 and url in str(err.value)
    assert f"rmkit: reward server {url} did not answer" in capsys.readouterr().err


def test_a_server_that_comes_back_gets_the_request_answered(capsys):
    """Nothing listens on the port for 1.5 s; then a server starts there and the waiting request gets its answer."""
    port = free_port()
    result = {}
    with RewardClient(f"http://127.0.0.1:{port}", retry_deadline=30.0, backoff=0.05) as client:
        thread = threading.Thread(target=lambda: result.setdefault("rewards", client.score_texts(["a", "b"])))
        thread.start()
        time.sleep(1.5)
        assert thread.is_alive()  # still waiting
        server = FixedAnswer(json.dumps({"rewards": [0.5, -1.0]}), port=port)
        try:
            thread.join(timeout=20)
        finally:
            server.close()
    assert result["rewards"] == [0.5, -1.0]
    err = capsys.readouterr().err
    assert "did not answer" in err and "answers again after" in err


@pytest.mark.parametrize(("body", "match"), [
    ('{"rewards": [0.5]}', "answered 1 rewards for 2 inputs"),
    ('{"rewards": [0.5, 1.0, 2.0]}', "answered 3 rewards for 2 inputs"),
    ('{"oops": 1}', r"answered \{'oops': 1\} for 2 inputs"),
    ('{"rewards": ["0.5", 1.0]}', "answered '0.5' as a reward"),
    ('{"rewards": [true, 1.0]}', "answered True as a reward"),
    ("<html>bad gateway</html>", "not JSON"),
])
def test_a_malformed_answer_is_an_error_never_a_reward(body, match):
    server = FixedAnswer(body)
    try:
        with RewardClient(server.url) as client, pytest.raises(RewardServerError, match=match) as err:
            client.score_texts(["a", "b"])
        assert "malformed answer" in str(err.value)
    finally:
        server.close()


def _rollout(n: int) -> Rollout:
    prompts = [PromptItem(f"prompts.jsonl:{i + 1}", f"prompt {i}", [1, 2]) for i in range(n)]
    return Rollout(prompts, torch.arange(n), [[3]] * n, [f"answer {i}" for i in range(n)], [torch.zeros(1)] * n,
                   torch.zeros(n, dtype=torch.bool))


@pytest.mark.parametrize(("body", "match"), [
    ('{"scores": [0.5, NaN]}', r"returned nan for a completion of the prompt at prompts.jsonl:2 \('prompt 1'\)"),
    ('{"scores": [0.5]}', "answered 1 scores for 2 inputs"),
    ('{"scores": {"a": 1}}', "malformed answer"),
])
def test_a_rollout_with_a_bad_answer_stops_before_any_update(body, match):
    server = FixedAnswer(body)
    env = RewardModelEnvironment({"url": server.url})
    try:
        with pytest.raises(RolloutFailed, match=match) as err:
            score_rollout(env, _rollout(2), step=0)
        assert "at step 1" in str(err.value) and "no update was applied" in str(err.value)
    finally:
        env.shutdown()
        server.close()


def test_nan_on_the_wire_is_read_as_nan_not_replaced():
    server = FixedAnswer('{"rewards": [NaN, 1.5]}')
    try:
        with RewardClient(server.url) as client:
            rewards = client.score_texts(["a", "b"])
        assert math.isnan(rewards[0]) and rewards[1] == 1.5
    finally:
        server.close()
