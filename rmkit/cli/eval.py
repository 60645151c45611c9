"""`rmkit eval --model DIR --data FILE [--format F] [--json]`: the reward-model metrics of docs/design.md
(loss, acc, reward means and std, num_pairs) of a model directory on a preference file.

`rmkit eval --model DIR [--model DIR2 ...] --data FILE [--data FILE2 ...] --report OUT_DIR` writes a
report of every model on every file instead (`rmkit.report`): pairs (RewardBench v1 and any preference
layout), RewardBench 2 and RM-Bench files, and ProcessBench and PRMBench files for process reward models, each
recognised from its first record (or `--layout`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from rmkit.cli import description
from rmkit.cli.arguments import positive_int, sequence_length
from rmkit.cli.output_file import check_output_folder
from rmkit.data import FORMATS, load_preference_data, write_rejects
from rmkit.data.readers import check_data_path
from rmkit.errors import ConfigError
from rmkit.inference import RewardScorer, check_reward_model_dir, load_scorer
from rmkit.report.build import length_warnings
from rmkit.report.layouts import LAYOUTS, detect_layout
from rmkit.report.metrics import pair_stats, response_length
from rmkit.report.processbench import DEFAULT_THRESHOLD
from rmkit.trainer.datasets import resolve_data_path
from rmkit.validation import pair_metrics


def add_model_arguments(parser: argparse.ArgumentParser, several: bool = False) -> None:
    """Options shared by `eval` and `score` (`several`: `--model` may repeat)."""
    parser.add_argument("--model", required=True, action="append" if several else "store",
                        help="reward model directory (rmkit export or any HF classifier)"
                             + ("; repeat it to compare models (--report)" if several else ""))
    parser.add_argument("--max-length", type=sequence_length, default=None,
                        help="tokens per input (default: the model's scoring_contract.json, which every rmkit "
                             "path reads; else the model's position limit); longer inputs keep their end")
    parser.add_argument("--precision", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--batch-tokens", type=positive_int, default=None,
                        help="padded tokens per forward pass (default: 1024 on a CPU, 16384 on a GPU)")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")


def load_for_inference(args: argparse.Namespace) -> RewardScorer:
    """The inference core's scorer of `args.model` (checked by `check_reward_model_dir`) on the best device."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return load_scorer(args.model, device=device, precision=args.precision, max_length=args.max_length,
                       max_batch_tokens=args.batch_tokens)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rmkit eval", description=description(__doc__))
    add_model_arguments(parser, several=True)
    parser.add_argument("--data", required=True, action="append",
                        help="preference file (JSONL, JSON, Parquet) or HF dataset; repeat it with --report")
    parser.add_argument("--format", default="auto", choices=FORMATS, help="record format (default: sniffed)")
    parser.add_argument("--layout", default="auto", choices=LAYOUTS,
                        help="with --report: pairs (RewardBench v1 and the --format layouts), rewardbench2 "
                             "(chosen/rejected lists, num_correct), rm-bench (three styles each), processbench "
                             "(problem, steps, label) or prmbench (original and modified processes, error_steps): "
                             "the last two a process reward model's; for every --data file (default: recognised "
                             "from each file's first record)")
    parser.add_argument("--prompt-key", default="prompt")
    parser.add_argument("--chosen-key", default="chosen")
    parser.add_argument("--rejected-key", default="rejected")
    parser.add_argument("--allow-empty-response", action="store_true",
                        help="accept empty chosen/rejected responses (a model that said nothing)")
    parser.add_argument("--skip-bad", action="store_true",
                        help="skip bad records (written to --rejects) instead of stopping at the first")
    parser.add_argument("--rejects", default="rejects-eval.jsonl", help="where skipped records go")
    parser.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    parser.add_argument("--report", metavar="OUT_DIR", default=None,
                        help="write report.json, report.html, scores-<model>.jsonl (and disagreements.jsonl) there "
                             "instead of printing metrics (docs/reward-models/evaluate.md, 'The report')")
    parser.add_argument("--top-disagreements", type=positive_int, default=50,
                        help="with several models: pairs per two models in disagreements.jsonl")
    parser.add_argument("--calibration-bins", type=positive_int, default=10, help="bins of the reliability diagram")
    parser.add_argument("--step-threshold", type=float, default=DEFAULT_THRESHOLD,
                        help="ProcessBench: a step is judged wrong when its probability of being correct is below "
                             "this (default 0.5, as ProcessBench's own evaluation code judges a step)")
    return parser


