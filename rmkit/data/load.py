"""Loading preference and regression data: read a file or dataset, parse its format, validate each
record, and apply the `on_error` policy (raise the first bad record, or skip it and say why)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rmkit.data.formats import FORMATS, PARSERS, TIE_PREFIX, FormatOptions, detect_format, pair_aligner_lines
from rmkit.data.readers import RawRecord, read_records
from rmkit.data.records import MISSING_LABEL, PreferencePair, RegressionExample
from rmkit.data.validate import labels as read_labels
from rmkit.data.validate import text_or_messages
from rmkit.errors import DataError

ON_ERROR = ("raise", "skip")
ON_IDENTICAL = ("warn", "error")


@dataclass
class LoadResult:
    """What a loader returns: the usable records, what was skipped and why, and warnings."""

    records: list = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[tuple[str, str]] = field(default_factory=list)
    format: str = ""
    ties_skipped: int = 0  # entries of `.skipped` that are ties skipped under keep_ties=True

    @property
    def errors(self) -> list[tuple[str, str]]:
        """The skipped entries that are bad records (not ties skipped on purpose)."""
        return [entry for entry in self.skipped if not entry[1].startswith(TIE_PREFIX)]


def loaded_line(path: str | Path, count: int, noun: str, format: str) -> str:
    """What a data file gave, in the words `rmkit data check` and every training recipe print:
    `FILE: 12 pairs (binary format)`."""
    return f"{path}: {count} {noun}{'' if count == 1 else 's'} ({format} format)"


def _where(err: DataError) -> str:
    return err.path if err.line is None else f"{err.path}:{err.line}"


def _reason(err: DataError) -> str:
    return f"field '{err.field}': {err.message}" if err.field else err.message


class _Collector:
    """Applies the `on_error` policy: raise the first error, or record it as skipped."""

    def __init__(self, on_error: str):
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.on_error = on_error
        self.result = LoadResult()

    def error(self, err: DataError, source: str | None = None) -> None:
        if self.on_error == "raise":
            raise err
        self.result.skipped.append((source or _where(err), _reason(err)))


def load_preference_data(
    path: str | Path,
    format: str = "auto",
    *,
    prompt_key: str = "prompt",
    chosen_key: str = "chosen",
    rejected_key: str = "rejected",
    margin_key: str | None = "margin",
    text_key: str = "text",
    keep_ties: bool = False,
    allow_empty_response: bool = False,
    on_error: str = "raise",
    on_identical: str = "warn",
    split: str = "train",
) -> LoadResult:
    """Read preference pairs from JSON Lines, JSON, Parquet or a Hugging Face dataset (name or path).

    Args:
        path: a `.jsonl` / `.json` / `.parquet` file, a `save_to_disk` folder, or a dataset name.
        format: one of `FORMATS`: binary, ranked, aligner, helpsteer3, tulu3, hh_rlhf, or auto
            (sniffed from the first readable record's fields).
        prompt_key, chosen_key, rejected_key, margin_key: field names of the binary layout
            (chosen/rejected also name the tulu3 and hh_rlhf fields); `margin_key=None` ignores margins.
        text_key: the field of aligner comparison lines.
        keep_ties: ranked / helpsteer3 ties are an error by default; True skips them (counted).
        allow_empty_response: an empty chosen / rejected response is an error by default; True
            keeps it (real comparisons do rate a model that produced nothing: PandaLM has 33).
        on_error: "raise" the first bad record's `DataError`, or "skip" it (see `.skipped`).
        on_identical: chosen identical to rejected is a warning ("warn") or an error ("error").
        split: the split of a Hugging Face dataset.
    """
    if format not in FORMATS:
        raise DataError(str(path), None, None, f"unknown format '{format}'; choose one of {', '.join(FORMATS)}")
    if on_identical not in ON_IDENTICAL:
        raise ValueError(f"on_identical must be one of {ON_IDENTICAL}, got {on_identical!r}")
    opts = FormatOptions(prompt_key, chosen_key, rejected_key, margin_key, text_key, keep_ties, allow_empty_response)
    collector = _Collector(on_error)
    items = read_records(path, split)
    items, format = _resolve_format(items, format, opts)
    collector.result.format = format
    if format == "aligner":
        pairs = _aligner_pairs(items, opts, collector)
    else:
        pairs = _parsed_pairs(items, PARSERS[format], opts, collector)
    for pair in pairs:
        if pair.chosen == pair.rejected:
            message = "chosen and rejected are identical"
            if on_identical == "warn":
                collector.result.warnings.append((pair.source, message))
            else:
                collector.error(DataError(pair.source, None, chosen_key, message), pair.source)
                continue
        collector.result.records.append(pair)
    return collector.result


def _resolve_format(items: Iterator, format: str, opts: FormatOptions) -> tuple[Iterator, str]:
    """Sniff the format from the first readable record (errors before it are kept in the stream)."""
    if format != "auto":
        return items, format
    seen = []
    for item in items:
        seen.append(item)
        if isinstance(item, RawRecord):
            format = detect_format(item, opts)
            break
    else:
        format = "binary"  # every line was unreadable: report them as binary records would be

    def chained():
        yield from seen
        yield from items

    return chained(), format


def _parsed_pairs(items: Iterable, parser, opts: FormatOptions, collector: _Collector) -> Iterator[PreferencePair]:
    for item in items:
        if isinstance(item, DataError):
            collector.error(item)
            continue
        try:
            pairs, skipped = parser(item, opts)
        except DataError as err:
            collector.error(err, item.source)
            continue
        collector.result.skipped.extend((item.source, reason) for reason in skipped)
        collector.result.ties_skipped += len(skipped)
        yield from pairs


def _aligner_pairs(items: Iterable, opts: FormatOptions, collector: _Collector) -> Iterator[PreferencePair]:
    """Lines 2i / 2i+1 by position among the non-blank lines; a bad line skips its whole pair."""
    items = list(items)
    if len(items) % 2:
        last = items[-1]
        collector.error(DataError(last.path, last.line, None, f"aligner comparison files need an even number of lines "
                                  f"(chosen, rejected, ...); this one has {len(items)}"))
        items = items[:-1]
    for first, second in zip(items[0::2], items[1::2]):
        bad = [item for item in (first, second) if isinstance(item, DataError)]
        if bad:
            collector.error(bad[0])
            continue
        try:
            yield pair_aligner_lines(first, second, opts)
        except DataError as err:
            collector.error(err)


def load_regression_data(
    path: str | Path,
    *,
    text_key: str = "text",
    prompt_key: str = "prompt",
    response_key: str = "response",
    label_key: str = "label",
    attributes: list[str] | None = None,
    num_labels: int | None = None,
    on_error: str = "raise",
    split: str = "train",
) -> LoadResult:
    """Read regression / multi-attribute examples (`.records`: list[RegressionExample]).

    The text is `text_key` (prompt and response joined) or `prompt_key` + `response_key`. Labels are
    `label_key` (a number or a list; -100 marks a missing attribute, HelpSteer style) or, with
    `attributes=[name, ...]`, one field per attribute (a missing or null field is -100). Every
    record must have `num_labels` labels (default: as many as the first record has).
    """
    collector = _Collector(on_error)
    if attributes is not None:
        num_labels = len(attributes)
    for item in read_records(path, split):
        if isinstance(item, DataError):
            collector.error(item)
            continue
        try:
            example = _regression_example(item, text_key, prompt_key, response_key, label_key, attributes, num_labels)
        except DataError as err:
            collector.error(err, item.source)
            continue
        num_labels = len(example.labels)
        collector.result.records.append(example)
    collector.result.format = "regression"
    return collector.result


def _regression_example(record: RawRecord, text_key, prompt_key, response_key, label_key, attributes, num_labels):
    if text_key in record.data:
        prompt, response = text_or_messages(record, text_key), None
    else:
        prompt = text_or_messages(record, prompt_key)
        response = text_or_messages(record, response_key)
    if attributes is None:
        values = read_labels(record, label_key, num_labels)
    else:
        values = tuple(
            MISSING_LABEL if record.data.get(name) is None else read_labels(record, name, 1)[0] for name in attributes
        )
    return RegressionExample(prompt, response, values, record.source)


def load_validation_sets(paths: dict[str, str | Path] | str | Path, **kwargs) -> dict[str, LoadResult]:
    """`{name: path}` -> `{name: LoadResult}` (a single path is named "validation"); `kwargs` go to
    `load_preference_data` for every set."""
    if not isinstance(paths, dict):
        paths = {"validation": paths}
    return {name: load_preference_data(path, **kwargs) for name, path in paths.items()}


def write_rejects(path: str | Path, skipped: Iterable[tuple[str, str]]) -> None:
    """Write skipped records as JSON Lines `{"source": ..., "reason": ...}` (the parent folder is created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for source, reason in skipped:
            handle.write(json.dumps({"source": source, "reason": reason}, ensure_ascii=False) + "\n")
