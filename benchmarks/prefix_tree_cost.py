"""When does a prefix tree pay? A process reward model's forward + backward over sequences that share beginnings,
as padded rows (the plain forward) and as their token trie (`rmkit.models.prefix_tree`, `prm.share_prefixes`),
on SmolLM2-135M with a one-output head per token, fp32, the same threads. Three sets of 8 random-token sequences
of 300 tokens: sharing 150 tokens (PRM800K-like branches of one problem), sharing 20 (a chat template's worth:
one wide tree), sharing nothing (a tree per sequence). Beside each measured ratio, `tree_pays`'s estimate, which
decides `prm.share_prefixes: auto`. The two forwards take turns, in a rotated order each repeat; the summary is
the median seconds per pass.

    python benchmarks/prefix_tree_cost.py                     # 8 sequences of 300 tokens, 2 repeats
    python benchmarks/prefix_tree_cost.py --sequences 4 --length 500 --repeats 3
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

SHARED = {"branches": 0.5, "template": 20, "nothing": 0}  # how much each set's sequences share: a fraction or tokens


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a decoder directory (default: the packaged SmolLM2)")
    parser.add_argument("--sequences", type=int, default=8, help="sequences per forward (a micro-batch)")
    parser.add_argument("--length", type=int, default=300, help="tokens per sequence")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path,
                        default=common.REPO_ROOT / "benchmarks" / "results" / "prefix_tree_cost.json")
    return parser.parse_args(argv)


def sequence_sets(count: int, length: int, vocab: int) -> dict[str, list[list[int]]]:
    """Per entry of `SHARED`, `count` sequences of `length` random tokens that begin with the same tokens and part
    at the next one (sequence i's is token 5 + i, so that they share exactly that much)."""
    g = torch.Generator().manual_seed(0)

    def tokens(n: int) -> list[int]:
        return torch.randint(5, vocab, (n,), generator=g).tolist()

    sets = {}
    for name, share in SHARED.items():
        common_length = int(share * length) if isinstance(share, float) else share
        beginning = tokens(common_length)
        sets[name] = [beginning + [5 + i] + tokens(length - common_length - 1) for i in range(count)]
    return sets


def padded_pass(forward, sequences: list[list[int]]) -> None:
    ids = torch.zeros((len(sequences), max(map(len, sequences))), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(sequences):
        ids[i, :len(row)], mask[i, :len(row)] = torch.tensor(row), 1
    (forward(ids, mask).float() * mask).sum().backward()


def tree_pass(forward, model, sequences: list[list[int]]) -> None:
    from rmkit.models.prefix_tree import tree_layout, tree_values

    tree_values(forward, model, tree_layout(sequences), 0).float().sum().backward()


def timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    from rmkit.models import load_reward_model
    from rmkit.models.critic import TokenValues
    from rmkit.models.prefix_tree import TREE_MARGIN, tree_layout, tree_pays
    from rmkit.models.setup import resolve_model_name

    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(args.threads)
    model, _ = load_reward_model(args.model or resolve_model_name("smollm2"), num_labels=1)
    model.train()
    forward = TokenValues(model)
    results = {}
    for name, sequences in sequence_sets(args.sequences, args.length, model.config.vocab_size).items():
        layout = tree_layout(sequences)
        passes = {"padded": lambda s=sequences: padded_pass(forward, s),
                  "tree": lambda s=sequences: tree_pass(forward, model, s)}
        passes["padded"]()  # warm-up
        times = {k: [] for k in passes}
        for repeat in range(args.repeats):
            for k in list(passes)[repeat % 2:] + list(passes)[:repeat % 2]:
                times[k].append(timed(passes[k]))
                model.zero_grad(set_to_none=True)
        medians = {k: statistics.median(v) for k, v in times.items()}
        results[name] = {"tokens": sum(map(len, sequences)), "trie_tokens": len(layout.token_ids),
                         "trees": len(layout.trees), "seconds": times, "median_seconds": medians,
                         "tree_over_padded": medians["tree"] / medians["padded"],
                         "tree_pays": tree_pays(layout, model)}
        print(f"{name}: trie {len(layout.token_ids)} of {sum(map(len, sequences))} tokens, {len(layout.trees)} "
              f"tree(s); padded {medians['padded']:.1f} s, tree {medians['tree']:.1f} s "
              f"({results[name]['tree_over_padded']:.2f}x); tree_pays {results[name]['tree_pays']}", flush=True)
    common.write_json(args.output, {
        "command": "python benchmarks/prefix_tree_cost.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": common.machine_info(), "sequences": args.sequences, "length": args.length,
        "threads": args.threads, "repeats": args.repeats, "tree_margin": TREE_MARGIN, "sets": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
