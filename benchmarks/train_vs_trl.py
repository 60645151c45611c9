"""Train one reward model twice, with TRL's `RewardTrainer` and with `rmkit train`, and compare.

Same backbone (exported once, so both start from the same weights, head and pad token), same pairs
(the training pairs tokenized once by rmkit with truncation, as `rmkit train` cuts them, so neither side
drops any), same hyperparameters (global batch 16, AdamW lr 5e-5 with betas (0.9, 0.999), eps 1e-8, weight
decay 0.01 except biases and norms, cosine schedule after ceil(5% of steps) warmup steps, grad clip 1.0,
one epoch, dropout off: configs/rm.yaml's recipe), the same thread count. Each run is a fresh subprocess,
and repeats alternate which side goes first to cancel drift. For every run it records:

- train time: the harness clock's `training` (`benchmarks/harness.py`, hooked on every word-embedding table and
  every optimizer step, the same in both trainers): from the first training forward to the end of the last
  optimizer step (model loading, tokenization and saving are outside it; `wall_s` is the whole subprocess);
- pairs/s and real (non-padding) tokens/s over that time (real tokens: both sides of every pair in full), the
  tokens that went through the word embeddings per real token (above 1: padding; below 1: tokens computed
  once for both sides, a decoder's shared prompt), and the subprocess's peak RSS up to its last optimizer step;
- held-out pairwise accuracy of the saved model, scored for both by the same code: scoring goes through the
  inference core, `rmkit.inference` (`load_scorer` on the saved directory at `--max-length`, `encode_pairs`
  with each side of a pair cut on its own, `score_ids`, float32);
- MFU = 6 x non-embedding parameters x real tokens / train time, against the matmul peak measured in this
  run for that precision.

`--device cuda` runs both trainers on the GPU (TRL without `use_cpu`; rmkit takes CUDA when it sees it) and adds
each run's peak GPU memory (`torch.cuda.max_memory_allocated`, up to the last optimizer step); the clock
synchronizes CUDA before it reads the time. `--warmup-epochs N` trains N more epochs first and times from the end
of their last optimizer step, so first-call costs (kernel selection, allocator growth) stay out of the timed
epochs.

    python benchmarks/train_vs_trl.py                                  # MiniLM, all 1504 pairs, fp32 and bf16
    python benchmarks/train_vs_trl.py --pairs 256 --repeats 3 --precision fp32
    python benchmarks/train_vs_trl.py --workload smollm2               # SmolLM2-135M decoder, 32 pairs
    python benchmarks/train_vs_trl.py --device cuda --pairs 512 --warmup-epochs 1 --threads 8
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import common, harness  # noqa: E402

WORKLOADS = {
    # name: (backbone, default train pairs, default held-out pairs per file, default held-out files)
    "minilm": (common.minilm_path, None, None, "hh_harmless_val.jsonl,pandalm_val.jsonl"),
    "smollm2": (common.smollm2_path, 32, 64, "hh_harmless_val.jsonl"),
}
SIDES = ("trl", "rmkit")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="minilm")
    parser.add_argument("--backbone", type=Path, help="another backbone directory than the workload's")
    parser.add_argument(
        "--pairs", type=int, help="train on the first N pairs (default: all; 128 for smollm2)"
    )
    parser.add_argument(
        "--eval-pairs",
        type=int,
        help="held-out pairs to score per file (default: all; 100 for smollm2; 0: skip)",
    )
    parser.add_argument(
        "--eval-files", help="held-out files in --data-dir, comma list (default: per workload)"
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs per side and precision (accuracy: first only)"
    )
    parser.add_argument("--precision", default="fp32,bf16", help="comma list of fp32, bf16")
    parser.add_argument("--sides", default="trl,rmkit", help="comma list of trl, rmkit")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16, help="global batch, in pairs")
    parser.add_argument(
        "--micro-batch-size", type=int, help="pairs per forward/backward, both sides (default: --batch-size)"
    )
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--schedule", choices=["cosine", "constant"], default="cosine")
    parser.add_argument("--warmup-ratio", type=float, default=0.05, help="warmup steps = ceil(ratio x steps)")
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where both trainers run")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--head-seed", type=int,
                        help="draw the fresh score head with this seed, not --seed (runs of several seeds then share "
                             "one starting model and differ in data order only)")
    parser.add_argument("--epochs", type=int, default=1, help="passes over the training pairs, both sides")
    parser.add_argument(
        "--warmup-epochs", type=int, default=0, help="untimed passes before the timed --epochs, both sides"
    )
    parser.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA_DIR)
    parser.add_argument("--train-file", type=Path, help="training pairs (default: DATA_DIR/hh_harmless_train.jsonl)")
    parser.add_argument("--eval-dir", type=Path, help="where --eval-files are (default: DATA_DIR)")
    parser.add_argument(
        "--rmkit-override", action="append", default=[], metavar="KEY=VALUE",
        help="a dotted config override for the rmkit side (repeatable), e.g. data.batching=random",
    )
    parser.add_argument(
        "--rmkit-src", type=Path, help="run the rmkit side from another checkout (before/after)"
    )
    parser.add_argument("--trl-compile", action="store_true", help="TRL with torch_compile=True (TrainingArguments)")
    parser.add_argument(
        "--profile", action="store_true", help="torch.profiler top ops per run -> RUN/profile.txt"
    )
    parser.add_argument(
        "--work-dir", type=Path, help="scratch directory (default: /tmp/rmkit-bench-WORKLOAD)"
    )
    parser.add_argument(
        "--output", type=Path, help="results JSON (default: benchmarks/results/train_vs_trl[_WORKLOAD].json)"
    )
    parser.add_argument("--keep-model", type=Path, help="move the first run's trained model there (else deleted)")
    args = parser.parse_args(argv)
    backbone, pairs, eval_pairs, eval_files = WORKLOADS[args.workload]
    args.backbone = args.backbone or backbone()
    args.pairs = args.pairs if args.pairs is not None else pairs
    args.eval_pairs = args.eval_pairs if args.eval_pairs is not None else eval_pairs
    args.eval_files = (
        [f for f in (args.eval_files or eval_files).split(",") if f] if args.eval_pairs != 0 else []
    )
    args.precision = [p for p in args.precision.split(",") if p]
    args.sides = [s for s in args.sides.split(",") if s]
    if not set(args.precision) <= set(DTYPES) or not set(args.sides) <= set(SIDES):
        parser.error("--precision takes fp32,bf16 and --sides takes trl,rmkit")
    args.micro_batch_size = args.micro_batch_size or args.batch_size
    if args.batch_size % args.micro_batch_size:
        parser.error("--batch-size must be a multiple of --micro-batch-size")
    args.train_file = args.train_file or common.data_file(args.data_dir, "hh_harmless_train.jsonl")
    args.eval_dir = args.eval_dir or args.data_dir
    args.work_dir = args.work_dir or Path(f"/tmp/rmkit-bench-{args.workload}")
    suffix = "" if args.workload == "minilm" else f"_{args.workload}"
    args.output = args.output or common.REPO_ROOT / "benchmarks" / "results" / f"train_vs_trl{suffix}.json"
    return args


# ---------------------------------------------------------------- inside a training process


def train_trl(spec: dict) -> None:
    """TRL's RewardTrainer with its defaults, except the matched hyperparameters and no gradient checkpointing."""
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    from rmkit.models import load_reward_model

    model, tokenizer = load_reward_model(spec["model_dir"])
    tokens = json.loads(Path(spec["train_tokens"]).read_text())
    dataset = Dataset.from_dict({"chosen_ids": tokens["chosen"], "rejected_ids": tokens["rejected"]})
    config = RewardConfig(
        output_dir=spec["out_dir"],
        per_device_train_batch_size=spec["micro_batch_size"],
        gradient_accumulation_steps=spec["batch_size"] // spec["micro_batch_size"],
        learning_rate=spec["lr"],
        num_train_epochs=spec["epochs"],
        lr_scheduler_type=spec["schedule"],
        warmup_steps=spec["warmup_steps"],
        weight_decay=spec["weight_decay"],
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        max_length=spec["max_length"],
        bf16=spec["precision"] == "bf16",
        # TRL defaults to gradient checkpointing; rmkit does not, so both run without it.
        gradient_checkpointing=False,
        use_cpu=spec["device"] == "cpu",
        seed=spec["seed"],
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        torch_compile=spec["trl_compile"],
    )
    trainer = RewardTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
    if len(trainer.train_dataset) != len(dataset):
        raise SystemExit("TRL dropped pairs: pre-tokenization must keep every pair within max_length")
    trainer.train()
    trainer.save_model(spec["model_out"])
    tokenizer.save_pretrained(spec["model_out"])


