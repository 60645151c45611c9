"""Step-labelled solutions for process reward models (PRMs): four layouts, read, checked, one label per step.

    result = load_step_data("prm800k/phase1_train.parquet")   # format sniffed from the fields
    result.records   # list[StepSolution]: prompt, steps, labels (True correct, False wrong, None unlabelled)
    result.skipped   # [(source, reason)] with on_error="skip"

Layouts (`format`; `auto` reads the first readable record's fields):

- `stepwise`, TRL's stepwise supervision (JSON Lines or JSON): `{"prompt": str, "completions": [str, ...],
  "labels": [bool, ...]}`, one label per step.
- `prm800k`, PRM800K as re-laid out in `phase1_{train,test}.parquet`: one row per rated step, `instruction`
  (the problem), `responses` (the steps before), `next_response` (the step rated), `rating` (1 correct, 0
  ambiguous, -1 wrong, null not rated), `is_human_response` (a human's hint, never rated), `is_preferred_response`
  (the candidate the labeller took), other columns ignored. The rows are grouped into solutions (below).
- `processbench` (a JSON array): `{"problem", "steps": [str, ...], "label"}`, `label` the 0-based index of
  the first wrong step, -1 when every step is right: the steps before it are correct, it is wrong, the steps
  after it carry no label (ProcessBench only marks the first error).
- `prmbench`: `{"original_question", "original_process", "modified_question", "modified_process",
  "error_steps"}` gives two solutions: the clean one (the original question and process, every step correct)
  and the modified one (the modified question and process; the steps in `error_steps`, 1-based, wrong, every
  other step correct, as PRMBench's own evaluation labels them; `modified_steps`, the steps that were rewritten,
  are not errors). Both carry the record's source, clean first. Every error-type file repeats the same clean
  solutions: train on one file's, or deduplicate across files. Step texts are kept as written ("1. ..." too).

**PRM800K's rows as solutions.** A problem's rows are a labelling session, a tree: at each step the labeller
rated several candidate next steps (rows with the same `responses`), took one (`is_preferred_response`) or
wrote a hint (`is_human_response`), and every later row continues it. Row B continues row A when
`B.responses == A.responses + [A.next_response]`; a row that no row continues ends a solution: its steps are its
`responses + [next_response]`, each labelled by the row that rated it. So the candidates of one step are
separate solutions sharing the steps before them (TRL's PRM800K conversion builds the same ones). What phase 1
holds, and the rules for it (`tests/data/test_steps.py` checks the counts):

- 42 of the 942 train sessions (5 of 106 test) are verbatim repeats of another, and identical candidates occur
  within a session: rows that repeat a step with the same steps before it and the same label are one step,
  counted in `.repeated` (not an error).
- The same candidate text rated differently at one place (58 places in train) stays two steps, two solutions
  when nothing continues them; a row that continues several such steps continues the one marked
  `is_preferred_response` (an error naming its `responses` when that does not single one out).
- 822 train rows (110 test) are model steps with a null rating, nearly all (796; 107) candidates at the step
  where the labeller stopped, and human hints are never rated: both are steps with no label (None). A NaN
  rating is null.
- A row whose `responses` no row of its problem ends with is an error naming its `responses`.

**Ambiguous steps** (PRM800K rating 0: "neutral", neither clearly right nor wrong). `ambiguous="drop"` (the
default) keeps the step in the text with no label; `"correct"` labels it correct. Dropping invents no
label: the rating says the labeller could not call the step right or wrong, and training a binary step
classifier on it either way teaches it a judgement the data does not make (10,234 of the 48,672 rated
train rows are neutral). `correct` follows the view that a step which is not wrong lets the solution go on
(ProcessBench's "first wrong step" reading); TRL's conversion script counts them wrong (`rating == 1` is its
only positive), which rmkit does not offer.

**Bad input** is a `DataError` naming the file, the line (1-based; the 0-based record index for JSON arrays
and Parquet) and the field: a missing or null field, steps that are not a non-empty list of non-empty strings,
labels whose count differs from the steps', a label that is not a bool (stepwise), a rating outside {1, 0,
-1}, a ProcessBench label past the last step or below -1, an error step outside the modified process
(PRMBench), and, with `step_separator`, a step whose text holds the separator (a trainer joins the steps with
it, so the step boundaries would be lost). `on_error="skip"` skips the record and reports it in `.skipped`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rmkit.data.load import LoadResult, _Collector
from rmkit.data.readers import RawRecord, read_records
from rmkit.data.validate import get_field
from rmkit.errors import DataError

STEP_FORMATS = ("auto", "stepwise", "prm800k", "processbench", "prmbench")
AMBIGUOUS = ("drop", "correct")
RATINGS = (1, 0, -1)  # PRM800K: correct, ambiguous, wrong

# The fields that tell each layout apart (all must be present in the first record).
SIGNATURES = {
    "stepwise": {"prompt", "completions", "labels"},
    "prm800k": {"instruction", "responses", "next_response"},
    "processbench": {"problem", "steps", "label"},
    "prmbench": {"original_process", "modified_process", "error_steps"},
}


@dataclass(frozen=True)
class StepSolution:
    """A solution to `prompt` in steps, each labelled True (correct), False (wrong) or None (no label: the step
    is part of the text but nothing says whether it is right). `source` is `path:line` or `path[index]`."""

    source: str
    prompt: str
    steps: tuple[str, ...]
    labels: tuple[bool | None, ...]

    def __post_init__(self):
        if len(self.steps) != len(self.labels):
            raise ValueError(f"{self.source}: {len(self.steps)} steps but {len(self.labels)} labels")


@dataclass
class StepLoadResult(LoadResult):
    """`LoadResult` of `load_step_data`; `repeated` counts PRM800K rows merged into an identical step."""

    repeated: int = 0


def detect_step_format(record: RawRecord) -> str | None:
    """The step-labelled layout whose fields `record` has (`SIGNATURES`), or None when it matches none."""
    return next((name for name, keys in SIGNATURES.items() if keys <= record.data.keys()), None)


def load_step_data(path: str | Path, format: str = "auto", *, ambiguous: str = "drop",
                   step_separator: str | None = None, on_error: str = "raise", split: str = "train") -> StepLoadResult:
    """Read step-labelled solutions (`.records`: list[StepSolution]) from a file or dataset.

    Args:
        path: a `.jsonl` / `.json` / `.parquet` file, a `save_to_disk` folder, or a dataset name.
        format: one of `STEP_FORMATS`: stepwise, prm800k, processbench, prmbench, or auto.
        ambiguous: PRM800K's rating 0: "drop" (the step keeps no label) or "correct" (module docstring).
        step_separator: when set, a step whose text contains it is an error naming the field.
        on_error: "raise" the first bad record's `DataError`, or "skip" it (see `.skipped`).
        split: the split of a Hugging Face dataset.
    """
    if format not in STEP_FORMATS:
        raise DataError(str(path), None, None, f"unknown step format '{format}'; choose one of {', '.join(STEP_FORMATS)}")
    if ambiguous not in AMBIGUOUS:
        raise ValueError(f"ambiguous must be one of {AMBIGUOUS}, got {ambiguous!r}")
    if step_separator == "":
        raise ValueError("step_separator must be a non-empty string or None")
    collector = _Collector(on_error)
    collector.result = result = StepLoadResult()
    items = read_records(path, split)
    if format == "auto":
        items, format = _sniff(items)
    result.format = format
    if format == "prm800k":
        result.records = _prm800k(items, ambiguous, step_separator, collector)
        return result
    parse = PARSERS[format]
    for item in items:
        if isinstance(item, DataError):
            collector.error(item)
            continue
        try:
            result.records.extend(parse(item, step_separator))
        except DataError as err:
            collector.error(err, item.source)
    return result


def _sniff(items: Iterator) -> tuple[Iterator, str]:
    """The format of the first readable record; errors before it stay in the stream."""
    seen, format = [], "stepwise"  # every line unreadable: report them as stepwise records would be
    for item in items:
        seen.append(item)
        if isinstance(item, RawRecord):
            format = detect_step_format(item)
            if format is None:
                keys = ", ".join(sorted(map(str, item.data))) or "none"
                raise item.error(None, f"cannot tell the step-labelled layout from the fields ({keys}); pass "
                                       f"format= one of {', '.join(STEP_FORMATS[1:])}")
            break

    def chained():
        yield from seen
        yield from items

    return chained(), format


def step_summary(records: Iterable[StepSolution]) -> dict:
    """Counts `rmkit data check` reports: solutions, steps, labels correct / wrong / unlabelled, and steps
    per solution (min / median / max; None when there is no solution)."""
    records = list(records)
    labels = [label for r in records for label in r.labels]
    lengths = [len(r.steps) for r in records]
    per_solution = ({"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths)}
                    if lengths else None)
    return {"solutions": len(records), "steps": len(labels),
            "labels": {"correct": labels.count(True), "wrong": labels.count(False), "unlabelled": labels.count(None)},
            "steps_per_solution": per_solution}


# Field checks -------------------------------------------------------------------------------------------------

def _text(record: RawRecord, key: str, value=None) -> str:
    value = get_field(record, key) if value is None else value
    if not isinstance(value, str):
        raise record.error(key, f"expected a string, got {type(value).__name__}")
    if not value.strip():
        raise record.error(key, "is empty")
    return value


def _step(record: RawRecord, key: str, value, separator: str | None) -> str:
    if value is None:
        raise record.error(key, "is null (a step is a non-empty string)")
    value = _text(record, key, value)
    if separator is not None and separator in value:
        raise record.error(key, f"contains the step separator {separator!r} (the steps are joined with it, so "
                                "this step would read as several)")
    return value


def _steps(record: RawRecord, key: str, separator: str | None, allow_empty: bool = False) -> tuple[str, ...]:
    value = get_field(record, key)
    if not isinstance(value, list):
        raise record.error(key, f"expected a list of steps (strings), got {type(value).__name__}")
    if not value and not allow_empty:
        raise record.error(key, "is an empty list of steps")
    return tuple(_step(record, f"{key}[{i}]", step, separator) for i, step in enumerate(value))


def _integer(record: RawRecord, key: str, value) -> int:
    """An int (or an integral float, as Parquet's float columns hold them); not a bool."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value != int(value)):
        raise record.error(key, f"expected an integer, got {value!r}")
    return int(value)


def solution_to_score(record: RawRecord, prompt_key: str = "prompt", steps_key: str = "steps",
                      separator: str | None = None) -> tuple[str, tuple[str, ...]]:
    """`(prompt, steps)` of a record a process reward model scores (labels, if any, are not read): the prompt
    from `prompt_key` (ProcessBench's `problem` when the record has no such field), the steps from `steps_key`
    (TRL's `completions` when it has no such field); a step holding `separator` is an error."""
    if prompt_key not in record.data and "problem" in record.data:
        prompt_key = "problem"
    if steps_key not in record.data and "completions" in record.data:
        steps_key = "completions"
    return _text(record, prompt_key), _steps(record, steps_key, separator)


# The record layouts ------------------------------------------------------------------------------------------

def parse_stepwise(record: RawRecord, separator: str | None) -> list[StepSolution]:
    """TRL's stepwise supervision: `{prompt, completions, labels}`."""
    prompt = _text(record, "prompt")
    steps = _steps(record, "completions", separator)
    labels = get_field(record, "labels")
    if not isinstance(labels, list):
        raise record.error("labels", f"expected a list of true/false, one per step, got {type(labels).__name__}")
    if len(labels) != len(steps):
        raise record.error("labels", f"has {len(labels)} labels for {len(steps)} steps (one per step of 'completions')")
    for i, label in enumerate(labels):
        if not isinstance(label, bool):
            raise record.error(f"labels[{i}]", f"expected true or false, got {label!r}")
    return [StepSolution(record.source, prompt, steps, tuple(labels))]


def parse_processbench(record: RawRecord, separator: str | None) -> list[StepSolution]:
    """ProcessBench: `{problem, steps, label}`, label = the first wrong step (0-based) or -1."""
    prompt = _text(record, "problem")
    steps = _steps(record, "steps", separator)
    first_wrong = _integer(record, "label", get_field(record, "label"))
    if first_wrong < -1:
        raise record.error("label", f"must be -1 (every step correct) or the 0-based index of the first wrong "
                                    f"step, got {first_wrong}")
    if first_wrong >= len(steps):
        raise record.error("label", f"{first_wrong} is past the last step (the solution has {len(steps)} steps, "
                                    f"indices 0 to {len(steps) - 1}; -1 = every step correct)")
    if first_wrong == -1:
        labels = (True,) * len(steps)
    else:
        labels = (True,) * first_wrong + (False,) + (None,) * (len(steps) - first_wrong - 1)
    return [StepSolution(record.source, prompt, steps, labels)]


def parse_prmbench(record: RawRecord, separator: str | None) -> list[StepSolution]:
    """PRMBench: the clean solution (every step correct) and the modified one (`error_steps`, 1-based, wrong)."""
    clean_prompt = _text(record, "original_question")
    clean = _steps(record, "original_process", separator)
    modified_prompt = _text(record, "modified_question")
    modified = _steps(record, "modified_process", separator)
    error_steps = get_field(record, "error_steps")
    if not isinstance(error_steps, list):
        raise record.error("error_steps", f"expected a list of 1-based step numbers, got {type(error_steps).__name__}")
    wrong = set()
    for i, value in enumerate(error_steps):
        number = _integer(record, f"error_steps[{i}]", value)
        if not 1 <= number <= len(modified):
            raise record.error(f"error_steps[{i}]", f"step {number} is outside modified_process ({len(modified)} "
                                                    "steps, numbered from 1)")
        wrong.add(number - 1)
    labels = tuple(i not in wrong for i in range(len(modified)))
    return [StepSolution(record.source, clean_prompt, clean, (True,) * len(clean)),
            StepSolution(record.source, modified_prompt, modified, labels)]


PARSERS = {"stepwise": parse_stepwise, "processbench": parse_processbench, "prmbench": parse_prmbench}


# PRM800K: rows grouped into solutions -------------------------------------------------------------------------

@dataclass
class _Node:
    """One rated step of a problem: its place (`prefix`, `step`), its raw label, the rows that gave it."""

    record: RawRecord
    prefix: tuple[str, ...]
    step: str
    rating: int | None  # 1 / 0 / -1; None: a human hint or not rated
    preferred: bool
    parent: _Node | None = None
    continued: bool = False


def _prm800k_row(record: RawRecord, separator: str | None) -> _Node:
    _text(record, "instruction")
    prefix = _steps(record, "responses", separator, allow_empty=True)
    step = _step(record, "next_response", get_field(record, "next_response"), separator)
    if "rating" not in record.data:
        get_field(record, "rating")  # the "missing" error
    rating = record.data["rating"]
    if isinstance(rating, float) and math.isnan(rating):
        rating = None
    if rating is not None:
        if isinstance(rating, bool) or not isinstance(rating, (int, float)) or rating not in RATINGS:
            raise record.error("rating", f"expected 1 (correct), 0 (ambiguous), -1 (wrong) or null, got {rating!r}")
        rating = int(rating)
    human, preferred = (_flag(record, key) for key in ("is_human_response", "is_preferred_response"))
    return _Node(record, prefix, step, None if human else rating, preferred)


def _flag(record: RawRecord, key: str) -> bool:
    value = record.data.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise record.error(key, f"expected true or false, got {value!r}")
    return value


def _prm800k(items: Iterable, ambiguous: str, separator: str | None, collector: _Collector) -> list[StepSolution]:
    """Every row that no row continues ends a solution (module docstring)."""
    nodes: dict[tuple, _Node] = {}  # (problem, prefix, step, rating) -> the first row that gave it
    for item in items:
        if isinstance(item, DataError):
            collector.error(item)
            continue
        try:
            node = _prm800k_row(item, separator)
        except DataError as err:
            collector.error(err, item.source)
            continue
        key = (item.data["instruction"], node.prefix, node.step, node.rating)
        if key in nodes:
            nodes[key].preferred |= node.preferred
            collector.result.repeated += 1
        else:
            nodes[key] = node
    by_place: dict[tuple, list[_Node]] = {}
    for (problem, prefix, step, _), node in nodes.items():
        by_place.setdefault((problem, prefix + (step,)), []).append(node)
    usable = []
    for (problem, *_), node in nodes.items():
        try:
            _link(node, by_place.get((problem, node.prefix), []))
        except DataError as err:
            collector.error(err, node.record.source)
            continue
        usable.append(node)
    usable = _reachable(usable, collector)
    label = {1: True, -1: False, 0: None if ambiguous == "drop" else True, None: None}
    return [_solution(node, label) for node in usable if not node.continued]


def _link(node: _Node, candidates: list[_Node]) -> None:
    """Set `node.parent`: the row whose steps `node.prefix` is (module docstring)."""
    if not node.prefix:
        return
    if not candidates:
        raise node.record.error("responses", "continues no row of this problem (no row's responses + "
                                             "[next_response] equals these steps)")
    if len(candidates) > 1:
        candidates = [c for c in candidates if c.preferred]
        if len(candidates) != 1:
            raise node.record.error("responses", "its last step was rated differently by several rows and "
                                                 f"{'none' if not candidates else 'more than one'} of them is "
                                                 "marked is_preferred_response, so its labels are unknown")
    node.parent = candidates[0]
    node.parent.continued = True


def _reachable(nodes: list[_Node], collector: _Collector) -> list[_Node]:
    """The nodes whose chain of parents is whole; a row under one that was skipped is skipped too, named."""
    ok = {id(node): True for node in nodes}
    kept = []
    for node in nodes:
        parent = node.parent
        while parent is not None and ok.get(id(parent), False):
            parent = parent.parent
        if parent is not None:  # an ancestor was skipped
            collector.error(node.record.error("responses", "continues a row that was skipped"), node.record.source)
            ok[id(node)] = False
            continue
        kept.append(node)
    return kept


def _solution(leaf: _Node, label: dict) -> StepSolution:
    labels, node = [], leaf
    while node is not None:
        labels.append(label[node.rating])
        node = node.parent
    return StepSolution(leaf.record.source, leaf.record.data["instruction"], leaf.prefix + (leaf.step,),
                        tuple(reversed(labels)))
