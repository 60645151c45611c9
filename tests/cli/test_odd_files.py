"""Odd files a user brings to the training commands: a `{"text"}` file whose lines are not pairs, a validation file
in the standard layout beside a training file with remapped keys. Each is one line naming the file, the line and
the field or key and what to do, exit status 2, no traceback."""

import json

from rmkit import cli


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
