"""The served OpenAPI description is true: a schema-driven fuzzer (schemathesis) sends bodies generated from
`/openapi.json` to every route of the app, bounded in examples, and checks that no request gets a 5xx and
every answer (errors included) has a documented status, content type and schema."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

schemathesis = pytest.importorskip("schemathesis")

from schemathesis.specs.openapi.checks import positive_data_acceptance  # noqa: E402

from rmkit.serve.engine import ScoringEngine  # noqa: E402
from rmkit.serve.server import create_app  # noqa: E402


@pytest.fixture
def app(bt_model_dir):
    # One app per test: its lifespan shuts the engine down when a test's client closes.
    return create_app(ScoringEngine(bt_model_dir, batch_window_ms=0), max_inputs=16, max_body_bytes=65536)


def test_every_route_answers_as_described(app):
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 13  # every POST route, /health, /v1/models, /metrics

    for operation in operations:
        @given(operation.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def answers_as_described(case):
            # Every check but "positive data is accepted": a body of the documented shape may still be
            # refused for its values (an empty text, more inputs than --max-inputs, lists of different
            # lengths), with a documented 400 / 413 that names the problem.
            case.call_and_validate(excluded_checks=[positive_data_acceptance])

        answers_as_described()


# A valid body per POST route: each answer, a 200, is checked against its documented schema too (random
# bodies mostly draw documented 400s).
VALID = {
    "/v1/score": [{"texts": ["the cat sat"]}, {"conversations": [[{"role": "user", "content": "hello"}]]},
                  {"text_1": "the cat", "text_2": ["sat", "is bad"]}],
    "/classify": [{"input": ["a dog", "the cat"]}, {"input": [1, 7, 9], "use_activation": False}],
    "/v1/classify": [{"messages": [{"role": "user", "content": "hello"}]}],
    "/predict": [{"inputs": "a dog"}, {"inputs": [["a dog"], ["the cat", " sat"]], "raw_scores": True}],
    "/get_reward": [{"query": ["a dog", "the cat"], "prompts": ["", ""]}],
    "/v1/embeddings": [{"input": "a dog"}],
    "/score": [{"queries": ["a", "b"], "documents": ["dog", "cat"]}],
    "/rerank": [{"query": "what is ", "documents": ["a dog", "the cat"], "top_n": 1}],
    "/v1/rerank": [{"query": "what is ", "documents": ["a dog"]}],
    "/pooling": [{"input": "a dog"}],
}


def test_valid_bodies_get_answers_of_the_documented_shape(app):
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    for path, bodies in VALID.items():
        for body in bodies:
            response = schema[path]["POST"].Case(body=body).call_and_validate()
            assert response.status_code == 200, (path, body)
    for path in ("/health", "/v1/models"):
        assert schema[path]["GET"].Case().call_and_validate().status_code == 200


def test_the_description_declares_bodies_and_errors(app):
    spec = app.openapi()
    for path in ("/v1/score", "/get_reward", "/predict", "/classify", "/rerank", "/pooling", "/v1/embeddings"):
        operation = spec["paths"][path]["post"]
        assert operation["requestBody"]["required"] is True
        assert {"200", "400", "401", "413", "422", "500"} <= set(operation["responses"])
