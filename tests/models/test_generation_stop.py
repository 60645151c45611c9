"""`SamplingParams.stop_strings`: a completion ends with the token that completes the first stop string."""

import torch

from rmkit.config import SamplingParams
from rmkit.data.tokenize import render_prompt
from rmkit.generation import generate_completions
from rmkit.models.policy import load_policy_model


def test_stop_string_ends_the_completion(tiny_policy):
    model, tokenizer = load_policy_model(tiny_policy)
    prompt = render_prompt(tokenizer, "Count to ten.")
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    ids = generate_completions(model, tokenizer, [prompt], params, torch.Generator().manual_seed(3)).ids[0]
    # the first token from the third on whose text is new: the stop string completes exactly there
    at = next(i for i in range(2, len(ids)) if tokenizer.decode([ids[i]]).strip()
              and tokenizer.decode([ids[i]]).strip() not in tokenizer.decode(ids[:i]))
    stop = tokenizer.decode([ids[at]]).strip()
    params.stop_strings = [stop]
    out = generate_completions(model, tokenizer, [prompt], params, torch.Generator().manual_seed(3))
    assert out.ids[0] == ids[:at + 1]  # the same draws, cut at the stop string
    assert out.truncated == [False] and len(out.logprobs[0]) == at + 1
