"""The exported directory reproduces rmkit's rewards through plain transformers (within 1e-5)."""

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rmkit.config import load_config
from rmkit.models import compute_rewards, load_reward_model
from rmkit.models.setup import prepare_model
from rmkit.trainer.export import export_model, reward_stats

TEXTS = ["What is 2 plus 2? It is 4.", "Hi", "A longer text that certainly has more tokens than the others do."]


def _rmkit_rewards(model, tokenizer):
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.inference_mode():
        return compute_rewards(model, batch["input_ids"], batch["attention_mask"])


def _plain_rewards(path):
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    with torch.inference_mode():  # one text at a time, the way a user would call it
        return torch.cat([model(**tokenizer(t, return_tensors="pt")).logits for t in TEXTS])


@pytest.mark.parametrize("fixture", ["tiny_decoder", "tiny_encoder"])
def test_export_round_trip_through_plain_transformers(fixture, request, tmp_path):
    model, tokenizer = load_reward_model(request.getfixturevalue(fixture), num_labels=1)
    model.eval()
    cfg = load_config(None)
    stats = reward_stats({"v": (torch.tensor([1.0, 2.0]), torch.tensor([0.0, -1.0]))})
    out = export_model(model, tokenizer, tmp_path / "final", cfg, stats)
    assert (out / "model.safetensors").is_file() and (out / "rmkit_config.yaml").is_file()
    assert json.loads((out / "reward_stats.json").read_text())["mean"] == pytest.approx(0.5)
    torch.testing.assert_close(_plain_rewards(out), _rmkit_rewards(model, tokenizer), rtol=0, atol=1e-5)


def test_lora_is_merged_and_the_head_is_saved(tiny_decoder, tmp_path):
    cfg = load_config(None, ["policy.lora.enabled=true", "policy.lora.r=4"])
    model, tokenizer = load_reward_model(tiny_decoder, num_labels=1)
    peft_model = prepare_model(model, cfg.policy)
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert any("lora_" in n for n in trainable) and any("score" in n for n in trainable)
    with torch.no_grad():  # make the adapters and the head differ from the base so the merge matters
        for p in peft_model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    inner = peft_model.get_base_model()
    expected = _rmkit_rewards(inner, tokenizer)
    out = export_model(peft_model, tokenizer, tmp_path / "final")
    with safe_open(out / "model.safetensors", "pt") as weights:
        keys = list(weights.keys())
    assert "score.weight" in keys and not any("lora" in k or "modules_to_save" in k for k in keys)
    torch.testing.assert_close(_plain_rewards(out), expected, rtol=0, atol=1e-5)
    # the training model keeps its adapters (export merged a copy)
    assert any("lora_" in n for n, _ in peft_model.named_parameters())


def test_every_exported_file_is_readable_as_the_umask_allows(tiny_encoder, tmp_path):
    """transformers writes model.safetensors through a 0600 temporary file; the export gives it the mode any new
    file gets (0644 under umask 022), like the config beside it."""
    import os

    model, tokenizer = load_reward_model(tiny_encoder, num_labels=1)
    old = os.umask(0o022)
    try:
        out = export_model(model, tokenizer, tmp_path / "final", load_config(None))
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes
