"""Regression / multi-attribute records: text or prompt+response, label lists or attribute fields."""

import pytest

from rmkit.data import MISSING_LABEL, load_regression_data
from rmkit.errors import DataError

from .conftest import write_jsonl


def test_text_and_prompt_response_records(tmp_path):
    rows = [
        {"text": "Q A", "label": [1.0, -100]},
        {"prompt": [{"role": "user", "content": "Q"}], "response": "A", "label": [0.5, 2]},
    ]
    result = load_regression_data(write_jsonl(tmp_path / "r.jsonl", rows))
    first, second = result.records
    assert (first.prompt, first.response, first.labels) == ("Q A", None, (1.0, MISSING_LABEL))
    assert second.prompt == rows[1]["prompt"] and second.response == "A" and second.labels == (0.5, 2.0)


def test_scalar_label(tmp_path):
    result = load_regression_data(write_jsonl(tmp_path / "r.jsonl", [{"text": "t", "score": 3}]), label_key="score")
    assert result.records[0].labels == (3.0,)


def test_named_attributes_helpsteer_style(tmp_path):
    rows = [{"prompt": "Q", "response": "A", "helpfulness": 3, "correctness": 4}, {"prompt": "Q", "response": "B", "helpfulness": 1}]
    result = load_regression_data(write_jsonl(tmp_path / "r.jsonl", rows), attributes=["helpfulness", "correctness"])
    assert [r.labels for r in result.records] == [(3.0, 4.0), (1.0, MISSING_LABEL)]


@pytest.mark.parametrize("row, field, message", [
    ({"text": "t", "label": [1.0]}, "label", "expected 2 labels, got 1"),
    ('{"text": "t", "label": [1.0, NaN]}', "label[1]", "finite"),
    ('{"text": "t", "label": [1.0, -Infinity]}', "label[1]", "finite"),
    ({"text": "t", "label": [1.0, "x"]}, "label[1]", "expected a number"),
    ({"text": "", "label": [1.0, 2.0]}, "text", "empty"),
    ({"prompt": "p", "label": [1.0, 2.0]}, "response", "missing"),
    ({"text": "t"}, "label", "missing"),
])
def test_bad_regression_records(tmp_path, row, field, message):
    path = write_jsonl(tmp_path / "r.jsonl", [{"text": "ok", "label": [1, 2]}, row])
    with pytest.raises(DataError) as info:
        load_regression_data(path)
    assert (info.value.line, info.value.field) == (2, field) and message in info.value.message
    assert f"{path}:2:" in str(info.value)
    skipped = load_regression_data(path, on_error="skip")
    assert len(skipped.records) == 1 and skipped.skipped[0][0] == f"{path}:2"


def test_num_labels_checked_from_the_first_record(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [{"text": "a", "label": [1, 2, 3]}])
    with pytest.raises(DataError, match="expected 2 labels, got 3"):
        load_regression_data(path, num_labels=2)
