"""The inference core: the one way a reward-model directory and an input become a reward.

Every scoring path goes through here: validation during training, `rmkit eval`, `rmkit score`,
`rmkit serve`, `RewardModelEnvironment` (in process, and remotely through the server), `rmkit parity` and
the benchmarks. It owns
- the scoring contract (`ScoringContract`): max length, truncation rule, chat template, special tokens,
  padding side, where the reward is read, reward mean/std. The export writes it into the model directory
  as `scoring_contract.json` and every path reads it, so they agree with no flags;
- loading a model directory with its contract (`load_scorer`);
- encoding: an input is a text or a conversation (`data.tokenize.canonical_input` turns a prompt and a
  response into one), cut on its own by the one truncation rule (`data.tokenize.fit_inputs`), so a text's
  reward never depends on what it is paired or batched with;
- token-budgeted batching and reading the head (`models.scoring.score_sequences`);
- turning raw `[N, K]` head outputs into one scalar per input (attribute weights, normalization);
- a process reward model's steps (`RewardScorer.score_steps`): a solution laid out as its training laid it out
  (`data.step_tokenize`), the head read at every step's separator, each step's probability of being correct
  and their aggregate, the contract's `step_aggregation`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
import yaml

from rmkit.data.records import Message
from rmkit.data.step_tokenize import solution_ids
from rmkit.data.tokenize import TokenizedPairs, fit_inputs, tokenize_pairs
from rmkit.distributed import all_reduce, is_distributed
from rmkit.errors import ConfigError
from rmkit.models.reward import config_architectures, load_reward_model, uses_last_token_pooling
from rmkit.models.scoring import default_batch_tokens, length_sorted_batches, score_positions, score_sequences
from rmkit.models.setup import autocast, check_length, loading_errors, model_source

CONTRACT_FILE = "scoring_contract.json"
CONTRACT_VERSION = 1
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
UNBOUNDED = 1_000_000  # a position limit above this is a tokenizer's "no limit" placeholder


@dataclass(frozen=True)
class ScoringContract:
    """How inputs become rewards for one model directory (`scoring_contract.json`)."""

    max_length: int
    """Tokens per input; a longer input is cut by `truncation`."""
    truncation: str = "oldest_turns_then_keep_end"
    """A conversation loses whole oldest turns (system messages stay); then any input keeps its leading
    special tokens and its last tokens, `max_length` in all. Each input is cut on its own."""
    chat_template: str = "tokenizer"
    """`tokenizer`: messages go through the chat template saved with the tokenizer; `plain`: the tokenizer
    has none and rmkit renders "User: ...\\nAssistant: ..."."""
    chat_template_sha256: str | None = None
    """SHA-256 of the chat template text (None for `plain`); a tokenizer whose template differs is refused."""
    special_tokens: str = "tokenizer_once"
    """The tokenizer's special tokens are added ([CLS] .. [SEP], BOS ..) unless the rendered text already
    starts with them: BOS appears once."""
    padding_side: str = "right"
    """Batches pad on the right; padding never changes a reward."""
    reward_position: str = "last_real_token"
    """`last_real_token` (decoders: the last position the attention mask marks real) or `first_token`
    (encoders: the [CLS] pooler)."""
    num_labels: int = 1
    """Head outputs K per input."""
    reward_mean: float | None = None
    """Mean of the validation rewards at export (`--normalize` serves `(r - mean) / std`)."""
    reward_std: float | None = None
    """Their unbiased standard deviation."""
    version: int = CONTRACT_VERSION
    """Format version of this file."""
    step_separator: str | None = None
    """A process reward model's (None for any other): the text after every step of a solution; the step's score is
    the head at the separator's last token."""
    step_label: str | None = None
    """What a step's score means (a process reward model: the sigmoid of the head is the probability that the step
    is correct)."""
    step_aggregation: str | None = None
    """How a solution's step probabilities make one reward: `min`, `prod` or `last`."""


STEP_FIELDS = ("step_separator", "step_label", "step_aggregation")  # written only when set
STEP_AGGREGATIONS = ("min", "prod", "last")


def aggregate_steps(probabilities: Sequence[float], how: str) -> float:
    """One reward from a solution's step probabilities: their minimum (`min`: a solution is as good as its worst
    step), product (`prod`: the probability every step is correct, steps taken as independent) or the last
    step's (`last`)."""
    if how == "min":
        return min(probabilities)
    if how == "prod":
        return math.prod(probabilities)
    if how == "last":
        return probabilities[-1]
    raise ConfigError("step_aggregation", f"must be one of {', '.join(STEP_AGGREGATIONS)}, got {how!r}")


