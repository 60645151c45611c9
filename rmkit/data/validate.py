"""Field checks shared by every format: each failure is a `DataError` naming file, line and field."""

from __future__ import annotations

import math
from collections.abc import Callable

from rmkit.data.readers import RawRecord
from rmkit.data.records import Message

ROLES = ("system", "user", "assistant", "tool", "developer")
_UNSET = object()


def get_field(record: RawRecord, key: str):
    """The value of `key`, which must be present and not null."""
    if key not in record.data:
        present = ", ".join(sorted(map(str, record.data))) or "none"
        raise record.error(key, f"missing (fields present: {present})")
    value = record.data[key]
    if value is None:
        raise record.error(key, "is null")
    return value


def text_or_messages(record: RawRecord, key: str, value=_UNSET, allow_empty: bool = False) -> str | list[Message]:
    """A non-empty string or a non-empty list of `{"role", "content"}` messages (checked);
    `allow_empty` accepts an empty string (a response that was empty, e.g. a model that said nothing)."""
    value = get_field(record, key) if value is _UNSET else value
    if value is None:
        raise record.error(key, "is null")
    if isinstance(value, str):
        if not value.strip() and not allow_empty:
            raise record.error(key, "is empty (allow_empty_response=True / --allow-empty-response / "
                                    "data.allow_empty_response=true accepts empty responses)")
        return value
    if isinstance(value, list):
        return messages(record, key, value)
    raise record.error(key, f"expected a string or a list of chat messages, got {type(value).__name__}")


def messages(record: RawRecord, key: str, value) -> list[Message]:
    """A non-empty list of messages, each `{"role": str, "content": str}` (extra keys are dropped)."""
    return check_messages(value, key, record.error)


def check_messages(value, key: str, fail: Callable[[str, str], Exception]) -> list[Message]:
    """The one message check, for data files and server requests alike: `value` must be a non-empty list
    of `{"role": one of ROLES, "content": str or a list of text parts}` with some content; otherwise
    `fail(field, message)` is raised, `field` naming the place (`key[2].role`)."""
    if not isinstance(value, list):
        raise fail(key, f"expected a list of chat messages, got {type(value).__name__}")
    if not value:
        raise fail(key, "is an empty list of messages")
    checked = []
    for i, message in enumerate(value):
        where = f"{key}[{i}]"
        if not isinstance(message, dict):
            raise fail(where, f"expected a message object, got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or role not in ROLES:
            raise fail(f"{where}.role", f"expected one of {', '.join(ROLES)}, got {role!r}")
        if isinstance(content, list):
            content = text_parts(content, f"{where}.content", fail)
        if not isinstance(content, str):
            raise fail(f"{where}.content", f"expected a string, got {type(content).__name__}")
        checked.append({"role": role, "content": content})
    if not any(m["content"].strip() for m in checked):
        raise fail(key, "every message is empty")
    return checked


def text_parts(parts: list, where: str, fail: Callable[[str, str], Exception]) -> str:
    """OpenAI-style content parts `[{"type": "text", "text": str}, ...]` as one string, the parts joined by
    newlines (as vLLM renders them); any other part type is refused (rmkit scores text)."""
    texts = []
    for j, part in enumerate(parts):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise fail(f"{where}[{j}]", 'expected a text part {"type": "text", "text": str}')
        texts.append(part["text"])
    return "\n".join(texts)


def finite_number(record: RawRecord, key: str, value=_UNSET) -> float:
    """A finite int or float (not a bool, NaN or infinity)."""
    value = get_field(record, key) if value is _UNSET else value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "null" if value is None else type(value).__name__
        raise record.error(key, f"expected a number, got {kind}")
    if not math.isfinite(value):
        raise record.error(key, f"must be finite, got {value}")
    return float(value)


def optional_number(record: RawRecord, key: str | None) -> float | None:
    """`finite_number` when `key` is set and present (and not null), else None."""
    if key is None or record.data.get(key) is None:
        return None
    return finite_number(record, key)


def optional_text(record: RawRecord, key: str) -> str | None:
    """A non-empty string when `key` is present and not null, else None."""
    value = record.data.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise record.error(key, f"expected a non-empty string, got {value!r}")
    return value


def optional_id(record: RawRecord, key: str) -> str | int | None:
    """A string or an integer (not a bool) when `key` is present and not null, else None."""
    value = record.data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise record.error(key, f"expected a string or an integer, got {type(value).__name__}")
    return value


def labels(record: RawRecord, key: str, num_labels: int | None) -> tuple[float, ...]:
    """A number or a list of numbers, finite (or -100 for missing), of length `num_labels` if given."""
    value = get_field(record, key)
    values = value if isinstance(value, list) else [value]
    if not values:
        raise record.error(key, "is an empty list of labels")
    out = tuple(finite_number(record, f"{key}[{i}]" if isinstance(value, list) else key, v) for i, v in enumerate(values))
    if num_labels is not None and len(out) != num_labels:
        raise record.error(key, f"expected {num_labels} labels, got {len(out)}")
    return out
