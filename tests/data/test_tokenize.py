"""encode_* and the over-long policies, on a character tokenizer (1 char = 1 token, BOS first)."""

import pytest

from rmkit.data.records import PreferencePair, RegressionExample
from rmkit.data.tokenize import (
    encode_conversation,
    encode_example,
    encode_text,
    render_plain,
    tokenize_pairs,
    tokenize_regression,
)

from .conftest import char_tokenizer

CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]


def test_encode_text_adds_bos_once(char_tok):
    bos = char_tok.bos_token_id
    assert encode_text(char_tok, "ab") == [bos] + char_tok.convert_tokens_to_ids(["a", "b"])
    # A text that already starts with BOS keeps a single one.
    assert encode_text(char_tok, "<s>ab") == encode_text(char_tok, "ab")


def test_chat_template_that_writes_bos_gives_one_bos(char_tok):
    ids = encode_conversation(char_tok, CHAT)
    assert ids.count(char_tok.bos_token_id) == 1 and ids[0] == char_tok.bos_token_id
    text = char_tok.apply_chat_template(CHAT, tokenize=False)
    assert char_tok.decode(ids, skip_special_tokens=False).replace(" ", "") == text.replace(" ", "")


def test_template_without_bos_gets_the_tokenizers_bos():
    tok = char_tokenizer(chat_template="{% for m in messages %}{{ m['content'] }};{% endfor %}")
    assert encode_conversation(tok, CHAT) == encode_text(tok, "hi;yo;")


def test_no_template_uses_plain_rendering():
    tok = char_tokenizer(chat_template=None)
    assert render_plain(CHAT) == "User: hi\nAssistant: yo"
    assert encode_conversation(tok, CHAT) == encode_text(tok, "User: hi\nAssistant: yo")


def test_encode_example_branches(char_tok):
    assert encode_example(char_tok, "ab", "cd") == encode_text(char_tok, "abcd")
    assert encode_example(char_tok, "ab", None) == encode_text(char_tok, "ab")
    as_chat = encode_conversation(char_tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    assert encode_example(char_tok, "hi", [CHAT[1]]) == as_chat
    assert encode_example(char_tok, [CHAT[0]], "yo") == as_chat
    assert encode_example(char_tok, CHAT, None) == as_chat


def test_minilm_encodes_cls_sep(minilm_tok):
    ids = encode_text(minilm_tok, "hello world")
    assert ids[0] == minilm_tok.cls_token_id and ids[-1] == minilm_tok.sep_token_id
    # An encoder given a chat template still gets [CLS] .. [SEP].
    minilm_tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    try:
        ids = encode_conversation(minilm_tok, CHAT)
    finally:
        minilm_tok.chat_template = None
    assert ids[0] == minilm_tok.cls_token_id and ids[-1] == minilm_tok.sep_token_id


def test_short_pairs_are_untouched(char_tok):
    out = tokenize_pairs([PreferencePair("p", "c", "rr", 1.5, "f:1")], char_tok, max_length=16)
    (pair,) = out.pairs
    assert pair.chosen_ids == encode_text(char_tok, "pc") and pair.rejected_ids == encode_text(char_tok, "prr")
    assert (pair.margin, pair.source, out.truncated, out.dropped) == (1.5, "f:1", 0, [])
    assert out.lengths == [4]


def test_truncate_text_pair_keeps_response_end_and_same_prompt_tokens(char_tok):
    pair = PreferencePair("0123456789", "abc", "wxyz", None, "f:1")
    out = tokenize_pairs([pair], char_tok, max_length=8)
    (got,) = out.pairs
    bos = [char_tok.bos_token_id]
    # Budget 8 - BOS = 7; the longer response has 4 tokens, so 3 prompt tokens (the newest) stay.
    assert got.chosen_ids == bos + encode_text(char_tok, "789abc")[1:]
    assert got.rejected_ids == bos + encode_text(char_tok, "789wxyz")[1:]
    assert len(got.rejected_ids) == 8 and out.truncated == 1


def test_truncate_overlong_response_keeps_its_end(char_tok):
    out = tokenize_pairs([PreferencePair("pp", "abcdefghij", "z", None, "f:1")], char_tok, max_length=5)
    (got,) = out.pairs
    assert got.chosen_ids == [char_tok.bos_token_id] + encode_text(char_tok, "ghij")[1:]
    assert got.rejected_ids == [char_tok.bos_token_id] + encode_text(char_tok, "z")[1:]


def test_drop_policy_reports(char_tok):
    pairs = [PreferencePair("p", "c", "r", None, "f:1"), PreferencePair("p" * 20, "c", "r", None, "f:2")]
    out = tokenize_pairs(pairs, char_tok, max_length=8, overlong="drop")
    assert [p.source for p in out.pairs] == ["f:1"]
    assert out.dropped[0][0] == "f:2" and "max_length 8" in out.dropped[0][1]


def test_chat_truncation_drops_whole_oldest_turns(char_tok):
    prompt = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "old question " * 3},
        {"role": "assistant", "content": "old answer " * 3},
        {"role": "user", "content": "new?"},
    ]
    chosen, rejected = [{"role": "assistant", "content": "yes"}], [{"role": "assistant", "content": "no"}]
    full = len(encode_example(char_tok, prompt, chosen))
    short_prompt = [prompt[0], prompt[3]]
    limit = len(encode_example(char_tok, short_prompt, chosen))
    assert limit < full
    out = tokenize_pairs([PreferencePair(prompt, chosen, rejected, None, "f:1")], char_tok, max_length=limit)
    (got,) = out.pairs
    assert got.chosen_ids == encode_example(char_tok, short_prompt, chosen)
    assert got.rejected_ids == encode_example(char_tok, short_prompt, rejected)
    assert out.truncated == 1


