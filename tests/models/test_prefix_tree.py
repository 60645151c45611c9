"""Sequences that share beginnings, each shared beginning computed once (`rmkit.models.prefix_tree`), equal the plain
padded forward: a scalar head's value at every real position and every parameter's gradient, on tiny random Llama
and Qwen2 classifiers, on the one-row CPU layout and with a row per tree; the trie against a hand-built one; and
`tree_pays`, the estimate that decides `prm.share_prefixes: auto`, against a count by hand."""

import pytest
import torch

from rmkit.models import prefix_tree
from rmkit.models.critic import TokenValues
from rmkit.models.prefix_tree import TREE_MARGIN, tree_layout, tree_pays, tree_values
from rmkit.models.shared_prefix import ONE_ROW, PACKED
from tests.support.tiny import random_decoder

PAD = 0


def _solutions(seed: int = 1) -> list[list[int]]:
    """Branching like PRM800K's: two problems; the first with three solutions that part after steps 1 and 2, one
    the start of another; the second problem alone; a third that shares only its first token with the first."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(1, 64, (n,), generator=g).tolist()  # noqa: E731
    problem, step1, step2a, step2b, step3 = rand(6), rand(4), rand(3), rand(5), rand(2)
    other = rand(9)
    first = problem[:1] + rand(4)
    return [problem + step1 + step2a + step3, problem + step1 + step2b, problem + step1, other,
            problem + step1 + step2a, first]


def _plain(forward, sequences):
    width = max(map(len, sequences))
    ids = torch.full((len(sequences), width), PAD)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, row in enumerate(sequences):
        ids[i, :len(row)], mask[i, :len(row)] = torch.tensor(row), 1
    return forward(ids, mask), mask


def test_the_trie_against_a_hand_built_one():
    a, b, c = [5, 6, 7, 8], [5, 6, 9], [4, 6]
    layout = tree_layout([a, b, c, a[:2]])
    # depth first: 5 6 7 8 | 9 under 6 | then the tree of 4
    assert layout.token_ids == [5, 6, 7, 8, 9, 4, 6]
    assert layout.parent == [-1, 0, 1, 2, 1, -1, 5]
    assert layout.depth == [0, 1, 2, 3, 2, 0, 1]
    assert layout.trees == [(0, 5), (5, 7)]
    assert layout.index == [[0, 1, 2, 3], [0, 1, 4], [5, 6], [0, 1]]
    assert layout.shared_tokens == 4 + 3 + 2 + 2 - 7
    mask = layout.tree_mask(0, 5)[0, 0]
    assert mask[4].tolist() == [True, True, False, False, True]  # 9 sees 5, 6 and itself, not 7 or 8
    assert mask[3].tolist() == [True, True, True, True, False]
    assert layout.tree_mask(5, 7) is None  # one chain: causal
    with pytest.raises(ValueError, match="empty"):
        tree_layout([[1], []])


@pytest.mark.parametrize("layout", [ONE_ROW, PACKED])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_tree_values_equal_the_plain_forward_and_its_gradients(kind, layout, monkeypatch):
    model = random_decoder(kind, classifier=True, pad_token_id=PAD)
    forward, sequences = TokenValues(model), _solutions()
    monkeypatch.setattr(prefix_tree, "layout_for", lambda *_: layout)
    expected, mask = _plain(forward, sequences)
    weights = torch.randn(expected.shape, generator=torch.Generator().manual_seed(3)) * mask  # any loss over them
    expected_grads = torch.autograd.grad((expected * weights).sum(), list(model.parameters()))
    got = tree_values(forward, model, tree_layout(sequences), PAD)
    assert got.shape == expected.shape
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], rtol=1e-5, atol=1e-5)
    got_grads = torch.autograd.grad((got * weights).sum(), list(model.parameters()))
    for (name, _), a, b in zip(model.named_parameters(), got_grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_the_cpu_runs_the_shared_tokens_once_in_one_row():
    model = random_decoder("llama", classifier=True, pad_token_id=PAD)
    sequences = _solutions()
    layout = tree_layout(sequences)
    inputs, where = prefix_tree.tree_inputs(model, layout, PAD)
    assert inputs["input_ids"].shape == (1, len(layout.token_ids)) and "attention_mask" not in inputs
    assert len(layout.token_ids) == sum(map(len, sequences)) - layout.shared_tokens < sum(map(len, sequences)) / 2
    assert [(a, b) for a, b, _ in inputs["rmkit_groups"]] == layout.trees
    assert where.shape == (2, len(sequences), max(map(len, sequences)))


def test_tree_pays_against_a_count_by_hand():
    """The tiny Llama (hidden 32, 2 layers, 4 heads of 8, 2 key-value heads, MLP 64): per layer q and o 32x32, k and v
    32x16, the MLP 3x32x64 and two norms; a final norm and the one-output head. Two sequences that share a beginning
    of `m` tokens and go on for `t` more each: one tree of m + 2t tokens against two padded rows of m + t."""
    model = random_decoder("llama", classifier=True, pad_token_id=PAD)
    params = 2 * (2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 64 + 2 * 32) + 32 + 32
    per_token, per_pair = 2 * params, 4 * 32 * 2
    for m, t in [(40, 2), (30, 10), (20, 20), (10, 30), (2, 40), (0, 40)]:
        beginning = list(range(1, m + 1))
        sequences = [beginning + [50] * t, beginning + [51] * t]
        tree, width = (m + 2 * t, m + t) if m else (None, t)
        trees = [tree] if m else [t, t]
        cost = sum(n * (per_token + per_pair * n) for n in trees)
        padded = 2 * width * (per_token + per_pair * width)
        assert tree_pays(tree_layout(sequences), model) == (cost <= TREE_MARGIN * padded), (m, t)
    shared = [list(range(1, 41)) + [50, 51], list(range(1, 41)) + [52]]
    disjoint_tails = [[1] + [50] * 40, [1] + [51] * 40]  # a common first token (a template's) and nothing more
    assert tree_pays(tree_layout(shared), model) and not tree_pays(tree_layout(disjoint_tails), model)
    assert not tree_pays(tree_layout([[1, 2, 3], [4, 5, 6]]), model)  # nothing shared: the trees are the rows
