"""Held-out validation of the RL recipes (GRPO, PPO): one sampled completion per held-out prompt, scored by the
reward model, logged, written to samples.jsonl, and watched for a collapsing completion length
(`rmkit.rl.guards`)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from rmkit import distributed as dist
from rmkit.errors import TrainingDiverged
from rmkit.rl.guards import HackingWatch
from rmkit.rl.rollout import generate_rollout, score_rollout
from rmkit.trainer.logging.run_logger import RunLogger, append_samples


def run_validation(loop, model, tokenizer, env, val_sets: dict[str, list], params, logger: RunLogger, log_dir: Path,
                   step: int, watch: HackingWatch | None = None) -> dict:
    """One completion per held-out prompt (the first `max_val_samples` over the sets in order, this rank's
    share), sampled from a generator seeded the same way each time; logs `validation/reward_mean` (and std,
    length) and appends the generations with their rewards to `<log_dir>/samples.jsonl`. `loop`: `grpo.*` or
    `ppo.*`; `watch` gets the held-out length and may warn (printed and logged as a `warning` record)."""
    named = [(name, p) for name, prompts in val_sets.items() for p in prompts][:loop.max_val_samples]
    if not named:  # no data.val_data_paths
        return {}
    first, named = named[0][1], dist.shard(named)
    prompts, mine = [p for _, p in named], len(named)
    if dist.is_sharded(model):  # FSDP2: as many generate calls on every rank; the extra completions are dropped
        prompts += [first] * (int(dist.all_reduce(torch.tensor(mine), "max")) - mine)
    generator = torch.Generator().manual_seed(loop.seed + 7919 * (dist.rank() + 1))
    try:
        rollout = generate_rollout(model, tokenizer, prompts, 0, 1, params, loop.val_batch_size, generator)
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
    if watch is not None:
        warn(watch.after_validation(step, metrics["validation/mean_gen_tokens_per_sample"]), logger, step)
    return metrics


def warn(warning: str | None, logger: RunLogger, step: int) -> None:
    """A guard's warning, if any: printed (rank 0) and logged as `{"step": step, "warning": ...}`."""
    if warning is None:
        return
    logger.log({"warning": warning}, step)
    if dist.is_main():
        print(f"rmkit: {warning}", file=sys.stderr)
