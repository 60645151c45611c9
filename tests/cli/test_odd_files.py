"""Odd inputs a user brings to the training commands. A `{"text"}` file whose lines are not pairs, or a validation
file in the standard layout beside a training file with remapped keys: one line naming the file, the line and the
field or key and what to do, exit status 2, no traceback. A policy with no chat template, or a max length that cuts
DPO's prompts to nothing: a warning line that says so and what to do."""

import json
from pathlib import Path

import pytest

from rmkit import cli
from tests.recipes.dpo_helpers import write_pairs

REPO_ROOT = Path(__file__).resolve().parents[2]

NO_POLICY = "/nonexistent/policy"


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    return err[-1]


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_dpo_refuses_text_lines_that_are_not_pairs(tiny_policy, tmp_path, capsys):
    texts = _write(tmp_path / "texts.jsonl", [{"text": "The river is long."}, {"text": "Cats purr at night."}])
    assert cli.main(["dpo", f"policy.model_name={tiny_policy}", f"data.train_data_path={texts}",
                     "data.val_data_paths={}", f"checkpointing.checkpoint_dir={tmp_path / 'run'}"]) == 2
    assert _error(capsys).startswith(f"rmkit dpo: error: {texts}:1: field 'text': lines 1 and 2 are not one prompt's "
                                     "two answers: they start differently")


@pytest.fixture
def remapped(tmp_path):
    """A training file with its own field names and a validation file in the standard layout."""
    rows = [{"question": f"What is {i} plus {i}?", "answer": f"It is {2 * i}.", "bad": f"It is {2 * i + 1}."}
            for i in range(8)]
    train = _write(tmp_path / "train.jsonl", rows)
    return train, write_pairs(tmp_path / "val.jsonl", 4), ["data.prompt_key=question", "data.chosen_key=answer",
                                                           "data.rejected_key=bad"]


@pytest.mark.parametrize("recipe", ["train", "dpo", "sft", "grpo"])
def test_a_standard_validation_file_beside_remapped_keys_says_how_to_read_it(recipe, remapped, tmp_path, capsys):
    train, val, keys = remapped
    args = [recipe, f"policy.model_name={NO_POLICY}", f"data.train_data_path={train}", f"data.val_data_paths={{hh: {val}}}",
            *keys, f"checkpointing.checkpoint_dir={tmp_path / 'run'}"]
    if recipe == "grpo":
        args.append(f"env.reward_model.model_name={NO_POLICY}")
    assert cli.main(args) == 2  # before any model loads (the policy path does not exist)
    assert _error(capsys) == (
        f"rmkit {recipe}: error: {val}:1: field 'question': missing in validation set 'hh', which has the standard "
        "'prompt' instead (data.prompt_key=question, data.chosen_key=answer, data.rejected_key=bad: remapped for "
        "the training file); give this file its own keys: data.val_keys.hh={} for the standard ones, or "
        "data.val_keys.hh={prompt_key: FIELD}")  # was "cannot tell the data format from the fields"


def test_val_keys_read_the_validation_file_with_its_own_keys(remapped, tiny_decoder, tmp_path, capsys):
    train, val, keys = remapped
    assert cli.main(["train", f"policy.model_name={tiny_decoder}", f"data.train_data_path={train}", *keys,
                     f"data.val_data_paths={{hh: {val}}}", "data.val_keys={hh: {}}", "rm.max_num_steps=1",
                     "policy.train_global_batch_size=4", "policy.train_micro_batch_size=4",
                     "policy.max_total_sequence_length=64", f"checkpointing.checkpoint_dir={tmp_path / 'run'}",
                     "checkpointing.enabled=false", "logger.progress_bar=false", "logger.plots=false",
                     "logger.tensorboard=false", "policy.num_threads=1"]) == 0
    err = capsys.readouterr().err
    assert f"rmkit: train: {train}: 8 pairs (binary format)" in err
    assert f"rmkit: validation-hh: {val}: 4 pairs (binary format)" in err


def _dpo(policy, train, tmp_path, *extra) -> list[str]:
    return ["dpo", f"policy.model_name={policy}", f"data.train_data_path={train}", "data.val_data_paths={}",
            f"checkpointing.checkpoint_dir={tmp_path / 'run'}", "dpo.max_num_steps=1", "dpo.val_at_start=false",
            "dpo.val_at_end=false", "policy.train_global_batch_size=2", "policy.train_micro_batch_size=2",
            "policy.num_threads=1", "checkpointing.enabled=false", "logger.progress_bar=false", "logger.plots=false",
            "logger.tensorboard=false", *extra]


