"""`torchrun --nproc-per-node 2 -m rmkit train` with FSDP2 (`policy.dtensor_cfg.enabled`, gloo, CPU) ==
one process with the same global batch.

The same run as `test_train_ddp.py`: it crosses an epoch boundary, its 9th global batch holds a single
pair (rank 1 runs placeholder micro-batches to match rank 0's forwards: every FSDP2 forward all-gathers),
and the 21 validation pairs split 11 / 10 over the ranks (unequal shares, the same number of forwards).
Gradient accumulation: 2 micro-batches of 2 pairs per rank against 2 of 4 in the single process. Cases:
Bradley-Terry, the same with LoRA adapters, regression with 2 labels (some missing), Bradley-Terry
on a BERT classifier, and Bradley-Terry with CPU offload, no resharding after forward and gradient
checkpointing.

Tolerances, as in `test_train_ddp.py`: the runs add the same gradient contributions in a different order
(a reduce-scatter of per-rank sums) and pad rows differently, so they agree to float32 rounding, which
Adam can amplify on near-zero gradients: logged metrics to 1e-5 relative (plus 1e-6 absolute), final
weights to 1e-5 absolute. Averaging instead of summing gradients over ranks (FSDP2's default) is off
by a factor of 2 at the first step and fails.
"""

import json
import random
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
)

from rmkit import cli
from rmkit.config import config_from_dict
from rmkit.errors import ConfigError
from tests.recipes.test_rm_ddp import assert_close_runs, records
from tests.support.launch import CHILD_ENV, torchrun
from tests.support.tiny import BAD, GOOD, TOPICS, make_tiny_decoder, write_pairs

STEPS = 8
TEXTS = ["User: tell me about apples\nAssistant: the answer about apples is helpful the",
         "User: tell me about maps\nAssistant: the answer about maps is rude"]


VARIANTS = {  # policy options of each case; regression reads its own files
    "bradley_terry": {},
    "lora": {"lora": {"enabled": True, "r": 4, "alpha": 8}},  # adapters inside the sharded blocks
    "regression": {"reward_model_cfg": {"reward_model_type": "regression", "num_labels": 2}},
    "bert": {},  # an encoder: the reward is the classifier on [CLS] (the model's own forward)
    "offload": {"dtensor_cfg": {"enabled": True, "cpu_offload": True, "reshard_after_forward": False},
                "gradient_checkpointing": True},  # the other FSDP2 options, with activation recomputation
}


def make_tiny_encoder(directory: Path, decoder: Path) -> Path:
    """A random 2-layer BERT classifier with the tiny decoder's tokenizer (its <s> first, as [CLS])."""
    tokenizer = AutoTokenizer.from_pretrained(decoder)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=128, num_labels=1, pad_token_id=0)
    BertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def write_regression(path: Path, n: int, seed: int) -> Path:
    """`n` regression records of 2 labels (the second one missing in every third record)."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            topic, good = rng.choice(TOPICS), rng.random() < 0.5
            word = rng.choice(GOOD if good else BAD)
            f.write(json.dumps({"prompt": f"tell me about {topic}", "response": f"the answer is {word}",
                                "label": [float(good), -100 if i % 3 == 0 else rng.random()]}) + "\n")
    return path


def write_config(tmp_path: Path, name: str, micro: int, variant: str = "bradley_terry") -> Path:
    model = tmp_path / "model"
    if not model.exists():
        make_tiny_decoder(model)
        write_pairs(tmp_path / "train.jsonl", 65, seed=1)  # 8 global batches of 8 + one of 1 pair
        write_pairs(tmp_path / "val.jsonl", 21, seed=2)
        write_regression(tmp_path / "reg_train.jsonl", 65, seed=3)
        write_regression(tmp_path / "reg_val.jsonl", 21, seed=4)
        make_tiny_encoder(tmp_path / "bert", model)
    prefix = "reg_" if variant == "regression" else ""
    out = tmp_path / name
    config = {
        "rm": {"max_num_epochs": 2, "max_num_steps": STEPS + 2, "val_period": 4, "val_at_start": True,
               "seed": 5, "log_period": 1},
        "policy": {"model_name": str(tmp_path / "bert" if variant == "bert" else model), "train_global_batch_size": 8, "train_micro_batch_size": micro,
                   "max_total_sequence_length": 32, "precision": "float32", "num_threads": 1,
                   "optimizer": {"lr": 3e-3}, "max_grad_norm": 1.0, "dtensor_cfg": {"enabled": True},
                   **VARIANTS[variant]},
        "data": {"train_data_path": str(tmp_path / f"{prefix}train.jsonl"),
                 "val_data_paths": {"default": str(tmp_path / f"{prefix}val.jsonl")}},
        "checkpointing": {"enabled": False, "checkpoint_dir": str(out)},
        "logger": {"log_dir": str(out / "logs"), "tensorboard": False, "progress_bar": False, "plots": False},
    }  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def hf_scores(model_dir: Path) -> torch.Tensor:
    """Rewards `[2, 1]` of `TEXTS` from the exported directory through plain transformers."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**batch).logits


