"""One RL step's rollout (GRPO, PPO): prompts sampled into completions, laid out as training tensors, scored by the
reward environment (scaled and shaped as the loop says), checked against the sampler's log-probs, and summed up
in the step's metrics; and what an RL run samples from (`rollout_sources`).

Tensors follow docs/design.md: right-padded rows `[B, S]` of prompt + completion; per-token tensors
(`generation_logprobs`, `prev_logprobs`, `reference_policy_logprobs`) aligned with `input_ids` (position t
holds log p(input_ids[t] | input_ids[:t]), 0 at the prompt); `token_mask` 1 on generated tokens only;
`sample_mask` `[B]`; `prompt_length` and `group_index` `[B]` (the rows of one prompt's completions are
consecutive and share its group index).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from rmkit import distributed as dist
from rmkit.config import SamplingParams
from rmkit.data.sampler import LengthGroupedBatchSampler
from rmkit.data.tokenize import as_messages
from rmkit.errors import ConfigError, RolloutFailed, TrainingDiverged
from rmkit.generation import generate_completions
from rmkit.losses.rewards import missing_eos_penalty, overlong_penalty, scale_rewards, stop_properly_penalty
from rmkit.trainer.datasets import DataSet, PromptItem, load_prompt_set


@dataclass
class Rollout:
    """One step's completions on this rank: `G` consecutive rows per prompt."""

    prompts: list[PromptItem]
    """One per row (a prompt repeated G times)."""
    group_index: torch.Tensor
    """`[N]` the prompt's position in this step's global prompt batch."""
    completion_ids: list[list[int]]
    text: list[str]
    logprobs: list[torch.Tensor]
    truncated: torch.Tensor
    """`[N]` bool: `max_new_tokens` ran out."""


def generate_rollout(model, tokenizer, prompts: list[PromptItem], first_index: int, group_size: int,
                     params: SamplingParams, batch_size: int, generator: torch.Generator) -> Rollout:
    """Sample every prompt `group_size` times, `batch_size` completions per `generate` call."""
    rows = [p for p in prompts for _ in range(group_size)]
    groups = torch.arange(first_index, first_index + len(prompts)).repeat_interleave(group_size)
    ids, text, logprobs, truncated = [], [], [], []
    for start in range(0, len(rows), batch_size):
        chunk = [p.ids for p in rows[start:start + batch_size]]
        out = generate_completions(model, tokenizer, chunk, params, generator)
        ids += out.ids
        text += out.text
        logprobs += out.logprobs
        truncated += out.truncated
    return Rollout(rows, groups, ids, text, logprobs, torch.tensor(truncated, dtype=torch.bool))


def sample_and_score(cfg, loop, model, tokenizer, env, prompts: list[PromptItem], step: int,
                     generator: torch.Generator, timing: dict) -> tuple[Rollout, torch.Tensor]:
    """This rank's rollout of 0-based step `step` (`loop.num_generations_per_prompt` completions of each of
    `prompts`, sampled as `policy.generation` says) and its rewards, scaled and shaped as `loop` says; `timing`
    gets the seconds of `generation` and `reward_calculation`. Non-finite logits while sampling stop the run
    before any update."""
    policy, t0 = cfg.policy, time.perf_counter()
    try:
        rollout = generate_rollout(model, tokenizer, prompts, dist.rank() * len(prompts),
                                   loop.num_generations_per_prompt, policy.generation, policy.generation_batch_size,
                                   generator)
    except TrainingDiverged as err:
        raise TrainingDiverged(f"{err} at step {step + 1}; no update was applied. Lower "
                               f"policy.optimizer.lr (now {policy.optimizer.lr}) or raise "
                               "loss_fn.reference_policy_kl_penalty, and resume from the last checkpoint.") from None
    timing["generation"], t0 = time.perf_counter() - t0, time.perf_counter()
    rewards = shaped_rewards(loop, score_rollout(env, rollout, step), rollout)
    timing["reward_calculation"] = time.perf_counter() - t0
    return rollout, rewards


