"""`rmkit dpo --config CONFIG.yaml [section.key=value ...]`: train a policy with DPO."""

from __future__ import annotations

import argparse
import sys

from rmkit.cli.recipe_args import recipe_config, recipe_parser


def build_parser() -> argparse.ArgumentParser:
    return recipe_parser(
        "rmkit dpo",
        "Train a policy (causal LM) on preference pairs with DPO. Overrides use dotted keys, e.g. "
        "dpo.max_num_steps=20 dpo.reference_policy_kl_penalty=0.1 policy.optimizer.lr=1e-6",
        "YAML config (default: all defaults; see configs/dpo.yaml)",
    )


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from rmkit.recipes.dpo_config import DPOTree

    cfg = recipe_config(args, DPOTree)

    from rmkit.errors import TrainingDiverged
    from rmkit.recipes.dpo import train  # heavy imports only once the config is valid

    try:
        result = train(cfg)
    except TrainingDiverged as err:
        print(f"rmkit dpo: training failed: {err}", file=sys.stderr)
        return 1
    from rmkit import distributed as dist

    if not dist.is_main():  # under torchrun, rank 0 reports
        return 0
    print(f"rmkit: trained {result.steps} steps at {result.rates['pairs/s']:.2f} pairs/s, "
          f"{result.rates['tokens/s']:.0f} tokens/s (training only; validation and the reference pass excluded)",
          file=sys.stderr)
    if result.val_metrics:
        print("rmkit: last validation: " + ", ".join(f"{k} {v:.4f}" for k, v in result.val_metrics.items()
                                                     if k.endswith(("/loss", "/accuracy"))), file=sys.stderr)
    d = result.final_dir
    print(f"""
Policy saved to {d}
  logs and metrics: {result.log_dir}/metrics.jsonl (tensorboard --logdir {result.log_dir})
  sample generations: {result.log_dir}/samples.jsonl

Use it:
  python -c "from transformers import AutoModelForCausalLM as M, AutoTokenizer as T; \\
m = M.from_pretrained('{d}'); t = T.from_pretrained('{d}'); \\
ids = t.apply_chat_template([{{'role': 'user', 'content': 'Hi!'}}], add_generation_prompt=True, return_tensors='pt'); \\
print(t.decode(m.generate(ids, max_new_tokens=40)[0]))"
""")
    return 0
