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
   `prev_logprobs` are taken from the training forward itself (detached) instead of a pass of their own;
5. the update: `ClippedPGLossFn` over micro-batches with global-count normalization, one optimizer step per
   `train_global_batch_size` completions (several per rollout: then the ratio and clipping matter).
"""

from __future__ import annotations

import contextlib
import copy
import sys
import time
from pathlib import Path

import torch

from rmkit import distributed as dist
from rmkit.data.sampler import LengthGroupedBatchSampler
from rmkit.env import check_environment, environment_for
from rmkit.errors import ConfigError, TrainingDiverged
from rmkit.losses import reduce_metrics
from rmkit.losses.advantages import clip_advantages, grpo_group_advantages, reinforce_plus_plus_advantages
from rmkit.losses.policy_gradient import ClippedPGLossFn
from rmkit.models.policy import load_training_policy
from rmkit.recipes.configs import GRPOConfig
from rmkit.trainer.accumulate import accumulate
from rmkit.trainer.export import export_policy
from rmkit.trainer.optim import build_optimizer, build_scheduler
from rmkit.trainer.plots import plot_curves
from rmkit.trainer.progress import ProgressBar
from rmkit.trainer.resume import restore_rng, save_training_checkpoint
from rmkit.trainer.rollout import (
    batch_logprobs,
    generate_rollout,
    load_prompt_set,
    policy_logits,
    row_logprobs,
    score_rollout,
    slice_rows,
    training_batch,
)
from rmkit.trainer.run import Cadence, RunResult, apply_update, finish_run, resume, run_batches, start_run
from rmkit.trainer.run_data import DataSet
from rmkit.trainer.run_log import RunLogger, announce, append_samples
from rmkit.trainer.sharding import shard_policy
from rmkit.trainer.state import TrainState, total_steps

CURVES = {"reward": ["train/reward", "validation/reward_mean"], "KL to the reference": ["train/kl_penalty"],
          "generated tokens": ["train/mean_gen_tokens_per_sample", "validation/mean_gen_tokens_per_sample"]}


def reference_policy(cfg: GRPOConfig, model, info: dist.DistInfo):
    """A context manager factory giving the reference policy (the initial weights), or None when the loss has
    no KL term. LoRA: the same model with its adapters disabled (no second copy); else a frozen deep copy,
    taken before any checkpoint is restored (and before the policy is sharded), sharded like the policy
    under FSDP2."""
    if cfg.loss_fn.reference_policy_kl_penalty == 0:
        return None
    if cfg.policy.lora.enabled:
        return lambda: model.disable_adapter()
    frozen = copy.deepcopy(model).eval().requires_grad_(False)
    if cfg.policy.dtensor_cfg.enabled:
        shard_policy(frozen, cfg.policy, info)
    return lambda: contextlib.nullcontext(frozen)


def check_layout(cfg: GRPOConfig, world: int) -> None:
    """Every rank gets whole prompt groups and whole micro-batches."""
    p, g, m = cfg.grpo.num_prompts_per_step, cfg.policy.train_global_batch_size, cfg.policy.train_micro_batch_size
    if p % world:
        raise ConfigError("grpo.num_prompts_per_step", f"{p} prompts do not divide among {world} processes")
    if g % (world * m):
        raise ConfigError("policy.train_global_batch_size", f"{g} is not a multiple of {world} processes x "
                          f"train_micro_batch_size {m}")


def train(cfg: GRPOConfig) -> RunResult:
    """Optimize the policy against the reward model as `cfg` says; the policy goes to `<checkpoint_dir>/final/`."""
    run = start_run(cfg, cfg.grpo)  # threads, seed, torchrun, folders, the saved config
    device, world = run.device, dist.world_size()
    check_layout(cfg, world)
    check_environment(cfg.env.reward_model)  # a wrong reward-model path fails before the policy loads

    # --- policy, reference, reward environment, prompts
    model, tokenizer = load_training_policy(cfg.policy, device)
    reference = reference_policy(cfg, model, run.info)
    if cfg.policy.dtensor_cfg.enabled:  # FSDP2 under torchrun: shard the model in place (gradients summed)
        shard_policy(model, cfg.policy, run.info)
        trained = model
    else:  # DDP sums gradients over ranks (rmkit.distributed)
        trained = dist.wrap_data_parallel(model, run.info)
    env = environment_for(cfg.env.reward_model)
    train_prompts = load_prompt_set(cfg, DataSet.of(cfg.data, None, run.out_dir), tokenizer)
    val_prompts = {name: load_prompt_set(cfg, DataSet.of(cfg.data, name, run.out_dir), tokenizer)
                   for name in cfg.data.val_data_paths}
    if len(train_prompts) < cfg.grpo.num_prompts_per_step:
        raise ConfigError("grpo.num_prompts_per_step", f"{cfg.grpo.num_prompts_per_step} is more than the "
                          f"{len(train_prompts)} training prompts")
    sampler = LengthGroupedBatchSampler([0] * len(train_prompts), cfg.grpo.num_prompts_per_step // world,
                                        seed=cfg.grpo.seed, drop_last=True, num_replicas=world, rank=dist.rank())
    generator = torch.Generator().manual_seed(cfg.grpo.seed * 1000 + dist.rank())
    params = cfg.policy.generation

    # --- optimizer, schedule, loss, state; resume (the sampling generator too, so rollouts repeat exactly)
    rollout_size = cfg.grpo.num_prompts_per_step * cfg.grpo.num_generations_per_prompt
    updates_per_step = rollout_size // cfg.policy.train_global_batch_size
    steps = total_steps(cfg.grpo, len(sampler))
    optimizer = build_optimizer(model, cfg.policy.optimizer)
    scheduler = build_scheduler(optimizer, cfg.policy.scheduler, steps * updates_per_step)
    state = TrainState(model, optimizer, scheduler, sampler)
    loss_fn = ClippedPGLossFn(cfg.loss_fn)
    saved, logger = resume(run, state, steps)
    if run.resume_from:
        generators = saved["generators"]
        generator.set_state(generators[dist.rank()] if len(generators) == world else generators[0])
    announce(f"GRPO on {cfg.policy.model_name}", model, f"{steps} steps of {cfg.grpo.num_prompts_per_step} prompts x "
             f"{cfg.grpo.num_generations_per_prompt}", device, cfg.policy.precision)
    val_metrics = saved.get("val_metrics", {})
    if cfg.grpo.val_at_start and not run.resume_from:
        val_metrics = run_validation(cfg, model, tokenizer, env, val_prompts, params, logger, run.log_dir, 0)

    # --- the loop
    if run.resume_from:
        restore_rng(saved)
    bar = ProgressBar(steps, cfg.logger.progress_bar and dist.is_main(), initial=state.step)
    when = Cadence.of(cfg, cfg.grpo, steps)
    for indices in run_batches(state, steps, cfg.grpo.max_num_epochs):
        step_start = time.perf_counter()
        prompts = [train_prompts[i] for i in indices]
        metrics = grpo_step(cfg, state, trained, tokenizer, env, reference, loss_fn, prompts, params, generator)
        state.step += 1
        metrics["timing/train/total_step_time"] = time.perf_counter() - step_start
        bar.advance(reward=metrics["train/reward"], kl=metrics["train/kl_penalty"],
                    gen_tokens=metrics["train/mean_gen_tokens_per_sample"])
        if when.log(state.step):
            logger.log(metrics, state.step)
        if when.validate(state.step):
            val_metrics = run_validation(cfg, model, tokenizer, env, val_prompts, params, logger, run.log_dir,
                                         state.step)
        if when.save(state.step):
            save_checkpoint(cfg, state, val_metrics, generator, tokenizer)
    bar.close()
    if cfg.grpo.val_at_end or not val_metrics:
        val_metrics = run_validation(cfg, model, tokenizer, env, val_prompts, params, logger, run.log_dir, state.step)
    env.shutdown()

    # --- the last checkpoint (with every rank's sampling generator), the export (rank 0) and plots
    final_dir = finish_run(run, state, logger, val_metrics, tokenizer,
                           export=lambda whole, folder: export_policy(whole, tokenizer, folder, cfg),
                           load_unsharded=lambda: load_training_policy(cfg.policy, torch.device("cpu"))[0],
                           extra={"generators": dist.all_gather_object(generator.get_state())})
    plots = []
    if cfg.logger.plots and dist.is_main():
        plots = [p for p in [plot_curves(logger.history, run.log_dir / "grpo_curves.png", CURVES)] if p]
    dist.destroy()
    return RunResult(final_dir, run.log_dir, state.step, val_metrics, {}, plots)


def grpo_step(cfg, state, trained, tokenizer, env, reference, loss_fn, prompts, params, generator) -> dict[str, float]:
    """One rollout and its updates; returns the step's metrics (NeMo RL's names). A prompt's group index is its
    position in the step's global prompt batch."""
    timing, policy, model = {}, cfg.policy, state.model
    t0 = time.perf_counter()
    try:
        rollout = generate_rollout(model, tokenizer, prompts, dist.rank() * len(prompts),
                                   cfg.grpo.num_generations_per_prompt, params, policy.generation_batch_size, generator)
    except TrainingDiverged as err:
        raise TrainingDiverged(f"{err} at step {state.step + 1}; no update was applied. Lower "
                               f"policy.optimizer.lr (now {policy.optimizer.lr}) or raise "
                               "loss_fn.reference_policy_kl_penalty, and resume from the last checkpoint.") from None
    timing["generation"], t0 = time.perf_counter() - t0, time.perf_counter()
    rewards = score_rollout(env, rollout, state.step)
    timing["reward_calculation"], t0 = time.perf_counter() - t0, time.perf_counter()
    batch = training_batch(rollout, tokenizer.pad_token_id)
    if needs_prev_logprobs_pass(cfg, len(batch["input_ids"])):  # else update_policy takes them on the way
        batch["prev_logprobs"] = batch_logprobs(model, batch, policy.train_micro_batch_size,
                                                params.temperature, policy.precision)
    if reference is not None:
        with reference() as ref_model:
            batch["reference_policy_logprobs"] = batch_logprobs(model if ref_model is None else ref_model, batch,
                                                                policy.train_micro_batch_size, params.temperature,
                                                                policy.precision)
    timing["policy_and_reference_logprobs"], t0 = time.perf_counter() - t0, time.perf_counter()
    batch["advantages"] = compute_advantages(cfg, rewards, rollout.group_index, batch)
    batch["rewards"] = rewards
    train_metrics = update_policy(cfg, state, trained, batch, loss_fn, params.temperature)
    timing["policy_training"] = time.perf_counter() - t0
    metrics = {**rollout_metrics(rollout, rewards, batch, timing["generation"]), **train_metrics}
    return {**metrics, **{f"timing/train/{k}": v for k, v in timing.items()}}