def rmkit_config(spec: dict) -> dict:
    """The `rmkit train` config matching TRL's run (no validation, no plots, final model only)."""
    return {
        "rm": {
            "max_num_epochs": spec["epochs"],
            "seed": spec["seed"],
            "val_at_start": False,
            "val_at_end": False,
            "val_period": 0,
        },
        "policy": {
            "model_name": spec["model_dir"],
            "train_global_batch_size": spec["batch_size"],
            "train_micro_batch_size": spec["micro_batch_size"],
            "max_total_sequence_length": spec["max_length"],
            "precision": {"fp32": "float32", "bf16": "bfloat16"}[spec["precision"]],
            "optimizer": {
                "lr": spec["lr"],
                "weight_decay": spec["weight_decay"],
                "betas": [0.9, 0.999],
                "eps": 1e-8,
            },
            "scheduler": {
                "name": spec["schedule"],
                "warmup_steps": spec["warmup_steps"],
                "warmup_ratio": 0.0,
            },
            "max_grad_norm": 1.0,
            "num_threads": spec["threads"],
        },
        "data": {"train_data_path": spec["train_jsonl"], "val_data_paths": {}},
        "checkpointing": {"enabled": False, "checkpoint_dir": spec["out_dir"]},  # TRL saves none either
        "logger": {"tensorboard": False, "plots": False, "progress_bar": False},
    }


