"""`rmkit parity --model DIR --data FILE`: score a preference file through every rmkit path and report the
largest reward difference per path against the in-process inference core; exit 1 above the tolerance.

Paths: training-time validation, `rmkit score` (a real subprocess), a real `rmkit serve` on loopback at
request sizes 1, 2, 3 and 32 (4 requests in flight, so the server's dynamic batching mixes them),
`RewardModelEnvironment` in process and against that server (conversations only: its inputs are message
logs), and plain transformers (`AutoModelForSequenceClassification` + `AutoTokenizer`) on the inputs
that fit the contract's max length. Every side of every pair is one input: `prompt + response` for text,
the conversation for chat messages.

A process reward model (its contract names a step separator) is checked on step-labelled solutions (ProcessBench,
TRL stepwise, PRM800K, PRMBench; labels unread) instead: every step's probability and the solution's aggregate
through the training forward (`rmkit.models.step_values`, one row at a time), `rmkit score` (a real subprocess), the real
server's `/v1/score_steps` at the same request sizes, and `RewardModelEnvironment` in process and against that
server (each solution as a conversation: the prompt as the user's message, the steps joined by the separator as
the response; its reward is checked against the aggregate of the steps within the max length, the environment's
rule). A process reward model given preference pairs, or an outcome model given solutions, is one line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from rmkit.cli import description
from rmkit.cli.arguments import float_at_least, positive_int
from rmkit.cli.eval import add_model_arguments, load_for_inference
from rmkit.data import FORMATS, load_preference_data
from rmkit.data.readers import check_data_path
from rmkit.data.steps import STEP_FORMATS, load_step_data
from rmkit.data.tokenize import canonical_input
from rmkit.errors import ConfigError, DataError
from rmkit.inference import RewardScorer, StepRewards, aggregate_steps, check_reward_model_dir
from rmkit.models.reward import transformers_progress_bars_off

REQUEST_SIZES = (1, 2, 3, 32)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rmkit parity", description=description(__doc__))
    add_model_arguments(parser)
    parser.add_argument("--data", required=True, help="preference file in any format rmkit reads")
    parser.add_argument("--format", default="auto", choices=list(dict.fromkeys(FORMATS + STEP_FORMATS)),
                        help="record format (default: sniffed); a process reward model's: one of "
                             f"{', '.join(STEP_FORMATS)}")
    parser.add_argument("--limit", type=positive_int, default=None, help="use the first N pairs or solutions (default: all)")
    parser.add_argument("--tolerance", type=float_at_least(0.0), default=1e-5, help="largest allowed |difference| (float32)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    return parser


def _plain_transformers(model_dir: str, scorer: RewardScorer, inputs: list, fits: list[bool]) -> dict[int, torch.Tensor]:
    """Rewards from transformers alone, one input at a time as a user would call it: texts through the
    tokenizer, conversations through its chat template (skipped when it has none: rmkit's plain rendering
    is rmkit's own)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    with transformers_progress_bars_off():
        model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    out = {}
    with torch.inference_mode():
        for i, (value, fit) in enumerate(zip(inputs, fits)):
            if not fit or (isinstance(value, list) and not tokenizer.chat_template):
                continue
            if isinstance(value, str):
                encoded = tokenizer(value, return_tensors="pt")
            else:
                text = tokenizer.apply_chat_template(value, tokenize=False)
                starts_special = any(t and text.startswith(t) for t in (tokenizer.bos_token, tokenizer.cls_token))
                encoded = tokenizer(text, add_special_tokens=not starts_special, return_tensors="pt")
            out[i] = model(**encoded).logits[0].float()
    return out


def _served(url: str, inputs: list) -> dict[str, dict[int, torch.Tensor]]:
    """Rewards from a running server at every request size, and from the environment pointed at it."""
    from rmkit.env import RewardModelEnvironment
    from rmkit.serve.client import RewardClient

    texts = [i for i, v in enumerate(inputs) if isinstance(v, str)]
    chats = [i for i, v in enumerate(inputs) if isinstance(v, list)]
    out = {}
    for size in REQUEST_SIZES:
        with RewardClient(url, batch_size=size, concurrency=4) as client:
            rewards = {}
            for indices, score in ((texts, client.score_texts), (chats, client.score_conversations)):
                if indices:
                    rewards.update(zip(indices, map(_row, score([inputs[i] for i in indices]))))
            out[f"serve (requests of {size})"] = rewards
    out["environment (remote)"] = {}
    if chats:
        env = RewardModelEnvironment({"url": url, "batch_size": 32})
        out["environment (remote)"] = dict(zip(chats, map(_row, env.score([inputs[i] for i in chats]).tolist())))
        env.shutdown()
    return out


def _row(value) -> torch.Tensor:
    return torch.tensor(value if isinstance(value, list) else [value], dtype=torch.float32)


def _cli_score(model_dir: str, pairs: Sequence, max_length: int | None) -> dict[int, torch.Tensor]:
    """`rmkit score` in a real child process on the pairs written as prompt/chosen/rejected records."""
    with tempfile.TemporaryDirectory() as tmp:
        source, scored = Path(tmp) / "pairs.jsonl", Path(tmp) / "scored.jsonl"
        with open(source, "w", encoding="utf-8") as out:
            for pair in pairs:
                out.write(json.dumps({"prompt": pair.prompt, "chosen": pair.chosen, "rejected": pair.rejected}) + "\n")
        cmd = [sys.executable, "-m", "rmkit", "score", "--model", model_dir, "--input", str(source),
               "--output", str(scored)] + (["--max-length", str(max_length)] if max_length else [])
        done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
        if done.returncode != 0:
            raise RuntimeError(f"rmkit score failed ({done.returncode}):\n{done.stderr}")
        rows = [json.loads(line) for line in scored.read_text(encoding="utf-8").splitlines()]
    return {2 * k + side: _row(row[key]) for k, row in enumerate(rows)
            for side, key in enumerate(("reward_chosen", "reward_rejected"))}


def _in_process_paths(scorer: RewardScorer, model_dir: str, pairs: Sequence, inputs: list) -> dict[str, Callable]:
    from rmkit.env import RewardModelEnvironment
    from rmkit.validation import score_pairs

    def validation():
        chosen, rejected = score_pairs(scorer, scorer.encode_pairs(pairs).pairs)
        return {2 * k + side: rows[k] for side, rows in enumerate((chosen, rejected)) for k in range(len(pairs))}

    def environment():
        chats = [i for i, v in enumerate(inputs) if isinstance(v, list)]
        if not chats:
            return {}
        env = RewardModelEnvironment({"model_name": model_dir, "max_length": scorer.max_length})
        rewards = env.step([inputs[i] for i in chats], [None] * len(chats)).rewards
        env.shutdown()
        return dict(zip(chats, map(_row, rewards.tolist())))

    return {"validation (training)": validation, "environment (in process)": environment}


def check_parity(args: argparse.Namespace) -> dict:
    """`{path: {"compared": n, "max_abs_diff": d}}` of every path against the in-process core."""
    check_data_path(args.data, "--data")  # before the model loads
    check_reward_model_dir(args.model, "--model")
    scorer = load_for_inference(args)
    if scorer.is_process:
        return check_step_parity(args, scorer)
    pairs = _pairs_for_outcome_model(args, scorer)
    if not pairs:
        raise DataError(args.data, None, None, "no pairs to compare")
    inputs = [canonical_input(p.prompt, side) for p in pairs for side in (p.chosen, p.rejected)]
    encoded = scorer.encode(inputs)
    reference = scorer.score_ids([ids for ids, _ in encoded])
    fits = [full_length <= scorer.max_length for _, full_length in encoded]
    results = {name: path() for name, path in _in_process_paths(scorer, args.model, pairs, inputs).items()}
    results["rmkit score (CLI)"] = _cli_score(args.model, pairs, args.max_length)
    from rmkit.serve.process import ServerProcess

    extra = ["--max-inputs", "1024"] + (["--max-length", str(args.max_length)] if args.max_length else [])
    with ServerProcess(args.model, *extra) as server:
        results.update(_served(server.url, inputs))
    results["transformers (inputs under the limit)"] = _plain_transformers(args.model, scorer, inputs, fits)
    report = {}
    for name, rewards in results.items():
        diffs = [float((row - reference[i, : row.numel()]).abs().max()) for i, row in rewards.items()]
        report[name] = {"compared": len(diffs), "max_abs_diff": max(diffs) if diffs else None}
    return {"inputs": len(inputs), "truncated": fits.count(False), "max_length": scorer.max_length,
            "tolerance": args.tolerance, "paths": report}


def _pairs_for_outcome_model(args: argparse.Namespace, scorer: RewardScorer) -> list:
    """The first `--limit` preference pairs of `--data`; a file of step-labelled solutions is a ConfigError saying
    the model scores whole responses."""
    try:
        return load_preference_data(args.data, format=args.format).records[: args.limit]
    except DataError:
        if args.format in STEP_FORMATS and _loads(load_step_data, args.data, args.format):
            scorer.check_process(args.model)
        raise


def _loads(load: Callable, path: str, format: str) -> bool:
    try:
        load(path, format=format)
    except DataError:
        return False
    return True


# ---- a process reward model -----------------------------------------------------------------------------------

STEP_PATHS_NOTE = "(plain transformers has no step layout: rmkit's step_tokenize is the reference)"


def _solutions(args: argparse.Namespace, scorer: RewardScorer) -> list[tuple[str, tuple[str, ...]]]:
    """`(prompt, steps)` of the first `--limit` solutions of `--data`; a preference file is a ConfigError saying the
    model is a process reward model."""
    format = args.format if args.format in STEP_FORMATS else "auto"
    try:
        records = load_step_data(args.data, format=format, step_separator=scorer.contract.step_separator).records
    except DataError:
        if args.format in FORMATS and _loads(load_preference_data, args.data, args.format):
            raise ConfigError("--data", f"{args.data} holds preference pairs, but {args.model} is a process reward "
                                        "model (scoring_contract.json step_separator "
                                        f"{scorer.contract.step_separator!r}): give step-labelled solutions "
                                        "(ProcessBench or TRL stepwise layout)") from None
        raise
    solutions = [(r.prompt, r.steps) for r in records[: args.limit]]
    if not solutions:
        raise DataError(args.data, None, None, "no solutions to compare")
    return solutions


def _training_forward(scorer: RewardScorer, solutions: Sequence) -> list[list[float | None]]:
    """Step probabilities from the training forward (`rmkit.models.step_values`: a decoder's head at every position
    of the solution, an encoder's pooled output of each step's prefix row), one row at a time, read at the positions
    the core's layout gives."""
    from rmkit.models.step_values import scores_each_prefix, step_values

    forward, out = step_values(scorer.model).eval(), []
    with torch.inference_mode():
        for prompt, steps in solutions:
            ids, positions, num_steps = scorer.encode_solution(prompt, steps)
            rows = [(ids[: p + 1], p) for p in positions] if scores_each_prefix(scorer.model) else [(ids, None)]
            values = []
            for row, at in rows:
                row_values = forward(torch.tensor([row]), torch.ones(1, len(row), dtype=torch.long))[0]
                values += [row_values[at]] if at is not None else [row_values[p] for p in positions]
            probabilities = torch.sigmoid(torch.stack(values).double()).tolist() if values else []
            out.append(probabilities + [None] * (num_steps - len(positions)))
    return out


def _cli_score_steps(model_dir: str, solutions: Sequence, max_length: int | None) -> list[list[float | None]]:
    """`rmkit score` in a real child process on the solutions written as prompt/steps records."""
    with tempfile.TemporaryDirectory() as tmp:
        source, scored = Path(tmp) / "solutions.jsonl", Path(tmp) / "scored.jsonl"
        source.write_text("".join(json.dumps({"prompt": p, "steps": list(s)}) + "\n" for p, s in solutions),
                          encoding="utf-8")
        cmd = [sys.executable, "-m", "rmkit", "score", "--model", model_dir, "--input", str(source),
               "--output", str(scored)] + (["--max-length", str(max_length)] if max_length else [])
        done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
        if done.returncode != 0:
            raise RuntimeError(f"rmkit score failed ({done.returncode}):\n{done.stderr}")
        return [json.loads(line)["step_rewards"] for line in scored.read_text(encoding="utf-8").splitlines()]


def _as_conversation(prompt: str, steps: Sequence[str], separator: str) -> list[dict] | None:
    """The solution as the environment sees a rollout, or None when the response would not split back into these
    steps (a step that ends with part of the separator)."""
    response = separator.join(steps)
    if [piece for piece in response.split(separator) if piece.strip()] != list(steps):
        return None
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]


