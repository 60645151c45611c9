"""Wrong paths: a model path that does not exist, a folder that is not a model, a causal LM given as a reward
model, a data file that does not exist. Every command says so in one line naming the path and the option or
key, exit status 2, before any model loads (the policy path given to DPO and GRPO here does not exist either:
the checked path is named first, so nothing was loaded before the check)."""

from pathlib import Path

import pytest

from rmkit import cli
from tests.recipes.dpo_helpers import write_pairs as write_dpo_pairs

NO_POLICY = "/nonexistent/policy"


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.fixture
def not_a_model(tmp_path):
    folder = tmp_path / "not_a_model"
    folder.mkdir()
    (folder / "notes.txt").write_text("hello")
    return folder


@pytest.fixture
def pairs(tmp_path):
    return write_dpo_pairs(tmp_path / "pairs.jsonl", 4)


@pytest.mark.parametrize("command", ["score", "parity", "eval", "eval --report"])
def test_score_parity_and_eval_name_a_missing_or_non_model_path(command, tmp_path, not_a_model, pairs, tiny_policy,
                                                                capsys):
    data = {"score": ["--input", str(pairs), "--output", str(tmp_path / "o.jsonl")],
            "eval --report": ["--data", str(pairs), "--report", str(tmp_path / "report")]}.get(command, ["--data", str(pairs)])
    command = command.split()[0]
    cases = {str(tmp_path / "missing"): "no such model directory",
             str(not_a_model): "is not a model directory: it has no config.json",
             str(pairs): "is a file, not a model directory",
             tiny_policy: "is a causal language model (LlamaForCausalLM), not a reward model"}
    for model, message in cases.items():
        assert cli.main([command, "--model", model, *data]) == 2
        err = _error(capsys)
        assert err.startswith(f"rmkit {command}: error: config key '--model': ") and model in err and message in err


def test_eval_report_onto_a_file_names_it(tmp_path, tiny_decoder, pairs, capsys):
    existing = tmp_path / "report.html"
    existing.write_text("an earlier page")
    assert cli.main(["eval", "--model", tiny_decoder, "--data", str(pairs), "--report", str(existing)]) == 2
    err = _error(capsys)  # was a FileExistsError traceback
    assert err.startswith(f"rmkit eval: error: config key '--report': {existing} is a file; --report names a folder")


def test_score_names_a_missing_input_before_the_model_loads(tmp_path, capsys):
    missing = tmp_path / "missing.jsonl"
    assert cli.main(["score", "--model", str(tmp_path / "also_missing"), "--input", str(missing),
                     "--output", str(tmp_path / "o.jsonl")]) == 2
    assert _error(capsys) == f"rmkit score: error: config key '--input': no such file: {missing}"


def _grpo(reward_model: str, tmp_path, pairs) -> list[str]:
    return ["grpo", f"policy.model_name={NO_POLICY}", f"env.reward_model.model_name={reward_model}",
            f"data.train_data_path={pairs}", f"data.val_data_paths={{v: {pairs}}}",
            f"checkpointing.checkpoint_dir={tmp_path / 'run'}", "logger.progress_bar=false"]


def test_grpo_checks_the_reward_model_before_the_policy_loads(tmp_path, not_a_model, pairs, tiny_policy, capsys):
    key = "rmkit grpo: error: config key 'env.reward_model.model_name': "
    assert cli.main(_grpo(str(tmp_path / "missing"), tmp_path, pairs)) == 2
    assert _error(capsys) == key + f"no such model directory: {tmp_path / 'missing'}"
    assert cli.main(_grpo(str(not_a_model), tmp_path, pairs)) == 2
    assert _error(capsys).startswith(key + f"{not_a_model} is not a model directory: it has no config.json")
    assert cli.main(_grpo(tiny_policy, tmp_path, pairs)) == 2  # a policy given as the reward model
    err = _error(capsys)
    assert err.startswith(key + f"{tiny_policy} is a causal language model (LlamaForCausalLM), not a reward model")
    assert "attribute_weights" not in err


