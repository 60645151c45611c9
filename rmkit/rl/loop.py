"""What GRPO and PPO share around their own step (`RLLoop`): the reward environment, the prompts and the seeded
sampling generator, the adaptive KL coefficient and the reward-hacking watch, what checkpoints keep of them, the
held-out validation, and the bookkeeping after each step. A recipe keeps what is its own: its step (GRPO's group
advantages; PPO's critic and GAE) and its models."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from rmkit import distributed as dist
from rmkit.env import environment_for
from rmkit.losses.policy_gradient import ClippedPGLossFn
from rmkit.rl.guards import HackingWatch, KLCoefficient
from rmkit.rl.rollout import rollout_sources
from rmkit.rl.validation import run_validation, warn
from rmkit.trainer.datasets import PromptItem
from rmkit.trainer.lifecycle import Run
from rmkit.trainer.logging.plots import plot_curves
from rmkit.trainer.loop import StepReport
from rmkit.trainer.state import total_steps

CURVES = {"reward": ["train/reward", "validation/reward_mean"], "KL to the reference": ["train/kl_penalty"],
          "generated tokens": ["train/mean_gen_tokens_per_sample", "validation/mean_gen_tokens_per_sample"]}


class RLLoop:
    """An RL run's loop state besides the weights; `loop`: the recipe's loop section (`grpo.*`, `ppo.*`). Built
    once the models are (it loads the reward environment), before the first step."""

    def __init__(self, cfg, loop, run: Run, tokenizer):
        self.cfg, self.loop, self.run = cfg, loop, run
        self.env = environment_for(cfg.env.reward_model)
        self.train_prompts, self.val_prompts, self.sampler, self.generator = rollout_sources(cfg, loop, tokenizer,
                                                                                             run.out_dir)
        self.rollout_size = loop.num_prompts_per_step * loop.num_generations_per_prompt
        self.steps = total_steps(loop, len(self.sampler))
        self.kl = KLCoefficient(cfg.loss_fn.reference_policy_kl_penalty, loop.kl_target, loop.kl_horizon)
        self.watch = HackingWatch.of(loop)

    @property
    def length(self) -> str:
        """The run's length in the announcement's words."""
        return (f"{self.steps} step{'' if self.steps == 1 else 's'} of {self.loop.num_prompts_per_step} prompts x "
                f"{self.loop.num_generations_per_prompt}")

    def prompts(self, indices: list[int]) -> list[PromptItem]:
        return [self.train_prompts[i] for i in indices]

    def loss_fn(self) -> ClippedPGLossFn:
        """The policy's loss with the KL coefficient as it stands."""
        return ClippedPGLossFn(replace(self.cfg.loss_fn, reference_policy_kl_penalty=self.kl.value))

    def report(self, metrics: dict[str, float], started: float, step: int, kl_moves: bool = True) -> StepReport:
        """Step `step`'s metrics with its total time and KL coefficient, after which the coefficient moves (when
        `kl_moves`) and the hacking watch looks at the KL; shown on the bar: reward, KL, completion length."""
        metrics["timing/train/total_step_time"] = time.perf_counter() - started
        metrics["train/kl_coefficient"] = self.kl.value
        if kl_moves:
            self.kl.update(metrics["train/kl_penalty"], self.rollout_size)
        warn(self.watch.after_step(step, metrics["train/kl_penalty"]), self.run.logger, step)
        return StepReport(metrics, shown={"reward": metrics["train/reward"], "kl": metrics["train/kl_penalty"],
                                          "gen_tokens": metrics["train/mean_gen_tokens_per_sample"]})

    def validation(self, model, tokenizer):
        """`fit`'s validation: one sampled completion per held-out prompt, scored (None: no held-out prompts)."""
        if not any(self.val_prompts.values()):
            return None
        return lambda at: run_validation(self.loop, model, tokenizer, self.env, self.val_prompts,
                                         self.cfg.policy.generation, self.run.logger, self.run.log_dir, at, self.watch)

    def plots(self, name: str, curves: dict | None = None):
        """`fit`'s plots: the reward, KL and length curves (and `curves`) in `<log_dir>/<name>`."""
        return lambda history, log_dir: [plot_curves(history, Path(log_dir) / name, {**CURVES, **(curves or {})})]

    def state(self) -> dict:
        """What checkpoints keep: every rank's sampling generator (so the rollouts repeat exactly on resume; a
        collective: call on every rank), the KL coefficient and the hacking watch's state."""
        return {"generators": dist.all_gather_object(self.generator.get_state()), "kl_coefficient": self.kl.value,
                "hacking_watch": self.watch.state()}

    def restore(self, saved: dict) -> None:
        """`state()` back from a checkpoint (rank 0's generator when the process count changed)."""
        generators = saved["generators"]
        self.generator.set_state(generators[dist.rank()] if len(generators) == dist.world_size() else generators[0])
        self.kl.value = saved.get("kl_coefficient", self.kl.value)
        if "hacking_watch" in saved:
            self.watch.load(saved["hacking_watch"])

