"""Token sequences a policy learns from: a prompt's ids and its responses' ids, and which tokens a loss trains on.

A policy answers a prompt rendered as it is at generation (`rmkit.generation.render_prompt`: the chat
template with its generation prompt, or rmkit's plain "User: ...\\nAssistant:"); the response's tokens follow
it, ending with the turn's end (EOS). The prompt's ids are a prefix of every sequence built from it, so the
two sides of a preference pair share exactly their prompt tokens. An HH-RLHF text transcript
("\\n\\nHuman: ...\\n\\nAssistant:") is read as the chat it is when the policy has a chat template.

Overlong sequences (the `truncate` policy): a response keeps its beginning (it must follow the prompt) and
is cut at its end only when it alone leaves the prompt less than half the budget; the prompt keeps its
leading special tokens and its newest tokens, the same ones for every response of the prompt.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from rmkit.data.records import Message, PreferencePair
from rmkit.data.tokenize import as_messages, keep_end
from rmkit.generation import render_prompt

HH_TURN = re.compile(r"\n\n(Human|Assistant):")
HH_ROLES = {"Human": "user", "Assistant": "assistant"}


def hh_messages(text: str) -> list[Message] | None:
    """The chat messages of an HH-RLHF transcript ("\\n\\nHuman: a\\n\\nAssistant: b\\n\\nHuman: c\\n\\nAssistant:"),
    without the final empty assistant turn; None when `text` is not one."""
    if not text.startswith("\n\nHuman:"):
        return None
    parts = HH_TURN.split(text)[1:]  # [role, content, role, content, ...]
    messages = [{"role": HH_ROLES[role], "content": content.strip()} for role, content in zip(parts[::2], parts[1::2])]
    if messages and messages[-1]["role"] == "assistant" and not messages[-1]["content"]:
        messages.pop()
    return messages


def prompt_messages(tokenizer, prompt: str | list[Message]) -> str | list[Message]:
    """`prompt` as the policy reads it: an HH transcript becomes messages when the tokenizer has a chat
    template; anything else is unchanged."""
    if isinstance(prompt, str) and getattr(tokenizer, "chat_template", None):
        return hh_messages(prompt) or prompt
    return prompt


def _response_text(response: str | list[Message]) -> str:
    if isinstance(response, str):
        return response
    if len(response) != 1 or response[0]["role"] != "assistant":
        raise ValueError("a response must be a text or one assistant message")
    return response[0]["content"]


def response_ids(tokenizer, prompt: str | list[Message], prompt_ids: Sequence[int], response: str | list[Message]) -> list[int]:
    """The ids that follow `prompt_ids` (from `render_prompt(prompt)`) when the policy answers `response`:
    with a chat template, what the template renders after the prompt (the reply, stripped of the space
    HH replies start with, and its end-of-turn tokens); without one, the reply's tokens and EOS."""
    text = _response_text(response)
    if getattr(tokenizer, "chat_template", None):
        reply = {"role": "assistant", "content": text.strip()}
        full = tokenizer.apply_chat_template(as_messages(prompt, "user") + [reply],
                                             tokenize=True, return_dict=True)["input_ids"]
        if list(full[:len(prompt_ids)]) == list(prompt_ids):
            return list(full[len(prompt_ids):])
        # A template that renders the generation prompt differently from a finished turn: the reply's
        # own tokens and EOS, so the prompt stays a prefix of the sequence.
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return list(ids) + ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])


def fit_prompt_responses(tokenizer, prompt_ids: list[int], responses: list[list[int]],
                         max_length: int) -> tuple[list[int], list[list[int]], bool]:
    """`(prompt_ids, responses, cut)` within `max_length` tokens per prompt+response (module docstring)."""
    longest = max(len(r) for r in responses)
    if len(prompt_ids) + longest <= max_length:
        return prompt_ids, responses, False
    prompt_room = min(len(prompt_ids), max(max_length - longest, max_length // 2))
    responses = [r[:max_length - prompt_room] for r in responses]
    return keep_end(tokenizer, prompt_ids, prompt_room), responses, True


@dataclass(frozen=True)
class PolicyPair:
    """A preference pair for a policy: the full sequences are `prompt_ids + chosen_ids` and
    `prompt_ids + rejected_ids`; the loss trains on the response tokens."""

    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    source: str = ""

    @property
    def length(self) -> int:
        """Tokens of the longer side."""
        return len(self.prompt_ids) + max(len(self.chosen_ids), len(self.rejected_ids))


@dataclass
class PolicyPairs:
    """`.pairs`; `.dropped` `[(source, reason)]` under `overlong="drop"`; `.truncated` how many were cut."""

    pairs: list[PolicyPair] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    truncated: int = 0


def tokenize_policy_pairs(pairs: Sequence[PreferencePair], tokenizer, max_length: int,
                          overlong: str = "truncate") -> PolicyPairs:
    """Policy token sequences of preference `pairs` (`overlong`: `truncate` or `drop`)."""
    out = PolicyPairs()
    for pair in pairs:
        prompt = prompt_messages(tokenizer, pair.prompt)
        prompt_ids = render_prompt(tokenizer, prompt)
        sides = [response_ids(tokenizer, prompt, prompt_ids, r) for r in (pair.chosen, pair.rejected)]
        fitted_prompt, fitted, cut = fit_prompt_responses(tokenizer, prompt_ids, sides, max_length)
        if cut and overlong == "drop":
            out.dropped.append((pair.source, f"longer than max_length {max_length} "
                                             f"({len(prompt_ids) + max(map(len, sides))} tokens)"))
            continue
        out.truncated += cut
        out.pairs.append(PolicyPair(fitted_prompt, fitted[0], fitted[1], pair.source))
    return out
