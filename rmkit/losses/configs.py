"""The configs of the losses that recipes configure, as typed dataclasses: the one place each key is declared,
with NeMo RL's default and what it means, and the checks of a whole config. torch-free, so a recipe's config
tree nests them (`loss_fn: ClippedPGLossConfig`; `dpo.*` extends `DPOLossConfig`) and a bad key fails before
torch is imported. The losses take the dataclass or a plain dict of any subset of its keys (NeMo RL's
`TypedDict` configs); a dict's unknown keys are errors.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import ClassVar

from rmkit.errors import ConfigError

KL_TYPES = ("k1", "k2", "k3")  # rmkit.losses.kl.KL_ESTIMATORS
TRUNCATED_IS_TYPES = ("tis", "icepop", "seq-mask-tis")
NAME = "ClippedPGLossConfig"


def check_config_keys(cfg: dict, required: set[str], optional: set[str], name: str) -> None:
    """Raise ValueError naming missing or unknown keys of a loss config dict."""
    if not isinstance(cfg, dict):
        raise ValueError(f"{name} must be a dict, got {type(cfg).__name__}")
    missing = sorted(required - cfg.keys())
    unknown = sorted(cfg.keys() - required - optional)
    if missing:
        raise ValueError(f"{name}: missing key(s) {', '.join(missing)}")
    if unknown:
        raise ValueError(
            f"{name}: unknown key(s) {', '.join(unknown)}; allowed: {sorted(required | optional)}"
        )


def _as_config_error(section: str, keys, err: ValueError) -> ConfigError:
    """A loss's ValueError as a ConfigError naming `<section>.<the first key its message names>`."""
    message = str(err).split(": ", 1)[-1]
    named = [k for k in keys if k in message]
    return ConfigError(f"{section}.{min(named, key=message.index) if named else next(iter(keys))}", message)


@dataclass
class ClippedPGLossConfig:
    """`loss_fn.*`: the clipped policy-gradient loss (`rmkit.losses.policy_gradient.ClippedPGLossFn`), every
    key with NeMo RL's default."""

    section: ClassVar[str] = "loss_fn"

    reference_policy_kl_penalty: float = 0.01
    """beta: weight of the KL to the reference policy (the initial weights); 0: no reference pass."""
    ratio_clip_min: float = 0.2
    """PPO clip: the ratio is clipped below at 1 - ratio_clip_min."""
    ratio_clip_max: float = 0.2
    """PPO clip: above at 1 + ratio_clip_max (DAPO's clip-higher when larger)."""
    use_on_policy_kl_approximation: bool = False
    """Weight the KL by exp(curr - gen)."""
    use_importance_sampling_correction: bool = False
    """Weight the actor loss by exp(prev - gen)."""
    token_level_loss: bool = True
    """Mean over all tokens of the global batch (true) or each sequence's token mean (false)."""
    ratio_clip_c: float | None = None
    """Dual clip c > 1; null: off."""
    disable_ppo_ratio: bool = False
    """REINFORCE / RLOO: actor loss -A * logp, no ratio, no clipping."""
    reference_policy_kl_type: str = "k3"
    """KL estimator: k1, k2 or k3."""
    kl_input_clamp_value: float | None = 20.0
    """Clamp of ref - curr before the estimator; null: none."""
    kl_output_clamp_value: float | None = 10.0
    """Clamp of the weighted estimate; null: none."""
    sequence_level_importance_ratios: bool = False
    """GSPO: one ratio per sequence, exp(token mean of curr - prev), and one importance weight, exp(sum of
    prev - gen); needs token_level_loss: false."""
    use_cispo: bool = False
    """CISPO: -A * sg(clip(r)) * logp."""
    truncated_importance_sampling_type: str | None = None
    """Truncated importance sampling of the actor weights (needs use_importance_sampling_correction): tis
    clamps them to [min, max] (min defaults to 0), icepop zeroes tokens outside [min, max], seq-mask-tis zeroes
    sequences whose geometric-mean weight is outside [min, max]; null: off."""
    truncated_importance_sampling_ratio: float | None = None
    """Upper bound of the truncated importance weights (> 0)."""
    truncated_importance_sampling_ratio_min: float | None = None
    """Lower bound (icepop, seq-mask-tis)."""
    force_on_policy_ratio: bool = False
    """ratio = exp(curr - sg(curr)) = 1 (prev_logprobs unread)."""
    use_kl_in_reward: bool = False
    """The KL goes into the reward upstream (Reinforce++): the loss uses beta = 0."""
    positive_example_nll_weight: float = 0.0
    """VAPO: + weight * NLL of the tokens of rows with a positive reward (their own mean)."""

    def __post_init__(self):
        try:
            validate_clipped_pg(self)
        except ValueError as err:
            raise _as_config_error(self.section, CLIPPED_PG_DEFAULTS, err) from None


