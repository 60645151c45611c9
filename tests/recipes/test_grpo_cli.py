"""`rmkit grpo` end to end on tiny random models: metrics, generations, curves, checkpoint and an exported policy
that AutoModelForCausalLM loads; bad input exits 2 with one message naming the file:line:field or key; a NaN
reward stops the step before any update; a reward server that is down stops the run with a clear message."""

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from rmkit import cli
from tests.recipes.conftest import grpo_overrides

NEMO_NAMES = ("train/reward", "train/reward_std", "train/fraction_of_groups_with_zero_std", "train/advantages/mean",
              "train/kl_penalty", "train/probs_ratio", "train/clipped_fraction", "train/approx_entropy",
              "train/token_mult_prob_error", "train/mean_gen_tokens_per_sample", "train/truncation_rate",
              "timing/train/generation", "timing/train/reward_calculation",
              "timing/train/policy_and_reference_logprobs", "timing/train/policy_training",
              "timing/train/total_step_time")


def test_cli_end_to_end(tiny_policy, tiny_reward_model, prompt_files, tmp_path, capsys):
    train, val = prompt_files
    out = tmp_path / "run"
    assert cli.main(["grpo", *grpo_overrides(tiny_policy, tiny_reward_model, train, val, out)]) == 0
    records = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if "train/reward" in r]
    assert [r["step"] for r in train_records] == [1, 2]
    assert all(name in train_records[0] for name in NEMO_NAMES)
    assert abs(train_records[0]["train/token_mult_prob_error"] - 1.0) < 1e-3
    val_records = [r for r in records if "validation/reward_mean" in r]
    assert [r["step"] for r in val_records] == [0, 2] and all(r["validation/num_samples"] == 4 for r in val_records)
    samples = [json.loads(line) for line in (out / "logs" / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [0] * 4 + [2] * 4 and {s["set"] for s in samples} == {"val"}
    assert list(samples[0])[:5] == ["step", "set", "source", "prompt", "completion"] and "reward" in samples[0]
    assert (out / "logs" / "grpo_curves.png").is_file() and (out / "step_2" / "manifest.json").is_file()
    policy = AutoModelForCausalLM.from_pretrained(out / "final")
    trained = dict(policy.named_parameters())
    initial = dict(AutoModelForCausalLM.from_pretrained(tiny_policy).named_parameters())
    assert any(not torch.equal(trained[k], initial[k]) for k in initial)  # the policy was updated
    captured = capsys.readouterr()
    assert "Policy saved to" in captured.out
    assert f"rmkit: train: {train}: 16 prompts (prompts format)" in captured.err


@pytest.mark.parametrize("bad, where", [
    ('{"prompt": ""}', ":2: field 'prompt'"),
    ('{"messages": [{"role": "user"}]}', ":2: field 'messages[0].content'"),
])
def test_bad_prompt_record_exits_2_naming_file_line_field(tiny_policy, tiny_reward_model, prompt_files, tmp_path,
                                                          capsys, bad, where):
    train, val = prompt_files
    lines = train.read_text().splitlines()
    train.write_text("\n".join([lines[0], bad, *lines[1:]]) + "\n")
    args = ["grpo", *grpo_overrides(tiny_policy, tiny_reward_model, train, val, tmp_path / "run")]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert f"{train}{where}" in err and "Traceback" not in err
    # on_error=skip: the run goes on and the record is in the rejects file
    assert cli.main([*args, "data.on_error=skip", "grpo.max_num_steps=1", "grpo.val_at_start=false"]) == 0
    rejects = [json.loads(line) for line in (tmp_path / "run" / "rejects-train.jsonl").read_text().splitlines()]
    assert rejects[0]["source"] == f"{train}:2"


def test_bad_config_and_empty_prompts_exit_2(tiny_policy, tiny_reward_model, prompt_files, tmp_path, capsys):
    train, val = prompt_files
    base = grpo_overrides(tiny_policy, tiny_reward_model, train, val, tmp_path / "run")
    assert cli.main(["grpo", *base, "grpo.num_generation_per_prompt=3"]) == 2
    assert "grpo.num_generation_per_prompt" in capsys.readouterr().err
    assert cli.main(["grpo", *base, f"env.reward_model.model_name={tmp_path / 'missing'}"]) == 2
    assert "env.reward_model.model_name" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert cli.main(["grpo", *base, f"data.train_data_path={empty}"]) == 2
    assert f"{empty}: the file is empty" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": ""}\n')
    assert cli.main(["grpo", *base, f"data.train_data_path={bad}", "data.on_error=skip"]) == 2
    assert f"{bad}: no usable prompts (1 skipped, see" in capsys.readouterr().err


def test_nan_reward_stops_before_any_update(tiny_policy, tiny_reward_model, prompt_files, tmp_path, capsys, monkeypatch):
    from rmkit.env import RewardModelEnvironment

    real_score = RewardModelEnvironment.score
    monkeypatch.setattr(RewardModelEnvironment, "score",
                        lambda self, convs: real_score(self, convs).index_fill(0, torch.tensor([1]), math.nan))
    train, val = prompt_files
    args = grpo_overrides(tiny_policy, tiny_reward_model, train, val, tmp_path / "run")
    assert cli.main(["grpo", *args, "grpo.val_at_start=false"]) == 1
    err = capsys.readouterr().err
    assert "returned nan for a completion of the prompt at" in err and "no update was applied" in err
    assert not (tmp_path / "run" / "final").exists()


def test_reward_server_down_stops_with_a_clear_message(tiny_policy, prompt_files, tmp_path, capsys):
    train, val = prompt_files
    args = grpo_overrides(tiny_policy, "x", train, val, tmp_path / "run")
    args = [a for a in args if not a.startswith("env.")] + [
        "env.reward_model.url=http://127.0.0.1:9", "env.reward_model.max_retries=1", "env.reward_model.timeout=2"]
    assert cli.main(["grpo", *args]) == 1
    err = capsys.readouterr().err
    assert "rmkit grpo: stopped: the reward server failed" in err and "--resume" in err


def _diverge_at_step_2(monkeypatch, module, name, diverge):
    """Wrap `<module>.<name>` so that from the second training step on, `diverge` acts first."""
    real, calls = getattr(module, name), []

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) >= 2:
            args = diverge(*args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapped)


@pytest.mark.parametrize("fault", ["nan_weights", "nan_advantages"])
def test_divergence_stops_the_run_naming_the_step(tiny_policy, tiny_reward_model, prompt_files, tmp_path, capsys,
                                                  monkeypatch, fault):
    """NaN logits while sampling (torch.multinomial would crash) or a NaN loss: exit 1 naming step 2, no
    traceback, no final/, and step 1's checkpoint intact."""
    from rmkit.recipes import grpo
    from rmkit.rl import rollout
    from rmkit.trainer.checkpointing.files import verify_checkpoint

    if fault == "nan_weights":  # the policy's weights turn NaN before step 2's rollout: its logits follow
        def poison(model, *rest):
            with torch.no_grad():
                model.get_output_embeddings().weight.fill_(math.nan)
            return (model, *rest)
        _diverge_at_step_2(monkeypatch, rollout, "generate_rollout", poison)
    else:  # step 2's advantages are NaN: so is its loss
        _diverge_at_step_2(monkeypatch, grpo, "compute_advantages",
                           lambda cfg, rewards, *rest: (cfg, rewards * math.nan, *rest))
    train, val = prompt_files
    out = tmp_path / "run"
    args = [*grpo_overrides(tiny_policy, tiny_reward_model, train, val, out, steps=3), "grpo.val_at_start=false",
            "checkpointing.save_period=1"]
    assert cli.main(["grpo", *args]) == 1
    err = capsys.readouterr().err
    expected = "logits became NaN or infinite while it generated at step 2" if fault == "nan_weights" else \
        "the training loss became nan at step 2"
    assert "rmkit grpo: training failed: " in err and expected in err and "Traceback" not in err
    assert not (out / "final").exists() and verify_checkpoint(out / "step_1") is None
    assert not (out / "step_2").exists()


def test_a_process_reward_model_rewards_grpo(tiny_policy, tiny_prm, prompt_files, tmp_path, capsys):
    """`env.reward_model.model_name` may name a process reward model: each rollout's reward is the aggregate of its
    response's steps (rmkit.env), in (0, 1] for the contract's min of step probabilities, and the run trains."""
    train, val = prompt_files
    out = tmp_path / "run"
    assert cli.main(["grpo", *grpo_overrides(tiny_policy, tiny_prm, train, val, out), "grpo.max_num_steps=1"]) == 0
    records = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["train/reward"] for r in records if "train/reward" in r]
    assert rewards and all(0 <= r <= 1 for r in rewards)
    samples = [json.loads(line) for line in (out / "logs" / "samples.jsonl").read_text().splitlines()]
    assert samples and all(0 <= s["reward"] <= 1 for s in samples)