def train_rmkit(spec: dict) -> None:
    """`rmkit train` through its CLI entry point, in this process so the hooks see it."""
    import yaml

    from rmkit.cli import main as rmkit_main

    config_path = Path(spec["out_dir"]) / "bench.yaml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(rmkit_config(spec), sort_keys=False))
    status = rmkit_main(["train", "--config", str(config_path), *spec["rmkit_overrides"]])
    if status != 0:
        raise SystemExit(f"rmkit train exited with status {status}")
    shutil.move(str(Path(spec["out_dir"]) / "final"), spec["model_out"])


def worker(spec: dict) -> dict:
    """One training run in this (fresh) process, timed by the harness clock on every word-embedding table (the
    rmkit side may come from another checkout, run through its CLI); returns its measurements."""
    if spec["rmkit_src"]:  # another rmkit checkout (a before/after comparison) wins over this one
        sys.path.insert(0, spec["rmkit_src"])
    clock = harness.PhaseClock()
    clock.watch()
    train = {"trl": train_trl, "rmkit": train_rmkit}[spec["side"]]
    if spec["profile"]:
        from torch.profiler import ProfilerActivity, profile

        cuda = spec["device"] == "cuda"
        with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
            train(spec)
        table = prof.key_averages().table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total",
                                          row_limit=20)
        (Path(spec["out_dir"]).parent / "profile.txt").write_text(table)
    else:
        train(spec)
    clock.close()
    return {"train_s": clock.span(after_step=spec["warmup_steps_untimed"]), "optimizer_steps": len(clock.step_ends),
            "computed_tokens": clock.training_tokens, **clock.memory}


# ---------------------------------------------------------------- orchestration


def prepare(args: argparse.Namespace) -> dict:
    """Export the backbone, write the train slice (JSONL for rmkit, token ids for TRL), load the held-out pairs."""
    from rmkit.models import load_reward_model, load_tokenizer

    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    model_dir = common.export_reward_model(args.backbone, work / "model",
                                           args.seed if args.head_seed is None else args.head_seed)
    tokenizer = load_tokenizer(model_dir)
    lines = args.train_file.read_text().splitlines(keepends=True)
    train_jsonl = work / "train.jsonl"
    train_jsonl.write_text("".join(lines[: args.pairs] if args.pairs else lines))
    chosen, rejected = common.load_tokenized_pairs(train_jsonl, tokenizer, args.max_length)
    (work / "train_tokens.json").write_text(json.dumps({"chosen": chosen, "rejected": rejected}))
    val = {name: common.load_pairs(args.eval_dir / name, args.eval_pairs) for name in args.eval_files}
    model, _ = load_reward_model(model_dir)
    return {
        "model_dir": str(model_dir),
        "train_jsonl": str(train_jsonl),
        "train_tokens": str(work / "train_tokens.json"),
        "num_pairs": len(chosen),
        "real_tokens": sum(map(len, chosen)) + sum(map(len, rejected)),
        "non_embedding_params": common.non_embedding_params(model),
        "val": val,
    }


