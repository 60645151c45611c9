"""Does averaging the seeds' weights (`rmkit merge`, WARM) beat each seed? The seeds, their weight average and
their ensemble (the mean of their rewards), scored on the same pairs in one run.

Input: the models a study kept (`quality_vs_trl.py --keep-models DIR` writes `DIR/<variant>-seed<S>`). For each
`--variants` label, its seeds' models are merged with `rmkit merge` (in `--work-dir`) and every model is scored
on the study's files (alpacaeval_dev, then out of domain hh_harmless_val and pandalm_val) through the inference
core (`load_scorer`, each side cut on its own, fp32). Per file: each model's accuracy; the merge's paired
difference from each seed and from the seeds' mean, and the ensemble's, with the standard error clustered by
prompt (`quality_vs_trl.paired`).

    python benchmarks/merge_quality.py --models /work/demo/q256e1_models --variants rmkit,trl --max-length 256
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common, harness  # noqa: E402
from benchmarks.quality_vs_trl import PREF_FILES, pair_facts, paired  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, required=True, help="a --keep-models folder of quality_vs_trl.py")
    parser.add_argument("--variants", default="rmkit", help="comma list of variant labels to merge, each on its own")
    parser.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA_DIR)
    parser.add_argument("--files", default=",".join(PREF_FILES), help="files to score (alpacaeval_* under pref/)")
    parser.add_argument("--max-length", type=int, help="tokens per input for every model (default: each model's "
                        "scoring contract; TRL's saved models have none, so give the study's length)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/rmkit-merge-quality"))
    parser.add_argument("--output", type=Path, default=common.REPO_ROOT / "benchmarks" / "results" / "merge_quality.json")
    args = parser.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    args.files = [f for f in args.files.split(",") if f]
    return args


def data_path(args: argparse.Namespace, name: str) -> Path:
    return args.data_dir / ("pref/" + name if name.startswith("alpacaeval") else name)


def rewards(model_dir: Path, pairs: list, max_length: int | None) -> tuple[list[float], list[float]]:
    """Chosen and rejected rewards of `pairs` through the inference core (fp32; the model's contract, at
    `max_length` when given)."""
    from rmkit.inference import load_scorer

    scorer = load_scorer(model_dir, dtype="float32", precision="float32", max_length=max_length)
    tokenized = scorer.encode_pairs(pairs)
    values = scorer.score_ids([ids for p in tokenized.pairs for ids in (p.chosen_ids, p.rejected_ids)])[:, 0]
    return values[0::2].tolist(), values[1::2].tolist()


def seed_models(folder: Path, variant: str) -> dict[int, Path]:
    found = {int(p.name.rsplit("-seed", 1)[1]): p for p in folder.glob(f"{variant}-seed*") if p.is_dir()}
    if len(found) < 2:
        raise SystemExit(f"--models: {folder} holds {len(found)} {variant}-seed* folders; merging needs two or more")
    return dict(sorted(found.items()))


def compare(variant: str, seeds: dict[int, Path], merged: Path, files: dict[str, list], facts: dict,
            max_length: int | None) -> dict:
    """Accuracy of every seed, the merge and the ensemble per file, and the paired differences."""
    result = {"seeds": list(seeds), "files": {}}
    for name, pairs in files.items():
        scored = {str(s): rewards(path, pairs, max_length) for s, path in seeds.items()}
        merged_rewards = rewards(merged, pairs, max_length)
        correct = {s: [int(c > r) for c, r in zip(*v)] for s, v in scored.items()}
        n_seeds = len(scored)
        ensemble = [int(sum(scored[s][0][i] for s in scored) / n_seeds > sum(scored[s][1][i] for s in scored) / n_seeds)
                    for i in range(len(pairs))]
        merge = [int(c > r) for c, r in zip(*merged_rewards)]
        clusters = facts[name]["clusters"]
        entry = {
            "accuracy": {**{f"seed {s}": statistics.fmean(c) for s, c in correct.items()},
                         "merge": statistics.fmean(merge), "ensemble": statistics.fmean(ensemble)},
            "merge_vs_seed": {s: paired([merge], [c], clusters) for s, c in correct.items()},
            "merge_vs_seeds_mean": paired([merge], list(correct.values()), clusters),
            "ensemble_vs_seeds_mean": paired([ensemble], list(correct.values()), clusters),
            "merge_vs_ensemble": paired([merge], [ensemble], clusters),
            "length_only": statistics.fmean(facts[name]["chosen_longer"]),
        }
        result["files"][name] = entry
        print(f"{variant} {name}: " + ", ".join(f"{k} {v:.4f}" for k, v in entry["accuracy"].items()), flush=True)
    return result


def markdown_table(payload: dict) -> str:
    head = ["variant", "file", "seeds (accuracy)", "merge", "ensemble", "merge - seeds' mean (SE)",
            "merge - best seed (SE)", "ensemble - seeds' mean (SE)", "length only"]
    rows = []
    for variant, result in payload["variants"].items():
        for name, e in result["files"].items():
            seeds = {k: v for k, v in e["accuracy"].items() if k.startswith("seed")}
            best = max(seeds, key=seeds.get).split(" ", 1)[1]
            rows.append([variant, name.removesuffix(".jsonl"), ", ".join(f"{v:.1%}" for v in seeds.values()),
                         f"{e['accuracy']['merge']:.1%}", f"{e['accuracy']['ensemble']:.1%}",
                         _diff(e["merge_vs_seeds_mean"]), _diff(e["merge_vs_seed"][best]),
                         _diff(e["ensemble_vs_seeds_mean"]), f"{e['length_only']:.1%}"])
    return harness.markdown(head, rows)


def _diff(entry: dict) -> str:
    return f"{entry['mean_difference']:+.1%} ({entry['standard_error']:.1%})"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    import torch

    from rmkit.cli import main as rmkit_main

    torch.set_num_threads(args.threads)
    files = {name: common.load_pairs(data_path(args, name)) for name in args.files}
    facts = {name: pair_facts(data_path(args, name)) for name in args.files}
    payload = {"command": "python benchmarks/merge_quality.py " + " ".join(argv), "machine": common.machine_info(),
               "files": args.files, "variants": {}}
    for variant in args.variants:
        seeds = seed_models(args.models, variant)
        merged = args.work_dir / f"{variant}-merged"
        shutil.rmtree(merged, ignore_errors=True)
        merged.parent.mkdir(parents=True, exist_ok=True)
        if rmkit_main(["merge", *map(str, seeds.values()), "--output", str(merged)]) != 0:
            raise SystemExit(f"rmkit merge of {variant}'s seeds failed (above)")
        payload["variants"][variant] = compare(variant, seeds, merged, files, facts, args.max_length)
        payload["variants"][variant]["merge_record"] = json.loads((merged / "merge.json").read_text())
    common.write_json(args.output, payload)
    print(markdown_table(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
