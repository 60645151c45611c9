"""Serving a reward model to RL trainers: `ScoringEngine` (in process, dynamic batching), the HTTP
server (`rmkit serve`) and `RewardClient` (remote). The client needs httpx (the `serve` extra), so it is
imported on first use."""

from rmkit.serve.engine import InputError, ScoringEngine

__all__ = ["InputError", "RewardClient", "RewardServerError", "ScoringEngine"]


def __getattr__(name: str):
    if name in ("RewardClient", "RewardServerError"):
        from rmkit.serve import client

        return getattr(client, name)
    raise AttributeError(f"module 'rmkit.serve' has no attribute {name!r}")