def training_batch(rollout: Rollout, pad_id: int) -> dict[str, torch.Tensor]:
    """The rollout as right-padded `[N, S]` tensors (module docstring)."""
    lengths = [len(p.ids) + len(c) for p, c in zip(rollout.prompts, rollout.completion_ids)]
    n, width = len(lengths), max(lengths)
    batch = {"input_ids": torch.full((n, width), pad_id, dtype=torch.long),
             "attention_mask": torch.zeros((n, width), dtype=torch.long),
             "token_mask": torch.zeros((n, width), dtype=torch.float32),
             "generation_logprobs": torch.zeros((n, width), dtype=torch.float32),
             "sample_mask": torch.ones(n, dtype=torch.float32),
             "prompt_length": torch.tensor([len(p.ids) for p in rollout.prompts], dtype=torch.long),
             "group_index": rollout.group_index.clone()}
    for row, (prompt, completion, logprobs) in enumerate(zip(rollout.prompts, rollout.completion_ids, rollout.logprobs)):
        p, length = len(prompt.ids), lengths[row]
        batch["input_ids"][row, :length] = torch.tensor(prompt.ids + completion, dtype=torch.long)
        batch["attention_mask"][row, :length] = 1
        batch["token_mask"][row, p:length] = 1
        batch["generation_logprobs"][row, p:length] = logprobs
    return batch


def score_rollout(env, rollout: Rollout, step: int) -> torch.Tensor:
    """Rewards `[N]` of the conversations prompt + completion, through the reward model's own chat template.
    A server that stays down past its retry deadline or gives a malformed answer, a count of rewards other than
    N, or a NaN reward, raises `RolloutFailed` naming the cause (or the prompt) on every rank: the ranks agree
    on a failure flag first, so no rank is left waiting in a collective for one that raised. No reward is ever
    filled in."""
    from rmkit.serve.client import RewardServerError

    logs = [as_messages(p.prompt, "user") + [{"role": "assistant", "content": t}]
            for p, t in zip(rollout.prompts, rollout.text)]
    rewards, failure = None, None
    try:
        rewards = env.step(logs, None).rewards.float()
    except RewardServerError as err:
        failure = (f"the reward server failed at step {step + 1} ({err}); no update was applied. Check that "
                   "`rmkit serve` is up, then continue from the last checkpoint with --resume")
    if rewards is not None and tuple(rewards.shape) != (len(logs),):
        failure = (f"the reward model returned {rewards.numel()} rewards for {len(logs)} completions at step "
                   f"{step + 1}; no update was applied. Check the reward model (env.reward_model)")
    elif rewards is not None and (bad := (~torch.isfinite(rewards)).nonzero().flatten().tolist()):
        prompt = rollout.prompts[bad[0]]
        failure = (f"the reward model returned {rewards[bad[0]].item()} for a completion of the prompt at "
                   f"{prompt.source} ({_snippet(prompt.prompt)!r}) at step {step + 1}; no update was applied. "
                   "Check the reward model (env.reward_model) on this prompt")
    if dist.all_reduce(torch.tensor([float(failure is not None)]), "max").item():
        first = next(f for f in dist.all_gather_object(failure) if f is not None)
        raise RolloutFailed(failure or f"(in another process) {first}")
    return rewards


def _snippet(prompt: str | list[dict], limit: int = 80) -> str:
    text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
    return text if len(text) <= limit else text[:limit] + "..."


def shaped_rewards(loop, rewards: torch.Tensor, rollout: Rollout) -> torch.Tensor:
    """The rewards after `loop.reward_scaling` and then `loop.reward_shaping` (NeMo RL's order; `rmkit.losses.rewards`)."""
    scaling, shaping = loop.reward_scaling, loop.reward_shaping
    if scaling.enabled:
        rewards = scale_rewards(rewards, scaling.source_min, scaling.source_max, scaling.target_min,
                                scaling.target_max)
    if not shaping.enabled:
        return rewards
    if shaping.stop_properly_penalty_coef is not None:
        rewards = stop_properly_penalty(rewards, rollout.truncated, shaping.stop_properly_penalty_coef)
    elif shaping.max_response_length is not None:  # with both other overlong keys (checked in the config)
        lengths = torch.tensor([len(c) for c in rollout.completion_ids])
        rewards = overlong_penalty(rewards, lengths, shaping.overlong_buffer_length, shaping.overlong_buffer_penalty,
                                   shaping.max_response_length)
    if shaping.missing_eos_penalty is not None:
        rewards = missing_eos_penalty(rewards, rollout.truncated, shaping.missing_eos_penalty)
    return rewards