def test_chat_last_turn_too_long_cuts_tokens_after_the_head(char_tok):
    prompt = [{"role": "user", "content": "x" * 50}]
    chosen = [{"role": "assistant", "content": "yes"}]
    out = tokenize_pairs([PreferencePair(prompt, chosen, "no", None, "f:1")], char_tok, max_length=30)
    (got,) = out.pairs
    full = encode_example(char_tok, prompt, chosen)
    assert len(got.chosen_ids) == 30 and got.chosen_ids[:2] == full[:2]  # BOS, <|im_start|>
    assert got.chosen_ids[-10:] == full[-10:]  # the response end is whole
    assert got.chosen_ids.count(char_tok.bos_token_id) == 1


def test_pairs_with_minilm_stay_within_max_length(minilm_tok):
    pair = PreferencePair("word " * 100, "good answer", "bad answer here", None, "f:1")
    (got,) = tokenize_pairs([pair], minilm_tok, max_length=32).pairs
    for ids, reply in ((got.chosen_ids, "good answer"), (got.rejected_ids, "bad answer here")):
        assert len(ids) <= 32 and ids[0] == minilm_tok.cls_token_id and ids[-1] == minilm_tok.sep_token_id
        assert minilm_tok.decode(ids, skip_special_tokens=True).endswith(reply)
    # Both sides keep the same prompt tokens.
    assert got.chosen_ids[1:10] == got.rejected_ids[1:10]


def test_regression_truncate_and_drop(char_tok):
    examples = [RegressionExample("a" * 20, None, (1.0, -100.0), "f:1"), RegressionExample("q", "r", (2.0, 3.0), "f:2")]
    out = tokenize_regression(examples, char_tok, max_length=6)
    assert out.examples[0].input_ids == [char_tok.bos_token_id] + encode_text(char_tok, "aaaaa")[1:]
    assert out.examples[1].input_ids == encode_text(char_tok, "qr") and out.truncated == 1
    dropped = tokenize_regression(examples, char_tok, max_length=6, overlong="drop")
    assert [e.source for e in dropped.examples] == ["f:2"] and dropped.dropped[0][0] == "f:1"


def test_bad_policy_is_rejected(char_tok):
    with pytest.raises(ValueError, match="overlong"):
        tokenize_pairs([], char_tok, max_length=8, overlong="cut")


def test_batched_encoding_matches_one_at_a_time(char_tok, minilm_tok):
    from rmkit.data.tokenize import encode_examples

    items = [("ab", "cd"), (CHAT[:1], "yo"), ("hi", None), (CHAT, None), ("<s>x", "y")]
    for tok in (char_tok, minilm_tok):
        assert encode_examples(tok, items) == [encode_example(tok, p, r) for p, r in items]


def test_chat_pairs_have_one_bos(char_tok):
    pair = PreferencePair(CHAT[:1], [CHAT[1]], "nope", None, "f:1")
    for max_length in (100, 12):
        (got,) = tokenize_pairs([pair], char_tok, max_length=max_length).pairs
        for ids in (got.chosen_ids, got.rejected_ids):
            assert ids[0] == char_tok.bos_token_id and ids.count(char_tok.bos_token_id) == 1
            assert len(ids) <= max_length
