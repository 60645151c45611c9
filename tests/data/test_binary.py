"""The binary layout from JSON Lines, and every bad-input case naming file, line and field."""

import json

import pytest

from rmkit.data import load_preference_data, write_rejects
from rmkit.errors import DataError

from .conftest import write_jsonl

GOOD = {"prompt": "Q?", "chosen": "yes", "rejected": "no"}
CHAT = {
    "prompt": [{"role": "user", "content": "Q?"}],
    "chosen": [{"role": "assistant", "content": "yes"}],
    "rejected": "no",
    "margin": 2,
}


def test_binary_round_trip(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD, "", CHAT])
    result = load_preference_data(path)
    assert result.format == "binary" and result.skipped == [] and result.warnings == []
    first, second = result.records
    assert (first.prompt, first.chosen, first.rejected, first.margin) == ("Q?", "yes", "no", None)
    assert first.source == f"{path}:1"
    assert second.prompt == CHAT["prompt"] and second.chosen == CHAT["chosen"] and second.margin == 2.0
    assert second.source == f"{path}:3"  # the blank line 2 still counts


def test_custom_keys(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"q": "Q", "good": "a", "bad": "b"}])
    result = load_preference_data(path, "binary", prompt_key="q", chosen_key="good", rejected_key="bad")
    assert result.records[0].chosen == "a"


BAD_LINES = [
    ('{"prompt": "Q", "chosen": "a", ', None, "invalid JSON"),
    ({"prompt": "Q", "chosen": "a"}, "rejected", "missing"),
    ({"prompt": "Q", "chosen": "  ", "rejected": "b"}, "chosen", "empty"),
    ({"prompt": "Q", "chosen": 3, "rejected": "b"}, "chosen", "expected a string or a list"),
    ({"prompt": "Q", "chosen": "a", "rejected": "b", "margin": "x"}, "margin", "expected a number"),
    ('{"prompt": "Q", "chosen": "a", "rejected": "b", "margin": NaN}', "margin", "finite"),
    ('{"prompt": "Q", "chosen": "a", "rejected": "b", "margin": Infinity}', "margin", "finite"),
    ({"prompt": [{"role": "user"}], "chosen": "a", "rejected": "b"}, "prompt[0].content", "expected a string"),
    ({"prompt": [{"role": "robot", "content": "x"}], "chosen": "a", "rejected": "b"}, "prompt[0].role", "expected one of"),
    ('["not", "an", "object"]', None, "expected a JSON object"),
]


@pytest.mark.parametrize("line, field, message", BAD_LINES)
def test_bad_record_names_file_line_and_field(tmp_path, line, field, message):
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD, line])
    with pytest.raises(DataError) as info:
        load_preference_data(path)
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), 2, field)
    assert message in err.message and f"{path}:2:" in str(err)


def test_non_utf8_byte(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n" + b'{"prompt": "\xff"}\n')
    with pytest.raises(DataError, match=rf"{path}:2: not valid UTF-8 \(byte 0xff"):
        load_preference_data(path)


@pytest.mark.parametrize("content", [b"", b"\n  \n"])
def test_empty_file(tmp_path, content):
    path = tmp_path / "d.jsonl"
    path.write_bytes(content)
    with pytest.raises(DataError, match="empty") as info:
        load_preference_data(path, on_error="skip")  # an empty file is never skippable
    assert info.value.path == str(path)


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_preference_data(tmp_path / "nope.jsonl")


def test_identical_is_a_warning_or_an_error(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD, {"prompt": "Q", "chosen": "same", "rejected": "same"}])
    result = load_preference_data(path)
    assert len(result.records) == 2 and result.warnings == [(f"{path}:2", "chosen and rejected are identical")]
    with pytest.raises(DataError, match=rf"{path}:2: field 'chosen': chosen and rejected are identical"):
        load_preference_data(path, on_identical="error")
    skipped = load_preference_data(path, on_identical="error", on_error="skip")
    assert len(skipped.records) == 1 and skipped.skipped[0][0] == f"{path}:2"


def test_skip_counts_and_writes_rejects(tmp_path):
    rows = [GOOD, BAD_LINES[0][0], BAD_LINES[1][0], GOOD]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    result = load_preference_data(path, on_error="skip")
    assert [r.source for r in result.records] == [f"{path}:1", f"{path}:4"]
    assert [s for s, _ in result.skipped] == [f"{path}:2", f"{path}:3"]
    assert "field 'rejected': missing" in result.skipped[1][1]
    rejects = tmp_path / "out" / "rejects.jsonl"
    write_rejects(rejects, result.skipped)
    lines = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert lines[0]["source"] == f"{path}:2" and "invalid JSON" in lines[0]["reason"]


def test_empty_response_allowed_on_request(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD, {"prompt": "Q", "chosen": "an answer", "rejected": ""}])
    with pytest.raises(DataError, match=rf"{path}:2: field 'rejected': is empty"):
        load_preference_data(path)
    result = load_preference_data(path, allow_empty_response=True)
    assert result.records[1].rejected == ""
    prompt_empty = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "", "chosen": "a", "rejected": "b"}])
    with pytest.raises(DataError, match="field 'prompt': is empty"):
        load_preference_data(prompt_empty, allow_empty_response=True)


def test_byte_order_mark_and_crlf(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD).encode() + b"\r\n" + json.dumps(GOOD).encode() + b"\r\n")
    assert len(load_preference_data(path).records) == 2
