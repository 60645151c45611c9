"""The scoring contract: what the export writes, what every path reads, and the one truncation rule."""

import json

import pytest
import torch
import yaml
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rmkit.data.records import PreferencePair
from rmkit.data.tokenize import encode_text, fit_inputs
from rmkit.errors import ConfigError
from rmkit.inference import CONTRACT_FILE, load_scorer, read_contract
from rmkit.models import load_reward_model
from rmkit.trainer.export import export_model


@pytest.fixture
def exported(tiny_decoder, tmp_path):
    model, tokenizer = load_reward_model(tiny_decoder, num_labels=1)
    with torch.no_grad():
        model.score.weight.normal_(0.0, 1.0)  # a visible spread of rewards
    from rmkit.config import load_config

    cfg = load_config(None, ["policy.max_total_sequence_length=16"])
    return export_model(model.eval(), tokenizer, tmp_path / "final", cfg, {"mean": 0.25, "std": 2.0})


def test_export_writes_the_contract_every_path_reads(exported):
    values = json.loads((exported / CONTRACT_FILE).read_text())
    assert values["max_length"] == 16 and values["padding_side"] == "right"
    assert values["reward_position"] == "last_real_token" and values["num_labels"] == 1
    assert (values["reward_mean"], values["reward_std"]) == (0.25, 2.0)
    assert values["chat_template"] == "plain" and values["chat_template_sha256"] is None  # MiniLM has none
    assert load_scorer(exported).max_length == 16  # no flag needed
    assert load_scorer(exported, max_length=8).max_length == 8  # an explicit override wins


def test_a_reward_depends_on_its_text_alone(exported):
    """Pair sides are cut on their own: the chosen side's reward does not move with a long partner."""
    scorer = load_scorer(exported)
    prompt, short = "What is two plus two? ", "Four."
    long_reply = "It is four, " + "and that is the answer " * 20
    alone = scorer.score([prompt + short])[0]
    pairs = scorer.encode_pairs([PreferencePair(prompt, short, long_reply), PreferencePair(prompt, short, "Four!")])
    assert pairs.pairs[0].chosen_ids == pairs.pairs[1].chosen_ids == scorer.encode([prompt + short])[0][0]
    torch.testing.assert_close(scorer.score_ids([pairs.pairs[0].chosen_ids])[0], alone, rtol=0, atol=0)
    assert pairs.truncated == 1 and len(pairs.pairs[0].rejected_ids) == 16


def test_plain_transformers_gives_the_same_rewards_under_the_limit(exported):
    scorer = load_scorer(exported)
    texts = ["Hi there.", "What is the capital of France? Paris."]
    model = AutoModelForSequenceClassification.from_pretrained(exported).eval()
    tokenizer = AutoTokenizer.from_pretrained(exported)
    with torch.inference_mode():
        plain = torch.cat([model(**tokenizer(t, return_tensors="pt")).logits for t in texts])
    torch.testing.assert_close(scorer.score(texts), plain, rtol=0, atol=1e-5)


def test_truncation_keeps_the_leading_special_tokens_and_the_end(exported):
    scorer = load_scorer(exported)
    text = " ".join(f"word{i}" for i in range(40))
    full = encode_text(scorer.tokenizer, text)
    (ids, full_length), = fit_inputs(scorer.tokenizer, [text], 16)
    assert full_length == len(full) > 16 and ids == full[:1] + full[-15:]


def test_conversations_lose_whole_oldest_turns_first(exported):
    scorer = load_scorer(exported)
    old = [{"role": "user", "content": "tell me a long story " * 3}, {"role": "assistant", "content": "no"}]
    last = [{"role": "user", "content": "capital of France?"}, {"role": "assistant", "content": "Paris"}]
    (ids, _), = scorer.encode([old + last])
    assert ids == scorer.encode([last])[0][0]


def test_directories_without_a_contract_derive_one(tiny_encoder, tmp_path):
    model, tokenizer = load_reward_model(tiny_encoder)
    assert read_contract(tiny_encoder, model, tokenizer).max_length == 512  # BERT's position limit
    legacy = tmp_path / "legacy"
    model.save_pretrained(legacy)
    tokenizer.save_pretrained(legacy)
    (legacy / "rmkit_config.yaml").write_text(yaml.safe_dump({"policy": {"max_total_sequence_length": 64}}))
    (legacy / "reward_stats.json").write_text(json.dumps({"mean": 1.0, "std": 3.0}))
    contract = read_contract(legacy, model, tokenizer)
    assert (contract.max_length, contract.reward_mean, contract.reward_std) == (64, 1.0, 3.0)
    assert contract.reward_position == "first_token"


def test_a_bad_or_mismatched_contract_is_refused(exported):
    path = exported / CONTRACT_FILE
    values = json.loads(path.read_text())
    path.write_text(json.dumps({**values, "max_lenght": 3}))
    with pytest.raises(ConfigError, match="unknown key 'max_lenght'"):
        load_scorer(exported)
    path.write_text(json.dumps({**values, "chat_template_sha256": "0" * 64}))
    with pytest.raises(ConfigError, match="chat template is not the one"):
        load_scorer(exported)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_scorer(exported)
