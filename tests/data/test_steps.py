"""Step-labelled data (`rmkit.data.steps`): the four layouts from small files whose solutions are derived by hand,
every bad input located as file:line (or record index): field, PRM800K's rows grouped into solutions, the real
files in `../shared/data/prm` (skipped when absent), and `rmkit data check` on a step file."""

import json
import random
from pathlib import Path

import pytest

from rmkit import cli
from rmkit.data import STEP_FORMATS, StepSolution, load_step_data, step_summary
from rmkit.errors import DataError

from .conftest import write_jsonl

REPO_ROOT = Path(__file__).resolve().parents[2]
PRM_DATA = REPO_ROOT.parent / "shared" / "data" / "prm"
EXAMPLE = REPO_ROOT / "rmkit" / "resources" / "steps_example.jsonl"
real_data = pytest.mark.skipif(not PRM_DATA.is_dir(), reason=f"{PRM_DATA} is absent")

STEPWISE = {"prompt": "2 + 3 * 4?", "completions": ["3 * 4 = 12.", "2 + 12 = 14."], "labels": [True, True]}


def write_json(path: Path, records) -> Path:
    path.write_text(json.dumps(records), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    pd.DataFrame(rows).to_parquet(path)
    return path


def error_of(path, **kwargs) -> str:
    with pytest.raises(DataError) as caught:
        load_step_data(path, **kwargs)
    return str(caught.value)


# The layouts --------------------------------------------------------------------------------------------------

def test_stepwise_jsonl_and_json(tmp_path):
    wrong = {"prompt": "2 + 3 * 4?", "completions": ["2 + 3 = 5.", "5 * 4 = 20."], "labels": [False, False]}
    path = write_jsonl(tmp_path / "s.jsonl", [STEPWISE, wrong])
    result = load_step_data(path)
    assert result.format == "stepwise" and result.skipped == []
    assert result.records == [
        StepSolution(f"{path}:1", "2 + 3 * 4?", ("3 * 4 = 12.", "2 + 12 = 14."), (True, True)),
        StepSolution(f"{path}:2", "2 + 3 * 4?", ("2 + 3 = 5.", "5 * 4 = 20."), (False, False)),
    ]
    array = write_json(tmp_path / "s.json", [STEPWISE])
    assert load_step_data(array).records[0].source == f"{array}[0]"


def test_processbench_labels_before_at_and_after_the_first_error(tmp_path):
    steps = ["s0", "s1", "s2"]
    path = write_json(tmp_path / "pb.json", [
        {"id": "a", "problem": "P", "steps": steps, "label": -1, "final_answer_correct": True},
        {"id": "b", "problem": "P", "steps": steps, "label": 0},
        {"id": "c", "problem": "P", "steps": steps, "label": 1},
        {"id": "d", "problem": "P", "steps": steps, "label": 2},
    ])
    result = load_step_data(path)
    assert result.format == "processbench"
    assert [r.labels for r in result.records] == [
        (True, True, True),  # -1: every step right
        (False, None, None),  # the first step wrong, the rest unknown
        (True, False, None),
        (True, True, False),
    ]
    assert [r.source for r in result.records] == [f"{path}[{i}]" for i in range(4)]


def test_prmbench_gives_the_clean_and_the_modified_solution(tmp_path):
    record = {"original_question": "Q", "original_process": ["o1", "o2"], "modified_question": "Q'",
              "modified_process": ["m1", "m2", "m3", "m4"], "modified_steps": [2, 3, 4], "error_steps": [2, 4],
              "reason": "...", "idx": "x", "question": "Q", "classification": "circular"}
    path = write_jsonl(tmp_path / "pm.jsonl", [record])
    result = load_step_data(path)
    assert result.format == "prmbench"
    assert result.records == [
        StepSolution(f"{path}:1", "Q", ("o1", "o2"), (True, True)),
        StepSolution(f"{path}:1", "Q'", ("m1", "m2", "m3", "m4"), (True, False, True, False)),  # 1-based, m3 modified
    ]


# PRM800K: rows grouped into solutions ------------------------------------------------------------------------

def prm_row(problem, responses, step, rating, human=False, preferred=False):
    return {"instruction": problem, "responses": responses, "next_response": step, "rating": rating,
            "is_human_response": human, "is_preferred_response": preferred, "answer": None}


# Problem A: three candidates for step 1 (a1 taken), two for step 2 (a2 taken), a human hint, then two candidates
# (one unrated). Problem B: b1 (rated twice the same way: one step), then b2 rated both -1 and 1.
PRM_ROWS = [
    prm_row("A", [], "a1", 1.0, preferred=True),  # 0
    prm_row("A", [], "a1x", -1.0),  # 1
    prm_row("A", [], "a1y", 0.0),  # 2
    prm_row("A", ["a1"], "a2", 1.0, preferred=True),  # 3
    prm_row("A", ["a1"], "a2x", -1.0),  # 4
    prm_row("A", ["a1", "a2"], "hint", None, human=True, preferred=True),  # 5
    prm_row("A", ["a1", "a2", "hint"], "a4", 1.0, preferred=True),  # 6
    prm_row("A", ["a1", "a2", "hint"], "a4x", None),  # 7: not rated
    prm_row("B", [], "b1", 1.0, preferred=True),  # 8
    prm_row("B", ["b1"], "b2", -1.0),  # 9
    prm_row("B", [], "b1", 1.0, preferred=True),  # 10: repeats row 8
    prm_row("B", ["b1"], "b2", 1.0),  # 11: the same text as row 9, rated differently
]


def test_prm800k_groups_rows_into_solutions(tmp_path):
    path = write_parquet(tmp_path / "phase1.parquet", PRM_ROWS)
    result = load_step_data(path)
    assert result.format == "prm800k" and result.skipped == [] and result.repeated == 1
    assert [(r.source, r.prompt, r.steps, r.labels) for r in result.records] == [
        (f"{path}[1]", "A", ("a1x",), (False,)),
        (f"{path}[2]", "A", ("a1y",), (None,)),  # ambiguous, dropped (the default)
        (f"{path}[4]", "A", ("a1", "a2x"), (True, False)),
        (f"{path}[6]", "A", ("a1", "a2", "hint", "a4"), (True, True, None, True)),  # a hint carries no label
        (f"{path}[7]", "A", ("a1", "a2", "hint", "a4x"), (True, True, None, None)),  # nor does an unrated step
        (f"{path}[9]", "B", ("b1", "b2"), (True, False)),
        (f"{path}[11]", "B", ("b1", "b2"), (True, True)),
    ]
    correct = load_step_data(path, ambiguous="correct")
    assert correct.records[1].labels == (True,)
    assert [r.labels for r in correct.records[2:]] == [r.labels for r in result.records[2:]]
    assert correct.records[0] == result.records[0]


def test_prm800k_grouping_does_not_depend_on_row_order(tmp_path):
    rows = list(PRM_ROWS)
    random.Random(0).shuffle(rows)
    shuffled = load_step_data(write_parquet(tmp_path / "shuffled.parquet", rows))
    ordered = load_step_data(write_parquet(tmp_path / "ordered.parquet", PRM_ROWS))
    def solutions(result):
        return sorted((r.prompt, r.steps, tuple(map(str, r.labels))) for r in result.records)
    assert solutions(shuffled) == solutions(ordered) and shuffled.repeated == 1


def test_prm800k_continuing_a_step_rated_twice_takes_the_preferred_one(tmp_path):
    rows = [prm_row("A", [], "a1", 0.0), prm_row("A", [], "a1", 1.0, preferred=True),
            prm_row("A", ["a1"], "a2", -1.0)]
    result = load_step_data(write_parquet(tmp_path / "p.parquet", rows))
    assert [(r.steps, r.labels) for r in result.records] == [(("a1",), (None,)), (("a1", "a2"), (True, False))]
    rows[1]["is_preferred_response"] = False
    path = write_parquet(tmp_path / "q.parquet", rows)
    assert error_of(path).startswith(f"{path}:2: field 'responses': its last step was rated differently by "
                                     "several rows and none of them is marked is_preferred_response")


def test_prm800k_orphan_row_and_skip(tmp_path):
    rows = [prm_row("A", [], "a1", 1.0, preferred=True), prm_row("A", ["zz"], "a2", 1.0, preferred=True),
            prm_row("A", ["zz", "a2"], "a3", -1.0), prm_row("B", ["a1"], "b2", 1.0)]
    path = write_parquet(tmp_path / "p.parquet", rows)
    assert error_of(path) == (f"{path}:1: field 'responses': continues no row of this problem (no row's responses "
                              "+ [next_response] equals these steps)")
    result = load_step_data(path, on_error="skip")
    assert [r.steps for r in result.records] == [("a1",)]
    assert [(source, reason.partition(":")[0]) for source, reason in result.skipped] == [
        (f"{path}[1]", "field 'responses'"), (f"{path}[3]", "field 'responses'"),  # B's rows do not continue A's
        (f"{path}[2]", "field 'responses'"),  # under a skipped row
    ]
    assert result.skipped[2][1] == "field 'responses': continues a row that was skipped"


@pytest.mark.parametrize("change, field, message", [
    ({"rating": 2.0}, "rating", "expected 1 (correct), 0 (ambiguous), -1 (wrong) or null, got 2.0"),
    ({"rating": 0.5}, "rating", "expected 1 (correct), 0 (ambiguous), -1 (wrong) or null, got 0.5"),
    ({"next_response": " "}, "next_response", "is empty"),
    ({"instruction": None}, "instruction", "is null"),
])
def test_prm800k_bad_rows(tmp_path, change, field, message):
    rows = [prm_row("A", [], "a1", 1.0, preferred=True), {**prm_row("A", ["a1"], "a2", 1.0), **change}]
    path = write_parquet(tmp_path / "p.parquet", rows)
    assert error_of(path) == f"{path}:1: field '{field}': {message}"


def test_prm800k_missing_rating_and_bad_steps_in_jsonl(tmp_path):
    row = prm_row("A", [], "a1", 1)
    del row["rating"]
    path = write_jsonl(tmp_path / "p.jsonl", [row])
    assert error_of(path, format="prm800k").startswith(f"{path}:1: field 'rating': missing (fields present: ")
    path = write_jsonl(tmp_path / "q.jsonl", [prm_row("A", ["a1", ""], "a3", 1)])
    assert error_of(path) == f"{path}:1: field 'responses[1]': is empty"
    path = write_jsonl(tmp_path / "r.jsonl", [prm_row("A", "a1", "a2", 1)])
    assert error_of(path) == f"{path}:1: field 'responses': expected a list of steps (strings), got str"
    path = write_jsonl(tmp_path / "s.jsonl", [prm_row("A", [], "a1", True)])
    assert error_of(path).startswith(f"{path}:1: field 'rating': expected 1 (correct)")


# Bad input: file:line: field ---------------------------------------------------------------------------------

@pytest.mark.parametrize("change, field, message", [
    ({"labels": [True]}, "labels", "has 1 labels for 2 steps (one per step of 'completions')"),
    ({"labels": [True, True, False]}, "labels", "has 3 labels for 2 steps (one per step of 'completions')"),
    ({"labels": [True, 1]}, "labels[1]", "expected true or false, got 1"),
    ({"labels": [True, None]}, "labels[1]", "expected true or false, got None"),
    ({"labels": "true"}, "labels", "expected a list of true/false, one per step, got str"),
    ({"completions": ["3 * 4 = 12.", ""]}, "completions[1]", "is empty"),
    ({"completions": ["3 * 4 = 12.", None]}, "completions[1]", "is null (a step is a non-empty string)"),
    ({"completions": ["3 * 4 = 12.", 7]}, "completions[1]", "expected a string, got int"),
    ({"completions": []}, "completions", "is an empty list of steps"),
    ({"prompt": ""}, "prompt", "is empty"),
])
def test_stepwise_bad_records(tmp_path, change, field, message):
    path = write_jsonl(tmp_path / "s.jsonl", [STEPWISE, {**STEPWISE, **change}])
    assert error_of(path) == f"{path}:2: field '{field}': {message}"


def test_missing_fields_are_named(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [STEPWISE, {"prompt": "Q", "completions": ["a"]}])
    assert error_of(path, format="stepwise") == (f"{path}:2: field 'labels': missing (fields present: "
                                                 "completions, prompt)")
    path = write_json(tmp_path / "pb.json", [{"problem": "P", "steps": ["a"], "label": -1}, {"problem": "P", "label": 0}])
    assert error_of(path, format="processbench") == f"{path}:1: field 'steps': missing (fields present: label, problem)"


@pytest.mark.parametrize("label, message", [
    (3, "3 is past the last step (the solution has 3 steps, indices 0 to 2; -1 = every step correct)"),
    (-2, "must be -1 (every step correct) or the 0-based index of the first wrong step, got -2"),
    (1.5, "expected an integer, got 1.5"),
    (True, "expected an integer, got True"),
])
def test_processbench_bad_label(tmp_path, label, message):
    good = {"problem": "P", "steps": ["a", "b", "c"], "label": -1}
    path = write_json(tmp_path / "pb.json", [good, good, {**good, "label": label}])
    assert error_of(path) == f"{path}:2: field 'label': {message}"


def test_prmbench_error_step_outside_the_process(tmp_path):
    record = {"original_question": "Q", "original_process": ["o1"], "modified_question": "Q",
              "modified_process": ["m1", "m2"], "error_steps": [2, 3]}
    path = write_jsonl(tmp_path / "pm.jsonl", [record])
    assert error_of(path) == f"{path}:1: field 'error_steps[1]': step 3 is outside modified_process (2 steps, numbered from 1)"
    path = write_jsonl(tmp_path / "pn.jsonl", [{**record, "error_steps": [0]}])
    assert error_of(path) == f"{path}:1: field 'error_steps[0]': step 0 is outside modified_process (2 steps, numbered from 1)"
    path = write_jsonl(tmp_path / "po.jsonl", [{**record, "original_process": ["o1", "  "], "error_steps": []}])
    assert error_of(path) == f"{path}:1: field 'original_process[1]': is empty"


def test_step_separator_inside_a_step(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [{**STEPWISE, "completions": ["3 * 4\n= 12.", "2 + 12 = 14."]}])
    assert load_step_data(path).records  # no separator given: no check
    assert error_of(path, step_separator="\n") == (
        f"{path}:1: field 'completions[0]': contains the step separator '\\n' (the steps are joined with it, so this "
        "step would read as several)")
    rows = [prm_row("A", [], "a\n1", 1.0)]
    parquet = write_parquet(tmp_path / "p.parquet", rows)
    assert error_of(parquet, step_separator="\n").startswith(f"{parquet}:0: field 'next_response': contains the step")


def test_skip_reports_the_bad_records(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [STEPWISE, "{broken", {**STEPWISE, "labels": [True]}, STEPWISE])
    result = load_step_data(path, on_error="skip")
    assert [r.source for r in result.records] == [f"{path}:1", f"{path}:4"]
    assert result.skipped == [(f"{path}:2", "invalid JSON: Expecting property name enclosed in double quotes (column 2)"),
                              (f"{path}:3", "field 'labels': has 1 labels for 2 steps (one per step of 'completions')")]


def test_auto_detection(tmp_path):
    files = {
        "stepwise": write_jsonl(tmp_path / "a.jsonl", [STEPWISE]),
        "processbench": write_json(tmp_path / "b.json", [{"problem": "P", "steps": ["a"], "label": -1}]),
        "prmbench": write_jsonl(tmp_path / "c.jsonl", [{"original_question": "Q", "original_process": ["o"],
                                                        "modified_question": "Q", "modified_process": ["m"],
                                                        "error_steps": [1]}]),
        "prm800k": write_jsonl(tmp_path / "d.jsonl", [prm_row("A", [], "a1", 1)]),
    }
    assert set(files) == set(STEP_FORMATS) - {"auto"}
    for name, path in files.items():
        assert load_step_data(path).format == name
    pairs = write_jsonl(tmp_path / "e.jsonl", ["{broken", {"prompt": "Q", "chosen": "a", "rejected": "b"}])
    assert error_of(pairs) == (f"{pairs}:2: cannot tell the step-labelled layout from the fields (chosen, prompt, "
                               "rejected); pass format= one of stepwise, prm800k, processbench, prmbench")
    assert error_of(pairs, format="steps") == (f"{pairs}: unknown step format 'steps'; choose one of auto, stepwise, "
                                               "prm800k, processbench, prmbench")


def test_summary_of_the_shipped_example():
    result = load_step_data(EXAMPLE)
    assert step_summary(result.records) == {
        "solutions": 6, "steps": 17, "labels": {"correct": 10, "wrong": 7, "unlabelled": 0},
        "steps_per_solution": {"min": 2, "median": 3, "max": 3}}
    assert step_summary([])["steps_per_solution"] is None


# `rmkit data check` -------------------------------------------------------------------------------------------

def test_data_check_reports_a_step_file(tmp_path, capsys):
    assert cli.main(["data", "check", str(EXAMPLE)]) == 0
    assert capsys.readouterr().out == (
        f"{EXAMPLE}: 6 solutions (stepwise format)\n"
        "  steps: 17 (correct 10, wrong 7, unlabelled 0)\n"
        "  steps per solution: min 2, median 3, max 3\n"
        "0 problems, 0 warnings\n")
    path = write_jsonl(tmp_path / "s.jsonl", [STEPWISE, {**STEPWISE, "labels": [True, "yes"]}])
    rejects = tmp_path / "rejects.jsonl"
    assert cli.main(["data", "check", str(path), "--rejects", str(rejects), "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["format"] == "stepwise" and report["kind"] == "solutions" and report["records"] == 1
    assert report["labels"] == {"correct": 2, "wrong": 0, "unlabelled": 0}
    assert report["problems"] == [[f"{path}:2", "field 'labels[1]': expected true or false, got 'yes'"]]
    assert json.loads(rejects.read_text())["source"] == f"{path}:2"


def test_data_check_step_options_and_pairs_unchanged(tmp_path, capsys):
    path = write_parquet(tmp_path / "phase1.parquet", PRM_ROWS)
    assert cli.main(["data", "check", str(path), "--ambiguous", "correct"]) == 0
    out = capsys.readouterr().out
    assert "7 solutions (prm800k format)" in out and "steps: 16 (correct 10, wrong 3, unlabelled 3)" in out
    assert "1 repeated row merged" in out
    separated = write_jsonl(tmp_path / "s.jsonl", [{**STEPWISE, "completions": ["a\n\nb", "c"]}])
    assert cli.main(["data", "check", str(separated), "--format", "stepwise", "--step-separator", "\\n\\n"]) == 2
    assert f"error: {separated}:1: field 'completions[0]': contains the step separator '\\n\\n'" in capsys.readouterr().out
    assert cli.main(["data", "check", str(EXAMPLE), "--tokenizer", "minilm"]) == 2
    assert "token statistics cover preference and regression data" in capsys.readouterr().err
    pairs = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Q", "chosen": "a", "rejected": "b"}])
    assert cli.main(["data", "check", str(pairs)]) == 0
    assert capsys.readouterr().out == f"{pairs}: 1 pair (binary format)\n0 problems, 0 warnings\n"


# The real files (../shared/data/prm) --------------------------------------------------------------------------

@real_data
@pytest.mark.parametrize("split, rows, solutions, repeated, counts", [
    ("train", 51_835, 32_107, 6_342, {"correct": 394_103, "wrong": 16_847, "unlabelled": 113_739}),
    ("test", 5_449, 3_277, 556, {"correct": 38_498, "wrong": 1_694, "unlabelled": 8_441}),
])
def test_real_prm800k(split, rows, solutions, repeated, counts):
    from rmkit.data.readers import read_records

    path = PRM_DATA / "prm800k" / f"phase1_{split}.parquet"
    assert sum(1 for _ in read_records(path)) == rows
    result = load_step_data(path)
    assert result.format == "prm800k" and result.skipped == [] and result.repeated == repeated
    summary = step_summary(result.records)
    assert summary["solutions"] == solutions and summary["labels"] == counts
    if split == "test":  # ambiguous="correct" turns the 817 neutral steps (after merging) into correct ones
        moved = step_summary(load_step_data(path, ambiguous="correct").records)["labels"]
        assert moved == {"correct": counts["correct"] + 817, "wrong": counts["wrong"],
                         "unlabelled": counts["unlabelled"] - 817}


@real_data
@pytest.mark.parametrize("split, solutions, wrong", [
    ("gsm8k", 400, 207), ("math", 1_000, 594), ("olympiadbench", 1_000, 661), ("omnimath", 1_000, 759)])
def test_real_processbench(split, solutions, wrong):
    result = load_step_data(PRM_DATA / "processbench" / f"{split}.json")
    assert result.format == "processbench" and result.skipped == []
    summary = step_summary(result.records)
    assert summary["solutions"] == solutions and summary["labels"]["wrong"] == wrong  # one per erroneous solution


@real_data
def test_real_prmbench():
    """6,216 records in 25 files; 100 name an error step past the modified process and 3 hold an empty step: those
    are reported, the rest give two solutions each."""
    files = sorted((PRM_DATA / "prmbench").glob("*.jsonl"))
    results = [load_step_data(path, on_error="skip") for path in files]
    assert len(files) == 25 and {r.format for r in results} == {"prmbench"}
    skipped = [reason for r in results for _, reason in r.skipped]
    solutions = sum(len(r.records) for r in results)
    assert solutions // 2 + len(skipped) == 6_216 and solutions == 12_226
    assert sum("is outside modified_process" in reason for reason in skipped) == 100
    assert sum(reason.endswith("is empty") for reason in skipped) == 3
