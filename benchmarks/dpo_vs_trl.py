"""DPO of one policy twice, with TRL's `DPOTrainer` and with `rmkit dpo`, on the same token ids: pairs/s
including the reference pass, peak RSS, and held-out accuracy of the implicit reward.

Held equal: the weights (`--policy`, SmolLM2-135M-Instruct by default, dequantized once to a float32
directory both sides load); the token ids (the first `--pairs` pairs of hh_harmless_train.jsonl tokenized once
by rmkit's policy tokenization, `rmkit.data.policy_tokenize`: the prompt rendered as at generation with the
chat template and shared by both responses, each pair fitted to `--max-length`, so TRL's collator cuts
nothing; TRL receives `prompt_ids` / `chosen_ids` / `rejected_ids` through a subclass whose `_prepare_dataset`
returns them unchanged, rmkit reads the same JSONL lines through its data layer, and every run records a hash of
the pairs its trainer holds, compared with the prepared ones: `tokens_identical`); the sigmoid DPO loss on
summed response log-ratios with `--beta`; global batch `--batch` as micro-batches of `--micro` (TRL averages
each micro-batch and divides by the accumulation steps, rmkit divides by the global pair count: the same
for equal micro-batches); reference log-probs precomputed once in micro-batches of `--micro` (TRL
`precompute_ref_log_probs=True`, rmkit always; rmkit's cache directory is fresh per run); AdamW (fused on
both) at `--lr`, betas (0.9, 0.999), eps 1e-8, weight decay 0.01 on matrices only (rmkit: tensors of 2+
dimensions; the Trainer: all but biases and norms, the same set for Llama), a constant schedule without
warmup, grad clip 1.0, one epoch, float32, dropout off, no gradient checkpointing, no evaluation or
checkpoints during training, `--threads` torch threads, seed 42. Each run is a fresh subprocess; repeats
alternate which side goes first.

Known differences: TRL draws batches with its `RandomSampler`, rmkit with `data.batching=random`: both shuffle
from seed 42, with different generators, so the batches differ (each pair once per epoch). Each trainer keeps
its own forward: rmkit runs a pair as one row `[prompt, chosen, rejected]` (the prompt computed once) and takes
log-probs from full logits; TRL runs 2N right-padded rows and its fused LM head computes log-probs at the
response positions only. TRL's reference pass takes the pairs in dataset order, rmkit's sorts them by length
(less padding); TRL stores the result in an Arrow file (in-memory datasets get a random, uncached name),
rmkit in a `.pt` file. TRL computes extra metrics every micro-batch (entropy, mean logits and top-1 token
accuracy in its LM head, then several `.item()` syncs); rmkit reduces its metrics once per step. Both hash
the reference weights for their caches before the first forward: outside the timed span, reported as
`weights_hash_s`.

Timed by the harness clock (`benchmarks/harness.py`), hooked the same way in both processes on the input
embeddings and every optimizer step: `reference_s` (its `reference` phase) runs from the first forward (the
reference pass) to the first training forward (grad enabled, train mode), so it holds the reference pass and the
setup after it (optimizer, data loader); `training_s` runs from there to the end of the last optimizer step;
`total_s` is their sum (loading, tokenization, the weights hash and saving excluded). pairs/s = pairs / total_s.
Peak RSS (and GPU memory) are the process's peaks at the last optimizer step. Held-out accuracy: for the first
`--eval-pairs` pairs of hh_harmless_val.jsonl (the same tokenization), the implicit reward beta * (log pi(y|x) - log
pi_ref(y|x)) of each response, by one function for both sides' saved models (the reference being the starting
weights), each sequence run alone; accuracy = the fraction with chosen > rejected (a tie is wrong), for each
side's first run.

`--device cuda` runs both trainers (and the held-out scoring) on the GPU and records each run's peak GPU memory;
the clock synchronizes CUDA before reading the time. `--precision bf16` is bf16 autocast over float32 weights on
both sides (TRL `bf16=True`, rmkit `policy.precision=bfloat16`). `--warmup-epochs N` trains N untimed epochs
first: `steady_training_pairs_per_s` is then the pairs of the last epoch over its seconds (from the end of the
last warmup step to the end of the last step); `pairs_per_s` stays every epoch's pairs over the whole span.

    python benchmarks/dpo_vs_trl.py --pairs 64 --eval-pairs 64 --repeats 3
    python benchmarks/dpo_vs_trl.py --device cuda --precision bf16 --warmup-epochs 1 --repeats 1 --threads 8
    python benchmarks/dpo_vs_trl.py table benchmarks/results/dpo_vs_trl.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import common, harness  # noqa: E402

SIDES = ("trl", "rmkit")
SEED, WEIGHT_DECAY, MAX_GRAD_NORM, BETAS, EPS = 42, 0.01, 1.0, (0.9, 0.999), 1e-8
ID_KEYS = ("prompt_ids", "chosen_ids", "rejected_ids")
PRECISIONS = {"fp32": "float32", "bf16": "bfloat16"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="smollm2", help="a causal LM directory (GGUF too) or smollm2")
    parser.add_argument("--pairs", type=int, default=64, help="training pairs: the first N of hh_harmless_train")
    parser.add_argument("--eval-pairs", type=int, default=64, help="held-out pairs of hh_harmless_val (0: skip)")
    parser.add_argument("--max-length", type=int, default=256, help="prompt + response tokens")
    parser.add_argument("--lr", type=float, default=5e-6)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--batch", type=int, default=8, help="pairs per optimizer step")
    parser.add_argument("--micro", type=int, default=4, help="pairs per forward/backward and per reference forward")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where both trainers run")
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32", help="bf16: autocast, both sides")
    parser.add_argument("--warmup-epochs", type=int, default=0, help="untimed epochs before the timed one")
    parser.add_argument("--repeats", type=int, default=3, help="runs per side, alternating which goes first")
    parser.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA_DIR)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/rmkit-bench-dpo"))
    parser.add_argument("--output", type=Path, default=common.REPO_ROOT / "benchmarks" / "results" / "dpo_vs_trl.json")
    args = parser.parse_args(argv)
    for name in ("pairs", "max_length", "batch", "micro", "threads", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup_epochs < 0:
        parser.error("--warmup-epochs must be 0 or more")
    if args.eval_pairs < 0:
        parser.error("--eval-pairs must be 0 (skip the held-out accuracy) or more")
    if args.policy != "smollm2" and not Path(args.policy).exists():
        parser.error(f"--policy {args.policy}: no such directory; pass a causal LM directory (GGUF too) or smollm2")
    if args.lr <= 0 or args.beta <= 0:
        parser.error("--lr and --beta must be positive")
    if args.batch % args.micro:
        parser.error(f"--batch {args.batch} must be a multiple of --micro {args.micro}")
    if args.pairs % args.batch:
        parser.error(f"--pairs {args.pairs} must be a multiple of --batch {args.batch} (both trainers then take "
                     f"whole batches), e.g. --pairs {max(args.batch, args.pairs // args.batch * args.batch)}")
    return args


# ---------------------------------------------------------------- inside a training process


def token_digest(pairs: list[dict]) -> str:
    """sha256 of the pairs' token ids, in order."""
    return hashlib.sha256(json.dumps([[p[k] for k in ID_KEYS] for p in pairs]).encode()).hexdigest()


