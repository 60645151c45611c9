"""DistillationLossFn: NeMo RL's unit tests."""

import pytest
import torch
from cuda_rng import CudaGenerator

from rmkit.losses.distillation import DistillationLossFn

KL_TYPES = ["forward", "reverse", "mixed"]


# --- NeMo RL's tests (tests/unit/algorithms/test_loss_functions.py), inputs and expected values unchanged.
# NeMo RL computes the student/teacher top-k log-probs in prepare_loss_input and passes them to the loss;
# rmkit's loss takes the logits. NeMo RL draws its inputs on a GPU; CudaGenerator gives the same numbers.


def setup_distillation_test_data(batch_size=2, seq_len=4, vocab_size=8, topk=64):
    gen = CudaGenerator(seed=42)
    input_ids = gen.randint(vocab_size, (batch_size, seq_len))
    data = {
        "input_ids": input_ids,
        "input_lengths": torch.tensor([seq_len] * batch_size),
        "token_mask": torch.ones((batch_size, seq_len)),
        "sample_mask": torch.ones(batch_size),
        "teacher_topk_logits": gen.randn((batch_size, seq_len, topk)),
        "teacher_topk_indices": gen.randint(vocab_size, (batch_size, seq_len, topk)),
    }
    student_logits = gen.randn((batch_size, seq_len, vocab_size))
    return data, student_logits


def _nemo_call(loss_fn, logits, data):
    # NeMo RL's tests pass sum(sample_mask[:, None] * token_mask), position 0 included: 8 here.
    gvt = torch.sum(data["sample_mask"].unsqueeze(-1) * data["token_mask"])
    return loss_fn(logits, data, torch.sum(data["sample_mask"]), gvt)


NEMO_EXPECTED = {
    (True, "forward"): -0.9636520743370056,
    (True, "reverse"): -490.5150451660156,
    (True, "mixed"): -343.6496276855469,
    (False, "forward"): 0.5783048868179321,
    (False, "reverse"): 0.5811167359352112,
    (False, "mixed"): 0.5802732110023499,
}


@pytest.mark.parametrize("kl_type", KL_TYPES)
@pytest.mark.parametrize("zero_outside_topk", [True, False])
def test_distillation_loss_different_settings(kl_type, zero_outside_topk):
    data, student_logits = setup_distillation_test_data()
    loss_fn = DistillationLossFn(
        {"kl_type": kl_type, "mixed_kl_weight": 0.3, "zero_outside_topk": zero_outside_topk}
    )
    loss, metrics = _nemo_call(loss_fn, student_logits, data)
    # NeMo RL's tolerance (torch.allclose defaults: rtol 1e-5, atol 1e-8).
    assert torch.allclose(loss, torch.tensor(NEMO_EXPECTED[zero_outside_topk, kl_type]))
    assert isinstance(metrics, dict)
    assert "loss" in metrics


@pytest.mark.parametrize("k", [1, 32, 64, 1000000])
@pytest.mark.parametrize("zero_outside_topk", [True, False])
def test_distillation_loss_topk_filtering(k, zero_outside_topk):
    data, student_logits = setup_distillation_test_data(topk=k)
    loss_fn = DistillationLossFn({"kl_type": "forward", "mixed_kl_weight": 0.5, "zero_outside_topk": zero_outside_topk})
    loss, _ = _nemo_call(loss_fn, student_logits, data)
    assert loss.dim() == 0
    assert not torch.isnan(loss)
    assert not torch.isinf(loss)
    if k >= 32:
        assert loss.item() != 0.0


def test_distillation_loss_invalid_k_zero():
    data, student_logits = setup_distillation_test_data(topk=0)
    loss_fn = DistillationLossFn({"kl_type": "forward", "mixed_kl_weight": 0.5, "zero_outside_topk": False})
    with pytest.raises(ValueError, match="topk must be positive"):
        _nemo_call(loss_fn, student_logits, data)


def test_distillation_loss_gradient_flow():
    data, student_logits = setup_distillation_test_data()
    student_logits.requires_grad_(True)
    loss_fn = DistillationLossFn({"kl_type": "forward", "mixed_kl_weight": 0.5, "zero_outside_topk": False})
    loss, _ = _nemo_call(loss_fn, student_logits, data)
    loss.backward()
    assert student_logits.grad is not None
    assert not torch.allclose(student_logits.grad, torch.zeros_like(student_logits.grad))


@pytest.mark.parametrize("value", [0.0, 100.0, -100.0])
def test_distillation_loss_edge_cases(value):
    data, student_logits = setup_distillation_test_data()
    loss_fn = DistillationLossFn({"kl_type": "forward", "mixed_kl_weight": 0.5, "zero_outside_topk": False})
    loss, _ = _nemo_call(loss_fn, torch.full_like(student_logits, value), data)
    assert not torch.isnan(loss)
    assert not torch.isinf(loss)


def test_distillation_loss_fn_initialization():
    loss_fn = DistillationLossFn({"kl_type": "forward", "mixed_kl_weight": 0.5, "zero_outside_topk": False})
    assert loss_fn.kl_type == "forward"
    assert loss_fn.mixed_kl_weight == 0.5
    assert not loss_fn.zero_outside_topk
    loss_fn = DistillationLossFn({"kl_type": "reverse", "mixed_kl_weight": 0.3, "zero_outside_topk": True})
    assert loss_fn.kl_type == "reverse"
    assert loss_fn.mixed_kl_weight == 0.3
    assert loss_fn.zero_outside_topk


def test_distillation_loss_fn_call():
    data, student_logits = setup_distillation_test_data()
    loss_fn = DistillationLossFn({"kl_type": "forward", "mixed_kl_weight": 0.5, "zero_outside_topk": False})
    loss, metrics = _nemo_call(loss_fn, student_logits, data)
    assert isinstance(loss, torch.Tensor)
    assert isinstance(metrics, dict)
    assert loss.dim() == 0
    assert "loss" in metrics


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU to compare with")
def test_cuda_rng_matches_cuda():
    torch.manual_seed(42)
    gen = CudaGenerator(seed=42, sm_count=torch.cuda.get_device_properties(0).multi_processor_count)
    for shape in [(2, 4), (2, 4, 64), (3, 1000)]:
        assert torch.equal(gen.randint(8, shape), torch.randint(0, 8, shape, device="cuda").cpu())
        torch.testing.assert_close(gen.randn(shape), torch.randn(shape, device="cuda").cpu(), rtol=0, atol=1e-5)
