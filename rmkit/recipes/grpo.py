"""The GRPO recipe, top to bottom: config -> policy (and reference) -> reward environment -> prompts -> loop ->
export. One step, as NeMo RL's `grpo_train` does it:

1. rollouts: `num_prompts_per_step` prompts (this rank's share), each sampled `num_generations_per_prompt`
   times with `rmkit.generation` from a seeded `torch.Generator` (saved in checkpoints);
2. rewards from `RewardModelEnvironment` over the conversations, read through the reward model's own chat
   template;
3. advantages per prompt group (`rmkit.losses.advantages`), groups named by prompt index;
4. `prev_logprobs` (the policy before the update) and, with `reference_policy_kl_penalty > 0`, the
   reference's (the initial weights: a frozen copy, or the base model with the LoRA adapters disabled).
   With one optimizer step per rollout the policy that generated is the one being trained, so
   `prev_logprobs` are taken from the training forward itself (detached) instead of a pass of their own
   (otherwise a pass of their own, or the sampler's with `grpo.prev_logprobs_from_generation`);
5. the update: `ClippedPGLossFn` over micro-batches with global-count normalization, one optimizer step per
   `train_global_batch_size` completions (several per rollout: then the ratio and clipping matter).
"""

from __future__ import annotations

import time

import torch

from rmkit import distributed as dist
from rmkit.env import check_environment
from rmkit.losses import reduce_metrics
from rmkit.losses.advantages import (
    clip_advantages,
    grpo_group_advantages,
    reinforce_plus_plus_advantages,
    response_mask,
    sequence_kl,
)
from rmkit.models.policy import load_training_policy
from rmkit.recipes.configs import GRPOConfig
from rmkit.rl.logprobs import (
    batch_logprobs,
    policy_logits,
    reference_logprobs,
    reference_policy,
    row_logprobs,
    slice_rows,
)
from rmkit.rl.loop import RLLoop
from rmkit.rl.policy_update import clipped_fraction, mean_over_updates
from rmkit.rl.rollout import check_rollout_split, rollout_metrics, sample_and_score, training_batch
from rmkit.trainer.accumulate import accumulate
from rmkit.trainer.export import export_policy
from rmkit.trainer.lifecycle import RunResult, start_run
from rmkit.trainer.loop import RecipeParts, StepReport, apply_update, fit, start_state
from rmkit.trainer.sharding import shard_policy


def train(cfg: GRPOConfig) -> RunResult:
    """Optimize the policy against the reward model as `cfg` says; the policy goes to `<checkpoint_dir>/final/`."""
    run = start_run(cfg, cfg.grpo)  # threads, seed, torchrun, folders, the saved config
    check_rollout_split(cfg.grpo, cfg.policy, dist.world_size())
    check_environment(cfg.env.reward_model)  # a wrong reward-model path fails before the policy loads

    # --- policy, reference, then the RL loop's state: reward environment, prompts, sampling generator, KL, watch
    model, tokenizer = load_training_policy(cfg.policy, run.device)
    reference = reference_policy(model, cfg.policy, run.info, needed=cfg.loss_fn.reference_policy_kl_penalty > 0)
    if cfg.policy.dtensor_cfg.enabled:  # FSDP2 under torchrun: shard the model in place (gradients summed)
        shard_policy(model, cfg.policy, run.info)
        trained = model
    else:  # DDP sums gradients over ranks (rmkit.distributed)
        trained = dist.wrap_data_parallel(model, run.info)
    rl = RLLoop(cfg, cfg.grpo, run, tokenizer)

    # --- optimizer and schedule (one optimizer step per train_global_batch_size completions of a rollout)
    updates_per_step = rl.rollout_size // cfg.policy.train_global_batch_size
    state = start_state(model, cfg.policy, rl.sampler, rl.steps * updates_per_step)

    def step(indices: list[int]) -> StepReport:
        started = time.perf_counter()
        metrics = grpo_step(cfg, state, trained, tokenizer, rl.env, reference, rl.loss_fn(), rl.prompts(indices),
                            cfg.policy.generation, rl.generator)
        return rl.report(metrics, started, state.step + 1)

    # --- the loop, the last checkpoint (with every rank's sampling generator, the KL coefficient), the export
    # (rank 0), plots
    try:
        return fit(run, state, rl.steps, cfg.grpo, RecipeParts(
            action=f"GRPO on {cfg.policy.model_name}", length=rl.length, step=step,
            validate=rl.validation(model, tokenizer), tokenizer=tokenizer,
            export=lambda whole, folder: export_policy(whole, tokenizer, folder, cfg),
            load_unsharded=lambda: load_training_policy(cfg.policy, torch.device("cpu"))[0],
            plots=rl.plots("grpo_curves.png"), loop_state=rl.state, restore=rl.restore))
    finally:
        rl.env.shutdown()


def grpo_step(cfg, state, trained, tokenizer, env, reference, loss_fn, prompts, params, generator) -> dict[str, float]:
    """One rollout and its updates; returns the step's metrics (NeMo RL's names). A prompt's group index is its
    position in the step's global prompt batch."""
    timing, policy, model = {}, cfg.policy, state.model
    rollout, rewards = sample_and_score(cfg, cfg.grpo, model, tokenizer, env, prompts, state.step, generator, timing)
    t0 = time.perf_counter()
    batch = training_batch(rollout, tokenizer.pad_token_id)
    if needs_prev_logprobs_pass(cfg, len(batch["input_ids"])):  # else update_policy takes them on the way
        if cfg.grpo.prev_logprobs_from_generation:
            batch["prev_logprobs"] = batch["generation_logprobs"]
        else:
            batch["prev_logprobs"] = batch_logprobs(model, batch, policy.train_micro_batch_size,
                                                    params.temperature, policy.precision)
    if reference is not None:
        batch["reference_policy_logprobs"] = reference_logprobs(reference, model, batch, policy, params.temperature)
    timing["policy_and_reference_logprobs"], t0 = time.perf_counter() - t0, time.perf_counter()
    batch["advantages"] = compute_advantages(cfg, rewards, rollout.group_index, batch,
                                             loss_fn.cfg["reference_policy_kl_penalty"])
    batch["rewards"] = rewards
    train_metrics = update_policy(cfg, state, trained, batch, loss_fn, params.temperature)
    timing["policy_training"] = time.perf_counter() - t0
    metrics = {**rollout_metrics(rollout, rewards, batch, timing["generation"]), **train_metrics}
    return {**metrics, **{f"timing/train/{k}": v for k, v in timing.items()}}


