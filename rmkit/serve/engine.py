"""The scoring engine behind `rmkit serve` and the in-process RL environment.

One model, one forward at a time. The engine adds request handling to the inference core
(`rmkit.inference`): input checks that answer 400 (`InputError`), the `refuse` policy for over-long
inputs, and dynamic batching. Encoding, truncation, batching and reading rewards are the core's, so
served rewards equal offline ones whatever the batching (up to float rounding).

Dynamic batching (the asyncio path): requests that arrive within `batch_window_ms` of the first waiting
one are grouped; the group is sorted by length and cut into token-budgeted batches by the core in a
single worker thread, and every request gets its own rows back, in its own order. While a group is
in the model, new requests queue up and form the next group.

A process reward model (its contract names a step separator) scores solutions, a prompt and its steps
(`score_steps`: the core's `RewardScorer.score_steps`), not whole texts; a step request runs in the same worker
thread, one at a time with the groups (no batching across requests).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from rmkit.data.tokenize import keep_end
from rmkit.data.validate import check_messages
from rmkit.errors import ConfigError
from rmkit.inference import StepRewards, load_scorer

OVERLONG_CHOICES = ("truncate", "refuse")


class InputError(ValueError):
    """A request the engine cannot score (empty, over-long, a malformed message); the server says 400."""


class ScoringEngine:
    """Load a reward-model directory and score texts or conversations.

    Args:
        model_dir: an rmkit export or any HF sequence-classification directory (GGUF included).
        device, dtype: where and in which precision (`rmkit.inference.DTYPES` name) the model runs.
        max_batch_tokens: padded tokens (`rows x longest`) per forward pass (None: 1,024 on a CPU, 16,384 on an
            accelerator).
        max_batch_size: rows per forward pass.
        batch_window_ms: how long the first waiting async request waits for others to join its group.
        max_length: longest input in tokens (default: the model directory's scoring contract).
        overlong: "truncate" (the core's one rule: oldest conversation turns first, then the leading
            special tokens and the last tokens, where the reward is read) or "refuse" (InputError).
        normalize: serve `(reward - mean) / std` with the contract's reward statistics (scalar rewards).
        attribute_weights: K weights turning a regression model's `[K]` vector into one scalar reward.
    """

    def __init__(
        self,
        model_dir: str | Path,
        device: str = "cpu",
        dtype: str = "float32",
        max_batch_tokens: int | None = None,
        max_batch_size: int = 256,
        batch_window_ms: float = 5.0,
        max_length: int | None = None,
        overlong: str = "truncate",
        normalize: bool = False,
        attribute_weights: Sequence[float] | None = None,
    ):
        if overlong not in OVERLONG_CHOICES:
            raise ConfigError("overlong", f"must be one of {OVERLONG_CHOICES}, got {overlong!r}")
        self.model_dir = Path(model_dir)
        self.model_name = self.model_dir.name or str(model_dir)
        self.scorer = load_scorer(model_dir, device=device, dtype=dtype, max_length=max_length,
                                  max_batch_tokens=max_batch_tokens, max_batch_size=max_batch_size)
        self.tokenizer, self.max_length = self.scorer.tokenizer, self.scorer.max_length
        config = self.scorer.model.config
        self.num_labels = int(config.num_labels)
        self.labels = [config.id2label.get(i, f"LABEL_{i}") for i in range(self.num_labels)]
        self.batch_window_s = batch_window_ms / 1000.0
        self.overlong = overlong
        self.weights = self._check_weights(attribute_weights)
        self.normalize = normalize
        if normalize:
            self.scorer.check_normalizable()
            if self.num_labels > 1 and self.weights is None:
                raise ConfigError("normalize", "a regression model needs attribute weights to normalize a scalar")
        self.on_batch: Callable[[int, int, int], None] | None = None  # (requests, sequences, tokens)
        self._lock = threading.Lock()  # one model forward at a time, sync and async callers alike
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rmkit-score")
        self._pending: list[tuple[list[list[int]], asyncio.Future]] = []
        self._batcher: asyncio.Task | None = None

    def _check_weights(self, weights: Sequence[float] | None) -> torch.Tensor | None:
        if weights is None:
            return None
        if len(weights) != self.num_labels:
            raise ConfigError("attribute_weights", f"needs {self.num_labels} weights, got {len(weights)}")
        return torch.tensor([float(w) for w in weights], dtype=torch.float32)

    # ---- text to ids -------------------------------------------------------------------------------

    def _fit(self, inputs: Sequence, overlong: str | None = None) -> tuple[list[list[int]], int]:
        """The core's ids of each input and how many were cut (`_check_cut`)."""
        return self._check_cut(self.scorer.encode(inputs), overlong)

    def _check_cut(self, fitted: Sequence[tuple[list[int], int]],
                   overlong: str | None) -> tuple[list[list[int]], int]:
        """The ids of `(ids, full_length)` inputs already cut to the max length, and how many were cut;
        InputError under "refuse" (`overlong`, else the engine's policy) for an over-long one, or when one
        has no tokens."""
        overlong = overlong or self.overlong
        out, truncated = [], 0
        for i, (ids, full_length) in enumerate(fitted):
            if not ids:
                raise InputError(f"input {i} has no tokens")
            if full_length > self.max_length:
                if overlong == "refuse":
                    raise InputError(f"input {i} has {full_length} tokens, over the maximum of {self.max_length}")
                truncated += 1
            out.append(ids)
        return out, truncated

    def encode_texts(self, texts: Sequence[str], overlong: str | None = None) -> tuple[list[list[int]], int]:
        """Token ids of each text and how many were truncated; raises InputError on a bad one. `overlong`
        overrides the engine's policy for this call ("truncate" or "refuse")."""
        if not texts:
            raise InputError("no inputs to score")
        for i, text in enumerate(texts):
            if not text:
                raise InputError(f"input {i} is an empty string")
        return self._fit(texts, overlong)

    def check_token_ids(self, sequences, overlong: str | None = None) -> tuple[list[list[int]], int]:
        """Client-tokenized inputs (lists of token ids) checked against the vocabulary and cut by the same
        rule as text (leading special tokens and the end); how many were cut."""
        if not isinstance(sequences, list) or not sequences:
            raise InputError("no inputs to score")
        vocab = self.scorer.model.get_input_embeddings().num_embeddings
        for i, ids in enumerate(sequences):
            if not ids or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids):
                raise InputError(f"input {i} must be a non-empty list of token ids in [0, {vocab})")
        return self._check_cut([(keep_end(self.tokenizer, list(ids), self.max_length), len(ids)) for ids in sequences],
                               overlong)

    def encode_conversations(self, conversations: Sequence[list[dict]]) -> tuple[list[list[int]], int]:
        """Token ids of each conversation (the model's chat template) and how many were truncated; the
        messages are checked by the data library's one message check."""
        if not conversations:
            raise InputError("no inputs to score")
        checked = [check_messages(messages, f"conversation {i}", lambda field, message: InputError(f"{field}: {message}"))
                   for i, messages in enumerate(conversations)]
        return self._fit(checked)

    # ---- scoring -----------------------------------------------------------------------------------

    def score_ids(self, sequences: list[list[int]], requests: int = 1) -> torch.Tensor:
        """Raw rewards `[N, K]` float32 for N token sequences, in order (the core's `score_ids`)."""
        with self._lock:
            rewards = self.scorer.score_ids(sequences)
        if self.on_batch is not None:
            self.on_batch(requests, len(sequences), sum(len(s) for s in sequences))
        return rewards

    def score_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """Raw rewards `[N, K]` for N texts."""
        return self.score_ids(self.encode_texts(texts)[0])

    def score_conversations(self, conversations: Sequence[list[dict]]) -> torch.Tensor:
        """Raw rewards `[N, K]` for N conversations (lists of `{"role", "content"}` messages)."""
        return self.score_ids(self.encode_conversations(conversations)[0])

    # ---- a process reward model's steps -------------------------------------------------------------

    @property
    def is_process(self) -> bool:
        """Whether the model scores the steps of solutions (a process reward model)."""
        return self.scorer.is_process

    def check_solutions(self, solutions: Sequence[tuple[str, Sequence[str]]],
                        where: str = "solutions") -> list[tuple[list[int], list[int], int]]:
        """`(prompt, steps)` solutions checked for a process reward model and encoded (the core's
        `encode_solution`: ids after the cut, label positions, number of steps). InputError
        naming `where[i]` and the field for an empty prompt, steps that are not a non-empty list of non-empty
        strings, a step holding the step separator, a solution over the max length under "refuse"; and when the
        model is not a process reward model."""
        if not self.is_process:
            raise InputError(f"{self.model_name} is not a process reward model (its scoring_contract.json names no "
                             "step_separator): score whole texts with POST /v1/score")
        if not solutions:
            raise InputError("no solutions to score")
        separator, encoded = self.scorer.contract.step_separator, []
        for i, (prompt, steps) in enumerate(solutions):
            if not isinstance(prompt, str) or not prompt.strip():
                raise InputError(f"{where}[{i}].prompt must be a non-empty string")
            if not isinstance(steps, (list, tuple)) or not steps:
                raise InputError(f"{where}[{i}].steps must be a non-empty list of steps (strings)")
            for j, step in enumerate(steps):
                if not isinstance(step, str) or not step.strip():
                    raise InputError(f"{where}[{i}].steps[{j}] must be a non-empty string")
                if separator in step:
                    raise InputError(f"{where}[{i}].steps[{j}] contains the step separator {separator!r}: send it "
                                     "as separate steps")
            encoded.append(self.scorer.encode_solution(prompt, steps))
            _, positions, num_steps = encoded[-1]
            if len(positions) < num_steps and self.overlong == "refuse":
                raise InputError(f"{where}[{i}] has steps past the maximum of {self.max_length} tokens")
        return encoded

    def score_steps(self, solutions: Sequence[tuple[str, Sequence[str]]],
                    where: str = "solutions") -> tuple[list[StepRewards], int]:
        """Each `(prompt, steps)` solution's step probabilities and reward (the core's `score_steps`, whose
        `StepRewards` says what a cut solution gets), checked and encoded once first (`check_solutions`), and the
        tokens read."""
        encoded = self.check_solutions(solutions, where)
        tokens = sum(len(ids) for ids, _, _ in encoded)
        with self._lock:
            results = self.scorer.score_solution_ids(encoded)
        if self.on_batch is not None:
            self.on_batch(1, len(solutions), tokens)
        return results, tokens

    async def score_steps_async(self, solutions: Sequence[tuple[str, Sequence[str]]],
                                where: str = "solutions") -> tuple[list[StepRewards], int]:
        """`score_steps` in the worker thread, after the group in the model now."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.score_steps, solutions, where)

    # ---- rewards -----------------------------------------------------------------------------------

    def scalar_rewards(self, rewards: torch.Tensor) -> torch.Tensor | None:
        """One reward per row `[N]` from raw `[N, K]` (the core's `scalar` with this engine's weights and
        normalization); None for a regression model without weights."""
        return self.scorer.scalar(rewards, self.weights, self.normalize)

    # ---- dynamic batching (asyncio) ----------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """Requests waiting for the model (not counting the group in the model now)."""
        return len(self._pending)

    async def score_ids_async(self, sequences: list[list[int]]) -> torch.Tensor:
        """Raw rewards `[N, K]` for one request, scored together with the requests around it."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((sequences, future))
        if self._batcher is None or self._batcher.done():
            self._batcher = loop.create_task(self._run_groups())
        return await future

    async def _run_groups(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            await asyncio.sleep(self.batch_window_s)
            group, self._pending = self._pending, []
            sequences = [seq for request, _ in group for seq in request]
            try:
                rewards = await loop.run_in_executor(self._executor, self.score_ids, sequences, len(group))
            except Exception as err:  # answer every waiting request; the batcher keeps going
                for _, future in group:
                    if not future.done():
                        future.set_exception(err)
                continue
            start = 0
            for request, future in group:
                if not future.done():  # a client that went away leaves a cancelled future
                    future.set_result(rewards[start : start + len(request)])
                start += len(request)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
