"""SequencePackingLossWrapper: a packed row gives the padded batch's loss, metrics and gradients."""

import pytest
import torch
from loss_data import global_counts, random_batch

from rmkit.losses import ClippedPGLossFn, DPOLossFn, NLLLoss, SequencePackingLossWrapper

LENGTHS = [6, 5, 4]  # true lengths of random_batch(batch=3, seq=6)'s rows (token_mask ends there)
PG_CFG = {
    "reference_policy_kl_penalty": 0.1,
    "ratio_clip_min": 0.2,
    "ratio_clip_max": 0.2,
    "ratio_clip_c": 2.0,
    "use_on_policy_kl_approximation": False,
    "use_importance_sampling_correction": True,
    "token_level_loss": False,
}


def _pack(padded: torch.Tensor, starts: list[int], total: int) -> torch.Tensor:
    """`[B, S, ...]` -> `[1, total, ...]` with row b's first LENGTHS[b] entries at starts[b]."""
    pieces, pos = [], 0
    for b, (start, length) in enumerate(zip(starts, LENGTHS)):
        if start > pos:
            pieces.append(torch.zeros((start - pos, *padded.shape[2:]), dtype=padded.dtype))
        pieces.append(padded[b, :length])
        pos = start + length
    if total > pos:
        pieces.append(torch.zeros((total - pos, *padded.shape[2:]), dtype=padded.dtype))
    return torch.cat(pieces)[None]


@pytest.mark.parametrize("unpacked_data", [False, True])
@pytest.mark.parametrize("gaps", [False, True])
@pytest.mark.parametrize("loss_name", ["nll", "pg_token_adv", "pg_seq_adv"])
def test_packed_equals_padded(loss_name, gaps, unpacked_data):
    # float64; only summation order differs: 1e-10 relative. unpacked_data: the per-token tensors
    # stay [B, S] rows (NeMo RL's layout), only the logits are packed.
    logits, data = random_batch(batch=3, seq=6, per_seq_advantages=loss_name == "pg_seq_adv", seed=11)
    loss_fn = NLLLoss() if loss_name == "nll" else ClippedPGLossFn(PG_CFG)
    gvs, gvt = global_counts(data)
    want, want_metrics = loss_fn(logits, data, gvs, gvt)
    (want_grad,) = torch.autograd.grad(want, logits)

    cu = torch.tensor([0, 6, 11, 15])
    cu_padded = torch.tensor([0, 8, 16, 20]) if gaps else None  # each sequence padded to a multiple of 4
    starts, total = (cu_padded[:-1].tolist(), 21) if gaps else (cu[:-1].tolist(), 15)
    packed = {k: v if v.dim() == 1 or unpacked_data else _pack(v, starts, total) for k, v in data.items()}
    packed_logits = _pack(logits, starts, total)
    loss, metrics = SequencePackingLossWrapper(loss_fn, cu, cu_padded)(packed_logits, packed, gvs, gvt)
    (grad,) = torch.autograd.grad(loss, logits)

    torch.testing.assert_close(loss, want, rtol=1e-10, atol=0)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-14)
    assert metrics.keys() == want_metrics.keys()
    for key, value in want_metrics.items():
        assert float(metrics[key]) == pytest.approx(float(value), rel=1e-10, abs=1e-14), key


def test_bad_layouts_are_clear_errors():
    with pytest.raises(ValueError, match="pairs"):
        SequencePackingLossWrapper(
            DPOLossFn(
                {
                    "reference_policy_kl_penalty": 0.1,
                    "preference_loss_weight": 1,
                    "sft_loss_weight": 0,
                    "preference_average_log_probs": False,
                    "sft_average_log_probs": False,
                }
            ),
            torch.tensor([0, 3, 6]),
        )
    with pytest.raises(ValueError, match=">= its sequence length"):
        SequencePackingLossWrapper(NLLLoss(), torch.tensor([0, 3, 6]), torch.tensor([0, 2, 6]))
    wrapper = SequencePackingLossWrapper(NLLLoss(), torch.tensor([0, 3, 6]))
    data = {
        "input_ids": torch.zeros(1, 6, dtype=torch.long),
        "token_mask": torch.ones(1, 6),
        "sample_mask": torch.ones(3),
    }
    with pytest.raises(ValueError, match="sample_mask"):
        wrapper(torch.zeros(1, 6, 4), data, 2, 4)
