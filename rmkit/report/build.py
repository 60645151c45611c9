"""The report of one or more models on one `EvalSet`: `report.json`'s figures, the per-pair score files,
the most-disagreeing pairs and the HTML page, written into one folder."""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

import numpy as np

from rmkit.report import prmbench, processbench, rewardbench, rewardbench2, rmbench
from rmkit.report.metrics import agreement, calibration, most_disagreeing, pair_stats, sigmoid
from rmkit.report.scoring import EvalSet, ModelScores

DISAGREEMENTS_FILE = "disagreements.jsonl"


def subset_order(subsets: np.ndarray) -> list[str]:
    """RewardBench's subsets in its section order, then the others in order of first appearance."""
    present = list(dict.fromkeys(subsets.tolist()))
    return [s for s in rewardbench.SUBSETS if s in present] + [s for s in present if s not in rewardbench.EXAMPLE_COUNTS]


def model_report(evalset: EvalSet, scores: ModelScores, calibration_bins: int = 10,
                 step_threshold: float = processbench.DEFAULT_THRESHOLD) -> dict:
    """One model's pair figures (`pair_report`), and `rewardbench_v2` / `rm_bench` / `processbench` when the
    data holds those layouts."""
    entry = {"path": scores.path, "truncated": scores.truncated, "truncated_texts": scores.truncated_texts}
    if evalset.pairs:
        entry.update(pair_report(evalset, scores, calibration_bins))
    else:
        entry.update({"subsets": {}, "sections": {}, "overall": None, "length_bias": None, "calibration": None})
    if evalset.best_of:
        entry["rewardbench_v2"] = rewardbench2.rewardbench2_scores(evalset.best_of, scores.best_of)
    if evalset.styles:
        entry["rm_bench"] = rmbench.rm_bench_scores(evalset.styles, scores.styles_chosen, scores.styles_rejected)
    if evalset.solutions:
        entry["processbench"] = processbench.processbench_scores(
            evalset.solutions, [s.step_rewards for s in scores.steps], step_threshold)
    if evalset.prmbench:
        entry["prmbench"] = prmbench.prmbench_scores(evalset.prmbench, [s.step_rewards for s in scores.prmbench_steps])
    return entry


def pair_report(evalset: EvalSet, scores: ModelScores, calibration_bins: int = 10) -> dict:
    """One model's `subsets`, `sections` (RewardBench's, when its subset names appear), `overall`,
    `length_bias` and `calibration` (see `rmkit.report.metrics`) on the pairs."""
    lengths = (evalset.chosen_len, evalset.rejected_len)
    subsets = {}
    for name in subset_order(evalset.subsets):
        members = evalset.subsets == name
        subsets[name] = pair_stats(scores.chosen[members], scores.rejected[members],
                                   *(length[members] for length in lengths))
    pooled = pair_stats(scores.chosen, scores.rejected, *lengths)
    sections = {}
    if rewardbench.is_rewardbench(subsets):
        sections = rewardbench.section_scores({s: v["accuracy"] for s, v in subsets.items()})
    overall = {key: pooled[key] for key in ("n", "accuracy", "ci95", "ties", "mean_margin")}
    overall["rewardbench"] = rewardbench.overall_score(sections) if sections else None
    length_bias = {key: pooled[key] for key in ("longer_wins_accuracy", "length_warning", "reward_length_spearman")}
    return {"subsets": subsets, "sections": sections, "overall": overall, "length_bias": {**length_bias, **pooled["length_split"]},
            "calibration": calibration(scores.chosen, scores.rejected, calibration_bins)}


def length_warnings(report: dict) -> list[tuple[str, str, str]]:
    """`(model, where, sentence)` for every model whose accuracy, overall or on a subset, is within
    `LENGTH_MARGIN` of the length-only baseline or below it (`rmkit.report.metrics.length_warning`)."""
    found = []
    for name, entry in report["models"].items():
        if entry["length_bias"] and entry["length_bias"]["length_warning"]:
            found.append((name, "overall", entry["length_bias"]["length_warning"]))
        found += [(name, f"subset {subset}", s["length_warning"]) for subset, s in entry["subsets"].items()
                  if s["length_warning"] and len(entry["subsets"]) > 1]
    return found


