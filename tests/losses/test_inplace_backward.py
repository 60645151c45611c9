"""Every log-prob loss with `inplace_backward=True` gives the default path's loss and gradients."""

import pytest
import torch
from loss_data import global_counts, random_batch
from test_nll_dpo import DPO_CFG
from test_packing import PG_CFG

from rmkit.losses import ClippedPGLossFn, DPOLossFn, NLLLoss, SequencePackingLossWrapper


def _losses(inplace: bool):
    return {
        "nll": NLLLoss(inplace_backward=inplace),
        "dpo": DPOLossFn(DPO_CFG, inplace_backward=inplace),
        "pg": ClippedPGLossFn(PG_CFG, inplace_backward=inplace),
        "pg_packed": SequencePackingLossWrapper(
            ClippedPGLossFn(PG_CFG, inplace_backward=inplace), torch.tensor([0, 6, 12, 18, 24])
        ),
    }


@pytest.mark.parametrize("name", ["nll", "dpo", "pg", "pg_packed"])
def test_inplace_backward_gives_the_same_loss_and_weight_gradient(name):
    # The logits come out of a matmul (as from an LM head), so the in-place gradient must reach the
    # weight exactly as the out-of-place one does: float64, 1e-12.
    _, data = random_batch(batch=4, seq=6, seed=3)
    hidden = torch.randn(4, 6, 5, dtype=torch.float64)
    weight = torch.randn(5, 11, dtype=torch.float64, requires_grad=True)
    gvs, gvt = global_counts(data)
    if name == "pg_packed":
        data = {k: v if v.dim() == 1 else v.reshape(1, 24, *v.shape[2:]) for k, v in data.items()}
        hidden = hidden.reshape(1, 24, 5)
    results = []
    for inplace in (False, True):
        loss, metrics = _losses(inplace)[name](hidden @ weight, data, gvs, gvt)
        (grad,) = torch.autograd.grad(loss, weight)
        results.append((loss.detach(), metrics, grad))
    (want_loss, want_metrics, want_grad), (loss, metrics, grad) = results
    torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-14)
    assert metrics == want_metrics