def rollout_metrics(rollout: Rollout, rewards: torch.Tensor, batch: dict, generation_s: float) -> dict[str, float]:
    """Reward, group spread, advantages (over the generated tokens), lengths and truncation over all ranks'
    completions (NeMo RL's names)."""
    rewards_all = dist.all_gather_cat(rewards)
    groups = dist.all_gather_cat(rollout.group_index)
    lengths = dist.all_gather_cat(torch.tensor([len(c) for c in rollout.completion_ids], dtype=torch.float32))
    truncated = dist.all_gather_cat(rollout.truncated.float())
    adv, mask = batch["advantages"], batch["token_mask"] * batch["sample_mask"][:, None]
    adv_tokens = dist.all_gather_cat((adv[:, None].expand_as(mask) if adv.dim() == 1 else adv)[mask > 0])
    spread = [rewards_all[groups == g].std(unbiased=False) for g in groups.unique()]
    return {
        "train/reward": rewards_all.mean().item(),
        "train/reward_std": rewards_all.std().item() if len(rewards_all) > 1 else 0.0,
        "train/fraction_of_groups_with_zero_std": sum(float(s == 0) for s in spread) / len(spread),
        "train/advantages/mean": adv_tokens.mean().item() if adv_tokens.numel() else 0.0,
        "train/advantages/max": adv_tokens.max().item() if adv_tokens.numel() else 0.0,
        "train/advantages/min": adv_tokens.min().item() if adv_tokens.numel() else 0.0,
        "train/mean_gen_tokens_per_sample": lengths.mean().item(),
        "train/truncation_rate": truncated.mean().item(),
        "train/generated_tokens_per_s": lengths.sum().item() / max(generation_s, 1e-9),
    }


def mask_logprob_mismatch(batch: dict, threshold: float | None) -> dict[str, float]:
    """NeMo RL's sequence-level probability error: per completion, the mean over its tokens of
    `exp(|generation_logprobs - prev_logprobs|)` (1 when the sampler and the trainer agree exactly). With a
    `threshold`, completions above it leave the update (`sample_mask` 0). Returns its min / mean / max over
    all ranks' completions, before and after the mask, and how many were masked (`train/...`). Raises
    RolloutFailed when no completion is left."""
    mask = batch["token_mask"][:, 1:] * batch["sample_mask"][:, None]
    tokens = mask.sum(-1)
    counted = tokens > 0
    error = (batch["generation_logprobs"] - batch["prev_logprobs"]).abs()[:, 1:]
    per_sequence = (torch.exp(error * mask) * mask).sum(-1) / tokens.clamp(min=1)
    over = counted & (per_sequence > threshold) if threshold is not None else torch.zeros_like(counted)
    if threshold is not None:
        batch["sample_mask"] = batch["sample_mask"] * (~over).to(batch["sample_mask"].dtype)
    before, after = dist.all_gather_cat(per_sequence[counted]), dist.all_gather_cat(per_sequence[counted & ~over])
    masked = int(dist.all_reduce_sum(over.sum().float()).item())
    if threshold is not None and after.numel() == 0:
        raise RolloutFailed(f"every completion's sequence probability error exceeds ppo.seq_logprob_error_threshold "
                            f"({threshold}); raise it or set it to null")
    metrics = {"train/num_masked_seqs_by_logprob_error": float(masked)}
    for suffix, values in (("", before), ("_after_mask", after)):
        for name, reduce in (("max", torch.max), ("mean", torch.mean), ("min", torch.min)):
            metrics[f"train/{name}_seq_mult_prob_error{suffix}"] = reduce(values).item() if values.numel() else 0.0
    return metrics


def check_rollout_split(loop, policy, world: int) -> None:
    """Every rank gets whole prompt groups and whole micro-batches (`loop`: `grpo.*` or `ppo.*`)."""
    p, g, m = loop.num_prompts_per_step, policy.train_global_batch_size, policy.train_micro_batch_size
    if p % world:
        raise ConfigError(f"{loop.section}.num_prompts_per_step", f"{p} prompts do not divide among {world} processes")
    if g % (world * m):
        raise ConfigError("policy.train_global_batch_size", f"{g} is not a multiple of {world} processes x "
                          f"train_micro_batch_size {m}")


def rollout_sources(cfg, loop, tokenizer, out_dir: Path):
    """What an RL run samples from (`loop`: `grpo.*` or `ppo.*`): the training prompts, the validation prompt
    sets by name, the sampler of this rank's share of `num_prompts_per_step` prompts per step, and this rank's
    seeded sampling generator (checkpoints save it)."""
    world = dist.world_size()
    train = load_prompt_set(cfg, DataSet.of(cfg.data, None, out_dir), tokenizer)
    val = {name: load_prompt_set(cfg, DataSet.of(cfg.data, name, out_dir), tokenizer) for name in cfg.data.val_data_paths}
    if len(train) < loop.num_prompts_per_step:
        raise ConfigError(f"{loop.section}.num_prompts_per_step", f"{loop.num_prompts_per_step} is more than the "
                          f"{len(train)} training prompts")
    sampler = LengthGroupedBatchSampler([0] * len(train), loop.num_prompts_per_step // world, seed=loop.seed,
                                        drop_last=True, num_replicas=world, rank=dist.rank())
    generator = torch.Generator().manual_seed(loop.seed * 1000 + dist.rank())
    return train, val, sampler, generator