def comparison(evalset: EvalSet, models: list[ModelScores], reports: dict[str, dict],
               top: int) -> tuple[dict, list[dict]]:
    """Accuracy per subset side by side, agreement of every two models, and their `top` most-disagreeing
    pairs (rows of `disagreements.jsonl`)."""
    side_by_side = {s: {m.name: reports[m.name]["subsets"][s]["accuracy"] for m in models}
                    for s in subset_order(evalset.subsets)}
    pairwise, rows = [], []
    for a, b in combinations(models if evalset.pairs else [], 2):
        margin_a, margin_b = a.chosen - a.rejected, b.chosen - b.rejected
        pairwise.append({"models": [a.name, b.name], **agreement(margin_a, margin_b)})
        for index, gap in most_disagreeing(margin_a, margin_b, top):
            rows.append(disagreement_row(evalset, index, gap, (a, b)))
    return {"models": [m.name for m in models], "accuracy": side_by_side, "agreement": pairwise}, rows


def disagreement_row(evalset: EvalSet, index: int, gap: float, models: tuple[ModelScores, ...]) -> dict:
    pair = evalset.pairs[index]
    rewards = {m.name: {"reward_chosen": float(m.chosen[index]), "reward_rejected": float(m.rejected[index]),
                        "p_chosen": float(sigmoid(m.chosen[index] - m.rejected[index]))} for m in models}
    return {"models": [m.name for m in models], "gap": gap, "index": index, **_where(evalset, index),
            "prompt": pair.prompt, "chosen": pair.chosen, "rejected": pair.rejected, "rewards": rewards}


def _where(evalset: EvalSet, index: int) -> dict:
    pair = evalset.pairs[index]
    return {"subset": evalset.subsets[index], "id": pair.id, "source": pair.source}


def score_rows(evalset: EvalSet, scores: ModelScores) -> list[dict]:
    """`scores-<model>.jsonl`: every pair with both rewards and both response lengths (characters)."""
    return [{"index": i, **_where(evalset, i), "reward_chosen": float(c), "reward_rejected": float(r),
             "correct": bool(c > r), "chosen_length": int(evalset.chosen_len[i]),
             "rejected_length": int(evalset.rejected_len[i])}
            for i, (c, r) in enumerate(zip(scores.chosen, scores.rejected))]


def best_of_rows(evalset: EvalSet, scores: ModelScores) -> list[dict]:
    """`scores-rewardbench2-<model>.jsonl`: every RewardBench 2 row's completion rewards (chosen first) and
    its `result` (the 1/k rule; None in Ties, scored as a whole)."""
    return [{"index": i, "subset": row.subset, "id": row.id, "source": row.source, "num_correct": row.num_correct,
             "rewards": values.tolist(),
             "result": None if rewardbench2.is_ties(row.subset) else rewardbench2.best_of_result(values)}
            for i, (row, values) in enumerate(zip(evalset.best_of, scores.best_of))]


def style_rows(evalset: EvalSet, scores: ModelScores) -> list[dict]:
    """`scores-rm-bench-<model>.jsonl`: every RM-Bench row's rewards of its three chosen and three rejected
    styles (`rmkit.report.rmbench.STYLES` order)."""
    return [{"index": i, "domain": row.file_domain, "subset": row.subset, "id": row.id, "source": row.source,
             "rewards_chosen": c.tolist(), "rewards_rejected": r.tolist()}
            for i, (row, c, r) in enumerate(zip(evalset.styles, scores.styles_chosen, scores.styles_rejected))]


