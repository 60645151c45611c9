"""Save the final model (a reward model or a policy) as a plain Hugging Face model directory.

`<checkpoint_dir>/final/` holds safetensors weights, config, tokenizer (with its chat template),
`scoring_contract.json` (how every rmkit path turns an input into a reward: `rmkit.inference`),
`reward_stats.json` (validation reward mean and std, overall and per set) and `rmkit_config.yaml` (the
resolved training config). `AutoModelForSequenceClassification.from_pretrained`
on it reproduces rmkit's rewards: decoders carry a pad token distinct from every real last token.
A policy's directory (`export_policy`) holds weights, config, tokenizer and `rmkit_config.yaml`, and loads
with `AutoModelForCausalLM.from_pretrained`.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import replace
from pathlib import Path

import torch

from rmkit.config import Config, save_config
from rmkit.inference import ScoringContract, contract_for, model_max_length, write_contract
from rmkit.models.reward import transformers_progress_bars_off
from rmkit.models.setup import set_activation_checkpointing
from rmkit.wrappers import merged_model

REWARD_STATS = "reward_stats.json"
CONFIG_NAME = "rmkit_config.yaml"


def reward_stats(rewards: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict:
    """Mean and unbiased std of all validation rewards (chosen and rejected together), overall and per set."""
    per_set = {}
    for name, (chosen, rejected) in rewards.items():
        both = torch.cat([chosen.reshape(-1), rejected.reshape(-1)]).double()
        per_set[name] = {"mean": float(both.mean()), "std": float(both.std()) if both.numel() > 1 else 0.0,
                         "count": int(both.numel())}
    if not per_set:
        return {"mean": None, "std": None, "count": 0, "sets": {}}
    everything = torch.cat([torch.cat([c.reshape(-1), r.reshape(-1)]) for c, r in rewards.values()]).double()
    return {"mean": float(everything.mean()), "std": float(everything.std()) if everything.numel() > 1 else 0.0,
            "count": int(everything.numel()), "sets": per_set}


def save_hf_model(model: torch.nn.Module, tokenizer, out_dir: str | Path) -> tuple[torch.nn.Module, Path]:
    """Write `model` (LoRA merged, training wrappers removed) as safetensors with its config, and
    `tokenizer` (chat template included), to `out_dir`. Returns the plain model written and the directory."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Merging LoRA rewrites the base weights; merge a copy so the training model stays as it was.
    model = merged_model(copy.deepcopy(model) if hasattr(model, "merge_and_unload") else model)
    if any(getattr(m, "gradient_checkpointing", False) for m in model.modules()):
        set_activation_checkpointing(model, False)  # the saved config should not carry it
    with transformers_progress_bars_off():
        model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    readable_as_umask_allows(out_dir)
    return model, out_dir


def readable_as_umask_allows(out_dir: Path) -> None:
    """Give every file in `out_dir` the mode a new file gets under the process umask (0644 under the usual
    022). transformers writes the weights through a private temporary file (mode 0600), so without this a
    serving account or a teammate could not read `model.safetensors` beside a readable config."""
    umask = os.umask(0)
    os.umask(umask)
    for path in out_dir.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~umask)


def export_model(model: torch.nn.Module, tokenizer, out_dir: str | Path, cfg: Config | None = None,
                 stats: dict | None = None, contract: ScoringContract | None = None) -> Path:
    """Write the reward `model` (`save_hf_model`) and the scoring `contract` (with the reward mean and std
    of `stats`) to `out_dir`. Without a `contract`, the one of `cfg`'s max length (else the model's
    position limit)."""
    model, out_dir = save_hf_model(model, tokenizer, out_dir)
    if contract is None:
        max_length = cfg.policy.max_total_sequence_length if cfg else model_max_length(model, tokenizer)
        contract = contract_for(model, tokenizer, max_length)
    if stats is not None:
        (out_dir / REWARD_STATS).write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
        contract = replace(contract, reward_mean=stats.get("mean"), reward_std=stats.get("std"))
    write_contract(contract, out_dir)
    if cfg is not None:
        save_config(cfg, out_dir / CONFIG_NAME)
    return out_dir


def export_policy(model: torch.nn.Module, tokenizer, out_dir: str | Path, cfg=None) -> Path:
    """Write the policy `model` (`save_hf_model`) and the resolved run config: a directory that
    `AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained` load."""
    _, out_dir = save_hf_model(model, tokenizer, out_dir)
    if cfg is not None:
        save_config(cfg, out_dir / CONFIG_NAME)
    return out_dir
