"""`RewardModelEnvironment`: a reward model as an RL environment, with NeMo RL's environment contract.

    env = RewardModelEnvironment({"model_name": "results/rm/final"})            # in-process engine
    env = RewardModelEnvironment({"url": "http://127.0.0.1:8000", "api_key": k}) # a running rmkit serve
    out = env.step(message_logs, env_infos)   # out.rewards: float32 [B], one per conversation
    batch, metrics = env.global_post_process_and_metrics({"rewards": out.rewards})

Both backends tokenize the conversations with the reward model's chat template and read the reward the
same way, so they return the same rewards (a test checks it). In process it is a plain object; as NeMo RL
runs its environments, a Ray actor (the `ray` extra):

    env = RewardModelEnvironment.remote(config)            # or .options(num_gpus=1).remote(config)
    out = ray.get(env.step.remote(message_logs, env_infos))

A process reward model (its contract names a step separator) gives a conversation the aggregate of its steps
(`conversation_solution` says how a conversation becomes a prompt and steps; the contract's `step_aggregation`
makes one reward of them; `/v1/score_steps` on a server). A response with no step (nothing but separators and
blanks) gets 0.0, the lowest probability-valued reward: it solves nothing. A response longer than the model's max
length gets the aggregate of the steps that fit (its beginning, as `rmkit score` scores it), counted in
`reward_model_env/solutions_cut` and said once on stderr; one with no step within the max length gets NaN, which
an RL loop refuses naming the prompt (`rmkit.rl.rollout.score_rollout`).
"""

from __future__ import annotations

import functools
import math
import sys
from typing import Any, NamedTuple

import torch

from rmkit.data.validate import check_messages
from rmkit.errors import ConfigError
from rmkit.inference import DTYPES, aggregate_steps, check_reward_model_dir

# NeMo RL config keys accepted for compatibility and ignored here (resources are the trainer's business).
IGNORED_KEYS = {"enabled", "tokenizer", "resources", "reward_model_cfg", "dtensor_cfg", "precision"}
ENGINE_KEYS = {"device", "dtype", "max_batch_tokens", "max_batch_size", "max_length", "overlong",
               "normalize", "attribute_weights"}
CLIENT_KEYS = {"api_key", "timeout", "max_retries", "retry_deadline", "batch_size", "concurrency"}


class EnvironmentReturn(NamedTuple):
    """What `step` returns (NeMo RL's field names and order)."""

    observations: list[dict[str, str]]
    metadata: list[Any]
    next_stop_strings: list[list[str] | None]
    rewards: torch.Tensor  # [B] float32
    terminateds: torch.Tensor  # [B] bool, always True: one scoring turn ends the episode
    answers: list[str | None] | None


def conversation_solution(messages: list[dict], separator: str) -> tuple[str, list[str]]:
    """`(prompt, steps)` of a finished conversation for a process reward model, which is trained on a problem as plain
    text and its solution in steps (no chat template): the prompt is the text of the user messages before the
    last message, joined by newlines (system messages and earlier assistant turns are left out); the steps are the
    last message, the assistant's response, split on `separator`, the blank pieces dropped (every other piece kept
    as written). ValueError when the conversation does not end with an assistant message or has no user text."""
    checked = check_messages(messages, "conversation", lambda field, message: ValueError(f"{field}: {message}"))
    if checked[-1]["role"] != "assistant":
        raise ValueError(f"a process reward model scores the steps of the last assistant message, but the "
                         f"conversation ends with a {checked[-1]['role']} message")
    prompt = "\n".join(m["content"] for m in checked[:-1] if m["role"] == "user")
    if not prompt.strip():
        raise ValueError("a process reward model scores a solution to a problem, but the conversation has no user text")
    return prompt, [piece for piece in checked[-1]["content"].split(separator) if piece.strip()]


