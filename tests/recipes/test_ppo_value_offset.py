"""`value.calibrate_offset`: on the first rollout the critic's values are shifted by one constant so that their mean
over the response tokens equals the mean Monte Carlo return (checked against a per-token loop written here); the
offset lives in the critic's config, `TokenValues` subtracts it, the run says it, logs it, exports it and keeps it
across resume; off, the critic's head is read as it loads."""

import json
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from rmkit import cli
from rmkit.models.critic import TokenValues, load_critic, set_value_offset, value_offset
from rmkit.recipes.configs import ClippedPGLossConfig, PPOLoopConfig
from rmkit.recipes.ppo import calibrate_critic
from tests.recipes.conftest import ppo_overrides


def _monte_carlo_returns(rewards, logprobs, reference, mask, kl_coef):
    """Per token t of each row: the sum over the row's response tokens k >= t of -kl_coef * k1_k, plus the
    sequence reward (placed at the row's last response token)."""
    out = torch.zeros_like(mask, dtype=torch.float64)
    for b in range(mask.shape[0]):
        positions = [t for t in range(mask.shape[1]) if mask[b, t] > 0]
        for t in positions:
            later = [k for k in positions if k >= t]
            out[b, t] = float(rewards[b]) - kl_coef * sum(float(logprobs[b, k] - reference[b, k]) for k in later)
    return out


def test_the_values_move_to_the_mean_monte_carlo_return():
    torch.manual_seed(0)
    token_mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 0]], dtype=torch.float32)
    sample_mask = torch.tensor([1.0, 1.0, 0.0])  # the third completion is left out of the update: not counted
    batch = {"token_mask": token_mask, "value_mask": token_mask, "sample_mask": sample_mask,
             "values": torch.randn(3, 6) + 1.5,
             "prev_logprobs": -torch.rand(3, 6), "reference_policy_logprobs": -torch.rand(3, 6)}
    rewards = torch.tensor([-1.2, 0.4, 3.0])
    kl_coef = 0.1
    cfg = SimpleNamespace(ppo=PPOLoopConfig(), loss_fn=ClippedPGLossConfig(
        reference_policy_kl_penalty=kl_coef, reference_policy_kl_type="k1", use_kl_in_reward=True))
    critic = SimpleNamespace(config=SimpleNamespace(rmkit_value_offset=0.25))  # an offset it already carried
    before = batch["values"].clone()
    calibrate_critic(cfg, critic, batch, rewards, kl_coef)

    mask = (token_mask * sample_mask[:, None]).to(torch.bool)
    returns = _monte_carlo_returns(rewards, batch["prev_logprobs"], batch["reference_policy_logprobs"], mask, kl_coef)
    shift = before[mask].double().mean() - returns[mask].mean()
    assert batch["values"][mask].double().mean().item() == pytest.approx(returns[mask].mean().item(), abs=1e-5)
    torch.testing.assert_close(batch["values"], before - shift.float())  # one constant, every position
    assert value_offset(critic) == pytest.approx(0.25 + shift.item(), abs=1e-6)


def test_token_values_subtract_the_offset_in_the_config(tiny_reward_model):
    critic, _, _ = load_critic(tiny_reward_model)
    values = TokenValues(critic)
    ids = torch.tensor([[5, 9, 17, 3, 8]])
    with torch.no_grad():
        plain = values(ids, torch.ones_like(ids))
        set_value_offset(critic, 0.75)
        shifted = values(ids, torch.ones_like(ids))
    assert value_offset(critic) == 0.75
    torch.testing.assert_close(shifted, plain - 0.75)


def _records(out):
    return [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]


def test_the_run_calibrates_once_logs_and_exports_the_offset(tiny_policy, tiny_reward_model, prompt_files, tmp_path,
                                                            capsys):
    train, val = prompt_files
    out = tmp_path / "on"
    assert cli.main(["ppo", *ppo_overrides(tiny_policy, tiny_reward_model, train, val, out),
                     "ppo.val_at_start=false", "logger.plots=false"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "values shifted by" in line]
    assert len(said) == 1 and said[0].endswith("(value.calibrate_offset)")  # the first rollout only
    offsets = [r["train/critic/value_offset"] for r in _records(out) if "train/reward" in r]
    assert len(offsets) == 2 and offsets[0] == offsets[1] != 0.0
    assert float(said[0].split("values shifted by ")[1].split(":")[0]) == pytest.approx(-offsets[0], abs=1e-4)
    exported = AutoModelForSequenceClassification.from_pretrained(out / "final" / "critic")
    assert exported.config.rmkit_value_offset == pytest.approx(offsets[0])
    assert value_offset(load_critic(out / "final" / "critic")[0]) == pytest.approx(offsets[0])

    off = tmp_path / "off"
    assert cli.main(["ppo", *ppo_overrides(tiny_policy, tiny_reward_model, train, val, off, steps=1),
                     "value.calibrate_offset=false", "ppo.val_at_start=false", "logger.plots=false"]) == 0
    assert "values shifted by" not in capsys.readouterr().err
    assert [r["train/critic/value_offset"] for r in _records(off) if "train/reward" in r] == [0.0]
    assert value_offset(load_critic(off / "final" / "critic")[0]) == 0.0
