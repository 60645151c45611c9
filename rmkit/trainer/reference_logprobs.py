"""The reference policy's log-probs of every response, computed once before training and cached on disk.

DPO compares the policy with a frozen reference (the policy as it starts; under LoRA the same model with its
adapters disabled, no second copy). The reference never changes, so one pass over the data before the first
step gives every log-prob the run needs; NeMo RL recomputes them every step instead. The pass is cached in
`<checkpoint_dir>/reference_logprobs/<label>-<key>.pt`, `key` a hash of the reference weights, the tokenized
pairs and the settings that change the numbers (precision, max length, overlong rule): a resumed or repeated
run with the same key reads the file; any change computes a new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from rmkit import distributed as dist
from rmkit.data.policy_tokenize import PolicyPair
from rmkit.losses.logprobs import aligned_logprobs
from rmkit.models.pair_logprobs import PLACEHOLDER, PairLogits, RefLogprobs, response_start
from rmkit.trainer.sharding import same_count

CACHE_VERSION = 1


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of the reference weights: every parameter and buffer by name, LoRA adapters left out (the
    reference is the model without them)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if "lora_" in name:
            continue
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def cache_key(weights: str, pairs: Sequence[PolicyPair], settings: dict) -> str:
    """A hash of the reference weights' digest, the pairs' token ids and `settings`."""
    digest = hashlib.sha256(f"v{CACHE_VERSION}:{weights}:{json.dumps(settings, sort_keys=True)}".encode())
    for pair in pairs:
        digest.update(json.dumps([pair.prompt_ids, pair.chosen_ids, pair.rejected_ids]).encode())
    return digest.hexdigest()[:32]


def response_logprobs(logits: torch.Tensor, data: dict, pairs: Sequence[PolicyPair]) -> list[RefLogprobs]:
    """Each pair's log-probs of its response tokens (float32, on the CPU) from `PairLogits`' output."""
    aligned = aligned_logprobs(logits.detach(), data["input_ids"]).float().cpu()  # [2N, S]
    out = []
    for i, pair in enumerate(pairs):
        start = response_start(pair)
        out.append((aligned[2 * i, start:start + len(pair.chosen_ids)].clone(),
                    aligned[2 * i + 1, start:start + len(pair.rejected_ids)].clone()))
    return out


def reference_context(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """The reference policy: under LoRA (peft) the model with its adapters disabled; else the model as it is."""
    return model.disable_adapter() if hasattr(model, "disable_adapter") else contextlib.nullcontext()


@torch.no_grad()
def compute_reference(pair_logits: PairLogits, pairs: Sequence[PolicyPair], micro_size: int) -> list[RefLogprobs]:
    """Reference log-probs of every pair's responses: this rank's share of the pairs in length-sorted
    micro-batches (little padding), gathered from every rank in the pairs' order."""
    mine = list(range(len(pairs)))[dist.rank()::dist.world_size()]
    mine.sort(key=lambda i: pairs[i].length, reverse=True)
    model = pair_logits.model
    was_training = model.training
    model.eval()
    results = {}
    chunks = [mine[start:start + micro_size] for start in range(0, len(mine), micro_size)]
    with reference_context(model):
        for chunk in same_count(chunks, model):  # FSDP2: as many forwards on every rank
            batch = [pairs[i] for i in chunk] if chunk is not None else [PLACEHOLDER]
            logits, data = pair_logits(batch)
            if chunk is not None:
                results.update(zip(chunk, response_logprobs(logits, data, batch)))
    model.train(was_training)
    for part in dist.all_gather_object(results) if dist.is_distributed() else []:
        results.update(part)
    return [results[i] for i in range(len(pairs))]


def _save(path: Path, key: str, refs: Sequence[RefLogprobs]) -> None:
    flat = [side for ref in refs for side in ref]
    payload = {"key": key, "lengths": torch.tensor([len(t) for t in flat], dtype=torch.long),
               "logprobs": torch.cat(flat) if flat else torch.zeros(0)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)  # atomic: a killed run leaves the whole file or none


def _load(path: Path, key: str, pairs: Sequence[PolicyPair]) -> list[RefLogprobs] | None:
    """The cached log-probs, or None when the file is missing, damaged or not for these pairs."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        sides = payload["logprobs"].split(payload["lengths"].tolist())
    except Exception:  # a missing or unreadable file is a cache miss, not an error
        return None
    expected = [len(side) for pair in pairs for side in (pair.chosen_ids, pair.rejected_ids)]
    if payload.get("key") != key or [len(s) for s in sides] != expected:
        return None
    return list(zip(sides[0::2], sides[1::2]))


def reference_logprobs(pair_logits: PairLogits, pairs: Sequence[PolicyPair], micro_size: int, cache_dir: Path,
                       label: str, weights: str, settings: dict) -> list[RefLogprobs]:
    """The reference log-probs of `pairs`: read from `<cache_dir>/<label>-<key>.pt`, else computed (every
    rank its share) and written there by rank 0."""
    key = cache_key(weights, pairs, settings)
    path = cache_dir / f"{label}-{key}.pt"
    refs = _load(path, key, pairs)
    if dist.broadcast_object(refs is not None):  # rank 0 decides; every rank loads or computes alike
        refs = refs if refs is not None else _load(path, key, pairs)
        if dist.is_main():
            print(f"rmkit: {label}: reference log-probs of {len(pairs)} pairs read from {path}", file=sys.stderr)
        return refs
    t0 = time.perf_counter()
    refs = compute_reference(pair_logits, pairs, micro_size)
    if dist.is_main():
        _save(path, key, refs)
        print(f"rmkit: {label}: reference log-probs of {len(pairs)} pairs computed in "
              f"{time.perf_counter() - t0:.1f}s -> {path}", file=sys.stderr)
    dist.barrier()
    return refs
