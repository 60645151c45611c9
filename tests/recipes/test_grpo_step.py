"""One GRPO step on tiny random models: the rollout's tensor layout, advantages per prompt group against a
hand loop, generation vs training log-probs (token_mult_prob_error ~ 1), REINFORCE and PPO-clip modes, and a
reward that prefers one token raises that token's probability."""

import statistics
from types import SimpleNamespace

import pytest
import torch

from rmkit.config import load_config
from rmkit.distributed import DistInfo
from rmkit.generation import SamplingParams, render_prompt
from rmkit.losses.policy_gradient import ClippedPGLossFn
from rmkit.models.policy import load_training_policy
from rmkit.recipes import grpo
from rmkit.recipes.grpo_config import GRPOConfig
from rmkit.recipes.grpo_rollout import PromptItem, compute_advantages, generate_rollout, training_batch
from rmkit.trainer.optim import build_optimizer, build_scheduler


def _cfg(policy, *overrides):
    return load_config(None, [f"policy.model_name={policy}", "grpo.num_prompts_per_step=4",
                              "grpo.num_generations_per_prompt=4", "policy.train_global_batch_size=8",
                              "policy.train_micro_batch_size=4", "policy.generation.max_new_tokens=5",
                              "policy.max_total_sequence_length=128", "policy.max_grad_norm=null", *overrides],
                       tree_type=GRPOConfig)


def _prompts(tokenizer, n=4):
    texts = [f"Tell me about {w}." for w in ("rivers", "the sea", "a cat", "numbers", "trees", "stars")][:n]
    return [PromptItem(f"test:{i}", t, render_prompt(tokenizer, t)) for i, t in enumerate(texts)]


class TokenReward:
    """A deterministic in-process environment: the reward is the count of `token` in the completion."""

    def __init__(self, tokenizer, token: str):
        self.tokenizer, self.token = tokenizer, token

    def step(self, logs, infos):
        counts = [logs_[-1]["content"].count(self.token) for logs_ in logs]
        return SimpleNamespace(rewards=torch.tensor(counts, dtype=torch.float32))


def _grpo_advantages_by_hand(rewards, groups):
    out = []
    for r, g in zip(rewards, groups):
        others = [x for x, h in zip(rewards, groups) if h == g]
        others.remove(r)
        baseline = sum(others) / len(others)
        std = statistics.stdev(others) if len(others) > 1 and len(set(others)) > 1 else 0.0
        out.append((r - baseline) / (std + 1e-6) if std > 0 else r - baseline)
    return out


def test_rollout_layout_and_group_advantages(tiny_policy):
    cfg = _cfg(tiny_policy)
    model, tokenizer = load_training_policy(cfg.policy, torch.device("cpu"))
    prompts = _prompts(tokenizer, 2)
    rollout = generate_rollout(model, tokenizer, prompts, 0, 3, SamplingParams(max_new_tokens=5),
                               4, torch.Generator().manual_seed(0))
    assert rollout.group_index.tolist() == [0, 0, 0, 1, 1, 1]
    batch = training_batch(rollout, tokenizer.pad_token_id)
    for row, (p, c, lp) in enumerate(zip(rollout.prompts, rollout.completion_ids, rollout.logprobs)):
        n = len(p.ids) + len(c)
        assert batch["input_ids"][row, :n].tolist() == p.ids + c
        assert batch["token_mask"][row].tolist() == [0.0] * len(p.ids) + [1.0] * len(c) + [0.0] * (batch["input_ids"].shape[1] - n)
        assert torch.equal(batch["generation_logprobs"][row, len(p.ids):n], lp)
        assert batch["attention_mask"][row].sum() == n
    rewards = torch.tensor([1.0, 2.0, 4.0, 3.0, 3.0, 0.5])
    adv = compute_advantages(cfg, rewards, rollout.group_index, batch)
    torch.testing.assert_close(adv, torch.tensor(_grpo_advantages_by_hand(rewards.tolist(), [0, 0, 0, 1, 1, 1])))
    rloo = compute_advantages(_cfg(tiny_policy, "grpo.normalize_rewards=false"), rewards, rollout.group_index, batch)
    torch.testing.assert_close(rloo, torch.tensor([1 - 3.0, 2 - 2.5, 4 - 1.5, 3 - 1.75, 3 - 1.75, 0.5 - 3.0]))
    rpp = compute_advantages(_cfg(tiny_policy, "grpo.adv_estimator.name=reinforce_plus_plus"), rewards,
                             rollout.group_index, batch)
    assert rpp.shape == batch["input_ids"].shape  # per token, whitened over the generated tokens
    mask = batch["token_mask"] > 0
    assert abs(rpp[mask].mean().item()) < 1e-5


