"""`rmkit parity` on a process reward model: the step probabilities and their aggregate agree on every path (the
training forward, `rmkit score`, the server's `/v1/score_steps`, the environment) for a ProcessBench file with a
solution longer than the max length; a model and a data file that do not go together are one line, exit 2."""

import json

import pytest

from rmkit import cli
from tests.support.reward_models import run_cli, write_pairs

PROCESSBENCH = [
    {"id": "gsm8k-0", "problem": "Tom has 3 apples and buys 4. How many?", "steps": ["3 + 4 = 7.", "He has 7."],
     "label": -1},
    {"id": "gsm8k-1", "problem": "What is 6 * 7?", "steps": ["6 * 7 = 48.", "So 48.", "The answer is 48."], "label": 0},
    {"id": "long", "problem": "Count to twenty.",
     "steps": [f"The next number is {n}, one more than {n - 1}." for n in range(1, 21)], "label": -1},
    {"id": "trailing", "problem": "Half of 18?", "steps": ["18 / 2 = 9.\n", "So 9."], "label": 1},
]


def test_parity_holds_for_a_process_reward_model_on_every_path(tiny_prm, tmp_path):
    data = tmp_path / "processbench.json"
    data.write_text(json.dumps(PROCESSBENCH))
    result = run_cli("parity", "--model", tiny_prm, "--data", str(data), "--max-length", "48", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["solutions"] == 4 and report["steps"] == 27 and report["cut"] == 1
    paths = report["paths"]
    assert {"training forward", "rmkit score (CLI)", "environment (in process)", "environment (remote)",
            *(f"serve (requests of {n})" for n in (1, 2, 3, 32))} == set(paths)
    for name, path in paths.items():
        # The environment sees a response joined by the separator: "18 / 2 = 9.\n" + "\n\n" would split back
        # differently, so that solution is left out of its comparison.
        assert path["compared"] == (3 if name.startswith("environment") else 4), (name, path)
        assert path["max_abs_diff_reward"] <= 1e-5, (name, path)
        assert name.startswith("environment") or path["max_abs_diff"] <= 1e-5, (name, path)


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_a_process_reward_model_given_pairs_is_one_line(tiny_prm, tmp_path, capsys):
    pairs = write_pairs(tmp_path / "pairs.jsonl", 4)
    assert cli.main(["parity", "--model", tiny_prm, "--data", str(pairs)]) == 2
    err = _one_line_error(capsys)
    assert "--data" in err and "holds preference pairs, but" in err and "is a process reward model" in err


@pytest.mark.parametrize("as_array", [True, False])
def test_an_outcome_model_given_solutions_is_one_line(tiny_decoder, tmp_path, capsys, as_array):
    data = tmp_path / ("pb.json" if as_array else "pb.jsonl")
    data.write_text(json.dumps(PROCESSBENCH) if as_array else "".join(json.dumps(r) + "\n" for r in PROCESSBENCH))
    assert cli.main(["parity", "--model", tiny_decoder, "--data", str(data)]) == 2
    assert "is not a process reward model" in _one_line_error(capsys)
