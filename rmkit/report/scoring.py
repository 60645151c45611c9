"""The pairs a report evaluates (several files, grouped by subset) and one model's rewards on them,
scored through the inference core."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rmkit.data import PreferencePair, load_preference_data
from rmkit.errors import DataError
from rmkit.inference import RewardScorer
from rmkit.report.metrics import response_length


@dataclass
class EvalSet:
    """Every pair of the data files in order, its subset, and the lengths of its two responses."""

    paths: list[str]
    pairs: list[PreferencePair]
    subsets: np.ndarray  # [N] subset names (object)
    chosen_len: np.ndarray  # [N] characters
    rejected_len: np.ndarray  # [N]
    skipped: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class ModelScores:
    """One model's `[N]` chosen and rejected rewards (float64, the head's first output) on an `EvalSet`."""

    name: str
    path: str
    chosen: np.ndarray
    rejected: np.ndarray
    truncated: int = 0


def subset_of_file(path: str) -> str:
    """A file's default subset: its name without the extension (`data/pandalm_val.jsonl` -> `pandalm_val`)."""
    name = Path(str(path).rstrip("/")).name
    return name.split(".")[0] or name


def load_eval_set(paths: list[str], **load_options) -> EvalSet:
    """Pairs of every file (`load_preference_data(path, **load_options)`); a record's `subset` field names
    its subset, else the file does (`subset_of_file`)."""
    pairs, subsets, skipped = [], [], []
    for path in paths:
        loaded = load_preference_data(path, **load_options)
        pairs.extend(loaded.records)
        subsets.extend(p.subset or subset_of_file(path) for p in loaded.records)
        skipped.extend(loaded.skipped)
    if not pairs:
        raise DataError(", ".join(map(str, paths)), None, None, "no pairs to evaluate")
    lengths = np.array([[response_length(p.chosen), response_length(p.rejected)] for p in pairs])
    return EvalSet([str(p) for p in paths], pairs, np.array(subsets, dtype=object), lengths[:, 0],
                   lengths[:, 1], skipped)


def score_model(scorer: RewardScorer, evalset: EvalSet, name: str, path: str) -> ModelScores:
    """Both sides of every pair scored by `scorer`, each side cut on its own (the scoring contract)."""
    tokenized = scorer.encode_pairs(evalset.pairs)
    rewards = scorer.score_ids([ids for p in tokenized.pairs for ids in (p.chosen_ids, p.rejected_ids)])
    if len(tokenized.pairs) != len(evalset.pairs):  # the scoring rule cuts; it never drops
        raise RuntimeError(f"{len(evalset.pairs) - len(tokenized.pairs)} pairs were dropped while encoding")
    rewards = rewards[:, 0].double().numpy()  # interleaved [c0, r0, c1, r1, ...]
    return ModelScores(name, str(path), rewards[0::2].copy(), rewards[1::2].copy(), tokenized.truncated)


def model_names(paths: list[str]) -> list[str]:
    """Short unique names for model directories, safe in file names: the last path component, with more
    of the path (joined by '-') when two share it, and a number when whole paths repeat."""
    parts = [[re.sub(r"[^A-Za-z0-9._-]+", "_", p) for p in Path(str(path)).parts if p not in ("/", ".")]
             for path in paths]
    names = []
    for i, pieces in enumerate(parts):
        depth = 1
        while depth < len(pieces) and any(other[-depth:] == pieces[-depth:] for j, other in enumerate(parts) if j != i):
            depth += 1
        names.append("-".join(pieces[-depth:]) or "model")
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            names[i] = f"{name}-{seen[name]}"
    return names