def load_options(args: argparse.Namespace) -> dict:
    return {"format": args.format, "prompt_key": args.prompt_key, "chosen_key": args.chosen_key,
            "rejected_key": args.rejected_key, "allow_empty_response": args.allow_empty_response,
            "on_error": "skip" if args.skip_bad else "raise"}


def report_skipped(args: argparse.Namespace, skipped: list) -> None:
    if skipped:
        write_rejects(args.rejects, skipped)
        print(f"rmkit eval: skipped {len(skipped)} record{'' if len(skipped) == 1 else 's'} (see {args.rejects})", file=sys.stderr)


def warn_identical(pairs: list) -> int:
    """Say on stderr how many pairs have the same chosen and rejected response (a tie, so always counted
    wrong: such pairs only lower the accuracy) and which is the first; returns the count."""
    identical = [p for p in pairs if p.chosen == p.rejected]
    if identical:
        print(f"rmkit eval: warning: {len(identical)} of {len(pairs)} pairs have identical chosen and rejected "
              f"responses (first: {identical[0].source}); a tie counts as wrong, so each lowers the accuracy: "
              "fix or drop them (`rmkit data check FILE --identical error` lists them)", file=sys.stderr)
    return len(identical)


def evaluate(args: argparse.Namespace) -> dict:
    """The metrics of `args.model` on `args.data`."""
    layout = detect_layout(args.data) if args.layout == "auto" else args.layout
    if layout != "pairs":
        raise ConfigError("--report", f"{args.data} is in the {layout} layout, whose scores need a report: "
                                      "add --report OUT_DIR")
    scorer = load_for_inference(args)
    scorer.check_outcome(args.model)
    loaded = load_preference_data(args.data, **load_options(args))
    tokenized = scorer.encode_pairs(loaded.records)
    report_skipped(args, loaded.skipped)
    rewards = scorer.score_ids([ids for p in tokenized.pairs for ids in (p.chosen_ids, p.rejected_ids)])
    metrics = pair_metrics(rewards[0::2, 0], rewards[1::2, 0])
    metrics.update(length_metrics(loaded.records, rewards[0::2, 0].double().numpy(), rewards[1::2, 0].double().numpy()))
    metrics["truncated"] = tokenized.truncated
    metrics["skipped"] = len(loaded.skipped)
    metrics["identical_pairs"] = warn_identical(loaded.records)
    return metrics


def length_metrics(records: list, chosen: np.ndarray, rejected: np.ndarray) -> dict:
    """The length section of `rmkit eval` (the report's figures, `rmkit.report.metrics`): the length-only
    baseline `longer_wins_acc`, the accuracy on the pairs whose chosen response is longer and shorter (with
    their counts), and `length_warning` (a sentence, or None)."""
    chosen_len = np.array([response_length(r.chosen) for r in records])
    rejected_len = np.array([response_length(r.rejected) for r in records])
    stats = pair_stats(chosen, rejected, chosen_len, rejected_len)
    split = stats["length_split"]
    return {"longer_wins_acc": stats["longer_wins_accuracy"],
            "acc_chosen_longer": split["chosen_longer"]["accuracy"], "num_chosen_longer": split["chosen_longer"]["n"],
            "acc_chosen_shorter": split["chosen_shorter"]["accuracy"], "num_chosen_shorter": split["chosen_shorter"]["n"],
            "length_warning": stats["length_warning"]}


def write_model_report(args: argparse.Namespace) -> dict:
    """Score every model on every file through the inference core, then `rmkit.report.write_report`."""
    from rmkit.report import load_eval_set, model_names, score_model, write_report

    if not 0 < args.step_threshold < 1:
        raise ConfigError("--step-threshold", f"a probability strictly between 0 and 1, got {args.step_threshold}")
    evalset = load_eval_set(args.data, args.layout, **load_options(args))
    report_skipped(args, evalset.skipped)
    warn_identical(evalset.pairs)
    models = []
    for name, path in zip(model_names(args.model), args.model):
        scorer = load_for_inference(argparse.Namespace(**{**vars(args), "model": path}))
        models.append(score_model(scorer, evalset, name, path))
        del scorer  # one model in memory at a time
    return write_report(args.report, evalset, models, args.top_disagreements, args.calibration_bins,
                        args.step_threshold)


def _fraction(split: dict) -> str:
    """`0.8125 (n=16)`, or `- (n=0)`."""
    return f"{split['accuracy']:.4f} (n={split['n']})" if split["n"] else "- (n=0)"


