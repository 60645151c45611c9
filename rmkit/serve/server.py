"""The HTTP app of `rmkit serve`: rmkit's own route plus vLLM- and TEI-compatible ones.

    POST /v1/score   {"texts": [str]} | {"conversations": [[{"role", "content"}]]}
                     -> {"rewards", "model", "usage": {"tokens", "truncated"}} (+ "scores" for K > 1 with
                     attribute weights)
    POST /classify   vLLM classify API: {"model", "input": str | [str]} | {"messages": [...]},
                     "use_activation" (default true: sigmoid for one label, softmax over several)
    POST /predict    text-embeddings-inference: {"inputs": str | [str] | [str, str] | [[str, str]],
                     "raw_scores"} -> [{"score", "label"}] per input (a list of lists for a batch)
    GET  /health, GET /metrics (Prometheus text)

Bodies are read and checked here, not by pydantic, so every bad request gets one JSON error in the
OpenAI/vLLM shape `{"object": "error", "message", "type", "code"}` that names the problem.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from rmkit.serve.engine import InputError, ScoringEngine
from rmkit.serve.metrics import ServerMetrics

log = logging.getLogger("rmkit.serve")
ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 413: "PayloadTooLargeError",
               422: "UnprocessableEntityError", 500: "InternalServerError"}


class HTTPError(Exception):
    """A request answered with `status` and a JSON error carrying `message`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def error_response(status: int, message: str) -> JSONResponse:
    body = {"object": "error", "message": message, "type": ERROR_TYPES.get(status, "Error"), "code": status}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


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


async def read_json(request: Request, max_body_bytes: int) -> dict:
    """The body as a JSON object; 413 past `max_body_bytes` (read no further), 400 malformed, 422 not an
    object."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_body_bytes:
        raise HTTPError(413, f"request body of {declared} bytes is over the limit of {max_body_bytes}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_body_bytes:
            raise HTTPError(413, f"request body is over the limit of {max_body_bytes} bytes")
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise HTTPError(400, f"malformed JSON body: {err}") from err
    if not isinstance(payload, dict):
        raise HTTPError(422, "the JSON body must be an object")
    return payload


def create_app(
    engine: ScoringEngine,
    api_key: str | None = None,
    max_inputs: int = 1024,
    max_body_bytes: int = 16 * 1024 * 1024,
) -> FastAPI:
    """The FastAPI app serving `engine`; every scoring route requires `Bearer api_key` when one is set."""
    metrics = ServerMetrics(queue_depth=lambda: engine.queue_depth)
    engine.on_batch = metrics.observe_batch

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        engine.close()  # uvicorn has finished the in-flight requests by now

    app = FastAPI(title="rmkit reward model server", lifespan=lifespan)
    app.state.engine, app.state.metrics = engine, metrics

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise HTTPError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'")

    async def handle(request: Request, route: str, work: Callable[[dict], Awaitable[object]]):
        start, status = time.perf_counter(), 200
        metrics.in_flight += 1
        try:
            authorize(request)
            response = JSONResponse(await work(await read_json(request, max_body_bytes)))
        except HTTPError as err:
            status, response = err.status, error_response(err.status, err.message)
        except InputError as err:
            status, response = 400, error_response(400, str(err))
        except Exception as err:  # the server keeps serving; the caller learns what failed
            log.exception("internal error on %s", route)
            status, response = 500, error_response(500, f"internal error: {type(err).__name__}: {err}")
        finally:
            metrics.in_flight -= 1
        metrics.observe_request(route, status, time.perf_counter() - start)
        return response

    async def score_route(payload: dict) -> dict:
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

    async def classify_route(payload: dict) -> dict:
        if "messages" in payload:
            ids, _ = engine.encode_conversations([payload["messages"]])
        elif "input" in payload:
            ids, _ = engine.encode_texts(string_list(payload["input"], "input", max_inputs))
        else:
            raise HTTPError(400, "send 'input' (a string or list of strings) or 'messages'")
        use_activation = payload.get("use_activation", payload.get("activation", True))
        if not isinstance(use_activation, bool) and use_activation is not None:
            raise HTTPError(422, "'use_activation' must be a boolean")
        logits = await engine.score_ids_async(ids)
        probs = activation(logits) if use_activation is not False else logits
        tokens = sum(map(len, ids))
        data = [{"index": i, "label": engine.labels[int(row.argmax())], "probs": row.tolist(),
                 "num_classes": engine.num_labels} for i, row in enumerate(probs)]
        return {"id": f"classify-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                "model": engine.model_name, "data": data,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                          "prompt_tokens_details": None}}

    async def predict_route(payload: dict) -> list:
        if "inputs" not in payload:
            raise HTTPError(400, "send 'inputs': a string, a [text, text] pair, or a list of them")
        single, texts = predict_inputs(payload["inputs"], max_inputs)
        raw_scores = payload.get("raw_scores", False)
        if not isinstance(raw_scores, bool):
            raise HTTPError(422, "'raw_scores' must be a boolean")
        ids, _ = engine.encode_texts(texts)
        logits = await engine.score_ids_async(ids)
        scores = logits if raw_scores else activation(logits)
        predictions = [sorted(({"score": s, "label": engine.labels[k]} for k, s in enumerate(row.tolist())),
                              key=lambda p: -p["score"]) for row in scores]
        return predictions[0] if single else predictions

    for path, route, methods in (("/v1/score", score_route, ["POST"]), ("/classify", classify_route, ["POST"]),
                                 ("/v1/classify", classify_route, ["POST"]),
                                 ("/predict", predict_route, ["POST"])):
        app.add_api_route(path, _bind(handle, path, route), methods=methods)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": engine.model_name, "num_labels": engine.num_labels,
                "max_length": engine.max_length}

    @app.get("/metrics")
    async def metrics_route() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    return app


def _bind(handle, path: str, work):
    async def endpoint(request: Request):
        return await handle(request, path, work)

    endpoint.__name__ = "route_" + path.strip("/").replace("/", "_")
    return endpoint


def predict_inputs(inputs, max_inputs: int) -> tuple[bool, list[str]]:
    """TEI's `inputs` as (is_single, texts). As in TEI, a top-level list of exactly two strings is ONE
    (text, text_pair) input; a pair is scored as the concatenation `text + text_pair` (rmkit's
    prompt + response)."""

    def one(item) -> str:
        if isinstance(item, str):
            return item
        if isinstance(item, list) and len(item) == 2 and all(isinstance(s, str) for s in item):
            return item[0] + item[1]
        raise HTTPError(422, "each of 'inputs' must be a string or a [text, text_pair] list of two strings")

    if isinstance(inputs, str) or (isinstance(inputs, list) and len(inputs) == 2
                                   and all(isinstance(s, str) for s in inputs)):
        return True, [one(inputs)]
    if not isinstance(inputs, list):
        raise HTTPError(422, "'inputs' must be a string, a [text, text_pair] pair, or a list of them")
    check_count(inputs, "inputs", max_inputs)
    return False, [one(item) for item in inputs]
