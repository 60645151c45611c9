"""Rollouts for the RL recipes (GRPO, PPO): prompts ready to sample, completions sampled and laid out as training
tensors, rewards from the environment (scaled and shaped as the loop says), a policy's per-token log-probs of
such a batch (the completions of one prompt computed with the prompt once), the frozen reference policy, and
the rollout's metrics.

Tensors follow docs/design.md: right-padded rows `[B, S]` of prompt + completion; per-token tensors
(`generation_logprobs`, `prev_logprobs`, `reference_policy_logprobs`) aligned with `input_ids` (position t
holds log p(input_ids[t] | input_ids[:t]), 0 at the prompt); `token_mask` 1 on generated tokens only;
`sample_mask` `[B]`; `prompt_length` and `group_index` `[B]` (the rows of one prompt's completions are
consecutive and share its group index).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from pathlib import Path

import torch

from rmkit import distributed as dist
from rmkit.config import SamplingParams
from rmkit.data.prompts import load_prompts
from rmkit.data.sampler import LengthGroupedBatchSampler
from rmkit.data.tokenize import as_messages, render_prompt
from rmkit.errors import ConfigError, DataError, RolloutFailed
from rmkit.generation import generate_completions
from rmkit.losses.logprobs import next_token_logprobs
from rmkit.losses.rewards import missing_eos_penalty, overlong_penalty, scale_rewards, stop_properly_penalty
from rmkit.models.setup import autocast
from rmkit.models.shared_prefix import Group, shared_prefix_logits
from rmkit.trainer.run_data import DataSet, report_data, resolve_data_path
from rmkit.trainer.sharding import shard_policy


@dataclass
class PromptItem:
    """A prompt, where it came from, and its token ids rendered with the policy's chat template."""

    source: str
    prompt: str | list[dict]
    ids: list[int]


def load_prompt_set(cfg, ds: DataSet, tokenizer) -> list[PromptItem]:
    """The prompts of a data set rendered for the policy; prompts that leave no room for `max_new_tokens` within
    `policy.max_total_sequence_length` are skipped (listed in its rejects file), as are bad records under
    `data.on_error: skip`."""
    data, budget = ds.data, cfg.policy.max_total_sequence_length - cfg.policy.generation.max_new_tokens
    loaded = load_prompts(resolve_data_path(ds.path), data.format if data.format != "regression" else "prompts",
                          prompt_key=data.prompt_key, chosen_key=data.chosen_key, rejected_key=data.rejected_key,
                          on_error=data.on_error, split=data.split)
    items, too_long = [], []
    for prompt in loaded.records:
        ids = render_prompt(tokenizer, prompt.prompt)
        if len(ids) > budget:
            too_long.append((prompt.source, f"the prompt has {len(ids)} tokens; with policy.generation.max_new_tokens "
                                            f"it exceeds policy.max_total_sequence_length"))
        else:
            items.append(PromptItem(prompt.source, prompt.prompt, ids))
    report_data(ds, loaded, len(items), "prompt", too_long)
    skipped = loaded.skipped + too_long
    if not items:
        raise DataError(ds.path, None, None, f"no usable prompts ({len(skipped)} skipped, see {ds.rejects})"
                        if skipped else "no prompts")
    return items


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


def policy_logits(model, batch: dict, temperature: float, precision: str) -> tuple[torch.Tensor, dict]:
    """`(logits [B, W, V], view)`: the policy's logits divided by the sampling temperature (the distribution the
    rollouts were drawn from, so training log-probs compare with the generation log-probs) at the rows of
    `view = continuation_view(batch)`, the positions that predict a completion token; what a loss or a
    log-prob pass reads is `view`, not `batch`. The completions of one prompt share it: each group runs as
    one sequence with the prompt computed once, several groups packed to a row (`rmkit.models.shared_prefix`),
    and the output layer runs at the view's positions only; the logits equal a plain forward's within float
    rounding."""
    device = batch["input_ids"].device
    with autocast(precision, device):  # padding is masked: any id will do
        logits = shared_prefix_logits(model, prompt_groups(batch), pad_token_id=0, continuations_only=True)
    return (logits / temperature if temperature != 1.0 else logits), continuation_view(batch)


def continuation_view(batch: dict) -> dict:
    """The rows from their last prompt token on (`[last prompt token, completion]`; from the first token after
    an empty prompt), left-aligned and right-padded to the longest: every per-token tensor `[B, S]` shifted
    alike, so each stays aligned with `input_ids` (position t of the view: log p(token t | what precedes it));
    per-row tensors as they are, `prompt_length` the view's own (1, or 0). Losses over completion tokens
    give the same sums over the view as over the full rows, and the prompt's other positions are not
    computed."""
    start = continuation_start(batch)
    width = int((batch["attention_mask"].sum(1) - start).max())
    index = start[:, None] + torch.arange(width, device=start.device)
    view = {}
    for key, value in batch.items():
        if value.dim() == 2:  # zeros past each row's end: padding, masked
            view[key] = torch.cat([value, value.new_zeros(len(value), width)], 1).gather(1, index.to(value.device))
        else:
            view[key] = value
    view["prompt_length"] = (batch["prompt_length"] > 0).to(batch["prompt_length"].dtype)
    return view


