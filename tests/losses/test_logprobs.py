"""The chunked per-token log-probs against log_softmax in float64, values and gradients."""

import pytest
import torch

from rmkit.losses import aligned_logprobs, next_token_logprobs


def _naive(logits, input_ids):
    return torch.log_softmax(logits.double(), -1)[:, :-1].gather(-1, input_ids[:, 1:, None]).squeeze(-1)


@pytest.mark.parametrize("chunk_elements", [1, 7, 40, 130, 1 << 20])  # row parts, row groups, all
def test_float64_matches_log_softmax_values_and_gradients(chunk_elements):
    # float64 end to end: agreement to 1e-12 absolute (log-probs are O(1..10)).
    logits = torch.randn(3, 6, 13, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 13, (3, 6))
    got = next_token_logprobs(logits, ids, chunk_elements=chunk_elements)
    want = _naive(logits, ids)
    assert got.shape == (3, 5) and got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    upstream = torch.randn(3, 5, dtype=torch.float64)
    (g_got,) = torch.autograd.grad(got, logits, upstream)
    (g_want,) = torch.autograd.grad(want, logits, upstream)
    torch.testing.assert_close(g_got, g_want, rtol=0, atol=1e-12)
    assert torch.all(g_got[:, -1] == 0)  # the last position predicts no token


def test_bf16_logits_give_float32_log_probs_and_bf16_gradients():
    # The float32 math sees the same bf16 values as the float64 reference: error is float32
    # rounding only (1e-5 absolute); the gradient is rounded to bf16 (relative 2^-8).
    logits = (3 * torch.randn(2, 5, 1000)).bfloat16().requires_grad_()
    ids = torch.randint(0, 1000, (2, 5))
    got = next_token_logprobs(logits, ids, chunk_elements=2000)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), _naive(logits, ids), rtol=0, atol=1e-5)
    got.sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    want = torch.softmax(logits.detach().double(), -1).neg()
    want[:, :-1].scatter_add_(-1, ids[:, 1:, None], torch.ones(2, 4, 1, dtype=torch.float64))
    want[:, -1] = 0
    torch.testing.assert_close(logits.grad.double(), want, rtol=1e-2, atol=1e-3)


def test_non_contiguous_logits_slice():
    # A slice of a packed row (as the packing wrapper passes) is read in place.
    full = torch.randn(1, 10, 9, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 9, (1, 4))
    got = next_token_logprobs(full[:, 3:7], ids, chunk_elements=9)
    torch.testing.assert_close(got, _naive(full[:, 3:7], ids), rtol=0, atol=1e-12)


def test_shape_errors_are_clear():
    with pytest.raises(ValueError, match="disagree"):
        next_token_logprobs(torch.randn(2, 5, 3), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[B, S, V\]"):
        next_token_logprobs(torch.randn(5, 3), torch.zeros(5, dtype=torch.long))


def test_aligned_logprobs_match_the_data_layout():
    # [B, S] with 0 at position 0 and log p(input_ids[:, t]) at t: what prev_logprobs etc. hold.
    logits = torch.randn(2, 5, 7, dtype=torch.float64)
    ids = torch.randint(0, 7, (2, 5))
    got = aligned_logprobs(logits, ids)
    assert got.shape == (2, 5) and torch.all(got[:, 0] == 0)
    torch.testing.assert_close(got[:, 1:], _naive(logits, ids), rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunk_elements", [1, 40, 1 << 20])
def test_inplace_backward_matches_reference_and_reuses_the_logits_storage(chunk_elements):
    # The model-side case: logits come out of a matmul, so the gradient reaching the weight is
    # what counts. The in-place backward must give it to 1e-12 and write into the logits' buffer.
    hidden = torch.randn(3, 6, 4, dtype=torch.float64)
    weight = torch.randn(4, 13, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 13, (3, 6))
    upstream = torch.randn(3, 5, dtype=torch.float64)
    logits = hidden @ weight
    logits_ptr = logits.data_ptr()
    got = next_token_logprobs(logits, ids, chunk_elements=chunk_elements, inplace_backward=True)
    torch.testing.assert_close(got, _naive(hidden @ weight, ids), rtol=0, atol=1e-12)
    (g_logits,) = torch.autograd.grad(got, logits, upstream, retain_graph=True)
    assert g_logits.data_ptr() == logits_ptr  # no new [B, S, V] buffer
    (g_want,) = torch.autograd.grad(_naive(hidden @ weight, ids), weight, upstream)
    logits = hidden @ weight
    got = next_token_logprobs(logits, ids, chunk_elements=chunk_elements, inplace_backward=True)
    (g_got,) = torch.autograd.grad(got, weight, upstream)
    torch.testing.assert_close(g_got, g_want, rtol=0, atol=1e-12)


def test_inplace_backward_bf16_and_a_slice_of_a_packed_row():
    # bf16 logits: same bf16 gradient as the out-of-place backward (both round float32 math once).
    logits = (3 * torch.randn(2, 5, 1000)).bfloat16()
    ids = torch.randint(0, 1000, (2, 5))
    upstream = torch.randn(2, 4)
    out_of_place = logits.clone().requires_grad_()
    next_token_logprobs(out_of_place, ids, chunk_elements=2000).backward(upstream)
    in_place = logits.clone().requires_grad_()
    next_token_logprobs(in_place, ids, chunk_elements=2000, inplace_backward=True).backward(upstream)
    torch.testing.assert_close(in_place.grad.float(), out_of_place.grad.float(), rtol=1e-2, atol=1e-4)
    # A view into a larger row: the gradient lands in the right positions of the base.
    full = torch.randn(1, 10, 9, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 9, (1, 4))
    (g_want,) = torch.autograd.grad(_naive(full[:, 3:7], ids).sum(), full)
    part = full.clone()[:, 3:7]
    got = next_token_logprobs(part, ids, chunk_elements=9, inplace_backward=True)
    (g_got,) = torch.autograd.grad(got.sum(), full)
    torch.testing.assert_close(g_got, g_want, rtol=0, atol=1e-12)


def test_inplace_backward_fails_loudly_when_something_else_saved_the_logits():
    # logits ** 2 saves the logits for its own backward, which runs after ours (it was recorded
    # first): torch must refuse the overwritten values, not use them.
    weight = torch.randn(4, 7, dtype=torch.float64, requires_grad=True)
    logits = torch.randn(2, 5, 4, dtype=torch.float64) @ weight
    ids = torch.randint(0, 7, (2, 5))
    other = (logits**2).sum()
    loss = next_token_logprobs(logits, ids, inplace_backward=True).sum() + other
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