def build_report(evalset: EvalSet, models: list[ModelScores], top_disagreements: int = 50,
                 calibration_bins: int = 10,
                 step_threshold: float = processbench.DEFAULT_THRESHOLD) -> tuple[dict, list[dict]]:
    """`report.json`'s object and the rows of `disagreements.jsonl` (none for one model)."""
    reports = {m.name: model_report(evalset, m, calibration_bins, step_threshold) for m in models}
    report = {"data": evalset.paths, "layouts": evalset.layouts, "num_pairs": len(evalset.pairs),
              "skipped": len(evalset.skipped), "accuracy_rule": "r_chosen > r_rejected (a tie is wrong)",
              "aggregation": rewardbench.SOURCE if rewardbench.is_rewardbench(evalset.subsets.tolist()) else None,
              "models": reports}
    benchmarks = {}
    if evalset.best_of:
        benchmarks["rewardbench_v2"] = {"source": rewardbench2.SOURCE, "num_rows": len(evalset.best_of),
                                        "baselines": rewardbench2.baselines(evalset.best_of)}
    if evalset.styles:
        benchmarks["rm_bench"] = {"source": rmbench.SOURCE, "num_rows": len(evalset.styles),
                                  "styles": list(rmbench.STYLES)}
    if evalset.solutions:
        benchmarks["processbench"] = {"source": processbench.SOURCE, "num_rows": len(evalset.solutions),
                                      "threshold": step_threshold, "rule": processbench.THRESHOLD_RULE}
    if evalset.prmbench:
        benchmarks["prmbench"] = {"source": prmbench.SOURCE, "num_rows": len(evalset.prmbench),
                                  "threshold": prmbench.THRESHOLD}
    if benchmarks:
        report["benchmarks"] = benchmarks
    # The benchmarks' own leaderboard keys at the top, for the first model (the one under evaluation); every
    # model's, side by side, stay under `models.<name>`.
    first = models[0].name
    for key in ("rewardbench_v2", "rm_bench", "processbench", "prmbench"):
        if key in reports[first]:
            report[key] = {"model": first, **reports[first][key]}
    rows = []
    if len(models) > 1:
        report["comparison"], rows = comparison(evalset, models, reports, top_disagreements)
    return report, rows


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_report(out_dir: str | Path, evalset: EvalSet, models: list[ModelScores], top_disagreements: int = 50,
                 calibration_bins: int = 10, step_threshold: float = processbench.DEFAULT_THRESHOLD) -> dict:
    """Write `report.json`, `report.html`, per model `scores-<model>.jsonl` (pairs),
    `scores-rewardbench2-<model>.jsonl`, `scores-rm-bench-<model>.jsonl`, `scores-processbench-<model>.jsonl` and
    `scores-prmbench-<model>.jsonl`
    (when the data holds those layouts) and (two or more models, pairs) `disagreements.jsonl` into `out_dir`;
    returns the report."""
    from rmkit.report.html import render_html  # matplotlib is imported only here

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report, rows = build_report(evalset, models, top_disagreements, calibration_bins, step_threshold)
    for scores in models:
        if evalset.pairs:
            _write_jsonl(out / f"scores-{scores.name}.jsonl", score_rows(evalset, scores))
        if evalset.best_of:
            _write_jsonl(out / f"scores-rewardbench2-{scores.name}.jsonl", best_of_rows(evalset, scores))
        if evalset.styles:
            _write_jsonl(out / f"scores-rm-bench-{scores.name}.jsonl", style_rows(evalset, scores))
        if evalset.solutions:
            _write_jsonl(out / f"scores-processbench-{scores.name}.jsonl", processbench.prediction_rows(
                evalset.solutions, [s.step_rewards for s in scores.steps], [s.reward for s in scores.steps],
                step_threshold))
        if evalset.prmbench:
            _write_jsonl(out / f"scores-prmbench-{scores.name}.jsonl", prmbench.prediction_rows(
                evalset.prmbench, [s.step_rewards for s in scores.prmbench_steps],
                [s.reward for s in scores.prmbench_steps]))
    if len(models) > 1 and evalset.pairs:
        _write_jsonl(out / DISAGREEMENTS_FILE, rows)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "report.html").write_text(render_html(report, evalset, models), encoding="utf-8")
    return report
