"""Which beta, learning rate and number of epochs should `rmkit dpo` default to? Variants of configs/dpo.yaml
trained on part of hh_harmless_train, compared on a dev split carved from the same file; the choice is then
reported once on hh_harmless_val, with the score the HH reward model gives the policy's greedy answers before
and after.

The dev split is quality_vs_trl.py's (`--dev-pairs` lines drawn with `--split-seed`: the reward-model study's
split). Every variant trains over the same `--train-pairs` pairs drawn from the rest (one epoch unless it sets
`dpo.max_num_epochs`), through the real `rmkit dpo` CLI in a subprocess, all sharing one cached reference
pass. A variant is `LABEL` (the config as it is) or `LABEL:KEY=VALUE[+KEY=VALUE...]` (dotted config
overrides).

Scoring is independent of the recipe: each response's summed log-prob given its prompt by the exported model,
through transformers' own KV cache (`dpo_vs_trl.response_logprob_sums`), against the same sums of the starting
weights: the implicit reward beta * (log pi - log pi_ref) of chosen against rejected, per pair. Variants are
compared pair by pair with a standard error. The rule, fixed before any run: the variant with the highest dev
accuracy is chosen; a tie keeps the first listed. Only the chosen one is scored on hh_harmless_val (`--final`).

    python benchmarks/dpo_quality.py --reward-model /tmp/demo/rm/final --final
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common, dpo_vs_trl, quality_vs_trl  # noqa: E402

DEFAULT_VARIANTS = ("default,beta_0.1:dpo.reference_policy_kl_penalty=0.1,"
                    "trl_defaults:dpo.reference_policy_kl_penalty=0.1+policy.optimizer.lr=1e-6")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--config", type=Path, default=common.REPO_ROOT / "configs" / "dpo.yaml")
    parser.add_argument("--train-pairs", type=int, default=384, help="pairs each variant trains on")
    parser.add_argument("--dev-pairs", type=int, default=300)
    parser.add_argument("--split-seed", type=int, default=20261123)
    parser.add_argument("--warmup-steps", type=int, default=3, help="policy.scheduler.warmup_steps for every variant")
    parser.add_argument("--policy", default="smollm2")
    parser.add_argument("--reward-model", type=Path, help="the HH reward model (configs/rm.yaml's export) for --final")
    parser.add_argument("--prompts", type=int, default=64, help="held-out prompts answered greedily for the reward model")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--final", action="store_true", help="score the chosen variant on hh_harmless_val.jsonl (once)")
    parser.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA_DIR)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/rmkit-dpo-quality"))
    parser.add_argument("--output", type=Path, default=common.REPO_ROOT / "benchmarks" / "results" / "dpo_quality.json")
    args = parser.parse_args(argv)
    args.variants = [quality_vs_trl.parse_variant(v) if ":" in v else (v, "rmkit", []) for v in args.variants.split(",") if v]
    if args.final and args.reward_model is None:
        parser.error("--final needs --reward-model (the directory configs/rm.yaml exports to <checkpoint_dir>/final)")
    return args


def study_config(args: argparse.Namespace, train_path: Path, policy_dir: Path, run_dir: Path) -> Path:
    """configs/dpo.yaml pointed at the study's data and policy: one epoch (a variant's overrides come after it),
    no validation or samples (scored outside), the study's warmup, quiet logging."""
    cfg = yaml.safe_load(args.config.read_text(encoding="utf-8"))
    cfg["dpo"].update(max_num_epochs=1, max_num_steps=None, val_period=0, val_at_start=False, val_at_end=False,
                      num_sample_generations=0)
    cfg["policy"].update(model_name=str(policy_dir), num_threads=args.threads)
    cfg["policy"]["scheduler"]["warmup_steps"] = args.warmup_steps
    cfg["data"].update(train_data_path=str(train_path), val_data_paths={})
    cfg["checkpointing"].update(checkpoint_dir=str(run_dir), save_period=0)
    cfg["logger"].update(progress_bar=False, tensorboard=False, plots=False)
    path = run_dir / "study.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


