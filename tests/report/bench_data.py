"""Small files in RewardBench 2's and RM-Bench's layouts, written by these tests (no benchmark data is shipped):
the same columns as the published files, made-up texts."""

import json
from pathlib import Path

from rmkit.report.rmbench import FILE_DOMAINS

V2_SUBSETS = ("Factuality", "Precise IF", "Math", "Safety", "Focus")


def v2_rows() -> list[dict]:
    """Two best-of-4 prompts per subset outside Ties, and Ties prompts 0 and 1 with a `ref:` and a `tied:` row."""
    rows = []
    for subset in V2_SUBSETS:
        for k in range(2):
            rows.append({"id": f"{subset[:4].lower()}-{k}", "prompt": f"{subset} question {k}?",
                         "chosen": [f"The right answer to {subset} {k}."],
                         "rejected": [f"Wrong {k}.", f"A long but wrong answer to {subset} {k}, padded.", "No."],
                         "num_correct": 1, "num_incorrect": 3, "total_completions": 4, "subset": subset,
                         "models": ["m1", "m2", "m3", "m4"], "additional_metadata": {"category": "made up"}})
    for k in range(2):
        rows.append({"id": f"ref:{k}", "prompt": f"Name a primary colour ({k}).", "chosen": ["Red."],
                     "rejected": ["Green.", "Purple."], "num_correct": 1, "subset": "Ties"})
        rows.append({"id": f"tied:{k}", "prompt": f"Name a primary colour ({k}).",
                     "chosen": ["Red.", "Blue.", "Yellow."], "rejected": ["Green.", "Purple."], "num_correct": 3,
                     "subset": "Ties"})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_v2(folder: Path, kind: str = "jsonl") -> Path:
    """`rb2.<kind>`: JSONL, a JSON list, or Parquet (pyarrow)."""
    rows = v2_rows()
    path = folder / f"rb2.{kind}"
    if kind == "jsonl":
        return write_jsonl(path, rows)
    if kind == "json":
        path.write_text(json.dumps(rows, indent=2), encoding="utf-8")
        return path
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def style_row(i: int, domain: str) -> dict:
    """The chosen and rejected answers in RM-Bench's three styles (concise, detailed plain, detailed markdown)."""
    right, wrong = f"The answer to {domain} {i} is {i + 1}.", f"The answer to {domain} {i} is {i + 2}."
    styles = lambda text: [text, text + " Here is why, step by step, in plain words.",  # noqa: E731
                           "## Answer\n\n- " + text + "\n- **Why:** step by step."]
    return {"id": i, "subset": "made-up", "prompt": f"Question {i} about {domain}?", "chosen": styles(right),
            "rejected": styles(wrong)}


def write_rm_bench(folder: Path, rows_per_file: int = 2) -> list[Path]:
    """RM-Bench's `data/<domain>_filtered.json` (pretty-printed JSON lists, no `domain` field), one per domain."""
    paths = []
    for n, domain in enumerate(FILE_DOMAINS):
        path = folder / f"{domain}_filtered.json"
        rows = [style_row(10 * n + i, domain) for i in range(rows_per_file)]
        path.write_text(json.dumps(rows, indent=4), encoding="utf-8")
        paths.append(path)
    return paths
