"""The scoring engine behind `rmkit serve`, the client-free RL environment and the benchmarks.

One model, one forward at a time. Texts and conversations become token ids only through the data
contract (`encode_text` / `encode_conversation`), and rewards come only from `score_sequences`, the code
`rmkit score` runs, so served rewards equal offline ones whatever the batching (up to float rounding).

Dynamic batching (the asyncio path): requests that arrive within `batch_window_ms` of the first waiting
one are grouped; the group is sorted by length and cut into token-budgeted batches by `score_sequences`
in a single worker thread, and every request gets its own rows back, in its own order. While a group is
in the model, new requests queue up and form the next group.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from rmkit.data.tokenize import encode_examples, fit_example, keep_end
from rmkit.errors import ConfigError
from rmkit.models import load_reward_model, score_sequences

OVERLONG_CHOICES = ("truncate", "refuse")
ROLES = ("system", "user", "assistant", "tool")


class InputError(ValueError):
    """A request the engine cannot score (empty, over-long, a malformed message); the server says 400."""


def _read_stats(model_dir: Path) -> tuple[float, float]:
    path = model_dir / "reward_stats.json"
    if not path.is_file():
        raise ConfigError("normalize", f"{path} is missing; it holds the mean and std used to normalize")
    try:
        stats = json.loads(path.read_text())
        mean, std = float(stats["mean"]), float(stats["std"])
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError("normalize", f"{path} must be {{\"mean\": float, \"std\": float}}: {err}") from err
    if not std > 0:
        raise ConfigError("normalize", f"{path}: std must be > 0, got {std}")
    return mean, std


def _model_max_length(model, tokenizer) -> int:
    """The longest input the model accepts: position embeddings, capped by the tokenizer's own limit."""
    limits = [getattr(model.config.get_text_config(), "max_position_embeddings", None)]
    limits.append(getattr(tokenizer, "model_max_length", None))
    limits = [int(n) for n in limits if isinstance(n, int) and 0 < n < 1_000_000]
    return min(limits) if limits else 1_000_000