def compute_advantages(cfg, rewards: torch.Tensor, group_index: torch.Tensor, batch: dict) -> torch.Tensor:
    """Advantages per row `[N]` (GRPO) or per token `[N, S]` (Reinforce++), clipped per `grpo.advantage_clip_*`."""
    grpo, estimator = cfg.grpo, cfg.grpo.adv_estimator
    if estimator.name == "grpo":
        adv = grpo_group_advantages(rewards, group_index, use_leave_one_out_baseline=grpo.use_leave_one_out_baseline,
                                    normalize_rewards=grpo.normalize_rewards)
    else:
        loss = cfg.loss_fn
        mask = batch["token_mask"] * batch["sample_mask"][:, None]
        adv = reinforce_plus_plus_advantages(
            rewards, mask, group_index, minus_baseline=estimator.minus_baseline,
            use_kl_in_reward=loss.use_kl_in_reward, reference_policy_kl_penalty=loss.reference_policy_kl_penalty,
            reference_policy_kl_type=loss.reference_policy_kl_type, logprobs=batch.get("prev_logprobs"),
            reference_logprobs=batch.get("reference_policy_logprobs"), all_reduce_sum=dist.all_reduce_sum)
    return clip_advantages(adv, grpo.advantage_clip_low, grpo.advantage_clip_high)


