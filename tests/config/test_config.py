"""The typed config: YAML + dotted overrides, errors that name the dotted key (every shipped config loads:
test_shipped_configs.py)."""


from pathlib import Path

import pytest

from rmkit.config import config_from_dict, load_config, save_config
from rmkit.errors import ConfigError


def test_defaults_are_the_embedded_minilm_run():
    cfg = load_config(None)
    assert cfg.policy.model_name == "minilm" and cfg.data.train_data_path == "default"
    assert cfg.policy.reward_model_cfg.reward_model_type == "bradley_terry"


def test_shipped_configs_exist():
    configs = {p.name for p in (Path(__file__).resolve().parents[2] / "configs").glob("*.yaml")}
    assert configs >= {"default.yaml", "rm.yaml", "ppo_rm.yaml", "reinforce_rm.yaml"}


def test_overrides_are_parsed_as_yaml():
    cfg = load_config(None, ["policy.optimizer.lr=1e-5", "rm.max_num_steps=7", "policy.precision=bfloat16",
                             "policy.optimizer.betas=[0.8, 0.9]", "data.val_data_paths.hh=/x.jsonl",
                             "rm.val_batches=null", "policy.lora.target_modules=[q_proj, v_proj]"])
    assert cfg.policy.optimizer.lr == 1e-5 and isinstance(cfg.policy.optimizer.lr, float)
    assert cfg.rm.max_num_steps == 7 and cfg.policy.precision == "bfloat16"
    assert cfg.policy.optimizer.betas == (0.8, 0.9)
    assert cfg.data.val_data_paths == {"hh": "/x.jsonl"}  # a mapping given replaces the default mapping
    assert cfg.policy.lora.target_modules == ["q_proj", "v_proj"]


@pytest.mark.parametrize("override, key", [
    ("policy.optimizer.lrr=1", "policy.optimizer.lrr"),
    ("polcy.model_name=x", "polcy"),
    ("rm.max_num_epochs=two", "rm.max_num_epochs"),
    ("rm.val_at_start=1", "rm.val_at_start"),
    ("policy.precision=float16", "policy.precision"),
    ("policy.reward_model_cfg.reward_model_type=pairwise", "policy.reward_model_cfg.reward_model_type"),
    ("policy.optimizer.betas=[0.9]", "policy.optimizer.betas"),
    ("policy.train_micro_batch_size=3", "policy.train_global_batch_size"),
    ("policy.optimizer.lr=-1", "policy.optimizer.lr"),
    ("policy.optimizer=3", "policy.optimizer"),
    ("rm.max_num_steps=0", "rm.max_num_steps"),
])
def test_bad_keys_and_values_name_the_dotted_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert err.value.key == key
    assert f"'{key}'" in str(err.value)


def test_override_adds_to_a_mapping_from_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data:\n  val_data_paths:\n    a: /a.jsonl\n")
    assert load_config(path, ["data.val_data_paths.b=/b.jsonl"]).data.val_data_paths == {"a": "/a.jsonl", "b": "/b.jsonl"}


def test_unknown_key_in_yaml_is_named(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("policy:\n  tokenizer:\n    nam: x\n")
    with pytest.raises(ConfigError, match="policy.tokenizer.nam"):
        load_config(path)


def test_missing_file_and_bad_yaml_are_user_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "absent.yaml")
    (tmp_path / "bad.yaml").write_text("rm: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")


def test_save_then_load_round_trips(tmp_path):
    cfg = load_config(None, ["policy.optimizer.betas=[0.8, 0.95]", "rm.seed=3"])
    save_config(cfg, tmp_path / "resolved.yaml")
    assert load_config(tmp_path / "resolved.yaml") == cfg


def test_regression_needs_its_type_for_several_labels():
    with pytest.raises(ConfigError, match="num_labels"):
        config_from_dict({"policy": {"reward_model_cfg": {"num_labels": 3}}})
    cfg = config_from_dict({"policy": {"reward_model_cfg": {"num_labels": 3, "reward_model_type": "regression"}}})
    assert cfg.policy.reward_model_cfg.num_labels == 3


