"""RewardClient, RewardModelEnvironment (in process vs remote), a bounded load test, SIGTERM shutdown."""

from __future__ import annotations

import random
import signal
import threading
import time

import httpx
import pytest
import torch
from serve_helpers import API_KEY, CONVERSATIONS, TEXTS, Server

from rmkit.env import EnvironmentReturn, RewardModelEnvironment
from rmkit.errors import ConfigError
from rmkit.serve import RewardClient, RewardServerError, ScoringEngine
from rmkit.serve.process import free_port

TOL = 1e-5


@pytest.fixture(scope="module")
def expected(bt_model_dir):
    """Rewards of every text, scored in process one at a time."""
    engine = ScoringEngine(bt_model_dir)
    return {text: engine.score_texts([text])[0, 0].item() for text in TEXTS}


def test_client_batches_concurrently_and_keeps_order(bt_server, expected):
    texts = TEXTS * 5  # 40 texts -> 14 requests of 3, three at a time
    with RewardClient(bt_server.url, api_key=API_KEY, batch_size=3, concurrency=3) as client:
        assert client.score_texts(texts) == pytest.approx([expected[t] for t in texts], abs=TOL)
        assert len(client.score_conversations(CONVERSATIONS)) == 3


def test_readme_grpo_example_scores_a_group_and_computes_advantages(bt_server, bt_model_dir):
    from rmkit.losses import grpo_group_advantages

    prompt = [{"role": "user", "content": "what is the capital of france"}]
    completions = ["paris", "berlin", "the capital is paris", "no"]
    conversations = [prompt + [{"role": "assistant", "content": c}] for c in completions]
    with RewardClient(bt_server.url, api_key=API_KEY, batch_size=2, concurrency=2) as client:
        rewards = torch.tensor(client.score_conversations(conversations))
    advantages = grpo_group_advantages(rewards, group_size=4, use_leave_one_out_baseline=False, normalize_rewards=False)
    local = ScoringEngine(bt_model_dir).score_conversations(conversations)[:, 0]
    torch.testing.assert_close(rewards, local, atol=TOL, rtol=0)
    torch.testing.assert_close(advantages, local - local.mean(), atol=TOL, rtol=0)


def test_client_raises_on_4xx_without_retrying(bt_server):
    with RewardClient(bt_server.url, api_key="wrong", max_retries=3, backoff=5.0) as client:
        start = time.monotonic()
        with pytest.raises(RewardServerError, match="401 missing or wrong API key") as err:
            client.score_texts(["a dog"])
        assert err.value.status == 401 and time.monotonic() - start < 4.0  # no 5 s backoff happened


def test_client_retries_connection_errors_then_gives_up():
    with RewardClient(f"http://127.0.0.1:{free_port()}", max_retries=2, backoff=0.01) as client:
        with pytest.raises(RewardServerError, match="failed after 3 attempts: ConnectError"):
            client.score_texts(["a dog"])


def test_environment_in_process_and_remote_give_the_same_rewards(bt_model_dir, bt_server):
    logs = [[*c, ] for c in CONVERSATIONS]
    logs[0] = [{**m, "token_ids": torch.tensor([1, 2])} for m in logs[0]]  # NeMo RL's extra keys are ignored
    infos = [{"i": i} for i in range(len(logs))]
    local = RewardModelEnvironment({"model_name": str(bt_model_dir), "precision": "float32", "enabled": True})
    remote = RewardModelEnvironment({"url": bt_server.url, "api_key": API_KEY, "batch_size": 2})
    out_local, out_remote = local.step(logs, infos), remote.step(logs, infos)
    assert isinstance(out_local, EnvironmentReturn)
    assert out_local.rewards.dtype == torch.float32 and out_local.rewards.shape == (3,)
    torch.testing.assert_close(out_remote.rewards, out_local.rewards, atol=TOL, rtol=0)
    assert out_local.terminateds.tolist() == [True] * 3 and out_local.metadata == infos
    assert out_local.next_stop_strings == [None] * 3 and out_local.answers is None
    assert out_local.observations[0]["role"] == "environment"
    batch, metrics = local.global_post_process_and_metrics({"rewards": out_local.rewards})
    r = out_local.rewards.tolist()
    mean = sum(r) / 3
    assert metrics["reward_model_env/num_samples"] == 3
    assert metrics["reward_model_env/mean_reward"] == pytest.approx(mean)
    assert metrics["reward_model_env/std_reward"] == pytest.approx((sum((x - mean) ** 2 for x in r) / 2) ** 0.5)
    assert metrics["reward_model_env/min_reward"] == min(r) and metrics["reward_model_env/max_reward"] == max(r)
    local.shutdown()
    remote.shutdown()


