"""`rmkit grpo --config CONFIG.yaml [section.key=value ...]`: optimize a policy against a reward model."""

from __future__ import annotations

import argparse
import sys

from rmkit.cli.recipe_args import recipe_config, recipe_parser


def build_parser() -> argparse.ArgumentParser:
    return recipe_parser(
        "rmkit grpo",
        "GRPO: optimize a policy (causal LM) against a reward model (in process or a running "
        "rmkit serve). Overrides use dotted keys, e.g. grpo.max_num_steps=20 "
        "env.reward_model.model_name=results/rm/final policy.generation.max_new_tokens=32",
        "YAML config (e.g. configs/grpo_rm.yaml; default: all defaults)",
    )


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from rmkit.recipes.grpo_config import GRPOConfig

    cfg = recipe_config(args, GRPOConfig)

    from rmkit.errors import TrainingDiverged
    from rmkit.recipes.grpo import train  # heavy imports only once the config is valid
    from rmkit.recipes.grpo_rollout import RolloutFailed

    try:
        result = train(cfg)
    except RolloutFailed as err:
        print(f"rmkit grpo: stopped: {err}", file=sys.stderr)
        return 1
    except TrainingDiverged as err:
        print(f"rmkit grpo: training failed: {err}", file=sys.stderr)
        return 1
    from rmkit import distributed as dist

    if not dist.is_main():
        return 0
    if result.val_metrics:
        print("rmkit: final validation: " + ", ".join(f"{k} {v:.4f}" for k, v in result.val_metrics.items()),
              file=sys.stderr)
    d = result.final_dir
    print(f"""
Policy saved to {d} ({result.steps} steps)
  logs and metrics: {result.log_dir}/metrics.jsonl (tensorboard --logdir {result.log_dir})
  sample generations: {result.log_dir}/samples.jsonl
  plots:            {', '.join(str(p) for p in result.plots) or '(none)'}

Use it:
  python -c "from transformers import AutoModelForCausalLM as M, AutoTokenizer as T; \\
m = M.from_pretrained('{d}'); t = T.from_pretrained('{d}'); \\
print(t.decode(m.generate(**t.apply_chat_template([{{'role': 'user', 'content': 'Hi'}}], add_generation_prompt=True, \\
return_tensors='pt', return_dict=True), max_new_tokens=32)[0]))"
""")
    return 0
