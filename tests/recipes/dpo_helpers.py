"""Small preference files and configs for the `rmkit dpo` tests (tiny random policies, no downloads)."""

import json
from pathlib import Path

from rmkit.config import config_from_dict
from rmkit.recipes.configs import DPOTree


def write_pairs(path: Path, n: int, offset: int = 0) -> Path:
    """`n` binary preference records of varied lengths with a learnable signal (a correct polite reply vs a
    wrong rude one)."""
    with open(path, "w", encoding="utf-8") as out:
        for i in range(offset, offset + n):
            record = {"prompt": f"What is {i} plus {i}?" + " Please explain." * (i % 3),
                      "chosen": f"Happy to help: {i} plus {i} is {2 * i}." + " Glad to." * (i % 2),
                      "rejected": f"Figure it out yourself, it is {2 * i + 1}."}
            out.write(json.dumps(record) + "\n")
    return path


def dpo_values(model: str, train: Path, val: Path | None, out: Path, **sections) -> dict:
    """A small run's config as a dict: tiny batches, one thread, no bar, TensorBoard or plots; `sections`
    (`dpo={...}`, `policy={...}`, ...) update the defaults section by section."""
    values = {
        "dpo": {"max_num_steps": 3, "val_period": 0, "val_at_start": False, "val_batches": None,
                "val_global_batch_size": 4, "val_micro_batch_size": 2, "log_period": 1, "seed": 3,
                "num_sample_generations": 2, "sample_max_new_tokens": 4},
        "policy": {"model_name": model, "train_global_batch_size": 4, "train_micro_batch_size": 2,
                   "max_total_sequence_length": 64, "num_threads": 1,
                   "optimizer": {"lr": 1e-3}, "scheduler": {"warmup_steps": 0}},
        "data": {"train_data_path": str(train), "val_data_paths": {"default": str(val)} if val else {}},
        "checkpointing": {"checkpoint_dir": str(out), "save_period": 100},
        "logger": {"tensorboard": False, "progress_bar": False, "plots": False},
    }
    for name, updates in sections.items():
        values[name] = {**values.get(name, {}), **updates}
    return values


def dpo_config(*args, overrides: list[str] | None = None, **sections) -> DPOTree:
    return config_from_dict(dpo_values(*args, **sections), overrides, tree_type=DPOTree)


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]
