"""What a report evaluates (pairs grouped by subset; RewardBench 2 rows; RM-Bench rows; ProcessBench and PRMBench
solutions),
read from several files of any of those layouts, and one model's rewards on all of it, scored through the
inference core."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rmkit.data import PreferencePair, load_preference_data
from rmkit.data.tokenize import canonical_input
from rmkit.errors import ConfigError, DataError
from rmkit.inference import RewardScorer, StepRewards
from rmkit.report import prmbench, processbench, rewardbench2, rmbench
from rmkit.report.layouts import LAYOUTS, detect_layout, records_or_raise
from rmkit.report.metrics import response_length


@dataclass
class EvalSet:
    """Every pair of the pair files in order, its subset, and the lengths of its two responses; the rows of
    the RewardBench 2 files (`best_of`), of the RM-Bench files (`styles`), of the ProcessBench files
    (`solutions`) and of the PRMBench files (`prmbench`); each file's layout."""

    paths: list[str]
    pairs: list[PreferencePair]
    subsets: np.ndarray  # [N] subset names (object)
    chosen_len: np.ndarray  # [N] characters
    rejected_len: np.ndarray  # [N]
    skipped: list[tuple[str, str]] = field(default_factory=list)
    best_of: list[rewardbench2.BestOfRow] = field(default_factory=list)
    styles: list[rmbench.StyleRow] = field(default_factory=list)
    layouts: dict[str, str] = field(default_factory=dict)
    solutions: list[processbench.ProcessRow] = field(default_factory=list)
    prmbench: list[prmbench.PRMBenchRow] = field(default_factory=list)


@dataclass
class ModelScores:
    """One model's rewards (float64, the head's first output) on an `EvalSet`: `[N]` chosen and rejected
    of the pairs; per RewardBench 2 row its completions' `[n_i]` (chosen first); RM-Bench's `[M, 3]` chosen
    and rejected styles; a process reward model's `steps` of every ProcessBench solution and `prmbench_steps` of
    every PRMBench one. `truncated` counts
    pairs with a side cut to the model's max length, `truncated_texts` the RewardBench 2 and RM-Bench completions
    cut."""

    name: str
    path: str
    chosen: np.ndarray
    rejected: np.ndarray
    truncated: int = 0
    best_of: list[np.ndarray] = field(default_factory=list)
    styles_chosen: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    styles_rejected: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    truncated_texts: int = 0
    steps: list[StepRewards] = field(default_factory=list)
    prmbench_steps: list[StepRewards] = field(default_factory=list)


def subset_of_file(path: str) -> str:
    """A file's default subset: its name without the extension (`data/pandalm_val.jsonl` -> `pandalm_val`)."""
    name = Path(str(path).rstrip("/")).name
    return name.split(".")[0] or name


