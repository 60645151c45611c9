"""The training commands, one table: `rmkit {train,sft,dpo,grpo,ppo} --config CONFIG.yaml [--resume]
[section.key=value ...]`.

Each recipe is a row: its config tree and `train` function (imported only once the config is valid, so a bad
key costs no torch start-up), its help text, what its throughput counts and what to do with what it saved.
A run that stops (`rmkit.errors.RunStopped`: a diverged loss, a failed rollout) is one line and exit status 1.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from rmkit.config import config_to_dict, load_config

_REWARD_MODEL_USE = """
Use it:
  rmkit eval  --model {q} --data {data}
  rmkit score --model {q} --input {data} --output scored.jsonl
  rmkit serve --model {q}
  python -c "from transformers import AutoModelForSequenceClassification as M, AutoTokenizer as T; \\
m = M.from_pretrained({p}); t = T.from_pretrained({p}); \\
print(m(**t('Question? Answer.', return_tensors='pt')).logits)"
"""
_PRM_USE = """
Use it (a process reward model: the head at each step separator's last token, through a sigmoid, is the
probability that the step is correct; scoring_contract.json names the separator and the aggregation):
  python -c "import torch; from transformers import AutoModelForSequenceClassification as M, AutoTokenizer as T; \\
m = M.from_pretrained({p}); t = T.from_pretrained({p}); \\
h = getattr(m, m.base_model_prefix)(**t('1 + 1 = ?2 is the sum.\\n', return_tensors='pt')).last_hidden_state; \\
print(torch.sigmoid(m.score(h)[0, -1]))"
"""
_POLICY_USE = """
Use it:
  python -c "from transformers import AutoModelForCausalLM as M, AutoTokenizer as T; \\
m = M.from_pretrained({p}); t = T.from_pretrained({p}); \\
print(t.decode(m.generate(**t.apply_chat_template([{{'role': 'user', 'content': 'Hi'}}], add_generation_prompt=True, \\
return_tensors='pt', return_dict=True), max_new_tokens=32)[0]))"
"""
_PLAIN_POLICY_USE = """
Use it (the tokenizer has no chat template: prompt it as rmkit did, "User: ...\\nAssistant:"):
  python -c "from transformers import AutoModelForCausalLM as M, AutoTokenizer as T; \\
