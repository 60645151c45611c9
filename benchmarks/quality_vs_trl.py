"""Does rmkit's reward-model recipe generalize as well as TRL's? Both trainers over several seeds, scored on a
dev split that no choice was ever made on.

The dev split: `--dev-pairs` pairs drawn from hh_harmless_train.jsonl with a fixed seed (`--split-seed`); every
run trains on the rest with configs/rm.yaml's recipe (MiniLM, 2 epochs, lr 5e-5, cosine after 5% warmup,
weight decay 0.01, batch 16, max length 256, fp32, dropout off). Each run is one of train_vs_trl.py's (a
fresh subprocess, the same timing hooks, the same scoring code through the inference core); a seed sets
the fresh head's initialization and the trainer's data order alike on both sides.

Per variant: dev accuracy per seed, its mean and spread, and pairs/s. Against TRL, a paired comparison on
the same pairs: per pair, the fraction of seeds each side got right; the mean difference over pairs and its
standard error. The issue's bar: rmkit's mean is not below TRL's by more than that standard error.

    python benchmarks/quality_vs_trl.py                                  # trl, rmkit, rmkit with random batches
    python benchmarks/quality_vs_trl.py --variants trl,rmkit,per_text:data.pair_truncation=per_text
    python benchmarks/quality_vs_trl.py --final                          # also hh_harmless_val.jsonl, once, at the end
    python benchmarks/quality_vs_trl.py --variants trl,rmkit,X:KEY=VALUE --reuse earlier.json  # only X's runs train

`--reuse FILE` (a results JSON or its .partial.jsonl) takes the runs of the same variant (label and
overrides), seed and scored files from an earlier study instead of training them again: a run is
deterministic given its seed (the same accuracies came back in studies days apart), so only its timing
would differ, and the reused runs' pairs/s are those of the earlier machine state.

A variant is `trl`, `rmkit`, or `LABEL:KEY=VALUE[+KEY=VALUE...]`: rmkit with those config overrides.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common, harness, train_vs_trl  # noqa: E402

DEFAULT_VARIANTS = "trl,rmkit,random_batches:data.batching=random"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--seeds", default="42,1,2")
    parser.add_argument("--dev-pairs", type=int, default=300)
    parser.add_argument("--split-seed", type=int, default=20261123)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--final", action="store_true", help="also score hh_harmless_val.jsonl (report it once)")
    parser.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA_DIR)
    parser.add_argument("--backbone", type=Path, help="another backbone than MiniLM (tests use a tiny one)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/rmkit-quality"))
    parser.add_argument("--reuse", type=Path, help="an earlier results JSON or .partial.jsonl whose matching runs are kept")
    parser.add_argument("--output", type=Path, default=common.REPO_ROOT / "benchmarks" / "results" / "quality_vs_trl.json")
    args = parser.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    args.variants = [parse_variant(v) for v in args.variants.split(",") if v]
    if "trl" not in {label for label, _, _ in args.variants}:
        parser.error("--variants must include trl: every variant is compared with it")
    return args


def parse_variant(text: str) -> tuple[str, str, list[str]]:
    """`(label, side, rmkit overrides)` of `trl`, `rmkit` or `LABEL:KEY=VALUE+KEY=VALUE`."""
    if text in ("trl", "rmkit"):
        return text, text, []
    label, _, overrides = text.partition(":")
    if not overrides or "=" not in overrides:
        raise SystemExit(f"--variants: {text!r} is not trl, rmkit or LABEL:KEY=VALUE[+KEY=VALUE...]")
    return label, "rmkit", overrides.split("+")


def carve_split(args: argparse.Namespace) -> tuple[Path, Path]:
    """`(train_rest.jsonl, eval_dir)`: `--dev-pairs` lines of the training file drawn with `--split-seed`
    go to `eval_dir/dev.jsonl` (with `--final`, hh_harmless_val.jsonl beside it); the rest is for training."""
    lines = (args.data_dir / "hh_harmless_train.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    order = list(range(len(lines)))
    random.Random(args.split_seed).shuffle(order)
    dev = set(order[:args.dev_pairs])
    eval_dir = args.work_dir / "eval"
    eval_dir.mkdir(parents=True, exist_ok=True)
    train_path = args.work_dir / "train_rest.jsonl"
    train_path.write_text("".join(line for i, line in enumerate(lines) if i not in dev), encoding="utf-8")
    (eval_dir / "dev.jsonl").write_text("".join(lines[i] for i in sorted(dev)), encoding="utf-8")
    if args.final:
        shutil.copyfile(args.data_dir / "hh_harmless_val.jsonl", eval_dir / "hh_harmless_val.jsonl")
    return train_path, eval_dir


def one_run(args, train_path: Path, eval_dir: Path, files: list[str], seed: int,
            variant: tuple[str, str, list[str]], prepared: dict) -> dict:
    """One seed of one variant through train_vs_trl.py; returns its result with per-pair correctness.
    `prepared` caches train_vs_trl's `prepare` per seed (the exported backbone, the tokenized pairs, the
    held-out pairs: the same for every variant of a seed)."""
    label, side, overrides = variant
    argv = ["--train-file", str(train_path), "--eval-dir", str(eval_dir), "--eval-files", ",".join(files),
            "--epochs", str(args.epochs), "--seed", str(seed), "--precision", "fp32", "--sides", side,
            "--batch-size", str(args.batch_size), "--threads", str(args.threads),
            "--work-dir", str(args.work_dir / f"seed-{seed}"),
            *(["--backbone", str(args.backbone)] if args.backbone else [])]
    for override in overrides:
        argv += ["--rmkit-override", override]
    run_args = train_vs_trl.parse_args(argv)
    if seed not in prepared:
        prepared[seed] = train_vs_trl.prepare(run_args)
    data = prepared[seed]
    result = train_vs_trl.run_once(run_args, data, side, "fp32", 0)
    result.update(variant=label, seed=seed, overrides=overrides)
    return result


def reusable_runs(path: Path | None, files: list[str]) -> dict[tuple, dict]:
    """Finished runs of an earlier study by `(variant label, overrides, seed)`; only those scored on every
    one of `files`."""
    if path is None:
        return {}
    text = path.read_text(encoding="utf-8")
    runs = json.loads(text)["runs"] if path.suffix == ".json" else [json.loads(line) for line in text.splitlines() if line]
    return {(r["variant"], tuple(r["overrides"]), r["seed"]): {**r, "reused_from": str(path)} for r in runs
            if all(f"correct/{name}" in r for name in files)}


def paired(mine: list[list[int]], theirs: list[list[int]]) -> dict:
    """Paired comparison over pairs: `mine[s][i]` / `theirs[s][i]` = seed s got pair i right. Per pair, the
    fraction of seeds right; the mean of the differences and its standard error."""
    a = [statistics.fmean(col) for col in zip(*mine)]
    b = [statistics.fmean(col) for col in zip(*theirs)]
    diff = [x - y for x, y in zip(a, b)]
    se = statistics.stdev(diff) / len(diff) ** 0.5 if len(diff) > 1 else float("nan")
    return {"mean_difference": statistics.fmean(diff), "standard_error": se,
            "not_below_by_more_than_se": statistics.fmean(diff) >= -se}


def _correct(runs: list[dict], seeds: list[int], name: str) -> list[list[int]]:
    """Per seed (in `seeds` order), the per-pair correctness on file `name`."""
    by_seed = {r["seed"]: r[f"correct/{name}"] for r in runs}
    return [by_seed[s] for s in seeds]


def summarize(runs: list[dict], files: list[str]) -> dict:
    summary = {}
    for label in dict.fromkeys(r["variant"] for r in runs):
        mine = [r for r in runs if r["variant"] == label]
        row = {"seeds": [r["seed"] for r in mine], "pairs_per_s": common.median([r["pairs_per_s"] for r in mine])}
        for name in files:
            accs = [r[f"accuracy/{name}"] for r in mine]
            row[name] = {"accuracy": accs, "mean": statistics.fmean(accs),
                         "std": statistics.stdev(accs) if len(accs) > 1 else 0.0}
        summary[label] = row
    trl = [r for r in runs if r["variant"] == "trl"]
    for label, row in summary.items():
        if label == "trl":
            continue
        mine = [r for r in runs if r["variant"] == label]
        seeds = sorted({r["seed"] for r in mine} & {r["seed"] for r in trl})
        row["vs_trl"] = {name: paired(_correct(mine, seeds, name), _correct(trl, seeds, name)) for name in files}
        row["vs_trl"]["speed_ratio"] = row["pairs_per_s"] / summary["trl"]["pairs_per_s"]
    return summary


def markdown_table(payload: dict) -> str:
    files = payload["files"]
    head = ["variant", "pairs/s"] + [f"{f}: mean ± std (per seed)" for f in files] + [f"{f}: vs TRL (paired SE)" for f in files]
    rows = []
    for label, row in payload["summary"].items():
        cells = [label, f"{row['pairs_per_s']:.2f}"]
        cells += [f"{row[f]['mean']:.1%} ± {row[f]['std']:.1%} ({', '.join(f'{a:.1%}' for a in row[f]['accuracy'])})"
                  for f in files]
        cells += [f"{row['vs_trl'][f]['mean_difference']:+.1%} ({row['vs_trl'][f]['standard_error']:.1%})"
                  if "vs_trl" in row else "-" for f in files]
        rows.append(cells)
    return harness.markdown(head, rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    train_path, eval_dir = carve_split(args)
    files = ["dev.jsonl"] + (["hh_harmless_val.jsonl"] if args.final else [])
    runs = []
    partial = args.output.with_suffix(".partial.jsonl")  # one line per finished run: a long study survives a kill
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_text("")
    prepared: dict[int, dict] = {}
    earlier = reusable_runs(args.reuse, files)
    for seed in args.seeds:
        for variant in args.variants:
            label, _, overrides = variant
            reused = earlier.get((label, tuple(overrides), seed))
            runs.append(reused or one_run(args, train_path, eval_dir, files, seed, variant, prepared))
            with partial.open("a", encoding="utf-8") as out:
                out.write(json.dumps(runs[-1]) + "\n")
    payload = {
        "command": "python benchmarks/quality_vs_trl.py " + " ".join(argv),
        "machine": common.machine_info(),
        "split": {"seed": args.split_seed, "dev_pairs": args.dev_pairs, "from": "hh_harmless_train.jsonl"},
        "epochs": args.epochs, "seeds": args.seeds, "files": files,
        "summary": summarize(runs, files),
        "runs": runs,
    }
    common.write_json(args.output, payload)
    print(markdown_table(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