def test_data_split_and_allow_empty_response_reach_the_loader(tiny_decoder, tmp_path):
    datasets = pytest.importorskip("datasets")
    from transformers import AutoTokenizer

    from rmkit.errors import DataError
    from rmkit.trainer.datasets import load_run_data

    rows = [{"prompt": f"q{i}", "chosen": f"good {i}", "rejected": "" if i == 0 else f"bad {i}"} for i in range(3)]
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "ds"))
    tokenizer = AutoTokenizer.from_pretrained(tiny_decoder)
    options = [f"data.train_data_path={tmp_path / 'ds'}", "data.val_data_paths={}", "data.split=test"]
    with pytest.raises(DataError, match="rejected"):  # the empty response of the first record
        load_run_data(load_config(None, options), tokenizer, tmp_path / "out")
    cfg = load_config(None, [*options, "data.allow_empty_response=true"])
    data = load_run_data(cfg, tokenizer, tmp_path / "out")
    assert len(data.train) == 3 and data.val == {}


def test_length_group_window_reaches_the_sampler_and_must_be_positive():
    from rmkit.trainer.datasets import make_sampler

    def batches(window):
        cfg = config_from_dict({"data": {"length_group_window": window}, "policy": {"train_global_batch_size": 4, "train_micro_batch_size": 4}})
        return make_sampler(cfg, list(range(40)), seed=3).batches()  # record i has length i

    consecutive = lambda b: b == list(range(b[0], b[0] - 4, -1))  # noqa: E731
    assert all(consecutive(b) for b in batches(50))  # one window sorts all 40 records
    assert not all(consecutive(b) for b in batches(2))  # windows of 8 records mix lengths across windows
    with pytest.raises(ConfigError, match="data.length_group_window"):
        config_from_dict({"data": {"length_group_window": 0}})


def test_val_keys_give_a_validation_set_its_own_field_names():
    from rmkit.recipes.configs import SFTTree

    cfg = config_from_dict({"data": {"prompt_key": "question", "chosen_key": "answer",
                                     "val_data_paths": {"hh": "hh.jsonl", "mine": "mine.jsonl", "odd": "odd.jsonl"},
                                     "val_keys": {"hh": {}, "odd": {"chosen_key": "best"}}}})
    keys = ("prompt_key", "chosen_key", "rejected_key")
    assert [getattr(cfg.data.for_set("hh"), k) for k in keys] == ["prompt", "chosen", "rejected"]  # the standard keys
    assert [getattr(cfg.data.for_set("odd"), k) for k in keys] == ["prompt", "best", "rejected"]
    assert cfg.data.for_set("mine") is cfg.data and cfg.data.for_set(None) is cfg.data  # the training file's keys
    sft = config_from_dict({"data": {"response_key": "completion", "val_keys": {"default": {}}}}, tree_type=SFTTree)
    assert sft.data.for_set("default").response_key == "response" and sft.data.response_key == "completion"
    for override, key in [("data.val_keys={nope: {}}", "data.val_keys.nope"),
                          ("data.val_keys={default: {prompt: q}}", "data.val_keys.default.prompt"),
                          ("data.val_keys={default: {prompt_key: 3}}", "data.val_keys.default.prompt_key")]:
        with pytest.raises(ConfigError) as err:
            load_config(None, [override])
        assert err.value.key == key, override


@pytest.mark.parametrize("override, key", [
    ("value.optimizer.lr=-1", "value.optimizer.lr"), ("value.scheduler.min_lr_ratio=2", "value.scheduler.min_lr_ratio"),
    ("policy.optimizer.lr=-1", "policy.optimizer.lr"),
])
def test_a_shared_section_built_elsewhere_names_its_own_key_path(override, key):
    """The critic's optimizer is an `OptimizerConfig` like the policy's; its errors say `value.`, not `policy.`."""
    from rmkit.recipes.configs import PPOConfig

    with pytest.raises(ConfigError) as err:
        load_config(None, [override], tree_type=PPOConfig)
    assert err.value.key == key