def _run_steps(cfg, env, steps, generator_seed=0):
    model, tokenizer = load_training_policy(cfg.policy, torch.device("cpu"))
    optimizer = build_optimizer(model, cfg.policy.optimizer)
    scheduler = build_scheduler(optimizer, cfg.policy.scheduler, 100)
    reference = grpo.reference_policy(cfg, model, DistInfo(0, 1, 0, torch.device("cpu")))
    loss_fn = ClippedPGLossFn(cfg.loss_fn.as_dict())
    generator = torch.Generator().manual_seed(generator_seed)
    params = SamplingParams(**vars(cfg.policy.generation))
    env = env(tokenizer) if callable(env) else env
    history = [grpo.grpo_step(cfg, model, model, tokenizer, env, reference, loss_fn, optimizer, scheduler,
                              _prompts(tokenizer), params, generator, step) for step in range(steps)]
    return model, tokenizer, history


@pytest.mark.parametrize("mode", [[], ["loss_fn.disable_ppo_ratio=true"], ["policy.lora.enabled=true"]],
                         ids=["ppo_clip", "reinforce", "lora"])
def test_first_step_logprobs_agree_and_modes_run(tiny_policy, mode):
    cfg = _cfg(tiny_policy, "policy.generation.temperature=0.7", *mode)
    _, _, [metrics] = _run_steps(cfg, lambda tok: TokenReward(tok, "a"), 1)
    # generation (KV cache, left padding, temperature) vs training forward of the same weights: 1e-3 tolerance
    assert abs(metrics["train/token_mult_prob_error"] - 1.0) < 1e-3
    assert metrics["train/mean_gen_tokens_per_sample"] > 0 and 0 <= metrics["train/truncation_rate"] <= 1
    assert all(k in metrics for k in ("train/reward", "train/kl_penalty", "train/probs_ratio", "train/approx_entropy",
                                      "train/clipped_fraction", "train/fraction_of_groups_with_zero_std",
                                      "timing/train/generation", "timing/train/reward_calculation",
                                      "timing/train/policy_and_reference_logprobs", "timing/train/policy_training"))
    if mode == ["loss_fn.disable_ppo_ratio=true"]:
        assert metrics["train/clipped_fraction"] == 0.0


def test_reward_for_one_token_raises_its_probability(tiny_policy):
    """Reward = how often one token's text appears in the completion (the 5th most likely first token of the
    initial policy, sampled within top-k 8): after a few steps its probability at the first generated
    position is clearly higher than under the initial weights."""
    cfg = _cfg(tiny_policy, "policy.optimizer.lr=2e-3", "loss_fn.reference_policy_kl_penalty=0",
               "policy.generation.max_new_tokens=3", "policy.generation.top_k=8", "policy.scheduler.name=constant")
    model0, tokenizer = load_training_policy(cfg.policy, torch.device("cpu"))
    ids = torch.tensor([_prompts(tokenizer)[0].ids])

    def probs(model):
        with torch.no_grad():
            return torch.softmax(model(input_ids=ids).logits[0, -1], -1)

    target = int(probs(model0).topk(5).indices[-1])
    text = tokenizer.decode([target])
    before = probs(model0)[target].item()
    model, _, history = _run_steps(cfg, lambda tok: TokenReward(tok, text), 12)
    after = probs(model)[target].item()
    rewards = [h["train/reward"] for h in history]
    # seen: 3.1e-5 -> 1.1e-4 (3.6x) and rewards 0.06 -> ~0.8; thresholds leave room for other BLAS / torch builds
    assert after > 2.5 * before, (text, before, after, rewards)
    assert sum(rewards[-4:]) / 4 > 3 * sum(rewards[:2]) / 2, rewards
