"""Alignment losses with NeMo RL's LossFunction protocol; see `rmkit.losses.protocol`."""

from rmkit.data.records import MISSING_LABEL
from rmkit.losses.advantages import grpo_group_advantages
from rmkit.losses.distillation import DistillationLossConfig, DistillationLossFn
from rmkit.losses.dpo import DPOLossConfig, DPOLossFn
from rmkit.losses.logprobs import aligned_logprobs, next_token_logprobs
from rmkit.losses.masking import masked_mean, valid_counts
from rmkit.losses.nll import NLLLoss
from rmkit.losses.packing import SequencePackingLossWrapper
from rmkit.losses.policy_gradient import KL_ESTIMATORS, ClippedPGLossConfig, ClippedPGLossFn
from rmkit.losses.preference import PreferenceLoss, split_pairs
from rmkit.losses.protocol import LossFunction, reduce_metrics
from rmkit.losses.regression import RegressionLoss, regression_label_mask

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
    "NLLLoss",
    "PreferenceLoss",
    "RegressionLoss",
    "SequencePackingLossWrapper",
    "aligned_logprobs",
    "grpo_group_advantages",
    "masked_mean",
    "next_token_logprobs",
    "reduce_metrics",
    "regression_label_mask",
    "split_pairs",
    "valid_counts",
]
