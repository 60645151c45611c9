"""Server metrics in the Prometheus text exposition format (version 0.0.4), without a client library.

Exposed series:
    rmkit_requests_total{route, status}        counter
    rmkit_request_latency_seconds{route}       histogram (whole request, parsing to response)
    rmkit_batch_sequences                      histogram (sequences per model group)
    rmkit_batch_requests                       histogram (requests merged into one model group)
    rmkit_scored_sequences_total, rmkit_scored_tokens_total   counters
    rmkit_queue_depth                          gauge (requests waiting for the model)
    rmkit_requests_in_flight                   gauge
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Histogram:
    """Cumulative-bucket histogram with `_bucket`, `_sum` and `_count` series."""

    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        sep = "," if labels else ""
        out = [f'{name}_bucket{{{labels}{sep}le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        braces = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{braces} {self.total}", f"{name}_count{braces} {self.count}"]
        return out


class ServerMetrics:
    """Thread-safe counters the server updates; `render()` is the `/metrics` body."""

    def __init__(self, queue_depth: Callable[[], int] = lambda: 0):
        self._lock = threading.Lock()
        self.queue_depth = queue_depth
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.latency: dict[str, Histogram] = {}
        self.batch_sequences = Histogram(SIZE_BUCKETS)
        self.batch_requests = Histogram(SIZE_BUCKETS)
        self.sequences = 0
        self.tokens = 0
        self.in_flight = 0

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[(route, status)] += 1
            self.latency.setdefault(route, Histogram(LATENCY_BUCKETS)).observe(seconds)

    def observe_batch(self, requests: int, sequences: int, tokens: int) -> None:
        with self._lock:
            self.batch_requests.observe(requests)
            self.batch_sequences.observe(sequences)
            self.sequences += sequences
            self.tokens += tokens

    def render(self) -> str:
        with self._lock:
            lines = ["# HELP rmkit_requests_total HTTP requests by route and status.",
                     "# TYPE rmkit_requests_total counter"]
            for (route, status), n in sorted(self.requests.items()):
                lines.append(f'rmkit_requests_total{{route="{route}",status="{status}"}} {n}')
            lines += ["# HELP rmkit_request_latency_seconds Request latency by route.",
                      "# TYPE rmkit_request_latency_seconds histogram"]
            for route, hist in sorted(self.latency.items()):
                lines += hist.lines("rmkit_request_latency_seconds", f'route="{route}"')
            for name, hist, help_ in (
                ("rmkit_batch_sequences", self.batch_sequences, "Sequences per model group."),
                ("rmkit_batch_requests", self.batch_requests, "Requests merged into one model group."),
            ):
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} histogram", *hist.lines(name)]
            for name, kind, value, help_ in (
                ("rmkit_scored_sequences_total", "counter", self.sequences, "Sequences scored."),
                ("rmkit_scored_tokens_total", "counter", self.tokens, "Tokens scored (unpadded)."),
                ("rmkit_queue_depth", "gauge", self.queue_depth(), "Requests waiting for the model."),
                ("rmkit_requests_in_flight", "gauge", self.in_flight, "Requests being handled."),
            ):
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {value}"]
        return "\n".join(lines) + "\n"
