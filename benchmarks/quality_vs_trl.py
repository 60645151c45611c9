"""Does rmkit's reward-model recipe generalize as well as TRL's? Both trainers over several seeds, scored on
pairs that no choice was ever made on.

Two studies (`--study`):

- `pref` (the default): train on `pref/alpacaeval_train.jsonl` (11,066 GPT-4-judged pairs on 639 prompts; all,
  or `--train-pairs N` drawn with `--split-seed`, the same N for every seed and variant), score on
  `pref/alpacaeval_dev.jsonl` (1,272 pairs on 74 other prompts) and, out of domain, on `hh_harmless_val.jsonl`
  and `pandalm_val.jsonl`. The judge prefers longer answers, so every file also gets the length-only baseline
  ("the longer response wins", in characters) and each variant its accuracy on the pairs whose chosen reply is
  the longer and the shorter one.
- `hh`: the earlier study: `--dev-pairs` pairs drawn from `hh_harmless_train.jsonl` (`--split-seed`) are the
  dev split, the rest is trained on; with `--final`, `hh_harmless_val.jsonl` too.

Every run trains with configs/rm.yaml's recipe (lr 5e-5, cosine after 5% warmup, weight decay 0.01, batch 16,
fp32, dropout off) at `--max-length` for `--epochs` on `--workload`'s backbone. Each run is one of
train_vs_trl.py's (a fresh subprocess, the same timing hooks, the same scoring code through the inference
core); a seed sets the fresh head's initialization and the trainer's data order alike on both sides.

Per variant: accuracy per seed, its mean and spread, and pairs/s. Against TRL, a paired comparison on the same
pairs: per pair, the fraction of seeds each side got right; the mean difference over pairs and its standard
error, clustered by prompt (pairs that share a prompt are not independent: dev has 74 prompts). The same
paired comparison against the length-only baseline says whether a model beats "the longer response wins".

    python benchmarks/quality_vs_trl.py --train-pairs 2000 --epochs 1           # pref: trl, rmkit, random batches
    python benchmarks/quality_vs_trl.py --workload smollm2 --max-length 512 --train-pairs 1000
    python benchmarks/quality_vs_trl.py --study hh --final                      # the earlier HH study
    python benchmarks/quality_vs_trl.py --variants trl,rmkit,X:KEY=VALUE --reuse earlier.json  # only X's runs train

`--reuse FILE` (a results JSON or its .partial.jsonl; repeatable, a later file's run replacing an earlier one's)
takes the runs of the same variant (label and overrides), seed and scored files from earlier studies instead of
training them again: a run is
deterministic given its seed (the same accuracies came back in studies days apart), so only its timing
would differ, and the reused runs' pairs/s are those of the earlier machine state. Only a study with the same
training pairs, length and epochs may be reused: the results file records them.

`--keep-models DIR` keeps every run's trained model as `DIR/<variant>-seed<S>` (for `rmkit merge`). With
`--head-seed H` every run starts from the one score head seed H draws, and the seeds vary only the data order (the
setting of WARM, whose members are fine-tuned from one shared initialization); a study records it, and its runs
are reused only by a study with the same head seed.

A variant is `trl`, `rmkit`, or `LABEL:KEY=VALUE[+KEY=VALUE...]`: rmkit with those config overrides. An arm of
overrides is compared pair by pair with TRL and with rmkit's default recipe (`vs_rmkit`: what the rule for the
shipped defaults reads). A study may leave TRL out (`--variants rmkit,ARM...`): rmkit's arms alone.

`compare BASE.json OTHER.json` sets two studies of one training draw side by side (another max length, another
number of epochs): per variant both hold, per file, the paired difference OTHER minus BASE over the same pairs and
seeds, its standard error clustered by prompt (the rule for the shipped defaults reads it):

    python benchmarks/quality_vs_trl.py compare RESULTS_256.json RESULTS_512.json --output compare.json
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common, harness, train_vs_trl  # noqa: E402

DEFAULT_VARIANTS = "trl,rmkit,random_batches:data.batching=random"
PREF_TRAIN = "pref/alpacaeval_train.jsonl"
PREF_FILES = ("alpacaeval_dev.jsonl", "hh_harmless_val.jsonl", "pandalm_val.jsonl")  # dev first, then out of domain


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", choices=["pref", "hh"], default="pref")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--seeds", default="42,1,2")
    parser.add_argument("--train-pairs", type=int, help="pref: train on N pairs drawn with --split-seed (default: all)")
    parser.add_argument("--dev-pairs", type=int, default=300, help="hh: pairs carved from the training file")
    parser.add_argument("--split-seed", type=int, default=20261123)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--head-seed", type=int,
                        help="every run starts from one score head drawn with this seed; the seeds vary the data "
                             "order only (WARM's setting for `rmkit merge`; default: each seed draws its own head)")
    parser.add_argument("--workload", choices=sorted(train_vs_trl.WORKLOADS), default="minilm")
    parser.add_argument("--final", action="store_true", help="hh: also score hh_harmless_val.jsonl (report it once)")
    parser.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA_DIR)
    parser.add_argument("--backbone", type=Path, help="another backbone than the workload's (tests use a tiny one)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--micro-batch-size", type=int, help="pairs per forward/backward (default: --batch-size)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where both trainers run (train_vs_trl.py's --device); a study records cuda")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/rmkit-quality"))
    parser.add_argument("--keep-models", type=Path, help="keep each run's model as DIR/<variant>-seed<S>")
    parser.add_argument("--reuse", type=Path, action="append", default=[],
                        help="an earlier results JSON or .partial.jsonl whose matching runs are kept (repeatable)")
    parser.add_argument("--output", type=Path, default=common.REPO_ROOT / "benchmarks" / "results" / "quality_vs_trl.json")
    args = parser.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    args.variants = [parse_variant(v) for v in args.variants.split(",") if v]
    if not {"trl", "rmkit"} & {label for label, _, _ in args.variants}:
        parser.error("--variants must include trl or rmkit: every other variant is compared with them")
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
    """hh: `(train_rest.jsonl, eval_dir)`: `--dev-pairs` lines of the training file drawn with `--split-seed`
    go to `eval_dir/dev.jsonl` (with `--final`, hh_harmless_val.jsonl beside it); the rest is for training."""
    lines = common.data_file(args.data_dir, "hh_harmless_train.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    order = list(range(len(lines)))
    random.Random(args.split_seed).shuffle(order)
    dev = set(order[:args.dev_pairs])
    eval_dir = args.work_dir / "eval"
    eval_dir.mkdir(parents=True, exist_ok=True)
    train_path = args.work_dir / "train_rest.jsonl"
    train_path.write_text("".join(line for i, line in enumerate(lines) if i not in dev), encoding="utf-8")
    (eval_dir / "dev.jsonl").write_text("".join(lines[i] for i in sorted(dev)), encoding="utf-8")
    if args.final:
        shutil.copyfile(common.data_file(args.data_dir, "hh_harmless_val.jsonl"), eval_dir / "hh_harmless_val.jsonl")
    return train_path, eval_dir


def pref_split(args: argparse.Namespace) -> tuple[Path, Path]:
    """pref: `(train.jsonl, eval_dir)`: all of alpacaeval_train.jsonl, or `--train-pairs` of its lines drawn with
    `--split-seed` (kept in file order); `eval_dir` links the dev file and the two out-of-domain files (the
    data stays where it is: its licence keeps it out of the repository)."""
    lines = pref_file(args.data_dir, PREF_TRAIN).read_text(encoding="utf-8").splitlines(keepends=True)
    if args.train_pairs is not None:
        if not 0 < args.train_pairs <= len(lines):
            raise SystemExit(f"--train-pairs: {args.train_pairs} is not between 1 and {len(lines)}")
        order = list(range(len(lines)))
        random.Random(args.split_seed).shuffle(order)
        lines = [lines[i] for i in sorted(order[:args.train_pairs])]
    args.work_dir.mkdir(parents=True, exist_ok=True)
    train_path = args.work_dir / "train.jsonl"
    train_path.write_text("".join(lines), encoding="utf-8")
    eval_dir = args.work_dir / "eval"
    eval_dir.mkdir(exist_ok=True)
    for name in PREF_FILES:
        source = pref_file(args.data_dir, name)
        link = eval_dir / name
        link.unlink(missing_ok=True)
        link.symlink_to(source.resolve())
    return train_path, eval_dir


def pref_file(data_dir: Path, name: str) -> Path:
    """Where one of `PREF_FILES` lives under the data folder (the AlpacaEval files in `pref/`)."""
    return common.data_file(data_dir, "pref/" + name if name.startswith("alpacaeval") else name)


def pair_facts(path: Path) -> dict:
    """What the paired statistics need of a scored file, in the order its pairs are scored (`common.load_pairs`):
    `clusters` (per pair, the index of its prompt among the file's distinct prompts) and `chosen_longer` (1
    where the chosen response has more characters than the rejected one; the length-only baseline's pick)."""
    from rmkit.report.metrics import response_length

    pairs = common.load_pairs(path)
    keys = [p.prompt if isinstance(p.prompt, str) else json.dumps(p.prompt, sort_keys=True) for p in pairs]
    index = {key: i for i, key in enumerate(dict.fromkeys(keys))}
    return {"clusters": [index[k] for k in keys],
            "chosen_longer": [int(response_length(p.chosen) > response_length(p.rejected)) for p in pairs]}


def one_run(args, train_path: Path, eval_dir: Path, files: list[str], seed: int,
            variant: tuple[str, str, list[str]], prepared: dict) -> dict:
    """One seed of one variant through train_vs_trl.py; returns its result with per-pair correctness.
    `prepared` caches train_vs_trl's `prepare` per seed (the exported backbone, the tokenized pairs, the
    held-out pairs: the same for every variant of a seed)."""
    label, side, overrides = variant
    run_args = train_vs_trl_args(args, train_path, eval_dir, files, seed, variant)
    if seed not in prepared:
        prepared[seed] = train_vs_trl.prepare(run_args)
    data = prepared[seed]
    result = train_vs_trl.run_once(run_args, data, side, "fp32", 0)
    result.update(variant=label, seed=seed, overrides=overrides)
    return result


def train_vs_trl_args(args, train_path: Path, eval_dir: Path, files: list[str], seed: int,
                      variant: tuple[str, str, list[str]]) -> argparse.Namespace:
    """train_vs_trl.py's arguments for one run of this study: every pair of `train_path` and of the scored files."""
    label, side, overrides = variant
    argv = ["--train-file", str(train_path), "--eval-dir", str(eval_dir), "--eval-files", ",".join(files),
            "--workload", args.workload, "--max-length", str(args.max_length),
            "--epochs", str(args.epochs), "--seed", str(seed), "--precision", "fp32", "--sides", side,
            "--batch-size", str(args.batch_size), "--threads", str(args.threads), "--device", args.device,
            "--pairs", str(10**9), "--eval-pairs", str(10**9),  # every pair, whatever the workload's defaults
            "--work-dir", str(args.work_dir / f"seed-{seed}"),
            *(["--micro-batch-size", str(args.micro_batch_size)] if args.micro_batch_size else []),
            *(["--head-seed", str(args.head_seed)] if args.head_seed is not None else []),
            *(["--backbone", str(args.backbone)] if args.backbone else [])]
    if args.keep_models:
        argv += ["--keep-model", str(args.keep_models / f"{label}-seed{seed}")]
    for override in overrides:
        argv += ["--rmkit-override", override]
    return train_vs_trl.parse_args(argv)


def reusable_runs(paths: Sequence[Path], files: list[str], setting: dict | None = None) -> dict[tuple, dict]:
    """Finished runs of earlier studies (`paths`, a later file's run replacing an earlier one's) by `(variant label,
    overrides, seed)`; only those scored on every one of `files`, and (a results JSON that records it) only when
    its `setting` is this study's."""
    found = {}
    for path in paths:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            payload = json.loads(text)
            if setting is not None and payload.get("setting", setting) != setting:
                raise SystemExit(f"--reuse: {path} trained with {payload['setting']}, this study with {setting}")
            runs = payload["runs"]
        else:
            runs = [json.loads(line) for line in text.splitlines() if line]
        found.update({(r["variant"], tuple(r["overrides"]), r["seed"]): {**r, "reused_from": str(path)} for r in runs
                      if all(f"correct/{name}" in r for name in files)})
    return found


def paired(mine: list[list[int]], theirs: list[list[int]], clusters: list[int] | None = None) -> dict:
    """Paired comparison over pairs: `mine[s][i]` / `theirs[s][i]` = seed s got pair i right. Per pair, the
    fraction of seeds right; the mean of the differences and its standard error.

    With `clusters` (per pair, its prompt), the standard error is the cluster-robust one (Liang & Zeger 1986,
    with the G/(G-1) small-sample factor): `sqrt(G/(G-1) * sum_g (sum_{i in g} (d_i - mean))^2) / n` over the
    G prompts; with one pair per prompt it is the plain `stdev / sqrt(n)`."""
    a = [statistics.fmean(col) for col in zip(*mine)]
    b = [statistics.fmean(col) for col in zip(*theirs)]
    diff = [x - y for x, y in zip(a, b)]
    n, mean = len(diff), statistics.fmean(diff)
    if clusters is None:
        se = statistics.stdev(diff) / n ** 0.5 if n > 1 else float("nan")
    else:
        sums: dict[int, float] = {}
        for d, g in zip(diff, clusters, strict=True):
            sums[g] = sums.get(g, 0.0) + d - mean
        groups = len(sums)
        se = (groups / (groups - 1) * sum(v * v for v in sums.values())) ** 0.5 / n if groups > 1 else float("nan")
    result = {"mean_difference": mean, "standard_error": se, "not_below_by_more_than_se": mean >= -se}
    if clusters is not None:
        result["clusters"] = len(set(clusters))
    return result


def _correct(runs: list[dict], seeds: list[int], name: str) -> list[list[int]]:
    """Per seed (in `seeds` order), the per-pair correctness on file `name`."""
    by_seed = {r["seed"]: r[f"correct/{name}"] for r in runs}
    return [by_seed[s] for s in seeds]


def length_controlled(correct: list[list[int]], chosen_longer: list[int]) -> dict:
    """Mean accuracy over seeds on the pairs whose chosen response is the longer one and the shorter (or as
    long) one."""
    right = [statistics.fmean(col) for col in zip(*correct)]
    longer = [r for r, c in zip(right, chosen_longer) if c]
    shorter = [r for r, c in zip(right, chosen_longer) if not c]
    return {"chosen_longer": statistics.fmean(longer) if longer else None, "n_longer": len(longer),
            "chosen_not_longer": statistics.fmean(shorter) if shorter else None, "n_not_longer": len(shorter)}


def summarize(runs: list[dict], files: list[str], facts: dict | None = None) -> dict:
    """Per variant and file: accuracies, their mean and spread; against TRL the paired difference; with
    `facts` (pref: per file `clusters` and `chosen_longer`), standard errors clustered by prompt, the
    difference from the length-only baseline and the length-controlled accuracies."""
    facts = facts or {}
    summary = {}
    for label in dict.fromkeys(r["variant"] for r in runs):
        mine = [r for r in runs if r["variant"] == label]
        seeds = [r["seed"] for r in mine]
        row = {"seeds": seeds, "pairs_per_s": common.median([r["pairs_per_s"] for r in mine])}
        for name in files:
            accs = [r[f"accuracy/{name}"] for r in mine]
            row[name] = {"accuracy": accs, "mean": statistics.fmean(accs),
                         "std": statistics.stdev(accs) if len(accs) > 1 else 0.0}
            if name in facts:
                correct, longer = _correct(mine, seeds, name), facts[name]["chosen_longer"]
                row[name]["vs_length_only"] = paired(correct, [longer], facts[name]["clusters"])
                row[name]["length_controlled"] = length_controlled(correct, longer)
        summary[label] = row
    for label, row in summary.items():
        # Every variant against TRL; an arm of overrides also against rmkit's default recipe (the rule for
        # the shipped defaults reads that one). A learning curve has rmkit's runs only.
        for base in ("trl", "rmkit"):
            if label in ("trl", base) or base not in summary:
                continue
            mine = [r for r in runs if r["variant"] == label]
            theirs = [r for r in runs if r["variant"] == base]
            seeds = sorted({r["seed"] for r in mine} & {r["seed"] for r in theirs})
            row[f"vs_{base}"] = {name: paired(_correct(mine, seeds, name), _correct(theirs, seeds, name),
                                              facts[name]["clusters"] if name in facts else None) for name in files}
            row[f"vs_{base}"]["seeds"] = seeds
            row[f"vs_{base}"]["speed_ratio"] = row["pairs_per_s"] / summary[base]["pairs_per_s"]
    return summary


def _short(name: str) -> str:
    return name.removesuffix(".jsonl").removesuffix("_val").removeprefix("alpacaeval_")


def markdown_table(payload: dict) -> str:
    """One row per variant; per file the mean and per-seed accuracies, the paired difference from TRL and (pref)
    from the length-only baseline (clustered SE), and the accuracy when the chosen reply is longer / not."""
    files, baselines = payload["files"], payload.get("length_only", {})
    head = ["variant", "pairs/s"]
    for f in files:
        head += [f"{_short(f)}: mean (per seed)", f"{_short(f)}: vs TRL (SE)"]
        if f in baselines:
            head += [f"{_short(f)}: vs length-only {baselines[f]:.1%} (SE)", f"{_short(f)}: chosen longer / not"]
    rows = []
    for label, row in payload["summary"].items():
        cells = [label, f"{row['pairs_per_s']:.2f}"]
        for f in files:
            cells.append(f"{row[f]['mean']:.1%} ({', '.join(f'{a:.1%}' for a in row[f]['accuracy'])})")
            vs = row.get("vs_trl", {}).get(f)
            cells.append(f"{vs['mean_difference']:+.1%} ({vs['standard_error']:.1%})" if vs else "-")
            if f in baselines:
                vs = row[f]["vs_length_only"]
                lc = row[f]["length_controlled"]
                cells += [f"{vs['mean_difference']:+.1%} ({vs['standard_error']:.1%})",
                          f"{lc['chosen_longer']:.1%} / {lc['chosen_not_longer']:.1%}"]
        rows.append(cells)
    table = harness.markdown(head, rows)
    arms = {label: row["vs_rmkit"] for label, row in payload["summary"].items() if "vs_rmkit" in row}
    if arms:  # the arms of overrides against rmkit's default, pair by pair (what the defaults' rule reads)
        table += "\n\n" + harness.markdown(
            ["variant", "seeds"] + [f"{_short(f)}: vs rmkit (SE)" for f in files],
            [[label, ",".join(map(str, vs["seeds"]))]
             + [f"{vs[f]['mean_difference']:+.1%} ({vs[f]['standard_error']:.1%})" for f in files]
             for label, vs in arms.items()])
    return table


def compare(base: dict, other: dict, across_draws: bool = False) -> dict:
    """Per variant in both studies and per file, `paired(other, base)` over their common seeds, clustered by prompt;
    SystemExit when the two were not trained on one draw or scored on the same pairs. `across_draws`: the training
    draws may differ (more pairs, say), and each study's variant is its mean over all its own seeds."""
    for key in ("files", "pair_facts") if across_draws else ("split", "files", "pair_facts"):
        if base[key] != other[key]:
            raise SystemExit(f"compare: the studies differ in {key!r}: compare studies of one training draw, scored "
                             "on the same files (--across-draws allows other draws)")
    out = {}
    for label in [v for v in base["summary"] if v in other["summary"]]:
        mine = [r for r in other["runs"] if r["variant"] == label]
        theirs = [r for r in base["runs"] if r["variant"] == label]
        if across_draws:
            mine_seeds, their_seeds = sorted({r["seed"] for r in mine}), sorted({r["seed"] for r in theirs})
            row = {"seeds": {"base": their_seeds, "other": mine_seeds}}
        else:
            mine_seeds = their_seeds = sorted({r["seed"] for r in mine} & {r["seed"] for r in theirs})
            row = {"seeds": mine_seeds}
        out[label] = {**row, **{name: paired(_correct(mine, mine_seeds, name), _correct(theirs, their_seeds, name),
                                             base["pair_facts"][name]["clusters"])
                                for name in base["files"]}}
    return {"base": base["setting"], "other": other["setting"], "files": base["files"], "variants": out}


def compare_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="quality_vs_trl.py compare", description=compare.__doc__)
    parser.add_argument("base", type=Path)
    parser.add_argument("other", type=Path)
    parser.add_argument("--across-draws", action="store_true",
                        help="the studies may have other training draws (e.g. more pairs); each side averages all "
                             "its seeds")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    result = compare(*(json.loads(p.read_text(encoding="utf-8")) for p in (args.base, args.other)),
                     across_draws=args.across_draws)
    if args.output:
        common.write_json(args.output, result)
    files = result["files"]
    print(harness.markdown(["variant", "seeds"] + [f"{_short(f)}: other - base (SE)" for f in files],
                           [[label, _seeds(row["seeds"])]
                            + [f"{row[f]['mean_difference']:+.1%} ({row[f]['standard_error']:.1%})" for f in files]
                            for label, row in result["variants"].items()]))
    return 0


