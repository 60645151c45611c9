"""`rmkit sft --config configs/sft.yaml [section.key=value ...]`: supervised fine-tuning of a policy."""

from __future__ import annotations

import argparse
import sys

from rmkit.cli.recipe_args import recipe_config, recipe_parser


def build_parser() -> argparse.ArgumentParser:
    return recipe_parser(
        "rmkit sft",
        "Fine-tune a policy (any causal LM) on demonstrations: chat `messages`, prompt/response "
        "records or the chosen side of preference data. Overrides use dotted keys, e.g. "
        "policy.optimizer.lr=1e-5 sft.max_num_steps=100 data.train_data_path=demos.jsonl",
        "YAML config (default: all defaults, SmolLM2 on rmkit's small preference set)",
    )


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from rmkit.recipes.sft_config import SFTTree

    cfg = recipe_config(args, SFTTree)

    from rmkit.errors import TrainingDiverged
    from rmkit.recipes.sft import train  # heavy imports only once the config is valid

    try:
        result = train(cfg)
    except TrainingDiverged as err:
        print(f"rmkit sft: training failed: {err}", file=sys.stderr)
        return 1
    from rmkit import distributed as dist

    if not dist.is_main():  # under torchrun, rank 0 reports
        return 0
    print(f"rmkit: trained {result.steps} steps at {result.rates['sequences/s']:.2f} sequences/s, "
          f"{result.rates['tokens/s']:.0f} tokens/s (training only, validation excluded)", file=sys.stderr)
    if result.val_metrics:
        print("rmkit: final validation: " + ", ".join(
            f"{k} {v:.4f}" for k, v in result.val_metrics.items() if k.endswith(("/loss", "/token_acc"))), file=sys.stderr)
    d = result.final_dir
    print(f"""
Policy saved to {d}
  logs and metrics: {result.log_dir}/metrics.jsonl (tensorboard --logdir {result.log_dir})
  sample generations: {result.log_dir}/samples.jsonl
  plots:            {', '.join(str(p) for p in result.plots) or '(none)'}

Use it:
  python -c "from transformers import AutoModelForCausalLM as M, AutoTokenizer as T; \\
m = M.from_pretrained('{d}'); t = T.from_pretrained('{d}'); \\
ids = t.apply_chat_template([{{'role': 'user', 'content': 'Hello!'}}], add_generation_prompt=True, return_tensors='pt'); \\
print(t.decode(m.generate(ids, max_new_tokens=64)[0]))"
""")
    return 0
