"""The records every rmkit reader produces and every trainer, evaluator and scorer consumes.

A prompt or response is either plain text or a list of chat messages (`{"role", "content"}`).
`source` locates the record for error messages and rejects files: `"path:line"` for line-oriented
files, `"name[index]"` for JSON arrays, Parquet files and Hugging Face datasets.
"""

from __future__ import annotations

from dataclasses import dataclass

Message = dict  # {"role": str, "content": str}

MISSING_LABEL = -100.0  # a regression label that the loss ignores (HelpSteer style)


@dataclass(frozen=True)
class PreferencePair:
    """One human preference: `chosen` was preferred to `rejected` as a reply to `prompt`.

    `margin` is an optional preference strength (e.g. a rating difference) for margin losses.
    `subset` and `id` are optional labels a record may carry (RewardBench's layout `{prompt, chosen,
    rejected, subset, id}`); `rmkit eval --report` groups pairs by `subset`.
    """

    prompt: str | list[Message]
    chosen: str | list[Message]
    rejected: str | list[Message]
    margin: float | None = None
    source: str = ""
    subset: str | None = None
    id: str | int | None = None


@dataclass(frozen=True)
class RegressionExample:
    """A text with K attribute scores; `MISSING_LABEL` (-100.0) marks an attribute not rated.

    `response` is None when `prompt` holds the whole text (prompt and response already joined).
    """

    prompt: str | list[Message]
    response: str | list[Message] | None
    labels: tuple[float, ...]
    source: str = ""

