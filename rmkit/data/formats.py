"""Turn raw records into `PreferencePair`s, one parser per layout users bring.

Each parser takes a `RawRecord` and `FormatOptions` and returns `(pairs, skipped_reasons)`; it raises
a `DataError` (file, line, field) for a record it cannot use. Aligner comparison files pair
consecutive lines, so that layout is handled on the record stream (`pair_aligner_lines`).
"""

from __future__ import annotations

from dataclasses import dataclass
from os.path import commonprefix

from rmkit.data.readers import RawRecord
from rmkit.data.records import PreferencePair
from rmkit.data.validate import (
    finite_number,
    get_field,
    messages,
    optional_id,
    optional_number,
    optional_text,
    text_or_messages,
)

FORMATS = ("auto", "binary", "ranked", "aligner", "helpsteer3", "tulu3", "hh_rlhf")
HH_ASSISTANT = "\n\nAssistant:"
# Where an assistant's turn starts in a rendered conversation: HH and rmkit's plain rendering, ChatML, Llama 3,
# NeMo's templates, Llama 2 (the end of the user's turn), Gemma, Zephyr / Phi-3.
ASSISTANT_MARKERS = ("Assistant:", "<|im_start|>assistant", "<|start_header_id|>assistant", "<extra_id_1>Assistant",
                     "[/INST]", "<start_of_turn>model", "<|assistant|>")
TIE_PREFIX = "tie: "  # how a tie skipped under keep_ties=True is reported


@dataclass(frozen=True)
class FormatOptions:
    """Keys and policies for the parsers (see `load_preference_data` for each one's meaning)."""

    prompt_key: str = "prompt"
    chosen_key: str = "chosen"
    rejected_key: str = "rejected"
    margin_key: str | None = "margin"
    text_key: str = "text"
    keep_ties: bool = False
    allow_empty_response: bool = False


def parse_binary(record: RawRecord, opts: FormatOptions) -> tuple[list[PreferencePair], list[str]]:
    """`{prompt, chosen, rejected[, margin, subset, id]}`: text or chat messages; keys are configurable.
    `subset` (a string) and `id` (a string or an integer) are RewardBench's labels, kept when present."""
    prompt = text_or_messages(record, opts.prompt_key)
    chosen = text_or_messages(record, opts.chosen_key, allow_empty=opts.allow_empty_response)
    rejected = text_or_messages(record, opts.rejected_key, allow_empty=opts.allow_empty_response)
    margin = optional_number(record, opts.margin_key)
    subset, id_ = optional_text(record, "subset"), optional_id(record, "id")
    return [PreferencePair(prompt, chosen, rejected, margin, record.source, subset, id_)], []


def parse_ranked(record: RawRecord, opts: FormatOptions) -> tuple[list[PreferencePair], list[str]]:
    """NeMo RL PreferenceDataset: `{context, completions: [{rank, completion}, ...]}`, lower rank
    preferred. n completions expand into every pair with different ranks (chosen = better rank);
    a tie is an error unless `keep_ties`, which skips tie pairs (counted as skipped)."""
    context = text_or_messages(record, "context")
    completions = get_field(record, "completions")
    if not isinstance(completions, list) or len(completions) < 2:
        raise record.error("completions", "expected a list of at least 2 completions")
    ranked = []
    for i, item in enumerate(completions):
        where = f"completions[{i}]"
        if not isinstance(item, dict):
            raise record.error(where, f"expected an object with 'rank' and 'completion', got {type(item).__name__}")
        rank = finite_number(record, f"{where}.rank", item.get("rank"))
        ranked.append((rank, text_or_messages(record, f"{where}.completion", item.get("completion"), opts.allow_empty_response)))
    pairs, skipped = [], []
    for i in range(len(ranked)):
        for j in range(i + 1, len(ranked)):
            (rank_i, comp_i), (rank_j, comp_j) = ranked[i], ranked[j]
            if rank_i == rank_j:
                if not opts.keep_ties:
                    raise record.error(
                        "completions", f"completions {i} and {j} have the same rank {rank_i:g} (a tie); "
                        "pass keep_ties=True (--keep-ties, data.keep_ties=true) to skip tied pairs"
                    )
                skipped.append(f"{TIE_PREFIX}completions {i} and {j} have rank {rank_i:g}")
                continue
            chosen, rejected = (comp_i, comp_j) if rank_i < rank_j else (comp_j, comp_i)
            pairs.append(PreferencePair(context, chosen, rejected, None, record.source))
    return pairs, skipped


