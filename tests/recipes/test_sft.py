"""SFT data and numerics: assistant masks by decoding, the loss against a per-sequence loop, exact accumulation,
padding-free packing equal to padding, and a tiny memorization run.

Tolerances: float32 throughout. The reference loop and the batched step sum the same token NLLs in a different
order (and padded vs unpadded attention), so they agree to ~1e-6 relative; 1e-5 is used. A normalization
mistake (per-micro-batch means, dividing by sequences) is off by far more (the test's sequences have different
numbers of trained tokens).
"""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from rmkit.data.policy_tokenize import demonstration_ids, fit_demonstration, response_ids
from rmkit.data.tokenize import render_prompt
from rmkit.models.policy import load_policy_model
from rmkit.recipes.sft import collate, forward_logits, sft_step

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Say hello."},
    {"role": "assistant", "content": "Hello there."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
]


@pytest.fixture(scope="module")
def policy(tiny_policy):
    model, tokenizer = load_policy_model(tiny_policy)
    return model, tokenizer


def masked_text(tokenizer, demo) -> str:
    return tokenizer.decode([t for t, m in zip(demo.input_ids, demo.token_mask) if m])


def test_assistant_masks_are_the_replies_and_their_end_of_turn(policy):
    _, tokenizer = policy
    demo = demonstration_ids(tokenizer, CONVERSATION)
    assert demo.input_ids == tokenizer.apply_chat_template(CONVERSATION, tokenize=True, return_dict=True)["input_ids"]
    assert masked_text(tokenizer, demo) == "Hello there.<|im_end|>\n4<|im_end|>\n"
    # only the final turn (NeMo RL's only_unmask_final), and every token but the first (no log-prob there)
    assert masked_text(tokenizer, demonstration_ids(tokenizer, CONVERSATION, only_final=True)) == "4<|im_end|>\n"
    everything = demonstration_ids(tokenizer, CONVERSATION, assistant_only=False)
    assert everything.token_mask == [0] + [1] * (everything.length - 1)
    # the prompt a sample generation answers is the conversation up to the last reply, as at generation
    assert demo.input_ids[:demo.prompt_length] == render_prompt(tokenizer, CONVERSATION[:4])


def test_single_turn_is_render_prompt_plus_response_ids(policy):
    _, tokenizer = policy
    prompt, reply = [{"role": "user", "content": "Hi?"}], [{"role": "assistant", "content": "Hi!"}]
    demo = demonstration_ids(tokenizer, prompt + reply)
    prompt_ids = render_prompt(tokenizer, prompt)
    assert demo.input_ids == prompt_ids + response_ids(tokenizer, prompt, prompt_ids, "Hi!")
    assert demo.token_mask == [0] * len(prompt_ids) + [1] * (demo.length - len(prompt_ids))


def test_plain_rendering_without_a_chat_template(policy):
    _, tokenizer = policy
    plain = copy.copy(tokenizer)
    plain.chat_template = None
    demo = demonstration_ids(plain, CONVERSATION)
    assert plain.decode(demo.input_ids) == ("System: Be brief.\nUser: Say hello.\nAssistant: Hello there.<|im_end|>"
                                            "\nUser: What is 2+2?\nAssistant: 4<|im_end|>")
    assert masked_text(plain, demo) == " Hello there.<|im_end|> 4<|im_end|>"


def test_truncation_keeps_the_prompt_end_and_the_reply_start(policy):
    _, tokenizer = policy
    demo = demonstration_ids(tokenizer, [{"role": "user", "content": "word " * 60},
                                         {"role": "assistant", "content": "answer " * 40}])
    fitted, cut = fit_demonstration(tokenizer, demo, 64)
    assert cut and fitted.length == 64 and sum(fitted.token_mask) >= 32
    first = demo.token_mask.index(1)
    kept_reply = fitted.input_ids[fitted.token_mask.index(1):]
    assert kept_reply == demo.input_ids[first:first + len(kept_reply)]  # the reply keeps its start


def demos_of(tokenizer, n: int, seed: int = 0):
    rng = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        words = int(torch.randint(1, 12, (1,), generator=rng))
        conversation = [{"role": "user", "content": f"question {i} " + "why " * words},
                        {"role": "assistant", "content": "because " * (13 - words) + f"{i}"}]
        if i % 2:
            conversation += [{"role": "user", "content": "more?"}, {"role": "assistant", "content": "no " * (i + 1)}]
        out.append(demonstration_ids(tokenizer, conversation))
    return out


