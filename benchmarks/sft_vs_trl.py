"""Fine-tune one policy twice, with TRL's `SFTTrainer` and with `rmkit sft`, on the same demonstrations: tokens/s.

Same weights (SmolLM2-135M-Instruct dequantized to float32 safetensors once, so both start from one directory),
same data (the chosen sides of the first N pairs of `hh_harmless_train.jsonl`, tokenized once by rmkit with
its assistant masks; TRL gets those `input_ids` + `assistant_masks`, so both train on the same tokens), same
settings (max length 256, global batch 8 as micro 4 x accumulation 2, AdamW lr 1e-5, weight decay 0.01,
constant schedule, grad clip 1.0, one epoch, float32, dropout off, 2 torch threads, no evaluation, no
checkpoints). Each run is a fresh subprocess; repeats alternate which side goes first.

Train time is the harness clock's `training` (`benchmarks/harness.py`), hooked the same way in both trainers on
the input embeddings and every optimizer step: from the first training forward (train mode, grad enabled) to the
end of the last optimizer step (loading, tokenization and saving excluded); tokens/s = the real (non-padding)
tokens of the epoch / train time. Peak RSS (and GPU memory) are the process's peaks at the last optimizer step.

`--device cuda` runs both trainers on the GPU and records each run's peak GPU memory; the clock synchronizes CUDA
before reading the time. `--precision bf16` is bf16 autocast over float32 weights on both sides (TRL `bf16=True`,
rmkit `policy.precision=bfloat16`). `--warmup-epochs N` trains N untimed epochs first; train time then starts
at the end of their last optimizer step, and tokens/s is the last epoch's tokens over its seconds.

    python benchmarks/sft_vs_trl.py --sequences 48 --repeats 1
    python benchmarks/sft_vs_trl.py --device cuda --precision bf16 --warmup-epochs 1 --threads 8 --sequences 128
    python benchmarks/sft_vs_trl.py table benchmarks/results/sft_vs_trl.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import common, harness  # noqa: E402

MAX_LENGTH, GLOBAL, MICRO, LR, THREADS = 256, 8, 4, 1e-5, 2
PRECISIONS = {"fp32": "float32", "bf16": "bfloat16"}


def train_trl(spec: dict, clock: harness.PhaseClock) -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)  # master weights
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    clock.watch(model)
    rows = json.loads(Path(spec["data"]).read_text())
    dataset = Dataset.from_list([{"input_ids": r["input_ids"], "assistant_masks": r["token_mask"]} for r in rows])
    args = SFTConfig(output_dir=spec["out"], per_device_train_batch_size=MICRO, gradient_accumulation_steps=GLOBAL // MICRO,
                     learning_rate=LR, weight_decay=0.01, lr_scheduler_type="constant", max_grad_norm=1.0,
                     num_train_epochs=spec["epochs"], max_length=MAX_LENGTH, gradient_checkpointing=False,
                     save_strategy="no", eval_strategy="no", report_to=[], logging_steps=1000, seed=42,
                     use_cpu=spec["device"] == "cpu", bf16=spec["precision"] == "bf16", dataloader_num_workers=0,
                     disable_tqdm=True)
    SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer).train()


def train_rmkit(spec: dict, clock: harness.PhaseClock) -> None:
    from rmkit.config import load_config
    from rmkit.recipes import sft
    from rmkit.recipes.configs import SFTTree

    clock.watch_loaded(sft)
    overrides = [f"policy.model_name={spec['model']}", f"data.train_data_path={spec['jsonl']}", "data.val_data_paths={}",
                 f"checkpointing.checkpoint_dir={spec['out']}", "checkpointing.enabled=false",
                 f"policy.train_global_batch_size={GLOBAL}", f"policy.train_micro_batch_size={MICRO}",
                 f"policy.max_total_sequence_length={MAX_LENGTH}", f"policy.optimizer.lr={LR}",
                 "policy.scheduler.name=constant", "policy.scheduler.warmup_steps=0", f"policy.num_threads={spec['threads']}",
                 f"policy.precision={PRECISIONS[spec['precision']]}", f"sft.max_num_epochs={spec['epochs']}",
                 "logger.progress_bar=false", "logger.tensorboard=false", "logger.plots=false",
                 f"sft.sequence_packing={spec['packing']}"]
    sft.train(load_config(None, overrides, tree_type=SFTTree))


def worker(spec: dict) -> dict:
    """One training run in this (fresh) process; returns its measurements."""
    torch.manual_seed(42)
    clock = harness.PhaseClock()
    (train_trl if spec["side"] == "trl" else train_rmkit)(spec, clock)
    clock.close()
    return {"train_s": clock.span(after_step=spec["warmup_steps"]), **clock.memory}


def prepare(work: Path, sequences: int, policy: str, data_dir: Path) -> dict:
    """The float32 model directory and the demonstrations, tokenized once (JSON for TRL, JSONL for rmkit)."""
    from rmkit.data.demonstrations import load_demonstrations, tokenize_demonstrations
    from rmkit.models.reward import load_tokenizer

    model_dir = common.export_policy_dir(policy, work / "model")
    tokenizer = load_tokenizer(model_dir)
    source = common.data_file(data_dir, "hh_harmless_train.jsonl")
    lines = source.read_text().splitlines()[:sequences]
    (work / "train.jsonl").write_text("".join(line + "\n" for line in lines))
    demos = tokenize_demonstrations(load_demonstrations(work / "train.jsonl").records, tokenizer, MAX_LENGTH).items
    (work / "train_ids.json").write_text(json.dumps([{"input_ids": d.input_ids, "token_mask": d.token_mask} for d in demos]))
    return {"model": str(model_dir), "jsonl": str(work / "train.jsonl"), "data": str(work / "train_ids.json"),
            "tokens": sum(d.length for d in demos), "trained_tokens": sum(sum(d.token_mask) for d in demos),
            "sequences": len(demos)}


def run(side: str, data: dict, work: Path, repeat: int, packing: bool, settings: dict) -> dict:
    """One run in a fresh subprocess; `settings`: threads, device, precision, warmup_epochs."""
    name = f"{side}{'-packed' if packing else ''}-{repeat}"
    spec = {**data, "side": side, "packing": packing, "out": str(work / name / "out"),
            "threads": settings["threads"], "device": settings["device"], "precision": settings["precision"],
            "epochs": settings["warmup_epochs"] + 1, "warmup_steps": settings["warmup_epochs"] * data["sequences"] // GLOBAL}
    result = harness.launch(__file__, spec, work / name, settings["device"], name)
    return {"run": name, **result, "tokens_per_s": data["tokens"] / result["train_s"]}


def markdown_table(payload: dict) -> str:
    """One row per run: tokens/s, train and wall seconds, peak RSS, and tokens/s over the first TRL run's."""
    trl = next((r["tokens_per_s"] for r in payload["runs"] if r["run"].startswith("trl")), None)
    rows = [[r["run"], f"{r['tokens_per_s']:.1f}", f"{r['train_s']:.1f}", f"{r['wall_s']:.1f}",
             f"{r['peak_rss_mib']:.0f}", f"{r['tokens_per_s'] / trl:.2f}x" if trl else "-"] for r in payload["runs"]]
    return harness.markdown(["run", "tokens/s", "train (s)", "wall (s)", "peak RSS (MiB)", "tokens/s over TRL"], rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if harness.subcommand(argv, "sft_vs_trl.py", worker, markdown_table):
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="smollm2", help="a causal LM directory (GGUF too) or smollm2")
    parser.add_argument("--sequences", type=int, default=48)
    parser.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA_DIR, help="holds hh_harmless_train.jsonl")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where both trainers run")
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32", help="bf16: autocast, both sides")
    parser.add_argument("--warmup-epochs", type=int, default=0, help="untimed epochs before the timed one")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/rmkit_sft_vs_trl"))
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/sft_vs_trl.json"))
    args = parser.parse_args(argv)
    if args.warmup_epochs and args.sequences % GLOBAL:
        parser.error(f"--warmup-epochs needs --sequences to be a multiple of the global batch {GLOBAL}")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    data = prepare(args.work_dir, args.sequences, args.policy, args.data_dir)
    runs = []
    for repeat in range(args.repeats):
        order = [("trl", False), ("rmkit", False), ("rmkit", True)]
        for side, packing in order if repeat % 2 == 0 else order[::-1]:
            runs.append(run(side, data, args.work_dir, repeat, packing, vars(args)))
            print(json.dumps(runs[-1]), file=sys.stderr)
    extra = {"device": args.device, "warmup_epochs": args.warmup_epochs} if args.device != "cpu" or args.warmup_epochs else {}
    payload = {"machine": common.machine_info(), "settings": {"max_length": MAX_LENGTH, "global_batch": GLOBAL,
               "micro_batch": MICRO, "lr": LR, "threads": args.threads, "precision": PRECISIONS[args.precision],
               **extra},
               "data": {k: data[k] for k in ("sequences", "tokens", "trained_tokens")}, "runs": runs}
    common.write_json(args.output, payload)
    print(markdown_table(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
