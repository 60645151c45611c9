"""Advantage estimators with NeMo RL's semantics and key names (`grpo.adv_estimator`).

GRPO https://arxiv.org/abs/2402.03300 (group baseline, std normalization), RLOO
https://arxiv.org/abs/2402.14740 (leave-one-out baseline), GDPO https://arxiv.org/abs/2601.05242
(one group-normalized advantage per reward component), Reinforce++ https://arxiv.org/abs/2501.03262
(global normalization, optional KL in the reward), on-policy distillation https://arxiv.org/abs/2601.02780
(MOPD: the teacher-minus-student log-prob gap of each sampled token as its advantage).

Groups are given by an explicit `group_index` `[N]` of ints (any values; equal value = same prompt;
rows of a group need not be consecutive and groups may have different sizes). NeMo RL instead
groups rows whose *prompt token ids* are identical; rmkit does not, because that merges groups that
should stay apart: two different prompts that tokenize the same (after truncation or a lossy chat
template), or the same prompt sampled twice in one step, would share one baseline and one std.
Give each sampled prompt its own index (e.g. its position in the step's prompt batch); for the
common layout of `group_size` consecutive responses per prompt, pass `group_size=` instead.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rmkit.losses.kl import KL_ESTIMATORS

AllReduceSum = Callable[[torch.Tensor], torch.Tensor]


def consecutive_groups(num_rows: int, group_size: int, device: torch.device | None = None) -> torch.Tensor:
    """`group_index` `[num_rows]` for `group_size` consecutive responses per prompt: 0,0,..,1,1,.."""
    if group_size < 1 or num_rows % group_size:
        raise ValueError(f"{num_rows} rewards do not split into groups of {group_size}")
    return torch.arange(num_rows, device=device) // group_size


def _padded_groups(group_index: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's (group, slot) in a padded `[G, K]` layout, K = the largest group's size."""
    if group_index.shape != (n,) or group_index.is_floating_point():
        raise ValueError(f"group_index must be an integer tensor of shape [{n}], got "
                         f"{group_index.dtype} {tuple(group_index.shape)}")
    _, group = torch.unique(group_index, return_inverse=True)
    order = torch.argsort(group, stable=True)
    sizes = torch.bincount(group)
    starts = torch.cumsum(sizes, 0) - sizes
    slot = torch.empty_like(group)
    slot[order] = torch.arange(n, device=group.device) - starts[group[order]]
    return group, slot


