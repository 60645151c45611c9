"""The HTTP app of `rmkit serve`: rmkit's own route plus vLLM- and TEI-compatible ones.

    POST /v1/score   {"texts": [str]} | {"conversations": [[{"role", "content"}]]}
                     -> {"rewards", "model", "usage": {"tokens", "truncated"}} (+ "scores" for K > 1 with
                     attribute weights)
    POST /classify   vLLM classify API: {"model", "input": str | [str]} | {"messages": [...]},
                     "use_activation" (default true: sigmoid for one label, softmax over several)
    POST /get_reward OpenRLHF's remote reward model: {"query": [str], "prompts", "labels"}
                     -> {"rewards", "scores", "extra_logs"}
    POST /v1/embeddings  OpenAI embeddings shape (SGLang, verl's SGLang branch): each input's raw head
                     output as its "embedding"
    POST /score, /rerank (/v1/rerank), /pooling   vLLM's score, rerank and pooling APIs (a vLLM score
                     request to /v1/score is answered the same way)
    GET  /v1/models  the OpenAI / vLLM model list
    POST /predict    text-embeddings-inference: {"inputs": str | [str] | [str, str] | [[str, str]],
                     "raw_scores"} -> [{"score", "label"}] per input (a list of lists for a batch)
    POST /v1/score_steps  a process reward model's steps: {"solutions": [{"prompt": str, "steps": [str]}]}
                     -> {"results": [{"step_rewards", "reward"}], "model", "step_aggregation", "usage"}; the
                     whole-text routes above answer 400 for a process reward model, /v1/score_steps 400 for
                     any other
    GET  /health (with the model's step_separator and step_aggregation, null for an outcome model),
    GET  /metrics (Prometheus text)

Bodies are read here and checked in `rmkit.serve.routes`, not by pydantic, so every bad request gets one JSON error in the
OpenAI/vLLM shape `{"object": "error", "message", "type", "code"}` that names the problem; `rmkit.serve.schemas`
describes every body and answer at `/openapi.json`.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from rmkit.data.readers import unencodable
from rmkit.serve.engine import InputError, ScoringEngine
from rmkit.serve.metrics import ServerMetrics
from rmkit.serve.routes import (
    HTTPError,
    classify_route,
    embeddings_route,
    get_reward_route,
    models_listing,
    pooling_route,
    predict_route,
    refuse_process_model,
    rerank_route,
    score_route,
    score_steps_route,
    vllm_score_route,
)
from rmkit.serve.schemas import install_openapi

log = logging.getLogger("rmkit.serve")
ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 413: "PayloadTooLargeError",
               422: "UnprocessableEntityError", 500: "InternalServerError"}


# POST routes that score: each needs the API key when one is set, unless named in `open_routes`.
SCORING_ROUTES = {"/v1/score": score_route, "/classify": classify_route, "/v1/classify": classify_route,
                  "/predict": predict_route, "/get_reward": get_reward_route, "/v1/embeddings": embeddings_route,
                  "/score": vllm_score_route, "/rerank": rerank_route, "/v1/rerank": rerank_route,
                  "/pooling": pooling_route, "/v1/score_steps": score_steps_route}
# The routes that score a whole text, which a process reward model does not serve (`refuse_process_model`).
WHOLE_TEXT_ROUTES = frozenset(SCORING_ROUTES) - {"/v1/score_steps"}


def error_response(status: int, message: str) -> JSONResponse:
    body = {"object": "error", "message": message, "type": ERROR_TYPES.get(status, "Error"), "code": status}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


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
    if b"\\u" in body and (bad := unencodable(payload)) is not None:  # only an escape makes a lone surrogate
        raise HTTPError(400, f"'{bad[0]}' {bad[1]}")
    return payload


def create_app(
    engine: ScoringEngine,
    api_key: str | None = None,
    max_inputs: int = 1024,
    max_body_bytes: int = 16 * 1024 * 1024,
    open_routes: frozenset[str] = frozenset(),
) -> FastAPI:
    """The FastAPI app serving `engine`; every scoring route requires `Bearer api_key` when one is set,
    except the paths in `open_routes` (for clients that cannot send headers: OpenRLHF, verl)."""
    metrics = ServerMetrics(queue_depth=lambda: engine.queue_depth)
    engine.on_batch = metrics.observe_batch

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        engine.close()  # uvicorn has finished the in-flight requests by now

    app = FastAPI(title="rmkit reward model server", lifespan=lifespan)
    install_openapi(app)
    app.state.engine, app.state.metrics = engine, metrics

    def authorize(request: Request, route: str) -> None:
        if api_key is None or route in open_routes:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise HTTPError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'")

    async def handle(request: Request, route: str, work: Callable[[dict], Awaitable[object]]):
        start, status = time.perf_counter(), 200
        metrics.in_flight += 1
        try:
            authorize(request, route)
            if route in WHOLE_TEXT_ROUTES:
                refuse_process_model(engine, route)
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

    for path, route in SCORING_ROUTES.items():
        app.add_api_route(path, _bind(handle, path, partial(route, engine, max_inputs=max_inputs)), methods=["POST"])

    @app.get("/health")
    async def health() -> dict:
        contract = engine.scorer.contract
        return {"status": "ok", "model": engine.model_name, "num_labels": engine.num_labels,
                "max_length": engine.max_length, "step_separator": contract.step_separator,
                "step_aggregation": contract.step_aggregation}

    started = int(time.time())

    @app.get("/v1/models")
    async def models() -> dict:
        return models_listing(engine, started)

    @app.get("/metrics")
    async def metrics_route() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    return app


def _bind(handle, path: str, work):
    async def endpoint(request: Request):
        return await handle(request, path, work)

    endpoint.__name__ = "route_" + path.strip("/").replace("/", "_")
    return endpoint