def run_once(args, data: dict, side: str, precision: str, repeat: int) -> dict:
    """Train in a subprocess, then (first repeat only) score the saved model on the held-out pairs."""
    out_dir = args.work_dir / f"{side}-{precision}-{repeat}"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    steps_per_epoch = math.ceil(data["num_pairs"] / args.batch_size)
    epochs = args.warmup_epochs + args.epochs
    spec = {
        "side": side,
        "precision": precision,
        "threads": args.threads,
        "device": args.device,
        "seed": args.seed,
        "epochs": epochs,
        "warmup_steps_untimed": args.warmup_epochs * steps_per_epoch,
        "rmkit_overrides": args.rmkit_override,
        "batch_size": args.batch_size,
        "micro_batch_size": args.micro_batch_size,
        "lr": args.lr,
        "schedule": args.schedule,
        "warmup_steps": math.ceil(args.warmup_ratio * epochs * steps_per_epoch),
        "weight_decay": args.weight_decay,
        "max_length": args.max_length,
        "model_dir": data["model_dir"],
        "train_jsonl": data["train_jsonl"],
        "train_tokens": data["train_tokens"],
        "out_dir": str(out_dir / "run"),
        "model_out": str(out_dir / "model"),
        "rmkit_src": str(args.rmkit_src) if args.rmkit_src else None,
        "trl_compile": args.trl_compile,
        "profile": args.profile,
    }
    result = harness.launch(__file__, spec, out_dir, args.device, f"{side} {precision} run")
    train_s = result["train_s"]
    result.update(
        side=side,
        precision=precision,
        repeat=repeat,
        pairs_per_s=args.epochs * data["num_pairs"] / train_s,
        real_tokens_per_s=args.epochs * data["real_tokens"] / train_s,
        embedded_per_real=result["computed_tokens"] / (epochs * data["real_tokens"]),
    )
    if repeat == 0:
        for name, pairs in data["val"].items():
            correct = common.pairwise_correct(Path(spec["model_out"]), pairs, args.max_length)
            result[f"accuracy/{name}"] = sum(correct) / len(correct)
            result[f"correct/{name}"] = [int(c) for c in correct]
    if args.keep_model and repeat == 0:
        shutil.rmtree(args.keep_model, ignore_errors=True)
        args.keep_model.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(out_dir / "model"), args.keep_model)
    shutil.rmtree(out_dir / "model", ignore_errors=True)
    print(
        f"{side:>5} {precision} #{repeat}: {result['pairs_per_s']:.2f} pairs/s, train {train_s:.1f} s, "
        f"wall {result['wall_s']:.1f} s, rss {result['peak_rss_mib']:.0f} MiB, "
        + " ".join(f"{k} {v:.4f}" for k, v in result.items() if k.startswith("accuracy/")),
        flush=True,
    )
    return result


def summarize(runs: list[dict], data: dict, peaks: dict) -> dict:
    """Medians per (precision, side), MFU, and the rmkit/TRL ratios."""
    keys = ("pairs_per_s", "real_tokens_per_s", "embedded_per_real", "peak_rss_mib", "train_s", "wall_s")
    keys += ("peak_gpu_mib",) if all("peak_gpu_mib" in r for r in runs) else ()
    summary: dict = {}
    for precision in sorted({r["precision"] for r in runs}):
        row: dict = {}
        for side in SIDES:
            mine = [r for r in runs if r["precision"] == precision and r["side"] == side]
            if not mine:
                continue
            stats = {k: common.median([r[k] for r in mine]) for k in keys}
            for name in {k for r in mine for k in r if k.startswith("accuracy/")}:
                stats[name] = common.median([r.get(name) for r in mine])
            stats["mfu"] = 6 * data["non_embedding_params"] * stats["real_tokens_per_s"] / peaks[precision]
            stats["runs"] = len(mine)
            row[side] = stats
        if len(row) == 2:
            row["ratio_rmkit_over_trl"] = {
                k: row["rmkit"][k] / row["trl"][k]
                for k in ("pairs_per_s", "real_tokens_per_s", "peak_rss_mib", "wall_s")
            }
        summary[precision] = row
    return summary


