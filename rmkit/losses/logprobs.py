"""Per-token log-probabilities from next-token logits, computed in chunks.

The naive `log_softmax(logits.float(), -1).gather(...)` materializes a float32 copy of `[B, S, V]`
(two when the logits are bf16: the cast and the log-softmax), and its backward two more. Here each
chunk of positions is cast to float32, reduced with logsumexp and gathered, so the extra memory is one
chunk; the backward recomputes the softmax per chunk instead of saving it, and writes the gradient
straight into one buffer of the logits' shape and dtype (the only `[B, S, V]` tensor it allocates).
"""

from __future__ import annotations

import torch

from rmkit.losses.masking import compute_dtype

# Elements of float32 scratch per chunk (4 MiB): small enough to stay in cache-friendly sizes, large
# enough that the Python loop is negligible next to the arithmetic.
DEFAULT_CHUNK_ELEMENTS = 1 << 20


def _chunks(batch: int, length: int, vocab: int, chunk_elements: int):
    """Yield `(b, t0, t1)`: row `b`, positions `[t0, t1)` of at most `chunk_elements // vocab` tokens."""
    step = max(1, chunk_elements // max(vocab, 1))
    for b in range(batch):
        for t0 in range(0, length, step):
            yield b, t0, min(t0 + step, length)


class _ChunkedNextTokenLogprobs(torch.autograd.Function):
    """log p(input_ids[:, t+1]) from next_token_logits[:, t]; see `next_token_logprobs`."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, input_ids: torch.Tensor, chunk_elements: int) -> torch.Tensor:
        batch, seq, vocab = logits.shape
        targets = input_ids[:, 1:]
        dtype = compute_dtype(logits)
        out = torch.empty(batch, seq - 1, dtype=dtype, device=logits.device)
        lse = torch.empty_like(out)
        for b, t0, t1 in _chunks(batch, seq - 1, vocab, chunk_elements):
            x = logits[b, t0:t1].to(dtype)
            lse[b, t0:t1] = torch.logsumexp(x, dim=-1)
            out[b, t0:t1] = x.gather(-1, targets[b, t0:t1, None]).squeeze(-1) - lse[b, t0:t1]
        ctx.save_for_backward(logits, targets, lse)
        ctx.chunk_elements = chunk_elements
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, targets, lse = ctx.saved_tensors
        batch, seq, vocab = logits.shape
        grad_logits = torch.empty_like(logits)
        grad_logits[:, -1].zero_()  # the last position predicts nothing here
        dtype = compute_dtype(logits)
        grad_out = grad_out.to(dtype)
        for b, t0, t1 in _chunks(batch, seq - 1, vocab, ctx.chunk_elements):
            g = grad_out[b, t0:t1, None]
            # d logp(y) / d x_v = 1[v = y] - softmax(x)_v, scaled by the incoming gradient.
            x = logits[b, t0:t1].to(dtype, copy=True)
            x.sub_(lse[b, t0:t1, None]).exp_().mul_(-g)
            x.scatter_add_(-1, targets[b, t0:t1, None], g)
            grad_logits[b, t0:t1] = x
        return grad_logits, None, None


def next_token_logprobs(
    next_token_logits: torch.Tensor,
    input_ids: torch.Tensor,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> torch.Tensor:
    """Log-probabilities of `input_ids[:, 1:]` under `next_token_logits[:, :-1]`, in float32.

    Args:
        next_token_logits: `[B, S, V]`, any floating dtype; position t predicts `input_ids[:, t+1]`.
        input_ids: `[B, S]` token ids.
        chunk_elements: float32 scratch elements per chunk (positions per chunk = this // V).

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
    return _ChunkedNextTokenLogprobs.apply(next_token_logits, input_ids.long(), int(chunk_elements))