def assert_close_shift_invariant(out_a: Path, out_b: Path) -> None:
    """BERT's classifier has a bias, and the Bradley-Terry loss does not change when every reward moves by
    the same amount: the bias's gradient is 0 up to float32 rounding, which Adam turns into steps of about
    lr of either sign. The two runs' biases (and reward means) then drift apart by ~1e-3 (the same under
    DDP: 9.5e-4 observed), and the other weights by up to 4e-5 (observed 3.6e-5 under FSDP2, 3.9e-5 under
    DDP). Compared: losses and accuracies to 1e-5 relative, weights other than the bias to 1e-4."""
    a_records, b_records = records(out_a), records(out_b)
    assert [r["step"] for r in a_records] == [r["step"] for r in b_records]
    for a, b in zip(a_records, b_records):
        for key in (k for k in a if k.endswith(("loss", "acc", "num_pairs"))):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (a["step"], key)
    w1, w2 = (load_file(out / "final" / "model.safetensors") for out in (out_a, out_b))
    assert w1.keys() == w2.keys()
    for key in w1.keys() - {"classifier.bias"}:
        torch.testing.assert_close(w2[key], w1[key], rtol=0, atol=1e-4)


@pytest.mark.slow  # ~20 s each on a quiet 2-core machine (one torchrun launch, plus the in-process reference)
@pytest.mark.parametrize("variant", VARIANTS)
def test_fsdp2_two_gloo_processes_equal_one_process(tmp_path, variant):
    single = write_config(tmp_path, "single", micro=4, variant=variant)
    sharded = write_config(tmp_path, "fsdp", micro=2, variant=variant)  # per rank: 4 of the global 8, 2 micro-batches
    threads = torch.get_num_threads()
    try:  # the single-process reference runs in this process (unsharded: there is no process group)
        assert cli.main(["train", "--config", str(single)]) == 0
    finally:
        torch.set_num_threads(threads)
    err = torchrun(["-m", "rmkit", "train", "--config", str(sharded)], CHILD_ENV)
    if variant == "bert":
        assert_close_shift_invariant(tmp_path / "single", tmp_path / "fsdp")
    else:
        assert_close_runs(tmp_path / "single", tmp_path / "fsdp")
    count = "num_examples" if variant == "regression" else "num_pairs"
    val = [r for r in records(tmp_path / "fsdp") if f"validation-default/{count}" in r]
    assert val and all(r[f"validation-default/{count}"] == 21 for r in val)  # gathered from both ranks
    assert err.count("rmkit: training") == 1, "only rank 0 prints"
    for name in ("config.json", "tokenizer.json", "scoring_contract.json", "reward_stats.json"):
        assert (tmp_path / "fsdp" / "final" / name).is_file(), name
    sharded_scores, single_scores = hf_scores(tmp_path / "fsdp" / "final"), hf_scores(tmp_path / "single" / "final")
    if variant == "bert":  # the classifier bias is free (see assert_close_shift_invariant): compare differences
        sharded_scores, single_scores = sharded_scores - sharded_scores[0], single_scores - single_scores[0]
    torch.testing.assert_close(sharded_scores, single_scores, rtol=0, atol=1e-5)


def test_dtensor_config_defaults_and_checks():
    cfg = config_from_dict({"policy": {"dtensor_cfg": {"enabled": True}}, "checkpointing": {"resume": "auto"}})
    assert cfg.policy.dtensor_cfg.reshard_after_forward and cfg.policy.dtensor_cfg.param_dtype == "auto"
    assert cfg.checkpointing.enabled  # sharded checkpoints and resume: tests/recipes/test_rm_fsdp_resume.py
    with pytest.raises(ConfigError, match="param_dtype"):
        config_from_dict({"policy": {"dtensor_cfg": {"enabled": True, "param_dtype": "bfloat16"}}})
