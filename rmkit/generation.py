"""Completions from a policy: prompts in; completion ids, text and per-token log-probs out.

One small interface, `generate_completions`, so that another backend (vLLM where GPUs are) can stand in;
the one shipped is transformers' `generate`: batched, KV cache, prompts padded on the left. Greedy when
`temperature == 0` (the sample generations DPO and SFT write at validation), else sampling with
temperature / top-p / top-k (GRPO's rollouts). The log-prob of a sampled token is
`log_softmax(logits / temperature)` of the model's raw logits, what the clipped policy-gradient loss
compares training log-probs with (`token_mult_prob_error`); greedy decoding reports `log_softmax(logits)`.

The prompts (all but their last token) are computed before `generate` starts, each distinct prompt once: a
prompt that appears on several rows (GRPO samples each prompt G times) has its keys/values copied to every row
that repeats it. On a CPU the distinct prompts run in chunks of similar length, each padded only to its own
longest instead of the batch's. `generate` continues from that cache. Rows then differ only in what they
sample; the logits equal those of separate prompt forwards within float32 rounding.

The cache is allocated once for the prompt and every new token (transformers' `StaticCache`) where the model
supports one: a growing cache concatenates every layer's keys and values again at each token, which on 2 CPU
cores took 1.1 s of the 11.4 s that SmolLM2-135M spent on 16 HH prompts x 48 tokens (three batches each
way, the same samples). Models with sliding-window layers keep the growing cache.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache, StaticCache

from rmkit.config import SamplingParams
from rmkit.distributed import is_sharded
from rmkit.errors import TrainingDiverged
from rmkit.models.reward_forward import chunk_overhead, planned_chunks
from rmkit.models.setup import has_sliding_layers
from rmkit.wrappers import transformers_model


@dataclass
class Completions:
    """`generate_completions`' answer, one entry per prompt, in order."""

    ids: list[list[int]]
    """Generated token ids, up to and including the stop token (EOS, or the token that completes a stop string)."""
    text: list[str]
    """The completions decoded without special tokens."""
    logprobs: list[torch.Tensor]
    """`[len(ids[i])]` float32 log-probs of each generated token, as sampled."""
    truncated: list[bool]
    """True where `max_new_tokens` ran out before a stop token or stop string."""


def _left_padded(prompts: Sequence[Sequence[int]], pad_id: int, min_width: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(min_width, *(len(p) for p in prompts))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt):] = 1
    return ids, mask


