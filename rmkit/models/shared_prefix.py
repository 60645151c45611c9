"""Prompts and their continuations through a decoder with each prompt computed once, several groups to a row.

A group `(prompt, [cont_1, ..., cont_K])` is laid out as `prompt + cont_1 + ... + cont_K` with an attention
mask in which every continuation sees the prompt and itself (causally) but no other continuation, and
position ids that restart after the prompt for each continuation (cont_k's first token sits at position
len(prompt), as in the unshared row `prompt + cont_k`). Attention is all a decoder mixes positions with, so
every continuation token's hidden state, and the logits read from it, equal those of the unshared row
within float rounding, while the prompt's tokens go through the model once instead of K times
(a preference pair: K = 2; GRPO's completions of one prompt: K = G).

Groups are then packed into rows (`pack_groups`): longest first, each into the first row with room, no row
longer than the longest group, and no group sees another (the mask is block diagonal by group). Rows of
mixed lengths (prompts of 40 to 450 tokens) would otherwise be padded to the longest: on the HH prompts of
`benchmarks/ppo_vs_trl.py`, batches of 8 completions held 54% real tokens padded, against 82% packed.

On the CPU (`one_row_layout`), with SDPA attention and no compiled blocks, all groups instead go to one row,
end to end, with no padding at all, and attention runs group by group (`GROUPED_SDPA`, a transformers attention
implementation for the length of the forward): causal over a group with one continuation, the group's own mask
over one with several. The projections then compute real tokens only, and attention no cross-group block: on
PPO's HH rollouts a SmolLM2-135M policy forward and backward over 8 completions took 5.9 s against 7.4 s packed.
GPUs keep the packed rows (one kernel over the batch; the group-by-group loop is unmeasured there). Where rows
must come in few shapes (CUDA graphs, `width_multiple`), each group takes a row of its own (`ROW_PER_GROUP`):
the row count is then the group count, which packing would change from batch to batch.

`shared_prefix_logits` returns the logits laid out as the unshared rows would give them (one row per
continuation, `[prompt, cont_k]`, right-padded), so a caller swaps it in for a plain forward and changes
nothing else; with `continuations_only` it returns only the rows `[last prompt token, cont_k]`, the
positions whose logits predict a continuation token, and runs the model's
output layer (the vocabulary projection) there only. The mask is a 4D `[B, 1, L, L]` mask, which
transformers passes to attention unchanged. A decoder reward model reads each continuation's reward at its
last token: `packed_inputs` and `continuation_ends` give what its forward takes and where to read
(`rmkit.models.reward.compute_rewards`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rmkit.data.packing import plan_packs
from rmkit.models.compiled import has_compiled_blocks, padded_length
from rmkit.models.setup import has_sliding_layers
from rmkit.wrappers import transformers_model

Group = tuple[Sequence[int], Sequence[Sequence[int]]]  # (prompt ids, [continuation ids, ...])
# How groups are laid out in rows (`pack_groups`): packed several to a row, all end to end in one row, or one each.
PACKED, ONE_ROW, ROW_PER_GROUP = "packed", "one_row", "row_per_group"


def group_length(group: Group) -> int:
    """Tokens a group takes in its row: the prompt once, then every continuation."""
    prompt, conts = group
    return len(prompt) + sum(len(c) for c in conts)


def pack_groups(groups: Sequence[Group], layout: str = PACKED) -> list[tuple[int, int]]:
    """`(row, offset)` of each group. `PACKED`: `rmkit.data.packing.plan_packs` (first fit, longest first) into
    rows as long as the longest group, so packing makes no row longer than the unpacked batch's; `ONE_ROW`: all
    in row 0 in their order; `ROW_PER_GROUP`: group i at the start of row i."""
    lengths = [group_length(g) for g in groups]
    if layout == ONE_ROW:
        return [(0, sum(lengths[:i])) for i in range(len(groups))]
    if layout == ROW_PER_GROUP:
        return [(i, 0) for i in range(len(groups))]
    places = [(0, 0)] * len(groups)
    for row, members in enumerate(plan_packs(lengths, max(lengths))):
        offset = 0
        for i in members:
            places[i], offset = (row, offset), offset + lengths[i]
    return places


def _packed(groups: Sequence[Group], pad_token_id: int, width_multiple: int | None = None, layout: str = PACKED):
    """`(input_ids, position_ids, segment, owner, places)`: `[B, L]` tensors of the packed rows and each group's
    `(row, offset)` (`pack_groups`). `segment` numbers the prompts and continuations of a row (-1 = padding);
    `owner` is, at each position, the segment of its group's prompt (-1 = padding). L is the longest row,
    rounded up to a multiple of `width_multiple` when given."""
    places = pack_groups(groups, layout)
    rows = 1 + max(row for row, _ in places)
    width = max(offset + group_length(g) for g, (_, offset) in zip(groups, places))
    width = padded_length(width, width_multiple)
    input_ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((rows, width), dtype=torch.long)
    segment = torch.full((rows, width), -1, dtype=torch.long)
    owner = torch.full((rows, width), -1, dtype=torch.long)
    next_segment = [0] * rows
    for (prompt, conts), (b, offset) in zip(groups, places):
        first, next_segment[b] = next_segment[b], next_segment[b] + 1 + len(conts)
        start, end = offset, offset + len(prompt)
        input_ids[b, start:end] = torch.as_tensor(list(prompt), dtype=torch.long)
        position_ids[b, start:end] = torch.arange(len(prompt))
        segment[b, start:end] = first
        for k, cont in enumerate(conts, start=1):
            start, end = end, end + len(cont)
            input_ids[b, start:end] = torch.as_tensor(list(cont), dtype=torch.long)
            position_ids[b, start:end] = torch.arange(len(prompt), len(prompt) + len(cont))
            segment[b, start:end] = first + k
        owner[b, offset:end] = first
    return input_ids, position_ids, segment, owner, places


def shared_prefix_mask(segment: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:
    """Boolean `[B, 1, L, L]`: query q may attend key j when j <= q, both are real, and j is in q's own segment
    or in the prompt of q's group (`owner`). A padding query attends to itself only (a row with no key would
    give NaN)."""
    length = segment.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segment.device).tril()
    q, k = segment[:, :, None], segment[:, None, :]
    allowed = causal & (q >= 0) & (k >= 0) & ((k == q) | (k == owner[:, :, None]))
    allowed |= torch.eye(length, dtype=torch.bool, device=segment.device) & (q < 0)
    return allowed[:, None]


GROUPED_SDPA = "rmkit_grouped_sdpa"


def grouped_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, rmkit_groups: Sequence[tuple[int, int, torch.Tensor | None]] | None = None,
                 **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention run over each `(start, end, mask)` of `rmkit_groups` (positions of the one row,
    `[1, H, L, D]` tensors) on its own: causal where `mask` is None, else with that `[1, 1, n, n]` boolean mask.
    Without `rmkit_groups`, plain SDPA (a forward that is not a grouped one: generation, a plain call)."""
    if rmkit_groups is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    outputs = [sdpa_attention_forward(module, query[:, :, start:end], key[:, :, start:end], value[:, :, start:end],
                                      mask, **kwargs)[0] for start, end, mask in rmkit_groups]
    return torch.cat(outputs, dim=1), None


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)
AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)  # a forward without groups gets SDPA's masks


