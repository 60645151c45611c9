"""The RL recipes' guards against reward hacking (GRPO and PPO): the KL coefficient, fixed or adaptive, and the
warnings when a run shows the usual signs of a policy gaming its reward model.

A reward model trained on harmlessness data pays for saying little: a policy optimized against it learns to
answer in two tokens, the held-out reward rises, and only the completion length and the KL to the reference
say what happened. `KLCoefficient` holds the KL near `kl_target` when one is set (InstructGPT-style PPO,
OpenRLHF's `kl_target` / `kl_horizon`); `HackingWatch` turns the numbers into a sentence when the held-out
length collapses below a share of its step-0 value or the KL runs away.
"""

from __future__ import annotations

from dataclasses import dataclass

# Without a kl_target, a per-token KL above this (nats, `train/kl_penalty`) counts as running away.
KL_RUNAWAY_WITHOUT_TARGET = 1.0


@dataclass
class KLCoefficient:
    """`value`: the coefficient of the KL to the reference (`loss_fn.reference_policy_kl_penalty` at the start).
    With a `target`, `update` moves it after each step: `value *= 1 + clip(kl / target - 1, -0.2, 0.2) * n /
    horizon`, n the step's completions."""

    value: float
    target: float | None = None
    horizon: int = 10000

    def update(self, kl: float, completions: int) -> None:
        if self.target is None or self.value == 0:
            return
        error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * completions / self.horizon


@dataclass
class HackingWatch:
    """Warnings (a sentence naming the step and the numbers) when the held-out mean completion length falls below
    `length_ratio` of step 0's, or the step's KL exceeds `kl_factor` times the target. Each warns when it
    starts, not at every step while it lasts; `state` goes into checkpoints."""

    length_ratio: float
    kl_factor: float
    kl_target: float | None
    baseline_length: float | None = None
    baseline_step: int = 0
    length_alarm: bool = False
    kl_alarm: bool = False

    @classmethod
    def of(cls, loop) -> HackingWatch:
        return cls(loop.length_collapse_ratio, loop.kl_runaway_factor, loop.kl_target)

    def after_validation(self, step: int, mean_length: float) -> str | None:
        """The held-out mean completion length at a validation; the first one (step 0 unless the run skips it) is
        the baseline."""
        if self.baseline_length is None:
            self.baseline_length, self.baseline_step = mean_length, step
            return None
        collapsed = self.length_ratio > 0 and mean_length < self.length_ratio * self.baseline_length
        warn = collapsed and not self.length_alarm
        self.length_alarm = collapsed
        if not warn:
            return None
        return (f"warning: at step {step} the held-out completions average {mean_length:.1f} tokens, below "
                f"{self.length_ratio:g} x their {self.baseline_length:.1f} at step {self.baseline_step}: the policy may be gaming "
                "the reward model by saying little (read samples.jsonl). Set or lower grpo/ppo.kl_target, raise "
                "loss_fn.reference_policy_kl_penalty, or penalize short answers (reward_shaping)")

    def after_step(self, step: int, kl: float) -> str | None:
        """The step's KL to the reference (per token, `train/kl_penalty`)."""
        if self.kl_factor == 0:
            return None
        limit = self.kl_factor * self.kl_target if self.kl_target is not None else KL_RUNAWAY_WITHOUT_TARGET
        running_away = kl > limit
        warn = running_away and not self.kl_alarm
        self.kl_alarm = running_away
        if not warn:
            return None
        against = (f"{self.kl_factor:g} x the target {self.kl_target:g}" if self.kl_target is not None
                   else f"{limit:g} (no kl_target is set)")
        return (f"warning: at step {step} the KL to the reference is {kl:.3f} nats per token, above {against}: "
                "the policy is moving far from where it started. Set or lower kl_target, or raise "
                "loss_fn.reference_policy_kl_penalty")

    def state(self) -> dict:
        return {"baseline_length": self.baseline_length, "baseline_step": self.baseline_step,
                "length_alarm": self.length_alarm, "kl_alarm": self.kl_alarm}

    def load(self, state: dict) -> None:
        self.baseline_length, self.baseline_step = state["baseline_length"], state["baseline_step"]
        self.length_alarm, self.kl_alarm = state["length_alarm"], state["kl_alarm"]
