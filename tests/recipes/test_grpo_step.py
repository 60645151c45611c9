"""One GRPO step on tiny random models: the rollout's tensor layout, advantages per prompt group against a
hand loop, generation vs training log-probs (token_mult_prob_error ~ 1), REINFORCE and PPO-clip modes, and a
reward that prefers one token raises that token's probability."""

import statistics
from types import SimpleNamespace

import pytest
import torch

from rmkit.config import SamplingParams, load_config
from rmkit.data.tokenize import render_prompt
from rmkit.distributed import DistInfo
from rmkit.losses.policy_gradient import ClippedPGLossFn
from rmkit.models.policy import load_training_policy
from rmkit.recipes import grpo
from rmkit.recipes.configs import GRPOConfig
from rmkit.recipes.grpo import compute_advantages
from rmkit.rl.logprobs import reference_policy
from rmkit.rl.rollout import generate_rollout, training_batch
from rmkit.trainer.datasets import PromptItem
from rmkit.trainer.optim import build_optimizer, build_scheduler
from rmkit.trainer.state import TrainState


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
    adv = compute_advantages(cfg, rewards, rollout.group_index, batch, 0.01)
    torch.testing.assert_close(adv, torch.tensor(_grpo_advantages_by_hand(rewards.tolist(), [0, 0, 0, 1, 1, 1])))
    rloo = compute_advantages(_cfg(tiny_policy, "grpo.normalize_rewards=false"), rewards, rollout.group_index, batch,
                              0.01)
    torch.testing.assert_close(rloo, torch.tensor([1 - 3.0, 2 - 2.5, 4 - 1.5, 3 - 1.75, 3 - 1.75, 0.5 - 3.0]))
    rpp = compute_advantages(_cfg(tiny_policy, "grpo.adv_estimator.name=reinforce_plus_plus"), rewards,
                             rollout.group_index, batch, 0.01)
    assert rpp.shape == batch["input_ids"].shape  # per token, whitened over the generated tokens
    mask = batch["token_mask"] > 0
    assert abs(rpp[mask].mean().item()) < 1e-5


def test_completions_of_a_prompt_share_its_forward_and_match_the_plain_one(tiny_policy):
    """policy_logits runs each prompt once for its completions, groups packed to rows, the output layer at the
    completions' positions only: on a real rollout (3 prompts x 3, different prompt and completion lengths)
    the logits at every position of the continuation view and every parameter's gradient equal a plain padded
    forward's at the same tokens, and batch_logprobs puts the completion tokens' log-probs back in place."""
    from rmkit.rl.logprobs import (
        batch_logprobs,
        continuation_start,
        policy_logits,
        prompt_groups,
        row_logprobs,
    )

    cfg = _cfg(tiny_policy)
    model, tokenizer = load_training_policy(cfg.policy, torch.device("cpu"))
    rollout = generate_rollout(model, tokenizer, _prompts(tokenizer, 3), 0, 3, SamplingParams(max_new_tokens=6),
                               9, torch.Generator().manual_seed(1))
    batch = training_batch(rollout, tokenizer.pad_token_id)
    groups = prompt_groups(batch)
    assert [len(conts) for _, conts in groups] == [3, 3, 3]
    assert [prompt for prompt, _ in groups] == [p.ids for p in _prompts(tokenizer, 3)]
    shared, view = policy_logits(model, batch, 0.7, "float32")
    real = view["attention_mask"].bool()
    width = batch["input_ids"].shape[1]
    index = (continuation_start(batch)[:, None] + torch.arange(view["input_ids"].shape[1])).clamp(max=width - 1)
    rows = torch.arange(len(index))[:, None]
    assert torch.equal(view["input_ids"][real], batch["input_ids"][rows, index][real])
    assert torch.equal(view["token_mask"].sum(1), batch["token_mask"].sum(1))
    (shared[real].square().mean()).backward()
    shared_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    plain_full = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits / 0.7
    plain = plain_full[rows, index]
    (plain[real].square().mean()).backward()
    torch.testing.assert_close(shared[real], plain[real], rtol=1e-5, atol=1e-5)
    for got, want in zip(shared_grads, (p.grad for p in model.parameters())):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    logprobs = batch_logprobs(model, batch, 4, 0.7, "float32")
    completion = batch["token_mask"].bool()
    torch.testing.assert_close(logprobs[completion], row_logprobs(plain_full, batch["input_ids"])[completion],
                               rtol=1e-5, atol=1e-5)
    assert not logprobs[~completion].any()


def _run_steps(cfg, env, steps, generator_seed=0):
    model, tokenizer = load_training_policy(cfg.policy, torch.device("cpu"))
    optimizer = build_optimizer(model, cfg.policy.optimizer)
    scheduler = build_scheduler(optimizer, cfg.policy.scheduler, 100)
    reference = reference_policy(model, cfg.policy, DistInfo(0, 1, 0, torch.device("cpu")),
                                 needed=cfg.loss_fn.reference_policy_kl_penalty > 0)
    loss_fn = ClippedPGLossFn(cfg.loss_fn)
    generator = torch.Generator().manual_seed(generator_seed)
    params = cfg.policy.generation
    env = env(tokenizer) if callable(env) else env
    state = TrainState(model, optimizer, scheduler, sampler=None)
    history = []
    for _ in range(steps):
        history.append(grpo.grpo_step(cfg, state, model, tokenizer, env, reference, loss_fn, _prompts(tokenizer), params,
                                      generator))
        state.step += 1
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


