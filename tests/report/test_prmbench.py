"""PRMBench in `rmkit eval --report`: PRMScore against a hand computation (PRMBench's confusion counts, F1 of the
correct steps, negative F1 of the wrong ones, their mean), a process reward model end to end (report.json's
`prmbench` section re-derived from the score file, the HTML section), a bad row, and the real files' counts."""

import json
from pathlib import Path

import pytest

from rmkit import cli
from rmkit.data.readers import RawRecord
from rmkit.report import load_eval_set
from rmkit.report.prmbench import CORRECT, PRMBenchRow, prmbench_scores

RECORDS = [
    {"idx": "p_0", "classification": "circular", "original_question": "What is 2 + 3 * 4?",
     "original_process": ["3 * 4 = 12.", "2 + 12 = 14.", "The answer is 14."],
     "modified_question": "What is 2 + 3 * 4?",
     "modified_process": ["3 * 4 = 12.", "2 + 12 = 14 because the answer is 14.", "The answer is 14."],
     "modified_steps": [2], "error_steps": [2]},
    {"idx": "p_1", "classification": "circular", "original_question": "Half of 18?",
     "original_process": ["18 / 2 = 9.", "So 9."], "modified_question": "Half of 18?",
     "modified_process": ["Half of 18 is half of 18.", "So 9."], "modified_steps": [1], "error_steps": [1]},
    {"idx": "p_0", "classification": "confidence", "original_question": "What is 2 + 3 * 4?",
     "original_process": ["3 * 4 = 12.", "2 + 12 = 14.", "The answer is 14."],
     "modified_question": "What is 2 + 3 * 4?",
     "modified_process": ["3 * 4 = 12.", "Surely 2 + 12 = 15.", "The answer is certainly 15."],
     "modified_steps": [2, 3], "error_steps": [2, 3]},
]


def row(kind: str, steps: int, wrong: set) -> PRMBenchRow:
    return PRMBenchRow("p", tuple("s" * steps), frozenset(wrong), kind, None, RawRecord("f", 1, {}))


def test_prm_score_by_hand():
    rows = [row(CORRECT, 3, set()), row("circular", 3, {1}), row("circular", 2, {0}), row("confidence", 3, {1, 2})]
    rewards = [[0.9, 0.8, 0.4],    # correct: TP TP FN
               [0.9, 0.7, 0.2],    # circular: TP, FP (the wrong step judged correct), FN (a correct one judged wrong)
               [0.3, None],        # circular: TN, TP (unscored: judged correct)
               [0.6, 0.1, 0.5]]    # confidence: TP, TN, TN (0.5 is not above the threshold)
    scores = prmbench_scores(rows, rewards)
    circular = scores["classes"]["circular"]
    assert {k: circular[k] for k in ("tp", "fp", "tn", "fn", "n", "cut")} == {"tp": 2, "fp": 1, "tn": 1, "fn": 1,
                                                                              "n": 2, "cut": 1}
    f1 = 2 * (2 / 3) * (2 / 3) / (4 / 3)            # precision 2/3, recall 2/3
    negative_f1 = 2 * (1 / 2) * (1 / 2) / 1         # negative precision 1/2 (TN / (TN + FN)), recall 1/2
    assert circular["f1"] == pytest.approx(f1) and circular["negative_f1"] == pytest.approx(negative_f1)
    assert circular["prm_score"] == pytest.approx(0.5 * f1 + 0.5 * negative_f1)
    correct = scores["classes"][CORRECT]  # no wrong step: no negative F1, so no PRMScore
    assert (correct["tp"], correct["fn"], correct["negative_f1"], correct["prm_score"]) == (2, 1, 0.0, 0.4)
    overall = scores["overall"]  # the three modified solutions only
    assert (overall["tp"], overall["fp"], overall["tn"], overall["fn"], overall["n"]) == (3, 1, 3, 1, 3)
    assert overall["prm_score"] == pytest.approx(0.5 * 0.75 + 0.5 * 0.75)


@pytest.fixture
def bench_file(tmp_path) -> Path:
    path = tmp_path / "prmbench_tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path


def test_report_end_to_end(tiny_prm, bench_file, tmp_path, capsys):
    out = tmp_path / "report"
    assert cli.main(["eval", "--model", tiny_prm, "--data", str(bench_file), "--report", str(out)]) == 0
    assert "PRMBench PRMScore" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert report["layouts"] == {str(bench_file): "prmbench"} and report["benchmarks"]["prmbench"]["num_rows"] == 5
    section = report["prmbench"]
    assert list(section["classes"]) == [CORRECT, "circular", "confidence"]  # p_0's clean solution once
    rows = [json.loads(line) for line in (out / f"scores-prmbench-{Path(tiny_prm).name}.jsonl").read_text().splitlines()]
    assert [r["classification"] for r in rows] == [CORRECT, "circular", CORRECT, "circular", "confidence"]
    assert [r["error_steps"] for r in rows] == [[], [2], [], [1], [2, 3]]
    tp = sum(1 for r in rows if r["classification"] != CORRECT for s, p in enumerate(r["step_rewards"], 1)
             if s not in r["error_steps"] and p > 0.5)
    assert section["overall"]["tp"] == tp
    assert "<h2>PRMBench</h2>" in (out / "report.html").read_text()


def test_a_bad_row_names_file_line_and_field_or_is_skipped(tiny_prm, tmp_path, capsys):
    """An error step past the modified process (103 of the real files' records have one; PRMBench's own code passes
    them over): one line, or with --skip-bad the record is skipped, counted and written to the rejects file."""
    bad = tmp_path / "prmbench_bad.jsonl"
    bad.write_text(json.dumps(RECORDS[0]) + "\n" + json.dumps({**RECORDS[1], "error_steps": [5]}) + "\n")
    assert cli.main(["eval", "--model", tiny_prm, "--data", str(bad), "--report", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: field 'error_steps[0]': step 5 is outside modified_process" in err and "Traceback" not in err
    rejects = tmp_path / "rejects.jsonl"
    assert cli.main(["eval", "--model", tiny_prm, "--data", str(bad), "--report", str(tmp_path / "r"), "--skip-bad",
                     "--rejects", str(rejects)]) == 0
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["skipped"] == 1 and report["prmbench"]["overall"]["n"] == 1
    assert json.loads(rejects.read_text())["source"] == f"{bad}:2"


def test_the_real_files(shared_data):
    files = sorted((shared_data / "prm" / "prmbench").glob("*.jsonl"))
    evalset = load_eval_set([str(f) for f in files], on_error="skip")
    modified = [r for r in evalset.prmbench if r.classification != CORRECT]
    assert len(files) == 25 and len(modified) + len(evalset.skipped) == 6216  # PRMBench's 6,216 solutions
    assert len(evalset.skipped) == 103
    # multi_solutions' modified process is another right solution (no error step); every other type has one
    assert {r.classification for r in modified if not r.wrong} == {"multi_solutions"}
    assert sum(r.classification == CORRECT for r in evalset.prmbench) == 758  # one clean solution per idx
