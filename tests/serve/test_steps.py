"""A process reward model served (`POST /v1/score_steps` over real HTTP) and as an RL reward
(`RewardModelEnvironment`, in process and through the server): the inference core's step probabilities and their
minimum (the tiny PRM's `step_aggregation`), a 400 naming the field for each bad body, and a 400 from every
whole-text route, which would otherwise read the head at a text's last token."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest
import torch
from serve_helpers import API_KEY, Server

from rmkit.env import RewardModelEnvironment, conversation_solution
from rmkit.inference import load_scorer
from rmkit.serve import RewardClient

MAX_LENGTH = 48  # the server's and the core's: short enough that LONG loses its last steps
TOL = 1e-6  # the server runs one thread, the test process several: float rounding only
SOLUTIONS = [
    ("Tom has 3 apples and buys 4. How many?", ["3 + 4 = 7.", "He has 7 apples."]),
    ("What is 6 * 7?", ["6 * 7 = 48.", "So 48.", "The answer is 48."]),
    ("Half of 18?", ["18 / 2 = 9."]),
]
LONG = ("Count to twenty.", [f"The next number is {n}, one more than {n - 1}." for n in range(1, 21)])


@pytest.fixture(scope="module")
def prm_server(tiny_prm):
    server = Server(Path(tiny_prm), "--max-length", str(MAX_LENGTH), "--max-inputs", "4", "--batch-window-ms", "2")
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def core(tiny_prm):
    return load_scorer(tiny_prm, max_length=MAX_LENGTH)


def _post(server, path: str, body: dict, **headers) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=60)


def _body(solutions) -> dict:
    return {"solutions": [{"prompt": prompt, "steps": steps} for prompt, steps in solutions]}


def test_score_steps_answers_the_cores_step_rewards_and_their_minimum(prm_server, core, tiny_prm):
    solutions = [*SOLUTIONS, LONG]
    response = _post(prm_server, "/v1/score_steps", _body(solutions))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == Path(tiny_prm).name and body["step_aggregation"] == "min"
    assert body["usage"]["truncated"] == 1
    expected = core.score_steps(solutions)
    for got, want, (_, steps) in zip(body["results"], expected, solutions):
        assert len(got["step_rewards"]) == len(steps)
        assert got["step_rewards"] == pytest.approx(want.step_rewards, abs=TOL)
    for got in body["results"][:3]:
        assert got["reward"] == min(got["step_rewards"])
    cut = body["results"][3]
    assert cut["reward"] is None and cut["step_rewards"][-1] is None and cut["step_rewards"][0] is not None
    health = httpx.get(f"{prm_server.url}/health").json()
    assert health["step_separator"] == "\n\n" and health["step_aggregation"] == "min"


def test_the_client_splits_solutions_into_requests_and_keeps_their_order(prm_server, core):
    solutions = SOLUTIONS * 3  # 9 solutions in requests of 2, two at a time
    with RewardClient(prm_server.url, batch_size=2, concurrency=2) as client:
        results = client.score_steps(solutions)
    assert [r["step_rewards"] for r in results] == [
        pytest.approx(s.step_rewards, abs=TOL) for s in core.score_steps(solutions)]


@pytest.mark.parametrize("body, status, message", [
    ({"texts": ["a"]}, 400, "send 'solutions'"),
    ({"solutions": "2 + 2 = 4"}, 422, "'solutions' must be a list"),
    ({"solutions": []}, 400, "'solutions' is empty"),
    ({"solutions": [{"prompt": "2 + 2?"}]}, 422, "'solutions[0]' must be an object with 'prompt'"),
    ({"solutions": [{"prompt": "2 + 2?", "steps": "4."}]}, 422, "'solutions[0].steps' must be a list of strings"),
    ({"solutions": [{"prompt": 4, "steps": ["4."]}]}, 422, "'solutions[0].prompt' must be a string"),
    ({"solutions": [{"prompt": " ", "steps": ["4."]}]}, 400, "solutions[0].prompt must be a non-empty string"),
    ({"solutions": [{"prompt": "2 + 2?", "steps": []}]}, 400, "solutions[0].steps must be a non-empty list"),
    ({"solutions": [{"prompt": "2 + 2?", "steps": ["4.", ""]}]}, 400, "solutions[0].steps[1] must be a non-empty"),
    ({"solutions": [{"prompt": "2 + 2?", "steps": ["2 + 2\n\n= 4."]}]}, 400,
     "solutions[0].steps[0] contains the step separator '\\n\\n'"),
    (_body(SOLUTIONS * 2), 413, "'solutions' has 6 inputs, over the limit of 4 per request"),
])
def test_bad_bodies_get_one_error_naming_the_field(prm_server, body, status, message):
    response = _post(prm_server, "/v1/score_steps", body)
    assert response.status_code == status, response.text
    assert message in response.json()["message"]


@pytest.mark.parametrize("path, body", [
    ("/v1/score", {"texts": ["What is 6 * 7?\n\n42."]}),
    ("/get_reward", {"query": ["What is 6 * 7?\n\n42."]}),
    ("/classify", {"input": "What is 6 * 7?"}),
    ("/predict", {"inputs": "What is 6 * 7?"}),
    ("/v1/embeddings", {"input": "What is 6 * 7?"}),
    ("/score", {"text_1": "What is 6 * 7?", "text_2": "42."}),
    ("/rerank", {"query": "What is 6 * 7?", "documents": ["42."]}),
    ("/pooling", {"input": "What is 6 * 7?"}),
])
def test_whole_text_routes_refuse_a_process_reward_model(prm_server, path, body):
    response = _post(prm_server, path, body)
    assert response.status_code == 400, response.text
    message = response.json()["message"]
    assert "is a process reward model" in message and "POST /v1/score_steps" in message


def test_an_outcome_model_refuses_score_steps(bt_server):
    response = _post(bt_server, "/v1/score_steps", _body(SOLUTIONS[:1]), Authorization=f"Bearer {API_KEY}")
    assert response.status_code == 400
    assert "is not a process reward model" in response.json()["message"]


# ---- as an RL reward ----------------------------------------------------------------------------------------

def _chat(response: str, *prompt: dict) -> list[dict]:
    return [*(prompt or [{"role": "user", "content": "What is 6 * 7?"}]), {"role": "assistant", "content": response}]


CONVERSATIONS = [
    _chat("6 * 7 = 42.\n\nSo the answer is 42."),
    _chat("Six sevens.\n\n\n\n6 * 7 = 42.\n\n", {"role": "system", "content": "Be brief."},
          {"role": "user", "content": "Multiply."}, {"role": "assistant", "content": "Which numbers?"},
          {"role": "user", "content": "6 and 7."}),
    _chat([{"type": "text", "text": "It is 42."}]),
    _chat("\n\n \n\n"),  # no step: 0.0
    _chat("\n\n".join(LONG[1]), {"role": "user", "content": LONG[0]}),  # cut: the steps that fit
]
# The same conversations split by hand: the user text, the response's non-blank pieces.
HAND_SPLIT = [
    ("What is 6 * 7?", ["6 * 7 = 42.", "So the answer is 42."]),
    ("Multiply.\n6 and 7.", ["Six sevens.", "6 * 7 = 42."]),
    ("What is 6 * 7?", ["It is 42."]),
    ("What is 6 * 7?", []),
    LONG,
]


def test_a_conversation_becomes_its_user_text_and_the_responses_steps():
    assert [conversation_solution(c, "\n\n") for c in CONVERSATIONS] == [(p, list(s)) for p, s in HAND_SPLIT]
    with pytest.raises(ValueError, match="ends with a user message"):
        conversation_solution([{"role": "user", "content": "2 + 2?"}], "\n\n")


def test_the_environment_rewards_a_rollout_with_the_minimum_of_its_steps_in_process_and_remote(
        tiny_prm, prm_server, core):
    local = RewardModelEnvironment({"model_name": tiny_prm, "max_length": MAX_LENGTH})
    remote = RewardModelEnvironment({"url": prm_server.url, "batch_size": 2})
    infos = [None] * len(CONVERSATIONS)
    got_local, got_remote = local.step(CONVERSATIONS, infos).rewards, remote.step(CONVERSATIONS, infos).rewards
    scored = core.score_steps([s for s in HAND_SPLIT if s[1]])
    expected = [min(r.step_rewards) for r in scored[:3]] + [0.0] + [
        min(p for p in scored[3].step_rewards if p is not None)]
    assert scored[3].cut  # LONG loses steps: its reward is the minimum of those that fit
    torch.testing.assert_close(got_local, torch.tensor(expected), atol=TOL, rtol=0)
    torch.testing.assert_close(got_remote, got_local, atol=TOL, rtol=0)
    for env, rewards in ((local, got_local), (remote, got_remote)):
        _, metrics = env.global_post_process_and_metrics({"rewards": rewards})
        assert metrics["reward_model_env/solutions_cut"] == 1 and metrics["reward_model_env/empty_responses"] == 1
        env.shutdown()


def test_a_prompt_that_fills_the_max_length_gets_nan(tiny_prm):
    env = RewardModelEnvironment({"model_name": tiny_prm, "max_length": 16})
    prompt = {"role": "user", "content": " ".join(["count the apples"] * 10)}
    assert math.isnan(env.score([_chat("3 + 4 = 7.", prompt)])[0].item())
    env.shutdown()
