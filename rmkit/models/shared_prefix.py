"""A prompt and its K continuations through a decoder with the prompt computed once.

A group `(prompt, [cont_1, ..., cont_K])` becomes ONE row `prompt + cont_1 + ... + cont_K` with an attention
mask in which every continuation sees the prompt and itself (causally) but no other continuation, and
position ids that restart after the prompt for each continuation (cont_k's first token sits at position
len(prompt), as in the unshared row `prompt + cont_k`). Attention is all a decoder mixes positions with, so
every continuation token's hidden state, and the logits read from it, equal those of the unshared row
within float rounding, while the prompt's tokens go through the model once instead of K times
(a preference pair: K = 2; GRPO's completions of one prompt: K = G).

`shared_prefix_logits` returns the logits laid out as the unshared rows would give them (one row per
continuation, `[prompt, cont_k]`, right-padded), so a caller swaps it in for a plain forward and changes
nothing else. The mask is a 4D `[B, 1, L, L]` mask, which transformers passes to attention unchanged.
A decoder reward model reads each continuation's reward at its last token: `packed_inputs` and
`continuation_ends` give what its forward takes and where to read (`rmkit.models.reward.compute_rewards`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rmkit.wrappers import transformers_model

Group = tuple[Sequence[int], Sequence[Sequence[int]]]  # (prompt ids, [continuation ids, ...])


def _packed(groups: Sequence[Group], pad_token_id: int):
    """`(input_ids, position_ids, segment)` `[B, L]` of the shared rows; segment 0 = prompt, k = cont_k,
    -1 = padding."""
    lengths = [len(p) + sum(len(c) for c in conts) for p, conts in groups]
    width = max(lengths)
    input_ids = torch.full((len(groups), width), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((len(groups), width), dtype=torch.long)
    segment = torch.full((len(groups), width), -1, dtype=torch.long)
    for b, (prompt, conts) in enumerate(groups):
        input_ids[b, :len(prompt)] = torch.as_tensor(list(prompt), dtype=torch.long)
        position_ids[b, :len(prompt)] = torch.arange(len(prompt))
        segment[b, :len(prompt)] = 0
        start = len(prompt)
        for k, cont in enumerate(conts, start=1):
            end = start + len(cont)
            input_ids[b, start:end] = torch.as_tensor(list(cont), dtype=torch.long)
            position_ids[b, start:end] = torch.arange(len(prompt), len(prompt) + len(cont))
            segment[b, start:end] = k
            start = end
    return input_ids, position_ids, segment


def shared_prefix_mask(segment: torch.Tensor) -> torch.Tensor:
    """Boolean `[B, 1, L, L]`: query q may attend key j when j <= q, both are real, and j is in the prompt or in
    q's own continuation. A padding query attends to itself only (a row with no key would give NaN)."""
    length = segment.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segment.device).tril()
    q, k = segment[:, :, None], segment[:, None, :]
    allowed = causal & (q >= 0) & (k >= 0) & ((k == 0) | (k == q))
    allowed |= torch.eye(length, dtype=torch.bool, device=segment.device) & (q < 0)
    return allowed[:, None]


def _unshared_index(groups: Sequence[Group]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """`(group_of_row [R], position [R, S], S)`: for unshared row r = `[prompt, cont_k]` of its group, the shared
    row position holding each of its tokens (padding points at position 0; the caller masks it)."""
    rows, positions = [], []
    for b, (prompt, conts) in enumerate(groups):
        start = len(prompt)
        for cont in conts:
            rows.append(b)
            positions.append(list(range(len(prompt))) + list(range(start, start + len(cont))))
            start += len(cont)
    width = max(len(p) for p in positions)
    index = torch.zeros((len(positions), width), dtype=torch.long)
    for r, p in enumerate(positions):
        index[r, :len(p)] = torch.tensor(p, dtype=torch.long)
    return torch.tensor(rows, dtype=torch.long), index, width


def packed_inputs(model: torch.nn.Module, groups: Sequence[Group], pad_token_id: int) -> dict[str, torch.Tensor]:
    """`input_ids`, `attention_mask` (4D, in the form `model`'s attention takes) and `position_ids` of the shared
    rows, on `model`'s device: the keyword arguments of a transformers decoder's forward. `model` is a
    transformers decoder or anything wrapping one (DDP, peft)."""
    device = next(model.parameters()).device
    input_ids, position_ids, segment = (t.to(device) for t in _packed(groups, pad_token_id))
    mask = shared_prefix_mask(segment)
    config = getattr(transformers_model(model), "config", None)  # under DDP the config is the inner model's
    if getattr(config, "_attn_implementation", "sdpa") != "sdpa":  # eager attention adds a float mask
        mask = torch.zeros(mask.shape, dtype=torch.float32, device=device).masked_fill(~mask, torch.finfo(torch.float32).min)
    return {"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids}


def continuation_ends(groups: Sequence[Group]) -> tuple[torch.Tensor, torch.Tensor]:
    """`(row [R], position [R])`: where in the shared rows each continuation's last token sits, group by group
    in order; the position of the unshared row `[prompt, cont_k]`'s last token. Every continuation must hold
    at least one token (an empty one would point at its neighbour's)."""
    rows, positions = [], []
    for b, (prompt, conts) in enumerate(groups):
        end = len(prompt)
        for cont in conts:
            if not cont:
                raise ValueError(f"group {b}: an empty continuation has no last token of its own")
            end += len(cont)
            rows.append(b)
            positions.append(end - 1)
    return torch.tensor(rows, dtype=torch.long), torch.tensor(positions, dtype=torch.long)


def shared_prefix_logits(model: torch.nn.Module, groups: Sequence[Group], pad_token_id: int) -> torch.Tensor:
    """Next-token logits `[R, S, V]` of the R = sum K unshared rows `[prompt, cont_k]` (group by group, in
    order; right-padded to S, the longest), computed with each prompt once. `model` is a causal LM (plain,
    DDP-unwrapped or peft). Values at padding positions are arbitrary: callers mask them, as for any padding."""
    logits = model(**packed_inputs(model, groups, pad_token_id), use_cache=False).logits
    return unshared_layout(logits, groups)


def unshared_layout(per_position: torch.Tensor, groups: Sequence[Group]) -> torch.Tensor:
    """A per-position output of the shared rows `[B, L, ...]` laid out as the unshared rows `[prompt, cont_k]`
    would give it: `[R, S, ...]` (padding positions arbitrary)."""
    rows, index, _ = _unshared_index(groups)
    return per_position[rows.to(per_position.device)[:, None], index.to(per_position.device)]
