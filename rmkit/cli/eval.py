"""`rmkit eval --model DIR --data FILE [--format F] [--json]`: DESIGN.md's reward-model metrics of a model
directory on a preference file (loss, acc, reward means and std, num_pairs)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import yaml

from rmkit.data import FORMATS, load_preference_data, write_rejects
from rmkit.data.tokenize import tokenize_pairs
from rmkit.errors import ConfigError
from rmkit.models import load_reward_model
from rmkit.trainer.validate import pair_metrics, score_pairs

DEFAULT_MAX_LENGTH = 2048


def default_max_length(model_dir: str, model) -> int:
    """The training run's `policy.max_total_sequence_length` when the directory records it, else 2048,
    never more than the model's position limit (`max_position_embeddings`, 512 for BERT)."""
    length = DEFAULT_MAX_LENGTH
    config = Path(model_dir) / "rmkit_config.yaml"
    if config.is_file():
        values = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
        recorded = values.get("policy", {}).get("max_total_sequence_length")
        if isinstance(recorded, int):
            length = recorded
    limit = getattr(model.config, "max_position_embeddings", None)
    return min(length, limit) if isinstance(limit, int) else length


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by `eval` and `score`."""
    parser.add_argument("--model", required=True, help="reward model directory (rmkit export or any HF classifier)")
    parser.add_argument("--max-length", type=int, default=None,
                        help="tokens per sequence (default: the training run's, else 2048, capped at the model's position limit); longer ones keep their end")
    parser.add_argument("--precision", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--batch-tokens", type=int, default=16384, help="padded tokens per forward pass")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def load_for_inference(args: argparse.Namespace):
    """`(model, tokenizer, max_length)` on the best device, in eval mode."""
    if not Path(args.model).exists() and "/" not in args.model:
        raise ConfigError("--model", f"no such model directory: {args.model}")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_reward_model(args.model)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).eval()
    return model, tokenizer, args.max_length or default_max_length(args.model, model)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rmkit eval", description=__doc__.split("\n")[0])
    add_model_arguments(parser)
    parser.add_argument("--data", required=True, help="preference file (JSONL, JSON, Parquet) or HF dataset")
    parser.add_argument("--format", default="auto", choices=FORMATS, help="record format (default: sniffed)")
    parser.add_argument("--prompt-key", default="prompt")
    parser.add_argument("--chosen-key", default="chosen")
    parser.add_argument("--rejected-key", default="rejected")
    parser.add_argument("--skip-bad", action="store_true",
                        help="skip bad records (written to --rejects) instead of stopping at the first")
    parser.add_argument("--rejects", default="rejects-eval.jsonl", help="where skipped records go")
    parser.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    return parser


def evaluate(args: argparse.Namespace) -> dict:
    """The metrics of `args.model` on `args.data`."""
    model, tokenizer, max_length = load_for_inference(args)
    loaded = load_preference_data(args.data, format=args.format, prompt_key=args.prompt_key,
                                  chosen_key=args.chosen_key, rejected_key=args.rejected_key,
                                  on_error="skip" if args.skip_bad else "raise")
    tokenized = tokenize_pairs(loaded.records, tokenizer, max_length, overlong="truncate")
    skipped = list(loaded.skipped) + list(tokenized.dropped)
    if skipped:
        write_rejects(args.rejects, skipped)
        print(f"rmkit eval: skipped {len(skipped)} records (see {args.rejects})", file=sys.stderr)
    chosen, rejected = score_pairs(model, tokenized.pairs, tokenizer.pad_token_id, args.precision, args.batch_tokens)
    metrics = pair_metrics(chosen[:, 0], rejected[:, 0])
    metrics["truncated"] = tokenized.truncated
    metrics["skipped"] = len(skipped)
    return metrics


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    metrics = evaluate(args)
    if args.json:
        print(json.dumps(metrics))
    else:
        print(f"{args.data} scored by {args.model}")
        for key, value in metrics.items():
            print(f"  {key:<22} {value:.4f}" if isinstance(value, float) else f"  {key:<22} {value}")
    return 0
