"""`rmkit` command line: one entry point; the training recipes are one table (`rmkit.cli.recipes`), every
other subcommand a module of its own.

A tool module exposes `main(argv: list[str]) -> int` with its own argparse parser; modules are imported only
when their subcommand runs, so `rmkit data check` does not pay for the training stack.
"""

from __future__ import annotations

import importlib
import sys

from rmkit.errors import UserError

SUBCOMMANDS = {
    "train": ("rmkit.cli.recipes", "train a reward model from a YAML config"),
    "dpo": ("rmkit.cli.recipes", "train a policy on preference pairs with DPO"),
    "sft": ("rmkit.cli.recipes", "fine-tune a policy on demonstrations (supervised fine-tuning)"),
    "eval": ("rmkit.cli.eval", "validation metrics of a model on a preference file; --report: a RewardBench-style report"),
    "score": ("rmkit.cli.score", "write each record of a file back with its reward(s)"),
    "serve": ("rmkit.cli.serve", "HTTP scoring server for RL trainers"),
    "data": ("rmkit.cli.data", "check and inspect data files (preference pairs, step-labelled solutions)"),
    "merge": ("rmkit.cli.merge", "average reward models fine-tuned from one base (WARM) into one"),
    "parity": ("rmkit.cli.parity", "score a file through every path and report the largest reward difference"),
    "grpo": ("rmkit.cli.recipes", "optimize a policy against a reward model with GRPO (configs/grpo_rm.yaml)"),
    "ppo": ("rmkit.cli.recipes", "optimize a policy against a reward model with PPO and a critic (configs/ppo_rm.yaml)"),
}

USAGE = "usage: rmkit [--version] {" + ",".join(SUBCOMMANDS) + "} ...\n\n" + "\n".join(
    f"  {name:<6} {help_}" for name, (_, help_) in SUBCOMMANDS.items()
)


def description(doc: str) -> str:
    """A subcommand's `--help` description: its module docstring's first paragraph, whole."""
    return " ".join(doc.split("\n\n")[0].split())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] in ("--version", "-V"):
        from rmkit import __version__

        print(f"rmkit {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"rmkit: unknown command '{name}'\n{USAGE}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    try:
        return module.main(name, rest) if module.__name__ == "rmkit.cli.recipes" else module.main(rest)
    except UserError as err:
        print(f"rmkit {name}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rmkit {name}: interrupted", file=sys.stderr)
        return 130