def _seeds(seeds: list[int] | dict[str, list[int]]) -> str:
    if isinstance(seeds, dict):
        return " against ".join(",".join(map(str, seeds[side])) for side in ("other", "base"))
    return ",".join(map(str, seeds))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compare"]:
        return compare_main(argv[1:])
    args = parse_args(argv)
    if args.study == "pref":
        train_path, eval_dir = pref_split(args)
        files = list(PREF_FILES)
        facts = {name: pair_facts(eval_dir / name) for name in files}
    else:
        train_path, eval_dir = carve_split(args)
        files = ["dev.jsonl"] + (["hh_harmless_val.jsonl"] if args.final else [])
        facts = {}
    setting = {"study": args.study, "workload": str(args.backbone or args.workload), "max_length": args.max_length,
               "epochs": args.epochs, "batch_size": args.batch_size, "split_seed": args.split_seed,
               "train_pairs": sum(1 for _ in train_path.open(encoding="utf-8")),
               **({"head_seed": args.head_seed} if args.head_seed is not None else {}),
               **({"device": args.device} if args.device != "cpu" else {})}
    runs = []
    earlier = reusable_runs(args.reuse, files, setting)  # read first: --reuse may name this study's own partial file
    partial = args.output.with_suffix(".partial.jsonl")  # one line per finished run: a long study survives a kill
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_text("")
    prepared: dict[int, dict] = {}
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
        "setting": setting,
        "split": ({"seed": args.split_seed, "train_pairs": setting["train_pairs"], "from": PREF_TRAIN}
                  if args.study == "pref" else
                  {"seed": args.split_seed, "dev_pairs": args.dev_pairs, "from": "hh_harmless_train.jsonl"}),
        "epochs": args.epochs, "seeds": args.seeds, "files": files,
        "length_only": {name: statistics.fmean(f["chosen_longer"]) for name, f in facts.items()},
        "pair_facts": facts,
        "summary": summarize(runs, files, facts),
        "runs": runs,
    }
    common.write_json(args.output, payload)
    print(markdown_table(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
