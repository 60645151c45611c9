"""`rmkit eval --report`: know a reward model before you use it.

    evalset = load_eval_set(["rb.jsonl"])                      # pairs, grouped by `subset`
    models = [score_model(load_scorer(d), evalset, name, d) for name, d in ...]
    report = write_report("out", evalset, models)              # report.json, report.html, scores-*.jsonl

Per subset: accuracy (strict `>`) with a Wilson 95% interval, ties, the "longer response wins" baseline,
reward-length rank correlation, mean margin; RewardBench v1 sections and overall score when the subset
names are RewardBench's (`rmkit.report.rewardbench`); calibration; agreement between models. Files in
RewardBench 2's layout (`rmkit.report.rewardbench2`) and RM-Bench's (`rmkit.report.rmbench`) are recognised
(`rmkit.report.layouts`) and scored as those benchmarks score them.
"""

from rmkit.report.build import build_report, write_report
from rmkit.report.scoring import EvalSet, ModelScores, load_eval_set, model_names, score_model

__all__ = ["EvalSet", "ModelScores", "build_report", "load_eval_set", "model_names", "score_model", "write_report"]
