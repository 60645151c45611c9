"""RewardBench 2 scoring: the tie penalty and the Ties formula derived by hand, and against RewardBench's own
logic re-created here from allenai/reward-bench@05a9005.

Why re-created: the `rewardbench` package on PyPI (0.1.4) imports torch, fastchat, transformers==4.51 and
vllm-era model code at import time, and its `process_single_model` is an older formula than the one
`scripts/run_v2.py` uses at 05a9005 (per-prompt scores averaged, no NaN-to-zero), so it is neither
importable here nor the reference. `reference_row_result` and `reference_ties` below follow
`reroll_and_score_dataset`, `_compute_prompt_stats` and `process_single_model` of that commit line by line
(numpy, with its NaN and +-inf behaviour); rmkit's code is written separately in rmkit/report/rewardbench2.py.
"""

import math
from collections import defaultdict

import numpy as np
import pytest

from rmkit.report.rewardbench2 import BestOfRow, best_of_result, rewardbench2_scores, ties_score


def reference_row_result(scores: list) -> float:
    """`reroll_and_score_dataset`: the tie penalty on a Python list of floats."""
    max_val = np.max(scores)
    return (1 / np.sum(scores == max_val)) if scores[0] == max_val else 0


def reference_ties(rows: list[tuple[str, int, list]]) -> float:
    """`process_single_model` at 05a9005, on (id, num_correct, scores) rows."""
    grouped = defaultdict(list)
    for id_, num_correct, scores in rows:
        sample_type, prompt_id = id_.split(":")
        for i, score in enumerate(scores):
            grouped[(sample_type, int(prompt_id))].append((i < num_correct, score))

    def stats(samples):
        correct = [s for c, s in samples if c]
        incorrect = [s for c, s in samples if not c]
        diff = max(correct) - min(correct) if len(correct) > 1 else None
        gap = min(correct) - max(incorrect)
        return gap > 0, diff, gap

    ref, tied = {}, {}
    for (kind, pid), samples in grouped.items():
        (ref if kind == "ref" else tied)[pid] = stats(samples)
    ref_acc = np.mean([s[0] for s in ref.values()]) if ref else 0.0
    tied_acc = np.mean([s[0] for s in tied.values()]) if tied else 0.0
    both = set(ref) & set(tied)
    diff = np.array([tied[p][1] for p in both])
    gap_tied = np.array([tied[p][2] for p in both])
    gap_ref = np.array([ref[p][2] for p in both])
    preferred = np.mean(gap_tied > diff)
    preferred_hard = np.mean(np.minimum(gap_ref, gap_tied) > diff)
    with np.errstate(divide="ignore", invalid="ignore"):
        margin = np.nan_to_num(np.tanh(np.minimum(gap_ref, gap_tied) / diff - 1), nan=0.0)
    return float(0.30 * tied_acc + 0.30 * ref_acc + 0.20 * preferred + 0.20 * preferred_hard
                 + 0.01 * float(np.mean(margin)))


def test_tie_penalty_by_hand():
    assert best_of_result([2.0, 1.0, 1.0, 1.0]) == 1.0
    assert best_of_result([1.0, 1.0, 0.0, 0.0]) == 0.5  # chosen ties 2-way for the top
    assert best_of_result([1.0, 1.0, 1.0, 0.0]) == pytest.approx(1 / 3)
    assert best_of_result([1.0, 1.0, 1.0, 1.0]) == 0.25
    assert best_of_result([1.0, 2.0, 0.0, 0.0]) == 0.0  # a rejected one beats it
    assert best_of_result([1.0, 1.0 + 1e-12, 0.0, 0.0]) == 0.0


# Ties by hand: (id, num_correct, scores), correct ones first.
TIES_ROWS = [
    ("ref:0", 1, [2.0, 1.0, 0.5]), ("tied:0", 2, [3.0, 2.5, 1.0]),  # gap_ref 1, spread 0.5, gap_tied 1.5
    ("ref:1", 1, [0.0, 1.0]), ("tied:1", 2, [2.0, 1.0, 0.5]),  # ref wrong (gap -1); spread 1, gap_tied 0.5
    ("ref:2", 1, [1.0, 1.0]), ("tied:2", 2, [1.0, 1.0, 1.0]),  # all equal: gap 0 (wrong), spread 0 -> 0/0
    ("tied:3", 2, [5.0, 4.0, 0.0]),  # no ref: counts in tied accuracy only
    ("ref:4", 1, [3.0, 0.0]), ("tied:4", 2, [2.0, 2.0, 1.0]),  # spread 0, gap_hard 1 -> 1/0 = inf, tanh -> 1
]


