"""`rmkit merge MODEL MODEL [MODEL ...] --output DIR`: average reward models fine-tuned from one base into
one model (WARM, Ramé et al. 2024), with a valid scoring contract.

The models must share an architecture, a tokenizer, a scoring contract and a base; a mismatch is refused
with one line. The merged folder scores like any rmkit export (`rmkit eval`, `score`, `serve`); it has no
reward statistics until measured, and `merge.json` records what was averaged.
"""

from __future__ import annotations

import argparse

from rmkit.cli import description


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rmkit merge", description=description(__doc__))
    parser.add_argument("models", nargs="+", metavar="MODEL",
                        help="reward model folders to average (e.g. each seed's final/), two or more")
    parser.add_argument("--output", required=True, help="a new folder for the merged model")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    # torch and transformers load only once the arguments parse
    from rmkit.trainer.merge import merge_reward_models

    record = merge_reward_models(args.models, args.output)
    distances = ", ".join(f"{d:.2%}" for d in record["backbone_distance_from_first"][1:])
    print(f"rmkit merge: averaged {len(record['models'])} models into {args.output} "
          f"(backbone distance from the first: {distances})")
    return 0
