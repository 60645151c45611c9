"""`ppo.shuffle_minibatches`: each PPO epoch takes the rollout's rows in an order of its own, drawn from (seed,
step, epoch), every tensor of a row moved together; off, the rollout as it is (NeMo RL)."""

import pytest
import torch
from safetensors.torch import load_file

from rmkit import cli
from rmkit.recipes.configs import PPOLoopConfig
from rmkit.recipes.ppo import epoch_rows
from tests.recipes.conftest import ppo_overrides


def _rollout(n: int = 16) -> dict:
    rows = torch.arange(n)
    return {"input_ids": rows[:, None] * 10 + torch.arange(5), "attention_mask": torch.ones(n, 5, dtype=torch.long),
            "advantages": rows[:, None].float().expand(n, 5), "sample_mask": torch.ones(n), "group_index": rows // 2}


def test_off_the_rollout_is_taken_as_it_is():
    batch = _rollout()
    assert epoch_rows(batch, PPOLoopConfig(), step=3, epoch=1) is batch


def test_each_epoch_takes_every_row_once_in_an_order_drawn_from_seed_step_and_epoch():
    loop, batch = PPOLoopConfig(shuffle_minibatches=True, seed=7), _rollout()
    orders = {}
    for step, epoch in [(0, 0), (0, 1), (1, 0)]:
        rows = epoch_rows(batch, loop, step, epoch)
        order = rows["input_ids"][:, 0] // 10
        assert sorted(order.tolist()) == list(range(16))  # a permutation: every row once
        for key in ("advantages", "group_index"):  # each row's tensors move together
            torch.testing.assert_close(rows[key], batch[key][order])
        orders[step, epoch] = order.tolist()
        assert epoch_rows(batch, loop, step, epoch)["input_ids"][:, 0].tolist() == (order * 10).tolist()  # resumable
    assert len({tuple(o) for o in orders.values()}) == 3  # a new order each epoch and each step
    other_seed = epoch_rows(batch, PPOLoopConfig(shuffle_minibatches=True, seed=8), 0, 0)["input_ids"][:, 0] // 10
    assert other_seed.tolist() != orders[0, 0]


@pytest.mark.slow  # ~20 s: two runs
def test_the_run_trains_on_the_shuffled_batches(tiny_policy, tiny_reward_model, prompt_files, tmp_path, monkeypatch):
    """The recipe takes each epoch's rows from `epoch_rows`: shuffled, the same rollouts give other weights."""
    from rmkit.recipes import ppo

    train, val = prompt_files
    calls, real = [], ppo.epoch_rows
    monkeypatch.setattr(ppo, "epoch_rows", lambda *a: calls.append(a[2:]) or real(*a))
    weights = {}
    for shuffle in ("false", "true"):
        out, calls[:] = tmp_path / shuffle, []
        args = ppo_overrides(tiny_policy, tiny_reward_model, train, val, out, steps=1)
        assert cli.main(["ppo", *args, f"ppo.shuffle_minibatches={shuffle}", "ppo.val_at_start=false",
                         "logger.plots=false"]) == 0
        assert calls == [(0, 0), (0, 1)]  # step 0, epochs 0 and 1
        weights[shuffle] = load_file(out / "final" / "model.safetensors")
    assert any(not torch.equal(weights["true"][k], v) for k, v in weights["false"].items())
