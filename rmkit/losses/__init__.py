"""Alignment losses with NeMo RL's LossFunction protocol; see `rmkit.losses.protocol`.

The names below load with their module on first use (PEP 562), so `rmkit.losses.configs`, the losses' torch-free
configs, can be imported by a config tree without importing torch.
"""

from __future__ import annotations

import importlib

_MODULES = {
    "rmkit.data.records": ("MISSING_LABEL",),
    "rmkit.losses.advantages": (
        "clip_advantages", "consecutive_groups", "gdpo_advantages", "group_baseline_and_std",
        "grpo_group_advantages", "kl_in_reward", "opd_advantages", "opd_metrics", "raw_reward_advantages",
        "reinforce_plus_plus_advantages", "response_mask", "sequence_kl"
    ),
    "rmkit.losses.configs": ("ClippedPGLossConfig", "DPOLossConfig", "MseValueLossConfig"),
    "rmkit.losses.distillation": ("DistillationLossConfig", "DistillationLossFn"),
    "rmkit.losses.dpo": ("DPOLossFn",),
    "rmkit.losses.kl": ("calculate_kl", "KL_ESTIMATORS"),
    "rmkit.losses.logprobs": ("aligned_logprobs", "next_token_logprobs"),
    "rmkit.losses.masking": ("masked_mean", "valid_counts"),
    "rmkit.losses.nll": ("NLLLoss",),
    "rmkit.losses.packing": ("SequencePackingLossWrapper",),
    "rmkit.losses.policy_gradient": ("ClippedPGLossFn",),
    "rmkit.losses.preference": ("PreferenceLoss", "split_pairs"),
    "rmkit.losses.protocol": ("LossFunction", "reduce_metrics"),
    "rmkit.losses.regression": ("regression_label_mask", "RegressionLoss"),
    "rmkit.losses.value": (
        "aligned_values", "gae_advantages", "MseValueLossFn", "token_level_rewards",
        "value_explained_variance"
    ),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'rmkit.losses' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