def _environment_rewards(config: dict, conversations: dict[int, list[dict]]) -> dict[int, float]:
    from rmkit.env import RewardModelEnvironment

    env = RewardModelEnvironment(config)
    try:
        return dict(zip(conversations, env.score(list(conversations.values())).tolist()))
    finally:
        env.shutdown()


def _step_diff(got: Sequence[float | None], want: StepRewards) -> float:
    """The largest |difference| of two solutions' step probabilities; inf when their unscored steps differ."""
    if len(got) != len(want.step_rewards) or [g is None for g in got] != [w is None for w in want.step_rewards]:
        return math.inf
    return max((abs(g - w) for g, w in zip(got, want.step_rewards) if g is not None), default=0.0)


def check_step_parity(args: argparse.Namespace, scorer: RewardScorer) -> dict:
    """`{path: {"compared", "max_abs_diff" (step probabilities), "max_abs_diff_reward"}}` of every path a process
    reward model has, against the in-process core."""
    from rmkit.serve.client import RewardClient
    from rmkit.serve.process import ServerProcess

    solutions = _solutions(args, scorer)
    reference = scorer.score_steps(solutions)
    how, separator = scorer.contract.step_aggregation, scorer.contract.step_separator
    steps = {"training forward": _training_forward(scorer, solutions),
             "rmkit score (CLI)": _cli_score_steps(args.model, solutions, args.max_length)}
    conversations = {i: c for i, (p, s) in enumerate(solutions) if (c := _as_conversation(p, s, separator))}
    env_rewards = {"environment (in process)": _environment_rewards(
        {"model_name": args.model, "max_length": scorer.max_length}, conversations)}
    extra = ["--max-inputs", "1024"] + (["--max-length", str(args.max_length)] if args.max_length else [])
    with ServerProcess(args.model, *extra) as server:
        for size in REQUEST_SIZES:
            with RewardClient(server.url, batch_size=size, concurrency=4) as client:
                steps[f"serve (requests of {size})"] = [r["step_rewards"] for r in client.score_steps(solutions)]
        env_rewards["environment (remote)"] = _environment_rewards({"url": server.url, "batch_size": 32}, conversations)
    report = {}
    for name, got in steps.items():
        diffs = [_step_diff(g, w) for g, w in zip(got, reference)]
        rewards = [abs(aggregate_steps(g, how) - w.reward) for g, w in zip(got, reference)
                   if not w.cut and None not in g]  # a step unscored where the core scored it: already inf above
        report[name] = {"compared": len(diffs), "max_abs_diff": max(diffs), "max_abs_diff_reward": max(rewards, default=None)}
    for name, got in env_rewards.items():  # the environment's rule: the aggregate of the steps within the max length
        kept = {i: [p for p in reference[i].step_rewards if p is not None] for i in got}
        diffs = [abs(got[i] - aggregate_steps(kept[i], how)) for i in got if kept[i]]
        report[name] = {"compared": len(diffs), "max_abs_diff": None, "max_abs_diff_reward": max(diffs, default=None)}
    return {"solutions": len(solutions), "steps": sum(len(s) for _, s in solutions),
            "cut": sum(r.cut for r in reference), "max_length": scorer.max_length, "tolerance": args.tolerance,
            "step_aggregation": how, "paths": report}


