"""The PPO recipe, top to bottom: config -> policy, reference and critic -> reward environment -> prompts -> loop ->
export. One step, as NeMo RL's `ppo_train` does it:

1. rollouts: `num_prompts_per_step` prompts (this rank's share), each sampled `num_generations_per_prompt`
   times from a seeded `torch.Generator` (saved in checkpoints);
2. rewards from `RewardModelEnvironment` (read at each completion's last token), then `ppo.reward_scaling`
   and `ppo.reward_shaping`;
3. the critic's values at every token, the policy's log-probs before the update (`prev_logprobs`: a forward
   pass, or the sampler's with `ppo.prev_logprobs_from_generation`) and, with a KL term, the reference's (the
   initial weights);
4. GAE (`rmkit.losses.value.gae_advantages`): the reward at the last token (with `ppo.score_after_end`, TRL's
   position: at the state after a finished completion's last token, `with_value_mask`), minus the KL per token when
   `loss_fn.use_kl_in_reward` (else the KL is in the loss), advantages whitened over all ranks' tokens and the
   critic's returns; on the run's first rollout the critic's values are first shifted by one constant to the
   rollout's mean Monte Carlo return (`value.calibrate_offset`, `calibrate_critic`);
5. `ppo_epochs` passes over the rollout, `train_global_batch_size` completions per optimizer step: the
   critic's clipped value loss (`MseValueLossFn`) and the policy's `ClippedPGLossFn`, each over
   micro-batches with global-count normalization, each clipped to its own gradient norm, one AdamW step
   over both (the critic first in NeMo RL; the two losses share no parameters, so the order changes
   nothing). Each epoch takes the rollout's rows in order, or with `ppo.shuffle_minibatches` in an order of its
   own (`epoch_rows`). For `ppo.policy_training_start_step` steps only the critic trains.

The critic is a decoder classifier whose head is read at every token (`rmkit.models.critic`): by default the
reward model when it is one with the policy's vocabulary (NeMo Aligner, OpenRLHF), else the policy's
weights with a fresh scalar head (NeMo RL). The policy goes to `final/`, the critic to `final/critic/`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from rmkit import distributed as dist
from rmkit.env import check_environment
from rmkit.errors import ConfigError
from rmkit.losses import reduce_metrics
from rmkit.losses.advantages import response_mask
from rmkit.losses.value import MseValueLossFn, aligned_values, gae_advantages, value_explained_variance
from rmkit.models.critic import (
    ActorCritic,
    TokenValues,
    check_critic_path,
    is_scalar_classifier,
    load_critic,
    set_value_offset,
    shared_prefix_values,
    shares_vocabulary,
    value_offset,
)
from rmkit.models.policy import load_training_policy
from rmkit.models.reward import load_tokenizer
from rmkit.models.setup import autocast, prepare_model, resolve_model_name
from rmkit.recipes.configs import PPOConfig
from rmkit.rl.logprobs import (
    batch_logprobs,
    continuation_view,
    from_continuation_view,
    policy_logits,
    prompt_groups,
    reference_logprobs,
    reference_policy,
    slice_rows,
)
from rmkit.rl.loop import RLLoop
from rmkit.rl.policy_update import clipped_fraction, mean_over_updates
from rmkit.rl.rollout import (
    check_rollout_split,
    mask_logprob_mismatch,
    rollout_metrics,
    sample_and_score,
    training_batch,
)
from rmkit.trainer.accumulate import accumulate
from rmkit.trainer.export import export_policy, save_hf_model
from rmkit.trainer.lifecycle import RunResult, start_run
from rmkit.trainer.loop import RecipeParts, StepReport, check_finite, fit
from rmkit.trainer.optim import (
    clip_gradients,
    joint_optimizer,
    learning_rate,
    lr_factor,
    schedule_by_model,
    step_optimizer,
)
from rmkit.trainer.sharding import shard_policy, shard_reward_model
from rmkit.trainer.state import TrainState

CRITIC_CURVES = {"critic": ["train/critic/loss", "train/critic/explained_var"]}


def train(cfg: PPOConfig) -> RunResult:
    """Optimize the policy against the reward model with a learned critic as `cfg` says; the policy goes to
    `<checkpoint_dir>/final/`, the critic to `final/critic/`."""
    run = start_run(cfg, cfg.ppo)  # threads, seed, torchrun, folders, the saved config
    check_rollout_split(cfg.ppo, cfg.policy, dist.world_size())
    check_environment(cfg.env.reward_model)  # a wrong reward-model path fails before the policy loads
    if cfg.value.model_name is not None:  # a wrong critic path fails before the policy loads too
        check_critic_path(cfg.value.model_name, "value.model_name")

    # --- policy, reference, critic, then the RL loop's state: reward environment, prompts, generator, KL, watch
    policy, tokenizer = load_training_policy(cfg.policy, run.device)
    reference = reference_policy(policy, cfg.policy, run.info, needed=cfg.loss_fn.reference_policy_kl_penalty > 0)
    critic_cfg, critic, critic_tokenizer = build_critic(cfg, tokenizer, run.device)
    if cfg.policy.dtensor_cfg.enabled:  # FSDP2 under torchrun: both models sharded in place (gradients summed)
        shard_policy(policy, cfg.policy, run.info)
        shard_reward_model(critic, critic_cfg, run.info)
    trained_policy = policy if cfg.policy.dtensor_cfg.enabled else dist.wrap_data_parallel(policy, run.info)
    values_forward = TokenValues(critic)
    trained_values = values_forward if cfg.policy.dtensor_cfg.enabled else dist.wrap_data_parallel(values_forward,
                                                                                                  run.info)
    rl = RLLoop(cfg, cfg.ppo, run, tokenizer)

    # --- one optimizer over both models (named groups; the policy's learning rate 0 during critic warmup)
    updates_per_step = cfg.ppo.ppo_epochs * rl.rollout_size // cfg.policy.train_global_batch_size
    both = ActorCritic(policy, critic)
    optimizer = joint_optimizer({"policy": (policy, cfg.policy.optimizer), "critic": (critic, critic_cfg.optimizer)})
    warmup = cfg.ppo.policy_training_start_step * updates_per_step
    total = rl.steps * updates_per_step

    def policy_factor(update: int) -> float:
        return 0.0 if update < warmup else lr_factor(update - warmup, cfg.policy.scheduler, max(1, total - warmup))

    def critic_factor(update: int) -> float:
        return lr_factor(update, critic_cfg.scheduler, total)

    scheduler = schedule_by_model(optimizer, {"policy": policy_factor, "critic": critic_factor})
    state = TrainState(both, optimizer, scheduler, rl.sampler)
    models = Models(policy, trained_policy, critic, trained_values, reference)
    value_loss_fn = MseValueLossFn(cfg.value_loss_fn)

    def step(indices: list[int]) -> StepReport:
        started = time.perf_counter()
        if state.step == cfg.ppo.policy_training_start_step > 0 and dist.is_main():
            print(f"rmkit: critic warmup done ({state.step} steps); the policy trains from here on", file=sys.stderr)
        metrics = ppo_step(cfg, critic_cfg, state, models, tokenizer, rl.env, rl.loss_fn(), value_loss_fn,
                           rl.prompts(indices), cfg.policy.generation, rl.generator)
        # In critic warmup the policy is the reference: the KL coefficient waits.
        report = rl.report(metrics, started, state.step + 1, kl_moves=state.step + 1 > cfg.ppo.policy_training_start_step)
        report.shown["vloss"] = metrics["train/critic/loss"]
        return report

    def restore(saved: dict) -> None:
        rl.restore(saved)
        set_value_offset(critic, saved.get("value_offset", value_offset(critic)))

    # --- the loop, the last checkpoint (the RL loop's state and the critic's offset), the export of both models
    # (rank 0: policy in final/, critic in final/critic/), plots
    try:
        return fit(run, state, rl.steps, cfg.ppo, RecipeParts(
            action=f"PPO on {cfg.policy.model_name} with a critic", length=f"{rl.length}, {cfg.ppo.ppo_epochs} epochs each",
            step=step, validate=rl.validation(policy, tokenizer), tokenizer=tokenizer,
            export=lambda whole, folder: export_both(whole, tokenizer, critic_tokenizer, folder, cfg,
                                                     value_offset(critic)),
            load_unsharded=lambda: ActorCritic(load_training_policy(cfg.policy, torch.device("cpu"))[0],
                                               build_critic(cfg, tokenizer, torch.device("cpu"), False)[1]),
            plots=rl.plots("ppo_curves.png", CRITIC_CURVES),
            loop_state=lambda: {"value_offset": value_offset(critic), **rl.state()}, restore=restore))
    finally:
        rl.env.shutdown()


def critic_source(cfg: PPOConfig, policy_tokenizer) -> tuple[str, str]:
    """`(model, why)`: what the critic starts from (the module docstring says how it is chosen)."""
    if cfg.value.model_name is not None:
        return cfg.value.model_name, "value.model_name"
    rm = cfg.env.reward_model
    if rm.model_name is None:
        return cfg.policy.model_name, "the policy's weights with a fresh value head (the reward model is a server)"
    rm_path = resolve_model_name(rm.model_name)
    if not is_scalar_classifier(rm_path):
        return cfg.policy.model_name, "the policy's weights with a fresh value head (the reward model has no scalar head)"
    if not shares_vocabulary(policy_tokenizer, load_tokenizer(rm_path)):
        return cfg.policy.model_name, ("the policy's weights with a fresh value head (the reward model's tokenizer is "
                                       "not the policy's)")
    return rm.model_name, "the reward model"


def build_critic(cfg: PPOConfig, policy_tokenizer, device: torch.device, say: bool = True):
    """`(the critic's settings as a PolicyConfig, the critic, its tokenizer)` on `device`, ready to train; `say`:
    print (rank 0) what it started from and why. A critic that cannot read the policy's tokens is refused
    (ConfigError on `value.model_name`); a reward model that cannot be one leaves the choice to the policy."""
    name, why = critic_source(cfg, policy_tokenizer)
    try:
        critic, critic_tokenizer, kept_head = load_critic(resolve_model_name(name))
    except ValueError as err:
        if why != "the reward model":
            raise ConfigError("value.model_name", str(err)) from None
        name, why = cfg.policy.model_name, f"the policy's weights with a fresh value head ({err.args[0].split(':')[0]})"
        critic, critic_tokenizer, kept_head = load_critic(resolve_model_name(name))
    if not shares_vocabulary(policy_tokenizer, critic_tokenizer):
        raise ConfigError("value.model_name", f"{name}'s tokenizer is not the policy's ({cfg.policy.model_name}): the "
                          "critic reads the policy's token ids, so it needs the same vocabulary. Pass a critic trained "
                          "on the policy's tokenizer, or value.model_name=null (the policy's own weights)")
    critic_cfg = cfg.value.as_policy(cfg.policy, name)
    critic = prepare_model(critic, critic_cfg).to(device)
    critic.train()
    if say and dist.is_main():
        head = "its own head" if kept_head else "a fresh scalar head"
        print(f"rmkit: critic: {name} ({type(critic).__name__}, {head}): {why}", file=sys.stderr)
    return critic_cfg, critic, critic_tokenizer


@dataclass
class Models:
    """What one PPO step runs: the policy (and its DDP wrapper), the critic (and the values forward, wrapped),
    the reference (a context-manager factory, or None)."""

    policy: torch.nn.Module
    trained_policy: torch.nn.Module
    critic: torch.nn.Module
    trained_values: torch.nn.Module
    reference: Callable | None


def ppo_step(cfg, critic_cfg, state, models: Models, tokenizer, env, loss_fn, value_loss_fn, prompts, params,
             generator) -> dict[str, float]:
    """One rollout and its `ppo_epochs` passes; returns the step's metrics (NeMo RL's names, the critic's under
    `train/critic/`)."""
    timing, policy_cfg = {}, cfg.policy
    rollout, rewards = sample_and_score(cfg, cfg.ppo, models.policy, tokenizer, env, prompts, state.step, generator,
                                        timing)
    t0 = time.perf_counter()
    batch = with_value_mask(training_batch(rollout, tokenizer.pad_token_id), rollout, cfg, tokenizer.pad_token_id)
    batch["values"] = batch_values(models, batch, critic_cfg)
    timing["value_inference"], t0 = time.perf_counter() - t0, time.perf_counter()
    if cfg.ppo.prev_logprobs_from_generation:
        batch["prev_logprobs"] = batch["generation_logprobs"]
    else:
        batch["prev_logprobs"] = batch_logprobs(models.policy, batch, policy_cfg.train_micro_batch_size,
                                                params.temperature, policy_cfg.precision)
    if models.reference is not None:
        batch["reference_policy_logprobs"] = reference_logprobs(models.reference, models.policy, batch, policy_cfg,
                                                                params.temperature)
    timing["policy_and_reference_logprobs"], t0 = time.perf_counter() - t0, time.perf_counter()
    mismatch = mask_logprob_mismatch(batch, cfg.ppo.seq_logprob_error_threshold)
    kl_penalty = loss_fn.cfg["reference_policy_kl_penalty"]
    if cfg.value.calibrate_offset and state.step == 0:
        calibrate_critic(cfg, models.critic, batch, rewards, kl_penalty)
    batch["advantages"], batch["returns"] = compute_advantages(cfg, rewards, batch, kl_penalty)
    batch["rewards"] = rewards
    train_policy = state.step >= cfg.ppo.policy_training_start_step
    train_metrics = update_actor_critic(cfg, critic_cfg, state, models, batch, loss_fn, value_loss_fn,
                                        params.temperature, train_policy)
    timing["training"] = time.perf_counter() - t0
    metrics = {**rollout_metrics(rollout, rewards, batch, timing["generation"]), **train_metrics, **mismatch,
               "train/critic/value_offset": value_offset(models.critic)}
    return {**metrics, **{f"timing/train/{k}": v for k, v in timing.items()}}


def with_value_mask(batch: dict, rollout, cfg, pad_id: int) -> dict:
    """`batch` with `value_mask`, the states the critic values and learns: the completion tokens' (`token_mask`)
    and, with `ppo.score_after_end`, the state after the last token of each completion that finished before
    `max_new_tokens` (the position past it, where the reward then goes: a pad token appended and attended there,
    so that the critic's head at the last token lands on it; the policy never trains on it, and it changes
    nothing before it). The batch grows by a column when a longest row needs one."""
    batch["value_mask"] = batch["token_mask"].clone()
    if not cfg.ppo.score_after_end:
        return batch
    limit = cfg.policy.generation.max_new_tokens
    finished = [not cut and len(ids) < limit for cut, ids in zip(rollout.truncated.tolist(), rollout.completion_ids)]
    rows = torch.tensor(finished, dtype=torch.bool).nonzero().flatten()
    if len(rows) == 0:
        return batch
    ends = batch["attention_mask"][rows].sum(1)
    if int(ends.max()) == batch["input_ids"].shape[1]:
        batch = {k: torch.cat([v, torch.full_like(v[:, :1], pad_id if k == "input_ids" else 0)], 1)
                 if v.dim() == 2 else v for k, v in batch.items()}
    batch["input_ids"][rows, ends] = pad_id
    batch["attention_mask"][rows, ends] = 1
    batch["value_mask"][rows, ends] = 1
    return batch


@torch.no_grad()
def batch_values(models: Models, batch: dict, critic_cfg) -> torch.Tensor:
    """`[N, S]` values aligned with input_ids (`aligned_values`): the critic's at the rollout, before any update."""
    out = torch.zeros(batch["input_ids"].shape, dtype=torch.float32)
    device, micro = next(models.critic.parameters()).device, critic_cfg.train_micro_batch_size
    for start in range(0, len(out), micro):
        mb = slice_rows(batch, start, start + micro, device)
        head, _ = critic_head(models.trained_values, models.critic, mb, critic_cfg.precision)
        values = from_continuation_view(aligned_values(head), mb)
        out[start:start + micro, :values.shape[1]] = values.cpu()
    return out


