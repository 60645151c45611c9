"""Wrong paths: a model path that does not exist, a folder that is not a model, a causal LM given as a reward
model, a data file that does not exist. Every command says so in one line naming the path and the option or
key, exit status 2, before any model loads (the policy path given to DPO and GRPO here does not exist either:
the checked path is named first, so nothing was loaded before the check)."""

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
