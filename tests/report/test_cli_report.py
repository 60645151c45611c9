"""`rmkit eval --report` end to end: two tiny random models (a decoder and an encoder) on a file in
RewardBench's layout plus a file without subsets; every figure is re-derived from the score files."""

import json

import numpy as np
import pytest

from rmkit.cli import main as rmkit_main
from rmkit.report.metrics import sigmoid
from tests.report.rb_data import ROWS, write_rb_files
from tests.support.reward_models import run_cli


@pytest.fixture(scope="module")
def run(tiny_decoder, tiny_encoder, tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    rb, extra = write_rb_files(folder)
    out = folder / "out"
    result = run_cli("eval", "--model", tiny_decoder, "--model", tiny_encoder, "--data", str(rb),
                     "--data", str(extra), "--report", str(out), "--top-disagreements", "3")
    assert result.returncode == 0, result.stderr
    return result, out, rb, extra


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_writes_every_file_and_the_summary(run):
    result, out, _, _ = run
    report = json.loads((out / "report.json").read_text())
    names = list(report["models"])
    assert len(names) == 2 and report["num_pairs"] == 14
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["report.json", "report.html", "disagreements.jsonl"] + [f"scores-{n}.jsonl" for n in names])
    for name in names:
        assert f"{name}: accuracy" in result.stdout and "RewardBench incomplete" in result.stdout
    assert str(out / "report.html") in result.stdout


def test_figures_recomputed_from_the_score_files(run):
    _, out, _, _ = run
    report = json.loads((out / "report.json").read_text())
    margins = {}
    for name, entry in report["models"].items():
        rows = read_jsonl(out / f"scores-{name}.jsonl")
        assert [r["index"] for r in rows] == list(range(14))
        assert [r["subset"] for r in rows[:len(ROWS)]] == [r[0] for r in ROWS]
        assert [r["id"] for r in rows] == [100 + i for i in range(len(ROWS))] + [None] * 3
        for subset, stats in entry["subsets"].items():
            members = [r for r in rows if r["subset"] == subset]
            right = [r["reward_chosen"] > r["reward_rejected"] for r in members]
            assert stats["n"] == len(members) and stats["accuracy"] == pytest.approx(sum(right) / len(right))
            longer = [r["chosen_length"] > r["rejected_length"] for r in members]
            assert stats["longer_wins_accuracy"] == pytest.approx(sum(longer) / len(longer))
        margins[name] = np.array([r["reward_chosen"] - r["reward_rejected"] for r in rows])
    (a, b), comparison = list(margins), report["comparison"]
    assert comparison["models"] == [a, b]
    agree = np.sign(margins[a]) == np.sign(margins[b])
    assert comparison["agreement"][0]["agreement"] == pytest.approx(agree.mean())
    assert set(comparison["accuracy"]["extra"]) == {a, b}
    disagreements = read_jsonl(out / "disagreements.jsonl")
    assert len(disagreements) == min(3, int((~agree).sum()))
    gaps = [row["gap"] for row in disagreements]
    assert gaps == sorted(gaps, reverse=True)
    records = read_jsonl(run[2]) + read_jsonl(run[3])
    for row in disagreements:
        i = row["index"]
        assert not agree[i] and row["chosen"] == records[i]["chosen"] and row["models"] == [a, b]
        assert row["gap"] == pytest.approx(abs(sigmoid(margins[a][i]) - sigmoid(margins[b][i])), abs=1e-9)