def test_a_policy_without_a_chat_template_is_named_once(tiny_plain_policy, tmp_path, capsys):
    hh = [{"prompt": f"\n\nHuman: Name fruit {i}.\n\nAssistant:", "chosen": " An apple.", "rejected": " No."}
          for i in range(2)]
    assert cli.main(_dpo(tiny_plain_policy, _write(tmp_path / "hh.jsonl", hh), tmp_path,
                         "policy.max_total_sequence_length=64")) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "no chat template" in line]
    assert warnings == [f"rmkit: warning: {tiny_plain_policy} has no chat template: prompts are rendered as "
                        "\"User: ...\\nAssistant:\" (an HH transcript's turns in those roles) and responses follow with "
                        "EOS; to prompt the policy in its own format, give a template with policy.tokenizer.chat_template"]


def test_dpo_says_how_many_prompts_were_cut_to_nothing(tiny_policy, tmp_path, capsys):
    train = write_pairs(tmp_path / "train.jsonl", 4)
    assert cli.main(_dpo(tiny_policy, train, tmp_path, "policy.max_total_sequence_length=8")) == 0
    err = capsys.readouterr().err  # it trained without a word
    assert ("rmkit: warning: train: 4 of 4 prompts were cut to nothing (what is left is what every prompt is rendered "
            "with: policy.max_total_sequence_length=8 leaves the responses all the room); raise "
            "policy.max_total_sequence_length, or set data.overlong=drop") in err
    assert cli.main(_dpo(tiny_policy, train, tmp_path, "policy.max_total_sequence_length=64")) == 0
    assert "cut to nothing" not in capsys.readouterr().err


def test_text_no_tokenizer_can_encode_is_a_record_error_every_path_can_skip(tiny_decoder, tmp_path, capsys,
                                                                           monkeypatch):
    """A lone surrogate escape is valid JSON but not text: `data check` passed it and `train` (even with
    `on_error: skip`) and `eval --skip-bad` died in the tokenizer. Now it is the record's error, and skipping skips it."""
    good = [{"prompt": f"q{i}", "chosen": f"good answer {i}", "rejected": f"bad {i}"} for i in range(8)]
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt": "q", "chosen": "fine \\ud800 text", "rejected": "no"}\n'
                    + "".join(json.dumps(r) + "\n" for r in good))
    message = f"{path}:1: field 'chosen': holds a lone surrogate (\\ud800), which is not text"
    assert cli.main(["data", "check", str(path)]) == 2
    assert message in capsys.readouterr().out
    assert cli.main(["train", f"policy.model_name={tiny_decoder}", f"data.train_data_path={path}",
                     "data.val_data_paths={}", "data.on_error=skip", "rm.max_num_steps=1", "logger.plots=false",
                     "policy.train_global_batch_size=4", "policy.train_micro_batch_size=4",
                     "policy.max_total_sequence_length=32", f"checkpointing.checkpoint_dir={tmp_path / 'run'}"]) == 0
    (reject,) = [json.loads(line) for line in (tmp_path / "run" / "rejects-train.jsonl").read_text().splitlines()]
    assert reject == {"source": f"{path}:1", "reason": message.split(": ", 1)[1] + ": no tokenizer can encode it; "
                                                                                  "fix or drop this record"}
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)  # eval's rejects file goes to the working folder
    assert cli.main(["eval", "--model", str(tmp_path / "run" / "final"), "--data", str(path), "--skip-bad"]) == 0
    assert "rmkit eval: skipped 1 record (see rejects-eval.jsonl)" in capsys.readouterr().err


def test_sft_on_instruction_output_records_says_which_keys_read_them(tiny_policy, tmp_path, capsys):
    """Alpaca-style `instruction`/`output` records: the hint listed only preference formats, in Python's spelling
    (`pass format=`); now it names the two overrides that read the file, and they do."""
    path = _write(tmp_path / "alpaca.jsonl", [{"instruction": "Say hi", "output": "Hi!"},
                                              {"instruction": "Count to three", "output": "1 2 3"}])
    args = ["sft", f"policy.model_name={tiny_policy}", f"data.train_data_path={path}", "data.val_data_paths={}",
            f"checkpointing.checkpoint_dir={tmp_path / 'run'}", "sft.max_num_steps=1", "logger.plots=false",
            "policy.train_global_batch_size=2", "policy.train_micro_batch_size=2"]
    assert cli.main(args) == 2
    assert _error(capsys) == (f"rmkit sft: error: {path}:1: cannot tell the demonstration layout from the fields "
                              "(instruction, output): for prompt/response records name the fields, "
                              "data.prompt_key=instruction data.response_key=output")
    assert cli.main([*args, "data.prompt_key=instruction", "data.response_key=output"]) == 0


