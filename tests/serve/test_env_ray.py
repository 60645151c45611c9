"""`RewardModelEnvironment.remote(config)` as NeMo RL users call it: a Ray actor under a real local Ray (two CPUs;
about 20 s, most of it Ray's start-up) gives the in-process environment's rewards; without Ray, `rmkit.env` still
imports and `.remote` says what to install. Skipped without Ray, except under CI (CI=true), where it fails."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from serve_helpers import CONVERSATIONS

from rmkit import env as env_module
from rmkit.env import RewardModelEnvironment


def _ray():
    try:
        import ray
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("ray is missing under CI (pip install 'rmkit[ray]')")
        pytest.skip("ray is not installed (pip install 'rmkit[ray]')")
    return ray


def test_a_ray_actor_gives_the_in_process_rewards(bt_model_dir):
    ray = _ray()
    config = {"model_name": str(bt_model_dir), "max_batch_size": 2}
    infos = [{"i": i} for i in range(len(CONVERSATIONS))]
    local = RewardModelEnvironment(config)
    expected = local.step(CONVERSATIONS, infos)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        actor = RewardModelEnvironment.options(num_cpus=1).remote(config)
        got = ray.get(actor.step.remote(CONVERSATIONS, infos))
        torch.testing.assert_close(got.rewards, expected.rewards, atol=1e-5, rtol=0)  # float32, another process
        assert got.metadata == infos and got.terminateds.all()
        _, metrics = ray.get(actor.global_post_process_and_metrics.remote({"rewards": got.rewards}))
        assert metrics["reward_model_env/num_samples"] == len(CONVERSATIONS)
        ray.get(actor.shutdown.remote())
        second = RewardModelEnvironment.remote(config)  # the plain call, Ray's default options
        torch.testing.assert_close(ray.get(second.score.remote(CONVERSATIONS)), expected.rewards, atol=1e-5, rtol=0)
    finally:
        ray.shutdown()
        local.shutdown()


def test_without_ray_the_module_works_and_remote_says_what_to_install(bt_model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    env_module.ray_actor_class.cache_clear()
    try:
        with pytest.raises(ImportError, match=r"RewardModelEnvironment.remote needs Ray: pip install 'rmkit\[ray\]'"):
            RewardModelEnvironment.remote({"model_name": str(bt_model_dir)})
    finally:
        env_module.ray_actor_class.cache_clear()
    local = RewardModelEnvironment({"model_name": str(bt_model_dir)})
    assert local.score(CONVERSATIONS).shape == (len(CONVERSATIONS),)
    local.shutdown()