def _failed(report: dict, tolerance: float) -> list[str]:
    return [name for name, r in report["paths"].items()
            if any(r.get(key) is not None and not r[key] <= tolerance for key in ("max_abs_diff", "max_abs_diff_reward"))]


def _print_pairs(report: dict, data: str) -> None:
    print(f"{report['inputs']} inputs from {data} ({report['truncated']} over max_length "
          f"{report['max_length']}), each path against the in-process core:")
    for name, r in report["paths"].items():
        diff = "n/a (no such inputs)" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.3g}"
        print(f"  {name:<40} {r['compared']:>6} inputs   max |diff| {diff}")


def _print_steps(report: dict, data: str) -> None:
    print(f"{report['solutions']} solutions ({report['steps']} steps) from {data} ({report['cut']} with steps past "
          f"max_length {report['max_length']}), each path against the in-process core {STEP_PATHS_NOTE}:")
    for name, r in report["paths"].items():
        steps = "n/a" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.3g}"
        reward = "n/a" if r["max_abs_diff_reward"] is None else f"{r['max_abs_diff_reward']:.3g}"
        print(f"  {name:<40} {r['compared']:>6} solutions   max |diff| steps {steps}, {report['step_aggregation']} {reward}")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    report = check_parity(args)
    failed = _failed(report, args.tolerance)
    if args.json:
        print(json.dumps({**report, "ok": not failed}))
    else:
        (_print_steps if "solutions" in report else _print_pairs)(report, args.data)
        print(f"parity {'FAILED on ' + ', '.join(failed) if failed else 'holds'} (tolerance {args.tolerance:g})")
    return 1 if failed else 0
