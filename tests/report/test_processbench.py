"""ProcessBench in `rmkit eval --report`: the scores against a hand computation, a process reward model end to
end (report.json's `processbench` section, the HTML section, the score file) agreeing to the bit with
`rmkit score` on the same file, the threshold, the bad inputs (one line each, exit 2), and the real files'
published counts."""

import json
from pathlib import Path

import pytest

from rmkit import cli
from rmkit.report import load_eval_set
from rmkit.report.processbench import ProcessRow, predicted_first_error, processbench_scores

GSM8K = [
    {"id": "gsm8k-0", "problem": "Tom has 3 apples and buys 4. How many?", "steps": ["3 + 4 = 7.", "He has 7."],
     "label": -1},
    {"id": "gsm8k-1", "problem": "What is 6 * 7?", "steps": ["6 * 7 = 48.", "So 48.", "The answer is 48."], "label": 0},
    {"id": "gsm8k-2", "problem": "Half of 18?", "steps": ["18 / 2 = 9.", "9 - 1 = 8.", "So 8."], "label": 1},
]
MATH = [
    {"id": "math-0", "problem": "Solve x + 2 = 5.", "steps": ["x = 5 - 2.", "x = 3."], "label": -1},
    {"id": "math-1", "problem": "Solve 2x = 10.", "steps": ["x = 10 / 2.", "x = 6."], "label": 1},
]


def row(label: int, split: str = "s") -> ProcessRow:
    return ProcessRow("p", ("a", "b", "c"), label, split, None, None)