def needs_prev_logprobs_pass(cfg, rows: int) -> bool:
    """Whether `prev_logprobs` need a forward pass of their own before the update: when the rollout's `rows`
    (this rank's) make several optimizer steps, the later ones train a policy that has moved; and when
    Reinforce++ puts the KL in the reward, the advantages need them first. Otherwise the training forward
    gives them (the same weights, the same micro-batches): the ratio is exactly 1, as NeMo RL's separate pass
    gives it up to rounding."""
    several_updates = rows > cfg.policy.train_global_batch_size // dist.world_size()
    kl_in_reward = cfg.grpo.adv_estimator.name != "grpo" and cfg.loss_fn.use_kl_in_reward
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
            logits = policy_logits(trained, mb, temperature, policy.precision)
            if "prev_logprobs" not in mb:
                mb["prev_logprobs"] = row_logprobs(logits, mb["input_ids"])
            loss, metrics = loss_fn(logits, mb, gvs, gvt)
            metrics["clipped_fraction"] = clipped_fraction(cfg, logits.detach(), mb, gvt)
            return loss, metrics

        metrics = reduce_metrics(accumulate(trained, list(range(0, per_rank, micro)), run_micro))
        loss = float(dist.all_reduce_sum(torch.as_tensor(metrics["loss"], device=device).detach().clone()))
        metrics["lr"], metrics["grad_norm"] = apply_update(
            state, loss, policy.max_grad_norm, f"Lower policy.optimizer.lr (now {policy.optimizer.lr}), set "
                                               "policy.max_grad_norm, or check the rewards of this rollout.")
        steps.append(metrics)
    return _mean_over_updates(steps)


@torch.no_grad()
def clipped_fraction(cfg, logits, mb, gvt) -> torch.Tensor:
    """The share of the global batch's tokens whose ratio exp(curr - prev) fell outside the clip range."""
    from rmkit.losses.logprobs import next_token_logprobs

    if cfg.loss_fn.disable_ppo_ratio:
        return torch.zeros((), device=logits.device)
    ratio = torch.exp(next_token_logprobs(logits, mb["input_ids"]) - mb["prev_logprobs"][:, 1:])
    out = (ratio < 1 - cfg.loss_fn.ratio_clip_min) | (ratio > 1 + cfg.loss_fn.ratio_clip_max)
    mask = mb["token_mask"][:, 1:] * mb["sample_mask"][:, None]
    return (out.float() * mask).sum() / gvt.clamp(min=1)


