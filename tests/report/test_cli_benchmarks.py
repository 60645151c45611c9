"""`rmkit eval --report` on RewardBench 2 and RM-Bench files: two tiny random models end to end, every number
re-derived from the score files; layouts recognised per file (JSONL, JSON, Parquet) or forced; bad rows named
by file:line with exit status 2."""

import json
import re

import numpy as np
import pytest

from rmkit.cli import main as rmkit_main
from rmkit.inference import load_scorer
from rmkit.report import load_eval_set
from rmkit.report.layouts import detect_layout
from rmkit.report.rewardbench2 import best_of_result, ties_score
from rmkit.report.rmbench import DOMAINS, difficulty, style_matrix
from tests.report.bench_data import v2_rows, write_jsonl, write_rm_bench, write_v2
from tests.report.rb_data import write_rb_files
from tests.support.reward_models import run_cli


@pytest.fixture(scope="module")
def run(tiny_decoder, tiny_encoder, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    v2, rm = write_v2(folder), write_rm_bench(folder)
    pairs, _ = write_rb_files(folder)
    out = folder / "out"
    data = [arg for path in [pairs, v2, *rm] for arg in ("--data", str(path))]
    result = run_cli("eval", "--model", tiny_decoder, "--model", tiny_encoder, *data, "--report", str(out))
    assert result.returncode == 0, result.stderr
    return result, out, v2, rm


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_layouts_and_files(run):
    result, out, v2, rm = run
    report = json.loads((out / "report.json").read_text())
    assert set(report["layouts"].values()) == {"pairs", "rewardbench2", "rm-bench"}
    assert report["layouts"][str(v2)] == "rewardbench2" and report["layouts"][str(rm[0])] == "rm-bench"
    names = list(report["models"])
    for name in names:
        for prefix in ("scores-", "scores-rewardbench2-", "scores-rm-bench-"):
            assert (out / f"{prefix}{name}.jsonl").exists()
        line = next(text for text in result.stdout.splitlines() if text.startswith(f"{name}: "))
        # a score can dip below 0: Ties adds 0.01 x a mean of tanh values in (-1, 1)
        assert re.search(r"RewardBench 2 -?\d\.\d{4}; RM-Bench \d\.\d{4} \(hard", line) and "accuracy" in line
    assert report["benchmarks"]["rewardbench_v2"]["num_rows"] == len(v2_rows())
    assert report["benchmarks"]["rm_bench"]["num_rows"] == 10
    # the leaderboard keys at the top: the first model's, the same numbers as under models.<name>
    first = report["models"][names[0]]
    for key, fields in (("rewardbench_v2", {"subsets", "score"}), ("rm_bench", {"domains", "hard", "normal", "easy", "score"})):
        assert fields <= report[key].keys() and report[key]["model"] == names[0]
        assert {k: v for k, v in report[key].items() if k != "model"} == first[key]


def test_rewardbench2_numbers_from_the_score_files(run):
    _, out, _, _ = run
    report = json.loads((out / "report.json").read_text())
    for name, entry in report["models"].items():
        rows = read_jsonl(out / f"scores-rewardbench2-{name}.jsonl")
        assert [len(r["rewards"]) for r in rows] == [len(v["chosen"]) + len(v["rejected"]) for v in v2_rows()]
        expected = {}
        for subset in ("Factuality", "Precise IF", "Math", "Safety", "Focus"):
            members = [r for r in rows if r["subset"] == subset]
            expected[subset] = np.mean([best_of_result(r["rewards"]) for r in members])
            assert [r["result"] for r in members] == [best_of_result(r["rewards"]) for r in members]
        expected["Ties"] = ties_score([(r["id"], r["num_correct"], r["rewards"]) for r in rows
                                       if r["subset"] == "Ties"])["score"]
        v2 = entry["rewardbench_v2"]
        assert v2["subsets"] == pytest.approx(expected, abs=1e-12)
        assert v2["score"] == pytest.approx(np.mean(list(expected.values())), abs=1e-12) and v2["complete"]
    baselines = report["benchmarks"]["rewardbench_v2"]["baselines"]
    assert baselines["Math"] == {"random": 0.25, "longest_wins": 0.0}  # the padded wrong answer is the longest
    assert baselines["Ties"]["random"] is None


def test_rm_bench_numbers_from_the_score_files(run):
    _, out, _, _ = run
    report = json.loads((out / "report.json").read_text())
    for name, entry in report["models"].items():
        rows = read_jsonl(out / f"scores-rm-bench-{name}.jsonl")
        rm = entry["rm_bench"]
        for domain in DOMAINS:
            members = [r for r in rows if r["domain"].split("-")[0] == domain]
            matrix = style_matrix(np.array([r["rewards_chosen"] for r in members]),
                                  np.array([r["rewards_rejected"] for r in members]))
            assert rm["domains"][domain]["matrix"] == matrix.tolist()
            assert rm["domains"][domain] == {**difficulty(matrix), "matrix": matrix.tolist(), "n": len(members)}
        for key in ("hard", "normal", "easy"):
            assert rm[key] == pytest.approx(np.mean([rm["domains"][d][key] for d in DOMAINS]), abs=1e-12)
        assert rm["score"] == pytest.approx(np.mean([rm["domains"][d]["avg"] for d in DOMAINS]), abs=1e-12)


def test_every_completion_is_scored_alone_through_the_inference_core(run, tiny_decoder):
    """A completion's reward is the core's reward of `prompt + completion` on its own."""
    _, out, v2, rm = run
    report = json.loads((out / "report.json").read_text())
    name = next(n for n, e in report["models"].items() if e["path"] == tiny_decoder)
    scorer = load_scorer(tiny_decoder)
    row = v2_rows()[0]
    alone = scorer.score([row["prompt"] + c for c in row["chosen"] + row["rejected"]])[:, 0].double().numpy()
    assert read_jsonl(out / f"scores-rewardbench2-{name}.jsonl")[0]["rewards"] == pytest.approx(alone, abs=1e-5)
    styled = json.loads(rm[0].read_text())[1]
    alone = scorer.score([styled["prompt"] + c for c in styled["chosen"]])[:, 0].double().numpy()
    assert read_jsonl(out / f"scores-rm-bench-{name}.jsonl")[1]["rewards_chosen"] == pytest.approx(alone, abs=1e-5)


def test_html_sections(run):
    _, out, _, _ = run
    text = (out / "report.html").read_text(encoding="utf-8")
    assert ">RewardBench 2<" in text and ">RM-Bench<" in text and ">Ties<" in text
    assert text.count('<table class="grid">') == 2 * len(DOMAINS)  # a 3x3 matrix per domain, per model
    assert "chosen \\ rejected" in text and "pairs truncated" in text


@pytest.mark.parametrize("kind", ["json", "parquet"])
def test_json_and_parquet_are_recognised(tmp_path, kind):
    path = write_v2(tmp_path, kind)
    assert detect_layout(str(path)) == "rewardbench2"
    evalset = load_eval_set([str(path)])
    assert len(evalset.best_of) == len(v2_rows()) and not evalset.pairs
    assert evalset.best_of[3].subset == "Precise IF" and evalset.best_of[-1].num_correct == 3


def test_a_forced_layout(tmp_path, tiny_decoder, capsys):
    rm = write_rm_bench(tmp_path)[0]
    capsys.readouterr()
    code = rmkit_main(["eval", "--model", tiny_decoder, "--data", str(rm), "--layout", "rewardbench2",
                       "--report", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and f"{rm}:2: field 'subset': unknown RewardBench 2 subset 'made-up'" in err
    code = rmkit_main(["eval", "--model", tiny_decoder, "--data", str(rm)])  # plain eval: pairs only
    err = capsys.readouterr().err
    assert code == 2 and "is in the rm-bench layout, whose scores need a report: add --report OUT_DIR" in err


def bad_v2(rows: list[dict], index: int, **change) -> list[dict]:
    rows[index] = {**rows[index], **change}
    return rows


@pytest.mark.parametrize("change, where, message", [
    ({"chosen": ["a", "b"]}, "field 'chosen'", "holds 2 responses but num_correct is 1"),
    ({"total_completions": 5}, "field 'total_completions'", "is 5 but the row has 4 completions"),
    ({"subset": "Chat"}, "field 'subset'", "unknown RewardBench 2 subset 'Chat'"),
    ({"subset": "Ties", "id": "tie-3"}, "field 'id'", "a Ties id is 'ref:N' or 'tied:N'"),
])
def test_bad_rewardbench2_rows_name_file_and_line(tmp_path, tiny_decoder, capsys, change, where, message):
    path = write_jsonl(tmp_path / "rb2.jsonl", bad_v2(v2_rows(), 2, **change))
    capsys.readouterr()
    code = rmkit_main(["eval", "--model", tiny_decoder, "--data", str(path), "--report", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"{path}:3: {where}: {message}" in err


def test_bad_rm_bench_rows_name_file_and_line(tmp_path, tiny_decoder, capsys):
    path = write_rm_bench(tmp_path, rows_per_file=3)[1]
    rows = json.loads(path.read_text())
    rows[2]["rejected"] = rows[2]["rejected"][:2]
    path.write_text(json.dumps(rows, indent=4), encoding="utf-8")
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if f'"id": {rows[2]["id"]},' in text) - 1
    capsys.readouterr()
    code = rmkit_main(["eval", "--model", tiny_decoder, "--data", str(path), "--report", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert f"{path}:{line}: field 'rejected': expected a list of 3 styles (concise, detailed plain, detailed markdown), " \
           "got 2 entries" in err
    rows[2]["rejected"], rows[2]["domain"] = rows[1]["rejected"], "poetry"
    path.write_text(json.dumps(rows, indent=4), encoding="utf-8")
    assert rmkit_main(["eval", "--model", tiny_decoder, "--data", str(path), "--report", str(tmp_path / "o")]) == 2
    assert f"{path}:{line}: field 'domain': unknown RM-Bench domain 'poetry'" in capsys.readouterr().err
