"""`rmkit eval --model DIR --data FILE [--format F] [--json]`: the reward-model metrics of docs/design.md
(loss, acc, reward means and std, num_pairs) of a model directory on a preference file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from rmkit.data import FORMATS, load_preference_data, write_rejects
from rmkit.errors import ConfigError
from rmkit.inference import RewardScorer, load_scorer
from rmkit.trainer.validate import pair_metrics


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by `eval` and `score`."""
    parser.add_argument("--model", required=True, help="reward model directory (rmkit export or any HF classifier)")
    parser.add_argument("--max-length", type=int, default=None,
                        help="tokens per input (default: the model's scoring_contract.json, which every rmkit "
                             "path reads; else the model's position limit); longer inputs keep their end")
    parser.add_argument("--precision", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--batch-tokens", type=int, default=16384, help="padded tokens per forward pass")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def load_for_inference(args: argparse.Namespace) -> RewardScorer:
    """The inference core's scorer of `args.model` on the best device."""
    if not Path(args.model).exists() and "/" not in args.model:
        raise ConfigError("--model", f"no such model directory: {args.model}")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return load_scorer(args.model, device=device, precision=args.precision, max_length=args.max_length,
                       max_batch_tokens=args.batch_tokens)


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
    scorer = load_for_inference(args)
    loaded = load_preference_data(args.data, format=args.format, prompt_key=args.prompt_key,
                                  chosen_key=args.chosen_key, rejected_key=args.rejected_key,
                                  on_error="skip" if args.skip_bad else "raise")
    tokenized = scorer.encode_pairs(loaded.records)
    if loaded.skipped:
        write_rejects(args.rejects, loaded.skipped)
        print(f"rmkit eval: skipped {len(loaded.skipped)} records (see {args.rejects})", file=sys.stderr)
    rewards = scorer.score_ids([ids for p in tokenized.pairs for ids in (p.chosen_ids, p.rejected_ids)])
    metrics = pair_metrics(rewards[0::2, 0], rewards[1::2, 0])
    metrics["truncated"] = tokenized.truncated
    metrics["skipped"] = len(loaded.skipped)
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