def one_row_layout(model: torch.nn.Module) -> bool:
    """Whether `model` takes the groups as one row attended group by group (`GROUPED_SDPA`): on the CPU, for a
    decoder with SDPA attention, no sliding-window layers and no compiled blocks."""
    config = getattr(transformers_model(model), "config", None)
    return (next(model.parameters()).device.type == "cpu"
            and getattr(config, "_attn_implementation", None) in ("sdpa", GROUPED_SDPA)
            and not has_sliding_layers(model) and not has_compiled_blocks(model))


def layout_for(model: torch.nn.Module, width_multiple: int | None = None, grouped: bool = True) -> str:
    """The layout `packed_inputs` gives `model`'s groups: `ROW_PER_GROUP` where rows must come in few shapes
    (`width_multiple`), `ONE_ROW` where `one_row_layout` allows it and the caller's forward takes grouped
    attention (`grouped`; a forward that takes only a mask cannot), `PACKED` elsewhere."""
    if width_multiple is not None:
        return ROW_PER_GROUP
    return ONE_ROW if grouped and one_row_layout(model) else PACKED


@contextmanager
def grouped_attention(model: torch.nn.Module, inputs: dict):
    """While open, `model`'s attention is `GROUPED_SDPA` when `inputs` (from `packed_inputs`) are one row of
    groups; otherwise nothing changes."""
    if "rmkit_groups" not in inputs:
        yield
        return
    config = transformers_model(model).config
    before, config._attn_implementation = config._attn_implementation, GROUPED_SDPA
    try:
        yield
    finally:
        config._attn_implementation = before


