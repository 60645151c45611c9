"""Length bias, rank correlation, calibration and agreement against slow, direct computations (Python loops)."""

import math

import numpy as np
import pytest

from rmkit.report.metrics import agreement, calibration, most_disagreeing, pair_stats, spearman


@pytest.fixture
def pairs():
    rng = np.random.default_rng(0)
    n = 300
    chosen_len = rng.integers(5, 60, n)
    rejected_len = rng.integers(5, 60, n)
    rejected_len[:20] = chosen_len[:20]  # equal lengths
    chosen = np.round(rng.normal(0.5, 1.5, n) + 0.02 * chosen_len, 1)  # rounded: tied rewards happen
    rejected = np.round(rng.normal(0.0, 1.5, n) + 0.02 * rejected_len, 1)
    rejected[20:30] = chosen[20:30]
    return chosen, rejected, chosen_len, rejected_len


def slow_ranks(values):
    """Rank i = 1 + (number smaller) + (number equal - 1) / 2: the mean rank of its tie group."""
    return [1 + sum(w < v for w in values) + (sum(w == v for w in values) - 1) / 2 for v in values]


def slow_pearson(x, y):
    mx, my = sum(x) / len(x), sum(y) / len(y)
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def test_length_bias_against_a_loop(pairs):
    chosen, rejected, chosen_len, rejected_len = pairs
    stats = pair_stats(chosen, rejected, chosen_len, rejected_len)
    rows = list(zip(chosen.tolist(), rejected.tolist(), chosen_len.tolist(), rejected_len.tolist()))
    assert stats["longer_wins_accuracy"] == pytest.approx(sum(cl > rl for _, _, cl, rl in rows) / len(rows))
    longer = [c > r for c, r, cl, rl in rows if cl > rl]
    shorter = [c > r for c, r, cl, rl in rows if cl < rl]
    same = [c > r for c, r, cl, rl in rows if cl == rl]
    split = stats["length_split"]
    assert (split["chosen_longer"]["n"], split["chosen_shorter"]["n"], split["same_length"]["n"]) == (
        len(longer), len(shorter), len(same)) and len(same) >= 20
    assert split["chosen_longer"]["accuracy"] == pytest.approx(sum(longer) / len(longer))
    assert split["chosen_shorter"]["accuracy"] == pytest.approx(sum(shorter) / len(shorter))
    rewards, lengths = chosen.tolist() + rejected.tolist(), chosen_len.tolist() + rejected_len.tolist()
    expected = slow_pearson(slow_ranks(rewards), slow_ranks(lengths))
    assert stats["reward_length_spearman"] == pytest.approx(expected, abs=1e-12)
    assert stats["ties"] == sum(c == r for c, r, _, _ in rows) >= 10


def test_spearman_matches_scipy_and_handles_constants(pairs):
    stats = pytest.importorskip("scipy.stats")
    chosen, rejected, _, _ = pairs
    assert spearman(chosen, rejected) == pytest.approx(stats.spearmanr(chosen, rejected).statistic, abs=1e-12)
    assert spearman(np.ones(4), np.arange(4)) is None and spearman(np.ones(1), np.ones(1)) is None
    assert spearman(np.arange(5), -np.arange(5)) == pytest.approx(-1.0)


def test_calibration_against_a_loop(pairs):
    chosen, rejected, _, _ = pairs
    bins = 10
    result = calibration(chosen, rejected, bins)
    groups = [[] for _ in range(bins)]
    for c, r in zip(chosen.tolist(), rejected.tolist()):
        p = 1 / (1 + math.exp(-(c - r)))
        confidence = max(p, 1 - p)
        b = next(b for b in range(bins) if confidence < 0.5 + (b + 1) * 0.05 or b == bins - 1)
        groups[b].append((confidence, c > r))
    ece = 0.0
    for b, (entry, members) in enumerate(zip(result["bins"], groups)):
        assert entry["n"] == len(members) and entry["lo"] == pytest.approx(0.5 + 0.05 * b)
        if members:
            conf = sum(m[0] for m in members) / len(members)
            acc = sum(m[1] for m in members) / len(members)
            assert (entry["confidence"], entry["accuracy"]) == pytest.approx((conf, acc), abs=1e-12)
            ece += len(members) / len(chosen) * abs(acc - conf)
    assert result["ece"] == pytest.approx(ece, abs=1e-12) and result["ece"] > 0
    assert sum(e["n"] for e in result["bins"]) == len(chosen)


def test_perfectly_calibrated_by_hand():
    # margins ln 3: p = sigmoid(ln 3) = 0.75 on 4 pairs, 3 right (chosen higher) and 1 wrong (rejected higher)
    m = math.log(3)
    result = calibration(np.array([m, m, m, 0.0]), np.array([0.0, 0.0, 0.0, m]), bins=5)
    assert result["ece"] == pytest.approx(0.0, abs=1e-12)
    full = [b for b in result["bins"] if b["n"]]
    assert len(full) == 1 and full[0]["n"] == 4 and full[0]["accuracy"] == 0.75


def test_agreement_and_most_disagreeing_by_hand():
    a = np.array([1.0, -1.0, 2.0, 0.0, -3.0])
    b = np.array([0.5, 1.0, -2.0, 0.0, -0.1])
    result = agreement(a, b)
    assert result == {"n": 5, "agreement": 3 / 5, "both_right": 1, "both_wrong": 2, "only_first_right": 1,
                      "only_second_right": 1}
    top = most_disagreeing(a, b, top=5)
    # pairs 1 and 2 are picked differently; |sigmoid(2) - sigmoid(-2)| > |sigmoid(-1) - sigmoid(1)|
    assert [i for i, _ in top] == [2, 1]
    assert top[0][1] == pytest.approx(math.tanh(1.0))
    assert most_disagreeing(a, b, top=1) == top[:1]