def critic_head(values_forward, critic, mb: dict, precision: str) -> tuple[torch.Tensor, dict]:
    """`(head [B, W], view)`: the critic's head at the rows of `view = continuation_view(mb)` (as
    `policy_logits` gives the policy's logits), each prompt computed once."""
    with autocast(precision, mb["input_ids"].device):
        head = shared_prefix_values(values_forward, critic, prompt_groups(mb), pad_token_id=0, continuations_only=True)
    return head, continuation_view(mb)


def calibrate_critic(cfg, critic, batch: dict, rewards: torch.Tensor, kl_penalty: float) -> None:
    """`value.calibrate_offset`: the constant `c` that makes the critic's mean value over every rank's response
    tokens equal their mean Monte Carlo return (GAE's returns at lambda 1: the reward, less the KL in it, summed
    from each token on), added to the critic's offset and taken off `batch["values"]`; rank 0 says what it did."""
    monte_carlo = replace(cfg.ppo.adv_estimator, gae_lambda=1.0, gae_lambda_value=None, gae_lambda_policy=None,
                          length_adaptive_alpha=0.0, normalize_advantages=False)
    _, returns = compute_advantages(cfg, rewards, batch, kl_penalty, monte_carlo)
    mask = response_mask(batch["value_mask"], batch["sample_mask"]).to(torch.float64)
    sums = torch.stack([(batch["values"] * mask).sum(), (returns * mask).sum(), mask.sum()])
    value_sum, return_sum, tokens = dist.all_reduce_sum(sums).tolist()
    if tokens == 0:
        return
    mean_value, mean_return = value_sum / tokens, return_sum / tokens
    set_value_offset(critic, value_offset(critic) + mean_value - mean_return)
    batch["values"] = batch["values"] - (mean_value - mean_return)
    if dist.is_main():
        print(f"rmkit: critic: values shifted by {mean_return - mean_value:+.4f}: on the first rollout they averaged "
              f"{mean_value:.4f} over the response tokens, the returns {mean_return:.4f} (value.calibrate_offset)",
              file=sys.stderr)


