"""Does averaging reward models' weights (`rmkit merge`, WARM) beat each of them? The members, their weight
average and their ensemble (the mean of their rewards), scored on the same pairs in one run.

Input: the models a study kept (`quality_vs_trl.py --keep-models DIR` writes `DIR/<variant>-seed<S>`). Each
`--variants` label merges that variant's seeds; each `--group NAME=A+B+...` merges the named folders of DIR, for
members that differ in their hyperparameters (WARM's own setting: one shared head, several lrs). Every merge is
made with `rmkit merge` (in `--work-dir`) and every model is scored on the study's files (alpacaeval_dev, then out
of domain hh_harmless_val and pandalm_val) through the inference core (`common.pair_rewards`: each side cut on its
own, fp32). Per file: each model's accuracy; the merge's paired difference from each member and from the members'
mean, and the ensemble's, with the standard error clustered by prompt (`quality_vs_trl.paired`).

    python benchmarks/merge_quality.py --models /work/demo/q256e1_models --variants rmkit,trl --max-length 256
    python benchmarks/merge_quality.py --models /work/demo/lrs_models --variants "" --group lrs=lr2e-5-seed42+rmkit-seed42+lr1e-4-seed42
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
    parser.add_argument("--variants", default="rmkit", help="comma list of variant labels whose seeds are merged, "
                        "each variant on its own")
    parser.add_argument("--group", action="append", default=[], metavar="NAME=A+B+...",
                        help="merge these folders of --models as one group named NAME (repeatable)")
    parser.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA_DIR)
    parser.add_argument("--files", default=",".join(PREF_FILES), help="files to score (alpacaeval_* under pref/)")
    parser.add_argument("--max-length", type=int, help="tokens per input for every model (default: each model's "
                        "scoring contract; TRL's saved models have none, so give the study's length)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/rmkit-merge-quality"))
    parser.add_argument("--output", type=Path, default=common.REPO_ROOT / "benchmarks" / "results" / "merge_quality.json")
    args = parser.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    args.group = [_group(spec) for spec in args.group]
    if not args.variants and not args.group:
        parser.error("nothing to merge: give --variants or --group")
    taken = set(args.variants)
    for name, _ in args.group:
        if name in taken:
            raise SystemExit(f"--group {name}: the name is already a variant's or another group's; give each merge "
                             "its own name")
        taken.add(name)
    args.files = [f for f in args.files.split(",") if f]
    return args


def _group(spec: str) -> tuple[str, list[str]]:
    name, sep, members = spec.partition("=")
    folders = [m for m in members.split("+") if m]
    if not sep or not name or len(folders) < 2:
        raise SystemExit(f"--group {spec!r}: write NAME=FOLDER+FOLDER[+...], two or more folders of --models")
    return name, folders


def seed_models(folder: Path, variant: str) -> dict[str, Path]:
    """A variant's models by seed, labelled `seed <S>`, in seed order."""
    found = {int(p.name.rsplit("-seed", 1)[1]): p for p in folder.glob(f"{variant}-seed*") if p.is_dir()}
    if len(found) < 2:
        raise SystemExit(f"--models: {folder} holds {len(found)} {variant}-seed* folders; merging needs two or more")
    return {f"seed {s}": found[s] for s in sorted(found)}


def group_models(folder: Path, names: list[str]) -> dict[str, Path]:
    """The named folders of --models, labelled by their names."""
    missing = [n for n in names if not (folder / n).is_dir()]
    if missing:
        raise SystemExit(f"--group: {folder} has no folder {', '.join(missing)} (it holds "
                         f"{', '.join(sorted(p.name for p in folder.iterdir() if p.is_dir())) or 'none'})")
    return {n: folder / n for n in names}


def compare(label: str, members: dict[str, Path], merged: Path, files: dict[str, list], facts: dict,
            max_length: int | None) -> dict:
    """Accuracy of every member, the merge and the ensemble per file, and the paired differences."""
    result = {"members": list(members), "files": {}}
    for name, pairs in files.items():
        scored = {m: common.pair_rewards(path, pairs, max_length) for m, path in members.items()}
        correct = {m: (c > r).int().tolist() for m, (c, r) in scored.items()}
        # the ensemble: each response's reward is the mean of the members' rewards
        ensemble_chosen = sum(c.double() for c, _ in scored.values()) / len(scored)
        ensemble_rejected = sum(r.double() for _, r in scored.values()) / len(scored)
        ensemble = (ensemble_chosen > ensemble_rejected).int().tolist()
        merged_chosen, merged_rejected = common.pair_rewards(merged, pairs, max_length)
        merge = (merged_chosen > merged_rejected).int().tolist()
        clusters = facts[name]["clusters"]
        entry = {
            "accuracy": {**{m: statistics.fmean(c) for m, c in correct.items()},
                         "merge": statistics.fmean(merge), "ensemble": statistics.fmean(ensemble)},
            "merge_vs_member": {m: paired([merge], [c], clusters) for m, c in correct.items()},
            "merge_vs_members_mean": paired([merge], list(correct.values()), clusters),
            "ensemble_vs_members_mean": paired([ensemble], list(correct.values()), clusters),
            "merge_vs_ensemble": paired([merge], [ensemble], clusters),
            "length_only": statistics.fmean(facts[name]["chosen_longer"]),
        }
        result["files"][name] = entry
        print(f"{label} {name}: " + ", ".join(f"{k} {v:.4f}" for k, v in entry["accuracy"].items()), flush=True)
    return result


def markdown_table(payload: dict) -> str:
    head = ["merged", "file", "members (accuracy)", "merge", "ensemble", "merge - members' mean (SE)",
            "merge - best member (SE)", "ensemble - members' mean (SE)", "length only"]
    rows = []
    for label, result in payload["variants"].items():
        for name, e in result["files"].items():
            members = {m: e["accuracy"][m] for m in result["members"]}
            best = max(members, key=members.get)
            rows.append([label, name.removesuffix(".jsonl"), ", ".join(f"{v:.1%}" for v in members.values()),
                         f"{e['accuracy']['merge']:.1%}", f"{e['accuracy']['ensemble']:.1%}",
                         _diff(e["merge_vs_members_mean"]), _diff(e["merge_vs_member"][best]),
                         _diff(e["ensemble_vs_members_mean"]), f"{e['length_only']:.1%}"])
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
    merges = {v: seed_models(args.models, v) for v in args.variants}
    merges.update((name, group_models(args.models, folders)) for name, folders in args.group)
    for label, members in merges.items():
        merged = args.work_dir / f"{label}-merged"
        shutil.rmtree(merged, ignore_errors=True)
        merged.parent.mkdir(parents=True, exist_ok=True)
        if rmkit_main(["merge", *map(str, members.values()), "--output", str(merged)]) != 0:
            raise SystemExit(f"rmkit merge of {label}'s members failed (above)")
        payload["variants"][label] = compare(label, members, merged, files, facts, args.max_length)
        payload["variants"][label]["merge_record"] = json.loads((merged / "merge.json").read_text())
    common.write_json(args.output, payload)
    print(markdown_table(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