def parse_helpsteer3(record: RawRecord, opts: FormatOptions) -> tuple[list[PreferencePair], list[str]]:
    """HelpSteer3 preference: `{context, response1, response2, overall_preference}` as NeMo RL
    preprocesses it: < 0 means response1 is chosen, > 0 response2; 0 is a tie (see `keep_ties`)."""
    context = text_or_messages(record, "context")
    response1 = text_or_messages(record, "response1", allow_empty=opts.allow_empty_response)
    response2 = text_or_messages(record, "response2", allow_empty=opts.allow_empty_response)
    preference = finite_number(record, "overall_preference")
    if preference == 0:
        if not opts.keep_ties:
            raise record.error("overall_preference", "is 0 (a tie); pass keep_ties=True (--keep-ties, data.keep_ties=true) to skip ties")
        return [], [f"{TIE_PREFIX}overall_preference is 0"]
    chosen, rejected = (response1, response2) if preference < 0 else (response2, response1)
    return [PreferencePair(context, chosen, rejected, None, record.source)], []


def split_last_assistant(record: RawRecord, key: str) -> tuple[list, list]:
    """A conversation split into (context before the last assistant turn, that turn onward)."""
    conversation = messages(record, key, get_field(record, key))
    last = max((i for i, m in enumerate(conversation) if m["role"] == "assistant"), default=None)
    if last is None:
        raise record.error(key, "has no assistant message")
    if last == 0:
        raise record.error(key, "has no context before its last assistant message")
    return conversation[:last], conversation[last:]


def parse_tulu3(record: RawRecord, opts: FormatOptions) -> tuple[list[PreferencePair], list[str]]:
    """Tulu 3 preference: `{chosen: [messages], rejected: [messages]}` full conversations; the prompt
    is the shared conversation before the last assistant turn (it must be the same on both sides)."""
    context, chosen = split_last_assistant(record, opts.chosen_key)
    other_context, rejected = split_last_assistant(record, opts.rejected_key)
    if other_context != context:
        raise record.error(opts.rejected_key, f"the conversation before the last assistant turn differs from '{opts.chosen_key}'")
    return [PreferencePair(context, chosen, rejected, None, record.source)], []


def split_hh_transcripts(record: RawRecord, chosen_key: str, rejected_key: str) -> tuple[str, str, str]:
    """Anthropic HH-RLHF raw transcripts -> (prompt, chosen reply, rejected reply): the prompt is the
    shared prefix up to and including its final "\\n\\nAssistant:"."""
    chosen, rejected = text_or_messages(record, chosen_key), text_or_messages(record, rejected_key)
    if not isinstance(chosen, str) or not isinstance(rejected, str):
        raise record.error(chosen_key, "HH-RLHF transcripts must be strings")
    shared = 0
    for a, b in zip(chosen, rejected):
        if a != b:
            break
        shared += 1
    cut = chosen.rfind(HH_ASSISTANT, 0, shared)
    if cut < 0:
        raise record.error(chosen_key, 'the transcripts share no prefix ending in "\\n\\nAssistant:"')
    end = cut + len(HH_ASSISTANT)
    chosen_reply, rejected_reply = chosen[end:], rejected[end:]
    for key, reply in ((chosen_key, chosen_reply), (rejected_key, rejected_reply)):
        if not reply.strip():
            raise record.error(key, "the final assistant reply is empty")
    return chosen[:end], chosen_reply, rejected_reply


def parse_hh_rlhf(record: RawRecord, opts: FormatOptions) -> tuple[list[PreferencePair], list[str]]:
    """Anthropic HH-RLHF raw layout `{chosen: transcript, rejected: transcript}` (see `split_hh_transcripts`)."""
    prompt, chosen, rejected = split_hh_transcripts(record, opts.chosen_key, opts.rejected_key)
    return [PreferencePair(prompt, chosen, rejected, None, record.source)], []


