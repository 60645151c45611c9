"""The RL recipes' shared machinery (GRPO, PPO): the rollout, the policy's passes over it, the loop state around the
step, guards, held-out validation and what the clipped updates report."""
