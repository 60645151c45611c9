"""`rmkit parity --model DIR --data FILE`: score a preference file through every rmkit path and report the
largest reward difference per path against the in-process inference core; exit 1 above the tolerance.

Paths: training-time validation, `rmkit score` (a real subprocess), a real `rmkit serve` on loopback at
request sizes 1, 2, 3 and 32 (4 requests in flight, so the server's dynamic batching mixes them),
`RewardModelEnvironment` in process and against that server (conversations only: its inputs are message
logs), and plain transformers (`AutoModelForSequenceClassification` + `AutoTokenizer`) on the inputs
that fit the contract's max length. Every side of every pair is one input: `prompt + response` for text,
the conversation for chat messages.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from rmkit.cli import description
from rmkit.cli.eval import add_model_arguments, load_for_inference
from rmkit.data import FORMATS, load_preference_data
from rmkit.data.readers import check_data_path
from rmkit.data.tokenize import canonical_input
from rmkit.errors import DataError
from rmkit.inference import RewardScorer, check_reward_model_dir
from rmkit.models.reward import transformers_progress_bars_off

REQUEST_SIZES = (1, 2, 3, 32)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rmkit parity", description=description(__doc__))
    add_model_arguments(parser)
    parser.add_argument("--data", required=True, help="preference file in any format rmkit reads")
    parser.add_argument("--format", default="auto", choices=FORMATS, help="record format (default: sniffed)")
    parser.add_argument("--limit", type=int, default=None, help="use the first N pairs (default: all)")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="largest allowed |difference| (float32)")
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
    pairs = load_preference_data(args.data, format=args.format).records[: args.limit]
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


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    report = check_parity(args)
    failed = [name for name, r in report["paths"].items()
              if r["max_abs_diff"] is not None and r["max_abs_diff"] > args.tolerance]
    if args.json:
        print(json.dumps({**report, "ok": not failed}))
    else:
        print(f"{report['inputs']} inputs from {args.data} ({report['truncated']} over max_length "
              f"{report['max_length']}), each path against the in-process core:")
        for name, r in report["paths"].items():
            diff = "n/a (no such inputs)" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.3g}"
            print(f"  {name:<40} {r['compared']:>6} inputs   max |diff| {diff}")
        print(f"parity {'FAILED on ' + ', '.join(failed) if failed else 'holds'} (tolerance {args.tolerance:g})")
    return 1 if failed else 0
