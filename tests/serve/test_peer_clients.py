"""Peers' reward clients against a real `rmkit serve`, each written from the peer's documented request and
response shapes: OpenRLHF's remote reward model, verl's SGLang branch (OpenAI embeddings), vLLM's model
list. The server runs with an API key, and the two routes those clients call are opened with --open-route
(they cannot send headers)."""

from __future__ import annotations

import math

import httpx
import pytest
from serve_helpers import API_KEY, CONVERSATIONS, TEXTS, Server

from rmkit.data.tokenize import encode_conversation
from rmkit.inference import load_scorer

TOL = 1e-5


@pytest.fixture(scope="module")
def open_server(bt_model_dir):
    server = Server(bt_model_dir, "--api-key", API_KEY, "--open-route", "/get_reward",
                    "--open-route", "/v1/embeddings")
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def scorer(bt_model_dir):
    return load_scorer(bt_model_dir)


def test_openrlhf_remote_reward(open_server, scorer):
    """OpenRLHF posts {"query", "prompts", "labels"} to remote_rm_url with no headers and reads
    `rewards` (falling back to `scores`) and `extra_logs`."""
    payload = {"query": TEXTS, "prompts": [""] * len(TEXTS), "labels": [None] * len(TEXTS)}
    response = httpx.post(open_server.url + "/get_reward", json=payload, timeout=30)
    assert response.status_code == 200, response.text
    body = response.json()
    expected = scorer.score(TEXTS)[:, 0].tolist()
    assert body["rewards"] == body["scores"] and len(body["rewards"]) == len(TEXTS)
    assert max(abs(a - b) for a, b in zip(body["rewards"], expected)) <= TOL
    assert body["extra_logs"]["reward_input_tokens"] == [len(ids) for ids, _ in scorer.encode(TEXTS)]


def test_a_decoded_sequence_scores_as_its_conversation(open_server, scorer):
    """OpenRLHF sends the policy's decoded tokens (special tokens kept): the same reward as the
    conversation sent as messages."""
    queries = [scorer.tokenizer.decode(encode_conversation(scorer.tokenizer, c), skip_special_tokens=False)
               for c in CONVERSATIONS]
    assert queries[0].startswith("<s>")  # the BOS is in the text; rmkit does not add a second one
    decoded = httpx.post(open_server.url + "/get_reward", json={"query": queries}, timeout=30).json()["rewards"]
    as_messages = httpx.post(open_server.url + "/v1/score", json={"conversations": CONVERSATIONS},
                             headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30).json()["rewards"]
    assert max(abs(a - b) for a, b in zip(decoded, as_messages)) <= TOL


def test_verl_sglang_branch_reads_the_last_embedding_value(open_server, scorer):
    """verl's SGLang path posts {"model", "input": text} to /v1/embeddings and reads data[-1].embedding[-1]."""
    response = httpx.post(open_server.url + "/v1/embeddings", json={"model": "my-rm", "input": TEXTS[0]}, timeout=30)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list" and body["model"] == "my-rm" and body["data"][0]["object"] == "embedding"
    assert abs(body["data"][-1]["embedding"][-1] - scorer.score(TEXTS[:1])[0, 0].item()) <= TOL
    batch = httpx.post(open_server.url + "/v1/embeddings", json={"input": TEXTS}, timeout=30).json()
    assert [d["index"] for d in batch["data"]] == list(range(len(TEXTS)))


def test_vllm_model_list(open_server, scorer):
    body = httpx.get(open_server.url + "/v1/models", timeout=30).json()
    assert body["object"] == "list" and body["data"][0]["object"] == "model"
    assert body["data"][0]["max_model_len"] == scorer.max_length


def test_routes_not_opened_still_need_the_key(open_server):
    response = httpx.post(open_server.url + "/v1/score", json={"texts": ["a dog"]}, timeout=30)
    assert response.status_code == 401
    missing = httpx.post(open_server.url + "/get_reward", json={"prompts": []}, timeout=30)
    assert missing.status_code == 400 and "send 'query'" in missing.json()["message"]


def test_open_route_must_name_a_scoring_route(bt_model_dir, capsys):
    from rmkit.cli import main

    assert main(["serve", "--model", str(bt_model_dir), "--open-route", "/health"]) == 2
    assert "config key 'open-route'" in capsys.readouterr().err


def _tei(server, payload):
    return httpx.post(server.url + "/predict", json=payload, headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=30)


