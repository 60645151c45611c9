"""DistillationLossFn: NeMo RL's unit tests, a float64 loop reference, hand-derived values, invariances."""

import math

import pytest
import torch
from cuda_rng import CudaGenerator
from loss_data import global_counts, random_batch, split_batch

from rmkit.losses import DistillationLossFn, SequencePackingLossWrapper
from rmkit.losses.distillation import topk_logprobs

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


# --- rmkit's own checks: a float64 loop reference, hand-derived values, invariances, errors.

CONFIGS = [
    {"kl_type": kl_type, "mixed_kl_weight": 0.3, "zero_outside_topk": zero}
    for kl_type in KL_TYPES
    for zero in (False, True)
]


def distill_batch(batch=4, seq=7, vocab=11, topk=4, seed=0):
    """`random_batch` plus a teacher: distinct top-k ids per position, logits -inf where no token is
    trained on (the loss must never read them)."""
    logits, data = random_batch(batch=batch, seq=seq, vocab=vocab, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    ids = torch.rand(batch, seq, vocab, generator=g).argsort(-1)[..., :topk]
    teacher = 3 * torch.randn(batch, seq, topk, generator=g, dtype=torch.float64)
    trained = torch.nn.functional.pad(data["token_mask"][:, 1:], (0, 1)) > 0  # position t predicts t+1
    data["teacher_topk_logits"] = torch.where(trained[..., None], teacher, float("-inf"))
    data["teacher_topk_indices"] = ids
    return logits, data


def reference_distillation(logits, data, gvt, cfg):
    """The definitions written out per token, in float64: a scalar autograd can differentiate."""
    w, total = cfg["mixed_kl_weight"], torch.zeros((), dtype=torch.float64)
    for b in range(logits.shape[0]):
        for t in range(1, logits.shape[1]):
            if not (data["token_mask"][b, t] and data["sample_mask"][b]):
                continue
            x = logits[b, t - 1].double()
            ids = [int(i) for i in data["teacher_topk_indices"][b, t - 1]]
            teacher = data["teacher_topk_logits"][b, t - 1].double()
            q = torch.exp(teacher - teacher.max()) / torch.exp(teacher - teacher.max()).sum()
            if cfg["zero_outside_topk"]:
                p_all = torch.exp(x - x.max()) / torch.exp(x - x.max()).sum()
                p = torch.stack([p_all[i] for i in ids])
            else:
                xk = torch.stack([x[i] for i in ids])
                p = torch.exp(xk - xk.max()) / torch.exp(xk - xk.max()).sum()
            forward = sum(q[j] * (torch.log(q[j]) - torch.log(p[j])) for j in range(len(ids)))
            reverse = sum(p[j] * (torch.log(p[j]) - torch.log(q[j])) for j in range(len(ids)))
            if cfg["zero_outside_topk"]:  # the teacher's log-prob is -100 on every other id
                reverse = reverse + sum(
                    p_all[v] * (torch.log(p_all[v]) + 100) for v in range(x.shape[0]) if v not in ids
                )
            kl = {"forward": forward, "reverse": reverse, "mixed": w * forward + (1 - w) * reverse}
            total = total + kl[cfg["kl_type"]]
    return total / gvt


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c['kl_type']}-zero{c['zero_outside_topk']}")
def test_matches_loop_reference(cfg):
    # float64 throughout; only the order of sums differs: 1e-12 relative on the loss, 1e-10 on gradients.
    logits, data = distill_batch()
    gvs, gvt = global_counts(data)
    loss, metrics = DistillationLossFn(cfg)(logits, data, gvs, gvt)
    want = reference_distillation(logits, data, gvt, cfg)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=0)
    (grad,) = torch.autograd.grad(loss, logits)
    (want_grad,) = torch.autograd.grad(want, logits)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-14)
    assert grad.abs().sum() > 0 and torch.isfinite(grad).all()
    assert metrics["loss"] == loss.detach() and metrics["num_valid_samples"] == 4


def test_hand_derived_values():
    """One trained position (B=1, S=2), V=4, uniform student logits, teacher top-2 ids {0, 1} with
    equal logits, so q = (1/2, 1/2) and the student's probabilities are all 1/4.

    - renormalized on the top-k (zero_outside_topk=False): the student is (1/2, 1/2) there too, so
      forward = reverse = mixed = 0.
    - full vocabulary (zero_outside_topk=True): p = 1/4 on each top-k id,
      forward = 2 * 1/2 * (ln 1/2 - ln 1/4) = ln 2;
      reverse = 2 * 1/4 * (ln 1/4 - ln 1/2) + 2 * 1/4 * (ln 1/4 + 100) = -ln2/2 + 50 - ln 2 = 50 - 1.5 ln 2;
      mixed (w = 0.3) = 0.3 ln 2 + 0.7 (50 - 1.5 ln 2).
    """
    data = {
        "input_ids": torch.tensor([[0, 1]]),
        "token_mask": torch.tensor([[0, 1]]),
        "sample_mask": torch.tensor([1]),
        "teacher_topk_logits": torch.tensor([[[2.0, 2.0], [5.0, -1.0]]], dtype=torch.float64),
        "teacher_topk_indices": torch.tensor([[[0, 1], [2, 3]]]),
    }
    logits = torch.zeros(1, 2, 4, dtype=torch.float64)
    ln2 = math.log(2)
    want = {
        (False, "forward"): 0.0,
        (False, "reverse"): 0.0,
        (False, "mixed"): 0.0,
        (True, "forward"): ln2,
        (True, "reverse"): 50 - 1.5 * ln2,
        (True, "mixed"): 0.3 * ln2 + 0.7 * (50 - 1.5 * ln2),
    }
    for (zero, kl_type), value in want.items():
        cfg = {"kl_type": kl_type, "mixed_kl_weight": 0.3, "zero_outside_topk": zero}
        loss, _ = DistillationLossFn(cfg)(logits, data, 1, 1)
        assert loss.item() == pytest.approx(value, abs=1e-12), (zero, kl_type)


