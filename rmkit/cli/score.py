"""`rmkit score --model DIR --input FILE --output FILE`: every record written back with its reward(s).

A record with `chosen` and `rejected` gets `reward_chosen` and `reward_rejected`; any other record is
scored as `prompt` + `response` (or `prompt` alone when it holds the whole text) and gets `reward`.
Fields may be text or lists of chat messages. A model with K > 1 outputs writes lists of K numbers.

A process reward model (its scoring contract names a step separator) scores each record's `prompt` (or
ProcessBench's `problem`) and `steps` (or TRL's `completions`): it gets `step_rewards`, each step's
probability of being correct, and `reward`, their aggregate (the contract's `step_aggregation`). A solution
longer than the max length keeps its beginning: the steps past it get null, and so does `reward`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rmkit.cli import description
from rmkit.cli.eval import add_model_arguments, load_for_inference
from rmkit.cli.output_file import check_output_file, write_lines
from rmkit.data.readers import RawRecord, check_data_path, read_records
from rmkit.data.steps import solution_to_score
from rmkit.data.tokenize import canonical_input
from rmkit.data.validate import text_or_messages
from rmkit.errors import DataError
from rmkit.inference import check_reward_model_dir
from rmkit.trainer.datasets import resolve_data_path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rmkit score", description=description(__doc__))
    add_model_arguments(parser)
    parser.add_argument("--input", required=True,
                        help="JSONL / JSON / Parquet file of records (default-val: the embedded validation set)")
    parser.add_argument("--output", required=True, help="JSONL file to write (the records plus rewards)")
    parser.add_argument("--prompt-key", default="prompt")
    parser.add_argument("--response-key", default="response")
    parser.add_argument("--chosen-key", default="chosen")
    parser.add_argument("--rejected-key", default="rejected")
    parser.add_argument("--steps-key", default="steps",
                        help="a process reward model's steps, a list of strings (default: steps, else completions)")
    return parser


def record_inputs(record: RawRecord, args: argparse.Namespace) -> tuple[list[str], list]:
    """`(output_keys, inputs)` of one record: a text or conversation per reward to write."""
    steps = next((k for k in (args.steps_key, "completions") if k in record.data), None)
    if steps is not None and args.response_key not in record.data and args.chosen_key not in record.data:
        raise record.error(steps, f"holds a solution's steps, but {args.model} is not a process reward model (its "
                                  "scoring_contract.json names no step_separator): it scores a prompt and a "
                                  f"'{args.response_key}'. Give a process reward model, or the response to score")
    prompt = text_or_messages(record, args.prompt_key)
    if args.chosen_key in record.data and args.rejected_key in record.data:
        keys = ["reward_chosen", "reward_rejected"]
        responses = [text_or_messages(record, k) for k in (args.chosen_key, args.rejected_key)]
    else:
        keys = ["reward"]
        response = record.data.get(args.response_key)
        responses = [text_or_messages(record, args.response_key) if response is not None else None]
    return keys, [canonical_input(prompt, response) for response in responses]


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    args.input = resolve_data_path(args.input)  # `default` / `default-val`: the embedded set, as `train` reads it
    check_data_path(args.input, "--input")  # the mistakes a user makes most, found before the model loads
    output = check_output_file(args.output, "--output", source=args.input)
    check_reward_model_dir(args.model, "--model")
    scorer = load_for_inference(args)
    if scorer.is_process:
        return score_steps(scorer, args, output)
    records, inputs, slots = [], [], []
    for item in read_records(args.input):
        if isinstance(item, DataError):
            raise item
        keys, values = record_inputs(item, args)
        slots.append([(key, len(inputs) + i) for i, key in enumerate(keys)])
        inputs.extend(values)
        records.append(item.data)
    if not records:
        raise DataError(args.input, None, None, "no records to score")
    encoded = scorer.encode(inputs)  # each input cut on its own: a reward never depends on its partner
    truncated = sum(full_length > len(ids) for ids, full_length in encoded)
    rewards = scorer.score_ids([ids for ids, _ in encoded])
    for record, record_slots in zip(records, slots):
        for key, index in record_slots:
            values = rewards[index].tolist()
            record[key] = values[0] if len(values) == 1 else values
    write_lines(output, (json.dumps(record, ensure_ascii=False) + "\n" for record in records))
    note = f" ({truncated} inputs truncated to {scorer.max_length} tokens)" if truncated else ""
    print(f"rmkit score: wrote {len(records)} records to {args.output}{note}", file=sys.stderr)
    return 0


def score_steps(scorer, args: argparse.Namespace, output: Path) -> int:
    """A process reward model's `step_rewards` and `reward` for every record (the module docstring)."""
    records = []
    for item in read_records(args.input):
        if isinstance(item, DataError):
            raise item
        records.append((item.data, solution_to_score(item, args.prompt_key, args.steps_key,
                                                     scorer.contract.step_separator)))
    if not records:
        raise DataError(args.input, None, None, "no records to score")
    scored = scorer.score_steps([solution for _, solution in records])
    for (record, _), result in zip(records, scored):
        record["step_rewards"], record["reward"] = result.step_rewards, result.reward
    write_lines(output, (json.dumps(record, ensure_ascii=False) + "\n" for record, _ in records))
    cut = sum(result.cut for result in scored)
    note = (f" ({cut} solutions longer than {scorer.max_length} tokens: their last steps and reward are null; "
            "--max-length N scores more)") if cut else ""
    print(f"rmkit score: wrote {len(records)} records to {args.output}{note}", file=sys.stderr)
    return 0
