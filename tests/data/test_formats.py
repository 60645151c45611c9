"""Each layout round-trips from a fixture the test writes; ties, odd aligner files, auto-detection."""

import json

import pytest

from rmkit.data import load_preference_data
from rmkit.errors import DataError

from .conftest import write_jsonl

U = [{"role": "user", "content": "Q?"}]


def asst(text):
    return [{"role": "assistant", "content": text}]


def ranked_row(*ranks):
    return {"context": U, "completions": [{"rank": r, "completion": asst(f"a{i}")} for i, r in enumerate(ranks)]}


def test_ranked_two_completions(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [ranked_row(1, 0)])
    result = load_preference_data(path)
    assert result.format == "ranked"
    (pair,) = result.records
    assert (pair.prompt, pair.chosen, pair.rejected) == (U, asst("a1"), asst("a0"))


def test_ranked_expands_to_all_ordered_pairs(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [ranked_row(2, 0, 1)])
    pairs = load_preference_data(path, "ranked").records
    got = {(p.chosen[0]["content"], p.rejected[0]["content"]) for p in pairs}
    assert got == {("a1", "a0"), ("a2", "a0"), ("a1", "a2")}
    assert all(p.source == f"{path}:1" for p in pairs)


def test_ranked_ties_error_or_skip(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [ranked_row(0, 1), ranked_row(0, 1, 1)])
    with pytest.raises(DataError, match=rf"{path}:2: field 'completions': completions 1 and 2 have the same rank 1"):
        load_preference_data(path)
    result = load_preference_data(path, keep_ties=True)
    assert len(result.records) == 3 and result.skipped == [(f"{path}:2", "tie: completions 1 and 2 have rank 1")]


def test_ranked_bad_completion(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [{"context": U, "completions": [{"rank": 0, "completion": asst("x")}, {"completion": asst("y")}]}])
    with pytest.raises(DataError, match=rf"{path}:1: field 'completions\[1\].rank': expected a number, got null"):
        load_preference_data(path)


