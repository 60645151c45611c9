"""PRMBench: its rows, checked, and its PRMScore from a process reward model's step rewards.

The facts come from ssmisya/PRMBench: `mr_eval/tasks/prmtest_classified/task.py` (`load_data_function`,
`evaluate_function`, `eval_on_hallucination_step`), `mr_eval/models/abstract_model.py` (the validity threshold)
and the PRMScore of its result notebooks (`mr_visualize/.../form_excel_strs.ipynb`):

- A record holds a clean solution (`original_question`, `original_process`) and a modified one
  (`modified_question`, `modified_process`) whose `error_steps` (1-based) are wrong; its `classification` names the
  kind of error (circular, confidence, counterfactual, ...). Each modified solution is scored as one row; each
  record's clean solution once (by its `idx`), as the class `correct`.
- A step is judged correct when its probability is above the threshold, 0.5 (PRMBench's `validity_threshold`).
- Over the steps of a class's solutions: a correct step judged correct is a true positive, a wrong step judged
  wrong a true negative (judged correct: a false positive; a correct step judged wrong: a false negative). `f1` is
  the F1 of the positives, `negative_f1` that of the negatives, and **PRMScore = 0.5 f1 + 0.5 negative_f1**.
- The overall PRMScore pools the steps of every modified solution (the clean ones, all positive, are reported as
  their own class only, as PRMBench does).
- A step past the model's max length is not scored, so it is judged correct; the report counts the solutions cut.
"""

from __future__ import annotations

from dataclasses import dataclass

from rmkit.data.readers import RawRecord
from rmkit.data.steps import parse_prmbench
from rmkit.data.validate import get_field, optional_id

SOURCE = ("ssmisya/PRMBench mr_eval/tasks/prmtest_classified/task.py (steps judged at validity_threshold 0.5; "
          "PRMScore = 0.5 F1 + 0.5 negative F1)")
THRESHOLD = 0.5
CORRECT = "correct"


@dataclass(frozen=True)
class PRMBenchRow:
    """One solution to score: a record's modified process (`wrong`: its error steps, 0-based) or its clean one
    (`classification` "correct", nothing wrong); `record` is the row as read."""

    prompt: str
    steps: tuple[str, ...]
    wrong: frozenset[int]
    classification: str
    id: str | int | None
    record: RawRecord

    @property
    def source(self) -> str:
        return self.record.source

    @property
    def steps_field(self) -> str:
        return "original_process" if self.classification == CORRECT else "modified_process"


def parse_rows(record: RawRecord, seen_clean: set) -> list[PRMBenchRow]:
    """The record's modified solution, and its clean one unless a record with the same `idx` gave it already
    (`seen_clean` is updated); checked by `rmkit.data.steps.parse_prmbench`."""
    clean, modified = parse_prmbench(record, None)
    kind = get_field(record, "classification")
    if not isinstance(kind, str) or not kind.strip():
        raise record.error("classification", f"expected the error type's name, got {kind!r}")
    identifier = optional_id(record, "idx")
    rows = [PRMBenchRow(modified.prompt, modified.steps, frozenset(i for i, ok in enumerate(modified.labels) if not ok),
                        kind, identifier, record)]
    if identifier is None or identifier not in seen_clean:
        seen_clean.add(identifier)
        rows.insert(0, PRMBenchRow(clean.prompt, clean.steps, frozenset(), CORRECT, identifier, record))
    return rows


def _f1(hits: int, false_hits: int, misses: int) -> float | None:
    """F1 of one side; 0 when its precision or recall is 0 (PRMBench's value, its -1 "undefined" for the other part
    included), None when neither is defined (no step on that side, judged or true)."""
    precision = hits / (hits + false_hits) if hits + false_hits else None
    recall = hits / (hits + misses) if hits + misses else None
    if precision == 0 or recall == 0:
        return 0.0
    if precision is None or recall is None:
        return None
    return 2 * precision * recall / (precision + recall)


def confusion(rows: list[PRMBenchRow], step_rewards: list[list[float | None]],
              threshold: float = THRESHOLD) -> dict[str, int]:
    """`tp`, `fp`, `tn`, `fn` over every step of `rows` (an unscored step, None, is judged correct)."""
    counts = {"tp": 0, "fp": 0, "tn": 0, "fn": 0}
    for row, rewards in zip(rows, step_rewards):
        for i, p in enumerate(rewards):
            judged_correct = p is None or p > threshold
            if i in row.wrong:
                counts["fp" if judged_correct else "tn"] += 1
            else:
                counts["tp" if judged_correct else "fn"] += 1
    return counts


def class_scores(rows: list[PRMBenchRow], step_rewards: list[list[float | None]], threshold: float) -> dict:
    """`n` solutions, their confusion counts, `f1`, `negative_f1` and `prm_score` (None where a side has no step),
    and `cut` (solutions with an unscored step)."""
    counts = confusion(rows, step_rewards, threshold)
    f1 = _f1(counts["tp"], counts["fp"], counts["fn"])
    negative_f1 = _f1(counts["tn"], counts["fn"], counts["fp"])
    score = 0.5 * f1 + 0.5 * negative_f1 if f1 is not None and negative_f1 is not None else None
    return {"n": len(rows), **counts, "f1": f1, "negative_f1": negative_f1, "prm_score": score,
            "cut": sum(None in rewards for rewards in step_rewards)}


def prmbench_scores(rows: list[PRMBenchRow], step_rewards: list[list[float | None]],
                    threshold: float = THRESHOLD) -> dict:
    """`classes.<classification>` (`class_scores`, the clean solutions as `correct`), `overall` over the modified
    solutions, and `threshold`."""
    def of(keep) -> dict:
        chosen = [i for i, row in enumerate(rows) if keep(row.classification)]
        return class_scores([rows[i] for i in chosen], [step_rewards[i] for i in chosen], threshold)

    classes = {kind: of(lambda c, kind=kind: c == kind) for kind in dict.fromkeys(r.classification for r in rows)}
    return {"threshold": threshold, "classes": classes, "overall": of(lambda c: c != CORRECT)}


def prediction_rows(rows: list[PRMBenchRow], step_rewards: list[list[float | None]], rewards: list[float | None],
                    threshold: float = THRESHOLD) -> list[dict]:
    """`scores-prmbench-<model>.jsonl`: every solution's step rewards, its error steps (1-based, as PRMBench numbers
    them), the steps judged wrong, and its aggregate reward."""
    return [{"index": i, "classification": row.classification, "id": row.id, "source": row.source,
             "error_steps": sorted(s + 1 for s in row.wrong),
             "judged_wrong": [s + 1 for s, p in enumerate(steps) if p is not None and p <= threshold],
             "step_rewards": steps, "reward": reward}
            for i, (row, steps, reward) in enumerate(zip(rows, step_rewards, rewards))]
