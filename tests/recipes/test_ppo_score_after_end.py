"""`ppo.score_after_end` (TRL's PPOTrainer's score position): a completion that finished before `max_new_tokens`
gets one more state, after its last token, that the critic values (its head at the last token) and learns, where
the reward goes; off, nothing in the batch changes. `with_value_mask` on made-up rollouts, then a run on tiny
random models whose completions stop at a stop string (a random policy rarely samples EOS)."""

from types import SimpleNamespace

import pytest
import torch

from rmkit import cli
from rmkit.config import SamplingParams
from rmkit.models.critic import TokenValues, load_critic
from rmkit.recipes.configs import PPOLoopConfig
from rmkit.recipes.ppo import with_value_mask
from rmkit.rl.rollout import Rollout, training_batch
from tests.recipes.conftest import ppo_overrides

PAD = 2


def _rollout(completions: list[list[int]], truncated: list[bool]) -> Rollout:
    prompts = [SimpleNamespace(ids=[5, 6, 7][:1 + i % 3]) for i in range(len(completions))]
    return Rollout(prompts, torch.arange(len(completions)), completions, [""] * len(completions),
                   [torch.full((len(c),), -1.0) for c in completions], torch.tensor(truncated))


def _cfg(on: bool, limit: int = 4) -> SimpleNamespace:  # what `with_value_mask` reads of a PPOConfig
    return SimpleNamespace(ppo=PPOLoopConfig(score_after_end=on),
                           policy=SimpleNamespace(generation=SamplingParams(max_new_tokens=limit)))


def test_a_finished_completion_gets_the_state_after_its_last_token():
    # finished with room (row 0), ran out of tokens (row 1), finished on the last allowed token (row 2)
    rollout = _rollout([[11, PAD], [12, 13, 14, 15], [16, 17, 18, PAD]], [False, True, False])
    plain = training_batch(rollout, PAD)
    batch = with_value_mask(training_batch(rollout, PAD), rollout, _cfg(True), PAD)
    new, width = batch["value_mask"] > batch["token_mask"], plain["input_ids"].shape[1]
    for key, value in plain.items():  # only the new state's position changes
        got = batch[key]
        assert torch.equal(got[:, :width][~new[:, :width]], value[~new[:, :width]]) if value.dim() == 2 else \
            torch.equal(got, value), key
    end = len(rollout.prompts[0].ids) + 2
    assert batch["value_mask"][0].tolist() == plain["token_mask"][0].tolist()[:end] + [1.0] + [0.0] * (
        batch["input_ids"].shape[1] - end - 1)
    assert batch["input_ids"][0, end] == PAD and batch["attention_mask"][0, end] == 1 and batch["token_mask"][0, end] == 0
    for row in (1, 2):  # no state after the end: the reward stays on the last token
        assert torch.equal(batch["value_mask"][row], batch["token_mask"][row])
        assert torch.equal(batch["attention_mask"][row], torch.cat([plain["attention_mask"][row],
                                                                     torch.zeros(batch["input_ids"].shape[1] - plain[
                                                                         "input_ids"].shape[1], dtype=torch.long)]))


def test_a_longest_finished_row_widens_the_batch_by_one_column():
    rollout = _rollout([[11, 12, PAD], [13]], [False, True])
    plain = training_batch(rollout, PAD)
    batch = with_value_mask(training_batch(rollout, PAD), rollout, _cfg(True), PAD)
    assert batch["input_ids"].shape[1] == plain["input_ids"].shape[1] + 1
    assert batch["value_mask"][0, -1] == 1 and batch["attention_mask"][0, -1] == 1
    assert batch["input_ids"][1, -1] == PAD and batch["attention_mask"][1, -1] == 0  # padding, as before


def test_off_the_batch_is_unchanged_and_the_critic_values_the_tokens():
    rollout = _rollout([[11, PAD], [12, 13, 14, 15]], [False, True])
    plain = training_batch(rollout, PAD)
    batch = with_value_mask(training_batch(rollout, PAD), rollout, _cfg(False), PAD)
    assert torch.equal(batch.pop("value_mask"), plain["token_mask"])
    assert all(torch.equal(batch[k], v) for k, v in plain.items())


@pytest.mark.slow  # ~15 s: one run, then the critic on every row
def test_the_run_values_the_state_after_the_end_and_returns_the_reward_there(tiny_policy, tiny_reward_model,
                                                                              prompt_files, tmp_path, monkeypatch):
    """In a run: the value at the state after a finished completion is the critic's head at its last token (a plain
    forward), and the return there is the reward (no KL there, nothing after it); the advantages stay on the tokens."""
    from rmkit.recipes import ppo

    seen, real = [], ppo.update_actor_critic
    monkeypatch.setattr(ppo, "update_actor_critic", lambda *a, **k: seen.append(a[4]) or real(*a, **k))
    train, val = prompt_files
    args = ppo_overrides(tiny_policy, tiny_reward_model, train, val, tmp_path / "run", steps=1)
    # a stop string one token in seven contains: completions of every length, some cut at the limit
    assert cli.main(["ppo", *args, "ppo.score_after_end=true", "policy.generation.stop_strings=[m]",
                     "value.calibrate_offset=false", "ppo.val_at_start=false", "ppo.val_at_end=false",
                     "logger.plots=false", "checkpointing.enabled=false"]) == 0
    batch = seen[0]
    after = (batch["value_mask"] > 0) & (batch["token_mask"] == 0)
    rows = after.any(1).nonzero().flatten().tolist()
    assert rows and len(rows) < len(batch["input_ids"])  # some finished with room, some did not
    critic = TokenValues(load_critic(tiny_reward_model)[0].eval())
    for row in rows:
        pos = int(after[row].nonzero())
        assert batch["token_mask"][row, pos - 1] == 1  # right after the completion's last token
        with torch.no_grad():
            head = critic(batch["input_ids"][row:row + 1, :pos], torch.ones(1, pos, dtype=torch.long))
        assert batch["values"][row, pos].item() == pytest.approx(head[0, -1].item(), abs=1e-5)
        assert batch["returns"][row, pos].item() == pytest.approx(batch["rewards"][row].item(), abs=1e-6)
        assert batch["advantages"][row, pos] == 0