def compute_advantages(cfg, rewards: torch.Tensor, group_index: torch.Tensor, batch: dict,
                       kl_penalty: float) -> torch.Tensor:
    """Advantages per row `[N]` (GRPO) or per token `[N, S]` (Reinforce++), clipped per `grpo.advantage_clip_*`.
    With `loss_fn.use_kl_in_reward`, `kl_penalty` times the KL to the reference comes off the reward first: per
    token for Reinforce++ (NeMo RL), the sequence's sum for GRPO's group baseline (NeMo Aligner's REINFORCE,
    with `use_leave_one_out_baseline: true`, `normalize_rewards: false`)."""
    grpo, estimator = cfg.grpo, cfg.grpo.adv_estimator
    if estimator.name == "grpo":
        if cfg.loss_fn.use_kl_in_reward and kl_penalty > 0:  # NeMo Aligner's REINFORCE: r - beta * KL(sequence)
            rewards = rewards - kl_penalty * sequence_kl(
                batch["prev_logprobs"], batch["reference_policy_logprobs"],
                response_mask(batch["token_mask"], batch["sample_mask"]), cfg.loss_fn.reference_policy_kl_type)
        adv = grpo_group_advantages(rewards, group_index, use_leave_one_out_baseline=grpo.use_leave_one_out_baseline,
                                    normalize_rewards=grpo.normalize_rewards)
    else:
        loss = cfg.loss_fn
        mask = batch["token_mask"] * batch["sample_mask"][:, None]
        adv = reinforce_plus_plus_advantages(
            rewards, mask, group_index, minus_baseline=estimator.minus_baseline,
            use_kl_in_reward=loss.use_kl_in_reward, reference_policy_kl_penalty=kl_penalty,
            reference_policy_kl_type=loss.reference_policy_kl_type, logprobs=batch.get("prev_logprobs"),
            reference_logprobs=batch.get("reference_policy_logprobs"), all_reduce_sum=dist.all_reduce_sum)
    return clip_advantages(adv, grpo.advantage_clip_low, grpo.advantage_clip_high)


def needs_prev_logprobs_pass(cfg, rows: int) -> bool:
    """Whether `prev_logprobs` are needed before the update (a forward pass of their own, or the sampler's with
    `grpo.prev_logprobs_from_generation`): when the rollout's `rows` (this rank's) make several optimizer steps,
    the later ones train a policy that has moved; and when the KL is in the reward, the advantages need them
    first. Otherwise the training forward gives them (the same weights, the same micro-batches): the ratio is
    exactly 1, as NeMo RL's separate pass gives it up to rounding."""
    several_updates = rows > cfg.policy.train_global_batch_size // dist.world_size()
    kl_in_reward = cfg.loss_fn.use_kl_in_reward and cfg.loss_fn.reference_policy_kl_penalty > 0
    return several_updates or kl_in_reward


def update_policy(cfg, state, trained, batch, loss_fn, temperature) -> dict[str, float]:
    """Optimizer steps over the rollout, `train_global_batch_size` completions each (this rank: its share),
    split into micro-batches whose losses are divided by the global counts; loss metrics averaged over the
    optimizer steps (min / max reduced). Without `prev_logprobs` in `batch` (one step per rollout), each
    micro-batch's come from its own training forward. A non-finite loss stops the run before its update."""
    policy, model, world = cfg.policy, state.model, dist.world_size()
    device = next(model.parameters()).device
    per_rank, micro = policy.train_global_batch_size // world, policy.train_micro_batch_size
    steps = []
    for start in range(0, len(batch["input_ids"]), per_rank):
        rows = slice_rows(batch, start, start + per_rank)
        sample_mask = rows["sample_mask"]
        counts = torch.stack([sample_mask.sum(), (rows["token_mask"][:, 1:] * sample_mask[:, None]).sum()])
        gvs, gvt = dist.all_reduce_sum(counts.to(device)).unbind()

        def run_micro(m, rows=rows, gvs=gvs, gvt=gvt):
            mb = slice_rows(rows, m, m + micro, device)
            logits, view = policy_logits(trained, mb, temperature, policy.precision)
            if "prev_logprobs" not in view:
                view["prev_logprobs"] = row_logprobs(logits, view["input_ids"])
            loss, metrics = loss_fn(logits, view, gvs, gvt)
            metrics["clipped_fraction"] = clipped_fraction(cfg.loss_fn, logits.detach(), view, gvt)
            return loss, metrics

        metrics = reduce_metrics(accumulate(trained, list(range(0, per_rank, micro)), run_micro))
        loss = float(dist.all_reduce_sum(torch.as_tensor(metrics["loss"], device=device).detach().clone()))
        metrics["lr"], metrics["grad_norm"] = apply_update(
            state, loss, policy.max_grad_norm, f"Lower policy.optimizer.lr (now {policy.optimizer.lr}), set "
                                               "policy.max_grad_norm, or check the rewards of this rollout.")
        steps.append(metrics)
    return mean_over_updates(steps)
