"""The reward model's forward passes in training: rows in length-planned chunks (`ChunkedRewards`, encoders and
regression rows) or a decoder's pairs with their shared prompt computed once (`SharedPromptRewards`), each
the module the training loop calls and DDP wraps, with the chunk planner both use.

Every chunk pads only to its own longest row and every row's reward is read at its own last real token, so
the rewards equal one padded forward's up to float rounding. Nothing here synchronizes with the device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from rmkit.data.collate import pad_right
from rmkit.data.tokenize import TokenizedPair
from rmkit.distributed import is_sharded
from rmkit.models import compiled
from rmkit.models.shared_prefix import Group, continuation_ends, layout_for, packed_inputs
from rmkit.wrappers import unwrap_model

# MiniLM on 2 CPU threads (a forward+backward pass has ~250 small ops whose fixed cost is that of
# computing ~30 more positions). It sets how far `plan_row_chunks` goes in cutting padding.
CHUNK_OVERHEAD_POSITIONS = 32

Chunk = tuple[torch.Tensor, torch.Tensor]  # `input_ids` and `attention_mask` `[n, S]` of n rows, S their longest


def plan_row_chunks(lengths: Sequence[int], overhead_positions: float = CHUNK_OVERHEAD_POSITIONS) -> list[tuple[int, int]]:
    """Cut rows sorted longest first (`lengths` non-increasing) into contiguous chunks `[start, end)`
    that minimize the positions computed (each chunk pads to its first, longest row) plus
    `overhead_positions` per chunk. Exact, by dynamic programming over the cut points (O(rows^2)).
    """
    best = [0.0] + [float("inf")] * len(lengths)  # best[j]: the cheapest plan for the first j rows
    cut = [0] * (len(lengths) + 1)
    for end in range(1, len(lengths) + 1):
        for start in range(end):
            cost = best[start] + (end - start) * lengths[start] + overhead_positions
            if cost < best[end]:
                best[end], cut[end] = cost, start
    chunks, end = [], len(lengths)
    while end > 0:
        chunks.append((cut[end], end))
        end = cut[end]
    return chunks[::-1]


def planned_chunks(lengths: Sequence[int], overhead_positions: float) -> list[list[int]]:
    """Indices of items of `lengths`, sorted longest first and cut into chunks by `plan_row_chunks`."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    return [order[start:end] for start, end in plan_row_chunks([lengths[i] for i in order], overhead_positions)]


def chunk_rewards(reward_forward: torch.nn.Module, chunks: Sequence[dict]) -> torch.Tensor:
    """Rewards of every chunk's rows, laid end to end in chunk order: `chunks` are `reward_forward`'s keyword
    arguments (`input_ids` `[n_i, S_i]` and the rest), one forward each, after ONE embedding lookup for all of
    them: its backward builds one dense gradient of the embedding matrix (vocab x hidden, 47 MB for MiniLM)
    instead of one per chunk, each zero-filled and summed."""
    flat_ids = torch.cat([chunk["input_ids"].reshape(-1) for chunk in chunks])
    embeddings = reward_forward.embed(flat_ids).split([chunk["input_ids"].numel() for chunk in chunks])
    return torch.cat([reward_forward(**chunk, inputs_embeds=embedded.view(*chunk["input_ids"].shape, -1))
                      for chunk, embedded in zip(chunks, embeddings)])


