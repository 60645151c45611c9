"""The real `rmkit serve` over HTTP: every route, every error, auth, offline equality, metrics."""

from __future__ import annotations

import math

import httpx
import pytest
import torch
from serve_helpers import API_KEY, CONVERSATIONS, TEXTS

from rmkit.data.tokenize import encode_conversation, encode_text
from rmkit.models import load_reward_model, score_sequences

TOL = 1e-5  # served rewards equal offline `score_sequences` within 1e-5 (the bound)
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def offline(bt_model_dir):
    """Offline rewards of TEXTS and CONVERSATIONS from a freshly loaded model, one sequence at a time."""
    model, tokenizer = load_reward_model(bt_model_dir)

    def score(ids):
        return [score_sequences(model, [seq], tokenizer.pad_token_id)[0, 0].item() for seq in ids]

    return {"texts": score([encode_text(tokenizer, t) for t in TEXTS]),
            "conversations": score([encode_conversation(tokenizer, c) for c in CONVERSATIONS])}


def post(server, path, payload=None, content=None, headers=AUTH):
    return httpx.post(server.url + path, json=payload, content=content, headers=headers, timeout=30)


def assert_error(response, status, fragment):
    assert response.status_code == status, response.text
    body = response.json()
    assert body["object"] == "error" and body["code"] == status
    assert fragment in body["message"], body["message"]


def test_start_up_line_names_model_url_and_key(bt_server, bt_model_dir, reg_server, reg_model_dir):
    assert (f"rmkit serve: {bt_model_dir} (1 reward per input, max length 24) at {bt_server.url}; API key required"
            in bt_server.output())
    assert (f"rmkit serve: {reg_model_dir} (3 attributes per input, max length 8) at {reg_server.url}; API key not "
            "required" in reg_server.output())


def test_health(bt_server):
    body = httpx.get(bt_server.url + "/health").json()  # no key needed
    assert body["status"] == "ok" and body["num_labels"] == 1 and body["max_length"] == 24


def test_score_texts_and_conversations_equal_offline(bt_server, offline):
    body = post(bt_server, "/v1/score", {"texts": TEXTS}).json()
    assert body["rewards"] == pytest.approx(offline["texts"], abs=TOL)
    assert body["usage"] == {"tokens": sum(len(t.split()) + 1 for t in TEXTS), "truncated": 0}
    body = post(bt_server, "/v1/score", {"conversations": CONVERSATIONS}).json()
    assert body["rewards"] == pytest.approx(offline["conversations"], abs=TOL)


def test_classify_vllm_shape(bt_server, offline):
    body = post(bt_server, "/classify", {"model": "rm", "input": TEXTS[:3]}).json()
    assert body["object"] == "list" and body["id"].startswith("classify-") and isinstance(body["created"], int)
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert all(d["num_classes"] == 1 and d["label"] == "LABEL_0" for d in body["data"])
    sigmoid = [1 / (1 + math.exp(-r)) for r in offline["texts"][:3]]
    assert [d["probs"][0] for d in body["data"]] == pytest.approx(sigmoid, abs=TOL)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    raw = post(bt_server, "/classify", {"input": TEXTS[0], "use_activation": False}).json()
    assert raw["data"][0]["probs"] == pytest.approx([offline["texts"][0]], abs=TOL)
    chat = post(bt_server, "/classify", {"messages": CONVERSATIONS[2], "use_activation": False}).json()
    assert chat["data"][0]["probs"] == pytest.approx([offline["conversations"][2]], abs=TOL)


def test_predict_tei_shape(bt_server, offline):
    single = post(bt_server, "/predict", {"inputs": TEXTS[0], "raw_scores": True}).json()
    assert single == [{"score": pytest.approx(offline["texts"][0], abs=TOL), "label": "LABEL_0"}]
    batch = post(bt_server, "/predict", {"inputs": TEXTS[:3]}).json()
    sigmoid = [1 / (1 + math.exp(-r)) for r in offline["texts"][:3]]
    assert [row[0]["score"] for row in batch] == pytest.approx(sigmoid, abs=TOL)
    # As in TEI, a list of exactly two strings is one (text, text_pair) input: scored as their concatenation.
    pair = post(bt_server, "/predict", {"inputs": ["the cat sat", " on the mat"], "raw_scores": True}).json()
    assert pair[0]["score"] == pytest.approx(offline["texts"][0], abs=TOL)
    pairs = post(bt_server, "/predict", {"inputs": [["the cat sat", " on the mat"]], "raw_scores": True}).json()
    assert pairs[0][0]["score"] == pytest.approx(offline["texts"][0], abs=TOL)