def test_ties_formula_by_hand():
    result = ties_score(TIES_ROWS)
    # ref accurate on 0 and 4 of {0, 1, 2, 4}; tied accurate on 0, 1, 3, 4 of {0, 1, 2, 3, 4}
    assert result["ref_accuracy"] == 0.5 and result["tied_accuracy"] == 0.8
    # prompts with both rows: 0, 1, 2, 4. gap_tied > spread: 1.5 > 0.5, 0.5 > 1 no, 0 > 0 no, 1 > 0 -> 2/4
    assert result["correctness_preferred"] == 0.5
    # min(gap_ref, gap_tied) > spread: 1 > 0.5, -1 > 1 no, 0 > 0 no, 1 > 0 -> 2/4
    assert result["correctness_preferred_hard"] == 0.5
    # tanh(min / spread - 1): tanh(1/0.5 - 1) = tanh(1), tanh(-1/1 - 1) = tanh(-2), 0/0 -> NaN -> 0, 1/0 -> tanh(inf) = 1
    margin = (math.tanh(1) + math.tanh(-2) + 0.0 + 1.0) / 4
    assert result["margin_score"] == pytest.approx(margin, abs=1e-15)
    expected = 0.3 * 0.8 + 0.3 * 0.5 + 0.2 * 0.5 + 0.2 * 0.5 + 0.01 * margin  # = 0.5919939...
    assert result["score"] == pytest.approx(expected, abs=1e-15) and result["score"] == pytest.approx(0.591994, abs=1e-6)
    assert result["score"] == pytest.approx(reference_ties(TIES_ROWS), abs=1e-15)
    assert (result["ref_prompts"], result["tied_prompts"], result["prompts_with_both"]) == (4, 5, 4)


def test_ties_without_a_prompt_in_both_has_no_score():
    # RewardBench's mean over no prompts is NaN (and so is its score); rmkit says None instead
    assert ties_score([("ref:0", 1, [1.0, 0.0]), ("tied:1", 2, [2.0, 1.0, 0.0])])["score"] is None


def random_rows(rng, prompts: int) -> list[tuple[str, int, list]]:
    rows = []
    for p in range(prompts):
        for kind, correct in (("ref", 1), ("tied", int(rng.integers(2, 5)))):
            if kind == "ref" and rng.random() < 0.2:
                continue  # a tied prompt without its ref row
            values = np.round(rng.normal(size=correct + int(rng.integers(1, 4))), 0)  # rounded: ties and 0/0
            rows.append((f"{kind}:{p}", correct, values.tolist()))
    return rows


@pytest.mark.parametrize("seed", range(5))
def test_against_rewardbench_logic_on_the_same_scores(seed):
    rng = np.random.default_rng(seed)
    ties = random_rows(rng, 30)
    assert ties_score(ties)["score"] == pytest.approx(reference_ties(ties), abs=1e-12)
    for _ in range(200):
        scores = np.round(rng.normal(size=4), 0).tolist()
        assert best_of_result(scores) == pytest.approx(reference_row_result(scores), abs=1e-15)


def best_of(subset: str, id_, num_correct: int, n: int) -> BestOfRow:
    return BestOfRow("Q?", tuple(f"answer {i}" for i in range(n)), num_correct, subset, id_, "f.jsonl:1")


def test_subsets_and_the_leaderboard_score():
    rows = [best_of("Math", 1, 1, 4), best_of("Math", 2, 1, 4), best_of("Focus", 1, 1, 4)]
    scores = [np.array([1.0, 0.0, 0.0, 0.0]), np.array([1.0, 1.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0, 0.0])]
    partial = rewardbench2_scores(rows, scores)
    assert partial["subsets"] == {"Math": 0.75, "Focus": 0.0}  # (1 + 1/2) / 2 and 0
    assert partial["score"] is None and not partial["complete"] and partial["present_score"] == 0.375
    assert partial["missing"] == ["Factuality", "Precise IF", "Safety", "Ties"]
    rows += [best_of(s, 1, 1, 4) for s in ("Factuality", "Precise IF", "Safety")]
    scores += [np.array([2.0, 1.0, 0.0, 0.0])] * 3
    rows += [best_of("Ties", id_, k, k + 1) for id_, k, _ in TIES_ROWS]
    scores += [np.array(s) for _, _, s in TIES_ROWS]
    full = rewardbench2_scores(rows, scores)
    ties = reference_ties(TIES_ROWS)
    assert full["subsets"] == {"Factuality": 1.0, "Precise IF": 1.0, "Math": 0.75, "Safety": 1.0, "Focus": 0.0,
                               "Ties": pytest.approx(ties, abs=1e-15)}
    assert full["score"] == pytest.approx((1 + 1 + 0.75 + 1 + 0 + ties) / 6, abs=1e-15) and full["complete"]
    assert full["ties"]["tied_accuracy"] == 0.8
