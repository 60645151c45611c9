"""The learning-rate schedule: rmkit's warmup, and Hugging Face's (TRL's) when `warmup_start_factor` is 0."""

import math

import pytest
import torch
from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

from rmkit.config import ConfigError, SchedulerConfig
from rmkit.trainer.optim import lr_factor


def test_default_warmup_first_step_learns_and_reaches_the_peak():
    cfg = SchedulerConfig(name="constant", warmup_steps=4)
    assert [lr_factor(s, cfg, 20) for s in range(6)] == [0.2, 0.4, 0.6, 0.8, 1.0, 1.0]


@pytest.mark.parametrize("name", ["cosine", "constant"])
def test_start_factor_zero_is_hugging_faces_schedule(name):
    total, warmup = 37, 5
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    if name == "cosine":
        hf = get_cosine_schedule_with_warmup(optimizer, warmup, total)
    else:
        hf = get_constant_schedule_with_warmup(optimizer, warmup)
    cfg = SchedulerConfig(name=name, warmup_steps=warmup, warmup_start_factor=0.0)
    for step in range(total):
        assert math.isclose(lr_factor(step, cfg, total), hf.lr_lambdas[0](step), abs_tol=1e-12), step


def test_start_factor_is_linear_to_the_peak():
    cfg = SchedulerConfig(name="constant", warmup_steps=4, warmup_start_factor=0.2)
    assert [round(lr_factor(s, cfg, 10), 12) for s in range(5)] == [0.2, 0.4, 0.6, 0.8, 1.0]


def test_start_factor_out_of_range_names_the_key():
    with pytest.raises(ConfigError, match="policy.scheduler.warmup_start_factor"):
        SchedulerConfig(warmup_start_factor=1.5)


def test_parameter_groups_are_named_and_each_model_keeps_its_own_schedule():
    """PPO's policy and critic sit in one AdamW; their groups are found by name, not by position."""
    from rmkit.config import OptimizerConfig
    from rmkit.trainer.optim import joint_optimizer, learning_rate, schedule_by_model

    policy, critic = torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)
    optimizer = joint_optimizer({"policy": (policy, OptimizerConfig(lr=1e-3)), "critic": (critic, OptimizerConfig(lr=4e-3))})
    assert [g["name"] for g in optimizer.param_groups] == ["policy", "policy_no_decay", "critic", "critic_no_decay"]
    assert optimizer.param_groups[1]["params"] == [policy.bias] and optimizer.param_groups[1]["weight_decay"] == 0.0
    scheduler = schedule_by_model(optimizer, {"policy": lambda step: 0.0 if step < 2 else 1.0, "critic": lambda step: 0.5})
    assert (learning_rate(optimizer, "policy"), learning_rate(optimizer, "critic")) == (0.0, 2e-3)
    for _ in range(2):
        optimizer.step()
        scheduler.step()
    assert (learning_rate(optimizer, "policy"), learning_rate(optimizer, "critic")) == (1e-3, 2e-3)
    with pytest.raises(KeyError, match="value"):
        learning_rate(optimizer, "value")