def continuation_start(batch: dict) -> torch.Tensor:
    """`[B]`: where each row's `continuation_view` begins (its last prompt token; 0 after an empty prompt)."""
    return (batch["prompt_length"] - 1).clamp(min=0)


def from_continuation_view(values: torch.Tensor, batch: dict) -> torch.Tensor:
    """`[B, S]` per-token `values` `[B, W]` of `continuation_view(batch)` put back at the rows' own positions
    (0 before each row's view and at padding)."""
    width, start = values.shape[1], continuation_start(batch).to(values.device)
    index = start[:, None] + torch.arange(width, device=values.device)
    real = torch.arange(width, device=values.device) < (batch["attention_mask"].sum(1).to(values.device) - start)[:, None]
    out = values.new_zeros(len(values), batch["input_ids"].shape[1] + width)
    return out.scatter_(1, index, values * real)[:, :batch["input_ids"].shape[1]]


def prompt_groups(batch: dict) -> list[Group]:
    """The rows as `(prompt ids, [completion ids, ...])`, one group per run of consecutive rows with the same
    `group_index`, in row order."""
    groups: list[Group] = []
    lengths, group_ids = batch["attention_mask"].sum(1).tolist(), batch["group_index"].tolist()
    for row, (ids, start, length, group) in enumerate(zip(batch["input_ids"].tolist(), batch["prompt_length"].tolist(),
                                                          lengths, group_ids)):
        if row and group == group_ids[row - 1]:
            groups[-1][1].append(ids[start:length])
        else:
            groups.append((ids[:start], [ids[start:length]]))
    return groups


@torch.no_grad()
def batch_logprobs(model, batch: dict, micro_batch_size: int, temperature: float, precision: str) -> torch.Tensor:
    """`[N, S]` log-probs of every row's completion tokens under `model`, aligned with input_ids (0 at the
    prompt's positions, which no loss reads)."""
    out = torch.zeros(batch["input_ids"].shape, dtype=torch.float32)
    device = next(model.parameters()).device
    for start in range(0, len(out), micro_batch_size):
        micro = slice_rows(batch, start, start + micro_batch_size, device)
        logits, view = policy_logits(model, micro, temperature, precision)
        logprobs = from_continuation_view(row_logprobs(logits, view["input_ids"]), micro)
        out[start:start + micro_batch_size, :logprobs.shape[1]] = logprobs.cpu()
    return out


@torch.no_grad()
def row_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """`[B, S]` float32 log-probs of `input_ids` under `logits` `[B, S, V]`, aligned with input_ids (0 at
    position 0): the layout of `prev_logprobs` and `reference_policy_logprobs`."""
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=logits.device)
    out[:, 1:] = next_token_logprobs(logits, input_ids).float()
    return out


def slice_rows(batch: dict, start: int, stop: int, device: torch.device | None = None) -> dict:
    """Rows `start:stop` of every tensor, cut to the rows' longest real length (less padding)."""
    width = int(batch["attention_mask"][start:stop].sum(1).max())
    return {k: (v[start:stop, :width] if v.dim() == 2 else v[start:stop]).to(device or v.device)
            for k, v in batch.items()}


def check_rollout_split(loop, policy, world: int) -> None:
    """Every rank gets whole prompt groups and whole micro-batches (`loop`: `grpo.*` or `ppo.*`)."""
    p, g, m = loop.num_prompts_per_step, policy.train_global_batch_size, policy.train_micro_batch_size
    if p % world:
        raise ConfigError(f"{loop.section}.num_prompts_per_step", f"{p} prompts do not divide among {world} processes")
    if g % (world * m):
        raise ConfigError("policy.train_global_batch_size", f"{g} is not a multiple of {world} processes x "
                          f"train_micro_batch_size {m}")


def reference_policy(model, policy, info: dist.DistInfo, needed: bool):
    """A context manager factory giving the reference policy (the initial weights), or None when not `needed`
    (no KL term). LoRA: the same model with its adapters disabled (no second copy); else a frozen deep copy,
    taken before any checkpoint is restored (and before the policy is sharded), sharded like the policy
    under FSDP2."""
    if not needed:
        return None
    if policy.lora.enabled:
        return lambda: model.disable_adapter()
    frozen = copy.deepcopy(model).eval().requires_grad_(False)
    if policy.dtensor_cfg.enabled:
        shard_policy(frozen, policy, info)
    return lambda: contextlib.nullcontext(frozen)


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


def rl_loop_state(generator: torch.Generator, kl, watch) -> dict:
    """What an RL run keeps in its checkpoints besides the weights: every rank's sampling generator (so the
    rollouts repeat exactly on resume; a collective), the KL coefficient (`rl_guards.KLCoefficient`) and the
    reward-hacking watch's state. Call on every rank."""
    return {"generators": dist.all_gather_object(generator.get_state()), "kl_coefficient": kl.value,
            "hacking_watch": watch.state()}


def restore_rl_loop_state(saved: dict, generator: torch.Generator, kl, watch) -> None:
    """`rl_loop_state` back from a checkpoint's trainer state (rank 0's generator when the process count changed)."""
    generators = saved["generators"]
    generator.set_state(generators[dist.rank()] if len(generators) == dist.world_size() else generators[0])
    kl.value = saved.get("kl_coefficient", kl.value)
    if "hacking_watch" in saved:
        watch.load(saved["hacking_watch"])


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
