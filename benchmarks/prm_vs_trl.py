"""A process reward model trained twice, with TRL 1.13.0's `PRMTrainer` and with `rmkit train --config
configs/prm.yaml`, on the same PRM800K solutions from the same SmolLM2 base, then both scored on ProcessBench.

TRL's side runs in its own environment, `.venv-trl113` in the repository root (`benchmarks/setup_trl_env.sh prm`,
or `--trl-python`), with the same torch, transformers, accelerate and datasets as rmkit's `.venv`; rmkit's side runs
in this interpreter through `rmkit train`'s CLI entry point. Each side trains in a fresh subprocess
(`harness.launch`) on `--threads` torch threads.

The solutions: PRM800K phase 1 train read by rmkit's loader (`load_step_data`: its rows grouped into solutions,
ambiguous steps (rating 0) unlabelled, a solution with a step holding the separator skipped), then, in file order,
the first `--solutions` that both trainers can take as they are:

- TRL's stepwise format (`{prompt, completions, labels}`) has no "no label" for a step, so each solution is cut
  after its last labelled step (the unlabelled steps after it carry no loss, and a decoder's output at a step never
  sees the steps after it: the cut changes nothing either trainer computes), and a solution with an unlabelled step
  before that (or with no label at all) is left out;
- a solution must fit `--max-length` tokens in TRL's layout (one token longer than rmkit's, below), so neither
  trainer cuts anything.

Both read that one stepwise JSONL file (rmkit with `data.format: stepwise`). Matched (`trl_config`,
`rmkit_config`): the base (one Hugging Face directory: SmolLM2-135M dequantized once by `common.export_policy_dir`,
with `--smoke` a tiny random Llama with SmolLM2's tokenizer), the separator ("\\n\\n", configs/prm.yaml's), every
step trained (not the last only), one epoch, the global batch (`--batch-size` solutions per optimizer step) in
micro-batches of `--micro-batch-size` (TRL: per-device batch x gradient accumulation), AdamW (lr, betas (0.9,
0.999), eps 1e-8, weight decay on matrices only: rmkit decays tensors of 2+ dimensions, transformers all but biases
and norm weights, the same set for a Llama), linear warmup for `--warmup-steps` then cosine down to `--min-lr-ratio`
of the peak (TRL `cosine_with_min_lr` with `min_lr_rate`), gradient clipping at 1.0, float32, no gradient
checkpointing (PRMConfig defaults to it and to bf16: both set off), dropout off (TRL's `disable_dropout`; rmkit's
backbone has none), the seed, metrics logged every 10 steps, no evaluation and no checkpoints during the run, the
final model saved.

Known differences, each side as it ships:

- the model: TRL trains `AutoModelForTokenClassification` with 2 labels (a biased linear head, cross-entropy,
  P(correct) = softmax(logits)[1]); rmkit a one-output sequence classifier read at every position (unbiased head,
  binary cross-entropy with logits, P(correct) = sigmoid). The heads start from different random draws;
- the layout: TRL puts the tokenizer's BOS before the prompt (SmolLM2: `<|im_start|>`, which SmolLM2's tokenizer
  does not add itself), rmkit tokenizes the prompt with the tokenizer's own special tokens (none for SmolLM2); then
  both: each step's ids followed by the separator's ids, each tokenized on its own, the label at the separator's
  last token;
- the loss normalization: rmkit divides the summed loss by the labelled steps of the whole global batch (exact
  under accumulation). TRL (transformers 5.24) takes each micro-batch's mean over its labelled tokens and, since
  the token classifier accepts loss keyword arguments, does not divide by the accumulation steps: the gradient is
  the sum of the micro-batch means, `--batch-size / --micro-batch-size` times the size of a mean (AdamW is nearly
  blind to that scale; clipping at 1.0 is not);
- batching: rmkit groups solutions of similar length into a batch (`data.batching: length_grouped`, less
  padding), TRL's Trainer samples them at random (`--rmkit-set data.batching=random` gives rmkit TRL's way);
- the schedule's steps: rmkit warms up as (step + 1) / (warmup + 1) and starts the cosine at the end of warmup,
  transformers as (step + 1) / warmup and one step further along;
- each side draws its own data order and head from its own RNG.

Measured per side: `wall_s`, the whole training process (start, imports, loading, tokenization, training, saving:
the time a user waits); `train_s`, the harness clock from the first training forward to the end of the last
optimizer step (`benchmarks/harness.py`, hooked on every word-embedding table and every optimizer step, the same in
both trainers); solutions/s over each; the process's own peak resident set (VmHWM, `harness.resident_peak_mib`) up to
the last optimizer step and over its whole life. After saving, the TRL process checks that TRL tokenized every
solution as `trl_layout` lays it out (the layout its scorer reads; well under a second, inside its `wall_s`).
Then ProcessBench per split, for both saved models, in this process, by one rule: each step's P(correct), from
rmkit's model by `rmkit.inference.load_scorer(...).score_steps`, from TRL's by `trl_step_rewards` (softmax over
the two labels at each step's separator in TRL's layout); a step past `--max-length` is unscored (judged right);
`rmkit.report.processbench.processbench_scores` at threshold 0.5 (error accuracy, correct accuracy, F1, their
mean over the splits, and rmkit's threshold-free step AUC: whether a model ranks first wrong steps below the steps
before them even when it judges every step right). ProcessBench files list their erroneous solutions first, so `--processbench-limit N` takes
the first ceil(N/2) erroneous and the first floor(N/2) correct solutions of each split, in file order. PRM800K's
problems come from MATH, as ProcessBench's `math` split does.

    bash benchmarks/setup_trl_env.sh prm
    python benchmarks/prm_vs_trl.py --solutions 512 --processbench-limit 40
    python benchmarks/prm_vs_trl.py --smoke    # tiny random models, 2 steps, 4 rows per split: end to end
    # one side now, the other later (the first side's model is scored again beside the second's):
    python benchmarks/prm_vs_trl.py --sides rmkit --output rmkit.json && python benchmarks/prm_vs_trl.py --sides trl --reuse rmkit.json
    python benchmarks/prm_vs_trl.py table benchmarks/results/prm_vs_trl.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import common, harness  # noqa: E402

SIDES = ("trl", "rmkit")
TRL_PYTHON = common.REPO_ROOT / ".venv-trl113" / "bin" / "python"
PRM_DATA = common.DEFAULT_DATA_DIR / "prm"
SPLITS = ("gsm8k", "math", "olympiadbench", "omnimath")
SMOKE = {"solutions": 8, "batch_size": 4, "micro_batch_size": 2, "max_length": 256, "warmup_steps": 1, "lr": 1e-3,
         "processbench_limit": 4}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true",
                        help=f"a tiny random Llama (SmolLM2's tokenizer) instead of SmolLM2, and {SMOKE}")
    parser.add_argument("--solutions", type=int, default=512, help="training solutions (one epoch)")
    parser.add_argument("--batch-size", type=int, default=32, help="solutions per optimizer step, both sides")
    parser.add_argument("--micro-batch-size", type=int, default=4, help="solutions per forward/backward")
    parser.add_argument("--max-length", type=int, default=1024, help="tokens per solution (longer ones are left out)")
    parser.add_argument("--separator", default="\n\n", help="text after every step")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--min-lr-ratio", type=float, default=0.1, help="the cosine's floor, a fraction of --lr")
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--processbench-limit", type=int, default=40,
                        help="solutions per ProcessBench split, half erroneous and half correct (0: skip)")
    parser.add_argument("--sides", default="trl,rmkit", help="comma list of trl, rmkit (run in this order)")
    parser.add_argument("--rmkit-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a dotted `rmkit train` override on top of the matched config (repeatable), recorded "
                             "under `rmkit_overrides`; e.g. data.batching=random")
    parser.add_argument("--reuse", type=Path, metavar="RESULTS",
                        help="an earlier results JSON of the same settings: its sides that --sides leaves out are "
                             "taken from it (their training figures) and their saved models, still in their "
                             "folders, are scored on ProcessBench again by this run")
    parser.add_argument("--trl-python", type=Path, default=TRL_PYTHON, help="the TRL 1.13.0 environment's python")
    parser.add_argument("--data-dir", type=Path, default=PRM_DATA, help="holds prm800k/ and processbench/")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/rmkit-bench-prm"))
    parser.add_argument("--output", type=Path, help="results JSON (default: benchmarks/results/prm_vs_trl.json, "
                                                     "with --smoke WORK_DIR/prm_vs_trl_smoke.json)")
    if "--smoke" in argv:
        parser.set_defaults(**SMOKE)
    args = parser.parse_args(argv)
    args.sides = [s for s in args.sides.split(",") if s]
    if not args.sides or not set(args.sides) <= set(SIDES):
        parser.error("--sides takes trl,rmkit")
    if args.batch_size % args.micro_batch_size or args.solutions % args.batch_size:
        parser.error(f"--micro-batch-size ({args.micro_batch_size}) must divide --batch-size ({args.batch_size}), "
                     f"and that --solutions ({args.solutions}): every optimizer step a whole batch")
    if "trl" in args.sides and not args.trl_python.exists():
        parser.error(f"{args.trl_python} is missing: run benchmarks/setup_trl_env.sh prm, or pass --sides rmkit")
    args.output = args.output or (args.work_dir / "prm_vs_trl_smoke.json" if args.smoke else
                                  common.REPO_ROOT / "benchmarks" / "results" / "prm_vs_trl.json")
    return args


# ---------------------------------------------------------------- the solutions, as both trainers take them


def labelled_prefix(solution):
    """`solution` (`rmkit.data.steps.StepSolution`) cut after its last labelled step, when every step up to there
    is labelled; None when it has no label or an unlabelled step among its labelled ones (TRL's stepwise format
    cannot say "no label")."""
    labelled = [i for i, label in enumerate(solution.labels) if label is not None]
    if not labelled or len(labelled) != labelled[-1] + 1:
        return None
    end = labelled[-1] + 1
    return dataclasses.replace(solution, steps=solution.steps[:end], labels=solution.labels[:end])


def select_solutions(solutions: Sequence, tokenizer, count: int, max_length: int, separator: str) -> dict:
    """The first `count` of `solutions` that TRL and rmkit both train on as they are (`labelled_prefix`, and no
    longer than `max_length` in TRL's layout, the longer of the two): `{"solutions": [...], "left_out": {reason:
    count}}` over the solutions looked at; SystemExit when fewer than `count` qualify."""
    chosen, left_out = [], {"an unlabelled step before the last labelled one, or no label": 0,
                            f"over {max_length} tokens": 0}
    reasons = list(left_out)
    for solution in solutions:
        if len(chosen) == count:
            break
        cut = labelled_prefix(solution)
        if cut is None:
            left_out[reasons[0]] += 1
        elif len(trl_layout(tokenizer, cut.prompt, cut.steps, separator)[0]) > max_length:
            left_out[reasons[1]] += 1
        else:
            chosen.append(cut)
    if len(chosen) < count:
        raise SystemExit(f"only {len(chosen)} solutions qualify ({left_out} left out); ask for fewer")
    return {"solutions": chosen, "left_out": left_out}


def stepwise_record(solution) -> dict:
    """TRL's stepwise record of a fully labelled solution: `{prompt, completions, labels}`."""
    return {"prompt": solution.prompt, "completions": list(solution.steps), "labels": [bool(x) for x in solution.labels]}


def trl_layout(tokenizer, prompt: str, steps: Sequence[str], separator: str) -> tuple[list[int], list[int]]:
    """The ids TRL 1.13.0's `PRMTrainer.tokenize_row` makes of a solution (before its cut) and each step's label
    position: the tokenizer's BOS (when it has one), the prompt's ids without special tokens, then each step's ids
    followed by the separator's, every piece tokenized on its own; a step's label sits at its separator's last
    token."""
    ids = ([tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else [])
    ids += tokenizer(prompt, add_special_tokens=False)["input_ids"]
    separator_ids = tokenizer.encode(separator, add_special_tokens=False)
    positions = []
    for step in steps:
        ids += tokenizer(step, add_special_tokens=False)["input_ids"] + separator_ids
        positions.append(len(ids) - 1)
    return ids, positions


# ---------------------------------------------------------------- scoring both saved models by one rule


@torch.no_grad()
def trl_step_rewards(model_dir: str | Path, solutions: Sequence[tuple[str, Sequence[str]]], separator: str,
                     max_length: int, batch_size: int = 8) -> list[list[float | None]]:
    """Each solution's step probabilities from TRL's saved token classifier: softmax over its two labels at each
    step's label position in `trl_layout`, P(label 1 = correct); the ids cut to `max_length`, a step whose position
    falls past the cut unscored (None), as `RewardScorer.score_steps` leaves rmkit's. Solutions go through float32
    forwards in batches of `batch_size` of similar length, padded on the right."""
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForTokenClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    laid_out = [trl_layout(tokenizer, prompt, steps, separator) for prompt, steps in solutions]
    order = sorted(range(len(laid_out)), key=lambda i: len(laid_out[i][0]))
    out: list[list[float | None]] = [[] for _ in laid_out]
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        rows = [laid_out[i][0][:max_length] for i in batch]
        width = max(map(len, rows))
        input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for r, ids in enumerate(rows):
            input_ids[r, :len(ids)], attention_mask[r, :len(ids)] = torch.tensor(ids), 1
        correct = model(input_ids=input_ids, attention_mask=attention_mask).logits.float().softmax(-1)[..., 1]
        for r, i in enumerate(batch):
            out[i] = [correct[r, p].item() if p < max_length else None for p in laid_out[i][1]]
    return out


def rmkit_step_rewards(model_dir: str | Path, solutions: Sequence[tuple[str, Sequence[str]]]) -> list[list]:
    """Each solution's step probabilities from rmkit's export, by its inference core (float32)."""
    from rmkit.inference import load_scorer

    return [r.step_rewards for r in load_scorer(model_dir).score_steps(solutions)]


def processbench_rows(data_dir: Path, limit: int) -> list:
    """The first ceil(limit / 2) erroneous and first floor(limit / 2) correct solutions of each ProcessBench split
    in `data_dir/processbench/` (`ProcessRow`s, in file order): its files list the erroneous ones first."""
    from rmkit.report.layouts import records_or_raise
    from rmkit.report.processbench import parse_row

    rows = []
    for split in SPLITS:
        wanted = {True: math.ceil(limit / 2), False: limit // 2}  # erroneous?
        for record in records_or_raise(str(common.data_file(data_dir, f"processbench/{split}.json"))):
            row = parse_row(record, split)
            erroneous = row.label != -1
            if wanted[erroneous]:
                wanted[erroneous] -= 1
                rows.append(row)
        if any(wanted.values()):
            raise SystemExit(f"{split}: too few solutions for --processbench-limit {limit}")
    return rows


def processbench(side: str, model_dir: str, rows: list, args: argparse.Namespace) -> dict:
    """ProcessBench's scores (`processbench_scores`, threshold 0.5) of one side's saved model on `rows`, and under
    `step_rewards` the per-solution step probabilities they came from (for `paired_difference`)."""
    from rmkit.report.processbench import DEFAULT_THRESHOLD, processbench_scores

    solutions = [(row.prompt, row.steps) for row in rows]
    rewards = (trl_step_rewards(model_dir, solutions, args.separator, args.max_length) if side == "trl"
               else rmkit_step_rewards(model_dir, solutions))
    return {**processbench_scores(rows, rewards, DEFAULT_THRESHOLD), "step_rewards": rewards}


def paired_difference(rows: list, step_rewards: dict, draws: int = 1000, seed: int = 0) -> dict:
    """rmkit minus TRL in the mean F1 and the mean step AUC over the splits, each with a bootstrap standard error:
    `draws` times, each split's erroneous and correct solutions drawn again with replacement (so each split keeps
    its counts), the same draw for both sides (the difference is paired by solution)."""
    from rmkit.report.processbench import DEFAULT_THRESHOLD, processbench_scores

    keys = ("average_f1", "average_step_auc")

    def difference(index: list[int]) -> dict:
        picked = [rows[i] for i in index]
        rmkit, trl = (processbench_scores(picked, [step_rewards[side][i] for i in index], DEFAULT_THRESHOLD)
                      for side in ("rmkit", "trl"))
        return {k: None if rmkit[k] is None or trl[k] is None else rmkit[k] - trl[k] for k in keys}

    strata: dict[tuple, list[int]] = {}
    for i, row in enumerate(rows):
        strata.setdefault((row.split, row.label != -1), []).append(i)
    rng = random.Random(seed)
    point = difference(list(range(len(rows))))
    samples = [difference([rng.choice(members) for members in strata.values() for _ in members]) for _ in range(draws)]
    result = {"draws": draws, "seed": seed}
    for k in keys:
        values = [s[k] for s in samples if s[k] is not None]
        result[k] = {"difference": point[k], "se": statistics.stdev(values) if len(values) > 1 else None}
    return result


# ---------------------------------------------------------------- the two configs


def trl_config(spec: dict) -> dict:
    """TRL's `PRMConfig` keywords for `spec`."""
    return {"per_device_train_batch_size": spec["micro_batch_size"],
            "gradient_accumulation_steps": spec["batch_size"] // spec["micro_batch_size"], "num_train_epochs": 1,
            "learning_rate": spec["lr"], "lr_scheduler_type": "cosine_with_min_lr",
            "lr_scheduler_kwargs": {"min_lr_rate": spec["min_lr_ratio"]}, "warmup_steps": spec["warmup_steps"],
            "weight_decay": spec["weight_decay"], "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8,
            "max_grad_norm": spec["max_grad_norm"], "max_length": spec["max_length"],
            "step_separator": spec["separator"], "train_on_last_step_only": False, "disable_dropout": True,
            "bf16": False, "gradient_checkpointing": False, "use_cpu": True, "seed": spec["seed"],
            "logging_steps": 10, "report_to": "none", "save_strategy": "no", "eval_strategy": "no",
            "disable_tqdm": True}


def rmkit_config(spec: dict) -> dict:
    """The `rmkit train` config (configs/prm.yaml's recipe) matching `trl_config`: no validation, no checkpoints,
    the final model only."""
    return {
        "prm": {"max_num_epochs": 1, "max_num_steps": None, "val_period": 0, "val_at_start": False,
                "val_at_end": False, "seed": spec["seed"], "log_period": 10, "step_separator": spec["separator"],
                "train_on_last_step_only": False},
        "policy": {"model_name": spec["base_dir"], "train_global_batch_size": spec["batch_size"],
                   "train_micro_batch_size": spec["micro_batch_size"],
                   "max_total_sequence_length": spec["max_length"], "precision": "float32",
                   "optimizer": {"lr": spec["lr"], "weight_decay": spec["weight_decay"], "betas": [0.9, 0.999],
                                 "eps": 1e-8},
                   "scheduler": {"name": "cosine", "warmup_steps": spec["warmup_steps"], "warmup_ratio": 0.0,
                                 "min_lr_ratio": spec["min_lr_ratio"]},
                   "max_grad_norm": spec["max_grad_norm"], "gradient_checkpointing": False,
                   "num_threads": spec["threads"]},
        "data": {"format": "stepwise", "train_data_path": spec["train_file"], "val_data_paths": {}},
        "checkpointing": {"enabled": False, "checkpoint_dir": spec["out_dir"]},
        "logger": {"tensorboard": False, "plots": False, "progress_bar": False},
    }


# ---------------------------------------------------------------- inside a training process


def train_trl(spec: dict) -> list[float]:
    """TRL's PRMTrainer on `trl_config(spec)` from the stepwise file; returns its logged losses. After saving, checks
    that TRL tokenized every solution as `trl_layout` lays it out."""
    from datasets import Dataset
    from transformers import AutoModelForTokenClassification, AutoTokenizer
    from trl.experimental.prm import PRMConfig, PRMTrainer

    records = [json.loads(line) for line in Path(spec["train_file"]).read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(spec["base_dir"])
    model = AutoModelForTokenClassification.from_pretrained(spec["base_dir"], num_labels=2, dtype=torch.float32)
    trainer = PRMTrainer(model=model, args=PRMConfig(output_dir=spec["out_dir"], **trl_config(spec)),
                         train_dataset=Dataset.from_list(records), processing_class=tokenizer)
    trainer.train()
    trainer.save_model(spec["model_out"])
    tokenizer.save_pretrained(spec["model_out"])
    for record, row in zip(records, trainer.train_dataset, strict=True):
        ids, positions = trl_layout(tokenizer, record["prompt"], record["completions"], spec["separator"])
        labelled = {i: label for i, label in enumerate(row["labels"]) if label != -100}
        if row["input_ids"] != ids or labelled != dict(zip(positions, map(int, record["labels"]))):
            raise SystemExit(f"TRL laid out a solution otherwise than trl_layout: {record['prompt'][:60]!r}")
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def train_rmkit(spec: dict) -> list[float]:
    """`rmkit train` through its CLI entry point on `rmkit_config(spec)`; returns its logged losses."""
    import yaml

    from rmkit.cli import main as rmkit_main

    out = Path(spec["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.yaml").write_text(yaml.safe_dump(rmkit_config(spec), sort_keys=False))
    status = rmkit_main(["train", "--config", str(out / "bench.yaml"), *spec["rmkit_set"]])
    if status != 0:
        raise SystemExit(f"rmkit train exited with status {status}")
    (out / "final").rename(spec["model_out"])
    records = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [r["train/loss"] for r in records if "train/loss" in r]


def worker(spec: dict) -> dict:
    """One training run in this (fresh) process: the harness clock's training span, its optimizer steps and
    embedded tokens, the logged losses, the peak RSS up to the last optimizer step and over the whole process, and
    this environment's package versions."""
    training_peak = {}
    clock = harness.PhaseClock(on_step=lambda step: training_peak.update(mib=harness.resident_peak_mib()))
    clock.watch()
    losses = {"trl": train_trl, "rmkit": train_rmkit}[spec["side"]](spec)
    clock.close()
    return {"train_s": clock.span(), "optimizer_steps": len(clock.step_ends), "embedded_tokens": clock.training_tokens,
            "logged_losses": losses, "peak_rss_mib": training_peak["mib"],
            # the kernel's high-water mark can read a little below a reading taken earlier (its counters are cached)
            "process_peak_rss_mib": max(training_peak["mib"], harness.resident_peak_mib()),
            "versions": common.machine_info()["versions"]}


# ---------------------------------------------------------------- orchestration


def tiny_base(directory: Path, seed: int) -> Path:
    """`--smoke`'s base: a random Llama causal LM (hidden 32, 2 layers) with SmolLM2's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rmkit.models.reward import load_tokenizer
    from rmkit.models.setup import resolve_model_name

    tokenizer = load_tokenizer(resolve_model_name("smollm2"))
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                         max_position_embeddings=1024, bos_token_id=tokenizer.bos_token_id,
                                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                         tie_word_embeddings=True))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def prepare(args: argparse.Namespace) -> dict:
    """The base directory, the selected solutions (written as stepwise JSONL for both sides), their counts."""
    from transformers import AutoTokenizer

    from rmkit.data.steps import load_step_data

    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    base = tiny_base(work / "tiny", args.seed) if args.smoke else common.export_policy_dir("smollm2", work / "base")
    loaded = load_step_data(common.data_file(args.data_dir, "prm800k/phase1_train.parquet"),
                            ambiguous="drop", step_separator=args.separator, on_error="skip")
    selected = select_solutions(loaded.records, AutoTokenizer.from_pretrained(base), args.solutions, args.max_length,
                                args.separator)
    train_file = work / "train.jsonl"
    train_file.write_text("".join(json.dumps(stepwise_record(s)) + "\n" for s in selected["solutions"]))
    steps = sum(len(s.labels) for s in selected["solutions"])
    return {"base_dir": str(base), "train_file": str(train_file), "labelled_steps": steps,
            "correct_steps": sum(label for s in selected["solutions"] for label in s.labels),
            "left_out": {**selected["left_out"], "skipped by the loader (a step holding the separator)":
                         len(loaded.skipped)}}


def settings(args: argparse.Namespace) -> dict:
    """The matched settings (the keys both configs are built from)."""
    return {key: getattr(args, key) for key in ("solutions", "batch_size", "micro_batch_size", "max_length",
                                                "separator", "lr", "weight_decay", "warmup_steps", "min_lr_ratio",
                                                "max_grad_norm", "threads", "seed")}


def run_side(args: argparse.Namespace, data: dict, side: str) -> dict:
    """Train one side in a fresh process (its folder `WORK_DIR/<side>`), with its speed figures added."""
    out_dir = args.work_dir / side
    shutil.rmtree(out_dir, ignore_errors=True)
    spec = {"side": side, **settings(args), "base_dir": data["base_dir"], "train_file": data["train_file"],
            "rmkit_set": args.rmkit_set, "out_dir": str(out_dir / "run"), "model_out": str(out_dir / "model")}
    python = args.trl_python if side == "trl" else sys.executable
    result = harness.launch(__file__, spec, out_dir, "cpu", f"{side} run", python=python)
    expected = args.solutions // args.batch_size
    if result["optimizer_steps"] != expected:
        raise SystemExit(f"{side}: {result['optimizer_steps']} optimizer steps, {expected} expected")
    result.update(side=side, model_dir=spec["model_out"], solutions_per_s=args.solutions / result["train_s"],
                  solutions_per_s_wall=args.solutions / result["wall_s"])
    print(f"{side:>5}: wall {result['wall_s']:.1f} s ({result['solutions_per_s_wall']:.3f} solutions/s), train "
          f"{result['train_s']:.1f} s ({result['solutions_per_s']:.3f} solutions/s), rss "
          f"{result['peak_rss_mib']:.0f} MiB (process {result['process_peak_rss_mib']:.0f})", flush=True)
    return result


def reused_runs(args: argparse.Namespace) -> list[dict]:
    """The runs of `--reuse` for the sides `--sides` leaves out, checked: the same settings (and, for rmkit's side,
    the same `--rmkit-set`) and their saved models still on disk."""
    earlier = json.loads(args.reuse.read_text())
    recorded = {key: earlier["settings"].get(key) for key in settings(args)}
    if recorded != settings(args):
        changed = {k: (v, getattr(args, k)) for k, v in recorded.items() if v != getattr(args, k)}
        raise SystemExit(f"--reuse {args.reuse}: other settings than this run's (recorded, given): {changed}")
    runs = [run for run in earlier["runs"] if run["side"] not in args.sides]
    if any(run["side"] == "rmkit" for run in runs) and earlier.get("rmkit_overrides", []) != args.rmkit_set:
        raise SystemExit(f"--reuse {args.reuse}: its rmkit side ran with --rmkit-set {earlier.get('rmkit_overrides', [])}, "
                         f"this run gives {args.rmkit_set}")
    for run in runs:
        if not Path(run["model_dir"]).is_dir():
            raise SystemExit(f"--reuse {args.reuse}: the {run['side']} side's model {run['model_dir']} is gone")
        print(f"{run['side']:>5}: reused from {args.reuse} (wall {run['wall_s']:.1f} s)", flush=True)
    return runs


def markdown_table(payload: dict) -> str:
    """One row per side (speed, memory, ProcessBench F1 per split, their mean, the mean step AUC), then rmkit / TRL
    and rmkit minus TRL (paired, bootstrap SE)."""
    head = ["side", "wall (s)", "solutions/s (wall)", "train (s)", "solutions/s (train)", "peak RSS (MiB)",
            *(f"F1 {s}" for s in SPLITS), "F1 mean", "step AUC mean"]
    rows = []

    def f1(value) -> str:
        return "-" if value is None else f"{value:.3f}"

    for run in payload["runs"]:
        scores = payload["processbench"].get(run["side"], {"splits": {}, "average_f1": None})
        rows.append([run["side"], f"{run['wall_s']:.1f}", f"{run['solutions_per_s_wall']:.3f}", f"{run['train_s']:.1f}",
                     f"{run['solutions_per_s']:.3f}", f"{run['process_peak_rss_mib']:.0f}",
                     *(f1(scores["splits"].get(s, {}).get("f1")) for s in SPLITS), f1(scores["average_f1"]),
                     f1(scores.get("average_step_auc"))])
    if "rmkit_over_trl" in payload:
        q = payload["rmkit_over_trl"]
        rows.append(["**rmkit / TRL**", "", f"**{q['wall_speed']:.2f}x**", "", f"{q['train_speed']:.2f}x",
                     f"{q['process_peak_rss']:.2f}x"])
    if "rmkit_minus_trl" in payload:
        d = payload["rmkit_minus_trl"]

        def paired(key: str) -> str:
            value, se = d[key]["difference"], d[key]["se"]
            return "-" if value is None else f"{value:+.3f} (SE {'-' if se is None else f'{se:.3f}'})"

        rows.append(["rmkit - TRL (paired)", *[""] * (len(head) - 3), paired("average_f1"), paired("average_step_auc")])
    return harness.markdown(head, rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if harness.subcommand(argv, "prm_vs_trl.py", worker, markdown_table):
        return 0
    args = parse_args(argv)
    info = common.machine_info()
    data = prepare(args)
    print(f"{args.solutions} solutions, {data['labelled_steps']} labelled steps ({data['correct_steps']} correct); "
          f"left out: {data['left_out']}", flush=True)
    reused = reused_runs(args) if args.reuse else []  # checked before anything trains
    runs = sorted([run_side(args, data, side) for side in args.sides] + reused, key=lambda r: SIDES.index(r["side"]))
    scores = {}
    if args.processbench_limit:
        rows = processbench_rows(args.data_dir, args.processbench_limit)
        torch.set_num_threads(args.threads)
        for run in runs:
            start = time.perf_counter()
            scores[run["side"]] = processbench(run["side"], run["model_dir"], rows, args)
            scores[run["side"]]["scoring_s"] = time.perf_counter() - start
            print(f"{run['side']:>5}: ProcessBench F1 " + ", ".join(
                f"{s} {v['f1']:.3f}" for s, v in scores[run["side"]]["splits"].items() if v["f1"] is not None)
                + f"; mean {scores[run['side']]['average_f1']}; step AUC mean "
                f"{scores[run['side']]['average_step_auc']} ({scores[run['side']]['scoring_s']:.0f} s to score "
                f"{len(rows)} solutions)", flush=True)
    spec = {**settings(args), "base_dir": data["base_dir"], "train_file": data["train_file"], "out_dir": "<side>/run"}
    payload = {
        "command": "python benchmarks/prm_vs_trl.py " + " ".join(argv),
        "machine": {**info, "load_average_end": os.getloadavg()},
        "versions": {r["side"]: r["versions"] for r in runs},
        "settings": {**settings(args), "base": "tiny random Llama (--smoke)" if args.smoke else "smollm2",
                     "processbench_limit_per_split": args.processbench_limit},
        "data": {k: data[k] for k in ("labelled_steps", "correct_steps", "left_out")},
        "configs": {"trl": trl_config(spec), "rmkit": rmkit_config(spec)},
        **({"rmkit_overrides": args.rmkit_set} if args.rmkit_set else {}),
        "measures": {"wall_s": "the whole training process, start to exit",
                     "train_s": "first training forward to the end of the last optimizer step (harness clock)",
                     "processbench": "P(correct) per step, threshold 0.5; rmkit: score_steps; TRL: "
                                     "softmax(logits)[1] at each separator's last token in TRL's layout; scoring_s: "
                                     "load and score, in this process"},
        "runs": runs,
        "processbench": scores,
    }
    by_side = {r["side"]: r for r in runs}
    if len(by_side) == 2:
        trl, rmkit = by_side["trl"], by_side["rmkit"]
        payload["rmkit_over_trl"] = {"wall_speed": trl["wall_s"] / rmkit["wall_s"],
                                     "train_speed": trl["train_s"] / rmkit["train_s"],
                                     "process_peak_rss": rmkit["process_peak_rss_mib"] / trl["process_peak_rss_mib"]}
        if scores:
            payload["rmkit_minus_trl"] = paired_difference(rows, {side: scores[side]["step_rewards"] for side in SIDES})
    common.write_json(args.output, payload)
    print(markdown_table(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