def group_baseline_and_std(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    valid_mask: torch.Tensor | None = None,
    leave_one_out_baseline: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row baseline and std of its group (NeMo RL's `calculate_baseline_and_std_per_prompt`).

    With `leave_one_out_baseline`, row j's baseline is the mean of the *other* valid rows of its group
    and its std is their unbiased std (so in a group of two the std is that of one number: 0); else
    the mean and unbiased std of the whole group's valid rows. A group with at most one valid row
    gets baseline = reward (advantage 0) and std 0. Rows with `valid_mask` 0 are left out of every
    baseline; their own baseline and std follow NeMo RL's formula as is (meaningless: mask them out).

    The std is exactly 0 when the rewards it is taken over are all equal, as it is in exact
    arithmetic (NeMo RL's `E[r^2] - E[r]^2` can leave ~1e-9 there, which `/ (std + 1e-6)` would then
    blow up); it is computed in float64 by two passes. Memory is `G * K^2` for G groups of at most K.

    Args:
        rewards: `[N]`.
        group_index: `[N]` ints; equal values are one group (see the module docstring).
        valid_mask: `[N]` 0/1, or None (all valid).
        leave_one_out_baseline: RLOO's baseline (NeMo RL's default).

    Returns:
        `(baseline [N], std [N])` in rewards' dtype.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [N], got shape {tuple(rewards.shape)}")
    n = rewards.shape[0]
    group, slot = _padded_groups(group_index, n)
    if n == 0:
        return rewards.clone(), rewards.clone()
    num_groups, width = int(group.max()) + 1, int(slot.max()) + 1
    r = torch.zeros(num_groups, width, dtype=torch.float64, device=rewards.device)
    v = torch.zeros_like(r)
    r[group, slot] = rewards.to(torch.float64)
    v[group, slot] = 1.0 if valid_mask is None else valid_mask.to(torch.float64)
    # weight[g, j, i]: does row i of group g count for row j's statistics
    loo = int(leave_one_out_baseline)
    others = 1.0 - loo * torch.eye(width, dtype=torch.float64, device=rewards.device)
    weight = others * v[:, None, :]
    count = v.sum(-1, keepdim=True)  # valid rows per group, [G, 1]
    m = count - loo  # NeMo RL's num_valid
    baseline = (weight * r[:, None, :]).sum(-1) / m.clamp(min=1)
    sq_dev = (weight * (r[:, None, :] - baseline[..., None]) ** 2).sum(-1)
    # Masked-out rows under leave-one-out count m + 1 others against a divisor of m: NeMo RL's
    # E[r^2] - E[r]^2 then differs from the two-pass sum by (counted - m) * baseline^2.
    sq_dev = sq_dev - (weight.sum(-1) - m) * baseline**2
    var = sq_dev.clamp(min=0) / (m - 1).clamp(min=1)
    inf = torch.tensor(float("inf"), dtype=torch.float64, device=rewards.device)
    spread = (torch.where(weight > 0, r[:, None, :], -inf).amax(-1)
              - torch.where(weight > 0, r[:, None, :], inf).amin(-1))
    std = torch.where((m > 1) & (spread > 0), var.sqrt(), torch.zeros_like(var))
    single = (count <= 1).expand_as(r)
    baseline = torch.where(single, r, baseline)
    std = torch.where(single, torch.zeros_like(std), std)
    return baseline[group, slot].to(rewards.dtype), std[group, slot].to(rewards.dtype)


def _resolve_groups(rewards, group_index, group_size) -> torch.Tensor:
    if (group_index is None) == (group_size is None):
        raise ValueError("pass exactly one of group_index and group_size")
    if group_index is None:
        return consecutive_groups(rewards.shape[-1], group_size, rewards.device)
    if not isinstance(group_index, torch.Tensor):
        raise TypeError(f"group_index must be a tensor [N] of ints, got {type(group_index).__name__}; "
                        "for consecutive groups pass group_size=k")
    return group_index


def normalize_by_std(advantages: torch.Tensor, std: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """`advantages / (std + eps)` where std > 0; rows with std 0 are left as they are (not sharpened)."""
    return torch.where(std > 0, advantages / (std + eps), advantages)


def grpo_group_advantages(
    rewards: torch.Tensor,
    group_index: torch.Tensor | None = None,
    *,
    group_size: int | None = None,
    use_leave_one_out_baseline: bool = True,
    normalize_rewards: bool = True,
    valid_mask: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO advantages `(r - baseline) / (std + eps)` per row (NeMo RL's GRPOAdvantageEstimator).

    Defaults are NeMo RL's (and its example GRPO config's): leave-one-out baseline, normalized by the
    std of the *other* responses of the group; a group of one gets 0, a group of two is not divided
    (the std of one other response is 0), nor is any row whose std is 0. See
    `group_baseline_and_std`.

    Args:
        rewards: `[N]`.
        group_index: `[N]` ints naming each row's prompt (module docstring: why not prompt tokens).
        group_size: instead of group_index: `group_size` consecutive rows per prompt.
        use_leave_one_out_baseline: RLOO baseline (mean of the other responses).
        normalize_rewards: divide by the std (see above).
        valid_mask: `[N]` 0/1; rows with 0 are left out of the baselines.
        eps: added to the std.

    Returns:
        `[N]` in rewards' dtype: one advantage per sequence, as `ClippedPGLossFn` accepts it;
        `adv[:, None].expand_as(mask)` gives NeMo RL's `[B, S]` layout.
    """
    group_index = _resolve_groups(rewards, group_index, group_size)
    baseline, std = group_baseline_and_std(rewards, group_index, valid_mask, use_leave_one_out_baseline)
    advantages = rewards - baseline
    return normalize_by_std(advantages, std, eps) if normalize_rewards else advantages


def clip_advantages(
    advantages: torch.Tensor,
    advantage_clip_low: float | None = None,
    advantage_clip_high: float | None = None,
) -> torch.Tensor:
    """Clamp advantages to `[advantage_clip_low, advantage_clip_high]` (NeMo RL's `grpo.advantage_clip_*`;
    None: that side unclipped). NeMo RL applies it to every estimator's output, after normalization."""
    if advantage_clip_low is not None and advantage_clip_high is not None:
        if advantage_clip_low > advantage_clip_high:
            raise ValueError(
                f"advantage_clip_low ({advantage_clip_low}) > advantage_clip_high ({advantage_clip_high})"
            )
    if advantage_clip_low is not None:
        advantages = advantages.clamp(min=advantage_clip_low)
    if advantage_clip_high is not None:
        advantages = advantages.clamp(max=advantage_clip_high)
    return advantages


def gdpo_advantages(
    reward_components: dict[str, torch.Tensor],
    group_index: torch.Tensor | None = None,
    *,
    group_size: int | None = None,
    reward_weights: list[float] | None = None,
    use_leave_one_out_baseline: bool = True,
    normalize_rewards: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GDPO advantages (NeMo RL's GDPOAdvantageEstimator): `sum_k w_k * A_k`, each `A_k` the GRPO
    advantage of reward component k alone, then the sum normalized over the whole batch:
    `(A - mean) / std` (unbiased std over all N rows; only `A - mean` when that std is 0).

    Args:
        reward_components: at least two `[N]` tensors by name (NeMo RL's batch keys `reward/<name>`);
            taken in sorted name order.
        group_index / group_size / use_leave_one_out_baseline / normalize_rewards / eps: as in
            `grpo_group_advantages`, applied to each component.
        reward_weights: one weight per component, in sorted name order; None: all 1.

    Returns:
        `[N]` advantages.
    """
    names = sorted(reward_components)
    if len(names) < 2:
        raise ValueError(
            f"GDPO needs at least two reward components, got {len(names)} ({names}); use GRPO for one"
        )
    weights = [1.0] * len(names) if reward_weights is None else list(reward_weights)
    if len(weights) != len(names):
        raise ValueError(
            f"reward_weights has {len(weights)} entries for {len(names)} reward components {names} "
            "(one weight per component, in sorted name order)"
        )
    first = reward_components[names[0]]
    group_index = _resolve_groups(first, group_index, group_size)
    total = sum(
        w * grpo_group_advantages(reward_components[name], group_index, eps=eps,
                                  use_leave_one_out_baseline=use_leave_one_out_baseline,
                                  normalize_rewards=normalize_rewards)
        for w, name in zip(weights, names)
    )
    centered = total - total.mean()
    std = total.std() if total.numel() > 1 else torch.zeros((), dtype=total.dtype, device=total.device)
    return torch.where(std > 0, centered / std, centered)


def kl_in_reward(
    logprobs: torch.Tensor, reference_logprobs: torch.Tensor, reference_policy_kl_type: str = "k3"
) -> torch.Tensor:
    """Per-token KL estimate `[B, S]` that NeMo RL subtracts from the reward (`use_kl_in_reward`):
    its `calculate_kl` with the default clamps, 20 on `reference - logprobs` and 10 on the estimate."""
    if reference_policy_kl_type not in KL_ESTIMATORS:
        raise ValueError(f"unknown reference_policy_kl_type {reference_policy_kl_type!r}; "
                         f"choose one of {sorted(KL_ESTIMATORS)}")
    log_ratio = (reference_logprobs - logprobs).clamp(-20.0, 20.0)
    return KL_ESTIMATORS[reference_policy_kl_type](log_ratio).clamp(-10.0, 10.0)


def sequence_kl(logprobs: torch.Tensor, reference_logprobs: torch.Tensor, mask: torch.Tensor,
                reference_policy_kl_type: str = "k3") -> torch.Tensor:
    """`[B]`: each sequence's KL to the reference, the per-token `kl_in_reward` summed over `mask` (the
    sequence-level KL that NeMo Aligner's REINFORCE subtracts from the reward before the leave-one-out
    baseline)."""
    per_token = kl_in_reward(logprobs, reference_logprobs, reference_policy_kl_type)
    return torch.where(mask > 0, per_token, torch.zeros_like(per_token)).sum(dim=-1)


def response_mask(token_mask: torch.Tensor, sample_mask: torch.Tensor) -> torch.Tensor:
    """The `[B, S]` mask the per-token estimators take: `token_mask * sample_mask[:, None]`, with
    position 0 off (it has no log-prob: rmkit's losses never train on it)."""
    mask = token_mask * sample_mask[:, None].to(token_mask.dtype)
    return torch.cat([torch.zeros_like(mask[:, :1]), mask[:, 1:]], dim=1)


def _global_whiten(x: torch.Tensor, mask: torch.Tensor, all_reduce_sum: AllReduceSum | None = None) -> torch.Tensor:
    """`(x - mean) / sqrt(max(var, 1e-8))`, mean and biased var over `mask`'s tokens; with `all_reduce_sum`
    (data parallel) over every rank's tokens: two passes, each summing this rank's `[sum, count]` globally."""
    reduce = all_reduce_sum or (lambda t: t)
    total, count = reduce(torch.stack([(x * mask).sum(), mask.sum()])).unbind()
    count = count.clamp(min=1)
    mean = total / count
    var = reduce(((x - mean) ** 2 * mask).sum()) / count
    return (x - mean) * var.clamp(min=1e-8).rsqrt()


def reinforce_plus_plus_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    group_index: torch.Tensor | None = None,
    *,
    group_size: int | None = None,
    minus_baseline: bool = True,
    use_kl_in_reward: bool = False,
    reference_policy_kl_penalty: float = 0.0,
    reference_policy_kl_type: str = "k3",
    logprobs: torch.Tensor | None = None,
    reference_logprobs: torch.Tensor | None = None,
    all_reduce_sum: AllReduceSum | None = None,
) -> torch.Tensor:
    """Reinforce++ advantages `[B, S]` (NeMo RL's ReinforcePlusPlusAdvantageEstimator).

    `a = r - group mean` (`minus_baseline`; a group of one gets 0) or `a = r`, broadcast over the
    tokens; with `use_kl_in_reward` (and both log-probs given) `a -= reference_policy_kl_penalty *
    kl_in_reward(...)` per token; then whitened over the batch's masked tokens: `(a - mean) /
    sqrt(max(var, 1e-8))`, biased var. Positions outside the mask are whitened too, not zeroed.

    Args:
        rewards: `[B]`.
        mask: `[B, S]` tokens that count (`response_mask(token_mask, sample_mask)`).
        group_index / group_size: the prompt groups (see the module docstring); needed only with
            minus_baseline.
        logprobs / reference_logprobs: `[B, S]` aligned with input_ids (`prev_logprobs`,
            `reference_policy_logprobs`).
    """
    adv = rewards
    if minus_baseline:
        group_index = _resolve_groups(rewards, group_index, group_size)
        baseline, _ = group_baseline_and_std(rewards, group_index, leave_one_out_baseline=False)
        adv = rewards - baseline
    adv = adv[:, None].expand(mask.shape)
    if use_kl_in_reward and logprobs is not None and reference_logprobs is not None:
        adv = adv - reference_policy_kl_penalty * kl_in_reward(logprobs, reference_logprobs,
                                                               reference_policy_kl_type)
    return _global_whiten(adv, mask.to(adv.dtype), all_reduce_sum)


def raw_reward_advantages(rewards: torch.Tensor, mask: torch.Tensor, normalize_advantages: bool) -> torch.Tensor:
    """The reward as every token's advantage, `[B, S]` (NeMo RL's RawRewardAdvantageEstimator, PPO's
    critic-free option); `normalize_advantages` whitens it over the mask as Reinforce++ does."""
    adv = rewards[:, None].expand(mask.shape)
    return _global_whiten(adv, mask.to(adv.dtype)) if normalize_advantages else adv


OPD_METRIC_NAMES = (
    "on_policy_distillation/teacher_student_logprob_gap_mean",
    "on_policy_distillation/adv_mean",
    "on_policy_distillation/adv_std",
)


def _opd_gap(teacher_logprobs, prev_logprobs, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked inputs -> (`sg(teacher - prev)` `[B, S]` in the compute dtype, `mask != 0`)."""
    for name, value in (("teacher_logprobs", teacher_logprobs), ("prev_logprobs", prev_logprobs)):
        if value is None:  # NeMo RL's message; a recipe may pass batch.get(...)
            raise ValueError(f"OPD requires {name}")
        if not value.is_floating_point():
            raise ValueError(f"{name} must be floating point log-probs, got {value.dtype}")
    if mask.dim() != 2 or teacher_logprobs.shape != mask.shape or prev_logprobs.shape != mask.shape:
        raise ValueError(
            f"teacher_logprobs {tuple(teacher_logprobs.shape)}, prev_logprobs {tuple(prev_logprobs.shape)} and mask "
            f"{tuple(mask.shape)} must all be [B, S], aligned with the same input_ids (pad a shorter teacher with 0)")
    wide = torch.float64 in (teacher_logprobs.dtype, prev_logprobs.dtype)
    dtype = torch.float64 if wide else torch.float32
    return (teacher_logprobs.to(dtype) - prev_logprobs.to(dtype)).detach(), mask != 0


def opd_advantages(
    teacher_logprobs: torch.Tensor | None, prev_logprobs: torch.Tensor | None, mask: torch.Tensor
) -> torch.Tensor:
    """On-policy distillation advantages `[B, S]` (NeMo RL's OPDAdvantageEstimator, `adv_estimator.name: opd`;
    MOPD https://arxiv.org/abs/2601.02780, Eq. 8):

        A[b, t] = sg(teacher_logprobs[b, t] - prev_logprobs[b, t]) * mask[b, t]

    The teacher's log-prob of each token the student sampled minus the student's: a per-token reward that
    is the negated k1 estimate of KL(student || teacher) at that token, so the policy gradient pulls the
    student toward the teacher using only the sampled tokens' teacher log-probs (not its logits over the
    vocabulary, as `DistillationLossFn` needs). No rewards, groups or normalization. NeMo RL trains on it with
    `ClippedPGLossFn` as REINFORCE (`disable_ppo_ratio: true`) behind the ICE-POP gate
    (`use_importance_sampling_correction: true`, `truncated_importance_sampling_type: icepop`), warning when
    one of these is not set; its MOPD guide also sets `reference_policy_kl_penalty: 0`.

    Alignment (docs/design.md): both log-probs are `[B, S]` aligned with input_ids, position t holding
    log p(input_ids[b, t] | input_ids[b, :t]) and 0 at position 0; the teacher's come from the same
    input_ids (so the teacher shares the student's tokenizer), e.g. `aligned_logprobs(teacher_logits,
    input_ids)`. `prev_logprobs` must be the student's real log-probs (NeMo RL refuses a config that would
    zero them: `force_on_policy_ratio` without `seq_logprob_error_threshold`).

    Differences from NeMo RL, none on finite inputs with a 0/1 mask: positions outside the mask are exactly 0
    (NeMo RL multiplies by the mask: a non-finite log-prob there would become NaN and reach the loss); the
    gap is computed in float32 (float64 if either input is), not in the inputs' dtype; shapes are checked
    (NeMo RL's loop first pads a shorter teacher row with zeros, `_pad_teacher_logprobs`); the unused
    `prompt_ids` and `rewards` are not taken; the metrics are `opd_metrics`, not state on an object.

    Args:
        teacher_logprobs: `[B, S]` the teacher's log-probs of the sampled tokens (NeMo RL's batch key
            `teacher_reference_logprobs`).
        prev_logprobs: `[B, S]` the student's, from the weights that sampled (before the update).
        mask: `[B, S]` tokens the policy trains on (`response_mask(token_mask, sample_mask)`).

    Returns:
        `[B, S]` detached advantages, as `ClippedPGLossFn` takes them; 0 outside the mask.
    """
    gap, valid = _opd_gap(teacher_logprobs, prev_logprobs, mask)
    return torch.where(valid, gap * mask.to(gap.dtype), torch.zeros((), dtype=gap.dtype, device=gap.device))


def opd_metrics(
    teacher_logprobs: torch.Tensor | None, prev_logprobs: torch.Tensor | None, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """NeMo RL's OPD metrics (`OPDAdvantageEstimator.last_metrics`), over the tokens where `mask != 0`: the
    mean teacher-minus-student gap, and the mean and unbiased std of `opd_advantages` (std 0 with fewer than
    two tokens, everything 0 with none). Detached 0-dim tensors left on the device (NeMo RL returns floats,
    one sync each); over data-parallel ranks, call it on the gathered tensors."""
    adv = opd_advantages(teacher_logprobs, prev_logprobs, mask)
    gap, valid = _opd_gap(teacher_logprobs, prev_logprobs, mask)
    count = valid.sum().to(gap.dtype)
    zero = torch.zeros((), dtype=gap.dtype, device=gap.device)
    gap_mean = torch.where(valid, gap, zero).sum() / count.clamp(min=1)
    adv_mean = adv.sum() / count.clamp(min=1)
    sq_dev = torch.where(valid, (adv - adv_mean) ** 2, zero).sum()
    adv_std = torch.where(count > 1, (sq_dev / (count - 1).clamp(min=1)).sqrt(), zero)
    return dict(zip(OPD_METRIC_NAMES, (gap_mean, adv_mean, adv_std)))
