"""Token sequences a policy learns from: a prompt's ids and its responses' ids, and which tokens a loss trains on.

A policy answers a prompt rendered as it is at generation (`rmkit.data.tokenize.render_prompt`: the chat
template with its generation prompt, or rmkit's plain "User: ...\\nAssistant:"); the response's tokens follow
it, ending with the turn's end (EOS). The prompt's ids are a prefix of every sequence built from it, so the
two sides of a preference pair share exactly their prompt tokens. An HH-RLHF text transcript
("\\n\\nHuman: ...\\n\\nAssistant:") is read as the chat it is, its roles rendered once (by the chat template,
or as rmkit's plain "User:" / "Assistant:").

Overlong sequences (the `truncate` policy): a response keeps its beginning (it must follow the prompt) and
is cut at its end only when it alone leaves the prompt less than half the budget; the prompt keeps its
leading special tokens and its newest tokens, the same ones for every response of the prompt.

Demonstrations (SFT) are whole conversations: `demonstration_ids` finds each assistant turn's tokens by
rendering the conversation prefix by prefix, so a single-turn demonstration is exactly `render_prompt` +
`response_ids`, and `fit_demonstration` cuts it by the same rule; a plain-text document (`document_ids`) is
trained on every token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rmkit.data.records import Message, PreferencePair
from rmkit.data.tokenize import as_messages, encode_text, hh_messages, keep_end, render_plain, render_prompt


def prompt_messages(prompt: str | list[Message]) -> str | list[Message]:
    """`prompt` as the policy reads it: an HH transcript becomes its messages (`hh_messages`), so its roles are
    rendered once (by the chat template, or rmkit's plain "User:" / "Assistant:"); anything else is unchanged."""
    return (hh_messages(prompt) or prompt) if isinstance(prompt, str) else prompt


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
    """`.pairs`; `.dropped` `[(source, reason)]` under `overlong="drop"`; `.truncated` how many were cut, and
    `.emptied` how many of those kept nothing of their prompt (what is left of it is what is left of an empty
    prompt: the chat template's or the plain rendering's own tokens)."""

    pairs: list[PolicyPair] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)
    truncated: int = 0
    emptied: int = 0


def tokenize_policy_pairs(pairs: Sequence[PreferencePair], tokenizer, max_length: int,
                          overlong: str = "truncate") -> PolicyPairs:
    """Policy token sequences of preference `pairs` (`overlong`: `truncate` or `drop`)."""
    out, empty = PolicyPairs(), render_prompt(tokenizer, "")
    for pair in pairs:
        prompt = prompt_messages(pair.prompt)
        prompt_ids = render_prompt(tokenizer, prompt)
        sides = [response_ids(tokenizer, prompt, prompt_ids, r) for r in (pair.chosen, pair.rejected)]
        fitted_prompt, fitted, cut = fit_prompt_responses(tokenizer, prompt_ids, sides, max_length)
        if cut and overlong == "drop":
            out.dropped.append((pair.source, f"longer than max_length {max_length} "
                                             f"({len(prompt_ids) + max(map(len, sides))} tokens)"))
            continue
        out.truncated += cut
        out.emptied += cut and prompt_ids != empty and fitted_prompt == keep_end(tokenizer, empty, len(fitted_prompt))
        out.pairs.append(PolicyPair(fitted_prompt, fitted[0], fitted[1], pair.source))
    return out


# ------------------------------------------------------------------------- demonstrations (SFT)


class TemplateMismatch(ValueError):
    """The chat template renders a conversation's prefix differently from the start of the whole
    conversation, so its assistant turns cannot be found by prefix (e.g. a template that drops earlier
    turns' reasoning)."""


@dataclass(frozen=True)
class DemonstrationIds:
    """A demonstration as a policy reads it: `input_ids` and `token_mask` (aligned, 1 = trained on;
    position 0 is never trained on, docs/design.md), and `prompt_length`, where the last assistant turn
    starts (its tokens before it are the prompt a sample generation answers)."""

    input_ids: list[int]
    token_mask: list[int]
    prompt_length: int
    source: str = ""

    @property
    def length(self) -> int:
        return len(self.input_ids)


def demonstration_messages(tokenizer, prompt: str | list[Message],
                           response: str | list[Message] | None) -> tuple[list[Message], int]:
    """`(conversation, first)`: the messages of a demonstration and the index of the first one a loss may train
    on. `prompt` alone is the whole conversation when `response` is None (`first` 0: every assistant turn);
    else the prompt read as at generation (`prompt_messages`: an HH transcript becomes chat turns, which stay
    context) followed by the response as assistant turn(s), `first` pointing at it; a response text is
    stripped of surrounding space under a chat template, as `response_ids` does."""
    if response is None:
        return as_messages(prompt, "user"), 0
    if isinstance(response, str):
        text = response.strip() if getattr(tokenizer, "chat_template", None) else response
        response = [{"role": "assistant", "content": text}]
    context = as_messages(prompt_messages(prompt), "user")
    return context + list(response), len(context)