def train_trl(spec: dict, clock: harness.PhaseClock) -> str:
    """TRL's DPOTrainer on the pre-tokenized pairs; returns the digest of the pairs it trained on."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer
    from trl.trainer import dpo_trainer

    class PretokenizedDPOTrainer(DPOTrainer):
        """Takes `prompt_ids` / `chosen_ids` / `rejected_ids` as given (rmkit's tokenization)."""

        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            return dataset

    dpo_trainer.hash_module = clock.timed(dpo_trainer.hash_module, "weights_hash")
    model = AutoModelForCausalLM.from_pretrained(spec["policy_dir"], dtype=torch.float32)  # master weights
    tokenizer = AutoTokenizer.from_pretrained(spec["policy_dir"])
    clock.watch(model, before_training="reference")
    pairs = json.loads(Path(spec["pairs_ids"]).read_text())
    args = DPOConfig(
        output_dir=spec["out_dir"], per_device_train_batch_size=spec["micro"],
        gradient_accumulation_steps=spec["batch"] // spec["micro"], learning_rate=spec["lr"], beta=spec["beta"],
        loss_type=["sigmoid"], weight_decay=WEIGHT_DECAY, adam_beta1=BETAS[0], adam_beta2=BETAS[1], adam_epsilon=EPS,
        lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=MAX_GRAD_NORM, num_train_epochs=spec["epochs"],
        max_length=spec["max_length"], precompute_ref_log_probs=True, precompute_ref_batch_size=spec["micro"],
        gradient_checkpointing=False, bf16=spec["precision"] == "bf16", fp16=False, disable_dropout=True,
        save_strategy="no", eval_strategy="no", report_to=[], logging_steps=10**6, seed=SEED,
        use_cpu=spec["device"] == "cpu", dataloader_num_workers=0,
        disable_tqdm=True)
    trainer = PretokenizedDPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(pairs),
                                     processing_class=tokenizer)
    digest = token_digest(list(trainer.train_dataset))
    trainer.train()
    if spec["save_model"]:
        trainer.save_model(spec["model_dir"])
    return digest


