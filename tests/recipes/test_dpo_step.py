"""The DPO step's numbers against a slow per-pair reference, exact accumulation, the interleaved layout and
the reference-log-prob cache (tiny random Llama policy with SmolLM2's tokenizer)."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from rmkit.data import load_preference_data
from rmkit.data.policy_tokenize import tokenize_policy_pairs
from rmkit.losses.dpo import DPOLossFn
from rmkit.models.pair_logprobs import PairLogits, pair_batch
from rmkit.models.policy import load_policy_model
from rmkit.recipes.dpo import dpo_step, validate_pairs
from rmkit.trainer import reference_logprobs as reference_cache
from rmkit.trainer.reference_logprobs import (
    compute_reference,
    reference_context,
    reference_logprobs,
    weights_digest,
)
from tests.recipes.dpo_helpers import write_pairs

LOSS_CFG = {"reference_policy_kl_penalty": 0.5, "preference_loss_weight": 1.0, "sft_loss_weight": 0.3,
            "preference_average_log_probs": False, "sft_average_log_probs": False}


@pytest.fixture(scope="module")
def setup(tiny_policy, tmp_path_factory):
    """`(policy, reference model, tokenizer, pairs)`: the reference is the policy with perturbed weights,
    so the implicit rewards are not zero."""
    policy, tokenizer = load_policy_model(tiny_policy)
    reference = copy.deepcopy(policy)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn_like(p))
    path = write_pairs(tmp_path_factory.mktemp("data") / "pairs.jsonl", 6)
    pairs = tokenize_policy_pairs(load_preference_data(path).records, tokenizer, 64).pairs
    return policy, reference, tokenizer, pairs


def slow_sequence_logprob(model, prompt, response):
    """Sum and count of log p(response tokens | prompt) of one unpadded row, token by token from the logits."""
    ids = torch.tensor([prompt + response])
    logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    return sum(logp[t - 1, ids[0, t]] for t in range(len(prompt), ids.shape[1]))


def slow_dpo(policy, reference, pairs, cfg):
    """DPO loss and metrics by a loop over pairs (the paper's formula, nothing shared with rmkit's code)."""
    beta, losses, nlls, chosen_r, rejected_r = cfg["reference_policy_kl_penalty"], [], [], [], []
    for pair in pairs:
        with torch.no_grad():
            ref_c = slow_sequence_logprob(reference, pair.prompt_ids, pair.chosen_ids)
            ref_r = slow_sequence_logprob(reference, pair.prompt_ids, pair.rejected_ids)
        pol_c = slow_sequence_logprob(policy, pair.prompt_ids, pair.chosen_ids)
        pol_r = slow_sequence_logprob(policy, pair.prompt_ids, pair.rejected_ids)
        r_c, r_r = pol_c - ref_c, pol_r - ref_r
        losses.append(-F.logsigmoid(beta * (r_c - r_r)))
        nlls.append(-pol_c)
        chosen_r.append(r_c.detach())
        rejected_r.append(r_r.detach())
    n = len(pairs)
    pref, sft = sum(losses) / n, sum(nlls) / n
    loss = cfg["preference_loss_weight"] * pref + cfg["sft_loss_weight"] * sft
    metrics = {"loss": loss.item(), "preference_loss": pref.item(), "sft_loss": sft.item(),
               "accuracy": sum(float(c > r) for c, r in zip(chosen_r, rejected_r)) / n,
               "rewards_chosen_mean": sum(chosen_r).item() / n, "rewards_rejected_mean": sum(rejected_r).item() / n}
    metrics["rewards_margin_mean"] = metrics["rewards_chosen_mean"] - metrics["rewards_rejected_mean"]
    return loss, metrics


def test_pair_batch_is_interleaved_with_response_mask(setup):
    _, _, tokenizer, pairs = setup
    data = pair_batch(pairs[:2], tokenizer.pad_token_id)
    for i, pair in enumerate(pairs[:2]):
        for row, side in ((2 * i, pair.chosen_ids), (2 * i + 1, pair.rejected_ids)):
            length = 1 + len(side)  # from the prompt's last token on
            assert data["input_ids"][row, :length].tolist() == pair.prompt_ids[-1:] + side
            assert data["token_mask"][row].nonzero().flatten().tolist() == list(range(1, length))
            assert data["attention_mask"][row].sum() == length


def test_step_matches_slow_reference(setup):
    """Loss, every metric and the gradient of every parameter equal the per-pair loop. Tolerances: a reward is
    the difference of two float32 sums of ~20 log-probs near -11 (sums ~200, rounding ~2e-5), so values
    agree to 1e-4 absolute; gradients to 1e-4 relative + 1e-6 absolute."""
    policy, reference, tokenizer, pairs = setup
    model = copy.deepcopy(policy)
    refs = compute_reference(PairLogits(reference, tokenizer.pad_token_id, "float32"), pairs, 4)
    metrics = dpo_step(PairLogits(model, tokenizer.pad_token_id, "float32"), DPOLossFn(LOSS_CFG), pairs, refs, 4)

    slow_model = copy.deepcopy(policy)
    slow_loss, expected = slow_dpo(slow_model, reference, pairs, LOSS_CFG)
    slow_loss.backward()
    assert abs(expected["rewards_margin_mean"]) > 1e-3  # the reference differs from the policy
    for key, value in expected.items():
        assert float(metrics[key]) == pytest.approx(value, rel=1e-5, abs=1e-4), key
    assert float(metrics["num_valid_samples"]) == len(pairs)
    for (name, p), q in zip(model.named_parameters(), slow_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_policy_equal_to_reference_gives_ln2(setup):
    policy, _, tokenizer, pairs = setup
    forward = PairLogits(copy.deepcopy(policy), tokenizer.pad_token_id, "float32")
    refs = compute_reference(forward, pairs, 3)  # other micro-batches (other padding) than the step's
    cfg = {**LOSS_CFG, "sft_loss_weight": 0.0}
    metrics = validate_pairs(forward, DPOLossFn(cfg), pairs, refs, 2)
    assert metrics["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert metrics["rewards_chosen_mean"] == pytest.approx(0.0, abs=1e-5)


def test_accumulation_is_exact(setup):
    """Micro-batch 1 x 6 accumulation steps == one micro-batch of 6: the same metrics and gradients, hence the
    same weights after an optimizer step. Compared on the gradients (float32: 1e-4 relative, 1e-7 absolute)
    and on an SGD step: Adam's first step divides a gradient by its own magnitude, which turns the rounding
    noise of a gradient near zero into a full-size update of either sign."""
    policy, reference, tokenizer, pairs = setup
    refs = compute_reference(PairLogits(reference, tokenizer.pad_token_id, "float32"), pairs, 6)
    results = []
    for micro in (1, 6):
        model = copy.deepcopy(policy)
        metrics = dpo_step(PairLogits(model, tokenizer.pad_token_id, "float32"), DPOLossFn(LOSS_CFG), pairs, refs, micro)
        grads = [p.grad.clone() for p in model.parameters()]
        torch.optim.SGD(model.parameters(), lr=0.1).step()
        results.append((metrics, grads, model))
    (m1, g1, a), (m6, g6, b) = results
    for key in m1:
        assert float(m1[key]) == pytest.approx(float(m6[key]), rel=1e-5, abs=1e-5), key
    for (name, p), q, x, y in zip(a.named_parameters(), b.parameters(), g1, g6):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-7, msg=name)
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7, msg=name)


def test_reference_cache_is_reused_and_invalidated(setup, tmp_path, monkeypatch):
    policy, _, tokenizer, pairs = setup
    model = copy.deepcopy(policy)
    forward = PairLogits(model, tokenizer.pad_token_id, "float32")
    calls = []
    monkeypatch.setattr(reference_cache, "compute_reference",
                        lambda *a: calls.append(1) or compute_reference(*a))
    weights, settings = weights_digest(model), {"max_total_sequence_length": 64}
    first = reference_logprobs(forward, pairs, 2, tmp_path, "train", weights, settings)
    files = list(tmp_path.iterdir())
    mtime = files[0].stat().st_mtime_ns
    again = reference_logprobs(forward, pairs, 2, tmp_path, "train", weights, settings)
    assert len(calls) == 1 and list(tmp_path.iterdir()) == files and files[0].stat().st_mtime_ns == mtime
    for (c1, r1), (c2, r2) in zip(first, again):
        assert torch.equal(c1, c2) and torch.equal(r1, r2)

    reference_logprobs(forward, pairs, 2, tmp_path, "train", weights, {"max_total_sequence_length": 32})
    reference_logprobs(forward, pairs[:-1], 2, tmp_path, "train", weights, settings)
    with torch.no_grad():
        model.lm_head.weight[0, 0] += 1.0  # tied to the embeddings: one changed weight
    reference_logprobs(forward, pairs, 2, tmp_path, "train", weights_digest(model), settings)
    assert len(calls) == 4 and len(list(tmp_path.iterdir())) == 4


def test_lora_reference_is_the_base_model(setup):
    """Under LoRA the reference pass runs with the adapters disabled, and the weights' digest leaves them out."""
    from rmkit.config import LoraConfig, PolicyConfig
    from rmkit.models.setup import prepare_model

    policy, _, tokenizer, pairs = setup
    base = copy.deepcopy(policy)
    lora = prepare_model(copy.deepcopy(policy), PolicyConfig(lora=LoraConfig(enabled=True, r=4)))
    digest = weights_digest(lora)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.add_(0.5)  # adapters that change the outputs
    assert weights_digest(lora) == digest
    refs = compute_reference(PairLogits(lora, tokenizer.pad_token_id, "float32"), pairs, 6)
    expected = compute_reference(PairLogits(base, tokenizer.pad_token_id, "float32"), pairs, 6)
    adapted, data = PairLogits(lora, tokenizer.pad_token_id, "float32")(pairs[:1])
    with reference_context(lora):
        plain, _ = PairLogits(lora, tokenizer.pad_token_id, "float32")(pairs[:1])
    assert not torch.allclose(adapted, plain)
    for (c1, r1), (c2, r2) in zip(refs, expected):
        torch.testing.assert_close(c1, c2, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(r1, r2, rtol=1e-5, atol=1e-5)
