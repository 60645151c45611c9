"""`rmkit data check FILE`: read a data file the way training will, report counts, token lengths,
the padding a length-grouped batch would carry, and every problem (file:line: field: message).

A step-labelled file (a process reward model's data: `--format` one of the step formats, or sniffed from the
first record under `auto`) gets its own counts: solutions, steps, labels correct / wrong / unlabelled, steps per
solution. Exit status 0 when every record is usable, 2 when any is not (or the file cannot be read at all).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from rmkit.cli.arguments import positive_int, sequence_length
from rmkit.data import (
    AMBIGUOUS,
    FORMATS,
    STEP_FORMATS,
    LoadResult,
    detect_step_format,
    load_preference_data,
    load_regression_data,
    load_step_data,
    loaded_line,
    step_summary,
    write_rejects,
)
from rmkit.data.readers import first_record
from rmkit.errors import ConfigError, UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rmkit data", description="Check and inspect preference, regression and "
                                                                     "step-labelled data files.")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="validate a file and report counts, lengths and problems")
    check.add_argument("file", help=".jsonl / .json / .parquet file, save_to_disk folder or dataset name")
    check.add_argument("--format", default="auto", choices=FORMATS + ("regression",) + STEP_FORMATS[1:],
                       help="the layout (default: sniffed from the first record)")
    check.add_argument("--split", default="train", help="split of a Hugging Face dataset")
    check.add_argument("--prompt-key", default="prompt")
    check.add_argument("--chosen-key", default="chosen")
    check.add_argument("--rejected-key", default="rejected")
    check.add_argument("--label-key", default="label", help="regression labels field")
    check.add_argument("--num-labels", type=positive_int, default=None, help="regression: labels each record must have")
    check.add_argument("--keep-ties", action="store_true", help="skip (count) ranked / HelpSteer3 ties instead of failing")
    check.add_argument("--allow-empty-response", action="store_true", help="accept empty chosen/rejected responses")
    check.add_argument("--identical", choices=("warn", "error"), default="warn", help="chosen identical to rejected")
    check.add_argument("--tokenizer", help="tokenizer directory: adds token length statistics")
    check.add_argument("--chat-template", help="a Jinja chat template file overriding the tokenizer's")
    check.add_argument("--max-length", type=sequence_length, default=1024, help="the training max length (default 1024)")
    check.add_argument("--batch-size", type=positive_int, default=16, help="pairs per batch for the padding estimate")
    check.add_argument("--ambiguous", choices=AMBIGUOUS, default="drop",
                       help="step data: PRM800K's ambiguous rating 0 gives no label (drop) or a correct one")
    check.add_argument("--step-separator", help="step data: a step holding this text is an error (backslash "
                                                "escapes such as \\n are read)")
    check.add_argument("--rejects", help="write the unusable records to this JSON Lines file")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def load(args) -> LoadResult:
    if args.format == "regression":
        return load_regression_data(
            args.file, label_key=args.label_key, num_labels=args.num_labels, on_error="skip", split=args.split
        )
    return load_preference_data(
        args.file, args.format, prompt_key=args.prompt_key, chosen_key=args.chosen_key,
        rejected_key=args.rejected_key, keep_ties=args.keep_ties, on_error="skip",
        allow_empty_response=args.allow_empty_response,
        on_identical=args.identical, split=args.split,
    )


def describe(values: list[int]) -> dict:
    ordered = sorted(values)

    def pct(q):
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"min": ordered[0], "mean": round(statistics.fmean(ordered), 1), "p50": pct(0.5), "p90": pct(0.9),
            "p99": pct(0.99), "max": ordered[-1]}


def token_report(result: LoadResult, args) -> dict:
    """Untruncated length statistics, how many exceed --max-length, and the padding fraction of
    length-grouped batches after truncation (vs. batches in file order)."""
    from transformers.utils import logging as hf_logging

    from rmkit.data.sampler import LengthGroupedBatchSampler, padding_fraction
    from rmkit.data.tokenize import encode_example, tokenize_pairs, tokenize_regression
    from rmkit.models.reward import load_tokenizer
    from rmkit.models.setup import loading_errors

    hf_logging.set_verbosity_error()  # the "longer than model max length" warning: we truncate ourselves

    template = open(args.chat_template, encoding="utf-8").read() if args.chat_template else None
    with loading_errors(args.tokenizer, "--tokenizer"):
        tokenizer = load_tokenizer(args.tokenizer, chat_template=template)
    if args.format == "regression":
        lengths = {"text": [len(encode_example(tokenizer, r.prompt, r.response)) for r in result.records]}
        batched = tokenize_regression(result.records, tokenizer, args.max_length)
        rows = sizes = batched.lengths
    else:
        lengths = {side: [len(encode_example(tokenizer, r.prompt, getattr(r, side))) for r in result.records]
                   for side in ("chosen", "rejected")}
        batched = tokenize_pairs(result.records, tokenizer, args.max_length)
        rows = [(len(p.chosen_ids), len(p.rejected_ids)) for p in batched.pairs]
        sizes = batched.lengths
    longest = [max(group) for group in zip(*lengths.values())]
    grouped = list(LengthGroupedBatchSampler(sizes, args.batch_size, seed=0))
    in_order = [list(range(i, min(i + args.batch_size, len(sizes)))) for i in range(0, len(sizes), args.batch_size)]
    return {
        "lengths": {name: describe(values) for name, values in lengths.items()},
        "max_length": args.max_length,
        "over_max_length": sum(n > args.max_length for n in longest),
        "padding_fraction_length_grouped": round(padding_fraction(grouped, rows), 4),
        "padding_fraction_file_order": round(padding_fraction(in_order, rows), 4),
        # Both rows of a pair share a width: the shorter side's padding remains in any batching.
        "padding_fraction_floor": round(padding_fraction([[i] for i in range(len(rows))], rows), 4),
        "batch_size": args.batch_size,
    }


def print_report(report: dict) -> None:
    print(loaded_line(report["file"], report["records"], report["kind"].removesuffix("s"), report["format"]))
    if report["ties_skipped"]:
        print(f"  {report['ties_skipped']} tie pairs skipped (--keep-ties)")
    tokens = report.get("tokens")
    if tokens:
        for name, stats in tokens["lengths"].items():
            print(f"  {name} tokens: " + ", ".join(f"{k} {v}" for k, v in stats.items()))
        print(f"  over --max-length {tokens['max_length']}: {tokens['over_max_length']} (truncated in training)")
        print(f"  padding with length-grouped batches of {tokens['batch_size']}: "
              f"{tokens['padding_fraction_length_grouped']:.1%} (file order: {tokens['padding_fraction_file_order']:.1%}, "
              f"floor of the pair layout: {tokens['padding_fraction_floor']:.1%})")
    for source, message in report["warnings"]:
        print(f"warning: {source}: {message}")
    for source, message in report["problems"]:
        print(f"error: {source}: {message}")
    print(f"{_count(len(report['problems']), 'problem')}, {_count(len(report['warnings']), 'warning')}")


def check_options(args) -> None:
    """The options that name files or text, before any data is read (ConfigErrors naming the option)."""
    if args.chat_template is not None:
        if not args.tokenizer:
            raise ConfigError("--chat-template", "it renders conversations for --tokenizer's token statistics: give "
                                                 "--tokenizer DIR too")
        if not Path(args.chat_template).is_file():
            raise ConfigError("--chat-template", f"no such file: {args.chat_template}")
    if args.step_separator == "":
        raise ConfigError("--step-separator", "must not be empty (leave it out to skip the check)")
    if args.tokenizer:
        from rmkit.models.setup import model_source  # torch, only when token statistics are asked for

        args.tokenizer = model_source(args.tokenizer, "--tokenizer")  # a packaged alias (minilm) becomes its folder


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    check_options(args)
    step_format = _step_format(args)
    if step_format:
        return check_steps(args, step_format)
    result = load(args)
    report = {
        "file": str(args.file),
        "format": result.format,
        "kind": "examples" if args.format == "regression" else "pairs",
        "records": len(result.records),
        "ties_skipped": result.ties_skipped,
        "problems": result.errors,
        "warnings": result.warnings,
    }
    if args.tokenizer and result.records:
        report["tokens"] = token_report(result, args)
    return emit(args, report, result.skipped, print_report)


def emit(args, report: dict, skipped: list, print_text) -> int:
    """The rejects file (`--rejects`), then the report as JSON (`--json`) or text; exit status 2 when a record is
    unusable."""
    if args.rejects:
        write_rejects(args.rejects, skipped)
    if args.json:
        json.dump(report, sys.stdout, indent=2, ensure_ascii=False)
        print()
    else:
        print_text(report)
    return 2 if report["problems"] else 0


def _step_format(args) -> str | None:
    """The step-labelled format to check the file as, or None for preference / regression data."""
    if args.format in STEP_FORMATS[1:]:
        return args.format
    if args.format != "auto":
        return None
    first = first_record(args.file, args.split)
    return detect_step_format(first) if first is not None else None


def check_steps(args, format: str) -> int:
    """A step-labelled file's report: solutions, steps, labels, steps per solution, problems."""
    if args.tokenizer:
        raise UserError("--tokenizer: token statistics cover preference and regression data, not step-labelled "
                        f"data ({args.file} is in the {format} format)")
    separator = args.step_separator
    if separator and "\\" in separator:  # "\n" typed at a shell; any other character is kept as it is
        separator = separator.encode("latin-1", "backslashreplace").decode("unicode_escape")
    result = load_step_data(args.file, format, ambiguous=args.ambiguous, step_separator=separator,
                            on_error="skip", split=args.split)
    summary = step_summary(result.records)
    report = {"file": str(args.file), "format": result.format, "kind": "solutions", "records": summary["solutions"],
              "steps": summary["steps"], "labels": summary["labels"], "steps_per_solution": summary["steps_per_solution"],
              "repeated_rows": result.repeated, "ambiguous": args.ambiguous, "problems": result.errors,
              "warnings": result.warnings}
    return emit(args, report, result.skipped, print_step_report)


def print_step_report(report: dict) -> None:
    print(loaded_line(report["file"], report["records"], "solution", report["format"]))
    labels = report["labels"]
    print(f"  steps: {report['steps']} (correct {labels['correct']}, wrong {labels['wrong']}, "
          f"unlabelled {labels['unlabelled']})")
    lengths = report["steps_per_solution"]
    if lengths:
        print(f"  steps per solution: min {lengths['min']}, median {lengths['median']:g}, max {lengths['max']}")
    if report["repeated_rows"]:
        print(f"  {_count(report['repeated_rows'], 'repeated row')} merged (the same step, steps before it and "
              "rating as a row read before)")
    for source, message in report["warnings"]:
        print(f"warning: {source}: {message}")
    for source, message in report["problems"]:
        print(f"error: {source}: {message}")
    print(f"{_count(len(report['problems']), 'problem')}, {_count(len(report['warnings']), 'warning')}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
