"""`rmkit grpo`'s config: the shipped YAML parses, loss_fn has every ClippedPGLossFn key with NeMo RL's
defaults, and bad keys or values name the dotted key."""

from dataclasses import asdict
from pathlib import Path

import pytest

from rmkit.config import load_config
from rmkit.errors import ConfigError
from rmkit.losses.configs import CLIPPED_PG_DEFAULTS, KL_TYPES, ClippedPGLossConfig
from rmkit.recipes.configs import GRPOConfig

REPO = Path(__file__).resolve().parents[2]


def test_shipped_config_parses_with_grpo_defaults():
    cfg = load_config(REPO / "configs" / "grpo_rm.yaml", tree_type=GRPOConfig)
    assert cfg.policy.model_name == "smollm2" and cfg.env.reward_model.model_name == "results/rm/final"
    assert cfg.grpo.num_prompts_per_step * cfg.grpo.num_generations_per_prompt == 32
    assert cfg.policy.train_global_batch_size == 16 and cfg.policy.generation.max_new_tokens == 48
    assert asdict(cfg.loss_fn) == CLIPPED_PG_DEFAULTS  # the YAML states NeMo RL's defaults
    defaults = load_config(None, tree_type=GRPOConfig)
    assert defaults.checkpointing.checkpoint_dir == "results/grpo" and defaults.checkpointing.higher_is_better
    # a partly given section keeps GRPO's defaults for the rest
    partial = load_config(None, ["policy.train_micro_batch_size=4", "checkpointing.save_period=3"], tree_type=GRPOConfig)
    assert partial.policy.model_name == "smollm2" and partial.checkpointing.metric_name == "validation/reward_mean"


def test_loss_fn_is_the_loss_own_config_with_nemo_rl_defaults():
    """`loss_fn` is `ClippedPGLossConfig` itself (declared once, in rmkit.losses.configs): the loss built from it
    equals the loss built from an empty dict (NeMo RL's defaults), and its KL names are the estimators'."""
    from rmkit.losses.kl import KL_ESTIMATORS
    from rmkit.losses.policy_gradient import ClippedPGLossFn

    assert ClippedPGLossFn(ClippedPGLossConfig()).cfg == ClippedPGLossFn({}).cfg == CLIPPED_PG_DEFAULTS
    assert CLIPPED_PG_DEFAULTS["ratio_clip_min"] == 0.2 and CLIPPED_PG_DEFAULTS["reference_policy_kl_penalty"] == 0.01
    assert set(KL_TYPES) == set(KL_ESTIMATORS)


def test_config_trees_load_without_torch():
    """A bad key must fail before torch's seconds of import: the config trees and the loss configs they nest
    import no torch (import-linter checks the static imports; this checks what actually runs)."""
    import subprocess
    import sys

    code = ("import sys; import rmkit.recipes.configs, rmkit.losses.configs; "
            "import rmkit.config, rmkit.cli.recipes; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("override, key", [
    ("grpo.num_generation_per_prompt=4", "grpo.num_generation_per_prompt"),
    ("loss_fn.ratio_clip=0.1", "loss_fn.ratio_clip"),
    ("loss_fn.ratio_clip_min=2", "loss_fn.ratio_clip_min"),
    ("loss_fn.reference_policy_kl_type=k9", "loss_fn.reference_policy_kl_type"),
    ("loss_fn.use_cispo=true", "loss_fn.use_cispo"),  # with disable_ppo_ratio below
    ("policy.generation.temperature=0", "policy.generation.temperature"),
    ("policy.generation.stop=x", "policy.generation.stop"),
    ("policy.train_global_batch_size=24", "policy.train_global_batch_size"),
    ("policy.generation.max_new_tokens=512", "policy.generation.max_new_tokens"),
    ("env.reward_model.url=http://127.0.0.1:1", "env.reward_model.model_name"),
    ("env.reward_model.port=1", "env.reward_model.port"),
    ("grpo.reward_shaping.enabled=true", "grpo.reward_shaping.enabled"),
    ("grpo.reward_shaping.missing_eos_penalty=-1", "grpo.reward_shaping.missing_eos_penalty"),
    ("grpo.reward_shaping.overlong_buffer_length=4", "grpo.reward_shaping.max_response_length"),
])
def test_bad_keys_and_values_name_the_key(override, key):
    extra = ["loss_fn.disable_ppo_ratio=true"] if "cispo" in override else []
    with pytest.raises(ConfigError) as err:
        load_config(None, [override, "env.reward_model.model_name=rm", *extra], tree_type=GRPOConfig)
    assert err.value.key == key
