"""Which benchmark layout a data file holds, recognised from its first record, and its records located by
file line.

- `pairs`: one chosen and one rejected response per record (RewardBench v1 and every layout
  `rmkit.data.load_preference_data` reads).
- `rewardbench2`: RewardBench 2's best-of-N rows, `chosen` and `rejected` lists with `num_correct`.
- `rm-bench`: RM-Bench's rows, `chosen` and `rejected` as the same answer in three styles.
- `processbench`: ProcessBench's rows, a `problem`, its solution in `steps` and `label`, the first wrong step
  (scored by a process reward model).
- `prmbench`: PRMBench's rows, a clean and a modified solution with its `error_steps` and `classification`
  (scored by a process reward model).

RM-Bench publishes pretty-printed JSON lists, so a bad record is named by the line where its object opens
(`located_records`), not by its index.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from rmkit.data.readers import JSON_SUFFIXES, JSONL_SUFFIXES, PARQUET_SUFFIXES, RawRecord, read_records
from rmkit.errors import DataError

LAYOUTS = ("auto", "pairs", "rewardbench2", "rm-bench", "processbench", "prmbench")


def layout_of_record(data: dict) -> str:
    """`rewardbench2` when `chosen` is a list and `num_correct` is present; `rm-bench` when `chosen` and
    `rejected` are lists of texts (styles); `processbench` when it has `problem`, `steps` and `label`; `prmbench`
    when it has `original_process`, `modified_process` and `error_steps`; else `pairs` (a list of chat messages is
    a conversation)."""
    if {"problem", "steps", "label"} <= set(data):
        return "processbench"
    if {"original_process", "modified_process", "error_steps"} <= set(data):
        return "prmbench"
    chosen, rejected = data.get("chosen"), data.get("rejected")
    if isinstance(chosen, list) and "num_correct" in data:
        return "rewardbench2"
    texts = all(isinstance(c, list) and c and all(isinstance(x, str) for x in c) for c in (chosen, rejected))
    return "rm-bench" if texts else "pairs"


def is_local_file(path: str) -> bool:
    lower = str(path).lower()
    return Path(path).is_file() and lower.endswith(JSONL_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES)


def detect_layout(path: str) -> str:
    """The layout of a local JSONL / JSON / Parquet file from its first readable record; anything else (a
    Hugging Face dataset, a folder) is read as `pairs`."""
    if not is_local_file(path):
        return "pairs"
    for item in located_records(path):
        if isinstance(item, RawRecord):
            return layout_of_record(item.data)
    return "pairs"  # no readable record: the pairs loader names the first bad line


def located_records(path: str) -> Iterator[RawRecord | DataError]:
    """`rmkit.data.read_records`, except that a JSON list's records carry the 1-based line where each
    object opens (a pretty-printed file's error then names a line an editor can jump to)."""
    if not str(path).lower().endswith(JSON_SUFFIXES) or not Path(path).is_file():
        yield from read_records(path)
        return
    text = Path(path).read_bytes().decode("utf-8", errors="replace").removeprefix("\ufeff")
    stripped = text.lstrip()
    if not stripped.startswith("["):
        yield from read_records(path)  # `{"data": [...]}` or one object: the index-based reader
        return
    decoder, position = json.JSONDecoder(), len(text) - len(stripped) + 1
    while True:
        position = _skip(text, position, ",")
        if position >= len(text) or text[position] == "]":
            return
        line = text.count("\n", 0, position) + 1
        try:
            value, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError as err:
            raise DataError(path, err.lineno, None, f"invalid JSON: {err.msg} (column {err.colno})") from None
        if isinstance(value, dict):
            yield RawRecord(str(path), line, value)
        else:
            yield DataError(str(path), line, None, f"expected a JSON object, got {type(value).__name__}")


def _skip(text: str, position: int, separators: str) -> int:
    """The next position past whitespace and `separators`."""
    while position < len(text) and (text[position].isspace() or text[position] in separators):
        position += 1
    return position


def records_or_raise(path: str) -> Iterator[RawRecord]:
    """`located_records`, raising the first unreadable record's `DataError`."""
    for item in located_records(path):
        if isinstance(item, DataError):
            raise item
        yield item
