"""Exact gradient accumulation: micro-batch 1 x accumulation 8 == micro-batch 8 x accumulation 1.

Each micro-batch loss is divided by the global batch's pair count, so the summed micro-batch gradients
equal the full-batch gradient. Only float rounding differs (different padding and matmul shapes):
tolerances 1e-6 absolute on the loss, 1e-5 relative + 1e-7 absolute on gradients and weights (float32).
"""

import copy
import random

import pytest
import torch

from rmkit.config import OptimizerConfig, SchedulerConfig
from rmkit.data.tokenize import TokenizedExample, TokenizedPair
from rmkit.models import load_reward_model
from rmkit.models.reward_forward import ChunkedRewards
from rmkit.models.setup import RewardForward
from rmkit.recipes.rm import bradley_terry_step, regression_step
from rmkit.trainer.optim import build_optimizer, build_scheduler, optimizer_step


def _pairs(n: int, vocab: int, seed: int = 0) -> list[TokenizedPair]:
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        c = [101] + [rng.randrange(1000, vocab) for _ in range(rng.randint(3, 20))] + [102]
        r = [101] + [rng.randrange(1000, vocab) for _ in range(rng.randint(3, 20))] + [102]
        pairs.append(TokenizedPair(c, r, margin=0.5 if i % 3 == 0 else None, source=f"x:{i}"))
    return pairs


def _run(model, items, micro, step_fn):
    forward = ChunkedRewards(RewardForward(model))
    # Adam's first step is ~lr * sign(g): a large eps keeps it smooth in g, so that float rounding in
    # near-zero gradients cannot flip a sign and the weight comparison tests the accumulation.
    optimizer = build_optimizer(model, OptimizerConfig(lr=1e-2, weight_decay=0.1, eps=1e-3))
    scheduler = build_scheduler(optimizer, SchedulerConfig(name="constant"), 10)
    metrics = step_fn(forward, items, micro, 0, "float32", torch.device("cpu"))
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    optimizer_step(model, optimizer, scheduler, max_grad_norm=1.0)
    return metrics, grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def _assert_same(a, b):
    (m1, g1, w1), (m2, g2, w2) = a, b
    assert abs(float(m1["loss"]) - float(m2["loss"])) < 1e-6
    assert g1.keys() == g2.keys() and len(g1) > 0
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], rtol=1e-5, atol=1e-7, msg=name)
    # Adam moves a weight by up to lr / eps = 10x its gradient's rounding error (a near-zero gradient,
    # e.g. the head bias, whose gradient is exactly 0 in theory): 10 x the gradients' 1e-7.
    for name in w1:
        torch.testing.assert_close(w1[name], w2[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("fixture", ["tiny_decoder", "tiny_encoder"])
def test_bradley_terry_micro1_x8_equals_micro8_x1(fixture, request):
    model, tokenizer = load_reward_model(request.getfixturevalue(fixture), num_labels=1)
    model.train()
    for module in model.modules():  # dropout off: both runs must see the same function
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    pairs = _pairs(8, len(tokenizer))
    one = _run(copy.deepcopy(model), pairs, 1, bradley_terry_step)
    eight = _run(copy.deepcopy(model), pairs, 8, bradley_terry_step)
    four = _run(copy.deepcopy(model), pairs, 4, bradley_terry_step)
    _assert_same(one, eight)
    _assert_same(four, eight)
    # the loss is the mean over pairs of -log sigmoid(r_c - r_r - margin): at init it is near ln 2
    assert 0.3 < float(eight[0]["loss"]) < 1.2


def test_regression_micro1_x4_equals_micro4_x1(tiny_decoder):
    model, tokenizer = load_reward_model(tiny_decoder, num_labels=3)
    rng = random.Random(1)
    examples = [TokenizedExample([101] + [rng.randrange(1000, 5000) for _ in range(rng.randint(2, 15))] + [102],
                                 (rng.random(), -100.0 if i % 2 else rng.random(), rng.random()))
                for i in range(4)]
    _assert_same(_run(copy.deepcopy(model), examples, 1, regression_step),
                 _run(copy.deepcopy(model), examples, 4, regression_step))