def embedded_per_real(stats: dict) -> float:
    """Tokens embedded per real token; results written before 2026-11-25 record the padding fraction instead
    (embedded / real = 1 / (1 - padding))."""
    return stats["embedded_per_real"] if "embedded_per_real" in stats else 1 / (1 - stats["padding_fraction"])


def markdown_table(payload: dict) -> str:
    """The summary as the BENCHMARKS.md table: one row per (precision, side), then the ratio."""
    names = sorted({k for row in payload["summary"].values() for side in SIDES if side in row
                    for k in row[side] if k.startswith("accuracy/")})  # fmt: skip
    head = ["precision", "side", "pairs/s", "real tokens/s", "embedded / real", "peak RSS (MiB)", "train (s)",
            "wall (s)", "MFU", "runs"] + [f"acc {n.split('/')[1].split('_val')[0]}" for n in names]  # fmt: skip
    rows = []
    for precision, row in payload["summary"].items():
        for side in SIDES:
            if side in row:
                r = row[side]
                cells = [precision, side, f"{r['pairs_per_s']:.2f}", f"{r['real_tokens_per_s']:.0f}",
                         f"{embedded_per_real(r):.2f}", f"{r['peak_rss_mib']:.0f}", f"{r['train_s']:.1f}",
                         f"{r['wall_s']:.1f}", f"{r['mfu']:.1%}", str(r["runs"])]  # fmt: skip
                rows.append(cells + [f"{r[n]:.1%}" if r.get(n) is not None else "-" for n in names])
        if "ratio_rmkit_over_trl" in row:
            q = row["ratio_rmkit_over_trl"]
            rows.append([precision, "**rmkit / TRL**", f"**{q['pairs_per_s']:.2f}x**", f"{q['real_tokens_per_s']:.2f}x",
                         "", f"{q['peak_rss_mib']:.2f}x", "", f"{q['wall_s']:.2f}x"])  # fmt: skip
    return harness.markdown(head, rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if harness.subcommand(argv, "train_vs_trl.py", worker, markdown_table):
        return 0
    args = parse_args(argv)
    info = common.machine_info()
    data = prepare(args)
    on_gpu = {"size": 8192, "device": "cuda"} if args.device == "cuda" else {}
    peaks = {p: common.matmul_peak_flops(DTYPES[p], args.threads, **on_gpu) for p in args.precision}
    if on_gpu:
        torch.cuda.empty_cache()  # the workers need the memory, not this process's cache
    print(
        f"{data['num_pairs']} pairs, {data['real_tokens']} real tokens; matmul peak "
        + ", ".join(f"{p} {v / 1e9:.0f} GFLOP/s" for p, v in peaks.items()),
        flush=True,
    )
    runs = []
    for repeat in range(args.repeats):
        for precision in args.precision:
            order = args.sides if repeat % 2 == 0 else args.sides[::-1]
            runs.extend(run_once(args, data, side, precision, repeat) for side in order)
    payload = {
        "command": "python benchmarks/train_vs_trl.py " + " ".join(argv),
        "machine": info,
        "workload": {
            "name": args.workload,
            "backbone": str(args.backbone),
            "train_pairs": data["num_pairs"],
            "real_tokens": data["real_tokens"],
            "held_out_pairs": {name: len(pairs) for name, pairs in data["val"].items()},
            "max_length": args.max_length,
            "batch_size": args.batch_size,
            "micro_batch_size": args.micro_batch_size,
            "lr": args.lr,
            "schedule": args.schedule,
            "warmup_ratio": args.warmup_ratio,
            "weight_decay": args.weight_decay,
            "threads": args.threads,
            "non_embedding_params": data["non_embedding_params"],
            **({"device": args.device, "warmup_epochs": args.warmup_epochs} if args.device != "cpu"
               or args.warmup_epochs else {}),
        },
        "matmul_peak_flops": peaks,
        "summary": summarize(runs, data, peaks),
        "runs": runs,
    }
    common.write_json(args.output, payload)
    print(markdown_table(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
