"""Request parsing and response shapes of the scoring routes (`rmkit.serve.server` wires them up).

Each route takes the engine, the decoded JSON object and the per-request input limit, and raises
`HTTPError` (status, message) or the engine's `InputError` (400) on a bad request.
"""

from __future__ import annotations

import time
import uuid

import torch

from rmkit.data.tokenize import keep_end
from rmkit.serve.engine import InputError, ScoringEngine


class HTTPError(Exception):
    """A request answered with `status` and a JSON error carrying `message`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def string_list(value, field: str, max_inputs: int) -> list[str]:
    """A string or a list of strings as a non-empty list, else 422/400/413 naming `field`."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        raise HTTPError(422, f"'{field}' must be a string or a list of strings")
    check_count(items, field, max_inputs)
    return items


def check_count(items: list, field: str, max_inputs: int) -> None:
    if not items:
        raise HTTPError(400, f"'{field}' is empty: nothing to score")
    if len(items) > max_inputs:
        raise HTTPError(413, f"'{field}' has {len(items)} inputs, over the limit of {max_inputs} per request")


def activation(logits: torch.Tensor) -> torch.Tensor:
    """vLLM and TEI's default: sigmoid for a single label, softmax over several. `[N, K] -> [N, K]`."""
    return torch.sigmoid(logits) if logits.shape[1] == 1 else torch.softmax(logits, dim=1)


async def score_route(engine: ScoringEngine, payload: dict, max_inputs: int) -> dict:
    """`POST /v1/score`: rmkit's own route (`texts` / `conversations`); a vLLM score request on the same
    path (`text_1`/`text_2` or `queries`/`documents`) is answered as vLLM answers it (`vllm_score_route`)."""
    if any(key in payload for key in VLLM_SCORE_KEYS):
        return await vllm_score_route(engine, payload, max_inputs)
    if ("texts" in payload) == ("conversations" in payload):
        raise HTTPError(400, "send exactly one of 'texts' (list of strings) or 'conversations'")
    if "texts" in payload:
        texts = payload["texts"]
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise HTTPError(422, "'texts' must be a list of strings")
        check_count(texts, "texts", max_inputs)
        ids, truncated = engine.encode_texts(texts)
    else:
        conversations = payload["conversations"]
        if not isinstance(conversations, list):
            raise HTTPError(422, "'conversations' must be a list of message lists")
        check_count(conversations, "conversations", max_inputs)
        ids, truncated = engine.encode_conversations(conversations)
    raw = await engine.score_ids_async(ids)
    scalar = engine.scalar_rewards(raw)
    body = {"model": engine.model_name, "usage": {"tokens": sum(map(len, ids)), "truncated": truncated}}
    if engine.num_labels == 1:
        body["rewards"] = scalar.tolist()
    else:
        body["rewards"] = raw.tolist()
        if scalar is not None:
            body["scores"] = scalar.tolist()
    return body

async def classify_route(engine: ScoringEngine, payload: dict, max_inputs: int) -> dict:
    """`POST /classify`: vLLM's classify API (one conversation under `messages`)."""
    ids = vllm_input_ids(engine, payload, max_inputs)
    use_activation = activation_flag(payload)
    logits = await engine.score_ids_async(ids)
    probs = activation(logits) if use_activation else logits
    data = [{"index": i, "label": engine.labels[int(row.argmax())], "probs": row.tolist(),
             "num_classes": engine.num_labels} for i, row in enumerate(probs)]
    return vllm_list_response("classify", engine, payload, data, ids)


