"""Sequences that share beginnings through a decoder with every shared beginning computed once (a prefix tree).

PRM800K's solutions branch: at a step its raters saw several candidate next steps, and each candidate starts a
solution of its own that repeats the problem and every step before it. The first 256 training solutions hold 4.2x
the characters of their prefix tree (2,048 solutions: 5.4x). A decoder's output at a token depends only on the
tokens up to it, so two sequences that begin with the same m tokens have the same hidden states there: those m
tokens need to go through the model once.

`tree_layout` builds the token trie of a batch of sequences and lays each tree (the sequences under one first
token) out in depth-first order: a token attends to its ancestors in the trie and to itself, and its position id is
its depth (its position in every sequence that passes through it). Every sequence's value at every one of its
positions is then the tree's value at that token, equal to the plain padded forward's within float rounding, and
so is every gradient: a loss over the gathered values (`tree_values`) is the unshared loss, a token shared by k
sequences receiving the sum of their k gradients.

On the CPU the trees go end to end in one row attended tree by tree (`rmkit.models.shared_prefix`'s
`GROUPED_SDPA`, the same path as its prompt groups; a tree that never branches is plain causal attention); elsewhere
each tree takes a row of its own, padded, with a 4D mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rmkit.models.shared_prefix import ONE_ROW, attention_mask_for, grouped_attention, layout_for


@dataclass
class TreeLayout:
    """The trie of a batch of sequences in depth-first order. Per trie token: `token_ids`, `parent` (the index of
    the token before it, -1 at a tree's first token), `depth`. `trees`: `(start, end)` of each tree's tokens.
    `index[s][p]`: where position p of sequence s sits."""

    token_ids: list[int]
    parent: list[int]
    depth: list[int]
    trees: list[tuple[int, int]]
    index: list[list[int]]

    @property
    def shared_tokens(self) -> int:
        """Tokens the sequences hold in all, minus the trie's: what sharing saves."""
        return sum(map(len, self.index)) - len(self.token_ids)

    def tree_mask(self, start: int, end: int) -> torch.Tensor | None:
        """`[1, 1, n, n]` boolean: token q of the tree `[start, end)` may attend to token k when k is q or one of
        its ancestors; None when the tree is one chain (plain causal attention)."""
        if all(self.parent[i] == i - 1 for i in range(start + 1, end)):
            return None
        n = end - start
        allowed = torch.zeros(n, n, dtype=torch.bool)
        for q in range(n):  # depth-first: a token's parent comes before it, its row is already complete
            parent = self.parent[start + q]
            if parent >= 0:
                allowed[q] = allowed[parent - start]
            allowed[q, q] = True
        return allowed[None, None]


def tree_layout(sequences: Sequence[Sequence[int]]) -> TreeLayout:
    """The prefix trie of `sequences` (each non-empty) laid out as `TreeLayout` says, trees in the order of their
    first sequence, a node's children in the order they first appear."""
    children: dict[int, dict[int, int]] = {-1: {}}  # trie node -> {token id: child node}; -1 the root
    node_token, node_parent, paths = [], [], []
    for sequence in sequences:
        if not sequence:
            raise ValueError("an empty sequence has no token to place in the tree")
        node, path = -1, []
        for token in sequence:
            child = children[node].get(token)
            if child is None:
                child = len(node_token)
                node_token.append(token)
                node_parent.append(node)
                children[node][token] = child
                children[child] = {}
            path.append(child)
            node = child
        paths.append(path)
    order, trees = [], []
    for root in children[-1].values():  # depth-first, one tree per first token
        start, stack = len(order), [root]
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(reversed(children[node].values()))
        trees.append((start, len(order)))
    place = {node: i for i, node in enumerate(order)}
    depth = [0] * len(order)
    parent = [-1 if node_parent[node] < 0 else place[node_parent[node]] for node in order]
    for i, p in enumerate(parent):
        depth[i] = 0 if p < 0 else depth[p] + 1
    return TreeLayout([node_token[node] for node in order], parent, depth, trees,
                      [[place[node] for node in path] for path in paths])


def tree_inputs(model: torch.nn.Module, layout: TreeLayout, pad_token_id: int) -> tuple[dict, torch.Tensor]:
    """`(inputs, where)`: the keyword arguments of `model`'s forward over `layout`'s trees (`input_ids`,
    `position_ids`, and `rmkit_groups` on the one-row layout or a 4D `attention_mask` with a row per tree), and
    `where` `[2, S, L]`-shaped indices `(row, position)` of each sequence's tokens in those rows (S sequences, right-
    padded to the longest L with the sequence's own first token)."""
    device = next(model.parameters()).device
    one_row = layout_for(model) == ONE_ROW
    width = len(layout.token_ids) if one_row else max(end - start for start, end in layout.trees)
    rows = 1 if one_row else len(layout.trees)
    input_ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((rows, width), dtype=torch.long)
    token_row, token_column = [0] * len(layout.token_ids), list(range(len(layout.token_ids)))  # one row: as laid out
    for t, (start, end) in enumerate(layout.trees):
        row, offset = (0, start) if one_row else (t, 0)
        input_ids[row, offset:offset + end - start] = torch.tensor(layout.token_ids[start:end])
        position_ids[row, offset:offset + end - start] = torch.tensor(layout.depth[start:end])
        if not one_row:
            token_row[start:end], token_column[start:end] = [t] * (end - start), range(end - start)
    longest = max(map(len, layout.index))
    where = torch.zeros((2, len(layout.index), longest), dtype=torch.long)
    for s, positions in enumerate(layout.index):
        padded = positions + [positions[0]] * (longest - len(positions))
        where[0, s] = torch.tensor([token_row[i] for i in padded])
        where[1, s] = torch.tensor([token_column[i] for i in padded])
    inputs = {"input_ids": input_ids.to(device), "position_ids": position_ids.to(device)}
    if one_row:
        masks = [layout.tree_mask(start, end) for start, end in layout.trees]
        inputs["rmkit_groups"] = [(start, end, None if m is None else m.to(device))
                                  for (start, end), m in zip(layout.trees, masks)]
        return inputs, where.to(device)
    mask = torch.zeros((rows, 1, width, width), dtype=torch.bool)
    for t, (start, end) in enumerate(layout.trees):
        tree = layout.tree_mask(start, end)
        n = end - start
        mask[t, 0, :n, :n] = torch.ones(n, n, dtype=torch.bool).tril() if tree is None else tree[0, 0]
        mask[t, 0, n:, n:] = torch.eye(width - n, dtype=torch.bool)  # padding attends to itself (no NaN rows)
    inputs["attention_mask"] = attention_mask_for(model, mask.to(device))
    return inputs, where.to(device)


# The trees go through the decoder only where they are estimated at most this share of the padded forward's work:
# at equal work the trees' path measured slower (its per-tree attention calls).
TREE_MARGIN = 0.9


def tree_pays(layout: TreeLayout, model: torch.nn.Module) -> bool:
    """Whether `layout`'s trees are estimated to cost at most `TREE_MARGIN` of the padded forward of its sequences
    through `model` (a transformers decoder). The estimate counts multiply-adds: the non-embedding parameters twice
    per token through the model, and 4 x hidden size x layers per (query, key) pair attended, where each tree, like
    each padded row, attends densely (`tree_mask`). Sharing pays when the sequences share much of their length
    (PRM800K's branches); a short common beginning (a chat template's) in long sequences makes one wide tree whose
    attention costs more than the repeated tokens saved (SmolLM2-135M, forward and backward of 8 sequences of 300
    tokens: sharing 150, the tree takes 0.83x the padded rows' time; sharing 20, 1.74x; nothing, 0.99x;
    `benchmarks/prefix_tree_cost.py`)."""
    per_token = 2 * model.num_parameters(exclude_embeddings=True)
    per_pair = 4 * model.config.hidden_size * model.config.num_hidden_layers
    longest = max(map(len, layout.index))
    padded = len(layout.index) * longest * (per_token + per_pair * longest)
    trees = sum((end - start) * (per_token + per_pair * (end - start)) for start, end in layout.trees)
    return trees <= TREE_MARGIN * padded


def tree_values(forward: torch.nn.Module, model: torch.nn.Module, layout: TreeLayout,
                pad_token_id: int) -> torch.Tensor:
    """`[S, L]`: `forward`'s per-position output (`rmkit.models.critic.TokenValues`, or DDP around it) for each
    sequence of `layout` (`tree_layout`; right-padded to the longest, padding positions arbitrary), each shared
    beginning computed once. `model` is the transformers decoder inside `forward`."""
    inputs, where = tree_inputs(model, layout, pad_token_id)
    with grouped_attention(model, inputs):
        values = forward(**inputs)
    return values[where[0], where[1]]
