"""ProcessBench: its rows, checked, and its scores from a process reward model's step rewards.

The facts come from QwenLM/ProcessBench (`code/run_eval_prm_rlhflow.py`, the repository's evaluation of a PRM)
and its README:

- A row is a problem, a solution in `steps` and `label`, the 0-based index of the first wrong step (-1 when every
  step is right). The four splits are the files `gsm8k`, `math`, `olympiadbench` and `omnimath`; a file's split is
  its name.
- A model predicts the first wrong step: the first step it judges wrong, -1 when it judges none wrong. A
  prediction is right when it equals `label`.
- Per split: `error_acc`, the accuracy on the erroneous solutions (label != -1: the first error found exactly);
  `correct_acc`, the accuracy on the correct ones (label == -1: no step judged wrong); `f1`, their harmonic mean
  `2 a b / (a + b)`. The leaderboard figure is the mean F1 over the splits.
- The threshold: ProcessBench's code judges a step wrong when the PRM does not answer "+" for it, that is when
  the PRM holds the step no more likely correct than wrong. For a PRM whose score is the probability that a step
  is correct, that is a probability below 0.5: rmkit's default `threshold`, which the report states. A step
  whose separator falls past the model's max length is not scored, so it is judged right; the report counts
  the solutions that were cut.

Beside ProcessBench's figures, rmkit adds one that needs no threshold: `step_auc`, the probability that a step
ProcessBench marks right (any step before a solution's first error) gets a higher probability of being correct than a
first wrong step, ties counted half (the area under the ROC curve; 0.5 is chance). A model that has learned only how
often steps are right judges every step right at 0.5 (F1 0) whether or not it ranks wrong steps lower; this says
which. Steps after a first error carry no label and are not counted, nor are unscored ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rmkit.data.readers import RawRecord
from rmkit.data.steps import parse_processbench
from rmkit.data.validate import optional_id

SOURCE = "QwenLM/ProcessBench code/run_eval_prm_rlhflow.py (first step judged wrong; error acc, correct acc, F1)"
SPLITS = ("gsm8k", "math", "olympiadbench", "omnimath")
DEFAULT_THRESHOLD = 0.5
THRESHOLD_RULE = ("a step is judged wrong when its probability of being correct is below the threshold (0.5: "
                  "ProcessBench's code judges a step wrong unless the PRM holds it more likely correct than wrong); "
                  "the predicted first error is the first step judged wrong, -1 when none is")


@dataclass(frozen=True)
class ProcessRow:
    """One ProcessBench solution: `label` is the index of its first wrong step, -1 when every step is right;
    `record` is the row as read (its file, line and errors)."""

    prompt: str
    steps: tuple[str, ...]
    label: int
    split: str
    id: str | int | None
    record: RawRecord

    @property
    def source(self) -> str:
        return self.record.source

    steps_field = "steps"


def parse_row(record: RawRecord, split: str) -> ProcessRow:
    """A checked row (`rmkit.data.steps.parse_processbench`: the errors name file, line and field)."""
    solution = parse_processbench(record, None)[0]
    wrong = [i for i, label in enumerate(solution.labels) if label is False]
    return ProcessRow(solution.prompt, solution.steps, wrong[0] if wrong else -1, split,
                      optional_id(record, "id"), record)


def predicted_first_error(step_rewards: list[float | None], threshold: float) -> int:
    """The first step whose probability is below `threshold` (an unscored step, None, is not), else -1."""
    return next((i for i, p in enumerate(step_rewards) if p is not None and p < threshold), -1)


def step_auc(rows: list[ProcessRow], step_rewards: list[list[float | None]]) -> float | None:
    """P(a right step scores above a first wrong step), ties half, over `rows`' scored steps (None without a step
    of either kind)."""
    right, wrong = [], []
    for row, rewards in zip(rows, step_rewards):
        last = row.label if row.label != -1 else len(rewards)
        right += [p for p in rewards[:last] if p is not None]
        if row.label != -1 and row.label < len(rewards) and rewards[row.label] is not None:
            wrong.append(rewards[row.label])
    if not right or not wrong:
        return None
    right_scores, wrong_scores = np.array(right)[:, None], np.array(wrong)[None, :]
    return float(((right_scores > wrong_scores).sum() + 0.5 * (right_scores == wrong_scores).sum())
                 / (right_scores.size * wrong_scores.size))


def _mean(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def split_order(rows: list[ProcessRow]) -> list[str]:
    present = list(dict.fromkeys(row.split for row in rows))
    return [s for s in SPLITS if s in present] + [s for s in present if s not in SPLITS]


def processbench_scores(rows: list[ProcessRow], step_rewards: list[list[float | None]],
                        threshold: float = DEFAULT_THRESHOLD) -> dict:
    """`splits.<name>`: `n_error`, `n_correct`, `error_acc`, `correct_acc`, `f1` (None where a side has no
    solution), `step_auc` (`step_auc`), `cut` (solutions with steps past the max length); `average_f1` and
    `average_step_auc`, the means over the splits (None when a split has none); `threshold`."""
    predictions = [predicted_first_error(rewards, threshold) for rewards in step_rewards]
    splits = {}
    for split in split_order(rows):
        members = [(row, pred, rewards) for row, pred, rewards in zip(rows, predictions, step_rewards)
                   if row.split == split]
        error_acc = _mean([pred == row.label for row, pred, _ in members if row.label != -1])
        correct_acc = _mean([pred == -1 for row, pred, _ in members if row.label == -1])
        f1 = None
        if error_acc is not None and correct_acc is not None:
            f1 = 2 * error_acc * correct_acc / (error_acc + correct_acc) if error_acc + correct_acc else 0.0
        splits[split] = {"n_error": sum(row.label != -1 for row, _, _ in members),
                         "n_correct": sum(row.label == -1 for row, _, _ in members),
                         "error_acc": error_acc, "correct_acc": correct_acc, "f1": f1,
                         "step_auc": step_auc([row for row, _, _ in members], [r for _, _, r in members]),
                         "cut": sum(None in rewards for _, _, rewards in members)}
    return {"threshold": threshold, "splits": splits, "average_f1": _split_mean(splits, "f1"),
            "average_step_auc": _split_mean(splits, "step_auc")}


def _split_mean(splits: dict, key: str) -> float | None:
    values = [s[key] for s in splits.values()]
    return sum(values) / len(values) if values and None not in values else None


def prediction_rows(rows: list[ProcessRow], step_rewards: list[list[float | None]], rewards: list[float | None],
                    threshold: float) -> list[dict]:
    """`scores-processbench-<model>.jsonl`: every solution's step rewards, aggregate, prediction and label."""
    out = []
    for i, (row, steps, reward) in enumerate(zip(rows, step_rewards, rewards)):
        prediction = predicted_first_error(steps, threshold)
        out.append({"index": i, "split": row.split, "id": row.id, "source": row.source, "label": row.label,
                    "prediction": prediction, "match": prediction == row.label, "step_rewards": steps,
                    "reward": reward})
    return out
