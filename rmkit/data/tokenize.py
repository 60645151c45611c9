"""The one way text becomes token ids: train, eval, score and serve all call these functions.

Text: `tokenizer(text, add_special_tokens=True)` ([CLS] .. [SEP] for BERT, BOS .. for decoders).
Messages: the tokenizer's chat template (or rmkit's plain "User: ...\\nAssistant: ..." rendering when
it has none). BOS is written once: a template that writes BOS itself is tokenized without the
tokenizer's special tokens, and a text that already starts with BOS does not get a second one.
A prompt for a policy to answer (`render_prompt`) ends with the template's generation prompt.

A prompt and its response stand for one input (`canonical_input`): both text -> the text
`prompt + response`; any messages -> the conversation `prompt messages + response messages` (a text
prompt is a user message, a text response an assistant message).

Over-long inputs (`max_length`) follow a policy, never silently:
- `truncate` (default). The scoring rule (`fit_inputs`, every scoring path): an input is cut on its
  own, whatever it is paired with. A conversation first loses whole oldest turns (system messages stay,
  a turn starts at a user message), so the template stays valid; what is still too long, and any text,
  keeps its leading special tokens (BOS / [CLS] / the first template token) and its last tokens (where
  the reward is read), `max_length` in all. Training pairs may instead keep the same prompt tokens on
  both sides (`tokenize_pairs(..., truncation="shared_prompt")`, the training default).
- `drop` removes the example and reports it in `.dropped` as `(source, reason)`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from rmkit.data.records import Message, PreferencePair, RegressionExample

OVERLONG = ("truncate", "drop")
PAIR_TRUNCATION = ("shared_prompt", "per_text")
PLAIN_ROLES = {"system": "System", "user": "User", "assistant": "Assistant"}
HH_TURN = re.compile(r"\n\n(Human|Assistant):")
HH_ROLES = {"Human": "user", "Assistant": "assistant"}


def _strip_double_bos(tokenizer, ids: list[int]) -> list[int]:
    bos = tokenizer.bos_token_id
    if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
        return ids[1:]
    return ids


def encode_rendered(tokenizer, rendered: Sequence[tuple[str, bool]], chunk: int = 1024) -> list[list[int]]:
    """Token ids of many `(text, add_special_tokens)` items, batched (a fast tokenizer runs a batch
    in parallel); item i gives exactly what tokenizing it alone gives."""
    out: list[list[int] | None] = [None] * len(rendered)
    for flag in (True, False):
        indices = [i for i, (_, add) in enumerate(rendered) if add is flag]
        for start in range(0, len(indices), chunk):
            part = indices[start:start + chunk]
            encoded = tokenizer([rendered[i][0] for i in part], add_special_tokens=flag)["input_ids"]
            for i, ids in zip(part, encoded):
                out[i] = _strip_double_bos(tokenizer, list(ids))
    return out


def encode_text(tokenizer, text: str) -> list[int]:
    """Token ids of `text` with the tokenizer's special tokens ([CLS]..[SEP], BOS..), BOS once."""
    return encode_rendered(tokenizer, [(text, True)])[0]


def render_plain(messages: Sequence[Message]) -> str:
    """rmkit's fallback chat rendering for tokenizers without a template: "User: hi\nAssistant: hello"."""
    return "\n".join(f"{PLAIN_ROLES.get(m['role'], m['role'].capitalize())}: {m['content']}" for m in messages)


def render_conversation(tokenizer, messages: Sequence[Message]) -> tuple[str, bool]:
    """`(text, add_special_tokens)` for chat `messages` (see `encode_conversation`)."""
    if not getattr(tokenizer, "chat_template", None):
        return render_plain(messages), True
    text = tokenizer.apply_chat_template(list(messages), tokenize=False)
    starts = [t for t in (tokenizer.bos_token, tokenizer.cls_token) if t]
    return text, bool(starts) and not any(text.startswith(t) for t in starts)


def encode_conversation(tokenizer, messages: Sequence[Message]) -> list[int]:
    """Token ids of chat `messages` rendered by the tokenizer's chat template, or `render_plain` +
    `encode_text` without one. The tokenizer's own special tokens are added only when the rendered
    text does not already start with them (a template that writes BOS gets no second BOS; an encoder
    given a template still gets its [CLS] .. [SEP])."""
    return encode_rendered(tokenizer, [render_conversation(tokenizer, messages)])[0]


def as_messages(value: str | list[Message], role: str) -> list[Message]:
    """A text as one message of `role`; messages unchanged."""
    return [{"role": role, "content": value}] if isinstance(value, str) else list(value)


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


