"""Alignment losses with NeMo RL's LossFunction protocol; see `rmkit.losses.protocol`."""

from rmkit.data.records import MISSING_LABEL
from rmkit.losses.advantages import (
    clip_advantages,
    consecutive_groups,
    gdpo_advantages,
    group_baseline_and_std,
    grpo_group_advantages,
    kl_in_reward,
    raw_reward_advantages,
    reinforce_plus_plus_advantages,
    response_mask,
)
from rmkit.losses.distillation import DistillationLossConfig, DistillationLossFn
from rmkit.losses.dpo import DPOLossConfig, DPOLossFn
from rmkit.losses.kl import calculate_kl
from rmkit.losses.logprobs import aligned_logprobs, next_token_logprobs
from rmkit.losses.masking import masked_mean, valid_counts
from rmkit.losses.nll import NLLLoss
from rmkit.losses.packing import SequencePackingLossWrapper
from rmkit.losses.policy_gradient import KL_ESTIMATORS, ClippedPGLossConfig, ClippedPGLossFn
from rmkit.losses.preference import PreferenceLoss, split_pairs
from rmkit.losses.protocol import LossFunction, reduce_metrics
from rmkit.losses.regression import RegressionLoss, regression_label_mask
from rmkit.losses.value import (
    MseValueLossConfig,
    MseValueLossFn,
    aligned_values,
    gae_advantages,
    token_level_rewards,
    value_explained_variance,
)

__all__ = [
    "KL_ESTIMATORS",
    "MISSING_LABEL",
    "ClippedPGLossConfig",
    "ClippedPGLossFn",
    "DPOLossConfig",
    "DPOLossFn",
    "DistillationLossConfig",
    "DistillationLossFn",
    "LossFunction",
    "MseValueLossConfig",
    "MseValueLossFn",
    "NLLLoss",
    "PreferenceLoss",
    "RegressionLoss",
    "SequencePackingLossWrapper",
    "aligned_logprobs",
    "aligned_values",
    "calculate_kl",
    "clip_advantages",
    "consecutive_groups",
    "gae_advantages",
    "gdpo_advantages",
    "group_baseline_and_std",
    "grpo_group_advantages",
    "kl_in_reward",
    "masked_mean",
    "next_token_logprobs",
    "raw_reward_advantages",
    "reduce_metrics",
    "regression_label_mask",
    "reinforce_plus_plus_advantages",
    "response_mask",
    "split_pairs",
    "token_level_rewards",
    "valid_counts",
    "value_explained_variance",
]