def vllm_list_response(kind: str, engine: ScoringEngine, payload: dict, data: list, ids: list[list[int]]) -> dict:
    """vLLM's list envelope (classify, score, pooling): id, object, created, the requested model, `data`
    and the token usage of `ids`."""
    tokens = sum(map(len, ids))
    return {"id": f"{kind}-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": requested_model(engine, payload), "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                      "prompt_tokens_details": None}}

def vllm_input_ids(engine: ScoringEngine, payload: dict, max_inputs: int) -> list[list[int]]:
    """Token ids of a vLLM classify / pooling request: `messages` (one conversation), or `input` as text(s)
    or token ids (`[int]` or `[[int]]`). `add_special_tokens: false` tokenizes text without the
    tokenizer's special tokens; `truncate_prompt_tokens: k` keeps at most k tokens (the leading special
    tokens and the end; -1: the model's maximum)."""
    if "messages" in payload:
        ids, _ = engine.encode_conversations([payload["messages"]])
    elif "input" not in payload:
        raise HTTPError(400, "send 'input' (text(s) or token ids) or 'messages'")
    elif _is_token_ids(payload["input"]):
        value = payload["input"]
        sequences = [value] if value and isinstance(value[0], int) else value
        check_count(sequences, "input", max_inputs)
        ids, _ = engine.check_token_ids(sequences)
    else:
        texts = string_list(payload["input"], "input", max_inputs)
        special = payload.get("add_special_tokens", True)
        if not isinstance(special, bool):
            raise HTTPError(422, "'add_special_tokens' must be a boolean")
        if special:
            ids, _ = engine.encode_texts(texts)
        else:
            ids, _ = engine.check_token_ids([engine.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts])
    limit = payload.get("truncate_prompt_tokens")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or (limit < 1 and limit != -1):
            raise HTTPError(422, "'truncate_prompt_tokens' must be a positive integer or -1")
        limit = engine.max_length if limit == -1 else min(limit, engine.max_length)
        ids = [keep_end(engine.tokenizer, seq, limit) for seq in ids]
    return ids


def _is_token_ids(value) -> bool:
    """`[int, ...]` or `[[int, ...], ...]` (vLLM accepts pre-tokenized prompts)."""
    if not isinstance(value, list) or not value:
        return False
    if all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return True
    return all(isinstance(row, list) and row and all(isinstance(t, int) and not isinstance(t, bool) for t in row)
               for row in value)


def activation_flag(payload: dict) -> bool:
    """Whether /classify applies the activation, with vLLM's precedence among its three spellings:
    `softmax` (oldest), then `activation`, then `use_activation`; the first one set (not null) decides,
    default true."""
    for key in ("softmax", "activation", "use_activation"):
        value = payload.get(key)
        if value is not None:
            if not isinstance(value, bool):
                raise HTTPError(422, f"'{key}' must be a boolean")
            return value
    return True


async def predict_route(engine: ScoringEngine, payload: dict, max_inputs: int) -> list:
    """`POST /predict`: text-embeddings-inference's route for sequence classifiers."""
    if "inputs" not in payload:
        raise HTTPError(400, "send 'inputs': a string, a [text, text] pair, or a list of them")
    single, texts = predict_inputs(payload["inputs"], max_inputs)
    raw_scores = payload.get("raw_scores", False)
    if not isinstance(raw_scores, bool):
        raise HTTPError(422, "'raw_scores' must be a boolean")
    ids = predict_ids(engine, texts, payload)
    logits = await engine.score_ids_async(ids)
    scores = logits if raw_scores else activation(logits)
    predictions = [sorted(({"score": s, "label": engine.labels[k]} for k, s in enumerate(row.tolist())),
                          key=lambda p: -p["score"]) for row in scores]
    return predictions[0] if single else predictions


def predict_ids(engine: ScoringEngine, texts: list[str], payload: dict) -> list[list[int]]:
    """Token ids for /predict under TEI's `truncate` (true: cut, false: refuse an over-long input; absent:
    the server's --overlong) and `truncation_direction`: rmkit cuts by the scoring contract, keeping the
    end where the reward is read, which is TEI's `left`; `right` (keep the start) is refused. TEI answers
    input problems with 422, and so does this route."""
    truncate, direction = payload.get("truncate"), payload.get("truncation_direction")
    if truncate is not None and not isinstance(truncate, bool):
        raise HTTPError(422, "'truncate' must be a boolean")
    if direction not in (None, "left", "Left"):
        raise HTTPError(422, "'truncation_direction' must be 'left': rmkit keeps the end of an over-long input "
                             "(its scoring contract; the reward is read at the last token)")
    overlong = None if truncate is None else ("truncate" if truncate else "refuse")
    try:
        return engine.encode_texts(texts, overlong=overlong)[0]
    except InputError as err:
        raise HTTPError(422, str(err)) from err


def predict_inputs(inputs, max_inputs: int) -> tuple[bool, list[str]]:
    """TEI's `inputs` as (is_single, texts): a string, or a list starting with a string, of one (text) or
    two (text, text_pair) strings, is ONE input; a list of lists of one or two strings is a batch. rmkit
    also takes a flat list of three or more strings as a batch (TEI refuses it). A pair is scored as the
    concatenation `text + text_pair` (rmkit's prompt + response)."""

    def sequence(item) -> str:
        if isinstance(item, list) and len(item) in (1, 2) and all(isinstance(s, str) for s in item):
            return "".join(item)
        raise HTTPError(422, "each of 'inputs' must be a [text] or [text, text_pair] list of strings")

    if isinstance(inputs, str):
        return True, [inputs]
    if not isinstance(inputs, list) or not inputs:
        raise HTTPError(422, "'inputs' must be a string, a [text, text_pair] pair, or a list of them")
    if all(isinstance(item, str) for item in inputs):
        if len(inputs) <= 2:
            return True, [sequence(inputs)]
        check_count(inputs, "inputs", max_inputs)
        return False, list(inputs)
    check_count(inputs, "inputs", max_inputs)
    return False, [sequence(item) for item in inputs]


def requested_model(engine: ScoringEngine, payload: dict) -> str:
    """The `model` a client asked for (OpenAI-style clients check it comes back), else the served name."""
    model = payload.get("model")
    return model if isinstance(model, str) and model else engine.model_name


async def get_reward_route(engine: ScoringEngine, payload: dict, max_inputs: int) -> dict:
    """`POST /get_reward`: OpenRLHF's remote reward model. `{"query": [full decoded sequences], "prompts",
    "labels"}` -> `{"rewards", "scores", "extra_logs"}`; each query is scored as one text (a decoded
    sequence already carries its chat template), `prompts` and `labels` are accepted and not used."""
    if "query" not in payload:
        raise HTTPError(400, "send 'query': the full sequences (prompt + response) to score")
    texts = string_list(payload["query"], "query", max_inputs)
    for key in ("prompts", "labels"):
        if key in payload and payload[key] is not None and not isinstance(payload[key], list):
            raise HTTPError(422, f"'{key}' must be a list (one entry per query)")
    ids, _ = engine.encode_texts(texts)
    raw = await engine.score_ids_async(ids)
    scalar = engine.scalar_rewards(raw)
    if scalar is None:
        raise HTTPError(400, f"this is a {engine.num_labels}-attribute model: start the server with "
                             "--attribute-weights to get one reward per query")
    rewards = scalar.tolist()
    # OpenRLHF logs each extra_logs entry per sample: the tokens the reward model read (after truncation).
    return {"rewards": rewards, "scores": rewards, "extra_logs": {"reward_input_tokens": [len(i) for i in ids]}}


async def embeddings_route(engine: ScoringEngine, payload: dict, max_inputs: int) -> dict:
    """`POST /v1/embeddings`: the OpenAI embeddings shape, as SGLang serves a reward model and verl's
    SGLang branch reads it (`data[-1].embedding[-1]`): each input's embedding is its raw head output `[K]`."""
    if "input" not in payload:
        raise HTTPError(400, "send 'input': a string or a list of strings")
    ids, _ = engine.encode_texts(string_list(payload["input"], "input", max_inputs))
    raw = await engine.score_ids_async(ids)
    tokens = sum(map(len, ids))
    data = [{"object": "embedding", "index": i, "embedding": row.tolist()} for i, row in enumerate(raw)]
    return {"object": "list", "data": data, "model": requested_model(engine, payload),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def models_listing(engine: ScoringEngine, created: int) -> dict:
    """`GET /v1/models`: the OpenAI / vLLM model list with the one served model."""
    return {"object": "list", "data": [{"id": engine.model_name, "object": "model", "created": created,
                                        "owned_by": "rmkit", "root": str(engine.model_dir), "parent": None,
                                        "max_model_len": engine.max_length}]}


VLLM_SCORE_KEYS = ("text_1", "text_2", "queries", "documents")


def _vllm_pairs(payload: dict, max_inputs: int) -> list[str]:
    """vLLM's score inputs as texts: `text_1` (or `queries`) against `text_2` (or `documents`); one first
    text is paired with every second text, equal-length lists pair up in order. Each pair is scored as
    the concatenation `text_1 + text_2` (rmkit's prompt + response)."""
    first_key = "text_1" if "text_1" in payload else "queries"
    second_key = "text_2" if "text_2" in payload else "documents"
    if first_key not in payload or second_key not in payload:
        raise HTTPError(400, "send 'text_1' and 'text_2' (or 'queries' and 'documents')")
    firsts = string_list(payload[first_key], first_key, max_inputs)
    seconds = string_list(payload[second_key], second_key, max_inputs)
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    if len(firsts) != len(seconds):
        raise HTTPError(400, f"'{first_key}' has {len(firsts)} texts and '{second_key}' {len(seconds)}: "
                             "send one, or as many as the other")
    return [a + b for a, b in zip(firsts, seconds)]


async def vllm_score_route(engine: ScoringEngine, payload: dict, max_inputs: int) -> dict:
    """`POST /score` (and vLLM-shaped requests to `/v1/score`): `{"data": [{"index", "object": "score",
    "score"}]}`, the score after the activation unless it is turned off (as /classify)."""
    texts = _vllm_pairs(payload, max_inputs)
    ids, _ = engine.encode_texts(texts)
    logits = await engine.score_ids_async(ids)
    scores = activation(logits) if activation_flag(payload) else logits
    data = [{"index": i, "object": "score", "score": row[0].item()} for i, row in enumerate(scores)]
    return vllm_list_response("score", engine, payload, data, ids)


async def rerank_route(engine: ScoringEngine, payload: dict, max_inputs: int) -> dict:
    """`POST /rerank` (also `/v1/rerank`): vLLM's (Jina/Cohere-style) rerank: `{"query", "documents",
    "top_n"}` -> `results` sorted by `relevance_score`, each `query + document` scored as one text."""
    if "query" not in payload or "documents" not in payload:
        raise HTTPError(400, "send 'query' (a string) and 'documents' (a list of strings)")
    if not isinstance(payload["query"], str):
        raise HTTPError(422, "'query' must be a string")
    documents = string_list(payload["documents"], "documents", max_inputs)
    top_n = payload.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0):
        raise HTTPError(422, "'top_n' must be a non-negative integer")
    ids, _ = engine.encode_texts([payload["query"] + d for d in documents])
    logits = await engine.score_ids_async(ids)
    scores = (activation(logits) if activation_flag(payload) else logits)[:, 0].tolist()
    order = sorted(range(len(documents)), key=lambda i: -scores[i])[: top_n or None]
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": requested_model(engine, payload),
            "usage": {"total_tokens": sum(map(len, ids))},
            "results": [{"index": i, "document": {"text": documents[i]}, "relevance_score": scores[i]}
                        for i in order]}


