"""The OpenAPI description of `rmkit serve`: request and response models of every route.

Requests are still read by hand in `rmkit.serve.routes` (so a bad request gets rmkit's one JSON error naming
the field, not pydantic's list), but every body that a route accepts and every answer it gives, errors
included, is described here and published at `/openapi.json`; `tests/serve/test_openapi.py` runs a
schema-driven fuzzer (schemathesis) against it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field

from rmkit.data.validate import ROLES

Role = Literal[ROLES]  # type: ignore[valid-type]


class _Open(BaseModel):
    """Clients send more fields than a route reads (vLLM's `priority`, OpenAI's `user`, ...): allowed."""

    model_config = ConfigDict(extra="allow")


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    role: Role
    content: str | list[TextPart]


Text = Annotated[str, Field(min_length=1)]


class NativeTextsRequest(_Open):
    """rmkit's native scoring of texts (send `texts` or `conversations`, not both)."""

    texts: list[Text] = Field(min_length=1)


class NativeConversationsRequest(_Open):
    """rmkit's native scoring of conversations (send `texts` or `conversations`, not both)."""

    conversations: list[list[Message]] = Field(min_length=1)


class VllmScoreRequest(_Open):
    """vLLM's score API: one first text against every second text, or equal-length lists in pairs."""

    model: str | None = None
    text_1: str | list[str] | None = None
    text_2: str | list[str] | None = None
    queries: str | list[str] | None = None
    documents: str | list[str] | None = None
    use_activation: bool | None = None
    activation: bool | None = None
    softmax: bool | None = None


TokenIds = list[int] | list[list[int]]


class ClassifyRequest(_Open):
    """vLLM's classify (and pooling) API: `input` (text(s) or token ids) or `messages`."""

    model: str | None = None
    input: str | list[str] | TokenIds | None = None
    messages: list[Message] | None = None
    use_activation: bool | None = None
    activation: bool | None = None
    softmax: bool | None = None
    add_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None


class PredictRequest(_Open):
    """text-embeddings-inference: a text, a [text] / [text, text_pair] list, or a list of such lists."""

    inputs: str | list[str] | list[list[str]]
    raw_scores: bool = False
    truncate: bool | None = None
    truncation_direction: Literal["left", "Left"] | None = None


class GetRewardRequest(_Open):
    """OpenRLHF's remote reward model."""

    query: Text | list[Text]
    prompts: list | None = None
    labels: list | None = None


class EmbeddingsRequest(_Open):
    model: str | None = None
    input: Text | list[Text]


class RerankRequest(_Open):
    model: str | None = None
    query: str
    documents: list[str]
    top_n: int | None = Field(default=None, ge=0)
    use_activation: bool | None = None


class StepSolution(BaseModel):
    """A solution for a process reward model: its prompt (plain text) and its steps, none holding the separator."""

    prompt: Text
    steps: list[Text] = Field(min_length=1)


class ScoreStepsRequest(_Open):
    """A process reward model's scoring of solutions, step by step."""

    solutions: list[StepSolution] = Field(min_length=1)


class ErrorResponse(BaseModel):
    """Every 4xx / 5xx answer (OpenAI / vLLM's error shape)."""

    object: Literal["error"]
    message: str
    type: str
    code: int


class ScoreUsage(BaseModel):
    tokens: int
    truncated: int


class NativeScoreResponse(BaseModel):
    model: str
    usage: ScoreUsage
    rewards: list[float] | list[list[float]]
    scores: list[float] | None = None


class StepResult(BaseModel):
    step_rewards: list[float | None]
    """Each step's probability of being correct; null for a step past the max length."""
    reward: float | None
    """Their aggregate (`step_aggregation`); null when a step is cut."""


class ScoreStepsResponse(BaseModel):
    model: str
    step_aggregation: Literal["min", "prod", "last"]
    results: list[StepResult]
    usage: ScoreUsage


class TokenUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0
    prompt_tokens_details: None = None


class ClassifyItem(BaseModel):
    index: int
    label: str
    probs: list[float]
    num_classes: int


class ClassifyResponse(BaseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ClassifyItem]
    usage: TokenUsage


class ScoreItem(BaseModel):
    index: int
    object: Literal["score"]
    score: float


class VllmScoreResponse(BaseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ScoreItem]
    usage: TokenUsage


