"""Slow, obviously-correct references for the losses: Python loops over rows and tokens.

Written independently of `rmkit.losses` (no shared helpers); each returns a scalar tensor that
autograd can differentiate, so tests compare values and gradients.
"""

from __future__ import annotations

import torch


def token_logprob(logits_row: torch.Tensor, target: int) -> torch.Tensor:
    """log softmax(logits_row)[target] for one position; `logits_row` is `[V]`."""
    v = logits_row.double()
    m = v.max().detach()
    return v[target] - m - torch.log(torch.exp(v - m).sum())


def logsigmoid(x: torch.Tensor) -> torch.Tensor:
    """log(1 / (1 + exp(-x))) written out, stable for either sign."""
    if x.item() >= 0:
        return -torch.log1p(torch.exp(-x))
    return x - torch.log1p(torch.exp(x))


def _valid(data, b: int, t: int) -> bool:
    return bool(data["token_mask"][b, t]) and bool(data["sample_mask"][b])


def preference(rewards, sample_mask, gvs, beta=1.0, margin=None, center=None):
    total = torch.zeros((), dtype=torch.float64)
    for i in range(rewards.shape[0] // 2):
        if not (sample_mask[2 * i] and sample_mask[2 * i + 1]):
            continue
        rc, rr = rewards[2 * i].double(), rewards[2 * i + 1].double()
        z = beta * (rc - rr) - (0.0 if margin is None else float(margin[i]))
        total = total - logsigmoid(z)
        if center:
            total = total + center * (rc + rr) ** 2
    return total / (gvs / 2)


def regression(rewards, labels, sample_mask, gvt):
    total = torch.zeros((), dtype=torch.float64)
    for b in range(labels.shape[0]):
        for k in range(labels.shape[1]):
            if sample_mask[b] and labels[b, k] != -100:
                total = total + (rewards[b, k].double() - float(labels[b, k])) ** 2
    return total / gvt


def sequence_nll(logits, data, b, average=False):
    """Summed (or averaged over the token mask) NLL of row b."""
    total, count = torch.zeros((), dtype=torch.float64), 0
    for t in range(1, data["input_ids"].shape[1]):
        if data["token_mask"][b, t]:
            count += 1
            if data["sample_mask"][b]:
                total = total - token_logprob(logits[b, t - 1], int(data["input_ids"][b, t]))
    return total / max(count, 1) if average else total


def nll(logits, data, gvt):
    total = torch.zeros((), dtype=torch.float64)
    for b in range(logits.shape[0]):
        for t in range(1, logits.shape[1]):
            if _valid(data, b, t):
                total = total - token_logprob(logits[b, t - 1], int(data["input_ids"][b, t]))
    return total / gvt


def dpo(logits, data, gvs, cfg):
    rewards = []
    for b in range(logits.shape[0]):
        r, n = torch.zeros((), dtype=torch.float64), 0
        for t in range(1, logits.shape[1]):
            if data["token_mask"][b, t]:
                lp = token_logprob(logits[b, t - 1], int(data["input_ids"][b, t]))
                r = r + lp - float(data["reference_policy_logprobs"][b, t])
                n += 1
        rewards.append(r / max(n, 1) if cfg["preference_average_log_probs"] else r)
    pref = preference(torch.stack(rewards), data["sample_mask"], gvs, cfg["reference_policy_kl_penalty"])
    sft = torch.zeros((), dtype=torch.float64)
    for i in range(logits.shape[0] // 2):
        if data["sample_mask"][2 * i] and data["sample_mask"][2 * i + 1]:
            sft = sft + sequence_nll(logits, data, 2 * i, cfg["sft_average_log_probs"])
    sft = sft / (gvs / 2)
    return cfg["preference_loss_weight"] * pref + cfg["sft_loss_weight"] * sft