def render_prompt(tokenizer, prompt: str | list[Message]) -> list[int]:
    """Token ids of a prompt ready for the policy to answer: the chat template with its generation prompt
    (a text is one user message), or rmkit's plain "User: ...\\nAssistant:" without a template (a text that
    carries its roles, an HH transcript, in those roles, not inside a second "User:")."""
    if getattr(tokenizer, "chat_template", None):
        return list(tokenizer.apply_chat_template(as_messages(prompt, "user"), add_generation_prompt=True,
                                                  tokenize=True, return_dict=True)["input_ids"])
    messages = (isinstance(prompt, str) and hh_messages(prompt)) or as_messages(prompt, "user")
    return encode_text(tokenizer, render_plain(messages) + "\nAssistant:")


def render_example(tokenizer, prompt: str | list[Message], response: str | list[Message] | None) -> tuple[str, bool]:
    """`(text, add_special_tokens)` for a prompt and its response (see `encode_example`)."""
    if response is None:
        return (prompt, True) if isinstance(prompt, str) else render_conversation(tokenizer, prompt)
    if isinstance(prompt, str) and isinstance(response, str):
        return prompt + response, True
    return render_conversation(tokenizer, as_messages(prompt, "user") + as_messages(response, "assistant"))


def encode_example(tokenizer, prompt: str | list[Message], response: str | list[Message] | None) -> list[int]:
    """Token ids of a prompt and its response: both text -> `encode_text(prompt + response)`; any
    messages -> `encode_conversation(prompt_msgs + response_msgs)` (a text prompt is a user message, a
    text response an assistant message); `response=None` -> the prompt alone."""
    return encode_rendered(tokenizer, [render_example(tokenizer, prompt, response)])[0]


def encode_examples(tokenizer, items: Sequence[tuple]) -> list[list[int]]:
    """`encode_example` of many `(prompt, response)` items at once (batched, same ids)."""
    return encode_rendered(tokenizer, [render_example(tokenizer, p, r) for p, r in items])


def canonical_input(prompt: str | list[Message], response: str | list[Message] | None) -> str | list[Message]:
    """The one input a prompt and its response stand for: `prompt` alone when `response` is None; both
    text -> `prompt + response`; any messages -> the conversation (text prompt = user message, text
    response = assistant message). `encode_example(prompt, response)` encodes exactly this."""
    if response is None:
        return prompt
    if isinstance(prompt, str) and isinstance(response, str):
        return prompt + response
    return as_messages(prompt, "user") + as_messages(response, "assistant")


def fit_inputs(tokenizer, inputs: Sequence[str | list[Message]], max_length: int) -> list[tuple[list[int], int]]:
    """The scoring rule: `(ids, full_length)` of each text or conversation, at most `max_length` tokens,
    each cut on its own (module docstring); `full_length > len(ids)` where it was cut. Batched."""
    encoded = encode_examples(tokenizer, [(value, None) for value in inputs])
    out = []
    for value, ids in zip(inputs, encoded):
        full_length = len(ids)
        if full_length > max_length and isinstance(value, list):
            for shorter in _oldest_turns_dropped(value):
                ids = encode_example(tokenizer, shorter, None)
                if len(ids) <= max_length:
                    break
        out.append((keep_end(tokenizer, ids, max_length), full_length))
    return out


@dataclass(frozen=True)
class TokenizedPair:
    chosen_ids: list[int]
    rejected_ids: list[int]
    margin: float | None = None
    source: str = ""


@dataclass
class TokenizedPairs:
    """`.pairs`; `.dropped` `[(source, reason)]` under `overlong="drop"`; `.truncated` how many were cut."""

    pairs: list[TokenizedPair] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    truncated: int = 0

    @property
    def lengths(self) -> list[int]:
        """Per pair, the longer side's length: a batch pads both rows of every pair to its longest."""
        return [max(len(p.chosen_ids), len(p.rejected_ids)) for p in self.pairs]


@dataclass(frozen=True)
class TokenizedExample:
    input_ids: list[int]
    labels: tuple[float, ...]
    source: str = ""


@dataclass
class TokenizedRegression:
    examples: list[TokenizedExample] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    truncated: int = 0

    @property
    def lengths(self) -> list[int]:
        return [len(e.input_ids) for e in self.examples]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _head_length(tokenizer, ids: Sequence[int], limit: int) -> int:
    """How many leading ids (at most `limit`) are special tokens (BOS, [CLS], a template's first token)."""
    special = set(tokenizer.all_special_ids)
    n = 0
    while n < limit and ids[n] in special:
        n += 1
    return n


def _cut_tokens(tokenizer, prompt, responses, fulls: list[list[int]], max_length: int) -> list[list[int]]:
    """Token-level truncation of sequences sharing `prompt`: keep the leading special tokens, the same
    newest prompt tokens on every side, and each response's end."""
    prompt_ids = encode_example(tokenizer, prompt, None)
    boundary = min(_common_prefix(full, prompt_ids) for full in fulls)
    head = _head_length(tokenizer, fulls[0], min(boundary, max_length - 1))
    budget = max_length - head
    keep = max(0, min(boundary - head, budget - max(len(full) - boundary for full in fulls)))
    out = []
    for full in fulls:
        response = full[boundary:]
        room = budget - keep
        if len(response) > room:
            response = response[len(response) - room:]
        out.append(full[:head] + full[boundary - keep: boundary] + response)
    return out


