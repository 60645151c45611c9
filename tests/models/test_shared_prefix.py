"""The prompt computed once, several groups packed to a row (on the CPU: all in one row, attended group by group),
equals the unshared computation: logits at every real position and every parameter's gradient, on tiny random
Llama and Qwen2 causal LMs, for single completions, pairs (K = 2) and groups of 4, in every layout; and the
continuation rows alone (`continuations_only`) equal those positions of it."""

import pytest
import torch

from rmkit.losses.logprobs import aligned_logprobs
from rmkit.models import shared_prefix
from rmkit.models.shared_prefix import (
    ONE_ROW,
    PACKED,
    ROW_PER_GROUP,
    _packed,
    continuation_ends,
    layout_for,
    pack_groups,
    packed_inputs,
    shared_prefix_logits,
    shared_prefix_mask,
)
from tests.support.tiny import random_decoder

PAD = 0


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


@pytest.mark.parametrize("layout", [ONE_ROW, PACKED, ROW_PER_GROUP])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_shared_prefix_equals_unshared_forward_and_gradients(kind, k, layout, monkeypatch):
    model, groups = random_decoder(kind, pad_token_id=PAD), _groups(k)
    monkeypatch.setattr(shared_prefix, "layout_for", lambda *_: layout)
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


def test_the_cpu_takes_one_row_attended_group_by_group_and_restores_the_attention():
    model, groups = random_decoder("llama", pad_token_id=PAD), _groups(2)
    lengths = [len(p) + sum(map(len, conts)) for p, conts in groups]  # 21, 11, 15
    inputs = packed_inputs(model, groups, PAD)
    assert inputs["input_ids"].shape == (1, sum(lengths)) and "attention_mask" not in inputs  # no padding, no mask
    assert [(a, b) for a, b, _ in inputs["rmkit_groups"]] == [(0, 21), (21, 32), (32, 47)]
    assert all(m.shape == (1, 1, b - a, b - a) for a, b, m in inputs["rmkit_groups"])  # K = 2: the group's mask
    single = packed_inputs(model, _groups(1), PAD)
    assert all(m is None for _, _, m in single["rmkit_groups"])  # one continuation: causal, no mask
    seen = []
    handle = model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args: seen.append(module.config._attn_implementation))
    shared_prefix_logits(model, groups, PAD)
    handle.remove()
    assert seen == [shared_prefix.GROUPED_SDPA] and model.config._attn_implementation == "sdpa"
    packed = packed_inputs(model, groups, PAD, layout=PACKED)  # what a reward model's forward takes
    assert packed["input_ids"].shape == (3, 21) and packed["attention_mask"].shape == (3, 1, 21, 21)  # a row each


def test_mask_hides_other_continuations_and_other_groups_and_keeps_padding_finite():
    # Two groups in one row: (prompt 0, conts 1 and 2) then (prompt 3, cont 4), then padding.
    segment = torch.tensor([[0, 0, 1, 1, 2, 3, 4, -1]])
    owner = torch.tensor([[0, 0, 0, 0, 0, 3, 3, -1]])
    mask = shared_prefix_mask(segment, owner)[0, 0]
    assert mask[4].tolist() == [True, True, False, False, True, False, False, False]  # cont 2: the prompt and itself
    assert mask[3].tolist() == [True, True, True, True, False, False, False, False]
    assert mask[6].tolist() == [False] * 5 + [True, True, False]  # the second group sees nothing of the first
    assert mask[7].tolist() == [False] * 7 + [True]  # a padding query attends to itself only