def _template_ids(tokenizer, messages: list[Message], turns: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    def render(msgs, generation_prompt=False):
        return list(tokenizer.apply_chat_template(msgs, add_generation_prompt=generation_prompt, tokenize=True,
                                                  return_dict=True)["input_ids"])

    full, spans = render(messages), []
    for k in turns:
        before, after = render(messages[:k], True), render(messages[:k + 1])
        if full[:len(before)] != before or full[:len(after)] != after:
            raise TemplateMismatch(f"the chat template renders the conversation up to message {k} differently "
                                   "from the start of the whole conversation")
        spans.append((len(before), len(after)))
    return full, spans


def _plain_ids(tokenizer, messages: list[Message], turns: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """rmkit's plain rendering turn by turn: the first assistant turn follows `render_prompt` of what precedes
    it; each reply is its text (a space after "Assistant:") and EOS; later context is "\\nUser: ...\\nAssistant:"."""
    ids, spans, start = [], [], 0
    for k in turns:
        context = messages[start:k]
        if start == 0:
            ids = render_prompt(tokenizer, context) if context else encode_text(tokenizer, "Assistant:")
        else:
            text = ("\n" + render_plain(context) if context else "") + "\nAssistant:"
            ids += tokenizer(text, add_special_tokens=False)["input_ids"]
        content = messages[k]["content"]
        reply = content if content[:1].isspace() else " " + content
        reply_ids = list(tokenizer(reply, add_special_tokens=False)["input_ids"])
        reply_ids += [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        spans.append((len(ids), len(ids) + len(reply_ids)))
        ids, start = ids + reply_ids, k + 1
    return ids, spans


def demonstration_ids(tokenizer, messages: list[Message], assistant_only: bool = True,
                      only_final: bool = False, source: str = "", first: int = 0) -> DemonstrationIds:
    """Token ids and loss mask of a conversation (at least one assistant turn, not the first message):
    with a chat template, each assistant turn's tokens are found by rendering the conversation prefix by
    prefix (the reply and the turn's end-of-turn tokens; `TemplateMismatch` when prefixes disagree with the
    whole rendering); without one, rmkit's plain rendering (`_plain_ids`). Messages after the last assistant
    turn teach nothing and are left out. `assistant_only=False` trains on every token; `only_final` on the
    last assistant turn alone (NeMo RL's `only_unmask_final`); assistant turns before message `first` are
    context, never trained on."""
    turns = [k for k, m in enumerate(messages) if m["role"] == "assistant" and k >= first]
    if not turns:
        raise ValueError("no assistant message to learn from")
    if turns[0] == 0:
        raise ValueError("the conversation starts with an assistant message; a reply needs a prompt before it")
    messages = list(messages[:turns[-1] + 1])
    render = _template_ids if getattr(tokenizer, "chat_template", None) else _plain_ids
    ids, spans = render(tokenizer, messages, turns)
    mask = [0] * len(ids)
    for start, end in spans[-1:] if only_final else spans:
        mask[start:end] = [1] * (end - start)
    if not assistant_only:
        mask = [1] * len(ids)
    mask[0] = 0  # position 0 has no log-prob (docs/design.md)
    return DemonstrationIds(ids, mask, spans[-1][0], source)


def document_ids(tokenizer, text: str, source: str = "") -> DemonstrationIds:
    """A plain-text document as TRL's language-modeling datasets train on it: the text with the tokenizer's
    special tokens and EOS (unless it already ends so), every token trained on. Its sample at validation
    continues the first half (`prompt_length`)."""
    ids = encode_text(tokenizer, text)
    if tokenizer.eos_token_id is not None and ids[-1:] != [tokenizer.eos_token_id]:
        ids.append(tokenizer.eos_token_id)
    return DemonstrationIds(ids, [0] + [1] * (len(ids) - 1), len(ids) // 2, source)


def fit_demonstration(tokenizer, demo: DemonstrationIds, max_length: int) -> tuple[DemonstrationIds, bool]:
    """`(demo, cut)` within `max_length` tokens by `fit_prompt_responses`' rule: the tokens before the first
    trained one are the prompt (it keeps its leading special tokens and its end), the rest the response
    (it keeps its start)."""
    if demo.length <= max_length:
        return demo, False
    first = next((t for t, m in enumerate(demo.token_mask) if m), 1)
    prompt, rest = demo.input_ids[:first], demo.input_ids[first:]
    prompt, (rest,), _ = fit_prompt_responses(tokenizer, prompt, [rest], max_length)
    mask = [0] * len(prompt) + demo.token_mask[first:first + len(rest)]
    mask[0] = 0
    prompt_length = min(max(demo.prompt_length - (first - len(prompt)), 0), len(prompt) + len(rest))
    return DemonstrationIds(prompt + rest, mask, prompt_length, demo.source), True