def pair_aligner_lines(first: RawRecord, second: RawRecord, opts: FormatOptions) -> PreferencePair:
    """NeMo Aligner comparison lines 2i (chosen) and 2i+1 (rejected), each `{"text"}` holding the
    prompt and response already joined (`prompt || response`, the prompt in the model's template); the
    pair's prompt is empty, its two texts whole. The format promises that the two lines share their prompt
    (`check_shared_prompt`)."""
    chosen = text_or_messages(first, opts.text_key)
    rejected = text_or_messages(second, opts.text_key)
    if isinstance(chosen, str) and isinstance(rejected, str):
        check_shared_prompt(first, second, opts.text_key, chosen, rejected)
    return PreferencePair("", chosen, rejected, None, f"{first.source}+{second.line}")


def check_shared_prompt(first: RawRecord, second: RawRecord, key: str, chosen: str, rejected: str) -> None:
    """A DataError at `first` unless its text and `second`'s start with the same prompt.

    The joined text does not say where its prompt ends, so the check is on the longest common prefix of the
    two texts, which holds the whole prompt when the pair is sound. When both texts hold an assistant marker
    (`ASSISTANT_MARKERS`: HH's "Assistant:", ChatML, Llama 3, NeMo, Llama 2, Gemma), the prompt runs up to the
    last one, the turn being answered: the prefix must hold a marker and neither text one after it (two texts
    that part in a user turn answer different prompts). Otherwise the prefix must hold a non-blank
    character. Texts of unrelated prompts (a file of lines that are not pairs, or one line missing, which
    shifts every later pair) fail at their first pair."""
    shared = len(commonprefix([chosen, rejected]))
    marked = any(m in chosen and m in rejected for m in ASSISTANT_MARKERS)
    if marked:
        answers = (chosen[shared:], rejected[shared:])
        if any(m in chosen[:shared] for m in ASSISTANT_MARKERS) and not any(
                m in answer for answer in answers for m in ASSISTANT_MARKERS):
            return
    elif chosen[:shared].strip():
        return
    lines = f"lines {first.line} and {second.line}" if first.line_oriented else f"records {first.line} and {second.line}"
    where = (f"they part before their last assistant turn (shared start: {chosen[:shared][-60:]!r})" if marked
             else f"they start differently ({chosen[:30]!r} vs {rejected[:30]!r})")
    raise first.error(key, f"{lines} are not one prompt's two answers: {where}. An aligner comparison file holds "
                           "each prompt twice, `prompt + chosen` then `prompt + rejected` on the next line, so the "
                           "two texts of a pair start alike up to the answer: keep each pair's lines together, "
                           "chosen first, or write {\"prompt\", \"chosen\", \"rejected\"} records")


PARSERS = {
    "binary": parse_binary,
    "ranked": parse_ranked,
    "helpsteer3": parse_helpsteer3,
    "tulu3": parse_tulu3,
    "hh_rlhf": parse_hh_rlhf,
}


def detect_format(record: RawRecord, opts: FormatOptions) -> str:
    """Guess the layout from one record's keys (`format="auto"`)."""
    data = record.data
    if "completions" in data and "context" in data:
        return "ranked"
    if {"response1", "response2", "overall_preference"} <= data.keys():
        return "helpsteer3"
    chosen = data.get(opts.chosen_key)
    if chosen is not None and opts.rejected_key in data:
        if isinstance(chosen, list) and any(isinstance(m, dict) and m.get("role") != "assistant" for m in chosen):
            return "tulu3"
        if opts.prompt_key in data:
            return "binary"
        if isinstance(chosen, str) and HH_ASSISTANT in chosen:
            return "hh_rlhf"
    if opts.text_key in data and "label" not in data:
        return "aligner"
    keys = ", ".join(sorted(map(str, data))) or "none"
    raise record.error(
        None, f"cannot tell the data format from the fields ({keys}): name your fields (data.prompt_key, "
              "data.chosen_key, data.rejected_key; --prompt-key, --chosen-key, --rejected-key on rmkit data / eval / "
              f"score), or the format (data.format=, --format) as one of {', '.join(FORMATS[1:])}")
