"""`rmkit dpo` end to end through the CLI: the shipped config, the exported policy, the log files, and the bad-input
contract (one message naming the file:line or the config key, exit 2)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from rmkit import cli
from rmkit.config import load_config
from rmkit.errors import ConfigError
from rmkit.recipes.configs import DPOTree
from tests.recipes.dpo_helpers import dpo_values, read_metrics, write_pairs

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG = REPO_ROOT / "configs" / "dpo.yaml"


def test_shipped_config_loads():
    cfg = load_config(CONFIG, tree_type=DPOTree)
    assert cfg.policy.model_name == "smollm2" and cfg.dpo.reference_policy_kl_penalty == 0.05
    assert cfg.checkpointing.checkpoint_dir == "results/dpo" and cfg.policy.optimizer.lr == 5e-6
    defaults = load_config(None, tree_type=DPOTree)  # a partial policy section keeps DPO's defaults
    assert load_config(None, ["policy.precision=bfloat16"], tree_type=DPOTree).policy.model_name == "smollm2"
    assert defaults.dpo.val_at_end is False and defaults.dpo.max_num_steps == 150


def test_unknown_and_bad_keys_name_the_key():
    with pytest.raises(ConfigError, match="dpo.betaa"):
        load_config(CONFIG, ["dpo.betaa=0.1"], tree_type=DPOTree)
    with pytest.raises(ConfigError, match="dpo.reference_policy_kl_penalty"):
        load_config(CONFIG, ["dpo.reference_policy_kl_penalty=0"], tree_type=DPOTree)


def test_cli_end_to_end(tiny_policy, tmp_path):
    train, val = write_pairs(tmp_path / "train.jsonl", 8), write_pairs(tmp_path / "val.jsonl", 4, offset=50)
    out = tmp_path / "run"
    args = [f"policy.model_name={tiny_policy}", f"data.train_data_path={train}", f"data.val_data_paths={{v: {val}}}",
            f"checkpointing.checkpoint_dir={out}", "checkpointing.metric_name=val:validation-v_loss",
            "dpo.max_num_steps=2", "dpo.val_period=1", "dpo.sample_max_new_tokens=3", "dpo.num_sample_generations=1",
            "policy.train_global_batch_size=4", "policy.max_total_sequence_length=64", "policy.num_threads=1",
            "logger.progress_bar=false", "logger.tensorboard=false"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "RMKIT_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "rmkit", "dpo", "--config", str(CONFIG), *args], env=env,
                          capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Policy saved to" in proc.stdout
    assert f"rmkit: validation-v: {val}: 4 pairs (binary format); 2 truncated to 64 tokens" in proc.stderr

    model = AutoModelForCausalLM.from_pretrained(out / "final")
    tokenizer = AutoTokenizer.from_pretrained(out / "final")
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    assert model.generate(ids, max_new_tokens=2, do_sample=False).shape[1] == ids.shape[1] + 2
    records = read_metrics(out / "logs" / "metrics.jsonl")
    keys = set().union(*records)
    for name in ("loss", "sft_loss", "preference_loss", "accuracy", "rewards_chosen_mean", "rewards_rejected_mean",
                 "rewards_margin_mean"):
        assert f"train/{name}" in keys and f"validation-v/{name}" in keys
    samples = read_metrics(out / "logs" / "samples.jsonl")
    assert [s["step"] for s in samples] == [0, 1] and all("completion" in s for s in samples)
    assert (out / "logs" / "training_curves.png").is_file()
    assert yaml.safe_load((out / "final" / "rmkit_config.yaml").read_text())["dpo"]["max_num_steps"] == 2
    assert (out / "step_2" / "manifest.json").is_file()


def test_malformed_record_is_a_file_line_error(tiny_policy, tmp_path, capsys):
    train = write_pairs(tmp_path / "train.jsonl", 3)
    with open(train, "a") as f:
        f.write(json.dumps({"prompt": "Hi", "chosen": "Hello"}) + "\n")  # line 4: no rejected
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(dpo_values(tiny_policy, train, None, tmp_path / "run")))
    assert cli.main(["dpo", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{train}:4" in err and "rejected" in err and "Traceback" not in err

    assert cli.main(["dpo", "--config", str(config), "data.on_error=skip"]) == 0
    rejects = (tmp_path / "run" / "rejects-train.jsonl").read_text().splitlines()
    assert len(rejects) == 1 and f"{train}:4" in rejects[0]


def test_unknown_key_at_the_cli(capsys):
    assert cli.main(["dpo", "--config", str(CONFIG), "dpo.no_such_key=1"]) == 2
    assert "dpo.no_such_key" in capsys.readouterr().err


def test_a_short_run_computes_the_reference_of_its_pairs_only(tiny_policy, tmp_path, capsys):
    """Two steps of 4 pairs from a file of 24 (issue 58: a 2-step run spent minutes on the reference log-probs of
    the whole file): the reference pass covers the 8 pairs the steps take, and the run finishes."""
    train = write_pairs(tmp_path / "train.jsonl", 24)
    out = tmp_path / "run"
    status = cli.main(["dpo", "--config", str(CONFIG), f"policy.model_name={tiny_policy}", f"data.train_data_path={train}",
                       "data.val_data_paths={}", f"checkpointing.checkpoint_dir={out}",
                       "dpo.max_num_steps=2", "dpo.val_period=0", "dpo.num_sample_generations=0",
                       "policy.train_global_batch_size=4", "policy.max_total_sequence_length=64",
                       "logger.progress_bar=false", "logger.tensorboard=false", "logger.plots=false"])
    assert status == 0, capsys.readouterr().err
    assert "rmkit: dpo: reference log-probs of the 8 of 24 training pairs that the run's 2 steps take" in \
        capsys.readouterr().err
    cached = torch.load(next((out / "reference_logprobs").glob("train-*.pt")), weights_only=True)
    assert len(cached["lengths"]) == 2 * 8  # a chosen and a rejected response per pair