CLIPPED_PG_DEFAULTS = {f.name: f.default for f in fields(ClippedPGLossConfig)}


def validate_clipped_pg(cfg: dict | ClippedPGLossConfig) -> dict:
    """`cfg` (any subset of the keys, or the dataclass) with NeMo RL's defaults filled in, checked: ValueError
    names the key and what is wrong."""
    cfg = asdict(cfg) if isinstance(cfg, ClippedPGLossConfig) else cfg
    check_config_keys(cfg, set(), set(CLIPPED_PG_DEFAULTS), NAME)
    cfg = {**CLIPPED_PG_DEFAULTS, **cfg}
    if cfg["reference_policy_kl_penalty"] < 0:
        raise ValueError(f"{NAME}: reference_policy_kl_penalty must be >= 0")
    if not cfg["disable_ppo_ratio"]:
        if not 0 <= cfg["ratio_clip_min"] <= 1 or cfg["ratio_clip_max"] < 0:
            raise ValueError(
                f"{NAME}: need 0 <= ratio_clip_min <= 1 and ratio_clip_max >= 0, got "
                f"{cfg['ratio_clip_min']} and {cfg['ratio_clip_max']}"
            )
    c = cfg["ratio_clip_c"]
    if c is not None:
        if c <= 1:
            raise ValueError(f"{NAME}: ratio_clip_c (dual clip) must be > 1, got {c}")
        if cfg["disable_ppo_ratio"]:
            raise ValueError(f"{NAME}: ratio_clip_c needs the PPO ratio; unset disable_ppo_ratio")
    if cfg["reference_policy_kl_type"] not in KL_TYPES:
        raise ValueError(
            f"{NAME}: unknown reference_policy_kl_type {cfg['reference_policy_kl_type']!r}; "
            f"choose one of {sorted(KL_TYPES)}"
        )
    for key in ("kl_input_clamp_value", "kl_output_clamp_value"):
        if cfg[key] is not None and cfg[key] <= 0:
            raise ValueError(f"{NAME}: {key} must be > 0 or None, got {cfg[key]}")
    if cfg["positive_example_nll_weight"] < 0:
        raise ValueError(f"{NAME}: positive_example_nll_weight must be >= 0")
    if cfg["sequence_level_importance_ratios"] and cfg["token_level_loss"]:
        raise ValueError(f"{NAME}: sequence_level_importance_ratios (GSPO) needs token_level_loss False")
    _validate_cispo(cfg)
    _validate_truncated_is(cfg)
    return cfg


def _validate_cispo(cfg: dict) -> None:
    if not cfg["use_cispo"]:
        return
    conflicts = {
        "disable_ppo_ratio": "CISPO weights by the ratio that it removes",
        "force_on_policy_ratio": "a ratio forced to 1 leaves CISPO nothing to clip",
        "sequence_level_importance_ratios": "CISPO's weights are per token",
        "ratio_clip_c": "the dual clip would replace the CISPO loss; set it to None",
    }
    for key, why in conflicts.items():
        if cfg[key] not in (False, None):
            raise ValueError(f"{NAME}: use_cispo is incompatible with {key} ({why})")
    if not cfg["token_level_loss"]:
        raise ValueError(f"{NAME}: use_cispo needs token_level_loss True")