def _oldest_turns_dropped(prompt: list[Message]) -> list[list[Message]]:
    """Shorter versions of a chat prompt, each starting one whole turn later (system messages kept)."""
    system = [m for m in prompt if m["role"] == "system"]
    rest = [m for m in prompt if m["role"] != "system"]
    starts = [i for i, m in enumerate(rest) if m["role"] == "user" and i > 0]
    return [system + rest[i:] for i in starts]


def fit_example(
    tokenizer, prompt, responses: list, max_length: int, fulls: list[list[int]] | None = None
) -> tuple[list[list[int]], bool]:
    """Encode `prompt` with each of `responses` within `max_length` tokens (the `truncate` policy);
    returns the ids and whether anything was cut. `fulls`: the untruncated ids, if already known."""
    fulls = fulls or encode_examples(tokenizer, [(prompt, r) for r in responses])
    if max(len(f) for f in fulls) <= max_length:
        return fulls, False
    if isinstance(prompt, list):
        for shorter in _oldest_turns_dropped(prompt):
            prompt = shorter
            fulls = encode_examples(tokenizer, [(prompt, r) for r in responses])
            if max(len(f) for f in fulls) <= max_length:
                return fulls, True
    return _cut_tokens(tokenizer, prompt, responses, fulls, max_length), True


def _check_policy(max_length: int, overlong: str) -> None:
    if overlong not in OVERLONG:
        raise ValueError(f"overlong must be one of {OVERLONG}, got {overlong!r}")
    if max_length < 2:
        raise ValueError(f"max_length must be at least 2, got {max_length}")


def tokenize_pairs(pairs: Sequence[PreferencePair], tokenizer, max_length: int, overlong: str = "truncate",
                   truncation: str = "shared_prompt") -> TokenizedPairs:
    """Token ids for both sides of every pair, at most `max_length` each (see the module docstring).

    `truncation` (under `overlong="truncate"`): `shared_prompt` cuts a pair's two sides together, so both
    keep the same prompt tokens (training's default); `per_text` cuts each side on its own with
    `fit_inputs`, the scoring rule, so a side's ids do not depend on its partner (every scoring path)."""
    _check_policy(max_length, overlong)
    if truncation not in PAIR_TRUNCATION:
        raise ValueError(f"truncation must be one of {PAIR_TRUNCATION}, got {truncation!r}")
    out = TokenizedPairs()
    inputs = [canonical_input(pair.prompt, side) for pair in pairs for side in (pair.chosen, pair.rejected)]
    if truncation == "per_text":
        fitted = fit_inputs(tokenizer, inputs, max_length)
    else:
        fitted = [(ids, len(ids)) for ids in encode_examples(tokenizer, [(value, None) for value in inputs])]
    for k, pair in enumerate(pairs):
        (chosen, chosen_length), (rejected, rejected_length) = fitted[2 * k], fitted[2 * k + 1]
        ids = [chosen, rejected]
        if max(chosen_length, rejected_length) > max_length:
            if overlong == "drop":
                reason = f"longer than max_length {max_length} (chosen {chosen_length}, rejected {rejected_length} tokens)"
                out.dropped.append((pair.source, reason))
                continue
            if truncation == "shared_prompt":
                ids, _ = fit_example(tokenizer, pair.prompt, [pair.chosen, pair.rejected], max_length, ids)
            out.truncated += 1
        out.pairs.append(TokenizedPair(ids[0], ids[1], pair.margin, pair.source))
    return out


def tokenize_regression(
    examples: Sequence[RegressionExample], tokenizer, max_length: int, overlong: str = "truncate"
) -> TokenizedRegression:
    """Token ids of every regression example, at most `max_length`, cut by the scoring rule
    (`fit_inputs`), or dropped under `overlong="drop"`."""
    _check_policy(max_length, overlong)
    out = TokenizedRegression()
    fitted = fit_inputs(tokenizer, [canonical_input(e.prompt, e.response) for e in examples], max_length)
    for example, (ids, full_length) in zip(examples, fitted):
        cut = full_length > max_length
        if cut and overlong == "drop":
            out.dropped.append((example.source, f"longer than max_length {max_length} ({full_length} tokens)"))
            continue
        out.truncated += cut
        out.examples.append(TokenizedExample(ids, example.labels, example.source))
    return out


def keep_end(tokenizer, ids: list[int], max_length: int) -> list[int]:
    """The leading special tokens and the last tokens of `ids`, `max_length` in all."""
    if len(ids) <= max_length:
        return ids
    head = _head_length(tokenizer, ids, max_length - 1)
    return ids[:head] + ids[len(ids) - (max_length - head):]