def train_variant(args, variant: tuple[str, str, list[str]], train_path: Path, policy_dir: Path) -> dict:
    """One `rmkit dpo` run of the variant; the reference cache is one directory shared by every run."""
    label, _, overrides = variant
    run_dir = args.work_dir / "runs" / label
    final = run_dir / "final"
    if (run_dir / "result.json").exists():  # finished by an earlier invocation with the same work dir
        return json.loads((run_dir / "result.json").read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    shared = args.work_dir / "reference_logprobs"
    shared.mkdir(parents=True, exist_ok=True)
    if not (run_dir / "reference_logprobs").exists():
        (run_dir / "reference_logprobs").symlink_to(shared)
    config = study_config(args, train_path, policy_dir, run_dir)
    env = {**os.environ, "PYTHONPATH": str(common.REPO_ROOT), "OMP_NUM_THREADS": str(args.threads),
           "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    with open(run_dir / "log.txt", "w") as log:
        proc = subprocess.run([sys.executable, "-m", "rmkit", "dpo", "--config", str(config), *overrides],
                              env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise SystemExit(f"{label} failed (log: {run_dir / 'log.txt'}):\n{(run_dir / 'log.txt').read_text()[-3000:]}")
    metrics = [json.loads(line) for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines() if line]
    train = [m for m in metrics if "train/loss" in m]
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    result = {"variant": label, "overrides": overrides, "wall_s": time.perf_counter() - start,
              "steps": train[-1]["step"], "final_train_loss": train[-1]["train/loss"],
              "beta": resolved["dpo"]["reference_policy_kl_penalty"], "lr": resolved["policy"]["optimizer"]["lr"],
              "model_dir": str(final)}
    (run_dir / "result.json").write_text(json.dumps(result))
    return result


def reference_sums(args, name: str, model_dir: Path, pairs: list[dict]) -> torch.Tensor:
    """`response_logprob_sums`, kept in the work dir: the starting weights' sums are scored once per file."""
    path = args.work_dir / f"sums-{name}.pt"
    if not path.exists():
        torch.save(dpo_vs_trl.response_logprob_sums(str(model_dir), pairs), path)
    return torch.load(path)


def paired_difference(a: list[bool], b: list[bool]) -> dict:
    """Mean of `a - b` over pairs (accuracy points) and its standard error."""
    diff = [float(x) - float(y) for x, y in zip(a, b)]
    return {"mean_difference": statistics.fmean(diff), "standard_error": statistics.stdev(diff) / len(diff) ** 0.5}


def greedy_answer_rewards(args, model_dir: Path, prompts: list, reward_model) -> dict:
    """The policy's greedy answers to `prompts` and the reward model's score of each conversation."""
    from rmkit.config import SamplingParams
    from rmkit.data.tokenize import render_prompt
    from rmkit.generation import generate_completions
    from rmkit.models.policy import load_policy_model

    model, tokenizer = load_policy_model(str(model_dir))
    ids = [render_prompt(tokenizer, p.prompt) for p in prompts]
    texts = []
    for start in range(0, len(ids), 8):
        texts += generate_completions(model, tokenizer, ids[start:start + 8],
                                      SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0)).text
    conversations = [messages_of(p.prompt) + [{"role": "assistant", "content": t}] for p, t in zip(prompts, texts)]
    rewards = reward_model.score(conversations)
    return {"rewards": rewards.tolist(), "answers": texts}


def messages_of(prompt) -> list[dict]:
    from rmkit.data.tokenize import as_messages

    return [dict(m) for m in as_messages(prompt, "user")]


def final_report(args, chosen: dict, policy_dir: Path, tokenizer) -> dict:
    """The chosen variant on hh_harmless_val: implicit-reward accuracy, and the reward model's scores of the
    greedy answers of the starting policy and the chosen one on the first `--prompts` prompts."""
    from rmkit.data.prompts import load_prompts
    from rmkit.env import RewardModelEnvironment

    val_file = common.data_file(args.data_dir, "hh_harmless_val.jsonl")
    count = sum(1 for line in val_file.read_text(encoding="utf-8").splitlines() if line.strip())
    pairs = dpo_vs_trl.tokenized_pairs(val_file, args.work_dir / "val.jsonl", tokenizer, max_length(args), count)
    ref = reference_sums(args, "val-reference", policy_dir, pairs)
    scored = dpo_vs_trl.implicit_reward_accuracy(dpo_vs_trl.response_logprob_sums(chosen["model_dir"], pairs), ref,
                                                 chosen["beta"])
    prompts = load_prompts(val_file).records[:args.prompts]
    reward_model = RewardModelEnvironment({"model_name": str(args.reward_model)})
    before = greedy_answer_rewards(args, policy_dir, prompts, reward_model)
    after = greedy_answer_rewards(args, Path(chosen["model_dir"]), prompts, reward_model)
    diff = [a - b for a, b in zip(after["rewards"], before["rewards"])]
    base_std = statistics.stdev(before["rewards"])
    return {"variant": chosen["variant"], "pairs": len(pairs), "accuracy": scored["accuracy"],
            "margin_mean": scored["margin_mean"], "reward_model": str(args.reward_model), "prompts": len(prompts),
            "reward_before": statistics.fmean(before["rewards"]), "reward_after": statistics.fmean(after["rewards"]),
            "reward_before_std": base_std, "reward_difference": statistics.fmean(diff),
            "reward_difference_se": statistics.stdev(diff) / len(diff) ** 0.5,
            "reward_difference_in_before_std": statistics.fmean(diff) / base_std,
            "samples": [{"prompt": messages_of(p.prompt)[-1]["content"][:300], "before": b, "after": a}
                        for p, b, a in list(zip(prompts, before["answers"], after["answers"]))[:8]]}


def max_length(args) -> int:
    return yaml.safe_load(args.config.read_text(encoding="utf-8"))["policy"]["max_total_sequence_length"]


def main(argv: list[str] | None = None) -> int:
    from rmkit.models.reward import load_tokenizer

    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    rest, eval_dir = quality_vs_trl.carve_split(argparse.Namespace(
        data_dir=args.data_dir, split_seed=args.split_seed, dev_pairs=args.dev_pairs, work_dir=args.work_dir, final=False))
    lines = rest.read_text(encoding="utf-8").splitlines(keepends=True)
    random.Random(args.split_seed).shuffle(lines)
    if len(lines) < args.train_pairs:
        raise SystemExit(f"--train-pairs {args.train_pairs}: only {len(lines)} pairs are left after the dev split")
    train_path = args.work_dir / "train.jsonl"
    train_path.write_text("".join(lines[:args.train_pairs]), encoding="utf-8")
    policy_dir = common.export_policy_dir(args.policy, args.work_dir / "policy")
    tokenizer = load_tokenizer(policy_dir)
    dev = dpo_vs_trl.tokenized_pairs(eval_dir / "dev.jsonl", args.work_dir / "dev.jsonl", tokenizer, max_length(args),
                                     args.dev_pairs)
    dev_ref = reference_sums(args, "dev-reference", policy_dir, dev)

    runs = []
    for variant in args.variants:
        run = train_variant(args, variant, train_path, policy_dir)
        if "dev_accuracy" not in run:
            scored = dpo_vs_trl.implicit_reward_accuracy(dpo_vs_trl.response_logprob_sums(run["model_dir"], dev),
                                                         dev_ref, run["beta"])
            run.update(dev_accuracy=scored["accuracy"], dev_margin_mean=scored["margin_mean"],
                       dev_correct=scored["correct"])
            (args.work_dir / "runs" / run["variant"] / "result.json").write_text(json.dumps(run))
        print(f"{run['variant']}: dev accuracy {run['dev_accuracy']:.3f}, margin {run['dev_margin_mean']:+.3f} "
              f"(trained in {run['wall_s']:.0f} s)", flush=True)
        runs.append(run)
    best = max(r["dev_accuracy"] for r in runs)
    chosen = next(r for r in runs if r["dev_accuracy"] == best)
    for run in runs:
        run["vs_first"] = paired_difference(run["dev_correct"], runs[0]["dev_correct"])
    payload = {"command": "python benchmarks/dpo_quality.py " + " ".join(argv), "machine": common.machine_info(),
               "split": {"seed": args.split_seed, "dev_pairs": args.dev_pairs, "train_pairs": args.train_pairs,
                         "from": "hh_harmless_train.jsonl"},
               "warmup_steps": args.warmup_steps, "runs": runs, "chosen": chosen["variant"]}
    if args.final:
        payload["final"] = final_report(args, chosen, policy_dir, tokenizer)
        f = payload["final"]
        print(f"hh_harmless_val ({chosen['variant']}): accuracy {f['accuracy']:.3f}; reward of greedy answers "
              f"{f['reward_before']:+.3f} -> {f['reward_after']:+.3f} ({f['reward_difference_in_before_std']:+.2f} "
              f"step-0 std, SE {f['reward_difference_se']:.3f})", flush=True)
    common.write_json(args.output, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