class ChunkedRewards(torch.nn.Module):
    """`forward(chunks, inverse) -> rewards [R, K]` of R token rows given as padded chunks: the module the
    loop calls and DDP wraps (DDP wants one forward call per backward, so the embedding lookup and every
    chunk's forward happen inside this one call). `reward_forward` computes one chunk (a `RewardForward`
    whose blocks `policy.compile` compiles). With `cuda_graphs` (compiled blocks that replay CUDA graphs,
    `rmkit.models.compiled`) every chunk is padded to a multiple of `CUDA_GRAPH_LENGTH_MULTIPLE` positions and
    every forward begins a graph step.
    """

    def __init__(self, reward_forward: torch.nn.Module, cuda_graphs: bool = False):
        super().__init__()
        self.reward_forward = reward_forward
        self.cuda_graphs = cuda_graphs

    def forward(self, chunks: Sequence[Chunk], inverse: torch.Tensor) -> torch.Tensor:
        """`chunks`: `(input_ids, attention_mask)` pairs `[n_i, S_i]`; `inverse` `[R]`: row r's position
        in the chunks' rows laid end to end (R = sum n_i). Returns rewards `[R, K]` in row order."""
        if self.cuda_graphs:
            compiled.begin_step()
            chunks = [(_pad_length(ids), _pad_length(mask)) for ids, mask in chunks]
        inputs = [{"input_ids": input_ids, "attention_mask": attention_mask} for input_ids, attention_mask in chunks]
        return chunk_rewards(self.reward_forward, inputs)[inverse]


def _pad_length(rows: torch.Tensor) -> torch.Tensor:
    """`[n, S]` right-padded with zeros to `[n, S']`, S' the next multiple of `CUDA_GRAPH_LENGTH_MULTIPLE`: an
    attention mask's padding, and token ids that mask hides (their embeddings get no gradient)."""
    width = compiled.padded_length(rows.shape[1], compiled.CUDA_GRAPH_LENGTH_MULTIPLE)
    return torch.nn.functional.pad(rows, (0, width - rows.shape[1]))


class SharedPromptRewards(torch.nn.Module):
    """`forward(groups, overhead_positions) -> rewards [R, K]` of groups `(prompt ids, [continuation ids, ...])`
    through a decoder reward model, each group one row with its prompt computed once
    (`rmkit.models.shared_prefix`); the rewards come in continuation order, each equal to that of the unshared
    row `[prompt, continuation]` within float rounding. For decoder pairs it stands where `ChunkedRewards`
    stands for encoders: the module the loop calls and DDP wraps, and like it, it runs the rows sorted by
    length in chunks planned by `plan_row_chunks` (one chunk when `overhead_positions` is infinite), after
    one embedding lookup for all of them. `reward_forward` is a `RewardForward` (its blocks compiled or not);
    `cuda_graphs` as for `ChunkedRewards`."""

    def __init__(self, reward_forward: torch.nn.Module, pad_token_id: int, cuda_graphs: bool = False):
        super().__init__()
        self.reward_forward = reward_forward
        self.pad_token_id = pad_token_id
        self.cuda_graphs = cuda_graphs

    def forward(self, groups: Sequence[Group], overhead_positions: float = math.inf) -> torch.Tensor:
        chunks = planned_chunks([len(prompt) + sum(map(len, conts)) for prompt, conts in groups], overhead_positions)
        multiple = compiled.CUDA_GRAPH_LENGTH_MULTIPLE if self.cuda_graphs else None
        # `RewardForward` takes a mask, not grouped attention's spans: rows packed, or under CUDA graphs one per
        # group, so that a micro-batch's row count is fixed and its shapes few
        layout = layout_for(self.reward_forward.model, multiple, grouped=False)
        if self.cuda_graphs:
            compiled.begin_step()
        inputs = []
        for chunk in chunks:
            members = [groups[i] for i in chunk]
            x = packed_inputs(self.reward_forward.model, members, self.pad_token_id, multiple, layout)
            inputs.append({**x, "read_at": tuple(t.to(x["input_ids"].device, non_blocking=True)
                                                 for t in continuation_ends(members, layout))})
        rewards = chunk_rewards(self.reward_forward, inputs)  # group by group in chunk order
        first_row, row = {}, 0  # where each group's continuations start in those rows
        for i in (i for chunk in chunks for i in chunk):
            first_row[i], row = row, row + len(groups[i][1])
        index = [first_row[i] + k for i, (_, conts) in enumerate(groups) for k in range(len(conts))]
        return rewards[torch.tensor(index, device=rewards.device)]