m = M.from_pretrained({p}); t = T.from_pretrained({p}); \\
print(t.decode(m.generate(**t('User: Hi\\nAssistant:', return_tensors='pt'), max_new_tokens=32)[0]))"
"""


@dataclass(frozen=True)
class Recipe:
    """One training command."""

    tree: str
    """`module:Class` of the config tree."""
    train: str
    """`module:function` that runs it and returns a `RunResult`."""
    description: str
    config_help: str
    rate: str | None
    """The `RunResult.rates` key to report first (None: the recipe reports no rate)."""
    shown: tuple[str, ...]
    """Endings of the validation metrics printed at the end."""
    saved: str
    """What `final/` holds, in words."""
    use: str
    """How to use it: `{q}` the folder quoted for the shell, `{p}` as a Python string, `{data}` a preference file
    (the run's first validation file, quoted)."""


RECIPES = {
    "train": Recipe(
        "rmkit.config:Config", "rmkit.recipes.rm:train",
        "Train a reward model. Overrides use dotted keys, e.g. policy.optimizer.lr=1e-5 rm.max_num_steps=100 "
        "data.val_data_paths.hh=../shared/data/hh_harmless_val.jsonl. A config (or an override) with a `prm` section "
        "trains a process reward model instead (configs/prm.yaml)",
        "YAML config (default: all defaults = configs/default.yaml's run)",
        "pairs/s", ("/acc", "/loss"), "Reward model", _REWARD_MODEL_USE),
    "sft": Recipe(
        "rmkit.recipes.configs:SFTTree", "rmkit.recipes.sft:train",
        "Fine-tune a policy (any causal LM) on demonstrations: chat `messages`, prompt/response records, plain "
        "`text` or the chosen side of preference data. Overrides use dotted keys, e.g. policy.optimizer.lr=1e-5 "
        "sft.max_num_steps=100 data.train_data_path=demos.jsonl",
        "YAML config (default: all defaults, SmolLM2 on rmkit's small preference set)",
        "sequences/s", ("/loss", "/token_acc"), "Policy", _POLICY_USE),
    "dpo": Recipe(
        "rmkit.recipes.configs:DPOTree", "rmkit.recipes.dpo:train",
        "Train a policy (causal LM) on preference pairs with DPO. Overrides use dotted keys, e.g. "
        "dpo.max_num_steps=20 dpo.reference_policy_kl_penalty=0.1 policy.optimizer.lr=1e-6",
        "YAML config (default: all defaults; see configs/dpo.yaml)",
        "pairs/s", ("/loss", "/accuracy"), "Policy", _POLICY_USE),
    "grpo": Recipe(
        "rmkit.recipes.configs:GRPOConfig", "rmkit.recipes.grpo:train",
        "GRPO: optimize a policy (causal LM) against a reward model (in process or a running rmkit serve). "
        "Overrides use dotted keys, e.g. grpo.max_num_steps=20 env.reward_model.model_name=results/rm/final "
        "policy.generation.max_new_tokens=32",
        "YAML config (e.g. configs/grpo_rm.yaml; default: all defaults)",
        None, ("/reward_mean", "/reward_std", "/mean_gen_tokens_per_sample"), "Policy", _POLICY_USE),
    "ppo": Recipe(
        "rmkit.recipes.configs:PPOConfig", "rmkit.recipes.ppo:train",
        "PPO with a critic: optimize a policy (causal LM) against a reward model (in process or a running rmkit "
        "serve), with a learned value per token and GAE. Overrides use dotted keys, e.g. ppo.max_num_steps=20 "
        "env.reward_model.model_name=results/rm/final value.model_name=null ppo.kl_target=0.05",
        "YAML config (e.g. configs/ppo_rm.yaml; default: all defaults)",
        None, ("/reward_mean", "/reward_std", "/mean_gen_tokens_per_sample"), "Policy (the critic in critic/)",
        _POLICY_USE),
    "prm": Recipe(
        "rmkit.recipes.configs:PRMTree", "rmkit.recipes.prm:train",
        "Train a process reward model (a decoder whose head scores every step of a solution) on step-labelled "
        "solutions; `rmkit train` runs it when the config has a `prm` section. Overrides use dotted keys, e.g. "
        "prm.max_num_steps=100 prm.train_on_last_step_only=true data.train_data_path=steps.jsonl",
        "YAML config with a `prm` section (e.g. configs/prm.yaml)",
        "solutions/s", ("/loss", "/step_acc"), "Process reward model", _PRM_USE),
}


def build_parser(name: str) -> argparse.ArgumentParser:
    """`rmkit <name>`'s command line: `--config`, `--resume` and the dotted overrides."""
    recipe = RECIPES[name]
    parser = argparse.ArgumentParser(prog=f"rmkit {name}", description=recipe.description)
    parser.add_argument("--config", help=recipe.config_help)
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest valid checkpoint in checkpointing.checkpoint_dir "
                             "(= checkpointing.resume=auto)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config as YAML (the defaults, --config and the overrides laid over "
                             "them) and exit without training")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    return parser