class ScoringEngine:
    """Load a reward-model directory and score texts or conversations.

    Args:
        model_dir: an rmkit export or any HF sequence-classification directory (GGUF included).
        device, dtype: where and in which precision the model runs.
        max_batch_tokens: padded tokens (`rows x longest`) per forward pass.
        max_batch_size: rows per forward pass.
        batch_window_ms: how long the first waiting async request waits for others to join its group.
        max_length: longest input in tokens (default: the model's maximum).
        overlong: "truncate" (as the data library does offline: keep the leading special tokens and the
            end, where the reward is read) or "refuse" (InputError).
        normalize: divide `(reward - mean)` by `std` from `reward_stats.json` (scalar rewards only).
        attribute_weights: K weights turning a regression model's `[K]` vector into one scalar reward.
    """

    def __init__(
        self,
        model_dir: str | Path,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        max_batch_tokens: int = 16384,
        max_batch_size: int = 256,
        batch_window_ms: float = 5.0,
        max_length: int | None = None,
        overlong: str = "truncate",
        normalize: bool = False,
        attribute_weights: Sequence[float] | None = None,
    ):
        if overlong not in OVERLONG_CHOICES:
            raise ConfigError("overlong", f"must be one of {OVERLONG_CHOICES}, got {overlong!r}")
        for key, value in (("max_batch_tokens", max_batch_tokens), ("max_batch_size", max_batch_size)):
            if value < 1:
                raise ConfigError(key, f"must be >= 1, got {value}")
        self.model_dir = Path(model_dir)
        self.model_name = self.model_dir.name or str(model_dir)
        self.model, self.tokenizer = load_reward_model(model_dir, dtype=dtype)
        self.model.to(device).eval()
        self.num_labels = int(self.model.config.num_labels)
        self.labels = [self.model.config.id2label.get(i, f"LABEL_{i}") for i in range(self.num_labels)]
        self.max_length = max_length or _model_max_length(self.model, self.tokenizer)
        if self.max_length < 2:
            raise ConfigError("max_length", f"must be >= 2, got {self.max_length}")
        self.max_batch_tokens, self.max_batch_size = max_batch_tokens, max_batch_size
        self.batch_window_s = batch_window_ms / 1000.0
        self.overlong = overlong
        self.weights = self._check_weights(attribute_weights)
        self.stats = _read_stats(self.model_dir) if normalize else None
        if normalize and self.num_labels > 1 and self.weights is None:
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

    def _check_length(self, ids: list[int], index: int) -> bool:
        """True when `ids` must be cut; InputError when it is empty or over-long under "refuse"."""
        if not ids:
            raise InputError(f"input {index} has no tokens")
        if len(ids) > self.max_length and self.overlong == "refuse":
            raise InputError(f"input {index} has {len(ids)} tokens, over the maximum of {self.max_length}")
        return len(ids) > self.max_length

    def encode_texts(self, texts: Sequence[str]) -> tuple[list[list[int]], int]:
        """Token ids of each text and how many were truncated; raises InputError on a bad one.

        Truncation is the data library's for a whole text: the leading special tokens and the last
        tokens (where the reward is read), `max_length` in all, as `rmkit score` does offline."""
        if not texts:
            raise InputError("no inputs to score")
        for i, text in enumerate(texts):
            if not text:
                raise InputError(f"input {i} is an empty string")
        out, truncated = [], 0
        # encode_examples(text, None) is encode_text, batched through the fast tokenizer.
        for i, ids in enumerate(encode_examples(self.tokenizer, [(text, None) for text in texts])):
            if self._check_length(ids, i):
                ids, truncated = keep_end(self.tokenizer, ids, self.max_length), truncated + 1
            out.append(ids)
        return out, truncated

    def encode_conversations(self, conversations: Sequence[list[dict]]) -> tuple[list[list[int]], int]:
        """Token ids of each conversation (the model's chat template) and how many were truncated.

        An over-long conversation ending with an assistant turn is cut as the data library cuts a
        (prompt, response) example: oldest whole turns first, then prompt tokens, keeping the response's
        end; any other is cut like a text."""
        if not conversations:
            raise InputError("no inputs to score")
        for i, messages in enumerate(conversations):
            _check_messages(messages, i)
        out, truncated = [], 0
        encoded = encode_examples(self.tokenizer, [(messages, None) for messages in conversations])
        for i, (messages, ids) in enumerate(zip(conversations, encoded)):
            if self._check_length(ids, i):
                truncated += 1
                if len(messages) > 1 and messages[-1]["role"] == "assistant":
                    (ids,), _ = fit_example(self.tokenizer, messages[:-1], [messages[-1:]], self.max_length)
                else:
                    ids = keep_end(self.tokenizer, ids, self.max_length)
            out.append(ids)
        return out, truncated

    # ---- scoring -----------------------------------------------------------------------------------

    def score_ids(self, sequences: list[list[int]], requests: int = 1) -> torch.Tensor:
        """Raw rewards `[N, K]` float32 for N token sequences, in order (the offline `score_sequences`)."""
        with self._lock:
            rewards = score_sequences(
                self.model, sequences, self.tokenizer.pad_token_id, self.max_batch_tokens, self.max_batch_size
            )
        if self.on_batch is not None:
            self.on_batch(requests, len(sequences), sum(len(s) for s in sequences))
        return rewards

    def score_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """Raw rewards `[N, K]` for N texts."""
        return self.score_ids(self.encode_texts(texts)[0])

    def score_conversations(self, conversations: Sequence[list[dict]]) -> torch.Tensor:
        """Raw rewards `[N, K]` for N conversations (lists of `{"role", "content"}` messages)."""
        return self.score_ids(self.encode_conversations(conversations)[0])

    def scalar_rewards(self, rewards: torch.Tensor) -> torch.Tensor | None:
        """One reward per row `[N]` from raw `[N, K]`: the column when K = 1, else the weighted sum with
        `attribute_weights` (None without weights); normalized by `reward_stats.json` when asked."""
        if self.num_labels == 1:
            scalar = rewards[:, 0]
        elif self.weights is not None:
            scalar = rewards @ self.weights
        else:
            return None
        if self.stats is not None:
            mean, std = self.stats
            scalar = (scalar - mean) / std
        return scalar

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


def _check_messages(messages, index: int) -> None:
    if not isinstance(messages, list) or not messages:
        raise InputError(f"conversation {index} must be a non-empty list of messages")
    for j, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise InputError(f"conversation {index} message {j} needs a string 'content'")
        if message.get("role") not in ROLES:
            raise InputError(f"conversation {index} message {j}: role must be one of {ROLES}")
