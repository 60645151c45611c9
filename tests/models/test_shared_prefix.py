"""The prompt computed once equals the unshared computation: logits at every real position and every
parameter's gradient, on tiny random Llama and Qwen2 causal LMs, for pairs (K = 2) and groups of 4."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rmkit.losses.logprobs import aligned_logprobs
from rmkit.models.shared_prefix import shared_prefix_logits, shared_prefix_mask

PAD = 0


def _model(kind: str):
    torch.manual_seed(0)
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, pad_token_id=PAD)
    config = LlamaConfig(**common) if kind == "llama" else Qwen2Config(**common)
    return (LlamaForCausalLM if kind == "llama" else Qwen2ForCausalLM)(config).float()


def _groups(k: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(1, 64, (n,), generator=g).tolist()  # noqa: E731
    return [(rand(p), [rand(int(n)) for n in torch.randint(1, 9, (k,), generator=g)]) for p in (7, 3, 12)]


def _unshared(model, groups):
    rows = [list(p) + list(c) for p, conts in groups for c in conts]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, :len(row)], mask[i, :len(row)] = torch.tensor(row), 1
    return model(input_ids=ids, attention_mask=mask).logits, ids, mask


def _loss(logits, ids, mask):
    # The sum of every real token's log-prob: a gradient through every position a caller could use.
    return (aligned_logprobs(logits, ids)[:, 1:] * mask[:, 1:]).sum()


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("k", [2, 4])
def test_shared_prefix_equals_unshared_forward_and_gradients(kind, k):
    model, groups = _model(kind), _groups(k)
    expected, ids, mask = _unshared(model, groups)
    expected_loss = _loss(expected, ids, mask)
    expected_grads = torch.autograd.grad(expected_loss, list(model.parameters()))
    got = shared_prefix_logits(model, groups, PAD)
    assert got.shape == expected.shape
    real = mask.bool()
    # float32: the same sums in another order (attention over a longer masked row); 1e-5 is ~100 ulp here.
    torch.testing.assert_close(got[real], expected[real], rtol=1e-5, atol=1e-5)
    got_grads = torch.autograd.grad(_loss(got, ids, mask), list(model.parameters()))
    for (name, _), a, b in zip(model.named_parameters(), got_grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_mask_hides_other_continuations_and_keeps_padding_finite():
    segment = torch.tensor([[0, 0, 1, 1, 2, -1]])
    mask = shared_prefix_mask(segment)[0, 0]
    assert mask[4].tolist() == [True, True, False, False, True, False]  # cont 2 sees the prompt and itself
    assert mask[3].tolist() == [True, True, True, True, False, False]
    assert mask[5].tolist() == [False] * 5 + [True]  # a padding query attends to itself only
