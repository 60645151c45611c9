"""Completions from a policy: greedy equals an argmax loop, log-probs equal a teacher-forced forward,
batching (left padding) changes nothing, and a seeded generator reproduces the same samples."""

import torch

from rmkit.config import SamplingParams
from rmkit.data.tokenize import render_prompt
from rmkit.generation import generate_completions
from rmkit.models.policy import load_policy_model


def _argmax_loop(model, prompt, steps, eos):
    ids = list(prompt)
    for _ in range(steps):
        with torch.no_grad():
            nxt = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        ids.append(nxt)
        if nxt == eos:
            break
    return ids[len(prompt):]


def test_greedy_batched_equals_one_by_one_argmax_and_logprobs_match_forward(tiny_policy):
    model, tokenizer = load_policy_model(tiny_policy)
    prompts = [render_prompt(tokenizer, "Tell me about rivers."),
               render_prompt(tokenizer, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])]
    assert len(prompts[0]) != len(prompts[1])  # so the batch really is left-padded
    out = generate_completions(model, tokenizer, prompts, SamplingParams(max_new_tokens=6, temperature=0))
    for prompt, ids, logprobs in zip(prompts, out.ids, out.logprobs):
        assert ids == _argmax_loop(model, prompt, 6, tokenizer.eos_token_id)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1]
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
        torch.testing.assert_close(logprobs, expected, rtol=1e-4, atol=1e-4)  # KV cache vs full forward
    assert out.truncated == [tokenizer.eos_token_id not in ids for ids in out.ids]


def test_sampling_logprobs_carry_the_temperature_and_a_generator_reproduces(tiny_policy):
    model, tokenizer = load_policy_model(tiny_policy)
    prompt = render_prompt(tokenizer, "Name a colour.")
    params = SamplingParams(max_new_tokens=5, temperature=0.7)
    runs = [generate_completions(model, tokenizer, [prompt] * 3, params, torch.Generator().manual_seed(7)) for _ in range(2)]
    assert runs[0].ids == runs[1].ids
    ids = runs[0].ids[0]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1] / 0.7
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
    torch.testing.assert_close(runs[0].logprobs[0], expected, rtol=1e-4, atol=1e-4)


def test_plain_prompt_without_a_chat_template(tiny_policy):
    _, tokenizer = load_policy_model(tiny_policy)
    tokenizer.chat_template = None
    assert tokenizer.decode(render_prompt(tokenizer, "Hi")).endswith("User: Hi\nAssistant:")


def _check_prompt_forwards(model, tokenizer, prompts) -> list[tuple[int, ...]]:
    """Generate greedily and sampled from `prompts`: every greedy row equals an argmax loop and every sampled
    row's log-probs a teacher-forced forward. Returns the shapes the embeddings saw in the greedy run."""
    embedded = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, args, out: embedded.append(tuple(args[0].shape)))
    try:
        greedy = generate_completions(model, tokenizer, prompts, SamplingParams(max_new_tokens=4, temperature=0))
    finally:
        hook.remove()
    for prompt, ids in zip(prompts, greedy.ids):
        assert ids == _argmax_loop(model, prompt, 4, tokenizer.eos_token_id)
    params = SamplingParams(max_new_tokens=5, temperature=0.7)
    sampled = generate_completions(model, tokenizer, prompts, params, torch.Generator().manual_seed(3))
    for prompt, ids, logprobs in zip(prompts, sampled.ids, sampled.logprobs):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1] / 0.7
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
        torch.testing.assert_close(logprobs, expected, rtol=1e-4, atol=1e-4)
    return embedded


def test_a_repeated_prompt_is_computed_once_and_every_row_still_matches_a_forward(tiny_policy):
    model, tokenizer = load_policy_model(tiny_policy)
    short, long = render_prompt(tokenizer, "Hi"), render_prompt(tokenizer, "Tell me three things about rivers.")
    prompts = [long, long, short, short, long]  # two distinct prompts, left-padded, interleaved
    embedded = _check_prompt_forwards(model, tokenizer, prompts)
    assert embedded[0] == (2, len(long) - 1)  # the prompts' forward: each distinct prompt once
    assert embedded[1] == (5, 1)  # then every row goes on from the shared cache with its prompt's last token