@pytest.mark.parametrize("recipe", ["dpo", "grpo", "sft", "train"])
def test_every_recipe_checks_its_data_paths_before_any_model_loads(recipe, tmp_path, pairs, capsys):
    missing = tmp_path / "val.jsonl"
    args = [recipe, f"policy.model_name={NO_POLICY}", f"data.train_data_path={pairs}",
            f"data.val_data_paths={{held_out: {missing}}}", f"checkpointing.checkpoint_dir={tmp_path / 'run'}"]
    if recipe == "grpo":
        args.append(f"env.reward_model.model_name={NO_POLICY}")  # the data paths are named first
    assert cli.main(args) == 2
    assert _error(capsys) == f"rmkit {recipe}: error: config key 'data.val_data_paths.held_out': no such file: {missing}"
    args[2] = f"data.train_data_path={tmp_path / 'nothing_here'}"
    assert cli.main(args) == 2
    assert _error(capsys) == (f"rmkit {recipe}: error: config key 'data.train_data_path': no such file or dataset "
                              f"directory: {tmp_path / 'nothing_here'}")


@pytest.mark.parametrize("recipe", ["train", "sft", "dpo"])
def test_a_training_model_that_does_not_exist_is_one_line_before_anything_loads(recipe, tmp_path, pairs, capsys):
    """A typo'd local model path was a transformers OSError traceback after the data loaded."""
    missing = str(tmp_path / "models" / "x")
    assert cli.main([recipe, f"policy.model_name={missing}", f"data.train_data_path={pairs}",
                     f"checkpointing.checkpoint_dir={tmp_path / 'out'}"]) == 2
    err = _error(capsys)
    assert err.startswith(f"rmkit {recipe}: error: config key 'policy.model_name': no such model directory: {missing}")


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_hub_id_that_cannot_be_loaded_is_one_line(command, tmp_path, pairs):
    """`org/x` looks like a Hub id, so it is tried; when it cannot be had the reason is one line naming the key."""
    import os
    import subprocess
    import sys

    argv = (["train", "policy.model_name=rmkit-test-org/no-such-model", f"data.train_data_path={pairs}",
             f"checkpointing.checkpoint_dir={tmp_path / 'out'}"] if command == "train"
            else ["eval", "--model", "rmkit-test-org/no-such-model", "--data", str(pairs)])
    key = "policy.model_name" if command == "train" else "--model"
    done = subprocess.run([sys.executable, "-m", "rmkit", *argv], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"config key '{key}': cannot load rmkit-test-org/no-such-model: " in done.stderr.strip().splitlines()[-1]


def test_a_length_over_the_models_positions_is_refused_up_front(tiny_encoder, tmp_path, pairs, capsys):
    """MiniLM-like encoders learn 512 positions: 1024 was accepted, then crashed in a tensor-size traceback."""
    assert cli.main(["train", f"policy.model_name={tiny_encoder}", f"data.train_data_path={pairs}",
                     "policy.max_total_sequence_length=1024", f"checkpointing.checkpoint_dir={tmp_path / 'out'}"]) == 2
    err = _error(capsys)
    assert err.startswith("rmkit train: error: config key 'policy.max_total_sequence_length': 1024 tokens is more than ")
    assert "it has 512 learned positions; set policy.max_total_sequence_length to 512 or less" in err
    assert cli.main(["eval", "--model", tiny_encoder, "--data", str(pairs), "--max-length", "1024"]) == 2
    assert "config key '--max-length': 1024 tokens is more than " in _error(capsys)


def test_training_on_pairs_whose_sides_are_identical_says_so(tiny_decoder, tmp_path, capsys):
    """`train` said nothing when chosen == rejected (only `data check` warned): some such pairs are a warning naming
    the first, a file of nothing else is refused."""
    import json

    rows = [{"prompt": f"q{i}", "chosen": f"good {i}", "rejected": f"good {i}" if i < 2 else f"bad {i}"} for i in range(8)]
    some = tmp_path / "some.jsonl"
    some.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = [f"policy.model_name={tiny_decoder}", "rm.max_num_steps=1", "policy.train_global_batch_size=4",
              "policy.train_micro_batch_size=4", "policy.max_total_sequence_length=32", "logger.plots=false",
              "logger.tensorboard=false", "logger.progress_bar=false", "data.val_data_paths={}"]
    assert cli.main(["train", *common, f"data.train_data_path={some}", f"checkpointing.checkpoint_dir={tmp_path / 'a'}"]) == 0
    err = capsys.readouterr().err
    assert (f"rmkit: warning: train: 2 of 8 pairs have identical chosen and rejected responses (first: {some}:1)"
            in err)
    every = tmp_path / "every.jsonl"
    every.write_text("".join(json.dumps({**r, "rejected": r["chosen"]}) + "\n" for r in rows))
    assert cli.main(["train", *common, f"data.train_data_path={every}", f"checkpointing.checkpoint_dir={tmp_path / 'b'}"]) == 2
    assert _error(capsys) == (f"rmkit train: error: {every}: every one of its 8 pairs has identical chosen and rejected "
                              "responses: there is no preference to learn (check data.chosen_key and data.rejected_key)")


@pytest.mark.parametrize("recipe", ["dpo", "sft"])
def test_a_reward_model_given_as_the_policy_is_refused_before_anything_loads(recipe, tiny_decoder, tmp_path, pairs,
                                                                              capsys):
    """It loaded with a random LM head, spent minutes on DPO's reference log-probs, then died in an AttributeError."""
    assert cli.main([recipe, f"policy.model_name={tiny_decoder}", f"data.train_data_path={pairs}",
                     f"checkpointing.checkpoint_dir={tmp_path / 'run'}"]) == 2
    assert _error(capsys) == (f"rmkit {recipe}: error: config key 'policy.model_name': {tiny_decoder} is a sequence "
                              "classifier (LlamaForSequenceClassification: a reward model), not a causal language "
                              "model: as a policy its language-model head would be random. Give a causal LM (e.g. "
                              "smollm2, or the final/ of rmkit sft)")


def test_score_names_an_output_it_cannot_write_before_the_model_loads(tmp_path, pairs, capsys):
    """A `--output` under a file, or one that is a folder: one line naming `--output` before the model (here a
    path that does not exist) is looked at, so no scoring is lost to it."""
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    model = str(tmp_path / "missing_model")
    assert cli.main(["score", "--model", model, "--input", str(pairs), "--output", str(blocker / "o.jsonl")]) == 2
    assert _error(capsys) == (f"rmkit score: error: config key '--output': cannot write {blocker / 'o.jsonl'}: "
                              f"{blocker} is a file, not a folder; give --output a place you can write")
    assert cli.main(["score", "--model", model, "--input", str(pairs), "--output", str(tmp_path)]) == 2
    assert f"config key '--output': {tmp_path} is a folder" in _error(capsys)


def test_score_refuses_to_write_over_its_input_and_eval_a_report_it_cannot_write(tmp_path, pairs, capsys):
    """`score --output` the same file as `--input` replaced the user's data with the scored copy; `eval --report`
    under a file died in mkdir with a traceback after every model had scored. Both are one line, first."""
    model = str(tmp_path / "missing_model")
    assert cli.main(["score", "--model", model, "--input", str(pairs), "--output", str(pairs)]) == 2
    assert _error(capsys) == (f"rmkit score: error: config key '--output': {pairs} is the input file: writing it "
                              "would replace the records being read; give --output another file")
    blocker = tmp_path / "blocker"
    blocker.write_text("a file")
    assert cli.main(["eval", "--model", model, "--data", str(pairs), "--report", str(blocker / "report")]) == 2
    assert (f"config key '--report': cannot write {blocker / 'report'}: {blocker} is a file, not a folder"
            in _error(capsys))


def test_a_missing_relative_data_path_names_the_folder_it_is_read_from(tmp_path, monkeypatch, capsys):
    """The shipped configs name ../shared/data/...: run from another folder, the error said "no such file" and
    nothing about where a relative path is looked for."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--config", str(Path(__file__).resolve().parents[2] / "configs" / "rm.yaml")]) == 2
    assert _error(capsys) == ("rmkit train: error: config key 'data.train_data_path': no such file: "
                              "../shared/data/hh_harmless_train.jsonl (a relative path is read from the folder you "
                              f"run in, {tmp_path})")


def test_an_unreadable_data_file_is_one_line_before_anything_loads(tmp_path, pairs, monkeypatch, capsys):
    """A data file this user may not read died in the reader with a PermissionError traceback. (The tests run as
    root, whom no file mode stops, so the reader's `open` is made to refuse as the OS refuses another user.)"""
    import builtins

    def refusing_open(path, *args, **kwargs):
        if str(path) == str(pairs):
            raise PermissionError(13, "Permission denied", str(path))
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr("rmkit.data.readers.open", refusing_open, raising=False)
    assert cli.main(["eval", "--model", str(tmp_path / "missing_model"), "--data", str(pairs)]) == 2
    assert _error(capsys) == (f"rmkit eval: error: config key '--data': cannot read {pairs} (Permission denied); "
                              "give a file this user can read")
