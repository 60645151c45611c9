"""`RewardClient`: score texts or conversations (or, on a process reward model, solutions step by step) on a
remote `rmkit serve`, for trainers that run the reward model elsewhere. Splits inputs into requests of `batch_size`, sends up to `concurrency` at once,
retries connection errors, timeouts and 5xx answers with exponential backoff until `retry_deadline` seconds
have passed (a server restart rides through), and raises on 4xx at once. An answer is checked before it is
returned: one number (or one `[K]` list) per input, else `RewardServerError`; a reward is never made up."""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx


class RewardServerError(RuntimeError):
    """The server refused a request (4xx) or kept failing (5xx / unreachable) after every retry."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class RewardClient:
    """Client of `POST /v1/score` (and `POST /v1/score_steps` for a process reward model).

    Args:
        url: server base URL, e.g. "http://127.0.0.1:8000".
        api_key: sent as `Authorization: Bearer KEY`.
        timeout: seconds per HTTP request.
        max_retries: at most this many extra attempts after a connection error, a timeout or a 5xx answer
            (None: as many as `retry_deadline` allows).
        batch_size: inputs per request (keep it under the server's `--max-inputs`).
        concurrency: requests in flight at once.
        backoff: first retry delay in seconds, doubled on every further retry up to `max_backoff`.
        retry_deadline: seconds after a request's first failure past which it is not retried.
        max_backoff: the longest wait between two attempts.
    """

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 60.0, max_retries: int | None = None,
                 batch_size: int = 64, concurrency: int = 4, backoff: float = 0.25, retry_deadline: float = 120.0,
                 max_backoff: float = 10.0):
        if batch_size < 1 or concurrency < 1 or (max_retries is not None and max_retries < 0) or retry_deadline < 0:
            raise ValueError("batch_size and concurrency must be >= 1, max_retries and retry_deadline >= 0")
        self.url = url.rstrip("/")
        self.max_retries, self.batch_size, self.concurrency, self.backoff = max_retries, batch_size, concurrency, backoff
        self.retry_deadline, self.max_backoff = retry_deadline, max_backoff
        self._outage_since: float | None = None  # when the server stopped answering (for the notices)
        self._lock = threading.Lock()
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

    def score_steps(self, solutions: Sequence[tuple[str, Sequence[str]]]) -> list[dict]:
        """`{"step_rewards", "reward"}` per `(prompt, steps)` solution, in order, from a process reward model's
        server (`POST /v1/score_steps`): each step's probability of being correct (None past the max length) and
        their aggregate (None when a step is cut)."""
        items = [{"prompt": prompt, "steps": list(steps)} for prompt, steps in solutions]
        out = []
        for body, n in zip(self._send_chunks("/v1/score_steps", "solutions", items), self._chunk_sizes(len(items))):
            results = body.get("results") if isinstance(body, dict) else None
            if not isinstance(results, list) or len(results) != n or not all(
                    isinstance(r, dict) and "step_rewards" in r and "reward" in r for r in results):
                raise RewardServerError(f"{self.url}/v1/score_steps answered {_snippet(body)} for {n} solutions "
                                        "(malformed answer; expected 'results', one {'step_rewards', 'reward'} each)")
            out.extend(results)
        return out

    def health(self) -> dict:
        return self._http.get("/health").raise_for_status().json()

    def server_info(self) -> dict:
        """`GET /health` of an rmkit server (the served model, its max length and step separator), retried while the
        server does not answer; an HTTP error answer (a peer server or proxy that has no /health) raises
        `RewardServerError` with its status at once."""
        return self._send("GET", "/health", retry_answers=False)

    def _chunk_sizes(self, n: int) -> list[int]:
        """The number of inputs in each request `_send_chunks` sends for `n` inputs."""
        return [min(self.batch_size, n - i) for i in range(0, n, self.batch_size)]

    def _send_chunks(self, path: str, field: str, items: list) -> list:
        """The answers to `items` posted under `field` in requests of `batch_size`, `concurrency` at once, in order."""
        chunks = [items[i : i + self.batch_size] for i in range(0, len(items), self.batch_size)]
        if len(chunks) <= 1 or self.concurrency == 1:
            return [self._send("POST", path, {field: chunk}) for chunk in chunks]
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(lambda chunk: self._send("POST", path, {field: chunk}), chunks))

    def _score(self, field: str, items: list, scalar: bool) -> list:
        results = self._send_chunks("/v1/score", field, items)
        key = "scores" if scalar and results and isinstance(results[0], dict) and "scores" in results[0] else "rewards"
        rewards = [reward for body, n in zip(results, self._chunk_sizes(len(items))) for reward in self._checked(body, key, n)]
        if scalar and rewards and isinstance(rewards[0], list):
            raise RewardServerError(f"{self.url} serves a {len(rewards[0])}-attribute model without "
                                    "--attribute-weights, so it has no scalar reward")
        return rewards

    def _checked(self, body, key: str, n: int) -> list:
        """`body[key]` if it holds one reward per input (a number, or a list of numbers); NaN passes (the caller
        names the input it belongs to), anything else is a malformed answer."""
        values = body.get(key) if isinstance(body, dict) else None
        if not isinstance(values, list) or len(values) != n:
            got = f"{len(values)} {key}" if isinstance(values, list) else f"{_snippet(body)}"
            raise RewardServerError(f"{self.url}/v1/score answered {got} for {n} inputs (malformed answer; "
                                    f"expected a list of {n} {key!r})")
        for value in values:
            if not (_is_number(value) or (isinstance(value, list) and value and all(map(_is_number, value)))):
                raise RewardServerError(f"{self.url}/v1/score answered {_snippet(value)} as a reward "
                                        "(malformed answer; expected a number or a list of numbers)")
        return values

    def _send(self, method: str, path: str, payload: dict | None = None, retry_answers: bool = True) -> dict:
        """One request, retried on connection errors, timeouts and (`retry_answers`) 5xx per `retry_delays` (and
        never past `retry_deadline` seconds of wall clock from the first attempt)."""
        start, attempts, last = time.monotonic(), 0, "no attempt made"
        waits = retry_delays(self.backoff, self.max_backoff, self.retry_deadline, self.max_retries)
        for wait in itertools.chain([0.0], waits):
            if attempts:
                remaining = self.retry_deadline - (time.monotonic() - start)
                if remaining <= 0:
                    break
                time.sleep(min(wait, remaining))
            attempts += 1
            try:
                response = self._http.request(method, path, json=payload)
            except httpx.TransportError as err:  # refused, reset, timed out: worth another try
                last = f"{type(err).__name__}: {err}"
                self._outage(last)
                continue
            if response.status_code < 400:
                self._recovered()
                try:
                    return response.json()
                except ValueError:
                    raise RewardServerError(f"{self.url}{path} answered {response.status_code} with a body "
                                            f"that is not JSON: {response.text[:200]!r} (malformed answer)") from None
            message = _error_message(response)
            if response.status_code < 500 or not retry_answers:
                raise RewardServerError(f"{self.url}{path}: {response.status_code} {message}",
                                        response.status_code)
            last = f"{response.status_code} {message}"
            self._outage(last)
        raise RewardServerError(f"{self.url}{path} failed after {attempts} attempts: {last} (retried for "
                                f"{time.monotonic() - start:.1f} s; retry deadline {self.retry_deadline:g} s)")

    def _outage(self, cause: str) -> None:
        """Say once per outage that the server stopped answering and that the client waits for it."""
        with self._lock:
            if self._outage_since is None:
                self._outage_since = time.monotonic()
                print(f"rmkit: reward server {self.url} did not answer ({cause}); retrying with backoff for up to "
                      f"{self.retry_deadline:g} s", file=sys.stderr, flush=True)

    def _recovered(self) -> None:
        with self._lock:
            if self._outage_since is not None:
                print(f"rmkit: reward server {self.url} answers again after "
                      f"{time.monotonic() - self._outage_since:.1f} s", file=sys.stderr, flush=True)
                self._outage_since = None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def retry_delays(backoff: float, max_backoff: float, deadline: float, max_retries: int | None = None) -> Iterator[float]:
    """The waits before each retry: `backoff`, doubled each time up to `max_backoff`, while their sum stays within
    `deadline` (the last one cut to end at it), at most `max_retries` of them (None: no count limit). With the
    defaults (0.25 s, 10 s, 120 s) the last attempt comes 120 s after the first: a restart of a minute rides through."""
    total, delay, count = 0.0, backoff, 0
    while total < deadline and (max_retries is None or count < max_retries):
        wait = min(delay, max_backoff, deadline - total)
        yield wait
        total, delay, count = total + wait, delay * 2, count + 1


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)  # NaN and inf too: the caller names them


def _snippet(value, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _error_message(response: httpx.Response) -> str:
    try:
        return str(response.json().get("message", response.text))
    except ValueError:
        return response.text
