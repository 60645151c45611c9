"""MseValueLossFn: NeMo RL's test_ppo.py `mse_value_loss_*` and `compute_critic_metrics_*` cases,
hand-worked clipping, the shift of the head's output, and exact microbatch accumulation.

NeMo RL's loss receives values already aligned with the tokens; rmkit's takes the head's raw output
and shifts it. `_nemo_call` keeps NeMo RL's tensors unchanged by putting them after one leading
prompt position: `head[:, :-1]` is then NeMo RL's `values` and `returns[:, 1:]` its returns.
"""

import pytest
import torch
from loss_data import global_counts, random_batch, split_batch

from rmkit.losses import MseValueLossFn, reduce_metrics, value_explained_variance


def _nemo_call(loss_fn, values, returns, old_values, token_mask, sample_mask):
    pad = torch.zeros(values.shape[0], 1, dtype=values.dtype)
    head = torch.cat([values, pad], dim=1)
    data = {
        "token_mask": torch.cat([pad, token_mask], dim=1),
        "sample_mask": sample_mask,
        "returns": torch.cat([pad, returns], dim=1),
        "values": torch.cat([pad, old_values], dim=1),
    }
    return loss_fn(head, data, sample_mask.sum(), (token_mask * sample_mask[:, None]).sum())


def _nemo_data(batch=2, seq=4):
    torch.manual_seed(0)
    values = torch.randn(batch, seq, requires_grad=True)
    return values, torch.randn(batch, seq), torch.randn(batch, seq), torch.ones(batch, seq), torch.ones(batch)


def test_nemo_basic():
    values, returns, old, token_mask, sample_mask = _nemo_data()
    loss, _ = _nemo_call(MseValueLossFn({"scale": 1.0, "cliprange": None}), values, returns, old, token_mask, sample_mask)
    assert loss.ndim == 0 and loss.item() >= 0 and loss.requires_grad
    torch.testing.assert_close(loss, 0.5 * ((values - returns) ** 2).mean())


def test_nemo_clipping_never_lowers_the_loss():
    values, returns, old, token_mask, sample_mask = _nemo_data()
    clipped, _ = _nemo_call(MseValueLossFn({"scale": 1.0, "cliprange": 0.2}), values, returns, old, token_mask, sample_mask)
    plain, _ = _nemo_call(MseValueLossFn({"scale": 1.0, "cliprange": None}), values, returns, old, token_mask, sample_mask)
    assert clipped.ndim == 0 and clipped.item() >= plain.item() - 1e-6
    assert clipped.item() > plain.item()  # with random old values some token is clipped


def test_nemo_scale():
    data = _nemo_data()
    one, _ = _nemo_call(MseValueLossFn({"scale": 1.0}), *data)
    two, _ = _nemo_call(MseValueLossFn({"scale": 2.0}), *data)
    torch.testing.assert_close(two, one * 2.0)


def test_nemo_masking():
    values = torch.ones(2, 4, requires_grad=True)
    loss, _ = _nemo_call(MseValueLossFn({"scale": 1.0}), values, torch.zeros(2, 4), torch.zeros(2, 4),
                         torch.ones(2, 4), torch.tensor([1.0, 0.0]))
    assert loss.item() > 0
    assert loss.item() == pytest.approx(0.5)  # only sample 0: 0.5 * MSE(1, 0), over its 4 tokens


def test_nemo_perfect_prediction():
    returns = torch.randn(2, 4)
    loss, _ = _nemo_call(MseValueLossFn({"scale": 1.0}), returns.clone().requires_grad_(), returns, returns.clone(),
                         torch.ones(2, 4), torch.ones(2))
    assert loss.item() < 1e-6


def test_nemo_metric_keys():
    _, metrics = _nemo_call(MseValueLossFn({"scale": 0.4, "cliprange": 0.2}), *_nemo_data())
    assert {"returns_mean", "values_mean", "values_min", "values_max", "returns_sq_mean", "residual_sq_mean",
            "vf_clipfrac"} <= set(metrics)
    assert all(isinstance(v, torch.Tensor) and v.ndim == 0 and not v.requires_grad for v in metrics.values())


def test_nemo_squeezes_a_trailing_singleton():
    torch.manual_seed(0)
    head = torch.randn(2, 5, 1, requires_grad=True)
    data = {"token_mask": torch.ones(2, 5), "sample_mask": torch.ones(2), "returns": torch.randn(2, 5),
            "values": torch.randn(2, 5)}
    loss, _ = MseValueLossFn({"scale": 1.0})(head, data, 2, 8)
    assert loss.ndim == 0 and loss.item() >= 0
    torch.testing.assert_close(loss, 0.5 * ((head[:, :-1, 0] - data["returns"][:, 1:]) ** 2).mean())


def test_nemo_critic_metrics_explained_variance():
    per_microbatch = [
        {"values_min": torch.tensor(-2.0), "values_max": torch.tensor(1.0), "returns_mean": torch.tensor(1.0),
         "values_mean": torch.tensor(0.5), "returns_sq_mean": torch.tensor(5.0), "residual_sq_mean": torch.tensor(1.25)},
        {"values_min": torch.tensor(-1.0), "values_max": torch.tensor(3.0), "returns_mean": torch.tensor(0.0),
         "values_mean": torch.tensor(0.0), "returns_sq_mean": torch.tensor(0.0), "residual_sq_mean": torch.tensor(0.0)},
    ]
    total = reduce_metrics(per_microbatch)
    assert total["values_min"].item() == -2.0 and total["values_max"].item() == 3.0
    # Var(R) = 5 - 1 = 4, Var(R - V) = 1.25 - 0.5^2 = 1 -> 1 - 1/4
    assert value_explained_variance(total).item() == pytest.approx(0.75)
    zero_var = {"returns_mean": 2.0, "values_mean": 2.0, "returns_sq_mean": 4.0, "residual_sq_mean": 0.0}
    assert value_explained_variance(zero_var).item() == pytest.approx(1.0)