def test_groups_pack_into_rows_no_longer_than_the_longest_group():
    groups = [([1] * 10, [[2] * 5]), ([3] * 2, [[4] * 2, [5]]), ([6] * 4, [[7] * 3]), ([8] * 3, [[9] * 4])]
    places = pack_groups(groups)  # lengths 15, 5, 7, 7: rows [15], [7, 7], and 5 fits nowhere else
    assert places == [(0, 0), (2, 0), (1, 0), (1, 7)]
    input_ids, position_ids, segment, owner, _ = _packed(groups, pad_token_id=0)
    assert input_ids.shape == (3, 15)
    assert input_ids[1].tolist() == [6] * 4 + [7] * 3 + [8] * 3 + [9] * 4 + [0]
    assert position_ids[1].tolist() == [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0]  # each group from 0
    assert segment[2].tolist()[:5] == [0, 0, 1, 1, 2] and owner[2].tolist()[:5] == [0] * 5
    rows, positions = continuation_ends(groups)
    assert list(zip(rows.tolist(), positions.tolist())) == [(0, 14), (2, 3), (2, 4), (1, 6), (1, 13)]


def test_a_forward_without_grouped_attention_never_gets_one_row():
    """A CPU decoder takes its groups in one row, unless the caller's forward takes only a mask (a reward
    model's): then packed rows, or a row per group under CUDA graphs."""
    model = random_decoder("llama", pad_token_id=PAD)
    assert layout_for(model) == ONE_ROW
    assert layout_for(model, grouped=False) == PACKED
    assert layout_for(model, width_multiple=32, grouped=False) == ROW_PER_GROUP


def test_rows_in_few_shapes_take_a_group_each():
    """Under CUDA graphs (`width_multiple`) a batch of n groups is n rows, whatever their lengths."""
    groups = [([1] * 10, [[2] * 5]), ([3] * 2, [[4] * 2, [5]]), ([6] * 4, [[7] * 3]), ([8] * 3, [[9] * 4])]
    assert layout_for(random_decoder("llama", pad_token_id=PAD), width_multiple=32) == ROW_PER_GROUP
    assert pack_groups(groups, ROW_PER_GROUP) == [(0, 0), (1, 0), (2, 0), (3, 0)]
    input_ids, _, segment, _, _ = _packed(groups, pad_token_id=0, width_multiple=32, layout=ROW_PER_GROUP)
    assert input_ids.shape == (4, 32) and input_ids[1].tolist()[:6] == [3, 3, 4, 4, 5, 0]
    assert segment[1].tolist()[:6] == [0, 0, 1, 1, 2, -1]
    rows, positions = continuation_ends(groups, ROW_PER_GROUP)
    assert list(zip(rows.tolist(), positions.tolist())) == [(0, 14), (1, 3), (1, 4), (2, 6), (3, 6)]


@pytest.mark.parametrize("k", [1, 2, 4])
def test_continuations_only_equals_those_positions_and_runs_the_output_layer_there(k):
    """The rows `[last prompt token, cont_k]`: equal to the full layout's positions, gradients included, and the
    output layer sees only those positions."""
    model, groups = random_decoder("llama", pad_token_id=PAD), _groups(k)
    full = shared_prefix_logits(model, groups, PAD)
    seen = []
    handle = model.get_output_embeddings().register_forward_hook(lambda _, args, out: seen.append(args[0].shape))
    got = shared_prefix_logits(model, groups, PAD, continuations_only=True)
    handle.remove()
    rows = [(len(p), len(c)) for p, conts in groups for c in conts]
    assert got.shape[:2] == (len(rows), 1 + max(c for _, c in rows)) and seen == [got.shape[:2] + (32,)]
    for r, (p, c) in enumerate(rows):
        torch.testing.assert_close(got[r, :c + 1], full[r, p - 1:p + c], rtol=1e-5, atol=1e-5)
    weight = torch.randn(got.shape[:2] + (64,), generator=torch.Generator().manual_seed(3))
    real = torch.zeros(got.shape[:2])
    for r, (_, c) in enumerate(rows):
        real[r, :c + 1] = 1
    full_weight = torch.zeros(full.shape)
    for r, (p, c) in enumerate(rows):
        full_weight[r, p - 1:p + c] = weight[r, :c + 1]
    got_grads = torch.autograd.grad((got * weight * real[..., None]).sum(), list(model.parameters()))
    full_grads = torch.autograd.grad((shared_prefix_logits(model, groups, PAD) * full_weight).sum(),
                                     list(model.parameters()))
    for (name, _), a, b in zip(model.named_parameters(), got_grads, full_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
