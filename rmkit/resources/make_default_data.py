"""Generate rmkit's embedded default preference set (`default_train.jsonl`, `default_val.jsonl`).

    python -m rmkit.resources.make_default_data     # rewrites the two files next to this script

Each record is `{"prompt", "chosen", "rejected"}` (binary format). The chosen reply answers the question
correctly and politely; the rejected one is, in turn, factually wrong in the same style, evasive, rude
(though often correct), or off topic. Wording is drawn from many templates and both sides get the same
kind of framing, so neither length nor a fixed keyword gives the answer away. Validation questions are
disjoint from training questions: validation accuracy measures generalization to new topics.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from rmkit.resources.default_facts import FACTS

OPENERS = ["", "", "Good question! ", "Sure. ", "Happy to help. ", "Of course. ", "Here you go: ",
           "Great question. ", "Certainly. ", "Thanks for asking. "]
CLOSERS = ["", "", " Let me know if you have more questions.", " I hope that helps!",
           " Feel free to ask a follow-up.", " Glad to help.", " Does that answer your question?"]
EVASIVE = [
    "I'd rather not get into that. You can probably find it somewhere online.",
    "That's not really something I can answer. Maybe ask someone else.",
    "Hmm, hard to say. There are many opinions on this, so it depends.",
    "I don't know, and honestly it doesn't matter much anyway.",
    "You could look it up yourself; it's not my job to research that.",
    "Let's talk about something else instead.",
    "It's complicated, and I don't think I should say.",
    "Nobody really knows for sure, so I won't guess.",
    "Why do you want to know? I'm not going to answer that.",
    "I can't help with this one, sorry. Try a search engine.",
]
RUDE = [
    "Seriously? Everyone knows this. {a} Try to keep up.",
    "Ugh, what a lazy question. {a} Next time use your brain.",
    "{a} Honestly, I can't believe you had to ask.",
    "Wow, you really don't know? Fine. {a}",
    "{a} Now stop wasting my time with basic stuff.",
    "This is embarrassing for you. {a}",
    "Pay attention this time because I won't repeat it: {a}",
    "Even a child could answer this. {a}",
]
OFF_TOPIC = [
    "My favorite color is blue, and I really enjoy long walks on the beach.",
    "Did you know that octopuses have three hearts? Fascinating animals.",
    "The weather has been lovely lately, perfect for a picnic in the park.",
    "I think pineapple on pizza is underrated, whatever people say.",
    "Let me tell you about my weekend: I reorganized my bookshelf by color.",
    "Bananas are berries, but strawberries are not. Fun fact!",
    "Chess is a wonderful game; the Sicilian Defense is a popular opening.",
    "Coffee tastes best when the beans are freshly ground.",
]
PROMPT_FRAMES = ["{q}", "{q}", "Quick question: {q}", "Can you tell me: {q}", "I was wondering, {q_lower}",
                 "Please help. {q}", "{q} Thanks!", "Hi! {q}"]


def frame_prompt(question: str, rng: random.Random) -> str:
    frame = rng.choice(PROMPT_FRAMES)
    return frame.format(q=question, q_lower=question[0].lower() + question[1:])


def polite(answer: str, rng: random.Random) -> str:
    return (rng.choice(OPENERS) + answer + rng.choice(CLOSERS)).strip()


def make_pair(fact: tuple[str, str, str], kind: str, rng: random.Random) -> dict:
    """One preference record of the given rejection `kind` for a `(question, correct, wrong)` fact."""
    question, correct, wrong = fact
    chosen = polite(correct, rng)
    if kind == "wrong":  # same friendly framing, wrong content
        rejected = polite(wrong, rng)
    elif kind == "evasive":
        rejected = polite(rng.choice(EVASIVE), rng)
    elif kind == "rude":
        rejected = rng.choice(RUDE).format(a=rng.choice([correct, correct, wrong]))
    else:
        rejected = polite(rng.choice(OFF_TOPIC), rng)
    return {"prompt": frame_prompt(question, rng), "chosen": chosen, "rejected": rejected, "kind": kind}


def generate(seed: int = 0, val_fraction: float = 0.25) -> tuple[list[dict], list[dict]]:
    """`(train, val)` records; each fact yields one pair per rejection kind, in random order."""
    rng = random.Random(seed)
    facts = list(FACTS)
    rng.shuffle(facts)
    n_val = int(len(facts) * val_fraction)
    splits = []
    for subset in (facts[n_val:], facts[:n_val]):
        records = [make_pair(f, kind, rng) for f in subset for kind in ("wrong", "evasive", "rude", "off_topic")]
        rng.shuffle(records)
        splits.append(records)
    return splits[0], splits[1]


def write_jsonl(records: list[dict], path: Path) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    train, val = generate()
    write_jsonl(train, here / "default_train.jsonl")
    write_jsonl(val, here / "default_val.jsonl")
    print(f"wrote {len(train)} train and {len(val)} validation pairs to {here}")