def test_tei_predict_input_shapes(open_server, scorer):
    """TEI: a string, or [text] / [text, text_pair], is one input (a list of predictions); a list of such
    lists is a batch (a list of lists), whatever its length."""
    raw = scorer.score(TEXTS)[:, 0].tolist()
    single = _tei(open_server, {"inputs": [TEXTS[0]], "raw_scores": True}).json()
    assert single[0]["score"] == pytest.approx(raw[0], abs=TOL)
    one_batch = _tei(open_server, {"inputs": [[TEXTS[0]]], "raw_scores": True}).json()
    assert one_batch[0][0]["score"] == pytest.approx(raw[0], abs=TOL)
    mixed = _tei(open_server, {"inputs": [[TEXTS[1]], ["the cat sat", " on the mat"]], "raw_scores": True}).json()
    assert [row[0]["score"] for row in mixed] == pytest.approx([raw[1], raw[0]], abs=TOL)


def test_tei_truncate_flag(open_server, bt_model_dir, scorer):
    long_text = " ".join(["the cat"] * 200)  # 401 tokens, over the model's 128 positions
    cut = _tei(open_server, {"inputs": long_text, "truncate": True, "raw_scores": True})
    assert cut.status_code == 200 and cut.json()[0]["score"] == pytest.approx(scorer.score([long_text])[0, 0].item(), abs=TOL)
    refused = _tei(open_server, {"inputs": long_text, "truncate": False})
    assert refused.status_code == 422 and "over the maximum of 128" in refused.json()["message"]
    right = _tei(open_server, {"inputs": "a dog", "truncate": True, "truncation_direction": "right"})
    assert right.status_code == 422 and "keeps the end" in right.json()["message"]


def test_vllm_activation_flag_precedence(open_server, scorer):
    """vLLM reads `softmax` first, then `activation`, then `use_activation`."""
    raw = scorer.score(TEXTS[:1])[0, 0].item()
    headers = {"Authorization": f"Bearer {API_KEY}"}

    def probs(**flags):
        body = httpx.post(open_server.url + "/classify", json={"model": "rm", "input": TEXTS[0], **flags},
                          headers=headers, timeout=30).json()
        assert body["model"] == "rm"
        return body["data"][0]["probs"][0]

    assert probs(softmax=False, use_activation=True) == pytest.approx(raw, abs=TOL)
    assert probs(activation=False, use_activation=True) == pytest.approx(raw, abs=TOL)
    assert probs(use_activation=False) == pytest.approx(raw, abs=TOL)
    assert probs() == pytest.approx(1 / (1 + math.exp(-raw)), abs=TOL)


