"""RM-Bench: its rows, checked, and its scores from the rewards of every style of every answer.

The facts come from THU-KEG/RM-Bench at commit 73c52d7 (July 2025): `compute_accuracy` and
`split_dataset_by_domain` in `scripts/utils.py`, the data files `data/*_filtered.json`, and the README's
"Clarity on Avg Calculation".

- A row holds the same chosen answer and the same rejected answer in three styles each, in the order
  concise, detailed plain, detailed markdown; each is scored alone against the prompt.
- Per domain (chat, code, math, safety; `safety-refuse` and `safety-response` are safety),
  `matrix[i][j]` is the fraction of rows whose chosen answer in style i scores strictly above the
  rejected answer in style j. `hard` is the mean of the upper triangle (a plainer chosen answer against
  a fancier rejected one), `normal` the diagonal, `easy` the lower triangle; the domain's `avg` is the
  mean of the three.
- `hard`, `normal`, `easy` and `score` are the means over the four domains (so `score` is both the mean
  of the domain averages and of the three difficulties). rmkit reports them only when all four domains
  are present (RM-Bench's code fails on an empty domain).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rmkit.data.readers import RawRecord
from rmkit.data.records import Message
from rmkit.data.validate import get_field, optional_id, optional_text, text_or_messages

SOURCE = "THU-KEG/RM-Bench@73c52d7 scripts/utils.py (compute_accuracy)"
STYLES = ("concise", "detailed plain", "detailed markdown")
DOMAINS = ("chat", "math", "code", "safety")  # the order of RM-Bench's split_dataset_by_domain
FILE_DOMAINS = ("chat", "code", "math", "safety-refuse", "safety-response")


@dataclass(frozen=True)
class StyleRow:
    """One RM-Bench row: `chosen` and `rejected` in the three `STYLES`; `domain` one of `DOMAINS`."""

    prompt: str | list[Message]
    chosen: tuple
    rejected: tuple
    domain: str
    file_domain: str
    subset: str | None
    id: str | int | None
    source: str


def domain_of_file(path: str) -> str | None:
    """`data/safety-refuse_filtered.json` -> `safety-refuse`; None when the name is not a domain's."""
    stem = Path(path).name.split(".")[0].removesuffix("_filtered")
    return stem if stem in FILE_DOMAINS else None


def _styles(record: RawRecord, key: str, allow_empty: bool) -> tuple:
    value = get_field(record, key)
    if not isinstance(value, list) or len(value) != len(STYLES):
        got = f"{len(value)} entries" if isinstance(value, list) else type(value).__name__
        raise record.error(key, f"expected a list of {len(STYLES)} styles ({', '.join(STYLES)}), got {got}")
    return tuple(text_or_messages(record, f"{key}[{i}]", v, allow_empty=allow_empty) for i, v in enumerate(value))


def parse_row(record: RawRecord, allow_empty: bool = False) -> StyleRow:
    """A checked row; its domain is its `domain` field (total_dataset.json), else the file's name."""
    domain = record.data.get("domain")
    if domain is None:
        domain = domain_of_file(record.path)
        if domain is None:
            raise record.error("domain", f"missing, and the file name does not name a domain ({', '.join(FILE_DOMAINS)}"
                                         "; RM-Bench's data/<domain>_filtered.json); add a domain field")
    if domain not in FILE_DOMAINS:
        raise record.error("domain", f"unknown RM-Bench domain {domain!r}; expected one of {', '.join(FILE_DOMAINS)}")
    prompt = text_or_messages(record, "prompt")
    chosen, rejected = _styles(record, "chosen", allow_empty), _styles(record, "rejected", allow_empty)
    return StyleRow(prompt, chosen, rejected, domain.split("-")[0], domain, optional_text(record, "subset"),
                    optional_id(record, "id"), record.source)


def style_matrix(chosen: np.ndarray, rejected: np.ndarray) -> np.ndarray:
    """`[3, 3]`: `[i, j]` the fraction of rows with `chosen[:, i] > rejected[:, j]` (strict), from `[N, 3]`."""
    return (chosen[:, :, None] > rejected[:, None, :]).mean(axis=0)


def difficulty(matrix: np.ndarray) -> dict:
    """`hard` (upper triangle: plainer chosen vs fancier rejected), `normal` (diagonal), `easy` (lower
    triangle) and `avg`, their mean."""
    upper = np.triu_indices(len(matrix), 1)
    out = {"hard": float(matrix[upper].mean()), "normal": float(np.diag(matrix).mean()),
           "easy": float(matrix.T[upper].mean())}
    out["avg"] = float(np.mean([out["hard"], out["normal"], out["easy"]]))
    return out


def rm_bench_scores(rows: list[StyleRow], chosen: np.ndarray, rejected: np.ndarray) -> dict:
    """`domains` (`{domain: {hard, normal, easy, avg, matrix, n}}`), then `hard`, `normal`, `easy` and
    `score` over the domains (None unless all four are present), `complete`, `missing`, `present_score`.
    `chosen` and `rejected` are `[N, 3]` rewards in `STYLES` order."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        groups[row.domain].append(i)
    domains = {}
    for domain in (d for d in DOMAINS if d in groups):
        matrix = style_matrix(chosen[groups[domain]], rejected[groups[domain]])
        domains[domain] = {**difficulty(matrix), "matrix": matrix.tolist(), "n": len(groups[domain])}
    missing = [d for d in DOMAINS if d not in groups]
    means = {key: float(np.mean([v[key] for v in domains.values()])) for key in ("hard", "normal", "easy", "avg")}
    out = {"domains": domains}
    out.update({key: None if missing else means[key] for key in ("hard", "normal", "easy")})
    out.update({"score": None if missing else means["avg"], "complete": not missing, "missing": missing,
                "present_score": means["avg"], "styles": list(STYLES)})
    return out