def test_scores_by_hand():
    rows = [row(-1), row(-1), row(1), row(0), row(2), row(-1, "t"), row(0, "t")]
    rewards = [[0.9, 0.8, 0.7],   # correct, none below 0.5: right
               [0.9, 0.4, 0.7],   # correct, step 1 judged wrong: wrong
               [0.9, 0.3, 0.1],   # first error 1 found: right
               [0.6, 0.2, 0.1],   # first error 0, predicted 1: wrong
               [0.9, 0.8, None],  # first error 2 past the cut, predicted -1: wrong
               [0.7, 0.6, 0.55],  # right
               [0.1, 0.9, 0.9]]   # right
    assert [predicted_first_error(r, 0.5) for r in rewards] == [-1, 1, 1, 1, -1, -1, 0]
    scores = processbench_scores(rows, rewards, 0.5)
    s, t = scores["splits"]["s"], scores["splits"]["t"]
    assert (s["n_error"], s["n_correct"], s["cut"]) == (3, 2, 1)
    assert s["error_acc"] == pytest.approx(1 / 3) and s["correct_acc"] == pytest.approx(1 / 2)
    assert s["f1"] == pytest.approx(2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))
    assert (t["error_acc"], t["correct_acc"], t["f1"]) == (1.0, 1.0, 1.0)
    assert scores["average_f1"] == pytest.approx((s["f1"] + 1.0) / 2)
    # step_auc: s has 9 scored right steps (all of the correct solutions', those before each first error) and 2
    # scored first errors (0.3, 0.6; the third is unscored); 9 right steps are above 0.3, 8 above 0.6 (0.4 is not)
    assert s["step_auc"] == pytest.approx(17 / 18) and t["step_auc"] == 1.0
    assert scores["average_step_auc"] == pytest.approx((17 / 18 + 1.0) / 2)
    ties = processbench_scores([row(-1), row(1)], [[0.5, 0.7, 0.5], [0.5, 0.5, 0.9]])["splits"]["s"]
    assert ties["step_auc"] == pytest.approx((0.5 + 1 + 0.5 + 0.5) / 4)  # right 0.5, 0.7, 0.5, 0.5 against 0.5
    assert predicted_first_error([0.9, 0.8, 0.7], 0.85) == 1  # the threshold is the report's
    only_correct = processbench_scores([row(-1)], [[0.9, 0.9, 0.9]])
    assert only_correct["splits"]["s"]["f1"] is None and only_correct["average_f1"] is None
    assert only_correct["splits"]["s"]["step_auc"] is None and only_correct["average_step_auc"] is None


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("processbench")
    (folder / "gsm8k.json").write_text(json.dumps(GSM8K, indent=2))
    (folder / "math.json").write_text(json.dumps(MATH, indent=2))
    return folder


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_report_and_score_agree_to_the_bit(tiny_prm, files, tmp_path, capsys):
    out = tmp_path / "report"
    assert cli.main(["eval", "--model", tiny_prm, "--data", str(files / "gsm8k.json"), "--data",
                     str(files / "math.json"), "--report", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "ProcessBench average F1" in printed and "threshold 0.5" in printed
    report = json.loads((out / "report.json").read_text())
    assert report["layouts"] == {str(files / "gsm8k.json"): "processbench", str(files / "math.json"): "processbench"}
    section = report["processbench"]
    assert list(section["splits"]) == ["gsm8k", "math"] and section["threshold"] == 0.5
    assert report["benchmarks"]["processbench"]["num_rows"] == 5
    assert "threshold" in report["benchmarks"]["processbench"]["rule"]
    rows = read_jsonl(out / f"scores-processbench-{Path(tiny_prm).name}.jsonl")
    for split, records in (("gsm8k", GSM8K), ("math", MATH)):
        scored = tmp_path / f"{split}.jsonl"
        assert cli.main(["score", "--model", tiny_prm, "--input", str(files / f"{split}.json"),
                         "--output", str(scored)]) == 0
        mine = [r for r in rows if r["split"] == split]
        for report_row, score_row, record in zip(mine, read_jsonl(scored), records):
            assert report_row["step_rewards"] == score_row["step_rewards"]  # exactly: the same numbers
            assert report_row["reward"] == score_row["reward"] and report_row["label"] == record["label"]
            assert report_row["prediction"] == predicted_first_error(report_row["step_rewards"], 0.5)
        # the split's figures re-derived from the score file
        errors = [r["prediction"] == r["label"] for r in mine if r["label"] != -1]
        corrects = [r["prediction"] == -1 for r in mine if r["label"] == -1]
        assert section["splits"][split]["error_acc"] == pytest.approx(sum(errors) / len(errors))
        assert section["splits"][split]["correct_acc"] == pytest.approx(sum(corrects) / len(corrects))
    page = (out / "report.html").read_text()
    assert "<h2>ProcessBench</h2>" in page and "5 ProcessBench solutions" in page


def test_the_threshold_is_the_users(tiny_prm, files, tmp_path):
    out = tmp_path / "report"
    assert cli.main(["eval", "--model", tiny_prm, "--data", str(files / "gsm8k.json"), "--report", str(out),
                     "--step-threshold", "0.999", "--json"]) == 0
    rows = read_jsonl(out / f"scores-processbench-{Path(tiny_prm).name}.jsonl")
    assert all(r["prediction"] == 0 for r in rows)  # every probability of a random head is below 0.999
    assert json.loads((out / "report.json").read_text())["processbench"]["threshold"] == 0.999


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_the_wrong_model_for_the_data(tiny_prm, tiny_decoder, files, pair_files, tmp_path, capsys):
    assert cli.main(["eval", "--model", tiny_decoder, "--data", str(files / "gsm8k.json"), "--report",
                     str(tmp_path / "a")]) == 2
    assert "config key '--model'" in (err := _error(capsys)) and "is not a process reward model" in err
    assert cli.main(["eval", "--model", tiny_prm, "--data", str(pair_files[1]), "--report", str(tmp_path / "b")]) == 2
    assert "is a process reward model" in _error(capsys)
    assert cli.main(["eval", "--model", tiny_prm, "--data", str(pair_files[1])]) == 2
    assert "is a process reward model" in _error(capsys)
    assert cli.main(["eval", "--model", tiny_prm, "--data", str(files / "gsm8k.json"), "--report",
                     str(tmp_path / "c"), "--step-threshold", "1.5"]) == 2
    assert "'--step-threshold': a probability strictly between 0 and 1, got 1.5" in _error(capsys)


@pytest.mark.parametrize("change, where", [
    ({"label": 3}, "field 'label': 3 is past the last step"),
    ({"steps": ["6 * 7\n\n= 48.", "So 48."]}, "field 'steps[0]': contains the model's step separator"),
    ({"steps": []}, "field 'steps': is an empty list of steps"),
])
def test_bad_rows_name_file_line_and_field(tiny_prm, tmp_path, capsys, change, where):
    bad = tmp_path / "gsm8k.json"
    bad.write_text(json.dumps([GSM8K[0], {**GSM8K[1], **change}], indent=2))
    assert cli.main(["eval", "--model", tiny_prm, "--data", str(bad), "--report", str(tmp_path / "r")]) == 2
    lines = bad.read_text().splitlines()
    second = [i for i, text in enumerate(lines, start=1) if text == "  {"][1]  # where the bad object opens
    err = _error(capsys)
    assert f"{bad}:{second}: {where}" in err


def test_the_real_files_hold_the_published_counts(shared_data):
    folder = shared_data / "prm" / "processbench"
    evalset = load_eval_set([str(folder / f"{s}.json") for s in ("gsm8k", "math", "olympiadbench", "omnimath")])
    counts = {}
    for r in evalset.solutions:
        counts.setdefault(r.split, [0, 0])[r.label == -1] += 1
    # ProcessBench's Table 1: erroneous / correct solutions per split
    assert counts == {"gsm8k": [207, 193], "math": [594, 406], "olympiadbench": [661, 339], "omnimath": [759, 241]}
