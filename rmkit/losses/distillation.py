"""On-policy distillation: KL of the student against a teacher's top-k next-token distribution.

NeMo RL's DistillationLossFn (Hinton et al. https://arxiv.org/abs/1503.02531; on-policy / reverse
KL as in Agarwal et al. https://arxiv.org/abs/2306.13649). The teacher is summarized per position by
its k largest logits and their vocabulary ids; the student is compared with it on those k ids.
"""

from __future__ import annotations

from typing import Any, TypedDict

import torch

from rmkit.losses.configs import check_config_keys
from rmkit.losses.logprobs import DEFAULT_CHUNK_ELEMENTS, _chunk_scratch, _chunks, _view
from rmkit.losses.masking import compute_dtype, masked_mean


class DistillationLossConfig(TypedDict, total=False):
    """Keys of `DistillationLossFn`'s config; all optional, defaults as NeMo RL's."""

    kl_type: str  # "forward" KL(teacher || student), "reverse" KL(student || teacher), or "mixed". Default "mixed"
    mixed_kl_weight: float  # w in [0, 1]: mixed = w * forward + (1 - w) * reverse. Default 0.5
    zero_outside_topk: bool  # student log-probs over the full vocabulary, teacher ~0 outside its top-k. Default False


DEFAULTS: DistillationLossConfig = {"kl_type": "mixed", "mixed_kl_weight": 0.5, "zero_outside_topk": False}
KL_TYPES = ("forward", "reverse", "mixed")
# log p_teacher assumed for every token outside the teacher's top-k when zero_outside_topk is set.
LOG_INFINITESIMAL = -100.0


def _validate(cfg: dict) -> dict:
    check_config_keys(cfg, set(), set(DEFAULTS), "DistillationLossConfig")
    cfg = {**DEFAULTS, **cfg}
    if cfg["kl_type"] not in KL_TYPES:
        raise ValueError(f"DistillationLossConfig: kl_type must be one of {list(KL_TYPES)}, got {cfg['kl_type']!r}")
    weight = cfg["mixed_kl_weight"]
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight <= 1:
        raise ValueError(f"DistillationLossConfig: mixed_kl_weight must be in [0, 1], got {weight!r}")
    if not isinstance(cfg["zero_outside_topk"], bool):
        raise ValueError(f"DistillationLossConfig: zero_outside_topk must be a bool, got {cfg['zero_outside_topk']!r}")
    return cfg


class _ChunkedTopkLogprobs(torch.autograd.Function):
    """Full-vocabulary log-softmax of `logits [B, T, V]` gathered at `index [B, T, k]`, and optionally
    `sum_v p_v log p_v` per position, one chunk of positions at a time (see `topk_logprobs`)."""

    @staticmethod
    def forward(ctx, logits, index, with_entropy: bool, chunk_elements: int):
        batch, length, vocab = logits.shape
        dtype = compute_dtype(logits)
        out = torch.empty(*index.shape, dtype=dtype, device=logits.device)
        neg_entropy = torch.zeros(batch, length, dtype=dtype, device=logits.device)
        scratch = _chunk_scratch(batch, length, vocab, chunk_elements, dtype, logits.device)
        for rows, pos in _chunks(batch, length, vocab, chunk_elements):
            chunk = logits[rows, pos]
            logp = torch.log_softmax(chunk, dim=-1, dtype=dtype, out=_view(scratch, chunk))
            out[rows, pos] = logp.gather(-1, index[rows, pos])
            if with_entropy:
                # xlogy: 0 * log 0 = 0 where a probability underflows (or a logit is -inf).
                p = logp.exp()
                neg_entropy[rows, pos] = torch.special.xlogy(p, p).sum(-1)
        ctx.save_for_backward(logits, index, neg_entropy)
        ctx.chunk_elements, ctx.with_entropy = chunk_elements, with_entropy
        if not with_entropy:
            ctx.mark_non_differentiable(neg_entropy)  # zeros, not a function of the logits
        return out, neg_entropy

    @staticmethod
    def backward(ctx, grad_out, grad_neg_entropy):
        # d log p_i / d x_v = 1[v = i] - p_v;  d (sum_u p_u log p_u) / d x_v = p_v (log p_v - sum_u p_u log p_u).
        logits, index, neg_entropy = ctx.saved_tensors
        batch, length, vocab = logits.shape
        dtype = compute_dtype(logits)
        grad_logits = torch.empty_like(logits)
        grad_out = grad_out.to(dtype)
        if not ctx.with_entropy or grad_neg_entropy is None:
            grad_neg_entropy = None
        else:
            grad_neg_entropy = grad_neg_entropy.to(dtype)
        scratch = _chunk_scratch(batch, length, vocab, ctx.chunk_elements, dtype, logits.device)
        for rows, pos in _chunks(batch, length, vocab, ctx.chunk_elements):
            chunk = logits[rows, pos]
            g = grad_out[rows, pos]
            logp = torch.log_softmax(chunk, dim=-1, dtype=dtype, out=_view(scratch, chunk))
            p = logp.exp()
            x = p * -g.sum(-1, keepdim=True)
            if grad_neg_entropy is not None:
                # where: a -inf logit has p = 0 and must not turn 0 * -inf into NaN.
                entropy_grad = torch.where(p > 0, p * (logp - neg_entropy[rows, pos, None]), 0.0)
                x += grad_neg_entropy[rows, pos, None] * entropy_grad
            grad_logits[rows, pos] = x.scatter_add_(-1, index[rows, pos], g)
        return grad_logits, None, None, None