def reference_loss(model, demos) -> torch.Tensor:
    """The slow definition: each sequence alone, the summed NLL of its trained tokens over all trained tokens."""
    total, count = 0.0, 0
    for d in demos:
        logits = model(torch.tensor([d.input_ids])).logits[0].double()
        logprobs = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(d.input_ids[1:])[:, None])[:, 0]
        mask = torch.tensor(d.token_mask[1:], dtype=torch.float64)
        total, count = total + -(logprobs * mask).sum(), count + int(mask.sum())
    return total / count


@pytest.mark.parametrize("packed", [False, True])
def test_step_loss_equals_per_sequence_reference(policy, packed):
    model, tokenizer = policy
    demos = demos_of(tokenizer, 5)
    model.zero_grad()
    metrics = sft_step(model, demos, 2, tokenizer.pad_token_id, "float32", torch.device("cpu"), packed)
    model.zero_grad()
    with torch.no_grad():
        expected = reference_loss(model, demos)
    torch.testing.assert_close(metrics["loss"].double(), expected, rtol=1e-5, atol=0)


def grads_after_step(model, demos, micro, packed, pad_id):
    model = copy.deepcopy(model)
    model.zero_grad()
    sft_step(model, demos, micro, pad_id, "float32", torch.device("cpu"), packed)
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_accumulation_and_packing_give_the_full_batch_gradient(policy):
    model, tokenizer = policy
    demos = demos_of(tokenizer, 4, seed=1)
    full = grads_after_step(model, demos, 4, False, tokenizer.pad_token_id)
    for micro, packed in [(1, False), (2, True), (4, True)]:
        other = grads_after_step(model, demos, micro, packed, tokenizer.pad_token_id)
        for name in full:
            torch.testing.assert_close(other[name], full[name], rtol=1e-4, atol=1e-7, msg=f"{name} micro {micro}")


def test_packed_rows_keep_sequences_apart(policy):
    model, tokenizer = policy
    demos = demos_of(tokenizer, 3, seed=2)
    with torch.no_grad():
        packed = forward_logits(model, collate(demos, tokenizer.pad_token_id, packed=True))[0]
        alone = torch.cat([model(torch.tensor([d.input_ids])).logits[0] for d in demos])
    torch.testing.assert_close(packed, alone, rtol=1e-4, atol=1e-5)


def test_loss_decreases_on_a_memorization_set(tiny_policy):
    model, tokenizer = load_policy_model(tiny_policy)
    demos = demos_of(tokenizer, 4, seed=3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(25):
        optimizer.zero_grad()
        losses.append(float(sft_step(model, demos, 2, tokenizer.pad_token_id, "float32", torch.device("cpu"))["loss"]))
        optimizer.step()
    assert losses[-1] < 0.3 * losses[0], losses


def test_export_loads_as_causal_lm(tmp_path, policy):
    from rmkit.trainer.export import export_policy

    model, tokenizer = policy
    export_policy(model, tokenizer, tmp_path / "final")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    ids = torch.tensor([demos_of(tokenizer, 1)[0].input_ids])
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits)


def test_template_whose_prefixes_disagree_is_an_error_naming_the_record(policy):
    from rmkit.data.demonstrations import Demonstration, tokenize_demonstrations
    from rmkit.errors import DataError

    _, tokenizer = policy
    hiding = copy.copy(tokenizer)  # renders only the last assistant reply (as templates that drop old reasoning)
    hiding.chat_template = ("{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}A: ...\n"
                            "{% else %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}"
                            "{% if add_generation_prompt %}assistant: {% endif %}")
    demos = [Demonstration(CONVERSATION, None, "demos.jsonl:7")]
    with pytest.raises(DataError) as err:
        tokenize_demonstrations(demos, hiding, 512)
    assert (err.value.path, err.value.line, err.value.field) == ("demos.jsonl", 7, "messages")
    skipped = tokenize_demonstrations(demos, hiding, 512, on_error="skip")
    assert not skipped.items and skipped.dropped[0][0] == "demos.jsonl:7"


def test_hh_transcript_prompt_is_read_as_chat_turns(policy):
    from rmkit.data.demonstrations import Demonstration, tokenize_demonstrations

    _, tokenizer = policy
    hh = Demonstration("\n\nHuman: Hi\n\nAssistant: Hello.\n\nHuman: Bye\n\nAssistant:", " Goodbye!", "hh.jsonl:1")
    demo = tokenize_demonstrations([hh], tokenizer, 512).items[0]
    expected = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Goodbye!"}]
    assert demo.input_ids == tokenizer.apply_chat_template(expected, tokenize=True, return_dict=True)["input_ids"]
    assert masked_text(tokenizer, demo) == "Goodbye!<|im_end|>\n"  # the prompt's earlier reply is context
