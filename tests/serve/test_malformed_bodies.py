"""Every scoring route of a real server against bodies a client gets wrong: each answer is a 4xx naming what is
wrong, never a 500 (a lone surrogate escape, `"\\ud800"`, valid JSON but no text, reached the tokenizer of four
routes and came back as an internal error)."""

import httpx
import pytest
from serve_helpers import API_KEY

from rmkit.serve.server import SCORING_ROUTES

AUTH = {"Authorization": f"Bearer {API_KEY}", "content-type": "application/json"}
BODIES = [
    '[]', '"x"', '1', 'null', 'not json', '{"input": "x"', '{"input": null}', '{"input": [null]}', '{"input": [1, 2]}',
    '{"input": [[1, "a"]]}', '{"input": {"a": 1}}', '{"input": 1e999}', '{"input": "\\ud800"}', '{"texts": ["\\udc00"]}',
    '{"texts": {"a": 1}}', '{"texts": ["a"], "conversations": []}', '{"conversations": [[{"role": "user"}]]}',
    '{"conversations": [[{"role": "user", "content": 1}]]}', '{"query": 5}', '{"queries": [1]}', '{"queries": "abc"}',
    '{"inputs": [[]]}', '{"inputs": [["a", "b", "c"]]}', '{"inputs": "a", "truncation_direction": 5}',
    '{"text_1": 1, "text_2": "b"}', '{"text_1": "a", "text_2": []}', '{"query": "q", "documents": [1]}',
    '{"query": "q", "documents": ["a"], "top_n": -1}', '{"query": "q", "documents": ["a"], "top_n": "x"}',
    '{"input": "x", "model": 5}', '{"input": ["a"], "activation": 2}', '{"input": "x", "dimensions": -1}',
    '{"solutions": 5}', '{"solutions": [{"prompt": "p", "steps": "s"}]}', '{"solutions": [{"prompt": "\\ud800", "steps": ["a"]}]}',
]


@pytest.mark.parametrize("route", sorted(SCORING_ROUTES))
def test_no_body_gets_a_server_error(bt_server, route):
    failures = []
    with httpx.Client(base_url=bt_server.url, timeout=30) as client:
        for body in BODIES:
            response = client.post(route, content=body.encode(), headers=AUTH)
            wrong = response.status_code >= 500 or (response.status_code >= 400 and "message" not in response.json())
            if wrong:  # a body some route reads (extra keys are ignored) may well be answered 200
                failures.append((body, response.status_code, response.text[:200]))
    assert not failures, failures


def test_a_lone_surrogate_is_named(bt_server):
    response = httpx.post(bt_server.url + "/v1/score", content=b'{"texts": ["fine", "\\ud800"]}', headers=AUTH)
    assert response.status_code == 400
    assert "'texts' holds a lone surrogate (\\ud800)" in response.json()["message"]
