"""Policy token sequences: the prompt as generation renders it is a prefix of every side, responses end with
the turn's end, HH transcripts become chat turns, and the truncation rule keeps a shared prompt."""

from transformers import AutoTokenizer

from rmkit.data.policy_tokenize import fit_prompt_responses, tokenize_policy_pairs
from rmkit.data.records import PreferencePair
from rmkit.data.tokenize import hh_messages, render_prompt


def test_hh_transcript_becomes_messages():
    text = "\n\nHuman: Hi there\n\nAssistant: Hello!\n\nHuman: How are you?\n\nAssistant:"
    assert hh_messages(text) == [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"},
                                 {"role": "user", "content": "How are you?"}]
    assert hh_messages("Just a question") is None


def test_pair_shares_the_generation_prompt_and_ends_each_turn(tiny_policy):
    tokenizer = AutoTokenizer.from_pretrained(tiny_policy)
    pair = PreferencePair("\n\nHuman: Name a fruit.\n\nAssistant:", " An apple.", " No.", source="f.jsonl:1")
    out = tokenize_policy_pairs([pair], tokenizer, max_length=512)
    got = out.pairs[0]
    expected_prompt = render_prompt(tokenizer, [{"role": "user", "content": "Name a fruit."}])
    assert got.prompt_ids == expected_prompt
    whole = tokenizer.apply_chat_template([{"role": "user", "content": "Name a fruit."},
                                           {"role": "assistant", "content": "An apple."}], tokenize=False)
    assert tokenizer.decode(got.prompt_ids + got.chosen_ids) == whole
    assert tokenizer.eos_token_id in got.chosen_ids and tokenizer.eos_token_id in got.rejected_ids


def test_plain_text_without_template_appends_eos(tiny_policy):
    tokenizer = AutoTokenizer.from_pretrained(tiny_policy)
    tokenizer.chat_template = None
    got = tokenize_policy_pairs([PreferencePair("Q: 2+2?", " 4", " 5")], tokenizer, 64).pairs[0]
    assert tokenizer.decode(got.prompt_ids).endswith("User: Q: 2+2?\nAssistant:")
    assert got.chosen_ids[-1] == tokenizer.eos_token_id


HH = "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Name a fruit.\n\nAssistant:"


def test_without_template_an_hh_prompt_keeps_one_set_of_roles(tiny_plain_policy):
    """DPO's pairs, SFT's demonstrations and GRPO's prompts alike: the transcript's turns in rmkit's plain roles
    (it was rendered inside a second "User: ...\\nAssistant:")."""
    from rmkit.data.demonstrations import Demonstration, tokenize_demonstrations

    tokenizer = AutoTokenizer.from_pretrained(tiny_plain_policy)
    plain = "User: Hi\nAssistant: Hello!\nUser: Name a fruit.\nAssistant:"
    assert tokenizer.decode(render_prompt(tokenizer, HH)) == plain  # GRPO renders its prompts so
    pair = tokenize_policy_pairs([PreferencePair(HH, " An apple.", " No.")], tokenizer, 64).pairs[0]
    assert tokenizer.decode(pair.prompt_ids + pair.chosen_ids) == plain + " An apple.<|im_end|>"
    (demo,) = tokenize_demonstrations([Demonstration(HH, " An apple.")], tokenizer, 64).items
    assert tokenizer.decode(demo.input_ids) == plain + " An apple.<|im_end|>"
    assert tokenizer.decode(demo.input_ids[:demo.prompt_length]) == plain


def test_truncation_keeps_prompt_end_and_response_start(tiny_policy):
    tokenizer = AutoTokenizer.from_pretrained(tiny_policy)
    prompt = [tokenizer.bos_token_id] + list(range(100, 140))
    short, long = list(range(500, 505)), list(range(600, 640))
    fitted_prompt, (a, b), cut = fit_prompt_responses(tokenizer, prompt, [short, long], 30)
    assert cut and a == short and b == long[:15]  # the prompt keeps half the budget
    assert fitted_prompt == [tokenizer.bos_token_id] + list(range(126, 140))
    assert len(fitted_prompt) + len(b) == 30
    fitted_prompt, (a, b), cut = fit_prompt_responses(tokenizer, prompt, [short, short], 30)
    assert cut and a == short and len(fitted_prompt) == 25 and fitted_prompt[-1] == 139
    pair = PreferencePair("x " * 300, "y", "z", source="f:3")
    assert tokenize_policy_pairs([pair], tokenizer, 30, overlong="drop").dropped[0][0] == "f:3"
