"""RewardBench aggregation, ties and intervals on a hand-made file, every expectation derived by hand."""

import math

import numpy as np
import pytest

from rmkit.report import ModelScores, build_report, load_eval_set, model_names
from rmkit.report.metrics import wilson_interval
from rmkit.report.rewardbench import EXAMPLE_COUNTS, SECTIONS, overall_score, section_scores
from tests.report.rb_data import EXTRA, ROWS, write_rb_files


@pytest.fixture
def report(tmp_path):
    evalset = load_eval_set([str(p) for p in write_rb_files(tmp_path)])
    rewards = np.array([r[-2:] for r in ROWS] + [r[-2:] for r in EXTRA])
    report, _ = build_report(evalset, [ModelScores("m", "dir/m", rewards[:, 0], rewards[:, 1])])
    return report["models"]["m"]


def test_subsets_strict_accuracy_and_ties(report):
    subsets = report["subsets"]
    # RewardBench's order first (its section order), then the file-named subset
    assert list(subsets) == ["alpacaeval-easy", "alpacaeval-length", "alpacaeval-hard", "mt-bench-easy",
                             "mt-bench-med", "math-prm", "hep-python", "extra"]
    expected = {"alpacaeval-easy": (2, 1.0), "alpacaeval-length": (2, 0.5), "alpacaeval-hard": (1, 1.0),
                "mt-bench-easy": (1, 0.0), "mt-bench-med": (2, 0.0), "math-prm": (2, 0.5),
                "hep-python": (1, 1.0), "extra": (3, 2 / 3)}
    assert {s: v["n"] for s, v in subsets.items()} == {s: n for s, (n, _) in expected.items()}
    assert {s: v["accuracy"] for s, v in subsets.items()} == pytest.approx({s: a for s, (_, a) in expected.items()})
    assert subsets["mt-bench-easy"]["ties"] == 1 and sum(v["ties"] for v in subsets.values()) == 1
    assert subsets["alpacaeval-length"]["mean_margin"] == pytest.approx((1.0 - 3.0) / 2)
    assert report["overall"]["n"] == 14 and report["overall"]["accuracy"] == pytest.approx(8 / 14)


def test_sections_weigh_by_rewardbench_counts_and_report_incomplete(report):
    sections = report["sections"]
    # Chat: (100 * 1 + 95 * 0.5 + 95 * 1 + 28 * 0 + 40 * 0) / (100 + 95 + 95 + 28 + 40) = 242.5 / 358
    assert sections["Chat"] == {"score": pytest.approx(242.5 / 358), "complete": True, "missing": [],
                                "present_score": pytest.approx(242.5 / 358)}
    # Reasoning has math-prm and hep-python only: (984 * 0.5 + 164 * 1) / (984 + 164) = 4/7, not a score
    reasoning = sections["Reasoning"]
    assert reasoning["score"] is None and not reasoning["complete"]
    assert reasoning["missing"] == ["hep-cpp", "hep-go", "hep-java", "hep-js", "hep-rust"]
    assert reasoning["present_score"] == pytest.approx(4 / 7)
    assert sections["Safety"] == {"score": None, "complete": False, "missing": list(SECTIONS["Safety"]),
                                  "present_score": None}
    assert report["overall"]["rewardbench"] is None  # never an average over incomplete sections


def test_complete_sections_and_the_math_prm_weight():
    accuracy = {s: 1.0 for s in EXAMPLE_COUNTS}
    accuracy["math-prm"] = 0.0  # weighs 984 = 6 x 164, as much as the six code subsets together
    sections = section_scores(accuracy)
    assert [sections[s]["score"] for s in SECTIONS] == [1.0, 1.0, 1.0, pytest.approx(0.5)]
    assert overall_score(sections) == pytest.approx((1 + 1 + 1 + 0.5) / 4)
    assert sum(EXAMPLE_COUNTS.values()) == 2985 - 447 + 984  # RewardBench's 2985 pairs, math-prm re-weighted


def test_wilson_interval_by_hand(report):
    # Wilson (z = 1.96): 2 of 3 -> centre (2/3 + z^2/6) / (1 + z^2/3) = 0.573084, half-width
    # z sqrt(2/27 + z^2/36) / (1 + z^2/3) = 0.365424 -> [0.207660, 0.938508]; 1 of 2 -> [0.094531, 0.905469]
    assert report["subsets"]["extra"]["ci95"] == pytest.approx([0.207660, 0.938508], abs=1e-6)
    assert report["subsets"]["math-prm"]["ci95"] == pytest.approx([0.094531, 0.905469], abs=1e-6)
    lo, hi = wilson_interval(0, 2)
    assert lo == 0.0 and hi == pytest.approx(1.959964 ** 2 / (2 + 1.959964 ** 2), abs=1e-6)
    assert wilson_interval(0, 0) is None and not math.isnan(wilson_interval(5, 5)[0])


def test_model_names_are_short_unique_and_file_safe():
    assert model_names(["runs/a/final", "runs/b/final", "x/hub model"]) == ["a-final", "b-final", "hub_model"]
    assert model_names(["m", "m"]) == ["m", "m-2"]


def test_wilson_interval_contains_the_proportion_at_0_and_1():
    """At p = 0 or 1 float rounding put a bound a hair past p (n = 3, 6, ...): a negative error bar, which
    matplotlib refuses (the report then failed)."""
    for n in range(1, 300):
        assert wilson_interval(n, n)[1] >= 1.0 and wilson_interval(0, n)[0] <= 0.0


def test_length_warnings_derived_by_hand(report):
    """Chosen longer (characters) in rows 1, 4, 7, 10 of ROWS and in "kind words"/"no" of EXTRA: the length-only
    baseline is 5/14 overall, under the 8/14 accuracy by far more than 2 points: no overall warning. Per subset
    (accuracy vs "longer wins"): alpacaeval-length .5 vs .5 and math-prm .5 vs .5 are within 2 points,
    mt-bench-easy 0 vs 0 too; mt-bench-med 0 vs .5 is below; the rest beat it."""
    from rmkit.report.build import length_warnings

    assert report["length_bias"]["longer_wins_accuracy"] == pytest.approx(5 / 14)
    assert report["length_bias"]["length_warning"] is None
    warned = {s: v["length_warning"] for s, v in report["subsets"].items() if v["length_warning"]}
    assert set(warned) == {"alpacaeval-length", "math-prm", "mt-bench-easy", "mt-bench-med"}
    assert "within 2 points of the length-only baseline 50.0%" in warned["alpacaeval-length"]
    assert "accuracy 0.0% is below the length-only baseline 50.0%" in warned["mt-bench-med"]
    listed = length_warnings({"models": {"m": report}})
    assert [where for _, where, _ in listed] == [f"subset {s}" for s in report["subsets"] if s in warned]


def test_length_warning_threshold():
    from rmkit.report.metrics import length_warning

    assert length_warning(0.70, 0.67) is None  # 3 points above: beats the baseline
    assert "within 2 points of" in length_warning(0.68, 0.67)
    assert "within 2 points of" in length_warning(0.66, 0.67)
    assert "below" in length_warning(0.60, 0.67)
    assert length_warning(None, 0.67) is None and length_warning(0.5, None) is None