def train_rmkit(spec: dict, clock: harness.PhaseClock) -> str:
    """`rmkit dpo` (its recipe, `rmkit.recipes.dpo.train`); returns the digest of the pairs it trained on."""
    from rmkit.config import load_config
    from rmkit.recipes import dpo
    from rmkit.recipes.configs import DPOTree

    load_pairs, trained = dpo.load_policy_pairs, []

    def load_recorded_pairs(*args):
        pairs = load_pairs(*args)
        trained.extend({k: getattr(p, k) for k in ID_KEYS} for p in pairs)
        return pairs

    clock.watch_loaded(dpo, before_training="reference")
    dpo.load_policy_pairs = load_recorded_pairs
    dpo.weights_digest = clock.timed(dpo.weights_digest, "weights_hash")
    overrides = [
        f"policy.model_name={spec['policy_dir']}", f"data.train_data_path={spec['pairs_jsonl']}",
        "data.val_data_paths={}", "data.batching=random", f"checkpointing.checkpoint_dir={spec['out_dir']}",
        "checkpointing.enabled=false", f"policy.train_global_batch_size={spec['batch']}",
        f"policy.train_micro_batch_size={spec['micro']}", f"policy.max_total_sequence_length={spec['max_length']}",
        f"policy.precision={PRECISIONS[spec['precision']]}", f"policy.optimizer.lr={spec['lr']}", f"policy.optimizer.weight_decay={WEIGHT_DECAY}",
        f"policy.optimizer.betas=[{BETAS[0]},{BETAS[1]}]", f"policy.optimizer.eps={EPS}",
        "policy.scheduler.name=constant", "policy.scheduler.warmup_steps=0", f"policy.max_grad_norm={MAX_GRAD_NORM}",
        "policy.gradient_checkpointing=false", "policy.disable_dropout=true", f"policy.num_threads={spec['threads']}",
        f"dpo.reference_policy_kl_penalty={spec['beta']}", f"dpo.max_num_epochs={spec['epochs']}", "dpo.max_num_steps=null",
        f"dpo.seed={SEED}", "dpo.val_at_start=false", "dpo.val_period=0", "dpo.num_sample_generations=0",
        "logger.progress_bar=false", "logger.tensorboard=false", "logger.plots=false"]
    dpo.train(load_config(None, overrides, tree_type=DPOTree))
    return token_digest(trained)


