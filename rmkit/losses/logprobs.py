"""Per-token log-probabilities from next-token logits, computed in chunks.

The naive `log_softmax(logits.float(), -1).gather(...)` materializes a float32 copy of `[B, S, V]`
(two when the logits are bf16: the cast and the log-softmax), and its backward two more. Here each
chunk of positions goes through a fused float32 log-softmax and is gathered, so the extra memory is
one chunk; the backward recomputes the softmax per chunk instead of saving anything `[B, S, V]`, and
writes the gradient straight into one buffer of the logits' shape and dtype (the only `[B, S, V]`
tensor it allocates, and the one any backward must return). With `inplace_backward=True` it writes
the gradient into the logits' own storage instead, so the backward allocates nothing `[B, S, V]`.
"""

from __future__ import annotations

import torch

from rmkit.losses.masking import compute_dtype

# Elements of float32 scratch per chunk (8 MiB): small next to any [B, S, V] worth chunking, large
# enough that per-op overhead (thread wake-ups on CPU, kernel launches on GPU) stays negligible.
DEFAULT_CHUNK_ELEMENTS = 1 << 21


def _chunks(batch: int, length: int, vocab: int, chunk_elements: int):
    """Yield index tuples `(rows, positions)` covering `[batch, length]` in chunks of about
    `chunk_elements // vocab` positions: several whole rows when a row is short, else part of a row.
    """
    per_chunk = max(1, chunk_elements // max(vocab, 1))
    if length <= per_chunk:
        rows_per_chunk = max(1, per_chunk // max(length, 1))
        for b in range(0, batch, rows_per_chunk):
            yield slice(b, min(b + rows_per_chunk, batch)), slice(0, length)
        return
    for b in range(batch):
        for t in range(0, length, per_chunk):
            yield slice(b, b + 1), slice(t, min(t + per_chunk, length))


def _chunk_scratch(batch: int, length: int, vocab: int, chunk_elements: int, dtype, device):
    """One buffer, the size of the largest chunk, that every chunk's softmax is written into: the
    chunks reuse warm memory instead of allocating (and page-faulting) a new buffer each."""
    largest = max(
        (rows.stop - rows.start) * (pos.stop - pos.start) for rows, pos in _chunks(batch, length, vocab, chunk_elements)
    )
    return torch.empty(largest * vocab, dtype=dtype, device=device)


def _view(scratch: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return scratch[: like.numel()].view(like.shape)


class _ChunkedNextTokenLogprobs(torch.autograd.Function):
    """log p(input_ids[:, t+1]) from next_token_logits[:, t]; see `next_token_logprobs`."""

    @staticmethod
    def forward(
        ctx, logits: torch.Tensor, input_ids: torch.Tensor, chunk_elements: int, inplace_backward: bool
    ) -> torch.Tensor:
        batch, seq, vocab = logits.shape
        dtype = compute_dtype(logits)
        targets = input_ids[:, 1:]
        out = torch.empty(batch, seq - 1, dtype=dtype, device=logits.device)
        # The in-place backward needs each position's log-sum-exp: x_y - log p(y), kept as [B, S-1].
        logsumexp = torch.empty_like(out) if inplace_backward else None
        scratch = _chunk_scratch(batch, seq - 1, vocab, chunk_elements, dtype, logits.device)
        for rows, pos in _chunks(batch, seq - 1, vocab, chunk_elements):
            # The fused kernel casts while it reads: the float32 copy is one chunk, never [B, S, V].
            chunk = logits[rows, pos]
            logp = torch.log_softmax(chunk, dim=-1, dtype=dtype, out=_view(scratch, chunk))
            index = targets[rows, pos, None]
            out[rows, pos] = logp.gather(-1, index).squeeze(-1)
            if logsumexp is not None:
                target_logits = chunk.gather(-1, index).squeeze(-1).to(dtype)
                logsumexp[rows, pos] = target_logits - out[rows, pos]
        if inplace_backward:
            # Kept as an attribute, not through save_for_backward: the backward of another slice of
            # the same packed row (the packing wrapper's case) legitimately writes into this storage
            # first, and save_for_backward would refuse that as a modification. Any other op that
            # saved these logits still checks, and fails loudly after the in-place write.
            ctx.logits = logits
            ctx.save_for_backward(targets, logsumexp)
        else:
            ctx.save_for_backward(logits, targets)
        ctx.chunk_elements = chunk_elements
        ctx.inplace_backward = inplace_backward
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        if ctx.inplace_backward:
            logits = ctx.logits
            targets, logsumexp = ctx.saved_tensors
        else:
            logits, targets = ctx.saved_tensors
        batch, seq, vocab = logits.shape
        dtype = compute_dtype(logits)
        # In place: the gradient overwrites the logits chunk by chunk (each chunk is read before it
        # is written); otherwise it goes to one new buffer of the logits' shape and dtype.
        grad_logits = logits if ctx.inplace_backward else torch.empty_like(logits)
        grad_logits[:, -1].zero_()  # the last position predicts nothing here
        grad_out = grad_out.to(dtype)
        in_place_float = ctx.inplace_backward and logits.dtype == dtype
        scratch = None
        if not in_place_float:
            scratch = _chunk_scratch(batch, seq - 1, vocab, ctx.chunk_elements, dtype, logits.device)
        for rows, pos in _chunks(batch, seq - 1, vocab, ctx.chunk_elements):
            # d logp(y) / d x_v = 1[v = y] - softmax(x)_v, scaled by the incoming gradient; the
            # softmax is recomputed here rather than saved, so the forward keeps nothing [B, S, V].
            g = grad_out[rows, pos, None]
            index = targets[rows, pos, None]
            chunk = logits[rows, pos]
            if ctx.inplace_backward:
                # softmax = exp(x - logsumexp), computed in the logits' storage when they are float32.
                x = chunk if in_place_float else _view(scratch, chunk).copy_(chunk)
                x.sub_(logsumexp[rows, pos, None]).exp_().mul_(-g).scatter_add_(-1, index, g)
                if x is not chunk:
                    chunk.copy_(x)
            else:
                x = torch.softmax(chunk, dim=-1, dtype=dtype, out=_view(scratch, chunk)).mul_(-g)
                grad_logits[rows, pos] = x.scatter_add_(-1, index, g)
        return grad_logits.detach() if ctx.inplace_backward else grad_logits, None, None, None


def next_token_logprobs(
    next_token_logits: torch.Tensor,
    input_ids: torch.Tensor,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    inplace_backward: bool = False,
) -> torch.Tensor:
    """Log-probabilities of `input_ids[:, 1:]` under `next_token_logits[:, :-1]`, in float32.

    Args:
        next_token_logits: `[B, S, V]`, any floating dtype; position t predicts `input_ids[:, t+1]`.
        input_ids: `[B, S]` token ids.
        chunk_elements: at most this many float32 scratch elements per chunk (positions per chunk =
            this // V, at least 1), and at most 1/16 of the logits.
        inplace_backward: the backward writes the gradient of the logits into the logits' own
            storage (their values are gone afterwards) instead of a new `[B, S, V]` buffer: the
            backward then allocates only one chunk. Use it when nothing else needs the logits
            after the backward; anything that saved them for its own backward fails loudly (torch
            detects the in-place change), it does not silently use the overwritten values.

    Returns:
        `[B, S-1]` float32 (float64 for float64 logits); entry `[b, t]` is log p(input_ids[b, t+1] | input_ids[b, :t+1]), i.e. it
        lines up with `token_mask[:, 1:]`, `prev_logprobs[:, 1:]` and the other per-token tensors.
        Differentiable with respect to the logits; the backward also works chunk by chunk.
    """
    if next_token_logits.dim() != 3 or input_ids.dim() != 2:
        raise ValueError(
            f"next_token_logprobs expects logits [B, S, V] and input_ids [B, S], got "
            f"{tuple(next_token_logits.shape)} and {tuple(input_ids.shape)}"
        )
    if next_token_logits.shape[:2] != input_ids.shape:
        raise ValueError(
            f"logits {tuple(next_token_logits.shape)} and input_ids {tuple(input_ids.shape)} disagree on [B, S]"
        )
    if input_ids.shape[1] < 1:
        raise ValueError("input_ids must have at least one position")
    batch, seq, vocab = next_token_logits.shape
    # At most 1/16 of the logits per chunk, so the scratch stays a small fraction of small inputs
    # too (and a call makes at most ~16 chunk iterations more than the absolute cap requires).
    chunk_elements = min(int(chunk_elements), max(vocab, batch * (seq - 1) * vocab // 16))
    return _ChunkedNextTokenLogprobs.apply(
        next_token_logits, input_ids.long(), chunk_elements, inplace_backward
    )


def aligned_logprobs(
    next_token_logits: torch.Tensor,
    input_ids: torch.Tensor,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> torch.Tensor:
    """`next_token_logprobs` laid out like `input_ids`: `[B, S]` with 0 at position 0.

    This is the layout of `prev_logprobs`, `generation_logprobs` and `reference_policy_logprobs`
    in the losses' `data` (entry `[b, t]` = log p(input_ids[b, t] | input_ids[b, :t])), e.g. for
    reference-policy log-probs computed under `torch.no_grad()`.
    """
    logprobs = next_token_logprobs(next_token_logits, input_ids, chunk_elements)
    return torch.nn.functional.pad(logprobs, (1, 0))