@pytest.mark.parametrize("zero", [False, True])
def test_student_equal_to_teacher_is_zero_with_zero_gradient(zero):
    """Student logits equal to the teacher's on its top-k (and, for the full-vocabulary form, -1e4
    elsewhere, so p = q exactly in float64): every KL is 0, and 0 is its minimum, so the gradient is 0."""
    _, data = distill_batch(batch=2, seq=5, vocab=9, topk=3)
    data["sample_mask"][:] = 1
    data["teacher_topk_logits"] = torch.nan_to_num(data["teacher_topk_logits"], neginf=0.0)
    logits = torch.full((2, 5, 9), -1e4, dtype=torch.float64)
    logits.scatter_(-1, data["teacher_topk_indices"], data["teacher_topk_logits"])
    logits.requires_grad_()
    for kl_type in KL_TYPES:
        cfg = {"kl_type": kl_type, "mixed_kl_weight": 0.4, "zero_outside_topk": zero}
        loss, _ = DistillationLossFn(cfg)(logits, data, *global_counts(data))
        (grad,) = torch.autograd.grad(loss, logits)
        assert abs(loss.item()) < 1e-12, kl_type
        assert grad.abs().max() < 1e-12, kl_type


def test_masks_and_global_normalization():
    """A row with sample_mask 0 and positions with token_mask 0 do not count; the loss is the masked
    sum over global_valid_toks (here twice the local count, as with a second micro-batch)."""
    logits, data = distill_batch()
    cfg = CONFIGS[1]
    gvs, gvt = global_counts(data)
    loss, _ = DistillationLossFn(cfg)(logits, data, gvs, 2 * gvt)
    torch.testing.assert_close(loss, reference_distillation(logits, data, gvt, cfg) / 2, rtol=1e-12, atol=0)
    data["sample_mask"][:] = 0
    loss, _ = DistillationLossFn(cfg)(logits, data, gvs, gvt)
    assert loss.item() == 0.0