def compute_advantages(cfg, rewards: torch.Tensor, batch: dict, kl_penalty: float,
                       estimator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and returns `[N, S]` (`estimator`, default `ppo.adv_estimator`), the KL in the reward with
    `kl_penalty` when `loss_fn.use_kl_in_reward`, whitened over every rank's tokens when the estimator says so;
    the rewards at the last `value_mask` position, the returns over `value_mask` (`with_value_mask`)."""
    gae, loss = estimator or cfg.ppo.adv_estimator, cfg.loss_fn
    return gae_advantages(
        rewards, batch["values"], response_mask(batch["token_mask"], batch["sample_mask"]),
        value_mask=response_mask(batch["value_mask"], batch["sample_mask"]), gae_gamma=gae.gae_gamma,
        gae_lambda=gae.gae_lambda, normalize_advantages=gae.normalize_advantages,
        gae_lambda_value=gae.gae_lambda_value, gae_lambda_policy=gae.gae_lambda_policy,
        length_adaptive_alpha=gae.length_adaptive_alpha, use_kl_in_reward=loss.use_kl_in_reward,
        reference_policy_kl_penalty=kl_penalty, reference_policy_kl_type=loss.reference_policy_kl_type,
        logprobs=batch["prev_logprobs"], reference_logprobs=batch.get("reference_policy_logprobs"),
        all_reduce_sum=dist.all_reduce_sum)


def update_actor_critic(cfg, critic_cfg, state, models: Models, batch, loss_fn, value_loss_fn, temperature,
                        train_policy: bool) -> dict[str, float]:
    """`ppo_epochs` passes over the rollout, one optimizer step per `train_global_batch_size` completions (this
    rank: its share): the critic's value loss and (when `train_policy`) the policy's loss over their own
    micro-batches, divided by the global counts; a non-finite loss stops the run before its update. Returns
    the policy's loss metrics and the critic's (`train/critic/...`, with `explained_var`), averaged over the
    optimizer steps (min / max reduced)."""
    policy_cfg, world = cfg.policy, dist.world_size()
    device = next(models.policy.parameters()).device
    per_rank = policy_cfg.train_global_batch_size // world
    policy_micro, critic_micro = policy_cfg.train_micro_batch_size, critic_cfg.train_micro_batch_size
    policy_steps, critic_steps = [], []
    for epoch in range(cfg.ppo.ppo_epochs):
        epoch_batch = epoch_rows(batch, cfg.ppo, state.step, epoch)
        for start in range(0, len(batch["input_ids"]), per_rank):
            rows = slice_rows(epoch_batch, start, start + per_rank)
            sample_mask = rows["sample_mask"]
            counts = torch.stack([sample_mask.sum()] + [(rows[k][:, 1:] * sample_mask[:, None]).sum()
                                                         for k in ("token_mask", "value_mask")])
            gvs, gvt, value_gvt = dist.all_reduce_sum(counts.to(device)).unbind()

            def critic_micro_loss(m, rows=rows, gvs=gvs, gvt=value_gvt):
                mb = slice_rows(rows, m, m + critic_micro, device)
                head, view = critic_head(models.trained_values, models.critic, mb, critic_cfg.precision)
                return value_loss_fn(head, {**view, "token_mask": view["value_mask"]}, gvs, gvt)

            def policy_micro_loss(m, rows=rows, gvs=gvs, gvt=gvt):
                mb = slice_rows(rows, m, m + policy_micro, device)
                logits, view = policy_logits(models.trained_policy, mb, temperature, policy_cfg.precision)
                loss, metrics = loss_fn(logits, view, gvs, gvt)
                metrics["clipped_fraction"] = clipped_fraction(cfg.loss_fn, logits.detach(), view, gvt)
                return loss, metrics

            critic_metrics = reduce_metrics(accumulate(models.trained_values, list(range(0, per_rank, critic_micro)),
                                                       critic_micro_loss))
            check_finite(global_loss(critic_metrics, device), state, "Lower value.optimizer.lr (now "
                         f"{critic_cfg.optimizer.lr}), set value.max_grad_norm or value_loss_fn.cliprange.")
            if train_policy:
                policy_metrics = reduce_metrics(accumulate(models.trained_policy, list(range(0, per_rank, policy_micro)),
                                                           policy_micro_loss))
                check_finite(global_loss(policy_metrics, device), state, "Lower policy.optimizer.lr (now "
                             f"{policy_cfg.optimizer.lr}), set policy.max_grad_norm, or check the rewards.")
                policy_metrics["lr"] = learning_rate(state.optimizer, "policy")
                policy_metrics["grad_norm"] = clip_gradients(models.policy, policy_cfg.max_grad_norm)
                policy_steps.append(policy_metrics)
            critic_metrics["lr"] = learning_rate(state.optimizer, "critic")
            critic_metrics["grad_norm"] = clip_gradients(models.critic, critic_cfg.max_grad_norm)
            critic_steps.append(critic_metrics)
            step_optimizer(state.optimizer, state.scheduler)
    critic = mean_over_updates(critic_steps, prefix="train/critic/")
    critic["train/critic/explained_var"] = sum(
        float(value_explained_variance({k: dist.all_reduce_sum(torch.as_tensor(s[k], dtype=torch.float64))
                                        for k in ("returns_mean", "values_mean", "returns_sq_mean", "residual_sq_mean")}))
        for s in critic_steps) / len(critic_steps)
    # In critic warmup the policy is still the reference (KL 0) and learns at lr 0: no loss to report.
    policy = mean_over_updates(policy_steps) if policy_steps else {"train/kl_penalty": 0.0, "train/lr": 0.0}
    return {**policy, **critic}


def epoch_rows(batch: dict, loop, step: int, epoch: int) -> dict:
    """This rank's rollout as epoch `epoch` of step `step` takes it: as it is, or with `ppo.shuffle_minibatches`
    its rows in an order drawn from (seed, step, epoch), so that a resumed run draws the same."""
    if not loop.shuffle_minibatches:
        return batch
    order = torch.from_numpy(np.random.default_rng([loop.seed, step, epoch]).permutation(len(batch["input_ids"])))
    return {k: v[order] for k, v in batch.items()}


def global_loss(metrics: dict, device: torch.device) -> float:
    """The global batch's loss from this rank's share, read on the host (for the finite check)."""
    return float(dist.all_reduce_sum(torch.as_tensor(metrics["loss"], device=device).detach().clone()))


def export_both(both: ActorCritic, tokenizer, critic_tokenizer, folder: Path, cfg: PPOConfig, offset: float) -> None:
    """The policy as a causal LM in `folder`, the critic as a sequence classifier in `folder/critic` with its value
    `offset` in its config (`rmkit.models.critic`)."""
    export_policy(both.policy, tokenizer, folder, cfg)
    set_value_offset(both.critic, offset)
    save_hf_model(both.critic, critic_tokenizer, folder / "critic")