def load_eval_set(paths: list[str], layout: str = "auto", **load_options) -> EvalSet:
    """Every file in its layout (`rmkit.report.layouts`: recognised from its first record, or `layout`
    for all). Pairs: `load_preference_data(path, **load_options)`; a record's `subset` field names its
    subset, else the file does (`subset_of_file`). RewardBench 2 rows, RM-Bench rows and
    ProcessBench solutions (their split: the file's name) and PRMBench records (the clean solution of an `idx` once;
    with `on_error="skip"` a bad record is skipped and listed) are checked record by record; the first bad one raises
    a `DataError` naming file and line."""
    if layout not in LAYOUTS:
        raise ConfigError("--layout", f"must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    allow_empty = load_options.get("allow_empty_response", False)
    pairs, subsets, skipped, best_of, styles, solutions, bench_rows, layouts = [], [], [], [], [], [], [], {}
    seen_clean: set = set()
    for path in map(str, paths):
        layouts[path] = kind = detect_layout(path) if layout == "auto" else layout
        if kind == "rewardbench2":
            best_of.extend(rewardbench2.parse_row(r, allow_empty) for r in records_or_raise(path))
        elif kind == "rm-bench":
            styles.extend(rmbench.parse_row(r, allow_empty) for r in records_or_raise(path))
        elif kind == "processbench":
            solutions.extend(processbench.parse_row(r, subset_of_file(path)) for r in records_or_raise(path))
        elif kind == "prmbench":  # 103 of its 6,216 records have an error step past the process: --skip-bad
            for record in records_or_raise(path):
                try:
                    bench_rows.extend(prmbench.parse_rows(record, seen_clean))
                except DataError as err:
                    if load_options.get("on_error") != "skip":
                        raise
                    skipped.append((record.source, str(err)))
        else:
            loaded = load_preference_data(path, **load_options)
            pairs.extend(loaded.records)
            subsets.extend(p.subset or subset_of_file(path) for p in loaded.records)
            skipped.extend(loaded.skipped)
    if not (pairs or best_of or styles or solutions or bench_rows):
        raise DataError(", ".join(map(str, paths)), None, None, "nothing to evaluate")
    lengths = np.array([[response_length(p.chosen), response_length(p.rejected)] for p in pairs]).reshape(-1, 2)
    return EvalSet([str(p) for p in paths], pairs, np.array(subsets, dtype=object), lengths[:, 0],
                   lengths[:, 1], skipped, best_of, styles, layouts, solutions, bench_rows)


def score_texts(scorer: RewardScorer, inputs: list) -> tuple[np.ndarray, int]:
    """`[M]` rewards of M inputs, each cut on its own (the scoring contract), and how many were cut."""
    if not inputs:
        return np.zeros(0), 0
    encoded = scorer.encode(inputs)
    rewards = scorer.score_ids([ids for ids, _ in encoded])[:, 0].double().numpy()
    return rewards, sum(full > len(ids) for ids, full in encoded)


def score_steps(scorer: RewardScorer, rows: list, path: str) -> list[StepRewards]:
    """A process reward model's steps of every solution of `rows` (ProcessBench's or PRMBench's: `prompt`, `steps`,
    `steps_field`, `record`), file by file (each file's solutions in one `score_steps` call, as `rmkit score` makes it, so the
    two agree to the bit); a step holding the model's separator is a DataError naming the record and the step."""
    scorer.check_process(path)
    separator = scorer.contract.step_separator
    for row in rows:
        for i, step in enumerate(row.steps):
            if separator in step:
                raise row.record.error(f"{row.steps_field}[{i}]", f"contains the model's step separator {separator!r} (the steps "
                                                      "are joined with it, so this step would read as several)")
    out = []
    for file in dict.fromkeys(row.record.path for row in rows):
        out += scorer.score_steps([(r.prompt, r.steps) for r in rows if r.record.path == file])
    return out


def score_model(scorer: RewardScorer, evalset: EvalSet, name: str, path: str) -> ModelScores:
    """Both sides of every pair, every completion of every RewardBench 2 row and every style of every
    RM-Bench answer, scored by `scorer` one input at a time (each cut on its own: the scoring contract); a
    process reward model's steps of every ProcessBench and PRMBench solution (`score_steps`). A process reward model given
    pairs, or a model of whole responses given ProcessBench, is a ConfigError naming `--model`."""
    if evalset.pairs or evalset.best_of or evalset.styles:
        scorer.check_outcome(path)
    steps = score_steps(scorer, evalset.solutions, path) if evalset.solutions else []
    bench_steps = score_steps(scorer, evalset.prmbench, path) if evalset.prmbench else []
    chosen, rejected, truncated = np.zeros(0), np.zeros(0), 0
    if evalset.pairs:
        tokenized = scorer.encode_pairs(evalset.pairs)
        rewards = scorer.score_ids([ids for p in tokenized.pairs for ids in (p.chosen_ids, p.rejected_ids)])
        if len(tokenized.pairs) != len(evalset.pairs):  # the scoring rule cuts; it never drops
            raise RuntimeError(f"{len(evalset.pairs) - len(tokenized.pairs)} pairs were dropped while encoding")
        rewards = rewards[:, 0].double().numpy()  # interleaved [c0, r0, c1, r1, ...]
        chosen, rejected, truncated = rewards[0::2].copy(), rewards[1::2].copy(), tokenized.truncated
    flat, cut = score_texts(scorer, [canonical_input(r.prompt, c) for r in evalset.best_of for c in r.completions])
    ends = np.cumsum([0] + [len(r.completions) for r in evalset.best_of])
    best_of = [flat[a:b].copy() for a, b in zip(ends[:-1], ends[1:])]
    styled, cut_styles = score_texts(scorer, [canonical_input(r.prompt, c) for r in evalset.styles
                                              for c in r.chosen + r.rejected])
    styled = styled.reshape(-1, 2, len(rmbench.STYLES))  # [M, chosen/rejected, style]
    return ModelScores(name, str(path), chosen, rejected, truncated, best_of, styled[:, 0].copy(),
                       styled[:, 1].copy(), cut + cut_styles, steps, bench_steps)


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