class _RewardModelEnvironment:
    """Scores each finished conversation of a batch with a reward model (`RewardModelEnvironment`, in process or
    as a Ray actor).

    Config keys: exactly one of `model_name` (a model directory, scored in process) or `url` (a
    running `rmkit serve`); for the engine `device`, `dtype` (or NeMo's `precision`), `max_batch_tokens`,
    `max_batch_size`, `max_length`, `overlong`, `normalize`, `attribute_weights`; for the client
    `api_key`, `timeout`, `max_retries`, `retry_deadline` (seconds a failing server is retried), `batch_size`,
    `concurrency`. NeMo RL's `enabled`, `tokenizer`,
    `resources`, `reward_model_cfg` are accepted and ignored; any other key is a ConfigError.
    """

    def __init__(self, config: dict[str, Any]):
        unknown = set(config) - IGNORED_KEYS - ENGINE_KEYS - CLIENT_KEYS - {"model_name", "url"}
        if unknown:
            raise ConfigError(f"env.{sorted(unknown)[0]}", "unknown key for RewardModelEnvironment")
        if ("model_name" in config) == ("url" in config):
            raise ConfigError("env.model_name", "set exactly one of 'model_name' (in process) or 'url' (server)")
        self.config = dict(config)
        self.engine, self.client = None, None
        if "url" in config:
            from rmkit.serve.client import RewardClient

            self.client = RewardClient(config["url"], **{k: config[k] for k in CLIENT_KEYS if k in config})
        else:
            from rmkit.serve.engine import ScoringEngine

            check_reward_model_dir(config["model_name"], "env.model_name")
            kwargs = {k: config[k] for k in ENGINE_KEYS if k in config}
            dtype = kwargs.pop("dtype", config.get("precision", "float32"))
            if dtype not in DTYPES:
                raise ConfigError("env.dtype", f"must be one of {sorted(DTYPES)}, got {dtype!r}")
            self.engine = ScoringEngine(config["model_name"], dtype=dtype, **kwargs)
            if self.engine.is_process and self.engine.normalize:
                raise ConfigError("env.normalize", "a process reward model's reward is an aggregate of step "
                                                   "probabilities, not normalized: leave normalize off")
            if self.engine.scalar_rewards(torch.zeros(1, self.engine.num_labels)) is None:
                raise ConfigError("env.attribute_weights", "a regression model needs weights for one reward")
        self.solutions_cut, self.empty_responses, self._told_cut = 0, 0, False

    @functools.cached_property
    def step_contract(self) -> tuple[str, str] | None:
        """`(step_separator, step_aggregation)` of a process reward model (in process, or asked of the server's
        `/health` once), None for a model that scores whole conversations (and for a server without rmkit's
        `/health`: only rmkit serves `/v1/score_steps`)."""
        if self.engine is not None:
            contract = self.engine.scorer.contract
            separator, aggregation = contract.step_separator, contract.step_aggregation
        else:
            from rmkit.serve.client import RewardServerError

            try:
                info = self.client.server_info()
            except RewardServerError as err:
                if err.status is None:  # the server never answered
                    raise
                info = {}  # no rmkit /health (a peer or a proxy serving /v1/score): a model of whole conversations
            separator, aggregation = info.get("step_separator"), info.get("step_aggregation")
        return None if separator is None else (separator, aggregation)

    def score(self, conversations: list[list[dict[str, str]]]) -> torch.Tensor:
        """Rewards `[B]` float32 for B conversations of `{"role", "content"}` messages (a process reward model's:
        `score_steps`)."""
        if self.step_contract is not None:
            return self.score_steps(conversations)
        if self.client is not None:
            return torch.tensor(self.client.score_conversations(conversations, scalar=True), dtype=torch.float32)
        raw = self.engine.score_conversations(conversations)
        return self.engine.scalar_rewards(raw).float()

    def score_steps(self, conversations: list[list[dict[str, str]]]) -> torch.Tensor:
        """A process reward model's rewards `[B]` float32: each conversation's steps (`conversation_solution`)
        scored and aggregated, the empty and the over-long responses as the module docstring says."""
        separator, aggregation = self.step_contract
        solutions = [conversation_solution(messages, separator) for messages in conversations]
        scored = [i for i, (_, steps) in enumerate(solutions) if steps]
        rewards = torch.zeros(len(solutions), dtype=torch.float32)
        if scored:
            if self.client is not None:
                step_rewards = [r["step_rewards"] for r in self.client.score_steps([solutions[i] for i in scored])]
            else:
                results, _ = self.engine.score_steps([solutions[i] for i in scored])
                step_rewards = [r.step_rewards for r in results]
            for i, probabilities in zip(scored, step_rewards):
                kept = [p for p in probabilities if p is not None]
                rewards[i] = aggregate_steps(kept, aggregation) if kept else math.nan
                self.solutions_cut += len(kept) < len(probabilities)
        self.empty_responses += len(solutions) - len(scored)
        if self.solutions_cut and not self._told_cut:
            self._told_cut = True
            print("rmkit: a response is longer than the process reward model's max length: its reward aggregates "
                  "the steps that fit (reward_model_env/solutions_cut counts such responses)", file=sys.stderr, flush=True)
        return rewards

    def step(self, message_logs: list[list[dict]], env_infos: list[dict | None]) -> EnvironmentReturn:
        """Score B finished conversations. `message_logs[b]` is a list of messages (extra keys such as
        NeMo RL's `token_ids` are ignored); `env_infos[b]` is passed through as metadata."""
        conversations = [[{"role": m["role"], "content": m["content"]} for m in log] for log in message_logs]
        rewards = self.score(conversations)
        observations = [{"role": "environment", "content": f"Environment: reward {r:.6g}"} for r in rewards.tolist()]
        return EnvironmentReturn(
            observations=observations,
            metadata=list(env_infos) if env_infos is not None else [None] * len(rewards),
            next_stop_strings=[None] * len(rewards),
            rewards=rewards,
            terminateds=torch.ones(len(rewards), dtype=torch.bool),
            answers=None,
        )

    def global_post_process_and_metrics(self, batch: dict) -> tuple[dict, dict[str, float]]:
        """`batch` unchanged and `reward_model_env/{num_samples, mean_reward, std_reward (unbiased),
        min_reward, max_reward}` over `batch["rewards"]` `[B]`; for a process reward model also
        `reward_model_env/{solutions_cut, empty_responses}`, counted since the last call."""
        rewards = torch.as_tensor(batch["rewards"], dtype=torch.float32).flatten()
        n = rewards.numel()
        metrics = {
            "reward_model_env/num_samples": float(n),
            "reward_model_env/mean_reward": rewards.mean().item() if n else 0.0,
            "reward_model_env/std_reward": rewards.std().item() if n > 1 else 0.0,
            "reward_model_env/min_reward": rewards.min().item() if n else 0.0,
            "reward_model_env/max_reward": rewards.max().item() if n else 0.0,
        }
        if self.step_contract is not None:
            metrics["reward_model_env/solutions_cut"] = float(self.solutions_cut)
            metrics["reward_model_env/empty_responses"] = float(self.empty_responses)
            self.solutions_cut = self.empty_responses = 0
        return batch, metrics

    def shutdown(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.engine is not None:
            self.engine.close()


class RewardModelEnvironment(_RewardModelEnvironment):
    """A reward model as an RL environment (the module docstring; its config keys: `_RewardModelEnvironment`).
    `RewardModelEnvironment(config)` runs in this process; `RewardModelEnvironment.remote(config)` (or
    `.options(...)`, Ray's actor options, then `.remote(config)`) starts it as a Ray actor, NeMo RL's way, whose
    methods are called with `.remote(...)` and their results read with `ray.get`."""

    @classmethod
    def remote(cls, config: dict[str, Any]):
        """A Ray actor handle of the environment of `config` (in a Ray worker process)."""
        return ray_actor_class().remote(config)

    @classmethod
    def options(cls, **options):
        """Ray's actor class with `options` (`num_gpus`, `num_cpus`, `runtime_env`, ...): call `.remote(config)` on it."""
        return ray_actor_class().options(**options)


@functools.cache
def ray_actor_class():
    """The environment as a Ray actor class (made from `_RewardModelEnvironment`: Ray would overwrite the public
    class's own `remote`); an ImportError saying how to install Ray when it is not."""
    try:
        import ray
    except ImportError:
        raise ImportError("RewardModelEnvironment.remote needs Ray: pip install 'rmkit[ray]'") from None
    return ray.remote(_RewardModelEnvironment)


def environment_for(rm) -> RewardModelEnvironment:
    """The environment an RL recipe's `env.reward_model` section describes: in process (`model_name`, a reward-model
    directory) or a running `rmkit serve` (`url`). Its keys: `model_name`, `url`, `api_key`, `batch_size`,
    `precision`, `normalize`, `max_retries`, `retry_deadline`, `timeout`."""
    if rm.url is not None:
        return RewardModelEnvironment({"url": rm.url, "api_key": rm.api_key, "batch_size": rm.batch_size,
                                       "max_retries": rm.max_retries, "retry_deadline": rm.retry_deadline,
                                       "timeout": rm.timeout})
    return RewardModelEnvironment({"model_name": check_environment(rm), "dtype": rm.precision,
                                   "max_batch_size": rm.batch_size, "normalize": rm.normalize})


def check_environment(rm) -> str | None:
    """The mistakes of an `env.reward_model` section found before any model loads (a recipe calls it before it
    loads its policy): no model at all, a path that does not exist, a folder that is not a model, a causal LM.
    Returns the reward-model directory, or None for a server (`url`)."""
    if rm.url is not None:
        return None
    if rm.model_name is None:
        raise ConfigError("env.reward_model.model_name", "set model_name (a reward-model directory, e.g. the "
                          "final/ of rmkit train) or url (a running rmkit serve)")
    return check_reward_model_dir(rm.model_name, "env.reward_model.model_name")
