"""The prompt computed once, measured: DPO's forward + backward over HH pairs with SmolLM2-135M, each pair as
two rows `[prompt, chosen]`, `[prompt, rejected]` (unshared) or as one row `[prompt, chosen, rejected]`
(`rmkit.models.shared_prefix`, as DPO's `PairLogits` runs it: on the CPU every pair of a batch in one row,
attended pair by pair, the output layer at the response positions only), the same pairs, fp32, the same threads.
A third setting, "packed", runs that with the layout GPUs take instead (pairs packed to rows no longer than the
longest, one attention over a row under a block-diagonal mask). The settings take turns, in a rotated order
each repeat, so that machine load drifts on all alike; the summary is the median seconds per pass.

    python benchmarks/shared_prefix.py                        # 16 pairs, batches of 4, max length 256, 3 repeats
    python benchmarks/shared_prefix.py --pairs 32 --repeats 5

Also reported: the fraction of the unshared rows' tokens that are prompt tokens (what sharing can save).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import common  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=Path, help="a causal LM directory (default: the packaged SmolLM2)")
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=4, help="pairs per forward + backward")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", type=Path, default=common.DEFAULT_DATA_DIR / "hh_harmless_train.jsonl")
    parser.add_argument("--output", type=Path, default=common.REPO_ROOT / "benchmarks" / "results" / "shared_prefix.json")
    return parser.parse_args(argv)


def unshared_logits(model, batch, pad_id):
    """A plain forward over the rows `[prompt, chosen]`, `[prompt, rejected]`, right-padded; the response tokens
    masked."""
    rows = [(p.prompt_ids + side, len(p.prompt_ids)) for p in batch for side in (p.chosen_ids, p.rejected_ids)]
    width = max(len(row) for row, _ in rows)
    data = {"input_ids": torch.full((len(rows), width), pad_id), "attention_mask": torch.zeros((len(rows), width)),
            "token_mask": torch.zeros((len(rows), width))}
    for i, (row, start) in enumerate(rows):
        data["input_ids"][i, :len(row)], data["attention_mask"][i, :len(row)] = torch.tensor(row), 1
        data["token_mask"][i, max(start, 1):len(row)] = 1
    return model(input_ids=data["input_ids"], attention_mask=data["attention_mask"], use_cache=False).logits, data


def shared_logits(model, batch, pad_id):
    """What DPO runs (`PairLogits`): the prompt once, pairs packed to rows, logits at the response positions."""
    from rmkit.models.pair_logprobs import PairLogits

    return PairLogits(model, pad_id, "float32")(batch)


def packed_logits(model, batch, pad_id):
    """`shared_logits` in the layout GPUs take: pairs packed to rows under one block-diagonal mask."""
    from unittest import mock

    from rmkit.models import shared_prefix

    with mock.patch.object(shared_prefix, "layout_for", lambda *_: shared_prefix.PACKED):
        return shared_logits(model, batch, pad_id)


FORWARDS = {"unshared": unshared_logits, "shared": shared_logits, "packed": packed_logits}


def one_pass(model, batches, pad_id, forward) -> float:
    """Seconds for forward + backward of the response log-probs over every batch."""
    from rmkit.losses.logprobs import aligned_logprobs

    start = time.perf_counter()
    for batch in batches:
        logits, data = forward(model, batch, pad_id)
        (aligned_logprobs(logits, data["input_ids"]) * data["token_mask"]).sum().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    from rmkit.data.policy_tokenize import tokenize_policy_pairs
    from rmkit.models.policy import load_policy_model
    from rmkit.models.setup import resolve_model_name

    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_policy_model(args.policy or resolve_model_name("smollm2"))
    pairs = tokenize_policy_pairs(common.load_pairs(args.data, args.pairs), tokenizer, args.max_length).pairs
    batches = [pairs[i:i + args.batch_size] for i in range(0, len(pairs), args.batch_size)]
    prompt = sum(2 * len(p.prompt_ids) for p in pairs)
    total = sum(2 * len(p.prompt_ids) + len(p.chosen_ids) + len(p.rejected_ids) for p in pairs)
    pad = tokenizer.pad_token_id
    one_pass(model, batches[:1], pad, shared_logits)  # warm-up (allocator, kernels)
    times = {name: [] for name in FORWARDS}
    for repeat in range(args.repeats):
        names = list(FORWARDS)
        for name in names[repeat % 3:] + names[:repeat % 3]:
            times[name].append(one_pass(model, batches, pad, FORWARDS[name]))
            print(f"{name}: {times[name][-1]:.1f} s", flush=True)
    medians = {k: statistics.median(v) for k, v in times.items()}
    payload = {
        "command": "python benchmarks/shared_prefix.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": common.machine_info(),
        "pairs": len(pairs), "batch_size": args.batch_size, "max_length": args.max_length, "threads": args.threads,
        "prompt_token_fraction": prompt / total,
        "seconds": times, "median_seconds": medians,
        "pairs_per_s": {k: len(pairs) / v for k, v in medians.items()},
        "speedup_shared_over_unshared": medians["unshared"] / medians["shared"],
        "speedup_shared_over_packed": medians["packed"] / medians["shared"],
    }
    common.write_json(args.output, payload)
    print(f"prompt tokens {payload['prompt_token_fraction']:.1%} of the unshared rows; pairs/s "
          f"unshared {payload['pairs_per_s']['unshared']:.2f}, shared {payload['pairs_per_s']['shared']:.2f} "
          f"({payload['speedup_shared_over_unshared']:.2f}x; {payload['speedup_shared_over_packed']:.2f}x the packed rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
