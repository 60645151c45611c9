"""Prompts for a policy to answer (GRPO's rollouts): prompt files, or the prompts of any preference file.

A prompt file holds one record per line (JSONL; JSON and Parquet too) with a `prompt` field (a text or a
list of chat messages) or a `messages` field (chat messages ending with a user turn). Any file that
`load_preference_data` reads gives its prompts instead (`format: auto` tells them apart by the fields), except
an aligner comparison file, whose prompts are joined to their answers.
The same prompt appearing twice is kept once. Bad records follow the data contract: a `DataError` naming
file:line:field, or with `on_error="skip"` they are listed in `.skipped` for a rejects file.

    result = load_prompts("prompts.jsonl")
    result.records   # list[Prompt]
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

from rmkit.data.load import LoadResult, _Collector, load_preference_data
from rmkit.data.readers import RawRecord, read_records
from rmkit.data.records import Message
from rmkit.data.validate import text_or_messages
from rmkit.errors import DataError

PREFERENCE_KEYS = ("completions", "response1", "text")  # ranked, helpsteer3, aligner (with chosen/rejected)


@dataclass(frozen=True)
class Prompt:
    """One prompt and where it came from (`file:line`)."""

    source: str
    prompt: str | list[Message]


def _is_prompt_record(record: RawRecord, prompt_key: str, chosen_key: str) -> bool:
    data = record.data
    if chosen_key in data or any(k in data for k in PREFERENCE_KEYS):
        return False
    return prompt_key in data or "messages" in data


def _parse_prompt(record: RawRecord, prompt_key: str) -> str | list[Message]:
    key = prompt_key if prompt_key in record.data or "messages" not in record.data else "messages"
    value = text_or_messages(record, key)
    if isinstance(value, list) and value[-1]["role"] == "assistant":
        raise record.error(f"{key}[{len(value) - 1}]", "a prompt must not end with an assistant message "
                                                        "(the policy writes the next assistant turn)")
    return value


def _prompt_records(items, prompt_key: str, collector: _Collector) -> list[Prompt]:
    prompts = []
    for item in items:
        if isinstance(item, DataError):
            collector.error(item)
            continue
        try:
            prompts.append(Prompt(item.source, _parse_prompt(item, prompt_key)))
        except DataError as err:
            collector.error(err, item.source)
    return prompts


def _dedupe(prompts: list[Prompt]) -> list[Prompt]:
    seen, kept = set(), []
    for prompt in prompts:
        key = json.dumps(prompt.prompt, sort_keys=True)
        if key not in seen:
            seen.add(key)
            kept.append(prompt)
    return kept


def load_prompts(path: str | Path, format: str = "auto", *, prompt_key: str = "prompt", chosen_key: str = "chosen",
                 rejected_key: str = "rejected", on_error: str = "raise", split: str = "train") -> LoadResult:
    """Prompts (`LoadResult.records`: list[Prompt], deduplicated) of a prompt file (`format="prompts"`), of a
    preference file (`format=` one of its formats), or either (`auto`: a record with `prompt` / `messages`
    and no response fields is a prompt record)."""
    collector = _Collector(on_error)
    items = None
    if format == "auto":
        items = read_records(path, split)
        first = []
        for item in items:
            first.append(item)
            if isinstance(item, RawRecord):
                format = "prompts" if _is_prompt_record(item, prompt_key, chosen_key) else "auto"
                break
        else:
            format = "prompts"
        items = chain(first, items)
    if format == "prompts":
        prompts = _prompt_records(items if items is not None else read_records(path, split), prompt_key, collector)
        collector.result.format = "prompts"
    else:
        pairs = load_preference_data(path, format, prompt_key=prompt_key, chosen_key=chosen_key,
                                     rejected_key=rejected_key, on_error=on_error, split=split)
        if pairs.format == "aligner":
            raise DataError(str(path), None, None, "an aligner comparison file joins each prompt to its answer in "
                                                   "`text`, so it holds no prompt to sample from: give a prompt file "
                                                   '({"prompt": ...} lines) or a preference file with a prompt field')
        collector.result.skipped, collector.result.format = list(pairs.skipped), pairs.format
        prompts = [Prompt(p.source, p.prompt) for p in pairs.records]
    collector.result.records = _dedupe(prompts)
    return collector.result