@dataclass(frozen=True)
class StepRewards:
    """A solution's scores from a process reward model: `step_rewards`, each step's probability of being correct
    (None for a step whose separator falls past the contract's max length: the solution keeps its beginning), and
    `reward`, their aggregate (None when a step is unscored: an aggregate of part of the steps is not the
    solution's)."""

    step_rewards: list[float | None]
    reward: float | None

    @property
    def cut(self) -> bool:
        return self.reward is None


CAUSAL_LM_ARCHITECTURES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def check_reward_model_dir(name: str, key: str = "--model") -> str:
    """`name` (a packaged alias resolved) if it can be a reward model, checked before anything loads: a directory
    with a `config.json` (or a LoRA `adapter_config.json`) whose architecture is not a causal LM, or a Hugging
    Face Hub id (`org/name`, with no part of it on disk). Else a ConfigError naming `key`: no such path, a
    file, a folder that is not a model, a causal LM (its score head would be random)."""
    source = model_source(name, key)
    path = Path(source)
    if not path.exists():
        return source  # a Hub id: transformers fetches it (or `loading_errors` says why not)
    hint = "give the final/ of `rmkit train`, or any Hugging Face sequence classifier"
    if not path.is_dir():
        raise ConfigError(key, f"{name} is a file, not a model directory ({hint})")
    if not (path / "config.json").is_file():
        if (path / "adapter_config.json").is_file():
            return str(path)
        raise ConfigError(key, f"{name} is not a model directory: it has no config.json ({hint})")
    try:
        architectures = config_architectures(path)
    except ValueError as err:
        raise ConfigError(key, str(err)) from None
    causal = [a for a in architectures if a.endswith(CAUSAL_LM_ARCHITECTURES)]
    if causal:
        raise ConfigError(key, f"{name} is a causal language model ({causal[0]}), not a reward model: a reward model "
                               f"is a sequence classifier (...ForSequenceClassification); {hint}")
    return str(path)


def template_sha256(tokenizer) -> str | None:
    """SHA-256 of the tokenizer's chat template text; None when it has none."""
    template = getattr(tokenizer, "chat_template", None)
    return hashlib.sha256(template.encode("utf-8")).hexdigest() if isinstance(template, str) else None


def model_max_length(model, tokenizer) -> int:
    """The longest input the model accepts: its position embeddings, capped by the tokenizer's own limit."""
    limits = [getattr(model.config.get_text_config(), "max_position_embeddings", None),
              getattr(tokenizer, "model_max_length", None)]
    limits = [int(n) for n in limits if isinstance(n, int) and 0 < n < UNBOUNDED]
    return min(limits) if limits else UNBOUNDED


def contract_for(model, tokenizer, max_length: int, stats: dict | None = None) -> ScoringContract:
    """The contract of `model` + `tokenizer` scored at `max_length` tokens; `stats` (`reward_stats.json`'s
    `mean` / `std`) fill the reward statistics."""
    stats = stats or {}
    sha = template_sha256(tokenizer)
    return ScoringContract(
        max_length=int(max_length), chat_template="tokenizer" if sha else "plain", chat_template_sha256=sha,
        reward_position="last_real_token" if uses_last_token_pooling(model) else "first_token",
        num_labels=int(model.config.num_labels), reward_mean=stats.get("mean"), reward_std=stats.get("std"),
    )


def write_contract(contract: ScoringContract, model_dir: str | Path) -> Path:
    """Write `contract` as `scoring_contract.json` into `model_dir`; returns the file's path."""
    path = Path(model_dir) / CONTRACT_FILE
    values = {k: v for k, v in asdict(contract).items() if k not in STEP_FIELDS or v is not None}
    path.write_text(json.dumps(values, indent=2) + "\n", encoding="utf-8")
    return path


def read_contract(model_dir: str | Path, model, tokenizer) -> ScoringContract:
    """The directory's `scoring_contract.json`, checked against the model and tokenizer loaded from it.

    A directory without one (any Hugging Face classifier, or an rmkit export that predates the contract)
    gets the contract derived from the model: the training run's max length when `rmkit_config.yaml`
    records it, else the model's position limit; reward statistics from `reward_stats.json` if present."""
    model_dir = Path(model_dir)
    path = model_dir / CONTRACT_FILE
    if not path.is_file():
        return contract_for(model, tokenizer, _legacy_max_length(model_dir, model, tokenizer),
                            _read_json(model_dir / "reward_stats.json"))
    values = _read_json(path)
    known = {f.name for f in fields(ScoringContract)}
    unknown = sorted(set(values) - known)
    if unknown or not isinstance(values.get("max_length"), int) or values["max_length"] < 2:
        problem = f"unknown key '{unknown[0]}'" if unknown else "'max_length' must be an integer >= 2"
        raise ConfigError("model", f"{path}: {problem}")
    contract = ScoringContract(**values)
    if contract.chat_template_sha256 != template_sha256(tokenizer):
        raise ConfigError("model", f"{path}: the tokenizer's chat template is not the one this model was "
                                   "exported with (chat_template_sha256 differs); restore the exported "
                                   "tokenizer_config.json / chat_template.jinja")
    if contract.step_separator is not None and contract.step_aggregation not in STEP_AGGREGATIONS:
        raise ConfigError("model", f"{path}: a process reward model's 'step_aggregation' must be one of "
                                   f"{', '.join(STEP_AGGREGATIONS)}, got {contract.step_aggregation!r}")
    if contract.step_separator is not None and contract.num_labels != 1:
        raise ConfigError("model", f"{path}: a process reward model has one output, not {contract.num_labels}")
    if contract.num_labels != model.config.num_labels:
        raise ConfigError("model", f"{path}: num_labels {contract.num_labels} but the model has "
                                   f"{model.config.num_labels} outputs")
    return contract


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ConfigError("model", f"{path} is not valid JSON: {err}") from None
    if not isinstance(values, dict):
        raise ConfigError("model", f"{path} must hold a JSON object")
    return values