def test_prev_logprobs_pass_only_when_the_policy_moves_before_its_update(tiny_policy):
    assert grpo.needs_prev_logprobs_pass(_cfg(tiny_policy), 16)  # 16 completions, global batch 8: two steps
    assert not grpo.needs_prev_logprobs_pass(_cfg(tiny_policy), 8)
    assert grpo.needs_prev_logprobs_pass(_cfg(tiny_policy, "grpo.adv_estimator.name=reinforce_plus_plus",
                                              "loss_fn.use_kl_in_reward=true"), 8)  # the advantages need them


def test_one_update_per_rollout_takes_prev_logprobs_from_the_training_forward(tiny_policy, logprob_passes, monkeypatch):
    """16 completions and a global batch of 16: one optimizer step per rollout, so the only log-prob pass
    before the update is the reference's, and the step ends with the weights and metrics that a separate
    prev_logprobs pass gives."""
    cfg = _cfg(tiny_policy, "policy.train_global_batch_size=16", "policy.optimizer.lr=1e-3")
    passes = logprob_passes
    shared, _, [fused] = _run_steps(cfg, lambda tok: TokenReward(tok, "a"), 1)
    assert len(passes) == 1 and fused["train/probs_ratio"] == 1.0
    monkeypatch.setattr(grpo, "needs_prev_logprobs_pass", lambda cfg, rows: True)
    separate, _, [apart] = _run_steps(cfg, lambda tok: TokenReward(tok, "a"), 1)
    assert len(passes) == 3
    for got, want in zip(shared.parameters(), separate.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    for key in ("train/loss", "train/probs_ratio", "train/token_mult_prob_error", "train/kl_penalty",
                "train/approx_entropy"):
        assert fused[key] == pytest.approx(apart[key], rel=1e-5, abs=1e-7), key


def test_kl_in_the_reward_before_the_leave_one_out_baseline(tiny_policy):
    """NeMo Aligner's REINFORCE (configs/reinforce_rm.yaml): each completion's reward less beta times its summed
    KL to the reference, then RLOO's baseline (the other completions' mean), not divided by the std."""
    cfg = _cfg(tiny_policy, "loss_fn.use_kl_in_reward=true", "loss_fn.reference_policy_kl_type=k1",
               "grpo.normalize_rewards=false")
    token_mask = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1], [0, 1, 0, 0]], dtype=torch.float32)
    prev = torch.tensor([[0.0, -1.0, -2.0, -9.0], [0.0, -0.5, -0.5, -0.5], [0.0, -9.0, -1.0, -1.0],
                         [0.0, -3.0, -9.0, -9.0]])
    ref = torch.full((4, 4), -1.0)
    batch = {"token_mask": token_mask, "sample_mask": torch.ones(4), "prev_logprobs": prev,
             "reference_policy_logprobs": ref}
    rewards = torch.tensor([1.0, 2.0, 0.0, 3.0])
    seq_kl = [0.0 + -1.0, 0.5 * 3, 0.0 + 0.0, -2.0]  # k1 = prev - ref over each completion's tokens
    penalized = [r - 0.1 * k for r, k in zip(rewards.tolist(), seq_kl)]
    expected = [penalized[i] - (sum(penalized[j] for j in (0, 1) if j != i)) for i in (0, 1)]
    expected += [penalized[i] - (sum(penalized[j] for j in (2, 3) if j != i)) for i in (2, 3)]
    adv = compute_advantages(cfg, rewards, torch.tensor([0, 0, 1, 1]), batch, 0.1)
    torch.testing.assert_close(adv, torch.tensor(expected))


def test_prev_logprobs_from_the_sampler_when_the_advantages_need_them_first(tiny_policy, logprob_passes):
    """Reinforce++ with the KL in the reward needs `prev_logprobs` before the update: with
    `grpo.prev_logprobs_from_generation` they are the sampler's (only the reference's pass runs), and in
    float32 the step ends with the weights that the pass of their own gives."""
    overrides = ("grpo.adv_estimator.name=reinforce_plus_plus", "loss_fn.use_kl_in_reward=true",
                 "policy.optimizer.lr=1e-3")
    passes = logprob_passes
    sampled, _, [metrics] = _run_steps(_cfg(tiny_policy, *overrides, "grpo.prev_logprobs_from_generation=true"),
                                       lambda tok: TokenReward(tok, "a"), 1)
    assert len(passes) == 1 and metrics["train/token_mult_prob_error"] == 1.0
    computed, _, _ = _run_steps(_cfg(tiny_policy, *overrides), lambda tok: TokenReward(tok, "a"), 1)
    assert len(passes) == 3
    for got, want in zip(sampled.parameters(), computed.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)

