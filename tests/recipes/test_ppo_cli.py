"""`rmkit ppo` end to end on tiny random models: NeMo RL's metrics with the critic's, generations, curves, a
checkpoint, the policy and the critic exported as models transformers loads; how the critic is chosen and
said; critic warmup leaves the policy untouched; bad input exits 2 naming the key, before the policy loads."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from rmkit import cli
from tests.recipes.conftest import ppo_overrides

CRITIC_NAMES = ("train/critic/loss", "train/critic/grad_norm", "train/critic/values_mean", "train/critic/values_min",
                "train/critic/values_max", "train/critic/returns_mean", "train/critic/explained_var",
                "train/critic/vf_clipfrac", "train/critic/lr")
POLICY_NAMES = ("train/reward", "train/advantages/mean", "train/kl_penalty", "train/probs_ratio",
                "train/clipped_fraction", "train/token_mult_prob_error", "train/mean_gen_tokens_per_sample",
                "train/max_seq_mult_prob_error", "train/mean_seq_mult_prob_error", "train/min_seq_mult_prob_error",
                "train/num_masked_seqs_by_logprob_error", "train/kl_coefficient", "timing/train/value_inference")


def _records(out):
    return [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]


def test_cli_end_to_end(tiny_policy, tiny_reward_model, prompt_files, tmp_path, capsys):
    train, val = prompt_files
    out = tmp_path / "run"
    assert cli.main(["ppo", *ppo_overrides(tiny_policy, tiny_reward_model, train, val, out)]) == 0
    err = capsys.readouterr().err
    assert f"rmkit: critic: {tiny_reward_model} (LlamaForSequenceClassification, its own head): the reward model" in err
    train_records = [r for r in _records(out) if "train/reward" in r]
    assert [r["step"] for r in train_records] == [1, 2]
    assert all(name in train_records[0] for name in CRITIC_NAMES + POLICY_NAMES)
    # generated and trained on by the same weights: the sampler and the trainer agree
    assert train_records[0]["train/mean_seq_mult_prob_error"] == pytest.approx(1.0, abs=1e-3)
    assert abs(train_records[0]["train/advantages/mean"]) < 1e-5  # whitened over the rollout's tokens
    assert [r["step"] for r in _records(out) if "validation/reward_mean" in r] == [0, 2]
    assert (out / "logs" / "ppo_curves.png").is_file() and (out / "step_2" / "manifest.json").is_file()

    policy = AutoModelForCausalLM.from_pretrained(out / "final")
    initial = dict(AutoModelForCausalLM.from_pretrained(tiny_policy).named_parameters())
    assert any(not torch.equal(p, initial[k]) for k, p in policy.named_parameters())
    critic = AutoModelForSequenceClassification.from_pretrained(out / "final" / "critic")
    assert critic.config.num_labels == 1
    rm = dict(AutoModelForSequenceClassification.from_pretrained(tiny_reward_model).named_parameters())
    assert any(not torch.equal(p, rm[k]) for k, p in critic.named_parameters())  # the critic trained too
    assert not torch.equal(critic.score.weight, rm["score.weight"])


def test_critic_from_the_policy_when_the_reward_model_cannot_be_one(tiny_policy, tiny_encoder, prompt_files, tmp_path,
                                                                      capsys):
    """An encoder reward model (another tokenizer too) cannot start the critic: the policy's weights with a fresh
    head do, and the run says why."""
    train, val = prompt_files
    out = tmp_path / "run"
    args = ppo_overrides(tiny_policy, tiny_encoder, train, val, out, steps=1)
    assert cli.main(["ppo", *args, "ppo.val_at_start=false"]) == 0
    err = capsys.readouterr().err
    assert f"rmkit: critic: {tiny_policy} (LlamaForSequenceClassification, a fresh scalar head): the policy's weights" in err
    critic = load_file(out / "final" / "critic" / "model.safetensors")
    policy = load_file(out / "final" / "model.safetensors")
    assert critic["model.layers.0.self_attn.q_proj.weight"].shape == policy["model.layers.0.self_attn.q_proj.weight"].shape


def test_critic_warmup_trains_the_critic_alone(tiny_policy, tiny_reward_model, prompt_files, tmp_path, capsys):
    train, val = prompt_files
    out = tmp_path / "run"
    args = ppo_overrides(tiny_policy, tiny_reward_model, train, val, out, steps=1)
    assert cli.main(["ppo", *args, "ppo.policy_training_start_step=1", "ppo.val_at_start=false"]) == 0
    trained, initial = load_file(out / "final" / "model.safetensors"), load_file(f"{tiny_policy}/model.safetensors")
    assert all(torch.equal(trained[k], initial[k]) for k in initial)
    record = next(r for r in _records(out) if "train/critic/loss" in r)
    assert record["train/critic/grad_norm"] > 0 and record["train/lr"] == 0.0


def test_bad_critic_and_config_exit_2_naming_the_key(tiny_policy, tiny_reward_model, tiny_encoder, prompt_files,
                                                     tmp_path, capsys):
    train, val = prompt_files
    base = ppo_overrides(tiny_policy, tiny_reward_model, train, val, tmp_path / "run")
    assert cli.main(["ppo", *base, f"value.model_name={tmp_path / 'missing'}"]) == 2
    assert f"'value.model_name': no such model directory: {tmp_path / 'missing'}" in capsys.readouterr().err
    assert cli.main(["ppo", *base, f"value.model_name={tiny_encoder}"]) == 2
    err = capsys.readouterr().err
    assert "value.model_name" in err and "encoder" in err and "Traceback" not in err
    assert cli.main(["ppo", *base, "value.train_global_batch_size=2"]) == 2
    assert "value.train_global_batch_size" in capsys.readouterr().err
    assert cli.main(["ppo", *base, "ppo.adv_estimator.gae_lambda=2"]) == 2
    assert "'ppo.adv_estimator.gae_lambda': must be in [0, 1]" in capsys.readouterr().err
    assert cli.main(["ppo", *base, "ppo.reward_shaping.enabled=true"]) == 2
    assert "ppo.reward_shaping.enabled" in capsys.readouterr().err
    assert cli.main(["ppo", *base, "value_loss_fn.clip=0.2"]) == 2
    assert "value_loss_fn.clip" in capsys.readouterr().err
    assert cli.main(["ppo", *base, f"env.reward_model.model_name={tiny_policy}"]) == 2  # a causal LM is no reward model
    assert "env.reward_model.model_name" in capsys.readouterr().err


@pytest.mark.slow  # ~20 s: two runs
@pytest.mark.parametrize("score_after_end", ["false", "true"])
def test_micro_batches_do_not_change_the_run(tiny_policy, tiny_reward_model, prompt_files, tmp_path, score_after_end):
    """Gradient accumulation is exact: micro-batches of 1 and of the whole mini-batch give the same weights (within
    float32 rounding of sums taken in another order), the critic's states after the end included. A stop string
    one random token in seven contains ends completions at every length."""
    train, val = prompt_files
    runs = {}
    for micro in (1, 4):
        out = tmp_path / f"micro{micro}"
        args = ppo_overrides(tiny_policy, tiny_reward_model, train, val, out, steps=2)
        assert cli.main(["ppo", *args, f"policy.train_micro_batch_size={micro}", f"value.train_micro_batch_size={micro}",
                         f"ppo.score_after_end={score_after_end}", "policy.generation.stop_strings=[m]",
                         "ppo.val_at_start=false", "logger.plots=false"]) == 0
        runs[micro] = {part: load_file(out / "final" / part) for part in ("model.safetensors", "critic/model.safetensors")}
    for part, weights in runs[1].items():
        for key, value in weights.items():
            torch.testing.assert_close(runs[4][part][key], value, rtol=0, atol=2e-5)


def test_nan_reward_stops_before_any_update(tiny_policy, tiny_reward_model, prompt_files, tmp_path, capsys, monkeypatch):
    import math

    from rmkit.env import RewardModelEnvironment

    real_score = RewardModelEnvironment.score
    monkeypatch.setattr(RewardModelEnvironment, "score",
                        lambda self, convs: real_score(self, convs).index_fill(0, torch.tensor([1]), math.nan))
    train, val = prompt_files
    args = ppo_overrides(tiny_policy, tiny_reward_model, train, val, tmp_path / "run")
    assert cli.main(["ppo", *args, "ppo.val_at_start=false"]) == 1
    err = capsys.readouterr().err
    assert "rmkit ppo: stopped: the reward model returned nan for a completion of the prompt at" in err
    assert "no update was applied" in err and not (tmp_path / "run" / "final").exists()


def test_reward_server_down_stops_with_a_clear_message(tiny_policy, prompt_files, tmp_path, capsys):
    """With a server for rewards, the critic starts from the policy (no reward-model weights to read)."""
    train, val = prompt_files
    args = [a for a in ppo_overrides(tiny_policy, "x", train, val, tmp_path / "run") if not a.startswith("env.")]
    args += ["env.reward_model.url=http://127.0.0.1:9", "env.reward_model.max_retries=1", "env.reward_model.timeout=2"]
    assert cli.main(["ppo", *args]) == 1
    err = capsys.readouterr().err
    assert "the policy's weights with a fresh value head (the reward model is a server)" in err
    assert "http://127.0.0.1:9" in err and "rmkit ppo: stopped:" in err


@pytest.mark.slow  # ~20 s: two runs
def test_prev_logprobs_from_the_sampler_skip_their_pass_and_change_nothing_else(tiny_policy, tiny_reward_model,
                                                                                 prompt_files, tmp_path, logprob_passes):
    """`ppo.prev_logprobs_from_generation`: one log-prob pass a step (the reference's) instead of two, and in
    float32 the same run as with the pass, the KL in the reward included."""
    train, val = prompt_files
    passes = logprob_passes
    runs = {}
    for from_generation in (False, True):
        out, passes[:] = tmp_path / f"gen{from_generation}", []
        args = ppo_overrides(tiny_policy, tiny_reward_model, train, val, out, steps=2)
        assert cli.main(["ppo", *args, f"ppo.prev_logprobs_from_generation={str(from_generation).lower()}",
                         "loss_fn.use_kl_in_reward=true", "ppo.val_at_start=false", "logger.plots=false"]) == 0
        assert len(passes) == (2 if from_generation else 4)  # 2 steps x (reference [+ prev])
        runs[from_generation] = load_file(out / "final" / "model.safetensors")
        record = next(r for r in _records(out) if "train/reward" in r)
        if from_generation:
            assert record["train/mean_seq_mult_prob_error"] == 1.0
    for key, value in runs[False].items():
        torch.testing.assert_close(runs[True][key], value, rtol=0, atol=2e-5)


def test_prev_logprobs_from_the_sampler_leave_no_error_to_threshold(tiny_policy, tiny_reward_model, prompt_files,
                                                                    tmp_path, capsys):
    train, val = prompt_files
    base = ppo_overrides(tiny_policy, tiny_reward_model, train, val, tmp_path / "run")
    assert cli.main(["ppo", *base, "ppo.prev_logprobs_from_generation=true",
                     "ppo.seq_logprob_error_threshold=2"]) == 2
    err = capsys.readouterr().err
    assert "ppo.seq_logprob_error_threshold" in err and "prev_logprobs_from_generation" in err