def test_an_unknown_preference_layout_names_the_keys_and_the_format_as_the_cli_spells_them(tmp_path, capsys):
    path = _write(tmp_path / "qa.jsonl", [{"question": "q", "good": "a", "bad": "b"}])
    assert cli.main(["data", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cannot tell the data format from the fields (bad, good, question): name your fields (data.prompt_key" in err
    assert "--prompt-key, --chosen-key, --rejected-key" in err and "data.format=, --format" in err
    assert "pass format=" not in err


@pytest.mark.parametrize("name", ["pairs.csv", "pairs.jsonl.gz"])
def test_a_local_file_of_another_kind_says_what_is_read_instead_of_asking_the_hub(name, tmp_path, capsys):
    """A CSV or a gzip file was sent to the Hugging Face Hub as a dataset name ("Couldn't reach ... on the Hub")."""
    import gzip

    path = tmp_path / name
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(b'{"prompt": "q", "chosen": "a", "rejected": "b"}\n'))
        why = "a compressed file: rmkit reads JSON Lines (.jsonl), JSON (.json) and Parquet (.parquet) files"
    else:
        path.write_text("prompt,chosen,rejected\nq,a,b\n")
        why = "rmkit reads JSON Lines (.jsonl), JSON (.json) and Parquet (.parquet) files"
    assert cli.main(["data", "check", str(path)]) == 2
    assert why in _error(capsys)
    assert cli.main(["train", f"data.train_data_path={path}", f"checkpointing.checkpoint_dir={tmp_path / 'run'}"]) == 2
    err = _error(capsys)
    assert err.startswith(f"rmkit train: error: config key 'data.train_data_path': {path}") and why in err


def test_eval_takes_the_embedded_set_by_the_name_train_takes(tiny_decoder, capsys):
    """`rmkit train` reads `default-val`; `rmkit eval --data default-val` called it a missing file."""
    assert cli.main(["eval", "--model", tiny_decoder, "--data", "default-val"]) == 0
    assert "rmkit/resources/default_val.jsonl scored by" in capsys.readouterr().out


def test_score_and_the_use_it_lines_take_the_embedded_set_by_name(tiny_decoder, tmp_path, capsys):
    """The run on the embedded default prints `--data default-val` (the absolute path of the packaged file worked,
    but only on that machine's install, and the docs showed a path that worked only from the repository root)."""
    from rmkit.cli.recipes import _validation_file
    from rmkit.config import load_config

    assert _validation_file(load_config(REPO_ROOT / "configs" / "default.yaml")) == "default-val"
    out = tmp_path / "scored.jsonl"
    assert cli.main(["score", "--model", tiny_decoder, "--input", "default-val", "--output", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 120


def test_a_folder_of_mixed_files_is_refused_not_read_in_part(tiny_decoder, tmp_path, capsys):
    """A folder holding a .jsonl and a .csv was read as a dataset of the .jsonl alone, the .csv left out without a
    word; an empty folder went to `load_dataset`. A folder of JSON Lines files alone is read whole."""
    mixed, only_jsonl, empty = tmp_path / "mixed", tmp_path / "jsonl", tmp_path / "empty"
    for folder in (mixed, only_jsonl, empty):
        folder.mkdir()
    write_pairs(mixed / "a.jsonl", 3)
    (mixed / "b.csv").write_text("prompt,chosen,rejected\nq,a,b\n")
    write_pairs(only_jsonl / "a.jsonl", 3)
    write_pairs(only_jsonl / "b.jsonl", 2, offset=10)
    (only_jsonl / "README.md").write_text("about the data")
    for argv in (["data", "check", str(mixed)], ["eval", "--model", tiny_decoder, "--data", str(mixed)],
                 ["train", f"data.train_data_path={mixed}", f"checkpointing.checkpoint_dir={tmp_path / 'run'}"]):
        assert cli.main(argv) == 2
        assert f"{mixed}: a folder of mixed files (b.csv): a folder is read as one dataset of one kind" in _error(capsys)
    assert cli.main(["data", "check", str(empty)]) == 2
    assert f"{empty}: a folder with no data file in it" in _error(capsys)
    assert cli.main(["data", "check", str(only_jsonl)]) == 0
    assert f"{only_jsonl}: 5 pairs (binary format)" in capsys.readouterr().out
