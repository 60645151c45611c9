"""The report's figures of one model on a set of pairs, from `[N]` chosen and rejected rewards (float64).

Accuracy is strict `r_chosen > r_rejected` (a tie is wrong), as RewardBench and `rmkit.metrics` count it.
A response's length is its characters (a conversation's: the characters of its messages' contents), so
the "longer response wins" baseline is the same for every model.
"""

from __future__ import annotations

import math

import numpy as np

Z95 = 1.959963984540054  # the 97.5th percentile of the standard normal
# A model whose accuracy is not above "the longer response wins" by more than this may be scoring length.
LENGTH_MARGIN = 0.02


def wilson_interval(correct: int, n: int, z: float = Z95) -> list[float] | None:
    """Wilson score interval `[lo, hi]` of a proportion `correct / n` (95% by default); None when n = 0.

    Wilson (1927): centre `(p + z^2/2n) / (1 + z^2/n)`, half-width `z sqrt(p(1-p)/n + z^2/4n^2) / (1 +
    z^2/n)`; unlike the normal approximation it stays inside [0, 1] and is not empty at p = 0 or 1."""
    if n == 0:
        return None
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # The interval contains p; at p = 0 or 1 float rounding can leave a bound a hair on the wrong side of it.
    return [min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half))]


def response_length(response) -> int:
    """Characters of a text, or of a list of chat messages' contents."""
    if isinstance(response, str):
        return len(response)
    return sum(len(m["content"]) for m in response)


def ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of their ranks."""
    order = np.argsort(values, kind="mergesort")
    positions = np.empty(len(values))
    positions[order] = np.arange(1, len(values) + 1)
    _, groups = np.unique(values, return_inverse=True)
    return (np.bincount(groups, weights=positions) / np.bincount(groups))[groups]


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    """Spearman's rank correlation (Pearson's of the tie-averaged ranks); None when either is constant."""
    if len(x) < 2:
        return None
    rx, ry = ranks(np.asarray(x, dtype=np.float64)), ranks(np.asarray(y, dtype=np.float64))
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denom = math.sqrt(float((rx * rx).sum() * (ry * ry).sum()))
    return float((rx * ry).sum() / denom) if denom > 0 else None


def _accuracy(correct: np.ndarray) -> dict:
    n = int(correct.size)
    return {"n": n, "accuracy": float(correct.mean()) if n else None}


def length_split(correct: np.ndarray, chosen_len: np.ndarray, rejected_len: np.ndarray) -> dict:
    """Accuracy on the pairs whose chosen response is longer, shorter, or as long as the rejected one."""
    return {"chosen_longer": _accuracy(correct[chosen_len > rejected_len]),
            "chosen_shorter": _accuracy(correct[chosen_len < rejected_len]),
            "same_length": _accuracy(correct[chosen_len == rejected_len])}


def length_warning(accuracy: float | None, longer_wins: float | None) -> str | None:
    """A plain sentence when `accuracy` is within `LENGTH_MARGIN` of the length-only baseline `longer_wins`
    (or below it); None when the model beats the baseline by more, or either is unknown."""
    if accuracy is None or longer_wins is None or accuracy > longer_wins + LENGTH_MARGIN:
        return None
    where = "below" if accuracy < longer_wins - LENGTH_MARGIN else f"within {100 * LENGTH_MARGIN:.0f} points of"
    return (f"accuracy {accuracy:.1%} is {where} the length-only baseline {longer_wins:.1%} (\"the longer response "
            "wins\"): on these pairs the model may be scoring length, not quality")


def pair_stats(chosen: np.ndarray, rejected: np.ndarray, chosen_len: np.ndarray,
               rejected_len: np.ndarray) -> dict:
    """One subset's figures: `n`, `accuracy`, `ci95` (Wilson), `ties`, `longer_wins_accuracy` (the
    accuracy of picking the longer response; equal lengths are wrong), `length_warning` (`length_warning`),
    `reward_length_spearman` (over the 2N responses), `mean_margin` (mean `r_chosen - r_rejected`) and
    `length_split`."""
    correct = chosen > rejected
    n, right = int(chosen.size), int(correct.sum())
    longer_wins = float((chosen_len > rejected_len).mean()) if n else None
    return {
        "n": n,
        "accuracy": right / n if n else None,
        "ci95": wilson_interval(right, n),
        "ties": int((chosen == rejected).sum()),
        "longer_wins_accuracy": longer_wins,
        "length_warning": length_warning(right / n if n else None, longer_wins),
        "reward_length_spearman": spearman(np.concatenate([chosen, rejected]),
                                           np.concatenate([chosen_len, rejected_len])),
        "mean_margin": float((chosen - rejected).mean()) if n else None,
        "length_split": length_split(correct, chosen_len, rejected_len),
    }


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow warning for large |x|


def calibration(chosen: np.ndarray, rejected: np.ndarray, bins: int = 10) -> dict:
    """Reliability of the Bradley-Terry probability `p = sigmoid(r_chosen - r_rejected)`.

    The model picks the side it scores higher with confidence `max(p, 1 - p) = sigmoid(|margin|)` in
    [0.5, 1]; `bins` equal-width bins of that confidence each hold `n`, `confidence` (mean) and
    `accuracy` (the fraction of its picks that are right; a tie is wrong). `ece` = sum over bins of
    `n_b / N * |accuracy_b - confidence_b|` (Guo et al. 2017), `mean_probability` the mean of `p`."""
    margin = chosen - rejected
    confidence = sigmoid(np.abs(margin))
    correct = margin > 0
    index = np.clip(np.floor((confidence - 0.5) * 2 * bins).astype(int), 0, bins - 1)
    table, ece = [], 0.0
    for b in range(bins):
        members = index == b
        n = int(members.sum())
        entry = {"lo": 0.5 + b / (2 * bins), "hi": 0.5 + (b + 1) / (2 * bins), "n": n,
                 "confidence": float(confidence[members].mean()) if n else None,
                 "accuracy": float(correct[members].mean()) if n else None}
        if n:
            ece += n / margin.size * abs(entry["accuracy"] - entry["confidence"])
        table.append(entry)
    return {"bins": table, "ece": ece if margin.size else None,
            "mean_probability": float(sigmoid(margin).mean()) if margin.size else None}


def agreement(margin_a: np.ndarray, margin_b: np.ndarray) -> dict:
    """How often two models pick the same side (`sign` of `r_chosen - r_rejected`; a tie is a side of
    its own), and how often both, either or neither are right."""
    right_a, right_b = margin_a > 0, margin_b > 0
    n = int(margin_a.size)
    return {"n": n, "agreement": float((np.sign(margin_a) == np.sign(margin_b)).mean()) if n else None,
            "both_right": int((right_a & right_b).sum()), "both_wrong": int((~right_a & ~right_b).sum()),
            "only_first_right": int((right_a & ~right_b).sum()),
            "only_second_right": int((~right_a & right_b).sum())}


def most_disagreeing(margin_a: np.ndarray, margin_b: np.ndarray, top: int) -> list[tuple[int, float]]:
    """`(index, gap)` of up to `top` pairs the two models pick differently, largest gap first; the gap is
    `|sigmoid(margin_a) - sigmoid(margin_b)|`, comparable across models whose reward scales differ."""
    gap = np.abs(sigmoid(margin_a) - sigmoid(margin_b))
    differ = np.flatnonzero(np.sign(margin_a) != np.sign(margin_b))
    order = differ[np.argsort(-gap[differ], kind="stable")][:top]
    return [(int(i), float(gap[i])) for i in order]
