"""Does averaging the seeds' weights (`rmkit merge`, WARM) beat each seed? The seeds, their weight average and
their ensemble (the mean of their rewards), scored on the same pairs in one run.

Input: the models a study kept (`quality_vs_trl.py --keep-models DIR` writes `DIR/<variant>-seed<S>`). For each
`--variants` label, its seeds' models are merged with `rmkit merge` (in `--work-dir`) and every model is scored
on the study's files (alpacaeval_dev, then out of domain hh_harmless_val and pandalm_val) through the inference
core (`common.pair_rewards`: each side cut on its own, fp32). Per file: each model's accuracy; the merge's paired
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
from benchmarks.quality_vs_trl import PREF_FILES, pair_facts, paired, pref_file  # noqa: E402


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
        scored = {str(s): common.pair_rewards(path, pairs, max_length) for s, path in seeds.items()}
        correct = {s: (c > r).int().tolist() for s, (c, r) in scored.items()}
        # the ensemble: each response's reward is the mean of the seeds' rewards
        ensemble_chosen = sum(c.double() for c, _ in scored.values()) / len(scored)
        ensemble_rejected = sum(r.double() for _, r in scored.values()) / len(scored)
        ensemble = (ensemble_chosen > ensemble_rejected).int().tolist()
        merged_chosen, merged_rejected = common.pair_rewards(merged, pairs, max_length)
        merge = (merged_chosen > merged_rejected).int().tolist()
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
    files = {name: common.load_pairs(pref_file(args.data_dir, name)) for name in args.files}
    facts = {name: pair_facts(pref_file(args.data_dir, name)) for name in args.files}
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