def worker(spec: dict) -> dict:
    """One training run in this (fresh) process; returns its measurements."""
    torch.manual_seed(SEED)
    clock = harness.PhaseClock()
    digest = {"trl": train_trl, "rmkit": train_rmkit}[spec["side"]](spec, clock)
    seconds = clock.close()
    if "training" not in seconds:
        raise SystemExit("the run made no training forward")
    reference, training = seconds.get("reference", 0.0), seconds["training"]
    result = {"total_s": reference + training, "reference_s": reference, "training_s": training,
              "weights_hash_s": seconds.get("weights_hash", 0.0), "reference_forwards": clock.forwards.get("reference", 0),
              "training_forwards": clock.forwards["training"], "optimizer_steps": len(clock.step_ends), **clock.memory,
              "token_digest": digest}
    if spec["warmup_steps"]:
        result["steady_training_s"] = clock.span(after_step=spec["warmup_steps"])
    return result


# ---------------------------------------------------------------- orchestration


def tokenized_pairs(source: Path, destination: Path, tokenizer, max_length: int, count: int) -> list[dict]:
    """The first `count` records of `source`, copied to `destination` and tokenized from there as rmkit's DPO
    recipe tokenizes them (rmkit trains from `destination` itself)."""
    from rmkit.data import load_preference_data
    from rmkit.data.policy_tokenize import tokenize_policy_pairs

    lines = [line for line in source.read_text(encoding="utf-8").splitlines() if line.strip()][:count]
    if len(lines) < count:
        raise SystemExit(f"{source} has {len(lines)} records, {count} asked for: lower --pairs / --eval-pairs")
    destination.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    tokenized = tokenize_policy_pairs(load_preference_data(destination).records, tokenizer, max_length)
    pairs = [{k: getattr(p, k) for k in ID_KEYS} for p in tokenized.pairs]
    if len(pairs) != count:
        raise SystemExit(f"{source}: {count - len(pairs)} of the first {count} records were not usable as pairs")
    return pairs


def prepare(args: argparse.Namespace) -> dict:
    """The policy directory, and the training and held-out pairs tokenized once (JSONL lines for rmkit, ids
    for TRL and for the held-out rewards)."""
    from rmkit.models.reward import load_tokenizer

    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    policy_dir = common.export_policy_dir(args.policy, work / "policy")
    tokenizer = load_tokenizer(policy_dir)
    train = tokenized_pairs(common.data_file(args.data_dir, "hh_harmless_train.jsonl"), work / "train.jsonl",
                            tokenizer, args.max_length, args.pairs)
    (work / "train_ids.json").write_text(json.dumps(train))
    held_out = (tokenized_pairs(common.data_file(args.data_dir, "hh_harmless_val.jsonl"), work / "held_out.jsonl",
                                tokenizer, args.max_length, args.eval_pairs) if args.eval_pairs else [])
    rows = sum(2 * len(p["prompt_ids"]) + len(p["chosen_ids"]) + len(p["rejected_ids"]) for p in train)
    return {"policy_dir": str(policy_dir), "pairs_jsonl": str(work / "train.jsonl"),
            "pairs_ids": str(work / "train_ids.json"), "token_digest": token_digest(train), "held_out": held_out,
            "unshared_row_tokens": rows}