@pytest.mark.parametrize("with_entropy", [False, True])
def test_topk_logprobs_chunks_match_direct(with_entropy):
    # Several chunks (chunk_elements = 2 positions) against the direct float64 computation.
    logits = torch.randn(3, 5, 7, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, 7, (3, 5, 4))
    got, neg_entropy = topk_logprobs(logits, index, with_entropy=with_entropy, chunk_elements=14)
    logp = torch.log_softmax(logits, -1)
    want = logp.gather(-1, index)
    want_neg_entropy = (logp.exp() * logp).sum(-1) if with_entropy else torch.zeros(3, 5, dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(neg_entropy, want_neg_entropy, rtol=1e-12, atol=1e-14)
    weights = torch.randn(3, 5, 4, dtype=torch.float64)
    g_got = torch.autograd.grad((got * weights).sum() + 0.7 * neg_entropy.sum(), logits)[0]
    g_want = torch.autograd.grad((want * weights).sum() + 0.7 * want_neg_entropy.sum(), logits)[0]
    torch.testing.assert_close(g_got, g_want, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("zero", [False, True])
def test_bf16_logits_match_float32(zero):
    """bf16 logits are read in float32 (no [B, S, V] float32 copy): the loss equals the one from the
    same values cast to float32 (1e-6: only float32 summation order can differ)."""
    logits, data = distill_batch()
    logits = logits.detach().to(torch.bfloat16)
    cfg = {"kl_type": "mixed", "mixed_kl_weight": 0.5, "zero_outside_topk": zero}
    gvs, gvt = global_counts(data)
    loss_bf16, _ = DistillationLossFn(cfg)(logits, data, gvs, gvt)
    loss_f32, _ = DistillationLossFn(cfg)(logits.float(), data, gvs, gvt)
    assert loss_bf16.dtype == torch.float32
    torch.testing.assert_close(loss_bf16, loss_f32, rtol=1e-6, atol=0)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c['kl_type']}-zero{c['zero_outside_topk']}")
def test_microbatch_invariance(cfg):
    """1, 2 and 4 micro-batches give the full batch's loss and accumulated parameter gradients (1e-6;
    float64 makes the actual differences ~1e-15), with a tiny float64 model producing the logits."""
    _, data = distill_batch(batch=8, seq=6, vocab=11, topk=3, seed=5)
    data["sample_mask"][5] = 0
    counts = global_counts(data)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 11)).double()
    loss_fn = DistillationLossFn(cfg)

    def run(splits):
        model.zero_grad()
        total, step = 0.0, 8 // splits
        for i in range(splits):
            micro = split_batch(data, slice(i * step, (i + 1) * step))
            loss, _ = loss_fn(model(micro["input_ids"]), micro, *counts)
            loss.backward()
            total += loss.item()
        return total, [p.grad.clone() for p in model.parameters()]

    full_loss, full_grads = run(1)
    assert all(g.abs().sum() > 0 for g in full_grads)
    for splits in (2, 4):
        loss, grads = run(splits)
        assert loss == pytest.approx(full_loss, rel=1e-6)
        for g, g_full in zip(grads, full_grads):
            torch.testing.assert_close(g, g_full, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("zero", [False, True])
def test_sequence_packing_equals_padded(zero):
    """A packed row (sequences at 0, 8, 16, gaps between) gives the padded batch's loss, metrics and
    gradients (float64; 1e-10 relative)."""
    logits, data = distill_batch(batch=3, seq=6, seed=11)
    lengths, starts, total = [6, 5, 4], [0, 8, 16], 21  # random_batch's rows end at 6, 5, 4
    cfg = {"kl_type": "mixed", "mixed_kl_weight": 0.3, "zero_outside_topk": zero}
    gvs, gvt = global_counts(data)
    want, want_metrics = DistillationLossFn(cfg)(logits, data, gvs, gvt)
    (want_grad,) = torch.autograd.grad(want, logits)

    def pack(x):
        out = torch.zeros((1, total, *x.shape[2:]), dtype=x.dtype)
        for b, (start, length) in enumerate(zip(starts, lengths)):
            out[0, start : start + length] = x[b, :length]
        return out

    packed = {k: v if v.dim() == 1 else pack(v) for k, v in data.items()}
    packed_logits = pack(logits)
    wrapper = SequencePackingLossWrapper(
        DistillationLossFn(cfg), torch.tensor([0, 6, 11, 15]), torch.tensor([0, 8, 16, 21])
    )
    loss, metrics = wrapper(packed_logits, packed, gvs, gvt)
    (grad,) = torch.autograd.grad(loss, logits)
    torch.testing.assert_close(loss, want, rtol=1e-10, atol=0)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-14)
    assert metrics.keys() == want_metrics.keys()
    for key, value in want_metrics.items():
        assert float(metrics[key]) == pytest.approx(float(value), rel=1e-10), key


@pytest.mark.parametrize(
    "cfg, key",
    [
        ({"kl_type": "jensen"}, "kl_type"),
        ({"mixed_kl_weight": 1.5}, "mixed_kl_weight"),
        ({"mixed_kl_weight": -0.1}, "mixed_kl_weight"),
        ({"zero_outside_topk": "yes"}, "zero_outside_topk"),
        ({"temperature": 2.0}, "temperature"),
    ],
)
def test_invalid_config_names_the_key(cfg, key):
    with pytest.raises(ValueError, match=key):
        DistillationLossFn(cfg)


def test_defaults_are_nemo_rl_s():
    loss_fn = DistillationLossFn({})
    assert (loss_fn.kl_type, loss_fn.mixed_kl_weight, loss_fn.zero_outside_topk) == ("mixed", 0.5, False)


def test_missing_or_misshaped_teacher_data_is_a_clear_error():
    logits, data = distill_batch()
    for key in ("teacher_topk_logits", "teacher_topk_indices", "token_mask", "sample_mask"):
        broken = {k: v for k, v in data.items() if k != key}
        with pytest.raises(ValueError, match=key):
            DistillationLossFn({})(logits, broken, 3, 10)
    broken = {**data, "teacher_topk_logits": data["teacher_topk_logits"][..., :2]}
    with pytest.raises(ValueError, match="differ"):
        DistillationLossFn({})(logits, broken, 3, 10)
    broken = {**data, "teacher_topk_indices": data["teacher_topk_indices"][:, :3]}
    with pytest.raises(ValueError, match=r"\[B, S, k\]"):
        DistillationLossFn({})(logits, broken, 3, 10)


def test_minus_inf_student_logits_keep_gradients_finite():
    """A vocabulary entry masked to -inf (p = 0) outside the teacher's top-k: the full-vocabulary
    reverse KL and its gradient stay finite, and that entry's gradient is 0."""
    logits, data = distill_batch(batch=2, seq=5, vocab=9, topk=3)
    data["teacher_topk_indices"] = torch.arange(3).expand(2, 5, 3).contiguous()
    logits = logits.detach().clone()
    logits[..., 8] = float("-inf")
    logits.requires_grad_()
    cfg = {"kl_type": "reverse", "mixed_kl_weight": 0.5, "zero_outside_topk": True}
    loss, _ = DistillationLossFn(cfg)(logits, data, *global_counts(data))
    (grad,) = torch.autograd.grad(loss, logits)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert (grad[..., 8] == 0).all() and grad.abs().sum() > 0