def test_aligner_pairs_consecutive_lines(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": "Q good"}, {"text": "Q bad"}, {"text": "R good"}, {"text": "R bad"}])
    result = load_preference_data(path)
    assert result.format == "aligner"
    assert [(p.prompt, p.chosen, p.rejected) for p in result.records] == [("", "Q good", "Q bad"), ("", "R good", "R bad")]
    assert result.records[1].source == f"{path}:3+4"


def test_aligner_odd_line_count(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": "Q a"}, {"text": "Q b"}, {"text": "Q c"}])
    with pytest.raises(DataError, match=rf"{path}:3: aligner comparison files need an even number of lines"):
        load_preference_data(path, "aligner")
    assert len(load_preference_data(path, "aligner", on_error="skip").records) == 1


def test_aligner_bad_line_skips_its_pair(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": "Q a"}, "{oops", {"text": "Q c"}, {"text": "Q d"}])
    result = load_preference_data(path, "aligner", on_error="skip")
    assert [p.chosen for p in result.records] == ["Q c"] and result.skipped[0][0] == f"{path}:2"


CHATML = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n{}<|im_end|>"


def test_aligner_pairs_must_share_their_prompt(tmp_path):
    """Unrelated texts, or a file one line short (every later pair shifted), are refused at the first bad pair."""
    unrelated = write_jsonl(tmp_path / "u.jsonl", [{"text": "The sky is blue."}, {"text": "Cats purr."}])
    with pytest.raises(DataError, match=rf"^{unrelated}:1: field 'text': lines 1 and 2 are not one prompt's two answers: "
                                        r"they start differently \('The sky is blue.' vs 'Cats purr.'\)\. .*keep each "
                                        r"pair's lines together, chosen first"):
        load_preference_data(unrelated)
    rows = [CHATML.format(q, a) for q in ("hi", "why?", "how?") for a in ("good", "bad")]
    assert len(load_preference_data(write_jsonl(tmp_path / "ok.jsonl", [{"text": t} for t in rows])).records) == 3
    shifted = write_jsonl(tmp_path / "s.jsonl", [{"text": t} for t in rows[1:] + ["x"]])  # the first line missing
    with pytest.raises(DataError, match=rf"^{shifted}:1: field 'text': lines 1 and 2 .* part before their last "
                                        r"assistant turn \(shared start: '<\|im_start\|>user\\n'\)"):
        load_preference_data(shifted)
    skipped = load_preference_data(shifted, on_error="skip")
    assert not skipped.records and [s[0] for s in skipped.skipped] == [f"{shifted}:1", f"{shifted}:3", f"{shifted}:5"]


def test_aligner_hh_transcripts_share_up_to_the_last_assistant_turn(tmp_path):
    hh = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: {}\n\nAssistant: {}"
    ok = write_jsonl(tmp_path / "hh.jsonl", [{"text": hh.format("why?", "because")}, {"text": hh.format("why?", "no")}])
    assert load_preference_data(ok).records[0].rejected.endswith("Assistant: no")
    parted = tmp_path / "p.json"  # a JSON list: records by 0-based index
    parted.write_text(json.dumps([{"text": hh.format("why?", "a")}, {"text": hh.format("how?", "a")}]))
    with pytest.raises(DataError, match=r"p.json:0: field 'text': records 0 and 1 are not one prompt's two answers"):
        load_preference_data(parted, "aligner")


def hs3(pref):
    return {"domain": "general", "context": U, "response1": "one", "response2": "two", "overall_preference": pref}


def test_helpsteer3(tmp_path):
    path = write_jsonl(tmp_path / "h.jsonl", [hs3(-2), hs3(3)])
    result = load_preference_data(path)
    assert result.format == "helpsteer3"
    assert [(p.chosen, p.rejected) for p in result.records] == [("one", "two"), ("two", "one")]
    assert result.records[0].prompt == U


def test_helpsteer3_tie(tmp_path):
    path = write_jsonl(tmp_path / "h.jsonl", [hs3(-1), hs3(0)])
    with pytest.raises(DataError, match=rf"{path}:2: field 'overall_preference': is 0 \(a tie\)"):
        load_preference_data(path)
    result = load_preference_data(path, keep_ties=True)
    assert len(result.records) == 1 and result.skipped == [(f"{path}:2", "tie: overall_preference is 0")]


def tulu(chosen_reply, rejected_reply, context=None):
    context = context or [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, *U]
    return {"prompt": "Q?", "chosen": context + asst(chosen_reply), "rejected": context + asst(rejected_reply)}


def test_tulu3(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [tulu("good", "bad")])
    result = load_preference_data(path)
    assert result.format == "tulu3"
    (pair,) = result.records
    assert len(pair.prompt) == 3 and pair.prompt[-1] == U[0]
    assert (pair.chosen, pair.rejected) == (asst("good"), asst("bad"))


def test_tulu3_context_mismatch(tmp_path):
    row = tulu("good", "bad")
    row["rejected"][0] = {"role": "user", "content": "other"}
    path = write_jsonl(tmp_path / "t.jsonl", [row])
    with pytest.raises(DataError, match=rf"{path}:1: field 'rejected': the conversation before the last assistant"):
        load_preference_data(path, "tulu3")


def test_hh_rlhf_hand_written(tmp_path):
    prompt = "\n\nHuman: Hi\n\nAssistant: Hello.\n\nHuman: Tell me a joke.\n\nAssistant:"
    row = {"chosen": prompt + " I know one.", "rejected": prompt + " I won't."}  # replies share " I "
    path = write_jsonl(tmp_path / "hh.jsonl", [row, {"chosen": "no transcript", "rejected": "at all"}])
    result = load_preference_data(path, "hh_rlhf", on_error="skip")
    (pair,) = result.records
    assert (pair.prompt, pair.chosen, pair.rejected) == (prompt, " I know one.", " I won't.")
    assert result.skipped[0][0] == f"{path}:2" and "Assistant:" in result.skipped[0][1]


def test_hh_rlhf_on_real_layout(tmp_path, shared_data):
    lines = (shared_data / "hh_harmless_train.jsonl").read_text(encoding="utf-8").splitlines()
    originals = sorted((json.loads(line) for line in lines), key=lambda r: len(r["prompt"]) + len(r["chosen"]))[:3]
    raw = [{"chosen": r["prompt"] + r["chosen"], "rejected": r["prompt"] + r["rejected"]} for r in originals]
    result = load_preference_data(write_jsonl(tmp_path / "hh.jsonl", raw))
    assert result.format == "hh_rlhf"
    for pair, original in zip(result.records, originals):
        assert (pair.prompt, pair.chosen, pair.rejected) == (original["prompt"], original["chosen"], original["rejected"])


def test_auto_detect_unknown_layout(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(DataError, match=rf"{path}:1: cannot tell the data format .*answer, question"):
        load_preference_data(path)


def test_unknown_format_name(tmp_path):
    with pytest.raises(DataError, match="unknown format 'pairs'"):
        load_preference_data(write_jsonl(tmp_path / "x.jsonl", [{"a": 1}]), "pairs")


def test_binary_keeps_rewardbench_subset_and_id(tmp_path):
    path = write_jsonl(tmp_path / "rb.jsonl", [
        {"prompt": "Q", "chosen": "a", "rejected": "b", "subset": "hep-go", "id": 7},
        {"prompt": "Q", "chosen": "a", "rejected": "b", "id": "x-1"},
        {"prompt": "Q", "chosen": "a", "rejected": "b", "subset": None},
    ])
    pairs = load_preference_data(path).records
    assert [(p.subset, p.id) for p in pairs] == [("hep-go", 7), (None, "x-1"), (None, None)]


@pytest.mark.parametrize("field, value", [("subset", 3), ("subset", " "), ("id", 1.5), ("id", True)])
def test_binary_bad_subset_or_id(tmp_path, field, value):
    path = write_jsonl(tmp_path / "rb.jsonl", [{"prompt": "Q", "chosen": "a", "rejected": "b", field: value}])
    with pytest.raises(DataError) as err:
        load_preference_data(path)
    assert err.value.field == field and err.value.line == 1
