"""`rmkit score` with a process reward model, as users run it: ProcessBench and TRL stepwise records get
`step_rewards` (the inference core's, to the bit) and `reward` (their minimum, the contract's aggregation), and
the bad inputs get one line naming file, line and field: a step holding the separator, a record with no steps,
steps given to a model that scores whole responses."""

import json

import pytest

from rmkit import cli
from rmkit.inference import load_scorer

PROCESSBENCH = [
    {"id": "gsm8k-0", "problem": "Tom has 3 apples and buys 4. How many?", "steps": ["3 + 4 = 7.", "He has 7."],
     "label": -1},
    {"id": "gsm8k-1", "problem": "What is 6 * 7?", "steps": ["6 * 7 = 48.", "So 48.", "The answer is 48."], "label": 0},
]
STEPWISE = [{"prompt": "Half of 18?", "completions": ["18 / 2 = 9.", "So 9."], "labels": [True, True]}]


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def _score(model, records, tmp_path, name="in.json", as_array=True):
    data = tmp_path / name
    data.write_text(json.dumps(records) if as_array else "".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out.jsonl"
    rc = cli.main(["score", "--model", model, "--input", str(data), "--output", str(out)])
    return rc, out


def test_processbench_and_stepwise_records_get_step_rewards_and_their_minimum(tiny_prm, tmp_path, capsys):
    rc, out = _score(tiny_prm, PROCESSBENCH, tmp_path)
    assert rc == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    expected = load_scorer(tiny_prm).score_steps([(r["problem"], r["steps"]) for r in PROCESSBENCH])
    for row, record, scored in zip(rows, PROCESSBENCH, expected):
        assert {k: row[k] for k in record} == record  # the record comes back whole
        assert row["step_rewards"] == scored.step_rewards and len(row["step_rewards"]) == len(record["steps"])
        assert row["reward"] == min(row["step_rewards"])
    rc, out = _score(tiny_prm, STEPWISE, tmp_path, "stepwise.jsonl", as_array=False)
    assert rc == 0 and len(json.loads(out.read_text())["step_rewards"]) == 2


def test_a_long_solution_keeps_its_first_steps_and_says_so(tiny_prm, tmp_path, capsys):
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps(PROCESSBENCH[1]) + "\n")
    out = tmp_path / "out.jsonl"
    assert cli.main(["score", "--model", tiny_prm, "--input", str(data), "--output", str(out),
                     "--max-length", "16"]) == 0
    row = json.loads(out.read_text())
    assert row["step_rewards"][-1] is None and row["reward"] is None
    assert "1 solutions longer than 16 tokens: their last steps and reward are null" in capsys.readouterr().err


@pytest.mark.parametrize("record, where", [
    ({"problem": "2 + 2?", "steps": ["2 + 2\n\n= 4."], "label": -1}, "field 'steps[0]': contains the step separator"),
    ({"problem": "2 + 2?", "steps": [], "label": -1}, "field 'steps': is an empty list of steps"),
    ({"problem": "2 + 2?", "steps": ["4.", ""], "label": -1}, "field 'steps[1]': is empty"),
    ({"problem": "2 + 2?", "answer": "4"}, "field 'steps': missing"),
])
def test_bad_step_records_name_file_line_and_field(tiny_prm, tmp_path, capsys, record, where):
    rc, _ = _score(tiny_prm, [record], tmp_path, "bad.jsonl", as_array=False)
    assert rc == 2
    err = _error(capsys)
    assert f"{tmp_path / 'bad.jsonl'}:1: {where}" in err


def test_steps_given_to_a_model_that_scores_whole_responses(tiny_decoder, tmp_path, capsys):
    rc, _ = _score(tiny_decoder, PROCESSBENCH, tmp_path, "pb.jsonl", as_array=False)
    assert rc == 2
    assert "pb.jsonl:1: field 'steps': holds a solution's steps, but" in _error(capsys)