@torch.no_grad()
def generate_completions(model, tokenizer, prompts: Sequence[Sequence[int]], params: SamplingParams,
                         generator: torch.Generator | None = None) -> Completions:
    """Complete every prompt (token ids) once. transformers' `generate` draws from torch's global RNG;
    with `generator` (a CPU `torch.Generator`) the draws come from its state instead, which is advanced,
    and the global RNG is left as it was."""
    device = next(model.parameters()).device
    ids, mask = _left_padded(prompts, tokenizer.pad_token_id)
    ids, mask = ids.to(device), mask.to(device)
    greedy = params.temperature == 0
    options = {"do_sample": False} if greedy else {
        "do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k or 0}
    was_training = model.training
    model.eval()
    with torch.random.fork_rng(devices=[]) if generator is not None else contextlib.nullcontext():
        if generator is not None:
            torch.set_rng_state(generator.get_state())
        guard = NonFiniteGuard()
        cache = _prompt_cache(model, prompts, ids.shape[1], tokenizer.pad_token_id, params.max_new_tokens)
        out = model.generate(input_ids=ids, attention_mask=mask, **cache,
                             max_new_tokens=params.max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id, output_logits=True, return_dict_in_generate=True,
                             disable_compile=True,  # a static cache would otherwise compile the forward on a GPU
                             # FSDP2: a rank that is done keeps running forwards (they all-gather) until all are
                             synced_gpus=is_sharded(model), logits_processor=[guard], **options,
                             **_stop_options(params, tokenizer))
        if generator is not None:
            generator.set_state(torch.get_rng_state())
    model.train(was_training)
    guard.check()
    new = out.sequences[:, ids.shape[1]:].cpu()
    logits = torch.stack(out.logits, dim=1).float().cpu()  # [B, T, V]: the raw logits of each generated step
    scaled = logits if greedy else logits / params.temperature
    token_logprobs = torch.log_softmax(scaled, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    return _completions(new, token_logprobs, tokenizer, params.stop_strings)


def _prompt_cache(model, prompts: Sequence[Sequence[int]], width: int, pad_id: int, max_new_tokens: int) -> dict:
    """`generate`'s cache keyword: a cache for `width` prompt positions (the batch's left-padded layout) and
    `max_new_tokens` more, static where the model supports one (`_static_cache`), holding every row's prompt but
    its last token already computed: each distinct prompt once, and on a CPU in chunks of prompts of similar
    length, each left-padded only to its own longest (`planned_chunks`). `generate`'s own prefill pads every
    prompt to the batch's longest: 16 HH prompts drawn at random are 33% real tokens that way. The chunks' keys
    and values are laid right-aligned into the batch's layout (the positions left of them are padding, masked
    there) and copied to every row that repeats a prompt. The cache is left empty for `generate`'s prefill when
    that saves nothing (one chunk, no prompt repeated) or the prompts are one token wide (`{}` then, without a
    static cache). Under FSDP2 every rank takes this path whenever the width allows, with one chunk, so that all
    ranks run the same forwards; models with sliding-window layers get one chunk too (their caches are not laid
    out by position)."""
    index: dict[tuple[int, ...], int] = {}  # a distinct prompt -> its position among the distinct ones
    heads, source = [], []
    for prompt in prompts:
        if tuple(prompt) not in index:
            index[tuple(prompt)] = len(heads)
            heads.append(list(prompt[:-1]))
        source.append(index[tuple(prompt)])
    keyword, cache = _cache_keyword(model), _static_cache(model, width + max_new_tokens)
    empty = {keyword: cache} if cache is not None else {}
    if width < 2:
        return empty
    device = next(model.parameters()).device
    overhead = math.inf if has_sliding_layers(model) else chunk_overhead(model, device)
    chunks = planned_chunks([len(head) for head in heads], overhead)
    if len(chunks) == 1 and len(heads) == len(prompts) and not is_sharded(model):
        return empty
    layers = []  # per chunk, per layer, (keys, values) [n_chunk, heads, w_chunk, d]
    for chunk in chunks:
        chunk_ids, chunk_mask = _left_padded([heads[i] for i in chunk], pad_id, min_width=1)
        chunk_ids, chunk_mask = chunk_ids.to(device), chunk_mask.to(device)
        positions = (chunk_mask.cumsum(-1) - 1).masked_fill(chunk_mask == 0, 0)  # as generate derives them
        out = model(input_ids=chunk_ids, attention_mask=chunk_mask, position_ids=positions, use_cache=True,
                    **_last_logits_only(model))
        layers.append(_cache_tensors(getattr(out, "cache" if hasattr(out, "cache") else "past_key_values")))
    cache = DynamicCache() if cache is None else cache
    rows = torch.tensor(source, device=device)
    for layer in range(len(layers[0])):
        keys, values = (_right_aligned([chunk_layers[layer][n] for chunk_layers in layers], chunks, len(heads), width - 1)
                        for n in (0, 1))
        cache.update(keys[rows], values[rows], layer)
    return {keyword: cache}


def _static_cache(model, length: int) -> StaticCache | None:
    """An empty `StaticCache` of `length` positions for `model`, or None where the model's attention does not
    take one (transformers marks those that do `_can_compile_fullgraph`), it has sliding-window layers, or its
    generation config names a cache of its own (`generate` refuses a cache object beside that)."""
    inner = transformers_model(model)
    if (not getattr(inner, "_can_compile_fullgraph", False) or has_sliding_layers(model)
            or getattr(getattr(inner, "generation_config", None), "cache_implementation", None)):
        return None
    return StaticCache(config=inner.config, max_cache_len=length)


def _cache_keyword(model) -> str:
    """The keyword a transformers decoder's forward and `generate` take a cache by (`cache` in transformers 5,
    `past_key_values` before)."""
    return "cache" if "cache" in inspect.signature(transformers_model(model).forward).parameters else "past_key_values"


def _right_aligned(parts: Sequence[torch.Tensor], chunks: Sequence[Sequence[int]], rows: int, width: int) -> torch.Tensor:
    """`[rows, heads, width, d]` zeros with each chunk's `[n_c, heads, w_c, d]` part in its rows (`chunks[c]`),
    in the last `w_c` positions: left-padded prompts all end where the batch's do."""
    whole = parts[0].new_zeros((rows, parts[0].shape[1], width, parts[0].shape[3]))
    for part, chunk in zip(parts, chunks):
        whole[torch.tensor(chunk, device=part.device), :, width - part.shape[2]:] = part
    return whole


def _last_logits_only(model) -> dict:
    """The keyword with which a transformers causal LM computes logits at the last position only (the prefill's
    are not read), where its forward takes one."""
    parameters = inspect.signature(transformers_model(model).forward).parameters
    return {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}


def _cache_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A transformers cache's `(keys, values)` per layer (`layers` in transformers 5, `key_cache` before)."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def run_with_copied_cache(model, rows: torch.Tensor, **inputs) -> tuple[Any, dict]:
    """Run `inputs` through `model` keeping its key/value cache, then copy that cache to `rows` (row r takes
    the keys/values of input row `rows[r]`). Returns the model's output and the keyword arguments with which a
    forward or `generate` goes on from the copied cache (`cache` in recent transformers, `past_key_values` in
    older ones)."""
    out = model(**inputs, use_cache=True)
    keyword = "cache" if hasattr(out, "cache") else "past_key_values"
    cache = getattr(out, keyword)
    cache.reorder_cache(rows)
    return out, {keyword: cache}


class NonFiniteGuard:
    """A logits processor for `generate`: a NaN or +inf score would crash sampling inside `torch.multinomial`
    with a message about probabilities. It notes such scores in a device flag (no host sync per token) and
    hands the sampler zeros in their place so `generate` finishes; `check()` then raises `TrainingDiverged`."""

    def __init__(self):
        self.seen: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        bad = torch.isnan(scores) | torch.isposinf(scores)  # -inf is a filtered token (top-k, top-p), not a fault
        self.seen = bad.any() if self.seen is None else self.seen | bad.any()
        return scores.masked_fill(bad, 0.0)

    def check(self) -> None:
        if self.seen is not None and bool(self.seen):
            raise TrainingDiverged("the policy's logits became NaN or infinite while it generated")


def _stop_options(params: SamplingParams, tokenizer) -> dict:
    return {"stop_strings": list(params.stop_strings), "tokenizer": tokenizer} if params.stop_strings else {}


def _stop_string_end(row: list[int], tokenizer, stop_strings: list[str] | None) -> int | None:
    """Index of the token that completes the first stop string of `row`, or None."""
    if not stop_strings:
        return None
    for i in range(len(row)):
        text = tokenizer.decode(row[:i + 1], skip_special_tokens=False)
        if any(s in text for s in stop_strings):
            return i
    return None


def _completions(new: torch.Tensor, token_logprobs: torch.Tensor, tokenizer, stop_strings=None) -> Completions:
    result = Completions([], [], [], [])
    for row, logprobs in zip(new.tolist(), token_logprobs):
        ends = [next((i for i, t in enumerate(row) if t == tokenizer.eos_token_id), None),
                _stop_string_end(row, tokenizer, stop_strings)]
        stop = min((i for i in ends if i is not None), default=None)
        kept = row if stop is None else row[:stop + 1]
        result.ids.append(kept)
        result.text.append(tokenizer.decode(kept, skip_special_tokens=True))
        result.logprobs.append(logprobs[:len(kept)].clone())
        result.truncated.append(stop is None)
    return result