def test_regression_server_vectors_weights_and_truncation(reg_server, reg_model_dir):
    texts = ["the cat sat on the mat the dog sat", "a dog"]
    body = post(reg_server, "/v1/score", {"texts": texts}, headers={}).json()
    model, tokenizer = load_reward_model(reg_model_dir)
    ids = [encode_text(tokenizer, t) for t in texts]
    ids[0] = ids[0][:1] + ids[0][-7:]  # --max-length 8 keeps BOS and the end, as the data library does
    expected = score_sequences(model, ids, tokenizer.pad_token_id)
    torch.testing.assert_close(torch.tensor(body["rewards"]), expected, atol=TOL, rtol=0)
    torch.testing.assert_close(torch.tensor(body["scores"]), expected @ torch.tensor([0.5, 0.3, 0.2]),
                               atol=TOL, rtol=0)
    assert body["usage"] == {"tokens": 8 + 3, "truncated": 1}


@pytest.mark.parametrize(("path", "payload"), [
    ("/v1/score", {"texts": ["a dog"]}), ("/classify", {"input": "a dog"}), ("/predict", {"inputs": "a dog"})])
def test_auth_required_on_scoring_routes(bt_server, path, payload):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        response = post(bt_server, path, payload, headers=headers)
        assert_error(response, 401, "API key")
        assert response.headers["www-authenticate"] == "Bearer"
    assert post(bt_server, path, payload).status_code == 200


@pytest.mark.parametrize(("path", "payload", "content", "status", "fragment"), [
    ("/v1/score", None, b"{not json", 400, "malformed JSON"),
    ("/v1/score", None, b"\xff\xfe", 400, "malformed JSON"),
    ("/v1/score", [1, 2], None, 422, "must be an object"),
    ("/v1/score", {"texts": "a dog"}, None, 422, "'texts' must be a list of strings"),
    ("/v1/score", {"texts": [1, 2]}, None, 422, "'texts' must be a list of strings"),
    ("/v1/score", {"conversations": "hi"}, None, 422, "'conversations' must be a list"),
    ("/v1/score", {"conversations": [[{"role": "user"}]]}, None, 400, "conversation 0[0].content: expected a string, got NoneType"),
    ("/v1/score", {"conversations": [[{"role": "bot", "content": "x"}]]}, None, 400, "conversation 0[0].role: expected one of system, user, assistant, tool, developer"),
    ("/v1/score", {"texts": ["a"], "conversations": []}, None, 400, "exactly one of"),
    ("/v1/score", {}, None, 400, "exactly one of"),
    ("/v1/score", {"texts": []}, None, 400, "'texts' is empty"),
    ("/v1/score", {"texts": ["a dog", ""]}, None, 400, "input 1 is an empty string"),
    ("/v1/score", {"texts": ["a dog"] * 17}, None, 413, "17 inputs, over the limit of 16"),
    ("/v1/score", {"texts": ["the cat " * 12]}, None, 400, "input 0 has 25 tokens, over the maximum of 24"),
    ("/v1/score", {"texts": ["a" * 5000]}, None, 413, "over the limit of 4096"),
    ("/classify", {"input": 3}, None, 422, "'input' must be a string or a list of strings"),
    ("/classify", {"input": []}, None, 400, "'input' is empty"),
    ("/classify", {"model": "rm"}, None, 400, "send 'input'"),
    ("/classify", {"input": "a", "use_activation": "yes"}, None, 422, "'use_activation' must be a boolean"),
    ("/predict", {"inputs": 7}, None, 422, "'inputs' must be a string"),
    ("/predict", {"inputs": [["a", "b", "c"]]}, None, 422, "[text, text_pair]"),
    ("/predict", {"raw_scores": True}, None, 400, "send 'inputs'"),
    ("/predict", {"inputs": "a", "raw_scores": 1}, None, 422, "'raw_scores' must be a boolean"),
])
def test_bad_requests_get_json_errors_and_the_server_keeps_serving(bt_server, path, payload, content,
                                                                    status, fragment):
    headers = {**AUTH, "Content-Type": "application/json"}
    assert_error(post(bt_server, path, payload, content=content, headers=headers), status, fragment)
    assert post(bt_server, "/v1/score", {"texts": ["a dog"]}).status_code == 200


def test_body_over_limit_without_content_length_is_refused(bt_server):
    def chunks():  # chunked transfer: the server must count the bytes itself
        for _ in range(10):
            yield b" " * 1000

    response = httpx.post(bt_server.url + "/v1/score", content=chunks(), headers=AUTH)
    assert_error(response, 413, "over the limit of 4096 bytes")


def test_metrics_prometheus_text(bt_server):
    post(bt_server, "/v1/score", {"texts": ["a dog"]})
    post(bt_server, "/v1/score", {"texts": []})
    text = httpx.get(bt_server.url + "/metrics").text
    assert "# TYPE rmkit_requests_total counter" in text
    assert 'rmkit_requests_total{route="/v1/score",status="200"}' in text
    assert 'rmkit_requests_total{route="/v1/score",status="400"}' in text
    assert 'rmkit_request_latency_seconds_bucket{route="/v1/score",le="+Inf"}' in text
    assert "rmkit_batch_sequences_count" in text and "rmkit_batch_requests_bucket" in text
    assert "rmkit_queue_depth 0" in text and "rmkit_requests_in_flight" in text
    sequences = next(line for line in text.splitlines() if line.startswith("rmkit_scored_sequences_total"))
    assert int(sequences.split()[1]) >= 1