@pytest.mark.parametrize(
    "pred,old,ret,loss,clipfrac,grad",
    [
        # unclipped (1 - 0.5)^2 = 0.25 beats clipped (0.2 - 0.5)^2 = 0.09: 0.5 * 0.25, gradient (1 - 0.5)
        (1.0, 0.0, 0.5, 0.125, 0.0, 0.5),
        # clipped (0.2 - 0.5)^2 = 0.09 beats (0.6 - 0.5)^2 = 0.01: 0.045, and V is clamped: gradient 0
        (0.6, 0.0, 0.5, 0.045, 1.0, 0.0),
        # inside the range both terms are equal: not counted as clipped
        (0.1, 0.0, 0.5, 0.08, 0.0, -0.4),
    ],
)
def test_clipping_by_hand(pred, old, ret, loss, clipfrac, grad):
    head = torch.tensor([[pred, 0.0]], dtype=torch.float64, requires_grad=True)
    data = {"token_mask": torch.tensor([[0.0, 1.0]]), "sample_mask": torch.ones(1),
            "returns": torch.tensor([[9.0, ret]], dtype=torch.float64),
            "values": torch.tensor([[9.0, old]], dtype=torch.float64)}
    out, metrics = MseValueLossFn({"cliprange": 0.2})(head, data, 1, 1)
    out.backward()
    assert out.item() == pytest.approx(loss, abs=1e-12)
    assert metrics["vf_clipfrac"].item() == clipfrac
    assert head.grad[0, 0].item() == pytest.approx(grad, abs=1e-12)
    assert head.grad[0, 1].item() == 0.0  # the last position predicts nothing


def test_cliprange_zero_or_none_is_off_and_bad_configs():
    data = _nemo_data()
    off, _ = _nemo_call(MseValueLossFn(), *data)
    zero, _ = _nemo_call(MseValueLossFn({"cliprange": 0.0}), *data)
    torch.testing.assert_close(off, zero)
    with pytest.raises(ValueError, match="unknown key"):
        MseValueLossFn({"clip_range": 0.2})
    with pytest.raises(ValueError, match="cliprange"):
        MseValueLossFn({"cliprange": -0.1})


def test_head_output_is_shifted_onto_the_tokens():
    # head[:, t] is V(input_ids[:, :t+1]): matching returns[:, t+1] everywhere gives loss 0; unshifted does not.
    returns = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    data = {"token_mask": torch.ones(1, 4), "sample_mask": torch.ones(1), "returns": returns, "values": returns}
    loss_fn = MseValueLossFn()
    assert loss_fn(torch.tensor([[1.0, 2.0, 3.0, 0.0]]), data, 1, 3)[0].item() == 0.0
    assert loss_fn(returns, data, 1, 3)[0].item() == pytest.approx(0.5)


def test_no_valid_token_gives_zero_loss_and_infinite_extremes():
    data = {"token_mask": torch.zeros(1, 3), "sample_mask": torch.ones(1), "returns": torch.zeros(1, 3),
            "values": torch.zeros(1, 3)}
    loss, metrics = MseValueLossFn({"cliprange": 0.2})(torch.ones(1, 3), data, 1, 0)
    assert loss.item() == 0.0
    assert metrics["values_min"].item() == float("inf") and metrics["values_max"].item() == float("-inf")


def _value_batch(batch=8):
    _, data = random_batch(batch=batch, seq=6, vocab=11, seed=7)
    g = torch.Generator().manual_seed(8)
    valid = data["token_mask"] > 0
    for key in ("returns", "values"):  # padding holds NaN: the loss must never read it
        x = torch.randn(batch, 6, generator=g, dtype=torch.float64)
        data[key] = torch.where(valid, x, torch.full_like(x, float("nan")))
    data["sample_mask"][5] = 0
    return {k: data[k] for k in ("input_ids", "token_mask", "sample_mask", "returns", "values")}


@pytest.mark.parametrize("cliprange", [None, 0.2])
def test_microbatch_accumulation_is_exact(cliprange):
    """1, 2 and 4 microbatches give the full batch's loss, metrics and gradients (tolerance 1e-6
    relative; float64 makes the differences ~1e-15)."""
    data = _value_batch()
    counts = global_counts(data)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 8), torch.nn.Linear(8, 1)).double()
    loss_fn = MseValueLossFn({"scale": 0.4, "cliprange": cliprange})

    def run(splits):
        model.zero_grad()
        step, total, metrics = 8 // splits, 0.0, []
        for i in range(splits):
            micro = split_batch(data, slice(i * step, (i + 1) * step))
            loss, m = loss_fn(model(micro["input_ids"]), micro, *counts)
            loss.backward()
            total += loss.item()
            metrics.append(m)
        return total, reduce_metrics(metrics), [p.grad.clone() for p in model.parameters()]

    full_loss, full_metrics, full_grads = run(1)
    assert full_loss > 0 and all(g.abs().sum() > 0 for g in full_grads)
    if cliprange is not None:
        assert 0 < full_metrics["vf_clipfrac"].item() < 1
    for splits in (2, 4):
        loss, metrics, grads = run(splits)
        assert loss == pytest.approx(full_loss, rel=1e-6)
        for key, value in full_metrics.items():
            assert metrics[key].item() == pytest.approx(value.item(), rel=1e-6, abs=1e-12), key
        for g, g_full in zip(grads, full_grads):
            torch.testing.assert_close(g, g_full, rtol=1e-6, atol=1e-12)