def pair_groups(pairs: Sequence[TokenizedPair]) -> list[Group]:
    """Each pair as `(the tokens both sides begin with, [chosen's rest, rejected's rest])`. The shared part is
    the common token prefix (the prompt, under `data.pair_truncation: shared_prompt`), stopped one token short
    of the shorter side so each rest keeps the token its reward is read at."""
    groups = []
    for pair in pairs:
        chosen, rejected = pair.chosen_ids, pair.rejected_ids
        limit = min(len(chosen), len(rejected)) - 1
        shared = 0
        while shared < limit and chosen[shared] == rejected[shared]:
            shared += 1
        groups.append((chosen[:shared], [chosen[shared:], rejected[shared:]]))
    return groups


def chunk_rows(rows: Sequence[Sequence[int]], pad_token_id: int,
               overhead_positions: float = CHUNK_OVERHEAD_POSITIONS) -> tuple[list[Chunk], torch.Tensor]:
    """`ChunkedRewards`' inputs for token `rows` (on the host): the rows sorted longest first, cut by
    `plan_row_chunks`, each chunk padded to its own longest row; and the inverse permutation `[R]`."""
    planned = planned_chunks([len(row) for row in rows], overhead_positions)
    chunks = [pad_right([rows[i] for i in chunk], pad_token_id) for chunk in planned]
    order = [i for chunk in planned for i in chunk]
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[order] = torch.arange(len(order))
    return chunks, inverse


def length_grouped_rewards(rewards: torch.nn.Module, rows: Sequence[Sequence[int]], pad_token_id: int,
                           device: torch.device,
                           overhead_positions: float = CHUNK_OVERHEAD_POSITIONS) -> torch.Tensor:
    """Rewards `[R, K]` of token `rows`, in their order, from `rewards` (a `ChunkedRewards`, or DDP
    around one): forward passes over chunks of rows of similar length, each padded only to its own
    longest row (`chunk_rows`).

    The two sides of a pair usually differ in length, so one batch of interleaved pairs pads every
    row to the longest response (12% padding on HH pairs at 256 tokens after length grouping; 2% in
    planned chunks). Each row's reward is read at its own last real token, so the result equals one
    padded forward up to float rounding. Backward runs once, on the loss.
    """
    chunks, inverse = chunk_rows(rows, pad_token_id, overhead_positions)
    chunks = [(ids.to(device, non_blocking=True), mask.to(device, non_blocking=True)) for ids, mask in chunks]
    return rewards(chunks, inverse.to(device, non_blocking=True))


def chunk_overhead(forward: torch.nn.Module, device: torch.device) -> float:
    """What one more forward costs in padded positions (`plan_row_chunks`' `overhead_positions`) for `forward`
    on `device`."""
    # Under FSDP2 every forward and backward all-gathers each block's parameters, so every rank must run
    # as many forwards: one chunk per micro-batch (an infinite per-chunk cost), as many micro-batches.
    # On a GPU a forward's fixed cost (kernel launches) dwarfs padded positions: one padded forward per
    # micro-batch trained MiniLM 2.8x faster in float32 and 6.4x in bf16 on an H100 than CPU-planned chunks.
    return math.inf if is_sharded(forward) or device.type != "cpu" else CHUNK_OVERHEAD_POSITIONS


def pair_rewards(forward: torch.nn.Module, pairs: Sequence[TokenizedPair], pad_token_id: int, device: torch.device,
                 overhead_positions: float) -> torch.Tensor:
    """Rewards `[2n, K]` of n pairs, interleaved `[c0, r0, c1, r1, ...]`: through `SharedPromptRewards` (a
    decoder: each pair one row, its common prefix computed once) or `ChunkedRewards` (rows in length-planned
    chunks), whichever `forward` is (or wraps)."""
    if isinstance(unwrap_model(forward), SharedPromptRewards):
        return forward(pair_groups(pairs), overhead_positions)
    rows = [ids for pair in pairs for ids in (pair.chosen_ids, pair.rejected_ids)]
    return length_grouped_rewards(forward, rows, pad_token_id, device, overhead_positions)
