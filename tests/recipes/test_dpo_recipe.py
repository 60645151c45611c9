"""`rmkit.recipes.dpo.train` on a tiny random policy: the first step's loss is ln 2, NeMo RL's metric names,
sample generations, the reference pass cached across runs, LoRA, and the exported policy."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rmkit.recipes.dpo import train
from tests.recipes.dpo_helpers import dpo_config, read_metrics, write_pairs

NAMES = ("loss", "sft_loss", "preference_loss", "accuracy", "rewards_chosen_mean", "rewards_rejected_mean",
         "rewards_margin_mean")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("dpo_data")
    return write_pairs(root / "train.jsonl", 12), write_pairs(root / "val.jsonl", 4, offset=100)


def test_train_metrics_samples_cache_and_export(tiny_policy, files, tmp_path, capsys):
    out = tmp_path / "run"
    cfg = dpo_config(tiny_policy, *files, out, dpo={"val_at_start": True, "val_period": 2})
    result = train(cfg)
    records = read_metrics(out / "logs" / "metrics.jsonl")
    # The policy starts as the reference: every implicit reward is 0 and the loss is ln 2 (float32 rounding).
    start = next(r for r in records if r["step"] == 0)
    first = next(r for r in records if r["step"] == 1 and "train/loss" in r)
    assert start["validation-default/loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert first["train/loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert first["train/rewards_margin_mean"] == pytest.approx(0.0, abs=1e-5)
    for name in NAMES:
        assert f"train/{name}" in first and f"validation-default/{name}" in start
    last = [r for r in records if "validation-default/loss" in r][-1]
    assert last["step"] == 2 and last["validation-default/rewards_margin_mean"] > 0  # it learned something
    assert result.steps == 3

    samples = read_metrics(out / "logs" / "samples.jsonl")
    assert [s["step"] for s in samples] == [0, 0, 2, 2]  # two prompts per validation
    assert all(s["prompt"].endswith("<|im_start|>assistant\n") and isinstance(s["completion"], str) for s in samples)

    model = AutoModelForCausalLM.from_pretrained(result.final_dir)
    tokenizer = AutoTokenizer.from_pretrained(result.final_dir)
    assert tokenizer.chat_template and model.config.vocab_size == len(tokenizer)
    reference = AutoModelForCausalLM.from_pretrained(tiny_policy)
    assert not torch.equal(model.lm_head.weight, reference.lm_head.weight)

    # A repeated run (the same steps, so the same pairs) reads the cached reference pass; a changed max length
    # computes a new one; a run that stops after one step computes its 4 pairs only.
    cache = sorted((out / "reference_logprobs").iterdir())
    mtimes = [p.stat().st_mtime_ns for p in cache]
    capsys.readouterr()
    train(dpo_config(tiny_policy, *files, out))
    err = capsys.readouterr().err
    assert "reference log-probs of 12 pairs read from" in err and "computed" not in err
    assert [p.stat().st_mtime_ns for p in sorted((out / "reference_logprobs").iterdir())] == mtimes
    train(dpo_config(tiny_policy, *files, out, policy={"max_total_sequence_length": 40}))
    assert "reference log-probs of 12 pairs computed" in capsys.readouterr().err
    assert len(list((out / "reference_logprobs").iterdir())) == 4
    train(dpo_config(tiny_policy, *files, out, dpo={"max_num_steps": 1}))
    assert "reference log-probs of 4 pairs computed" in capsys.readouterr().err


def test_lora_run(tiny_policy, files, tmp_path):
    """LoRA: the reference is the model with its adapters disabled (loss ln 2 at the first step, then the
    adapters move the policy away); the export is a plain merged causal LM."""
    out = tmp_path / "lora"
    cfg = dpo_config(tiny_policy, *files, out, policy={"lora": {"enabled": True, "r": 4}, "optimizer": {"lr": 1e-2}},
                     dpo={"num_sample_generations": 0})
    result = train(cfg)
    train_records = [r for r in read_metrics(out / "logs" / "metrics.jsonl") if "train/loss" in r]
    assert train_records[0]["train/loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert train_records[-1]["train/rewards_margin_mean"] != 0
    model = AutoModelForCausalLM.from_pretrained(result.final_dir)
    assert not any("lora" in name for name in model.state_dict())
    reference = AutoModelForCausalLM.from_pretrained(tiny_policy)
    assert not torch.equal(model.model.layers[0].self_attn.q_proj.weight, reference.model.layers[0].self_attn.q_proj.weight)