def benchmark_score(label: str, entry: dict) -> str:
    """`RewardBench 2 0.6123`, or `RewardBench 2 incomplete (missing Ties; present subsets 0.5812)`."""
    if entry["score"] is not None:
        return f"{label} {entry['score']:.4f}"
    if not entry["missing"]:
        return f"{label}: no score"
    present = f"; present {entry['present_score']:.4f}" if entry["present_score"] is not None else ""
    return f"{label} incomplete (missing {', '.join(entry['missing'])}{present})"


def print_report(report: dict, out_dir: str) -> None:
    for name, entry in report["models"].items():
        parts = []
        overall = entry["overall"]
        if overall is not None:
            rewardbench = f", RewardBench {overall['rewardbench']:.4f}" if overall["rewardbench"] is not None else ""
            incomplete = [s for s, v in entry["sections"].items() if not v["complete"]]
            if incomplete:
                rewardbench = f", RewardBench incomplete ({', '.join(incomplete)})"
            parts.append(f"accuracy {overall['accuracy']:.4f} on {overall['n']} pairs{rewardbench}, "
                         f"ECE {entry['calibration']['ece']:.4f}")
        if "rewardbench_v2" in entry:
            parts.append(benchmark_score("RewardBench 2", entry["rewardbench_v2"]))
        if "rm_bench" in entry:
            rm = entry["rm_bench"]
            parts.append(benchmark_score("RM-Bench", rm) + (
                f" (hard {rm['hard']:.4f}, normal {rm['normal']:.4f}, easy {rm['easy']:.4f})" if rm["complete"] else ""))
        if "processbench" in entry:
            pb = entry["processbench"]
            average = f"{pb['average_f1']:.4f}" if pb["average_f1"] is not None else "-"
            splits = ", ".join(f"{s} {v['f1']:.4f}" if v["f1"] is not None else f"{s} -"
                               for s, v in pb["splits"].items())
            auc = f"{pb['average_step_auc']:.4f}" if pb["average_step_auc"] is not None else "-"
            parts.append(f"ProcessBench average F1 {average} ({splits}; threshold {pb['threshold']}), "
                         f"step AUC {auc}")
        if "prmbench" in entry:
            score = entry["prmbench"]["overall"]["prm_score"]
            parts.append(f"PRMBench PRMScore {score:.4f}" if score is not None else "PRMBench PRMScore -")
        print(f"{name}: " + "; ".join(parts))
        bias = entry["length_bias"]
        if bias is not None:
            print(f"  length-only baseline (the longer response wins) {bias['longer_wins_accuracy']:.4f}; accuracy "
                  f"when the chosen response is longer {_fraction(bias['chosen_longer'])}, "
                  f"shorter {_fraction(bias['chosen_shorter'])}")
    for name, where, text in length_warnings(report):
        print(f"warning: {name}, {where}: {text}")
    print(f"report: {Path(out_dir) / 'report.html'}")


def check_paths(args: argparse.Namespace) -> None:
    """The data files (`default` / `default-val`: the embedded set, as `rmkit train` reads them), the models and the
    report folder, before any model loads (a ConfigError naming the option)."""
    args.data = [resolve_data_path(data) for data in args.data]
    for data in args.data:
        check_data_path(data, "--data")
    if args.report is not None and Path(args.report).exists() and not Path(args.report).is_dir():
        raise ConfigError("--report", f"{args.report} is a file; --report names a folder to write report.json, "
                                      "report.html and scores-*.jsonl into (a new one, or an earlier report's, "
                                      "whose files are replaced)")
    if args.report is not None:
        check_output_folder(args.report, "--report")
    for model in args.model:
        check_reward_model_dir(model, "--model")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    check_paths(args)
    if args.report is not None:
        report = write_model_report(args)
        if args.json:
            print(json.dumps(report))
        else:
            print_report(report, args.report)
        return 0
    if len(args.model) > 1 or len(args.data) > 1:
        raise ConfigError("--model" if len(args.model) > 1 else "--data",
                          "several models or data files need --report OUT_DIR")
    args.model, args.data = args.model[0], args.data[0]
    metrics = evaluate(args)
    if args.json:
        print(json.dumps(metrics))
    else:
        warning = metrics.pop("length_warning")
        print(f"{args.data} scored by {args.model}")
        for key, value in metrics.items():
            print(f"  {key:<22} {value:.4f}" if isinstance(value, float) else f"  {key:<22} {value}")
        if warning:
            print(f"warning: {warning}")
    return 0
