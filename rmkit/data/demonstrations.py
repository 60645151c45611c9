"""Demonstrations for supervised fine-tuning: what a policy should say, read from any layout rmkit knows.

Four layouts (`format`), sniffed from the first readable record when `auto`:

- `messages`: `{"messages": [{"role", "content"}, ...]}`, a whole conversation (multi-turn; the loss
  trains on every assistant turn);
- `prompt_response`: `{"prompt": text or messages, "response": text or assistant messages}` (keys
  configurable: `response_key="completion"` reads TRL's prompt-completion layout);
- `text`: `{"text": ...}`, TRL's plain-text (language-modeling) layout: every line a document, trained on
  every token (a `{"text"}` file is NeMo Aligner's comparison format only for the preference recipes; name
  `format: aligner` to fine-tune on its chosen lines);
- any preference format (`rmkit.data.FORMATS`): the chosen side of each pair, read by
  `load_preference_data` with all its checks.

Bad records are `DataError`s naming file, line and field, raised or (`on_error="skip"`) collected in
`.skipped` like every other loader. `tokenize_demonstrations` turns them into `DemonstrationIds`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rmkit.data.formats import FORMATS
from rmkit.data.load import LoadResult, _Collector, load_preference_data
from rmkit.data.policy_tokenize import (
    DemonstrationIds,
    TemplateMismatch,
    demonstration_ids,
    demonstration_messages,
    document_ids,
    fit_demonstration,
)
from rmkit.data.readers import RawRecord, read_records
from rmkit.data.records import Message
from rmkit.data.validate import get_field, text_or_messages
from rmkit.data.validate import messages as read_messages
from rmkit.errors import DataError

TEXT_KEY = "text"  # TRL's plain-text layout
DEMONSTRATION_FORMATS = ("auto", "messages", "prompt_response", "text", *(f for f in FORMATS if f != "auto"))


@dataclass(frozen=True)
class Demonstration:
    """A conversation to imitate: `prompt` is the whole conversation (messages) or the whole document (a
    text, trained on every token) when `response` is None, else the prompt (text, HH transcript or
    messages) that `response` answers."""

    prompt: str | list[Message]
    response: str | list[Message] | None = None
    source: str = ""
    field: str = "messages"  # the record's field a "no assistant token" error names


def load_demonstrations(path: str | Path, format: str = "auto", *, messages_key: str = "messages",
                        prompt_key: str = "prompt", response_key: str = "response", chosen_key: str = "chosen",
                        rejected_key: str = "rejected", allow_empty_response: bool = False, keep_ties: bool = False,
                        on_error: str = "raise", split: str = "train") -> LoadResult:
    """Read demonstrations (`.records`: list[Demonstration]) from a file or dataset (module docstring)."""
    if format not in DEMONSTRATION_FORMATS:
        raise DataError(str(path), None, None,
                        f"unknown format '{format}' for demonstrations; choose one of {', '.join(DEMONSTRATION_FORMATS)}")
    items = read_records(path, split)
    first, items = _peek(items)
    if format == "auto":
        format = _sniff(first, messages_key, response_key)
    if format not in ("messages", "prompt_response", "text"):
        loaded = load_preference_data(path, format, prompt_key=prompt_key, chosen_key=chosen_key,
                                      rejected_key=rejected_key, allow_empty_response=allow_empty_response,
                                      keep_ties=keep_ties, on_error=on_error, split=split)
        loaded.records = [Demonstration(p.prompt, p.chosen, p.source, chosen_key) for p in loaded.records]
        return loaded
    collector = _Collector(on_error)
    collector.result.format = format
    for item in items:
        if isinstance(item, DataError):
            collector.error(item)
            continue
        try:
            if format == "messages":
                collector.result.records.append(_conversation(item, messages_key))
            elif format == "text":
                collector.result.records.append(Demonstration(_document(item), None, item.source, TEXT_KEY))
            else:
                collector.result.records.append(_prompt_response(item, prompt_key, response_key, allow_empty_response))
        except DataError as err:
            collector.error(err, item.source)
    return collector.result


def _peek(items: Iterator) -> tuple[RawRecord | None, Iterator]:
    seen, first = [], None
    for item in items:
        seen.append(item)
        if isinstance(item, RawRecord):
            first = item
            break

    def chained():
        yield from seen
        yield from items

    return first, chained()


def _sniff(record: RawRecord | None, messages_key: str, response_key: str) -> str:
    if record is None:
        return "messages"  # every line was unreadable: report them as such
    if messages_key in record.data:
        return "messages"
    if response_key in record.data:
        return "prompt_response"
    if TEXT_KEY in record.data:
        return "text"
    prompt, response = _named_like(record.data, PROMPT_LIKE), _named_like(record.data, RESPONSE_LIKE)
    if prompt and response:  # instruction/output, question/answer, ...: say which keys read it
        raise record.error(None, f"cannot tell the demonstration layout from the fields "
                                 f"({', '.join(sorted(map(str, record.data)))}): for prompt/response records name "
                                 f"the fields, data.prompt_key={prompt} data.response_key={response}")
    return "auto"  # a preference layout: load_preference_data sniffs which


# Field names other datasets give a prompt and its response (Alpaca's instruction/output, QA sets' question/answer).
PROMPT_LIKE = ("instruction", "question", "query", "input", "prompt")
RESPONSE_LIKE = ("output", "answer", "completion", "response", "target")


def _named_like(data: dict, names: tuple[str, ...]) -> str | None:
    return next((name for name in names if isinstance(data.get(name), str)), None)


def _conversation(record: RawRecord, key: str) -> Demonstration:
    value = read_messages(record, key, get_field(record, key))
    if not any(m["role"] == "assistant" for m in value):
        raise record.error(key, "has no assistant message to learn from (SFT trains on the assistant turns)")
    if value[0]["role"] == "assistant":
        raise record.error(f"{key}[0].role", "the conversation starts with an assistant message; a reply needs a "
                                             "prompt (a system or user message) before it")
    return Demonstration(value, None, record.source, key)


def _document(record: RawRecord) -> str:
    value = text_or_messages(record, TEXT_KEY)
    if not isinstance(value, str):
        raise record.error(TEXT_KEY, "a plain-text record holds a text (for a conversation, use a `messages` field)")
    return value


def _prompt_response(record: RawRecord, prompt_key: str, response_key: str, allow_empty: bool) -> Demonstration:
    prompt = text_or_messages(record, prompt_key)
    response = text_or_messages(record, response_key, allow_empty=allow_empty)
    if isinstance(response, list) and any(m["role"] != "assistant" for m in response):
        raise record.error(response_key, "a response given as messages must hold assistant messages only")
    return Demonstration(prompt, response, record.source, response_key)


@dataclass
class TokenizedDemonstrations:
    """`.items` (DemonstrationIds); `.dropped` `[(source, reason)]` (overlong under `drop`, no trained
    token under `on_error="skip"`); `.truncated` how many were cut."""

    items: list[DemonstrationIds] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    truncated: int = 0


def tokenize_demonstrations(demos: Sequence[Demonstration], tokenizer, max_length: int, overlong: str = "truncate",
                            assistant_only: bool = True, only_final: bool = False,
                            on_error: str = "raise") -> TokenizedDemonstrations:
    """Token ids and loss masks of `demos` within `max_length` tokens (`overlong`: `truncate` or `drop`). A
    demonstration with no token to train on is a `DataError` naming it (or, `on_error="skip"`, dropped)."""
    out = TokenizedDemonstrations()
    for demo in demos:
        try:
            ids = _tokenized(demo, tokenizer, assistant_only, only_final)
        except DataError as err:
            if on_error == "raise":
                raise
            out.dropped.append((demo.source, f"field '{err.field}': {err.message}"))
            continue
        fitted, cut = fit_demonstration(tokenizer, ids, max_length)
        if cut and overlong == "drop":
            out.dropped.append((demo.source, f"longer than max_length {max_length} ({ids.length} tokens)"))
            continue
        out.truncated += cut
        out.items.append(fitted)
    return out


def _tokenized(demo: Demonstration, tokenizer, assistant_only: bool, only_final: bool) -> DemonstrationIds:
    path, _, line = demo.source.rpartition(":")
    where = (path, int(line)) if line.isdigit() else (demo.source, None)
    if demo.response is None and isinstance(demo.prompt, str):
        return document_ids(tokenizer, demo.prompt, demo.source)
    try:
        messages, first = demonstration_messages(tokenizer, demo.prompt, demo.response)
        ids = demonstration_ids(tokenizer, messages, assistant_only, only_final, demo.source, first)
    except TemplateMismatch as err:
        raise DataError(*where, demo.field, f"{err}; its assistant turns cannot be found (set policy.tokenizer."
                                            "chat_template to a template that renders turns incrementally)") from None
    except ValueError as err:
        raise DataError(*where, demo.field, str(err)) from None
    if not any(ids.token_mask):
        raise DataError(*where, demo.field, "no assistant token to learn from (the assistant turns render to no "
                                            "tokens)")
    return ids