def _mean_over_updates(steps: list[dict]) -> dict[str, float]:
    out = {}
    for key in steps[0]:
        values = torch.stack([torch.as_tensor(s[key], dtype=torch.float64).cpu() for s in steps])
        if key.endswith(("_min", "_max")):  # the reduction over ranks too
            value = dist.all_reduce(values.amin() if key.endswith("_min") else values.amax(), key[-3:])
        elif key in ("lr", "grad_norm"):
            value = values.mean()
        else:  # each rank holds its part of the globally normalized value
            value = dist.all_reduce_sum(values.mean())
        out[f"train/{key}"] = float(value)
    return out


def rollout_metrics(rollout, rewards: torch.Tensor, batch: dict, generation_s: float) -> dict[str, float]:
    """Reward, group spread, advantages (over the generated tokens), lengths and truncation over all ranks'
    completions."""
    rewards_all = dist.all_gather_cat(rewards)
    groups = dist.all_gather_cat(rollout.group_index)
    lengths = dist.all_gather_cat(torch.tensor([len(c) for c in rollout.completion_ids], dtype=torch.float32))
    truncated = dist.all_gather_cat(rollout.truncated.float())
    adv = batch["advantages"]
    adv_tokens = dist.all_gather_cat(
        (adv[:, None].expand_as(batch["token_mask"]) if adv.dim() == 1 else adv)[batch["token_mask"] > 0])
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


def run_validation(cfg, model, tokenizer, env, val_sets: dict[str, list], params, logger: RunLogger, log_dir: Path,
                   step: int) -> dict:
    """One completion per held-out prompt (the first `max_val_samples` over the sets in order, this rank's
    share), sampled from a generator seeded the same way each time; logs `validation/reward_mean` (and std,
    length) and appends the generations with their rewards to `<log_dir>/samples.jsonl`."""
    named = [(name, p) for name, prompts in val_sets.items() for p in prompts][:cfg.grpo.max_val_samples]
    if not named:  # no data.val_data_paths
        return {}
    first, named = named[0][1], dist.shard(named)
    prompts, mine = [p for _, p in named], len(named)
    if dist.is_sharded(model):  # FSDP2: as many generate calls on every rank; the extra completions are dropped
        prompts += [first] * (int(dist.all_reduce(torch.tensor(mine), "max")) - mine)
    generator = torch.Generator().manual_seed(cfg.grpo.seed + 7919 * (dist.rank() + 1))
    try:
        rollout = generate_rollout(model, tokenizer, prompts, 0, 1, params, cfg.grpo.val_batch_size, generator)
    except TrainingDiverged as err:
        raise TrainingDiverged(f"{err} during the validation after step {step}") from None
    rewards = score_rollout(env, rollout, step - 1)
    samples = [{"set": name, "source": p.source, "prompt": p.prompt, "completion": t, "reward": r, "truncated": bool(c)}
               for (name, p), t, r, c in zip(named, rollout.text, rewards.tolist(), rollout.truncated)]
    samples = [s for part in dist.all_gather_object(samples) for s in part]
    rewards_all = torch.tensor([s["reward"] for s in samples])
    lengths = dist.all_gather_cat(torch.tensor([len(c) for c in rollout.completion_ids[:mine]], dtype=torch.float32))
    metrics = {"validation/reward_mean": rewards_all.mean().item(),
               "validation/reward_std": rewards_all.std().item() if len(samples) > 1 else 0.0,
               "validation/mean_gen_tokens_per_sample": lengths.mean().item(),
               "validation/num_samples": float(len(samples))}
    logger.log(metrics, step)
    path = append_samples(log_dir, step, samples)
    if dist.is_main():
        print(f"rmkit: step {step}: validation/reward_mean {metrics['validation/reward_mean']:.4f} "
              f"(std {metrics['validation/reward_std']:.4f}, {metrics['validation/mean_gen_tokens_per_sample']:.1f} "
              f"tokens) -> {path}", file=sys.stderr)
    return metrics


def save_checkpoint(cfg, state, val_metrics: dict, generator: torch.Generator, tokenizer) -> None:
    """`save_training_checkpoint` with every rank's sampling generator (resume reproduces the rollouts); the
    last one is `finish_run`'s."""
    generators = dist.all_gather_object(generator.get_state())
    save_training_checkpoint(cfg, state, val_metrics, {"val_metrics": val_metrics, "generators": generators}, tokenizer)