def topk_logprobs(
    logits: torch.Tensor,
    index: torch.Tensor,
    with_entropy: bool = False,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(log_softmax(logits)[..., index], sum_v p_v log p_v)` in float32 (float64 for float64 logits).

    Args:
        logits: `[B, T, V]`, any floating dtype.
        index: `[B, T, k]` vocabulary ids.
        with_entropy: also compute the negative entropy `[B, T]` (zeros otherwise).

    The float32 softmax exists one chunk of positions at a time (forward and backward), never as a
    `[B, T, V]` copy; the backward recomputes it and allocates only the gradient of the logits.
    """
    batch, length, vocab = logits.shape
    chunk_elements = min(int(chunk_elements), max(vocab, batch * length * vocab // 16))
    return _ChunkedTopkLogprobs.apply(logits, index.long(), with_entropy, chunk_elements)


def _check_data(data: dict[str, Any], logits: torch.Tensor) -> None:
    for key in ("input_ids", "token_mask", "sample_mask", "teacher_topk_logits", "teacher_topk_indices"):
        if key not in data:
            raise ValueError(f"DistillationLossFn: data has no {key!r}")
    logits_shape, indices = tuple(logits.shape), data["teacher_topk_indices"]
    if logits.dim() != 3 or indices.dim() != 3 or indices.shape[:2] != logits.shape[:2]:
        raise ValueError(
            f"DistillationLossFn: teacher_topk_indices {tuple(indices.shape)} must be [B, S, k] with the "
            f"[B, S] of next_token_logits {logits_shape}"
        )
    if indices.shape[-1] <= 0:
        raise ValueError(f"DistillationLossFn: topk must be positive, got {indices.shape[-1]}")
    if data["teacher_topk_logits"].shape != indices.shape:
        raise ValueError(
            f"DistillationLossFn: teacher_topk_logits {tuple(data['teacher_topk_logits'].shape)} and "
            f"teacher_topk_indices {tuple(indices.shape)} differ"
        )


class DistillationLossFn:
    """KL between the student's and the teacher's next-token distributions on the teacher's top-k ids.

    Called as `loss_fn(next_token_logits [B, S, V], data, global_valid_seqs, global_valid_toks)`.
    `data` holds `input_ids [B, S]`, `token_mask [B, S]` (aligned with input_ids), `sample_mask [B]`,
    and the teacher's `teacher_topk_logits [B, S, k]` (float) and `teacher_topk_indices [B, S, k]`
    (vocabulary ids), laid out like `next_token_logits`: entry `[b, t]` is the teacher's top-k for
    predicting `input_ids[b, t+1]`, so the last position is unused.

    Per position t < S-1, with `i = teacher_topk_indices[b, t]` (k ids), teacher `q = softmax(teacher
    logits over the k)` and student log-probs `s`:
    - `zero_outside_topk=False`: `s = log_softmax(next_token_logits[b, t, i])`, both renormalized on
      the k ids: `forward = sum_k q (log q - s)`, `reverse = sum_k e^s (s - log q)`.
    - `zero_outside_topk=True`: `s = log_softmax(next_token_logits[b, t])[i]` (full vocabulary, not
      renormalized); the teacher puts log-prob -100 on every id outside its top-k, so `reverse` gains
      `sum_{v not in i} p_v (log p_v + 100) = (sum_v p log p - sum_k e^s s) + 100 (1 - sum_k e^s)`.
      `forward` is unchanged (the teacher's mass outside the top-k is taken as 0).
    - `mixed = w * forward + (1 - w) * reverse`, `w = mixed_kl_weight`.

    The loss is the masked sum over `token_mask[:, 1:] * sample_mask` divided by `global_valid_toks`.
    Ids repeated within a top-k count once per occurrence (as in NeMo RL). Metrics: `loss`,
    `num_valid_samples` (rows in this microbatch, as NeMo RL counts them).
    """

    def __init__(self, cfg: DistillationLossConfig):
        self.cfg = _validate(dict(cfg))
        self.kl_type = self.cfg["kl_type"]
        self.mixed_kl_weight = float(self.cfg["mixed_kl_weight"])
        self.zero_outside_topk = self.cfg["zero_outside_topk"]

    def _student_logprobs(self, logits: torch.Tensor, index: torch.Tensor):
        """Student log-probs `[B, S-1, k]` on the teacher's ids, and `sum_v p log p` `[B, S-1]` or None.

        Computed on all S positions and sliced afterwards (the last one is wasted work): slicing the
        logits first would make the backward allocate a second `[B, S, V]` gradient buffer.
        """
        if self.zero_outside_topk:
            with_entropy = self.kl_type != "forward"
            logprobs, neg_entropy = topk_logprobs(logits, index, with_entropy=with_entropy)
            return logprobs[:, :-1], neg_entropy[:, :-1] if with_entropy else None
        # k logits per position: no [B, S, V] copy in float32, only the gather's gradient buffer.
        topk = logits.gather(-1, index.long())
        return torch.log_softmax(topk, dim=-1, dtype=compute_dtype(logits))[:, :-1], None

    def __call__(
        self,
        next_token_logits: torch.Tensor,
        data: dict[str, Any],
        global_valid_seqs: torch.Tensor | float | None,
        global_valid_toks: torch.Tensor | float,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        _check_data(data, next_token_logits)
        if global_valid_toks is None:
            raise ValueError("DistillationLossFn needs global_valid_toks")
        student, neg_entropy = self._student_logprobs(next_token_logits, data["teacher_topk_indices"])
        dtype = student.dtype
        mask = data["token_mask"][:, 1:].to(dtype) * data["sample_mask"].to(dtype)[:, None]
        teacher = torch.log_softmax(data["teacher_topk_logits"][:, :-1].to(dtype), dim=-1)
        # Padding positions may hold anything (-inf logits make NaN log-probs): zero them so the
        # masked sum and its gradient stay finite.
        teacher = torch.where(mask[..., None] > 0, teacher, torch.zeros_like(teacher))

        per_token = self._per_token_kl(student, teacher, neg_entropy)
        loss = masked_mean(per_token, mask, global_valid_toks)
        return loss, {
            "loss": loss.detach(),
            "num_valid_samples": torch.tensor(float(data["input_ids"].shape[0]), device=loss.device),
        }

    def _per_token_kl(self, student, teacher, neg_entropy) -> torch.Tensor:
        """`[B, S-1]` KL per position from log-probs `[B, S-1, k]` (summed in NeMo RL's order)."""
        student_probs, teacher_probs = student.exp(), teacher.exp()
        forward = teacher_probs * (teacher - student)
        reverse = student_probs * (student - teacher)
        w = self.mixed_kl_weight
        terms = {"forward": forward, "reverse": reverse}.get(self.kl_type)
        per_token = (w * forward + (1.0 - w) * reverse if terms is None else terms).sum(-1)
        if neg_entropy is None:
            return per_token
        # Reverse KL over the ids outside the top-k, where the teacher's log-prob is LOG_INFINITESIMAL.
        rest_neg_entropy = neg_entropy - (student_probs * student).sum(-1)
        rest_mass = 1 - student_probs.sum(-1)
        outside = rest_neg_entropy - LOG_INFINITESIMAL * rest_mass
        return per_token + (outside if self.kl_type == "reverse" else (1.0 - w) * outside)
