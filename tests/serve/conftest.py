"""Tiny reward-model directories and real `rmkit serve` subprocesses on free loopback ports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from serve_helpers import API_KEY, Server, build_model_dir


@pytest.fixture(scope="session")
def bt_model_dir(tmp_path_factory) -> Path:
    """Bradley-Terry (one label) model with `reward_stats.json`."""
    path = build_model_dir(tmp_path_factory.mktemp("bt_model"), num_labels=1, seed=1)
    (path / "reward_stats.json").write_text(json.dumps({"mean": 0.5, "std": 2.0}))
    return path


@pytest.fixture(scope="session")
def reg_model_dir(tmp_path_factory) -> Path:
    """Regression model with K = 3 attributes."""
    return build_model_dir(tmp_path_factory.mktemp("reg_model"), num_labels=3, seed=2)


@pytest.fixture(scope="session")
def servers(bt_model_dir, reg_model_dir):
    """Both servers, started together (their start-up overlaps): `bt` with an API key, refusing inputs
    over 24 tokens, 16 inputs and 4 KB per request; `reg` (K = 3, weights, truncating at 8 tokens)."""
    bt = Server(bt_model_dir, "--api-key", API_KEY, "--max-length", "24", "--overlong", "refuse",
                "--max-inputs", "16", "--max-body-bytes", "4096", "--batch-window-ms", "2")
    reg = Server(reg_model_dir, "--attribute-weights", "0.5,0.3,0.2", "--max-length", "8")
    try:
        yield {"bt": bt.wait_ready(), "reg": reg.wait_ready()}
    finally:
        bt.stop()
        reg.stop()


@pytest.fixture(scope="session")
def bt_server(servers) -> Server:
    return servers["bt"]


@pytest.fixture(scope="session")
def reg_server(servers) -> Server:
    return servers["reg"]