def run(args: argparse.Namespace, data: dict, side: str, repeat: int) -> dict:
    """One run of `side` in a fresh subprocess (its directory emptied first, so no cache is reused)."""
    name = f"{side}-{repeat}"
    run_dir = args.work_dir / name
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    model_dir = run_dir / "out" / "final"  # rmkit exports here; TRL saves here too
    spec = {"side": side, "policy_dir": data["policy_dir"], "pairs_jsonl": data["pairs_jsonl"],
            "pairs_ids": data["pairs_ids"], "max_length": args.max_length, "lr": args.lr, "beta": args.beta,
            "batch": args.batch, "micro": args.micro, "threads": args.threads, "out_dir": str(run_dir / "out"),
            "device": args.device, "precision": args.precision, "epochs": args.warmup_epochs + 1,
            "warmup_steps": args.warmup_epochs * (args.pairs // args.batch),
            "model_dir": str(model_dir), "save_model": repeat == 0}
    result = harness.launch(__file__, spec, run_dir, args.device, name)
    if repeat:  # only each side's first run is scored; rmkit exports every run
        shutil.rmtree(run_dir / "out", ignore_errors=True)
    result.update(run=name, side=side, repeat=repeat,
                  pairs_per_s=spec["epochs"] * args.pairs / result["total_s"],
                  model_dir=str(model_dir) if repeat == 0 else None)
    if "steady_training_s" in result:
        result["steady_training_pairs_per_s"] = args.pairs / result["steady_training_s"]
    print(f"{name:>8}: {result['pairs_per_s']:.3f} pairs/s (reference {result['reference_s']:.1f} s, training "
          f"{result['training_s']:.1f} s), peak RSS {result['peak_rss_mib']:.0f} MiB", flush=True)
    return result


@torch.no_grad()
def response_logprob_sums(model_dir: str, pairs: list[dict], device: str = "cpu") -> torch.Tensor:
    """`[P, 2]`: each pair's summed log-probs of its chosen and rejected response tokens given the prompt, by the
    causal LM in `model_dir` (float32). Independent of rmkit's shared-prefix rows: the prompt runs alone once
    with transformers' KV cache, which `rmkit.generation.run_with_copied_cache` copies to two rows; the two
    responses continue from it as a batch of two, right-padded (a causal model's real tokens never see the
    padding after them)."""
    from transformers import AutoModelForCausalLM

    from rmkit.generation import run_with_copied_cache
    from rmkit.models.reward import transformers_progress_bars_off

    with transformers_progress_bars_off():
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    sums = torch.zeros(len(pairs), 2)
    for i, pair in enumerate(pairs):
        if not pair["prompt_ids"]:
            raise SystemExit(f"pair {i} has an empty prompt: the held-out scoring needs one to condition on")
        prompt, resume = run_with_copied_cache(model, torch.tensor([0, 0], device=device),  # one copy per response
                                               input_ids=torch.tensor([pair["prompt_ids"]], device=device))
        responses = (pair["chosen_ids"], pair["rejected_ids"])
        width = max(len(r) for r in responses)
        ids = torch.tensor([list(r) + [0] * (width - len(r)) for r in responses], device=device)
        logits = torch.cat([prompt.logits[:, -1:].expand(2, 1, -1), model(input_ids=ids, **resume).logits],
                           dim=1)  # [2, width + 1, V]: position t predicts response token t
        logprobs = torch.log_softmax(logits[:, :width].float(), dim=-1).gather(-1, ids[..., None]).squeeze(-1)
        for j, response in enumerate(responses):
            sums[i, j] = logprobs[j, :len(response)].sum()
    return sums


def implicit_reward_accuracy(logprobs: torch.Tensor, reference: torch.Tensor, beta: float) -> dict:
    """Accuracy (chosen reward > rejected, a tie wrong) and mean margin of the implicit rewards
    beta * (log pi - log pi_ref), from `[P, 2]` summed log-probs of the policy and the reference."""
    rewards = beta * (logprobs - reference)
    correct = rewards[:, 0] > rewards[:, 1]
    return {"accuracy": correct.float().mean().item(), "margin_mean": (rewards[:, 0] - rewards[:, 1]).mean().item(),
            "correct": correct.tolist()}


def held_out_accuracies(data: dict, runs: list[dict], beta: float, device: str = "cpu") -> dict:
    """`implicit_reward_accuracy` on the held-out pairs for each side's saved model (its first run), against the
    starting weights, and `agreement`: the fraction of pairs both sides call the same way."""
    reference = response_logprob_sums(data["policy_dir"], data["held_out"], device)
    held = {}
    for r in runs:
        if r["model_dir"]:
            held[r["side"]] = implicit_reward_accuracy(response_logprob_sums(r["model_dir"], data["held_out"], device),
                                                       reference, beta)
            print(f"held-out accuracy {r['side']}: {held[r['side']]['accuracy']:.3f}", flush=True)
    if set(held) == set(SIDES):
        agree = [a == b for a, b in zip(held["trl"]["correct"], held["rmkit"]["correct"])]
        held["agreement"] = sum(agree) / len(agree)
    return held


def summarize(runs: list[dict]) -> dict:
    """Per side, the median over repeats of each measure."""
    keys = ("pairs_per_s", "total_s", "reference_s", "training_s", "weights_hash_s", "peak_rss_mib", "wall_s")
    keys += tuple(k for k in ("steady_training_pairs_per_s", "steady_training_s", "peak_gpu_mib")
                  if all(k in r for r in runs))
    return {side: {k: common.median([r[k] for r in runs if r["side"] == side]) for k in keys}
            for side in SIDES if any(r["side"] == side for r in runs)}


def markdown_table(payload: dict) -> str:
    head = ["run", "pairs/s", "total (s)", "reference (s)", "training (s)", "weights hash (s)", "peak RSS (MiB)",
            "held-out accuracy"]
    held, rows = payload["held_out"], []
    for r in payload["runs"]:
        accuracy = f"{held[r['side']]['accuracy']:.3f}" if r["repeat"] == 0 and r["side"] in held else ""
        rows.append([r["run"], f"{r['pairs_per_s']:.3f}", f"{r['total_s']:.1f}", f"{r['reference_s']:.1f}",
                     f"{r['training_s']:.1f}", f"{r['weights_hash_s']:.1f}", f"{r['peak_rss_mib']:.0f}", accuracy])
    for side, m in payload["median"].items():
        rows.append([f"**{side} median**", f"**{m['pairs_per_s']:.3f}**", f"{m['total_s']:.1f}", f"{m['reference_s']:.1f}",
                     f"{m['training_s']:.1f}", f"{m['weights_hash_s']:.1f}", f"{m['peak_rss_mib']:.0f}"])
    if "speedup_pairs_per_s" in payload:
        rows.append(["**rmkit / TRL pairs/s**", f"**{payload['speedup_pairs_per_s']:.2f}x**"])
    return harness.markdown(head, rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if harness.subcommand(argv, "dpo_vs_trl.py", worker, markdown_table):
        return 0
    args = parse_args(argv)
    info = common.machine_info()
    data = prepare(args)
    runs = []
    for repeat in range(args.repeats):
        for side in SIDES if repeat % 2 == 0 else SIDES[::-1]:
            runs.append(run(args, data, side, repeat))
    held = held_out_accuracies(data, runs, args.beta, args.device) if data["held_out"] else {}
    tokens_identical = all(r["token_digest"] == data["token_digest"] for r in runs)
    payload = {
        "command": "python benchmarks/dpo_vs_trl.py " + " ".join(argv),
        "machine": {**info, "load_average_end": os.getloadavg()},
        "settings": {"policy": str(args.policy), "pairs": args.pairs, "eval_pairs": len(data["held_out"]),
                     "max_length": args.max_length, "lr": args.lr, "beta": args.beta, "global_batch": args.batch,
                     "micro_batch": args.micro, "threads": args.threads, "repeats": args.repeats, "seed": SEED,
                     "weight_decay": WEIGHT_DECAY, "max_grad_norm": MAX_GRAD_NORM, "betas": list(BETAS), "eps": EPS,
                     "schedule": "constant", "precision": PRECISIONS[args.precision], "device": args.device,
                     **({"warmup_epochs": args.warmup_epochs} if args.warmup_epochs else {})},
        "data": {"pairs": args.pairs, "unshared_row_tokens": data["unshared_row_tokens"],
                 "token_digest": data["token_digest"]},
        "checks": {"tokens_identical": tokens_identical,
                   "optimizer_steps_equal": all(r["optimizer_steps"] == (args.warmup_epochs + 1) * args.pairs // args.batch
                                                for r in runs),
                   "reference_pass_ran": all(r["reference_forwards"] > 0 for r in runs)},
        "runs": runs,
        "median": summarize(runs),
        "held_out": held,
    }
    if set(payload["median"]) == set(SIDES):
        payload["speedup_pairs_per_s"] = payload["median"]["rmkit"]["pairs_per_s"] / payload["median"]["trl"]["pairs_per_s"]
    common.write_json(args.output, payload)
    print(markdown_table(payload))
    failed = [name for name, ok in payload["checks"].items() if not ok]
    if failed:
        print(f"checks failed: {', '.join(failed)} (see {args.output})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
