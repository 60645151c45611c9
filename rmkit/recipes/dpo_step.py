"""One DPO optimizer step, one validation pass and the sample generations, for `rmkit.recipes.dpo`.

A step's global batch is split into micro-batches whose losses are divided by the *global* batch's pair
count (exact gradient accumulation, docs/design.md); under torchrun each rank takes its slice and the counts
and metrics are summed over ranks. Metrics are NeMo RL's (`loss`, `sft_loss`, `preference_loss`, `accuracy`,
`rewards_chosen_mean`, `rewards_rejected_mean`) plus `rewards_margin_mean` (chosen minus rejected) and
`num_valid_samples` (pairs); rewards are the unscaled implicit rewards `log pi - log pi_ref` of a response.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from rmkit import distributed as dist
from rmkit.data.policy_tokenize import PolicyPair
from rmkit.generation import SamplingParams, generate_completions
from rmkit.losses.protocol import reduce_metrics
from rmkit.recipes.dpo_logprobs import RefLogprobs, reference_tensor
from rmkit.trainer.sharding import same_count

# A one-token pair standing in for a rank's empty share of a global batch (its rows have sample_mask 0).
PLACEHOLDER = PolicyPair([0], [0], [0], "placeholder")


def _global_counts(pairs: Sequence[PolicyPair]) -> tuple[torch.Tensor, torch.Tensor]:
    """`(global_valid_seqs, global_valid_toks)` of a global batch whose local slice is `pairs`."""
    counts = torch.tensor([2.0 * len(pairs), float(sum(len(p.chosen_ids) + len(p.rejected_ids) for p in pairs))])
    seqs, toks = dist.all_reduce_sum(counts)
    return seqs, toks


def _finish(metrics_list: list[dict]) -> dict[str, torch.Tensor]:
    """Micro-batch metrics summed, then summed over ranks (each is already divided by the global counts)."""
    metrics = reduce_metrics(metrics_list)
    names = sorted(metrics)
    values = dist.all_reduce_sum(torch.stack([torch.as_tensor(metrics[k]).float().cpu() for k in names]))
    out = dict(zip(names, values))
    out["rewards_margin_mean"] = out["rewards_chosen_mean"] - out["rewards_rejected_mean"]
    return out


def _micro_batches(pairs: Sequence, refs: Sequence, size: int, module: torch.nn.Module) -> list[tuple[list, list]]:
    """`(pairs, reference log-probs)` micro-batches of this rank's share. A rank whose share is empty runs one
    placeholder micro-batch (it still joins the gradient all-reduce); under FSDP2 a rank with fewer
    micro-batches than the busiest runs placeholder ones (every forward all-gathers)."""
    batches = [(pairs[i:i + size], refs[i:i + size]) for i in range(0, len(pairs), size)]
    return [batch or ([PLACEHOLDER], [(torch.zeros(1), torch.zeros(1))]) for batch in same_count(batches or [None], module)]


def _forward(forward: torch.nn.Module, batch: list[PolicyPair], batch_refs: list) -> tuple[torch.Tensor, dict]:
    logits, data = forward(batch)
    data["reference_policy_logprobs"] = reference_tensor(batch_refs, batch, data)
    if batch[0] is PLACEHOLDER:
        data["sample_mask"] = torch.zeros_like(data["sample_mask"])  # counts for nothing
    return logits, data


def dpo_step(forward: torch.nn.Module, loss_fn, pairs: Sequence[PolicyPair], refs: Sequence[RefLogprobs],
             micro_size: int) -> dict[str, torch.Tensor]:
    """Forward and backward over this rank's `pairs` of one global batch (gradients accumulate in the
    model; the caller steps the optimizer). `forward` is a `PairLogits`, or DDP around one."""
    global_seqs, global_toks = _global_counts(pairs)
    batches = _micro_batches(pairs, refs, micro_size, forward)
    metrics_list = []
    for k, (batch, batch_refs) in enumerate(batches):
        # DDP reduces gradients in the last micro-batch's backward only; the others accumulate locally.
        with dist.sync_gradients(forward, k == len(batches) - 1):
            logits, data = _forward(forward, batch, batch_refs)
            loss, metrics = loss_fn(logits, data, global_seqs, global_toks)
            loss.backward()
        metrics_list.append(metrics)
    return _finish(metrics_list)


@torch.no_grad()
def validate_pairs(pair_logits: torch.nn.Module, loss_fn, pairs: Sequence[PolicyPair], refs: Sequence[RefLogprobs],
                   micro_size: int) -> dict[str, float]:
    """The DPO metrics over all of `pairs` (every rank scores its share), as floats."""
    mine = list(range(len(pairs)))[dist.rank()::dist.world_size()]
    local_pairs, local_refs = [pairs[i] for i in mine], [refs[i] for i in mine]
    global_seqs, global_toks = _global_counts(local_pairs)
    model = pair_logits.model
    was_training = model.training
    model.eval()
    metrics_list = []
    for batch, batch_refs in _micro_batches(local_pairs, local_refs, micro_size, pair_logits):
        logits, data = _forward(pair_logits, batch, batch_refs)
        metrics_list.append(loss_fn(logits, data, global_seqs, global_toks)[1])
    model.train(was_training)
    return {k: float(v) for k, v in _finish(metrics_list).items()}


def write_samples(model: torch.nn.Module, tokenizer, pairs: Sequence[PolicyPair], path: Path, step: int,
                  set_name: str, max_new_tokens: int) -> None:
    """Greedy completions of the prompts of `pairs`, appended to the JSONL `path` by rank 0 as
    `{"step", "set", "source", "prompt", "completion"}` (the prompt as the policy reads it). Call it on rank 0,
    or on every rank when the model is sharded (each forward all-gathers)."""
    if not pairs:
        return
    prompts = [pair.prompt_ids for pair in pairs]
    completions = generate_completions(model, tokenizer, prompts, SamplingParams(max_new_tokens, temperature=0.0))
    if not dist.is_main():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        for pair, text in zip(pairs, completions.text):
            record = {"step": step, "set": set_name, "source": pair.source,
                      "prompt": tokenizer.decode(pair.prompt_ids), "completion": text}
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


def rewind_samples(path: Path, step: int) -> None:
    """Drop the sample lines written after `step` (a killed run wrote past the checkpoint it resumes from)."""
    if not path.is_file():
        return
    kept = [line for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and _step_of(line) <= step]
    path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


def _step_of(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):  # a line cut short by the kill
        return float("inf")
