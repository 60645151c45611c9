"""Prompts for GRPO: prompt files (text or messages), the prompts of a preference file (deduplicated),
and the data contract for bad records (file:line:field, or skipped with a reason)."""

import json

import pytest

from rmkit.data.prompts import load_prompts
from rmkit.errors import DataError


def _write(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_prompt_file_text_and_messages(tmp_path):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    path = _write(tmp_path / "p.jsonl", [{"prompt": "Name a river."}, {"messages": chat}, {"prompt": "Name a river."}])
    result = load_prompts(path)
    assert result.format == "prompts"
    assert [p.prompt for p in result.records] == ["Name a river.", chat]  # the repeat is kept once
    assert result.records[1].source == f"{path}:2"


def test_preference_file_gives_its_prompts(tmp_path):
    pairs = [{"prompt": f"Q{i % 2}", "chosen": "a", "rejected": "b"} for i in range(4)]
    result = load_prompts(_write(tmp_path / "pairs.jsonl", pairs))
    assert result.format == "binary" and [p.prompt for p in result.records] == ["Q0", "Q1"]


def test_an_aligner_file_holds_no_prompts(tmp_path):
    """Its prompts are joined to their answers: read as pairs, every prompt would be the empty one."""
    path = _write(tmp_path / "a.jsonl", [{"text": "User: hi\nAssistant: hello"}, {"text": "User: hi\nAssistant: go"}])
    with pytest.raises(DataError, match=rf"^{path}: an aligner comparison file joins each prompt to its answer"):
        load_prompts(path)


@pytest.mark.parametrize("record, field", [
    ({"prompt": ""}, "prompt"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}, "messages[1]"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"prompt": 3}, "prompt"),
])
def test_bad_record_names_file_line_field_or_is_skipped(tmp_path, record, field):
    path = _write(tmp_path / "p.jsonl", [{"prompt": "fine"}, record])
    with pytest.raises(DataError) as err:
        load_prompts(path)
    assert (err.value.path, err.value.line, err.value.field) == (str(path), 2, field)
    skipped = load_prompts(path, on_error="skip")
    assert [p.prompt for p in skipped.records] == ["fine"] and skipped.skipped[0][0] == f"{path}:2"


def test_broken_json_line(tmp_path):
    path = _write(tmp_path / "p.jsonl", [{"prompt": "fine"}, "{not json"])
    with pytest.raises(DataError) as err:
        load_prompts(path)
    assert err.value.line == 2