def test_environment_remote_regression_uses_weighted_scalar(reg_model_dir, reg_server):
    conversations = [[{"role": "user", "content": "hello"}], [{"role": "user", "content": "no"}]]
    local = RewardModelEnvironment({"model_name": str(reg_model_dir), "attribute_weights": [0.5, 0.3, 0.2],
                                    "max_length": 8})
    remote = RewardModelEnvironment({"url": reg_server.url})
    torch.testing.assert_close(remote.step(conversations, [None, None]).rewards,
                               local.step(conversations, [None, None]).rewards, atol=TOL, rtol=0)


def test_environment_config_errors(reg_model_dir):
    with pytest.raises(ConfigError, match="exactly one of"):
        RewardModelEnvironment({})
    with pytest.raises(ConfigError, match="env.batchsize"):
        RewardModelEnvironment({"model_name": "x", "batchsize": 2})
    with pytest.raises(ConfigError, match="needs weights"):
        RewardModelEnvironment({"model_name": str(reg_model_dir)})


def test_load_8_concurrent_clients_zero_errors_every_response_correct(bt_server, expected):
    """8 threads x 40 requests of 1-4 texts each; every reward checked against its offline value."""
    failures: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=bt_server.url, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            for _ in range(40):
                texts = rng.sample(TEXTS, rng.randint(1, 4))
                response = http.post("/v1/score", json={"texts": texts}, timeout=30)
                if response.status_code != 200:
                    failures.append(f"{response.status_code} {response.text}")
                elif response.json()["rewards"] != pytest.approx([expected[t] for t in texts], abs=TOL):
                    failures.append(f"wrong rewards for {texts}: {response.json()['rewards']}")

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    metrics = httpx.get(bt_server.url + "/metrics").text
    # Dynamic batching happened: some model group merged more than one request.
    groups = next(line for line in metrics.splitlines() if line.startswith('rmkit_batch_requests_bucket{le="1"}'))
    count = next(line for line in metrics.splitlines() if line.startswith("rmkit_batch_requests_count"))
    assert int(groups.split()[1]) < int(count.split()[1])


def test_sigterm_finishes_the_in_flight_requests_and_exits_0(reg_model_dir):
    """A server of its own (the shared ones serve other tests, in any order and on any worker) with a 1 s batch
    window: SIGTERM arrives once /metrics shows a batch of 4 requests waiting in it, and every request must
    still get its answer."""
    batch = [["a dog"], ["hello world yes", "no"], ["the cat sat on the mat"], ["good answer", "bad answer", "no"]]
    results = {}
    with Server(reg_model_dir, "--max-length", "8", "--batch-window-ms", "1000") as server:

        def request(i: int) -> None:
            results[i] = httpx.post(server.url + "/v1/score", json={"texts": batch[i]}, timeout=30)

        threads = [threading.Thread(target=request, args=(i,)) for i in range(len(batch))]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 20
        while f"rmkit_queue_depth {len(batch)}" not in httpx.get(server.url + "/metrics").text:
            assert time.monotonic() < deadline, "the requests never reached the queue together"
            time.sleep(0.02)
        server.proc.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join()
        assert server.proc.wait(timeout=30) == 0, server.output()
    assert [r.status_code for r in results.values()] == [200] * len(batch)
    assert all(len(results[i].json()["rewards"]) == len(texts) for i, texts in enumerate(batch))
