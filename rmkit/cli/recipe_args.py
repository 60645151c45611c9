"""The command line every training recipe takes: `--config CONFIG.yaml [--resume] [section.key=value ...]`."""

from __future__ import annotations

import argparse

from rmkit.config import load_config


def recipe_parser(prog: str, description: str, config_help: str) -> argparse.ArgumentParser:
    """`--config`, `--resume` and the dotted overrides, for `rmkit <prog>`."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help=config_help)
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest valid checkpoint in checkpointing.checkpoint_dir "
                             "(= checkpointing.resume=auto)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    return parser


def recipe_config(args: argparse.Namespace, tree_type: type | None = None):
    """The recipe's config tree from `--config` and the overrides (`--resume` = `checkpointing.resume=auto`)."""
    return load_config(args.config, args.overrides + (["checkpointing.resume=auto"] if args.resume else []),
                       tree_type=tree_type)