def test_content_parts_score_as_their_text(open_server):
    """OpenAI / vLLM clients may send content as a list of text parts: the same reward as the string."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    parted = [[{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in c]
              for c in CONVERSATIONS]
    as_parts = httpx.post(open_server.url + "/v1/score", json={"conversations": parted}, headers=headers, timeout=30)
    as_text = httpx.post(open_server.url + "/v1/score", json={"conversations": CONVERSATIONS}, headers=headers, timeout=30)
    assert as_parts.status_code == 200, as_parts.text
    assert as_parts.json()["rewards"] == as_text.json()["rewards"]
    image = [[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]]
    refused = httpx.post(open_server.url + "/v1/score", json={"conversations": image}, headers=headers, timeout=30)
    assert refused.status_code == 400 and "conversation 0[0].content[0]" in refused.json()["message"]


def _post(server, path, payload):
    return httpx.post(server.url + path, json=payload, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)


def test_vllm_score_on_both_paths(open_server, scorer):
    """vLLM's score API: one text_1 against each text_2 (or paired lists); rmkit's native /v1/score keeps
    answering `texts`, and a vLLM request to /v1/score gets vLLM's answer."""
    prompt, replies = "what is the capital of france ", ["paris", "berlin"]
    expected = [1 / (1 + math.exp(-r)) for r in scorer.score([prompt + r for r in replies])[:, 0].tolist()]
    for path in ("/score", "/v1/score"):
        body = _post(open_server, path, {"model": "rm", "text_1": prompt, "text_2": replies}).json()
        assert body["object"] == "list" and body["model"] == "rm"
        assert [d["object"] for d in body["data"]] == ["score", "score"]
        assert [d["score"] for d in body["data"]] == pytest.approx(expected, abs=TOL)
    paired = _post(open_server, "/score", {"queries": [prompt, prompt], "documents": replies, "use_activation": False})
    assert [d["score"] for d in paired.json()["data"]] == pytest.approx(
        scorer.score([prompt + r for r in replies])[:, 0].tolist(), abs=TOL)
    mismatch = _post(open_server, "/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]})
    assert mismatch.status_code == 400 and "send one, or as many" in mismatch.json()["message"]


def test_vllm_rerank_and_pooling(open_server, scorer):
    query, documents = "what is the capital of france ", ["berlin", "paris", "no"]
    raw = scorer.score([query + d for d in documents])[:, 0].tolist()
    body = _post(open_server, "/rerank", {"model": "rm", "query": query, "documents": documents, "top_n": 2}).json()
    best = sorted(range(3), key=lambda i: -raw[i])[:2]
    assert [r["index"] for r in body["results"]] == best
    assert body["results"][0]["document"] == {"text": documents[best[0]]}
    pooled = _post(open_server, "/pooling", {"model": "rm", "input": documents}).json()
    assert [d["object"] for d in pooled["data"]] == ["pooling"] * 3
    assert [d["data"][0] for d in pooled["data"]] == pytest.approx(scorer.score(documents)[:, 0].tolist(), abs=TOL)


def test_vllm_classify_token_ids_special_tokens_and_truncation(open_server, scorer):
    from rmkit.data.tokenize import keep_end

    def raw(payload):
        response = _post(open_server, "/classify", {"model": "rm", "use_activation": False, **payload})
        assert response.status_code == 200, response.text
        return [d["probs"][0] for d in response.json()["data"]]

    ids = [i for i, _ in scorer.encode(TEXTS[:2])]
    expected = scorer.score_ids(ids)[:, 0].tolist()
    assert raw({"input": ids[0]}) == pytest.approx(expected[:1], abs=TOL)  # one pre-tokenized prompt
    assert raw({"input": ids}) == pytest.approx(expected, abs=TOL)
    bare = scorer.tokenizer(TEXTS[0], add_special_tokens=False)["input_ids"]
    assert bare != ids[0]  # this tokenizer adds BOS
    assert raw({"input": TEXTS[0], "add_special_tokens": False}) == pytest.approx(
        scorer.score_ids([bare])[:, 0].tolist(), abs=TOL)
    kept = keep_end(scorer.tokenizer, ids[0], 3)
    assert raw({"input": TEXTS[0], "truncate_prompt_tokens": 3}) == pytest.approx(
        scorer.score_ids([kept])[:, 0].tolist(), abs=TOL)
    bad = _post(open_server, "/classify", {"input": [1, 10_000]})
    assert bad.status_code == 400 and "token ids in [0," in bad.json()["message"]


def test_verl_vllm_branch_rendered_chat_without_bos(open_server, scorer):
    """verl's vLLM path posts the chat-templated text with the leading BOS removed to /classify with
    "activation": false and reads data[-1].probs[-1]: the reward of the conversation sent as messages."""
    bos = scorer.tokenizer.bos_token
    for conversation in CONVERSATIONS:
        text = scorer.tokenizer.apply_chat_template(conversation, tokenize=False)
        text = text[len(bos):] if text.startswith(bos) else text
        body = _post(open_server, "/classify", {"model": "rm", "input": text, "activation": False}).json()
        assert body["data"][-1]["probs"][-1] == pytest.approx(scorer.score([conversation])[0, 0].item(), abs=TOL)


def test_docs_trl_reward_function(bt_server, scorer):
    """The TRL reward function of docs/serving.md, on TRL's two reward-function input shapes (standard: strings;
    conversational: message lists), gives the served rewards."""
    from rmkit.serve import RewardClient

    client = RewardClient(bt_server.url, api_key=API_KEY)

    def rmkit_reward(prompts, completions, **kwargs):
        if isinstance(prompts[0], str):
            return client.score_texts([p + c for p, c in zip(prompts, completions)])
        return client.score_conversations([p + c for p, c in zip(prompts, completions)])

    standard = rmkit_reward(["the cat ", "a "], ["sat on the mat", "dog"], completion_ids=None)
    assert standard == pytest.approx(scorer.score(["the cat sat on the mat", "a dog"])[:, 0].tolist(), abs=TOL)
    prompts = [c[:-1] for c in CONVERSATIONS]
    completions = [c[-1:] for c in CONVERSATIONS]
    conversational = rmkit_reward(prompts, completions)
    assert conversational == pytest.approx(scorer.score(CONVERSATIONS)[:, 0].tolist(), abs=TOL)
    client.close()