def test_rewards_are_the_inference_cores(run, tiny_decoder, capsys):
    """The report's rewards agree with plain `rmkit eval` (no --report) on the same file."""
    _, out, rb, _ = run
    name = next(iter(json.loads((out / "report.json").read_text())["models"]))
    rows = read_jsonl(out / f"scores-{name}.jsonl")[:len(ROWS)]
    capsys.readouterr()
    assert rmkit_main(["eval", "--model", tiny_decoder, "--data", str(rb), "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["num_pairs"] == len(ROWS)
    assert plain["acc"] == pytest.approx(np.mean([r["reward_chosen"] > r["reward_rejected"] for r in rows]))
    assert plain["rewards_chosen_mean"] == pytest.approx(np.mean([r["reward_chosen"] for r in rows]), abs=1e-6)
    assert plain["rewards_rejected_mean"] == pytest.approx(np.mean([r["reward_rejected"] for r in rows]), abs=1e-6)


def test_several_models_need_report(tiny_decoder, tmp_path, capsys):
    rb, _ = write_rb_files(tmp_path)
    capsys.readouterr()
    code = rmkit_main(["eval", "--model", tiny_decoder, "--model", tiny_decoder, "--data", str(rb)])
    assert code == 2 and "several models or data files need --report" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage_error:  # argparse's own: the value is checked before anything loads
        rmkit_main(["eval", "--model", tiny_decoder, "--data", str(rb), "--report", str(tmp_path / "o"),
                    "--top-disagreements", "0"])
    assert usage_error.value.code == 2 and "argument --top-disagreements: must be >= 1" in capsys.readouterr().err


def test_empty_responses_when_allowed(tiny_decoder, tmp_path, capsys):
    data = tmp_path / "pandalm_like.jsonl"
    data.write_text(json.dumps({"prompt": "Say something.", "chosen": "Hello there!", "rejected": ""}) + "\n")
    capsys.readouterr()
    assert rmkit_main(["eval", "--model", tiny_decoder, "--data", str(data), "--report", str(tmp_path / "o")]) == 2
    assert "is empty" in capsys.readouterr().err
    assert rmkit_main(["eval", "--model", tiny_decoder, "--data", str(data), "--report", str(tmp_path / "o"),
                       "--allow-empty-response", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    stats = next(iter(report["models"].values()))["subsets"]["pandalm_like"]
    assert stats["n"] == 1 and stats["longer_wins_accuracy"] == 1.0


def test_plain_eval_length_section_against_the_file(run, tiny_decoder, capsys):
    """`rmkit eval` without --report: the length-only baseline and the length-controlled accuracies, computed
    again here from the file's characters and the report's rewards (the same inference core)."""
    _, out, rb, _ = run
    name = next(iter(json.loads((out / "report.json").read_text())["models"]))
    scores = read_jsonl(out / f"scores-{name}.jsonl")[:len(ROWS)]
    records = read_jsonl(rb)
    longer = [len(r["chosen"]) > len(r["rejected"]) for r in records]
    shorter = [len(r["chosen"]) < len(r["rejected"]) for r in records]
    right = [s["reward_chosen"] > s["reward_rejected"] for s in scores]
    capsys.readouterr()
    assert rmkit_main(["eval", "--model", tiny_decoder, "--data", str(rb), "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["longer_wins_acc"] == pytest.approx(sum(longer) / len(records)) == pytest.approx(4 / 11)
    assert plain["num_chosen_longer"] == 4 and plain["num_chosen_shorter"] == 5
    assert plain["acc_chosen_longer"] == pytest.approx(sum(r for r, x in zip(right, longer) if x) / 4)
    assert plain["acc_chosen_shorter"] == pytest.approx(sum(r for r, x in zip(right, shorter) if x) / 5)
    expect_warning = plain["acc"] <= 4 / 11 + 0.02
    assert (plain["length_warning"] is not None) == expect_warning


def test_a_model_no_better_than_length_is_warned_about(tiny_decoder, tmp_path, capsys):
    """Every chosen reply is the longer one: the length-only baseline is 100%, so any model is within 2 points
    of it or below, and both `rmkit eval` and `eval --report` say so in plain words."""
    data = tmp_path / "longer.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Q{i}?", "chosen": "a long and careful reply " * (i + 1),
                                        "rejected": "no"}) + "\n" for i in range(6)))
    capsys.readouterr()
    assert rmkit_main(["eval", "--model", tiny_decoder, "--data", str(data)]) == 0
    text = capsys.readouterr().out
    assert "longer_wins_acc        1.0000" in text and "warning: accuracy" in text
    assert "length-only baseline 100.0%" in text
    out = tmp_path / "report"
    assert rmkit_main(["eval", "--model", tiny_decoder, "--data", str(data), "--report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "length-only baseline (the longer response wins) 1.0000" in text
    assert f"warning: {name_of(out)}, overall: accuracy" in text
    report = json.loads((out / "report.json").read_text())
    assert "length-only baseline 100.0%" in next(iter(report["models"].values()))["length_bias"]["length_warning"]
    page = (out / "report.html").read_text()
    assert 'id="length-warnings"' in page and "length-only baseline 100.0%" in page


def name_of(out):
    return next(iter(json.loads((out / "report.json").read_text())["models"]))


def test_identical_pairs_are_named_not_silently_scored_wrong(tiny_decoder, tmp_path, capsys):
    """Every pair's chosen equals its rejected: accuracy 0 by the tie rule, and both eval paths say why on
    stderr, naming the count and the first record."""
    data = tmp_path / "same.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Q{i}?", "chosen": "same", "rejected": "same"}) + "\n"
                            for i in range(3)))
    capsys.readouterr()
    assert rmkit_main(["eval", "--model", tiny_decoder, "--data", str(data), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["identical_pairs"] == 3 and json.loads(out.out)["acc"] == 0.0
    assert f"3 of 3 pairs have identical chosen and rejected responses (first: {data}:1)" in out.err
    assert rmkit_main(["eval", "--model", tiny_decoder, "--data", str(data), "--report", str(tmp_path / "r")]) == 0
    assert "3 of 3 pairs have identical chosen and rejected" in capsys.readouterr().err