def test_prompts_of_unlike_lengths_are_computed_in_chunks_and_every_row_still_matches_a_forward(tiny_policy):
    model, tokenizer = load_policy_model(tiny_policy)
    long = render_prompt(tokenizer, "Tell me about rivers, lakes and seas. " * 12)
    short = [render_prompt(tokenizer, text) for text in ("Hi", "Name a colour.", "Hi")]
    prompts = [short[0], long, short[1], short[2]]  # a repeated prompt, and one far longer than the rest
    embedded = _check_prompt_forwards(model, tokenizer, prompts)
    # the long prompt alone, then the two distinct short ones padded to the longer of them, not to the long one
    assert embedded[:2] == [(1, len(long) - 1), (2, max(map(len, short)) - 1)]
    assert embedded[2] == (4, 1)  # then every row goes on from the assembled cache with its prompt's last token


def test_non_finite_logits_stop_generation_with_training_diverged(tiny_policy):
    """Sampling from NaN logits would crash inside torch.multinomial ("probability tensor contains either inf,
    nan or element < 0"); generation instead finishes and raises TrainingDiverged, greedy or sampled."""
    import pytest

    from rmkit.errors import TrainingDiverged

    model, tokenizer = load_policy_model(tiny_policy)
    with torch.no_grad():
        model.get_output_embeddings().weight[5].fill_(float("nan"))  # one vocabulary row: NaN logits for it
    prompts = [render_prompt(tokenizer, "Tell me about rivers.")] * 2
    for temperature in (1.0, 0.0):
        with pytest.raises(TrainingDiverged, match="logits became NaN or infinite"):
            generate_completions(model, tokenizer, prompts, SamplingParams(max_new_tokens=4, temperature=temperature),
                                 torch.Generator().manual_seed(0))


def _caches_generate_gets(model) -> list:
    """Wrap `model.generate` to record the cache object of each call (None: generate builds its own)."""
    seen, generate = [], model.generate

    def recording(**kwargs):
        seen.append(kwargs.get("cache", kwargs.get("past_key_values")))
        return generate(**kwargs)

    model.generate = recording
    return seen


def test_the_cache_is_allocated_once_for_the_prompt_and_every_new_token(tiny_policy):
    """A static cache (no per-token concatenation of every layer's keys and values): as long as the padded prompt
    plus max_new_tokens, whether the prompts were computed ahead (a repeated prompt) or by generate's prefill."""
    from transformers import StaticCache

    model, tokenizer = load_policy_model(tiny_policy)
    seen = _caches_generate_gets(model)
    short, long = render_prompt(tokenizer, "Hi"), render_prompt(tokenizer, "Tell me three things about rivers.")
    for prompts in ([long, short, long], [long, short]):
        _check_prompt_forwards(model, tokenizer, prompts)
    assert len(seen) == 4 and all(isinstance(cache, StaticCache) for cache in seen)
    assert [cache.layers[0].max_cache_len for cache in seen] == [len(long) + 4, len(long) + 5] * 2

    model.generation_config.cache_implementation = "dynamic"  # generate refuses a cache object beside one it names
    seen.clear()
    _check_prompt_forwards(model, tokenizer, [long, short])
    assert seen == [None, None]


def test_a_model_with_sliding_window_layers_keeps_the_growing_cache(tiny_policy, tmp_path):
    """A static cache keeps only a window in sliding layers, laid out otherwise than by position: such a model
    generates from transformers' growing cache, and every row still matches an argmax loop and a forward."""
    from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

    _, tokenizer = load_policy_model(tiny_policy)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=8,
                         max_window_layers=1, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    assert config.layer_types == ["full_attention", "sliding_attention"]
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "sliding")
    tokenizer.save_pretrained(tmp_path / "sliding")
    model, tokenizer = load_policy_model(str(tmp_path / "sliding"))
    seen = _caches_generate_gets(model)
    short, long = render_prompt(tokenizer, "Hi"), render_prompt(tokenizer, "Tell me three things about rivers.")
    _check_prompt_forwards(model, tokenizer, [long, short, long])
    assert seen and all(isinstance(cache, DynamicCache) for cache in seen)