def _unshared_index(groups: Sequence[Group], places: Sequence[tuple[int, int]],
                    continuations_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """`(row [R], position [R, S])`: for each unshared row `[prompt, cont_k]` (group by group, in order), the
    packed row holding it and the packed position of each of its tokens; with `continuations_only`, of the
    tokens `[last prompt token, cont_k]` only (`[cont_k]` after an empty prompt). Padding points at the
    row's position 0; the caller masks it."""
    rows, positions = [], []
    for (prompt, conts), (b, offset) in zip(groups, places):
        start = offset + len(prompt)
        prompt_part = list(range(offset, start))
        for cont in conts:
            rows.append(b)
            positions.append((prompt_part[-1:] if continuations_only else prompt_part)
                             + list(range(start, start + len(cont))))
            start += len(cont)
    width = max(len(p) for p in positions)
    index = torch.zeros((len(positions), width), dtype=torch.long)
    for r, p in enumerate(positions):
        index[r, :len(p)] = torch.tensor(p, dtype=torch.long)
    return torch.tensor(rows, dtype=torch.long), index


def packed_inputs(model: torch.nn.Module, groups: Sequence[Group], pad_token_id: int,
                  width_multiple: int | None = None, layout: str | None = None) -> dict:
    """`input_ids`, `attention_mask` (4D, in the form `model`'s attention takes) and `position_ids` of the packed
    rows, on `model`'s device: the keyword arguments of a transformers decoder's forward. `model` is a
    transformers decoder or anything wrapping one (DDP, peft). Rows are padded to a multiple of
    `width_multiple` positions when given (few shapes, for CUDA graphs). `layout` (None: `layout_for`'s) is how
    the groups take rows (`pack_groups`); with `ONE_ROW`, the inputs hold, instead of the mask, `rmkit_groups` for
    `grouped_sdpa`: run that forward inside `grouped_attention`."""
    device = next(model.parameters()).device
    layout = layout_for(model, width_multiple) if layout is None else layout
    input_ids, position_ids, segment, owner, places = _packed(groups, pad_token_id, width_multiple, layout)
    if layout == ONE_ROW:
        spans = [(offset, offset + group_length(g), len(g[1]) > 1) for g, (_, offset) in zip(groups, places)]
        masks = [shared_prefix_mask(segment[:, a:b], owner[:, a:b]).to(device) if shared else None
                 for a, b, shared in spans]
        return {"input_ids": input_ids.to(device), "position_ids": position_ids.to(device),
                "rmkit_groups": [(a, b, m) for (a, b, _), m in zip(spans, masks)]}
    mask = attention_mask_for(model, shared_prefix_mask(segment.to(device), owner.to(device)))
    return {"input_ids": input_ids.to(device), "attention_mask": mask, "position_ids": position_ids.to(device)}


def attention_mask_for(model: torch.nn.Module, allowed: torch.Tensor) -> torch.Tensor:
    """A boolean `[B, 1, L, L]` mask (True: may attend) in the form `model`'s attention takes: as it is for SDPA,
    as an additive float mask (0 or the float32 minimum) for eager attention."""
    config = getattr(transformers_model(model), "config", None)  # under DDP the config is the inner model's
    if getattr(config, "_attn_implementation", "sdpa") == "sdpa":
        return allowed
    return torch.zeros(allowed.shape, dtype=torch.float32, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(torch.float32).min)


def continuation_ends(groups: Sequence[Group], layout: str = PACKED) -> tuple[torch.Tensor, torch.Tensor]:
    """`(row [R], position [R])`: where in the rows of `layout` each continuation's last token sits, group by
    group in order; the position of the unshared row `[prompt, cont_k]`'s last token. Every continuation must hold
    at least one token (an empty one would point at its neighbour's)."""
    rows, positions = [], []
    for b, ((prompt, conts), (row, offset)) in enumerate(zip(groups, pack_groups(groups, layout))):
        end = offset + len(prompt)
        for cont in conts:
            if not cont:
                raise ValueError(f"group {b}: an empty continuation has no last token of its own")
            end += len(cont)
            rows.append(row)
            positions.append(end - 1)
    return torch.tensor(rows, dtype=torch.long), torch.tensor(positions, dtype=torch.long)


def shared_prefix_logits(model: torch.nn.Module, groups: Sequence[Group], pad_token_id: int,
                         continuations_only: bool = False) -> torch.Tensor:
    """Next-token logits `[R, S, V]` of the R = sum K unshared rows `[prompt, cont_k]` (group by group, in
    order; right-padded to S, the longest), computed with each prompt once. With `continuations_only`, those
    of the rows `[last prompt token, cont_k]` (S = 1 + the longest continuation), the output layer run at
    those positions only. `model` is a causal LM (plain, DDP-wrapped or peft). Values at padding positions
    are arbitrary: callers mask them, as for any padding."""
    layout = layout_for(model)
    inputs = packed_inputs(model, groups, pad_token_id, layout=layout)
    rows, index = _unshared_index(groups, pack_groups(groups, layout), continuations_only)
    rows, index = rows.to(inputs["input_ids"].device)[:, None], index.to(inputs["input_ids"].device)
    with grouped_attention(model, inputs):
        if not continuations_only:
            return model(**inputs, use_cache=False).logits[rows, index]
        with output_layer_at(model, rows, index):
            return model(**inputs, use_cache=False).logits


@contextmanager
def output_layer_at(model: torch.nn.Module, rows: torch.Tensor, index: torch.Tensor):
    """While open, `model`'s output layer (its output embeddings) reads the hidden states at `[rows, index]`
    only, so the forward's logits are `[R, S, V]` for those positions and the vocabulary projection runs
    nowhere else."""
    head = transformers_model(model).get_output_embeddings()
    handle = head.register_forward_pre_hook(lambda _, args: (args[0][rows, index], *args[1:]))
    try:
        yield
    finally:
        handle.remove()


def unshared_layout(per_position: torch.Tensor, groups: Sequence[Group], continuations_only: bool = False,
                    layout: str = PACKED) -> torch.Tensor:
    """A per-position output of the rows `[B, L, ...]` of `layout` (`pack_groups`) laid out
    as the unshared rows `[prompt, cont_k]` would give it: `[R, S, ...]` (padding positions arbitrary); with
    `continuations_only`, as the rows `[last prompt token, cont_k]`."""
    rows, index = _unshared_index(groups, pack_groups(groups, layout), continuations_only)
    return per_position[rows.to(per_position.device)[:, None], index.to(per_position.device)]
