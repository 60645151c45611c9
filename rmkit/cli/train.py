"""`rmkit train --config CONFIG.yaml [section.key=value ...]`."""

from __future__ import annotations

import argparse
import sys

from rmkit.cli.recipe_args import recipe_config, recipe_parser


def build_parser() -> argparse.ArgumentParser:
    return recipe_parser(
        "rmkit train",
        "Train a reward model. Overrides use dotted keys, e.g. policy.optimizer.lr=1e-5 "
        "rm.max_num_steps=100 data.val_data_paths.hh=../shared/data/hh_harmless_val.jsonl",
        "YAML config (default: all defaults = configs/default.yaml's run)",
    )


def usage_text(result) -> str:
    """What to do with the trained model next."""
    d = result.final_dir
    return f"""
Reward model saved to {d}
  logs and metrics: {result.log_dir}/metrics.jsonl (tensorboard --logdir {result.log_dir})
  plots:            {', '.join(str(p) for p in result.plots) or '(none)'}

Use it:
  rmkit eval  --model {d} --data FILE.jsonl
  rmkit score --model {d} --input FILE.jsonl --output scored.jsonl
  rmkit serve --model {d}
  python -c "from transformers import AutoModelForSequenceClassification as M, AutoTokenizer as T; \\
m = M.from_pretrained('{d}'); t = T.from_pretrained('{d}'); \\
print(m(**t('Question? Answer.', return_tensors='pt')).logits)"
"""


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    cfg = recipe_config(args)

    from rmkit.errors import TrainingDiverged
    from rmkit.recipes.rm import train  # heavy imports only once the config is valid

    try:
        result = train(cfg)
    except TrainingDiverged as err:
        print(f"rmkit train: training failed: {err}", file=sys.stderr)
        return 1
    from rmkit import distributed as dist

    if not dist.is_main():  # under torchrun, rank 0 reports
        return 0
    print(f"rmkit: trained {result.steps} steps at {result.rates['pairs/s']:.2f} pairs/s, "
          f"{result.rates['tokens/s']:.0f} tokens/s (training only, validation excluded)", file=sys.stderr)
    if result.val_metrics:
        print("rmkit: final validation: " + ", ".join(
            f"{k} {v:.4f}" for k, v in result.val_metrics.items() if k.endswith(("/acc", "/loss"))), file=sys.stderr)
    print(usage_text(result))
    return 0
