"""How much preference data does a reward model need? Dev accuracy of rmkit's recipe against the number of
training pairs, with the length-only baseline beside it, as JSON and a PNG.

Each point trains `rmkit train` (through quality_vs_trl.py's run: a fresh subprocess, configs/rm.yaml's
recipe at `--max-length` for `--epochs`) on the first N pairs of one fixed draw of
`pref/alpacaeval_train.jsonl` (`--split-seed`: the subsets are nested, 500 inside 1,000 inside ...), then scores
`alpacaeval_dev.jsonl` and the two out-of-domain files. Per point: accuracy per seed, the mean, its paired
difference from "the longer response wins" with the standard error clustered by prompt, and the accuracy on
the pairs whose chosen reply is the longer one and the shorter one.

    python benchmarks/learning_curve.py --sizes 500,1000,2000,4000,8000,11066 --epochs 1
    python benchmarks/learning_curve.py --workload smollm2 --max-length 512 --sizes 500,1000 --micro-batch-size 4
    python benchmarks/learning_curve.py --workload smollm2 --max-length 512 --device cuda --threads 8  # on a GPU

`--device cuda` trains every point on the GPU (train_vs_trl.py's `--device`); the curve records it, and a point
measured on one device is not reused for a curve on the other.

`--reuse FILE` takes points already measured (the same size, seed and setting) from an earlier curve's JSON
or .partial.jsonl, or from a quality_vs_trl.py study's results (its `rmkit` runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common, harness, quality_vs_trl  # noqa: E402

RMKIT = ("rmkit", "rmkit", [])


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="500,1000,2000,4000,8000,11066", help="training pairs per point")
    parser.add_argument("--seeds", default="42")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--workload", default="minilm")
    parser.add_argument("--backbone", type=Path, help="another backbone than the workload's (tests use a tiny one)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--micro-batch-size", type=int)
    parser.add_argument("--split-seed", type=int, default=20261123)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where each point trains")
    parser.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA_DIR)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/rmkit-curve"))
    parser.add_argument("--reuse", type=Path, action="append", default=[], help="earlier results (repeatable)")
    parser.add_argument("--output", type=Path, default=common.REPO_ROOT / "benchmarks" / "results" / "learning_curve.json")
    args = parser.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    return args


def study_args(args: argparse.Namespace, size: int) -> argparse.Namespace:
    """quality_vs_trl.py's arguments for one point (its pref study, rmkit only)."""
    argv = ["--train-pairs", str(size), "--epochs", str(args.epochs), "--max-length", str(args.max_length),
            "--workload", args.workload, "--batch-size", str(args.batch_size), "--split-seed", str(args.split_seed),
            "--threads", str(args.threads), "--device", args.device, "--data-dir", str(args.data_dir),
            "--work-dir", str(args.work_dir / f"n{size}"), "--variants", "trl,rmkit",
            *(["--micro-batch-size", str(args.micro_batch_size)] if args.micro_batch_size else []),
            *(["--backbone", str(args.backbone)] if args.backbone else [])]
    return quality_vs_trl.parse_args(argv)


def earlier_runs(paths: list[Path]) -> dict[tuple[int, int], dict]:
    """rmkit runs of earlier curves or studies by `(training pairs, seed)`, with the setting they ran under."""
    found = {}
    for path in paths:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            payload = json.loads(text)
            runs = payload["runs"]
            for run in runs:
                run.setdefault("setting", payload.get("setting"))
        else:
            runs = [json.loads(line) for line in text.splitlines() if line]
        for run in runs:
            if run.get("variant") == "rmkit" and not run.get("overrides") and run.get("setting"):
                found[(run["setting"]["train_pairs"], run["seed"])] = {**run, "reused_from": str(path)}
    return found


def point(size: int, runs: list[dict], files: list[str], facts: dict) -> dict:
    """One point: per file the accuracies, their mean, the paired difference from the length-only baseline and
    the length-controlled accuracies (`quality_vs_trl.summarize`)."""
    row = quality_vs_trl.summarize(runs, files, facts)["rmkit"]
    return {"train_pairs": size, "seeds": row["seeds"], "pairs_per_s": row["pairs_per_s"],
            **{name: row[name] for name in files}}


