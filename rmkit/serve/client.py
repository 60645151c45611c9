"""`RewardClient`: score texts or conversations on a remote `rmkit serve`, for trainers that run the
reward model elsewhere. Splits inputs into requests of `batch_size`, sends up to `concurrency` at once,
retries connection errors and 5xx answers with exponential backoff, and raises on 4xx at once."""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx


class RewardServerError(RuntimeError):
    """The server refused a request (4xx) or kept failing (5xx / unreachable) after every retry."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class RewardClient:
    """Client of `POST /v1/score`.

    Args:
        url: server base URL, e.g. "http://127.0.0.1:8000".
        api_key: sent as `Authorization: Bearer KEY`.
        timeout: seconds per HTTP request.
        max_retries: extra attempts after a connection error or a 5xx answer.
        batch_size: inputs per request (keep it under the server's `--max-inputs`).
        concurrency: requests in flight at once.
        backoff: first retry delay in seconds, doubled on every further retry.
    """

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 60.0, max_retries: int = 3,
                 batch_size: int = 64, concurrency: int = 4, backoff: float = 0.25):
        if batch_size < 1 or concurrency < 1 or max_retries < 0:
            raise ValueError("batch_size and concurrency must be >= 1 and max_retries >= 0")
        self.url = url.rstrip("/")
        self.max_retries, self.batch_size, self.concurrency, self.backoff = max_retries, batch_size, concurrency, backoff
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, limits=limits)

    def score_texts(self, texts: Sequence[str], scalar: bool = False) -> list:
        """One reward per text, in order: floats, or `[K]` lists for a regression model (`scalar=True`:
        the server's weighted scalar "scores" instead, which needs `--attribute-weights` on the server)."""
        return self._score("texts", list(texts), scalar)

    def score_conversations(self, conversations: Sequence[list[dict]], scalar: bool = False) -> list:
        """One reward per conversation (a list of `{"role", "content"}` messages), in order."""
        return self._score("conversations", list(conversations), scalar)

    def health(self) -> dict:
        return self._http.get("/health").raise_for_status().json()

    def _score(self, field: str, items: list, scalar: bool) -> list:
        chunks = [items[i : i + self.batch_size] for i in range(0, len(items), self.batch_size)]
        if len(chunks) <= 1 or self.concurrency == 1:
            results = [self._post({field: chunk}) for chunk in chunks]
        else:
            with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
                results = list(pool.map(lambda chunk: self._post({field: chunk}), chunks))
        key = "scores" if scalar and results and "scores" in results[0] else "rewards"
        rewards = [reward for body in results for reward in body[key]]
        if scalar and rewards and isinstance(rewards[0], list):
            raise RewardServerError(f"{self.url} serves a {len(rewards[0])}-attribute model without "
                                    "--attribute-weights, so it has no scalar reward")
        return rewards

    def _post(self, payload: dict) -> dict:
        delay, last = self.backoff, "no attempt made"
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(delay)
                delay *= 2
            try:
                response = self._http.post("/v1/score", json=payload)
            except httpx.TransportError as err:  # refused, reset, timed out: worth another try
                last = f"{type(err).__name__}: {err}"
                continue
            if response.status_code < 400:
                return response.json()
            message = _error_message(response)
            if response.status_code < 500:
                raise RewardServerError(f"{self.url}/v1/score: {response.status_code} {message}",
                                        response.status_code)
            last = f"{response.status_code} {message}"
        raise RewardServerError(f"{self.url}/v1/score failed after {self.max_retries + 1} attempts: {last}")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _error_message(response: httpx.Response) -> str:
    try:
        return str(response.json().get("message", response.text))
    except ValueError:
        return response.text