def main(name: str, argv: list[str]) -> int:
    """Run the recipe `name` with the command line `argv`; rank 0 reports what it saved."""
    args = build_parser(name).parse_intermixed_args(argv)  # overrides before and after --resume
    if name == "train" and _has_prm_section(args.config, args.overrides):
        name = "prm"  # `rmkit train` with a `prm` section trains a process reward model
    recipe = RECIPES[name]
    cfg = load_config(args.config, args.overrides + (["checkpointing.resume=auto"] if args.resume else []),
                      tree_type=_load(recipe.tree))
    if args.print_config:  # before torch loads: a quick look at what a run would use
        print(yaml.safe_dump(config_to_dict(cfg), sort_keys=False), end="")
        return 0
    from rmkit.errors import RunStopped

    try:
        result = _load(recipe.train)(cfg)
    except RunStopped as err:
        print(f"rmkit {name}: {err.outcome}: {err}", file=sys.stderr)
        print(f"rmkit {name}: {_last_checkpoint(cfg.checkpointing.checkpoint_dir)}", file=sys.stderr)
        return 1
    from rmkit import distributed as dist

    if not dist.is_launch_rank_zero():  # under torchrun, rank 0 reports (the process group is gone by now)
        return 0
    if recipe.rate and not result.rates.get(recipe.rate):  # a resumed run that had no step left
        print(f"rmkit: no step left to train: the run was complete at step {result.steps}", file=sys.stderr)
    elif recipe.rate:
        print(f"rmkit: trained {_steps(result.steps)} at {result.rates[recipe.rate]:.2f} {recipe.rate}, "
              f"{result.rates['tokens/s']:.0f} tokens/s (training only; validation and one-off passes excluded)",
              file=sys.stderr)
    from rmkit.trainer.logging.run_logger import summary

    if shown := summary(result.val_metrics, recipe.shown):
        print(f"rmkit: final validation: {shown}", file=sys.stderr)
    d = result.final_dir
    print(f"\n{recipe.saved} saved to {d} ({_steps(result.steps)})\n"
          f"  logs and metrics: {result.log_dir}/metrics.jsonl (tensorboard --logdir {result.log_dir})\n"
          + (f"  sample generations: {result.log_dir}/samples.jsonl\n" if recipe.saved == "Policy" else "")
          + f"  plots:            {', '.join(str(p) for p in result.plots) or '(none)'}\n"
          + (_PLAIN_POLICY_USE if recipe.use is _POLICY_USE and not _has_chat_template(d) else recipe.use).format(
              q=shlex.quote(str(d)), p=repr(str(d)), data=_validation_file(cfg)))
    return 0


def _has_prm_section(config: str | None, overrides: list[str]) -> bool:
    """Whether the YAML file `config` has a top-level `prm` section or an override sets a `prm.` key (a file that
    does not read as a mapping is left to `load_config`, which names the problem)."""
    if any(o.split("=", 1)[0].strip().startswith("prm.") for o in overrides):
        return True
    if config is None or not Path(config).is_file():
        return False
    try:
        values = yaml.safe_load(Path(config).read_text(encoding="utf-8"))
    except (yaml.YAMLError, OSError, UnicodeDecodeError):
        return False
    return isinstance(values, dict) and "prm" in values


def _validation_file(cfg) -> str:
    """The run's first validation file, absolute and quoted for the shell (FILE.jsonl when it has none); the embedded
    sets by their names (`default-val`), which `eval` and `score` take from any folder."""
    from rmkit.trainer.datasets import EMBEDDED, resolve_data_path

    paths = list(cfg.data.val_data_paths.values())
    if paths and paths[0] in EMBEDDED:
        return paths[0]
    if not paths or not Path(resolve_data_path(paths[0])).is_file():
        return "FILE.jsonl"
    return shlex.quote(str(Path(resolve_data_path(paths[0])).resolve()))


def _has_chat_template(folder) -> bool:
    """Whether the tokenizer saved in `folder` has a chat template (a file of its own, or in its config)."""
    import json
    from pathlib import Path

    config = Path(folder) / "tokenizer_config.json"
    return (Path(folder) / "chat_template.jinja").is_file() or (
        config.is_file() and bool(json.loads(config.read_text()).get("chat_template")))


def _steps(n: int) -> str:
    return f"{n} step" + ("" if n == 1 else "s")


def _last_checkpoint(checkpoint_dir) -> str:
    """Where a stopped run can continue from, in words."""
    from rmkit.trainer.checkpointing.files import latest_valid_checkpoint

    path = latest_valid_checkpoint(checkpoint_dir, warn=lambda _: None) if checkpoint_dir else None
    if path is None:
        return f"no checkpoint was saved in {checkpoint_dir} yet; rerun to start over"
    return f"last checkpoint: {path} (continue from it with --resume)"


def _load(dotted: str):
    module, name = dotted.split(":")
    return getattr(importlib.import_module(module), name)