def plot(payload: dict, path: Path) -> None:
    from rmkit.plotting import pyplot

    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    sizes = [p["train_pairs"] for p in payload["points"]]
    for name, style in zip(payload["files"], ("o-", "s--", "^:")):
        means = [p[name]["mean"] for p in payload["points"]]
        errors = [2 * p[name]["vs_length_only"]["standard_error"] for p in payload["points"]]
        ax.errorbar(sizes, means, yerr=errors, fmt=style, capsize=3, label=name.removesuffix(".jsonl"))
    dev = payload["files"][0]
    ax.axhline(payload["length_only"][dev], color="black", linewidth=1, linestyle="-.",
               label=f"{dev.removesuffix('.jsonl')}: the longer response wins")
    ax.axhline(0.5, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xscale("log")
    ax.minorticks_off()  # only the measured sizes are labelled
    ax.set_xticks(sizes, [f"{s:,}" for s in sizes])
    ax.set_xlabel("training pairs (alpacaeval_train, nested draws)")
    ax.set_ylabel("pairwise accuracy")
    ax.set_title(f"{payload['setting']['workload']}, max length {payload['setting']['max_length']}, "
                 f"{payload['setting']['epochs']} epoch(s): accuracy by training pairs (bars: 2 SE, clustered by prompt)",
                 fontsize=9)
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown_table(payload: dict) -> str:
    files = payload["files"]
    head = ["training pairs", "pairs/s"] + [f"{f.removesuffix('.jsonl')}: mean (vs length-only, SE)" for f in files]
    head.append(f"{files[0].removesuffix('.jsonl')}: chosen longer / not")
    rows = []
    for p in payload["points"]:
        cells = [f"{p['train_pairs']:,}", f"{p['pairs_per_s']:.2f}"]
        for f in files:
            vs = p[f]["vs_length_only"]
            cells.append(f"{p[f]['mean']:.1%} ({vs['mean_difference']:+.1%}, {vs['standard_error']:.1%})")
        lc = p[files[0]]["length_controlled"]
        cells.append(f"{lc['chosen_longer']:.1%} / {lc['chosen_not_longer']:.1%}")
        rows.append(cells)
    return harness.markdown(head, rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    earlier = earlier_runs(args.reuse)
    partial = args.output.with_suffix(".partial.jsonl")
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_text("")
    files = list(quality_vs_trl.PREF_FILES)
    facts = {name: quality_vs_trl.pair_facts(quality_vs_trl.pref_file(args.data_dir, name)) for name in files}
    setting = {"workload": str(args.backbone or args.workload), "max_length": args.max_length,
               "epochs": args.epochs, "batch_size": args.batch_size, "split_seed": args.split_seed,
               **({"device": args.device} if args.device != "cpu" else {})}
    points, every_run = [], []
    for size in args.sizes:
        study = study_args(args, size)
        train_path, eval_dir = quality_vs_trl.pref_split(study)
        runs, prepared = [], {}
        for seed in args.seeds:
            run = earlier.get((size, seed))
            measured_under = {"device": "cpu", **run["setting"]} if run is not None else {}  # CPU runs record none
            if run is not None and any(measured_under.get(k) != v for k, v in {"device": args.device, **setting}.items()):
                run = None  # measured under another setting
            if run is None:
                run = quality_vs_trl.one_run(study, train_path, eval_dir, files, seed, RMKIT, prepared)
                run["setting"] = {**setting, "study": "pref", "train_pairs": size}
            runs.append(run)
            with partial.open("a", encoding="utf-8") as out:
                out.write(json.dumps(run) + "\n")
        points.append(point(size, runs, files, facts))
        every_run += runs
    payload = {"command": "python benchmarks/learning_curve.py " + " ".join(argv), "machine": common.machine_info(),
               "setting": setting, "sizes": args.sizes, "seeds": args.seeds, "files": files,
               "length_only": {name: statistics.fmean(f["chosen_longer"]) for name, f in facts.items()},
               "points": points, "runs": every_run}
    common.write_json(args.output, payload)
    plot(payload, args.output.with_suffix(".png"))
    print(markdown_table(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