def _validate_truncated_is(cfg: dict) -> None:
    kind = cfg["truncated_importance_sampling_type"]
    high, low = cfg["truncated_importance_sampling_ratio"], cfg["truncated_importance_sampling_ratio_min"]
    if kind is None:
        if high is not None:  # NeMo RL fails on it at the first call
            raise ValueError(
                f"{NAME}: truncated_importance_sampling_ratio is set but truncated_importance_sampling_type "
                f"is None; choose one of {list(TRUNCATED_IS_TYPES)}"
            )
        return
    if not cfg["use_importance_sampling_correction"]:
        raise ValueError(f"{NAME}: truncated_importance_sampling_type needs use_importance_sampling_correction True")
    if kind not in TRUNCATED_IS_TYPES:
        raise ValueError(
            f"{NAME}: unknown truncated_importance_sampling_type {kind!r}; choose one of {list(TRUNCATED_IS_TYPES)}"
        )
    if high is None or high <= 0:
        raise ValueError(f"{NAME}: truncated_importance_sampling_ratio must be set and > 0, got {high}")
    if low is not None and low > high:
        raise ValueError(
            f"{NAME}: truncated_importance_sampling_ratio_min must be <= truncated_importance_sampling_ratio, "
            f"got {low} > {high}"
        )
    if kind != "tis" and low is None:
        raise ValueError(f"{NAME}: truncated_importance_sampling_type {kind!r} needs truncated_importance_sampling_ratio_min")
    if kind == "seq-mask-tis" and cfg["sequence_level_importance_ratios"]:
        raise ValueError(
            f"{NAME}: truncated_importance_sampling_type 'seq-mask-tis' (per-token weights, masked per "
            "sequence) is incompatible with sequence_level_importance_ratios"
        )


@dataclass
class DPOLossConfig:
    """The DPO loss's keys (`rmkit.losses.dpo.DPOLossFn`), NeMo RL's `dpo.*` names and defaults."""

    section: ClassVar[str] = "dpo"

    reference_policy_kl_penalty: float = 0.05
    """beta: the implicit reward is `beta * (log pi - log pi_ref)` of a response."""
    preference_loss_weight: float = 1.0
    """Weight of the DPO (preference) term."""
    sft_loss_weight: float = 0.0
    """Weight of the NLL of the chosen responses (RPO-style SFT term)."""
    preference_average_log_probs: bool = False
    """The implicit reward uses the mean instead of the sum of the response's token log-ratios."""
    sft_average_log_probs: bool = False
    """The SFT term is each chosen response's mean token NLL instead of its sum."""

    def __post_init__(self):
        try:
            validate_dpo(self)
        except ValueError as err:
            raise _as_config_error(self.section, DPO_KEYS, err) from None

    def loss_config(self) -> dict:
        """The loss's keys alone (a config that extends this one has more)."""
        return {key: getattr(self, key) for key in DPO_KEYS}


DPO_KEYS = tuple(f.name for f in fields(DPOLossConfig))


def validate_dpo(cfg: dict | DPOLossConfig) -> dict:
    """`cfg` checked: every key present and nothing else (a dict), weights >= 0; ValueError otherwise."""
    cfg = DPOLossConfig.loss_config(cfg) if isinstance(cfg, DPOLossConfig) else cfg
    check_config_keys(cfg, set(DPO_KEYS), set(), "DPOLossConfig")
    if cfg["preference_loss_weight"] < 0 or cfg["sft_loss_weight"] < 0:
        raise ValueError("DPOLossConfig: preference_loss_weight and sft_loss_weight must be >= 0")
    return dict(cfg)


@dataclass
class MseValueLossConfig:
    """`value_loss_fn.*`: the critic's clipped value loss (`rmkit.losses.value.MseValueLossFn`), NeMo RL's
    keys and the loss's defaults."""

    section: ClassVar[str] = "value_loss_fn"

    scale: float = 1.0
    """Multiplies the loss."""
    cliprange: float | None = None
    """Clip the critic's new values to the rollout's values +- cliprange (PPO's value clipping); null or 0: off."""

    def __post_init__(self):
        try:
            validate_value_loss(self)
        except ValueError as err:
            raise _as_config_error(self.section, VALUE_LOSS_KEYS, err) from None


VALUE_LOSS_KEYS = tuple(f.name for f in fields(MseValueLossConfig))


def validate_value_loss(cfg: dict | MseValueLossConfig) -> dict:
    """`cfg` (any subset of the keys, or the dataclass) with the defaults filled in, checked: ValueError names
    the key and what is wrong."""
    cfg = asdict(cfg) if isinstance(cfg, MseValueLossConfig) else cfg
    check_config_keys(cfg, set(), set(VALUE_LOSS_KEYS), "MseValueLossConfig")
    cfg = {"scale": 1.0, "cliprange": None, **cfg}
    if cfg["cliprange"] is not None and cfg["cliprange"] < 0:
        raise ValueError(f"MseValueLossConfig: cliprange must be >= 0 or None, got {cfg['cliprange']}")
    return cfg
