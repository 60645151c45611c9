"""Choose the reward-model recipe from measurements: train `configs/rm.yaml` under a few overrides and compare
held-out pairwise accuracy.

Every setting is one real `rmkit train --config configs/rm.yaml KEY=VALUE ...` subprocess on the HH training
pairs (no validation during training, no checkpoints, no plots), after which the exported model is scored by
the same code for every setting (`benchmarks.common.pairwise_accuracy`: scoring goes through the inference
core, `rmkit.inference`, in float32 at `--eval-max-length` tokens whatever the setting trained at, each side of
a pair cut on its own, strict `>`) on `hh_harmless_val.jsonl` and `pandalm_val.jsonl`. Settings run in one
process at a time, so their train times are comparable on a quiet machine.

    python benchmarks/recipe_sweep.py                                  # the recorded sweep (MiniLM)
    python benchmarks/recipe_sweep.py --settings epochs3,lr2e-5        # others
    python benchmarks/recipe_sweep.py --settings smollm2_lr5e-5 --eval-pairs 300   # SmolLM2-135M, the full recipe
    python benchmarks/recipe_sweep.py table benchmarks/results/recipe_sweep.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common, harness  # noqa: E402

# name: overrides of configs/rm.yaml ("recipe" changes nothing). MiniLM settings name their epochs so that a
# result does not depend on the epoch count the YAML had when it ran (1 until the sweep of 2026-11-23 chose 2);
# the smollm2 settings are the recipe with another backbone and lr, so they train the YAML's epochs.
SETTINGS: dict[str, list[str]] = {
    "recipe": [],
    "epochs1": ["rm.max_num_epochs=1"],
    "epochs1_lr2e-5": ["rm.max_num_epochs=1", "policy.optimizer.lr=2e-5"],
    "epochs1_lr1e-4": ["rm.max_num_epochs=1", "policy.optimizer.lr=1e-4"],
    "epochs1_freeze_embeddings": ["rm.max_num_epochs=1", "policy.freeze_embeddings=true"],
    "epochs1_constant": ["rm.max_num_epochs=1", "policy.scheduler.name=constant"],
    "epochs1_len128": ["rm.max_num_epochs=1", "policy.max_total_sequence_length=128"],
    "epochs2": ["rm.max_num_epochs=2"],
    "epochs3": ["rm.max_num_epochs=3"],
    "lr2e-5": ["rm.max_num_epochs=2", "policy.optimizer.lr=2e-5"],
    "lr1e-4": ["rm.max_num_epochs=2", "policy.optimizer.lr=1e-4"],
    "freeze_embeddings": ["rm.max_num_epochs=2", "policy.freeze_embeddings=true"],
    "len128": ["rm.max_num_epochs=2", "policy.max_total_sequence_length=128"],
    "smollm2": ["policy.model_name=smollm2", "policy.optimizer.lr=1e-5", "policy.train_micro_batch_size=8"],
    "smollm2_lr5e-5": ["policy.model_name=smollm2", "policy.optimizer.lr=5e-5", "policy.train_micro_batch_size=8"],
}
DEFAULT_SETTINGS = "epochs1,epochs1_lr2e-5,epochs1_lr1e-4,epochs2,epochs1_freeze_embeddings"
EVAL_FILES = ("hh_harmless_val.jsonl", "pandalm_val.jsonl")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default=DEFAULT_SETTINGS, help=f"comma-separated, from {sorted(SETTINGS)}")
    parser.add_argument("--pairs", type=int, help="train on the first N pairs of the training file (default: all)")
    parser.add_argument("--eval-pairs", type=int, help="score the first N pairs of each held-out file (default: all)")
    parser.add_argument("--eval-max-length", type=int, default=256, help="tokens per held-out sequence")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override applied to every setting (repeatable)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA_DIR)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/rmkit-recipe-sweep"))
    parser.add_argument("--output", type=Path, default=common.REPO_ROOT / "benchmarks" / "results" / "recipe_sweep.json")
    args = parser.parse_args(argv)
    args.settings = [s for s in args.settings.split(",") if s]
    unknown = [s for s in args.settings if s not in SETTINGS]
    if unknown:
        parser.error(f"unknown settings {unknown}; known: {sorted(SETTINGS)}")
    return args


def training_file(args: argparse.Namespace) -> Path:
    """The HH training file, or its first `--pairs` lines in the work directory."""
    source = common.data_file(args.data_dir, "hh_harmless_train.jsonl")
    if not args.pairs:
        return source
    subset = args.work_dir / f"hh_harmless_train_first{args.pairs}.jsonl"
    subset.parent.mkdir(parents=True, exist_ok=True)
    with source.open() as lines:
        subset.write_text("".join(line for _, line in zip(range(args.pairs), lines)))
    return subset


def train(args: argparse.Namespace, name: str, train_path: Path) -> dict:
    """One `rmkit train` subprocess; returns its wall time, train rate and exported model directory."""
    out_dir = args.work_dir / name
    overrides = [
        f"data.train_data_path={train_path}", "data.val_data_paths={}", f"checkpointing.checkpoint_dir={out_dir}",
        "checkpointing.enabled=false", "rm.val_at_start=false", "rm.val_at_end=false", "rm.val_period=0",
        "logger.tensorboard=false", "logger.plots=false", "logger.progress_bar=false",
        f"policy.num_threads={args.threads}", *args.override, *SETTINGS[name],
    ]
    command = [sys.executable, "-m", "rmkit", "train", "--config", str(common.REPO_ROOT / "configs" / "rm.yaml"),
               *overrides]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=common.REPO_ROOT)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{name}: rmkit train failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rate = [line for line in done.stderr.splitlines() if " pairs/s" in line]
    return {"overrides": SETTINGS[name], "wall_s": wall, "train_rate": rate[-1] if rate else None,
            "model_dir": str(out_dir / "final")}


def held_out_accuracy(args: argparse.Namespace, model_dir: str) -> dict[str, float]:
    """Pairwise accuracy of `model_dir` on each held-out file, at `--eval-max-length` tokens per input."""
    return {
        file_name: common.pairwise_accuracy(
            Path(model_dir), common.load_pairs(common.data_file(args.data_dir, file_name), args.eval_pairs),
            args.eval_max_length
        )
        for file_name in EVAL_FILES
    }


def markdown_table(payload: dict) -> str:
    rows = [[name, " ".join(run["overrides"]) or "-", f"{100 * run['accuracy'][EVAL_FILES[0]]:.1f}%",
             f"{100 * run['accuracy'][EVAL_FILES[1]]:.1f}%", f"{run['wall_s']:.0f}"] for name, run in payload["runs"].items()]
    return harness.markdown(["setting", "overrides of configs/rm.yaml", "acc HH val", "acc PandaLM", "wall (s)"], rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["table"]:
        print(markdown_table(json.loads(Path(argv[1]).read_text())))
        return 0
    args = parse_args(argv)
    train_path = training_file(args)
    payload = {"command": "python benchmarks/recipe_sweep.py " + " ".join(argv), "machine": common.machine_info(),
               "train_data": str(train_path), "pairs": args.pairs, "eval_pairs": args.eval_pairs, "runs": {}}
    for name in args.settings:
        print(f"recipe_sweep: {name} {' '.join(SETTINGS[name])}", file=sys.stderr, flush=True)
        run = train(args, name, train_path)
        run["accuracy"] = held_out_accuracy(args, run["model_dir"])
        payload["runs"][name] = run
        print(f"recipe_sweep: {name}: {run['accuracy']} ({run['wall_s']:.0f} s; {run['train_rate']})",
              file=sys.stderr, flush=True)
        common.write_json(args.output, payload)  # after every setting: a long sweep keeps what it measured
    print(markdown_table(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