class PoolingItem(BaseModel):
    index: int
    object: Literal["pooling"]
    data: list[float]


class PoolingResponse(BaseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[PoolingItem]
    usage: TokenUsage


class Prediction(BaseModel):
    score: float
    label: str


class GetRewardResponse(BaseModel):
    rewards: list[float]
    scores: list[float]
    extra_logs: dict[str, list[int]]


class EmbeddingItem(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float]


class EmbeddingsUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"]
    data: list[EmbeddingItem]
    model: str
    usage: EmbeddingsUsage


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    document: RerankDocument
    relevance_score: float


class RerankUsage(BaseModel):
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    parent: None = None
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok"]
    model: str
    num_labels: int
    max_length: int
    step_separator: str | None = None
    """A process reward model's step separator; null for a model that scores whole texts."""
    step_aggregation: Literal["min", "prod", "last"] | None = None


# Per POST path: the request models (any of) and the 200 response models (any of).
ROUTE_MODELS: dict[str, tuple[tuple[type[BaseModel], ...], tuple[object, ...]]] = {
    "/v1/score": ((NativeTextsRequest, NativeConversationsRequest, VllmScoreRequest),
                  (NativeScoreResponse, VllmScoreResponse)),
    "/classify": ((ClassifyRequest,), (ClassifyResponse,)),
    "/v1/classify": ((ClassifyRequest,), (ClassifyResponse,)),
    "/predict": ((PredictRequest,), (list[Prediction], list[list[Prediction]])),
    "/get_reward": ((GetRewardRequest,), (GetRewardResponse,)),
    "/v1/embeddings": ((EmbeddingsRequest,), (EmbeddingsResponse,)),
    "/score": ((VllmScoreRequest,), (VllmScoreResponse,)),
    "/rerank": ((RerankRequest,), (RerankResponse,)),
    "/v1/rerank": ((RerankRequest,), (RerankResponse,)),
    "/pooling": ((ClassifyRequest,), (PoolingResponse,)),
    "/v1/score_steps": ((ScoreStepsRequest,), (ScoreStepsResponse,)),
}
ERROR_STATUSES = {400: "bad request (a field's value)", 401: "missing or wrong API key",
                  413: "too many inputs or too large a body", 422: "a field of the wrong type",
                  500: "internal error"}
REF = "#/components/schemas/{model}"


def _schema(model, components: dict) -> dict:
    """The JSON schema of a model or a `list[...]` of models, its definitions added to `components`."""
    from pydantic import TypeAdapter

    schema = TypeAdapter(model).json_schema(ref_template=REF)
    components.update(schema.pop("$defs", {}))
    if isinstance(model, type) and issubclass(model, BaseModel):
        components[model.__name__] = schema
        return {"$ref": REF.format(model=model.__name__)}
    return schema


def install_openapi(app: FastAPI) -> None:
    """Replace the app's generated description (which knows no bodies: routes read them by hand) with one
    that declares every POST route's request and responses and the GET routes' answers."""

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        spec = get_openapi(title=app.title, version="1", routes=app.routes)
        components = spec.setdefault("components", {}).setdefault("schemas", {})
        error = {"content": {"application/json": {"schema": _schema(ErrorResponse, components)}}}
        for path, (requests, answers) in ROUTE_MODELS.items():
            operation = spec["paths"][path]["post"]
            body = [_schema(m, components) for m in requests]
            operation["requestBody"] = {"required": True, "content": {"application/json": {
                "schema": body[0] if len(body) == 1 else {"anyOf": body}}}}
            ok = [_schema(m, components) for m in answers]
            operation["responses"] = {"200": {"description": "scored", "content": {"application/json": {
                "schema": ok[0] if len(ok) == 1 else {"anyOf": ok}}}}}
            for status, why in ERROR_STATUSES.items():
                operation["responses"][str(status)] = {"description": why, **error}
        for path, model in (("/health", Health), ("/v1/models", ModelList)):
            spec["paths"][path]["get"]["responses"] = {"200": {"description": "ok", "content": {
                "application/json": {"schema": _schema(model, components)}}}}
        spec["paths"]["/metrics"]["get"]["responses"] = {"200": {"description": "Prometheus text format",
                                                                 "content": {"text/plain": {"schema": {"type": "string"}}}}}
        app.openapi_schema = spec
        return spec

    app.openapi = openapi