def _legacy_max_length(model_dir: Path, model, tokenizer) -> int:
    limit = model_max_length(model, tokenizer)
    config = model_dir / "rmkit_config.yaml"
    if config.is_file():
        recorded = (yaml.safe_load(config.read_text(encoding="utf-8")) or {}).get("policy", {})
        if isinstance(recorded.get("max_total_sequence_length"), int):
            return min(recorded["max_total_sequence_length"], limit)
    return limit


class RewardScorer:
    """A reward model, its tokenizer and its contract: inputs in, rewards out.

    Args:
        model: a transformers sequence classifier (the peft base model during training).
        tokenizer: its tokenizer (pad token set, right padding).
        contract: the scoring contract (`read_contract` / `contract_for`).
        precision: `bfloat16` runs under bf16 autocast; weights stay as loaded.
        max_batch_tokens: padded tokens (`rows x longest`) per forward pass; None: 1,024 when the model is on a
            CPU, 16,384 on an accelerator (`rmkit.models.scoring.default_batch_tokens`).
        max_batch_size: rows per forward pass.
    """

    def __init__(self, model, tokenizer, contract: ScoringContract, precision: str = "float32",
                 max_batch_tokens: int | None = None, max_batch_size: int = 256):
        if max_batch_tokens is None:
            max_batch_tokens = default_batch_tokens(next(model.parameters()).device)
        for key, value in (("max_batch_tokens", max_batch_tokens), ("max_batch_size", max_batch_size)):
            if value < 1:
                raise ConfigError(key, f"must be >= 1, got {value}")
        self.model, self.tokenizer, self.contract = model, tokenizer, contract
        self.precision, self.max_batch_tokens, self.max_batch_size = precision, max_batch_tokens, max_batch_size

    @property
    def max_length(self) -> int:
        return self.contract.max_length

    def encode(self, inputs: Sequence[str | list[Message]]) -> list[tuple[list[int], int]]:
        """`(ids, full_length)` per text or conversation, cut on its own to the contract's max length."""
        return fit_inputs(self.tokenizer, inputs, self.max_length)

    def encode_pairs(self, pairs: Sequence) -> TokenizedPairs:
        """Both sides of every `PreferencePair`, each side cut on its own (`.truncated` counts pairs cut)."""
        return tokenize_pairs(pairs, self.tokenizer, self.max_length, truncation="per_text")

    def score_ids(self, sequences: Sequence[Sequence[int]], lockstep: bool = False) -> torch.Tensor:
        """Raw rewards `[N, K]` float32 (CPU) of N token sequences, in order; the model's train/eval mode
        is restored afterwards. `lockstep`: every rank of a torchrun job calls this and runs as many
        forward passes as the busiest one (an FSDP2-sharded model all-gathers in each)."""
        device = next(self.model.parameters()).device
        was_training = self.model.training
        forwards = 0
        if lockstep and is_distributed():
            batches = length_sorted_batches([len(s) for s in sequences], self.max_batch_tokens, self.max_batch_size)
            forwards = int(all_reduce(torch.tensor(len(batches)), "max"))
        self.model.eval()
        try:
            with autocast(self.precision, device):
                return score_sequences(self.model, sequences, self.tokenizer.pad_token_id,
                                       self.max_batch_tokens, self.max_batch_size, forwards)
        finally:
            self.model.train(was_training)

    def score(self, inputs: Sequence[str | list[Message]]) -> torch.Tensor:
        """Raw rewards `[N, K]` of N texts or conversations."""
        return self.score_ids([ids for ids, _ in self.encode(inputs)])

    @property
    def is_process(self) -> bool:
        """Whether the model scores steps (its contract names a step separator)."""
        return self.contract.step_separator is not None

    def check_process(self, name: str, key: str = "--model") -> None:
        """ConfigError naming `key` unless the model is a process reward model."""
        if not self.is_process:
            raise ConfigError(key, f"{name} is not a process reward model (its scoring_contract.json names no "
                                   "step_separator): it gives one reward per text, not one per step. Give the "
                                   "final/ of a `rmkit train --config configs/prm.yaml` run")

    def check_outcome(self, name: str, key: str = "--model") -> None:
        """ConfigError naming `key` when the model is a process reward model (a path that scores whole texts)."""
        if self.is_process:
            raise ConfigError(key, f"{name} is a process reward model (scoring_contract.json step_separator "
                                   f"{self.contract.step_separator!r}): it scores the steps of a solution, not a "
                                   "whole response. Score steps with `rmkit score` (records with `steps`) or "
                                   "evaluate it on step-labelled data (ProcessBench layout) with `rmkit eval --report`")

    def encode_solution(self, prompt: str, steps: Sequence[str]) -> tuple[list[int], list[int], int]:
        """`(ids, positions, num_steps)` of one solution: its ids cut to the max length (the beginning kept, as in
        training) and the label positions of the steps whose separator fits."""
        ids, ends = solution_ids(self.tokenizer, prompt, steps, self.contract.step_separator)
        return ids[: self.max_length], [end for end in ends if end < self.max_length], len(ends)

    def score_steps(self, solutions: Sequence[tuple[str, Sequence[str]]]) -> list[StepRewards]:
        """Each `(prompt, steps)` solution's step probabilities and reward (`StepRewards`), in order."""
        return self.score_solution_ids([self.encode_solution(prompt, steps) for prompt, steps in solutions])

    def score_solution_ids(self, encoded: Sequence[tuple[list[int], list[int], int]]) -> list[StepRewards]:
        """`score_steps` of solutions already encoded by `encode_solution`; the model's train/eval mode is restored
        afterwards."""
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        try:
            with autocast(self.precision, device):
                logits = score_positions(self.model, [ids for ids, _, _ in encoded], [p for _, p, _ in encoded],
                                         self.tokenizer.pad_token_id, self.max_batch_tokens, self.max_batch_size)
        finally:
            self.model.train(was_training)
        out = []
        for (_, _, num_steps), scores in zip(encoded, logits):
            probabilities = torch.sigmoid(scores[:, 0].double()).tolist()
            missing = num_steps - len(probabilities)
            reward = aggregate_steps(probabilities, self.contract.step_aggregation) if not missing else None
            out.append(StepRewards(probabilities + [None] * missing, reward))
        return out

    def scalar(self, raw: torch.Tensor, weights: torch.Tensor | None = None,
               normalize: bool = False) -> torch.Tensor | None:
        """One reward per row `[N]` from raw `[N, K]`: the column when K = 1, else the weighted sum with
        `weights` `[K]` (None without them); `normalize` gives `(r - reward_mean) / reward_std`."""
        if raw.shape[1] == 1:
            scalar = raw[:, 0]
        elif weights is not None:
            scalar = raw @ weights
        else:
            return None
        if normalize:
            scalar = (scalar - self.contract.reward_mean) / self.contract.reward_std
        return scalar

    def check_normalizable(self) -> None:
        """ConfigError unless the contract holds a usable reward mean and std."""
        mean, std = self.contract.reward_mean, self.contract.reward_std
        if mean is None or std is None:
            raise ConfigError("normalize", "the model directory has no reward mean/std (scoring_contract.json "
                                           "reward_mean/reward_std; reward_stats.json is missing)")
        if not std > 0:
            raise ConfigError("normalize", f"reward_std must be > 0, got {std}")


def load_scorer(model_dir: str | Path, device: str | torch.device = "cpu", dtype: str = "float32",
                precision: str = "float32", max_length: int | None = None, **batching) -> RewardScorer:
    """Load a model directory (an rmkit export, any HF sequence classifier, GGUF too) for scoring.

    `max_length` overrides the contract's (an explicit choice; the default agrees on every path)."""
    if dtype not in DTYPES:
        raise ConfigError("dtype", f"must be one of {', '.join(DTYPES)}, got {dtype!r}")
    with loading_errors(str(model_dir), "--model"):
        model, tokenizer = load_reward_model(model_dir, dtype=DTYPES[dtype])
    model.to(device).eval()
    contract = read_contract(model_dir, model, tokenizer)
    if max_length is not None:
        if max_length < 2:
            raise ConfigError("--max-length", f"must be >= 2, got {max_length}")
        check_length(model, max_length, str(model_dir), "--max-length")
        contract = replace(contract, max_length=max_length)
    return RewardScorer(model, tokenizer, contract, precision=precision, **batching)
