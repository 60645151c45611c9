"""Validation: score every chosen and rejected sequence of a set once through the inference core, then the
reward-model metrics of docs/design.md."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from rmkit.distributed import all_gather_cat, shard
from rmkit.inference import RewardScorer
from rmkit.losses import RegressionLoss, masked_mean, regression_label_mask
from rmkit.metrics import reward_model_metrics


def pair_metrics(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, float]:
    """docs/design.md's reward-model metrics of `[N]` chosen and rejected rewards (`rmkit.metrics`); NaN
    metrics for an empty set instead of an error, so a tiny validation file cannot stop a run."""
    if chosen.numel() == 0:
        return {"loss": math.nan, "acc": math.nan, "rewards_chosen_mean": math.nan,
                "rewards_rejected_mean": math.nan, "rewards_all_mean": math.nan,
                "rewards_all_std": math.nan, "num_pairs": 0}
    return reward_model_metrics(chosen, rejected)


def regression_metrics(predictions: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Metrics of `[N, K]` predictions against `[N, K]` labels: `loss` (the training loss,
    `RegressionLoss`: MSE over the present labels), `mse_<k>` per attribute, reward mean/std,
    `num_examples`. Computed in float64."""
    predictions, labels = predictions.double(), labels.double()
    present = regression_label_mask(labels).double()
    loss, _ = RegressionLoss()(predictions, {"labels": labels}, None, present.sum())
    metrics = {"loss": float(loss)}
    for k in range(labels.shape[1]):
        metrics[f"mse_{k}"] = float(masked_mean((predictions[:, k] - labels[:, k]).pow(2), present[:, k]))
    metrics["rewards_all_mean"] = float(predictions.mean())
    metrics["rewards_all_std"] = float(predictions.std()) if predictions.numel() > 1 else 0.0
    metrics["num_examples"] = int(labels.shape[0])
    return metrics


def score_pairs(scorer: RewardScorer, pairs: Sequence) -> tuple[torch.Tensor, torch.Tensor]:
    """`[N, K]` chosen and rejected rewards of tokenized pairs (`.chosen_ids`, `.rejected_ids`), scored by
    the inference core, as `rmkit eval`, `rmkit score` and `rmkit serve` score them.

    Under data parallelism each rank scores its contiguous share and the rewards are gathered in rank
    order, so every rank returns all N rows in the original order."""
    rows = [ids for p in shard(pairs) for ids in (p.chosen_ids, p.rejected_ids)]  # interleaved
    rewards = scorer.score_ids(rows, lockstep=True)
    return all_gather_cat(rewards[0::2]), all_gather_cat(rewards[1::2])


def validate(scorer: RewardScorer, val_sets: dict[str, Sequence],
             max_pairs: int | None) -> tuple[dict[str, float], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """Metrics `validation-<name>/<metric>` over every set (its first `max_pairs` pairs), and the rewards."""
    metrics, rewards = {}, {}
    for name, pairs in val_sets.items():
        pairs = pairs[:max_pairs] if max_pairs is not None else pairs
        chosen, rejected = score_pairs(scorer, pairs)
        rewards[name] = (chosen[:, 0], rejected[:, 0])
        for key, value in pair_metrics(chosen[:, 0], rejected[:, 0]).items():
            metrics[f"validation-{name}/{key}"] = value
    return metrics, rewards


def validate_regression(scorer: RewardScorer, val_sets: dict[str, Sequence],
                        max_examples: int | None) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """Regression counterpart of `validate` (examples with `.input_ids` and `.labels`)."""
    metrics, rewards = {}, {}
    for name, examples in val_sets.items():
        examples = examples[:max_examples] if max_examples is not None else examples
        predictions = all_gather_cat(scorer.score_ids([e.input_ids for e in shard(examples)], lockstep=True))
        labels = torch.tensor([list(e.labels) for e in examples], dtype=torch.float64)
        rewards[name] = predictions
        for key, value in regression_metrics(predictions, labels).items():
            metrics[f"validation-{name}/{key}"] = value
    return metrics, rewards
