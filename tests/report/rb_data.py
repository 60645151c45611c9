"""A small file in RewardBench's layout, with hand-picked rewards for every pair."""

import json
from pathlib import Path

# (subset, chosen, rejected, reward_chosen, reward_rejected): hand-picked rewards for test_aggregation.
ROWS = [
    ("alpacaeval-easy", "a good long answer", "bad", 2.0, 1.0),
    ("alpacaeval-easy", "ok", "a rambling wrong answer", 0.5, -0.5),
    ("alpacaeval-length", "short right", "a longer wrong reply", 1.0, 0.0),
    ("alpacaeval-length", "longer but right answer", "short", 0.0, 3.0),
    ("alpacaeval-hard", "right", "wrong", 1.5, 1.0),
    ("mt-bench-easy", "same reward", "same rewards", 0.25, 0.25),  # a tie: wrong
    ("mt-bench-med", "right one", "wrong", -1.0, 1.0),
    ("mt-bench-med", "right", "wrong one", -2.0, -1.0),
    ("math-prm", "x = 4", "x = 5, since ...", 1.0, 0.0),
    ("math-prm", "x = 7 because", "x = 8", 0.0, 0.5),
    ("hep-python", "def f(): return 1", "def f(): return 2", 0.3, 0.2),
]
EXTRA = [("fine", "rude", 1.0, 0.0), ("kind words", "no", 1.0, -1.0), ("yes", "a no", -1.0, 0.0)]


def write_rb_files(folder: Path) -> tuple[Path, Path]:
    """`rb.jsonl` (RewardBench subsets and ids) and `extra.jsonl` (no subset field: subset `extra`)."""
    rb, extra = folder / "rb.jsonl", folder / "extra.jsonl"
    with open(rb, "w", encoding="utf-8") as out:
        for i, (subset, chosen, rejected, _, _) in enumerate(ROWS):
            out.write(json.dumps({"prompt": "Q?", "chosen": chosen, "rejected": rejected, "subset": subset,
                                  "id": 100 + i}) + "\n")
    with open(extra, "w", encoding="utf-8") as out:
        for chosen, rejected, _, _ in EXTRA:
            out.write(json.dumps({"prompt": "Q?", "chosen": chosen, "rejected": rejected}) + "\n")
    return rb, extra