async def pooling_route(engine: ScoringEngine, payload: dict, max_inputs: int) -> dict:
    """`POST /pooling`: vLLM's pooling API for a classifier: each input's raw head output `[K]`."""
    ids = vllm_input_ids(engine, payload, max_inputs)
    raw = await engine.score_ids_async(ids)
    data = [{"index": i, "object": "pooling", "data": row.tolist()} for i, row in enumerate(raw)]
    return vllm_list_response("pool", engine, payload, data, ids)


async def score_steps_route(engine: ScoringEngine, payload: dict, max_inputs: int) -> dict:
    """`POST /v1/score_steps`: a process reward model's step rewards. `{"solutions": [{"prompt": str, "steps":
    [str, ...]}]}` -> `{"model", "step_aggregation", "results": [{"step_rewards", "reward"}], "usage": {"tokens",
    "truncated"}}`, the numbers `rmkit score` writes: each step's probability of being correct (null for a step
    past the max length) and their aggregate (null when a step is cut)."""
    if "solutions" not in payload:
        raise HTTPError(400, "send 'solutions': a list of {\"prompt\": str, \"steps\": [str, ...]}")
    solutions = payload["solutions"]
    if not isinstance(solutions, list):
        raise HTTPError(422, "'solutions' must be a list of {\"prompt\": str, \"steps\": [str, ...]} objects")
    check_count(solutions, "solutions", max_inputs)
    for i, solution in enumerate(solutions):
        if not isinstance(solution, dict) or "prompt" not in solution or "steps" not in solution:
            raise HTTPError(422, f"'solutions[{i}]' must be an object with 'prompt' (a string) and 'steps' (a list "
                                 "of strings)")
        if not isinstance(solution["prompt"], str):
            raise HTTPError(422, f"'solutions[{i}].prompt' must be a string")
        if not isinstance(solution["steps"], list) or not all(isinstance(s, str) for s in solution["steps"]):
            raise HTTPError(422, f"'solutions[{i}].steps' must be a list of strings")
    results, tokens = await engine.score_steps_async([(s["prompt"], s["steps"]) for s in solutions])
    return {"model": engine.model_name, "step_aggregation": engine.scorer.contract.step_aggregation,
            "results": [{"step_rewards": r.step_rewards, "reward": r.reward} for r in results],
            "usage": {"tokens": tokens, "truncated": sum(r.cut for r in results)}}


def refuse_process_model(engine: ScoringEngine, route: str) -> None:
    """A whole-text route (`route`) on a process reward model answers 400: its head at a text's last token is no
    reward of the text (the model was trained to judge the step before each separator)."""
    if engine.is_process:
        raise HTTPError(400, f"{engine.model_name} is a process reward model: it scores the steps of a solution, not "
                             f"a whole text, so {route} does not serve it; POST /v1/score_steps "
                             "{\"solutions\": [{\"prompt\", \"steps\"}]}")
