"""`rmkit merge`: real fine-tunes of one tiny base averaged weight by weight, scored through the inference core,
and every mismatch refused with one line."""

import json
import shutil

import pytest
import torch
import yaml
from safetensors.torch import load_file

from rmkit import cli
from rmkit.inference import load_scorer
from rmkit.models import load_reward_model
from tests.support.tiny import make_tiny_decoder, write_pairs


def train(root, base, seed: int, max_length: int = 32):
    """`rmkit train` of the tiny decoder for 6 steps; returns its final/ folder."""
    out = root / f"run-{base.name}-{seed}-{max_length}"
    config = {
        "rm": {"max_num_epochs": 1, "seed": seed, "val_period": 0, "val_at_start": False},
        "policy": {"model_name": str(base), "train_global_batch_size": 8, "train_micro_batch_size": 8,
                   "max_total_sequence_length": max_length, "num_threads": 1, "optimizer": {"lr": 3e-4}},
        "data": {"train_data_path": str(root / "train.jsonl"), "val_data_paths": {"default": str(root / "val.jsonl")}},
        "checkpointing": {"checkpoint_dir": str(out), "save_period": 0},
        "logger": {"tensorboard": False, "progress_bar": False, "plots": False},
    }
    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(config))
    threads = torch.get_num_threads()
    try:
        assert cli.main(["train", "--config", str(path)]) == 0
    finally:
        torch.set_num_threads(threads)
    return out / "final"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("merge")
    base = make_tiny_decoder(root / "base", seed=0)
    write_pairs(root / "train.jsonl", 48, seed=1)
    write_pairs(root / "val.jsonl", 16, seed=2)
    return root, base, [train(root, base, seed) for seed in (1, 2, 3)]


def merge(capsys, *args) -> tuple[int, str, str]:
    code = cli.main(["merge", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_merge_is_the_mean_of_the_weights_and_scores_through_its_contract(runs, tmp_path, capsys):
    root, _, finals = runs
    code, out, err = merge(capsys, *finals, "--output", tmp_path / "merged")
    assert code == 0, err
    assert "averaged 3 models" in out
    weights = [load_file(f / "model.safetensors") for f in finals]
    merged = load_file(tmp_path / "merged" / "model.safetensors")
    assert set(merged) == set(weights[0])
    for key, value in merged.items():
        expected = (weights[0][key].double() + weights[1][key].double() + weights[2][key].double()) / 3
        torch.testing.assert_close(value.double(), expected, rtol=0, atol=1e-7)
    assert any(not torch.equal(weights[0][k], weights[1][k]) for k in merged)  # the seeds really differ
    contract = json.loads((tmp_path / "merged" / "scoring_contract.json").read_text())
    first = json.loads((finals[0] / "scoring_contract.json").read_text())
    assert first["reward_mean"] is not None and contract["reward_mean"] is None and contract["reward_std"] is None
    assert {k: v for k, v in contract.items() if not k.startswith("reward_")} == \
           {k: v for k, v in first.items() if not k.startswith("reward_")}
    record = json.loads((tmp_path / "merged" / "merge.json").read_text())
    assert record["models"] == [str(f) for f in finals] and record["backbone_distance_from_first"][0] == 0.0
    assert all(0 < d < 0.5 for d in record["backbone_distance_from_first"][1:])
    # The merged folder scores through the inference core (its contract checked against model and tokenizer),
    # and the model it scores with is the average.
    scorer = load_scorer(tmp_path / "merged")
    rewards = scorer.score(["User: tell me about apples\nAssistant: the answer about apples is correct"])
    model, _ = load_reward_model(tmp_path / "merged")
    assert rewards.shape == (1, 1) and torch.isfinite(rewards).all()
    assert torch.equal(model.score.weight, merged["score.weight"])


def test_a_model_merged_with_itself_scores_as_it_did(runs, tmp_path, capsys):
    _, _, finals = runs
    code, _, err = merge(capsys, finals[0], finals[0], "--output", tmp_path / "same")
    assert code == 0, err
    texts = ["User: tell me about rivers\nAssistant: the answer about rivers is wrong", "User: hi\nAssistant: maps"]
    torch.testing.assert_close(load_scorer(tmp_path / "same").score(texts), load_scorer(finals[0]).score(texts),
                               rtol=0, atol=1e-6)


def test_mismatches_are_refused_with_one_line(runs, tmp_path, capsys):
    root, base, finals = runs
    cases = []
    # one model
    cases.append(((finals[0], "--output", tmp_path / "a"), "averages two or more reward models, got 1"))
    # a missing folder
    cases.append(((finals[0], tmp_path / "nowhere", "--output", tmp_path / "b"), "no such model directory"))
    # another architecture: the same tokenizer, a wider model
    wide = tmp_path / "wide"
    shutil.copytree(finals[1], wide)
    config = json.loads((wide / "config.json").read_text())
    config["intermediate_size"] = 96
    (wide / "config.json").write_text(json.dumps(config))
    cases.append(((finals[0], wide, "--output", tmp_path / "c"),
                  "are different architectures: config.json's 'intermediate_size' is 96 against 64"))
    # another base: a fresh random decoder of the same shape, fine-tuned the same way
    other_base = make_tiny_decoder(root / "other_base", seed=7)
    foreign = train(root, other_base, seed=1)
    cases.append(((finals[0], foreign, "--output", tmp_path / "d"), "do not share a base"))
    # another scoring contract: the same base trained at another max length
    longer = train(root, base, seed=4, max_length=48)
    cases.append(((finals[0], longer, "--output", tmp_path / "e"),
                  "score differently: scoring_contract.json's 'max_length' is 48 against 32"))
    # another tokenizer: a chat template added
    templated = tmp_path / "templated"
    shutil.copytree(finals[1], templated)
    tokenizer_config = json.loads((templated / "tokenizer_config.json").read_text())
    tokenizer_config["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (templated / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    cases.append(((finals[0], templated, "--output", tmp_path / "f"), "have different tokenizers (the chat template"))
    # an output folder that holds something
    cases.append(((finals[0], finals[1], "--output", finals[2]), "already exists and is not an empty folder"))
    capsys.readouterr()  # the training runs' output
    for args, message in cases:
        code, out, err = merge(capsys, *args)
        assert code == 2 and message in err, (args, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not any((tmp_path / name).exists() for name in "abcdef")
