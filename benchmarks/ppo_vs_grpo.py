"""PPO or GRPO here? `rmkit ppo` and `rmkit grpo` from the same start, compared per generated token and per second.

Both runs start from the same policy and reward model, read the same prompts in the same order (the same seed),
sample the same number of completions per step (`--prompts` x `--generations`) with the same sampling, the same
policy lr and KL coefficient, and validate on the same held-out prompts (one sampled completion each, from the
same per-validation seed) every `--val-period` steps. PPO adds a critic (by default started from the reward
model when it can be) and `--ppo-epochs` passes over each rollout; GRPO takes one optimizer step per rollout.
Samples cost the same in both, so the curves are drawn against the completion tokens generated so far; time
is each run's own step time (`timing/train/total_step_time`, validation excluded).

The JSON (`--output`) holds, per recipe, every validation: the step, generated tokens and training seconds so
far, the held-out reward mean and std and mean completion length, the KL; the rise of the held-out reward
over step 0 in units of step 0's std; PPO's critic loss and explained variance at the first and last step;
and the figure's path. Each run is a fresh `python -m rmkit` process, one after the other.

    python benchmarks/ppo_vs_grpo.py --reward-model results/rm_smollm2/final --steps 12
    python benchmarks/ppo_vs_grpo.py ... --recipes grpo --merge PPO_RUN.json   # rerun one side, keep the other
    python benchmarks/ppo_vs_grpo.py ... --recipes '' --merge PPO_RUN.json --merge GRPO_RUN.json   # join two runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reward-model", required=True, help="an rmkit reward model directory (`rmkit train`'s final/)")
    parser.add_argument("--policy", default="smollm2", help="a causal LM directory (GGUF too) or smollm2")
    parser.add_argument("--train-data", default=str(DATA / "hh_harmless_train.jsonl"))
    parser.add_argument("--val-data", default=str(DATA / "hh_harmless_val.jsonl"))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--generations", type=int, default=4, help="completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--val-period", type=int, default=4)
    parser.add_argument("--val-samples", type=int, default=16, help="held-out prompts per validation")
    parser.add_argument("--lr", type=float, default=1e-6, help="the policy's lr (both recipes)")
    parser.add_argument("--critic-lr", type=float, default=5e-6)
    parser.add_argument("--kl", type=float, default=0.01, help="loss_fn.reference_policy_kl_penalty (both)")
    parser.add_argument("--ppo-epochs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--recipes", default="ppo,grpo")
    parser.add_argument("--extra", action="append", default=[], metavar="RECIPE:key=value",
                        help="one more override for one recipe, e.g. ppo:ppo.kl_target=0.05 (repeatable)")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/rmkit-ppo-vs-grpo"))
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "ppo_vs_grpo.json")
    parser.add_argument("--merge", type=Path, action="append", default=[], metavar="RESULTS.json",
                        help="take the recipes this run leaves out of --recipes (which may be empty) from an earlier "
                             "results file whose shared settings are the same, checked key by key (repeatable)")
    return parser.parse_args(argv)


SHARED_SETTINGS = ("reward_model", "policy", "train_data", "val_data", "steps", "prompts", "generations",
                   "max_new_tokens", "val_period", "val_samples", "lr", "kl", "threads")


def earlier_results(args: argparse.Namespace) -> dict:
    """The recipes of the `--merge` files that this run does not run, after checking that the settings both
    recipes share are this run's (each recipe's own command, with its own keys, stays in its result)."""
    ran, taken = set(recipes(args)), {}
    for path in args.merge:
        try:
            earlier = json.loads(path.read_text(encoding="utf-8"))
            settings, results = earlier["settings"], earlier["results"]
        except (OSError, ValueError, KeyError) as err:
            raise SystemExit(f"--merge {path}: not a ppo_vs_grpo.py results file ({err})") from None
        for key in SHARED_SETTINGS:
            if settings.get(key) != str(getattr(args, key)):
                raise SystemExit(f"--merge {path}: its {key} is {settings.get(key)!r}, this run's "
                                 f"{str(getattr(args, key))!r}; the curves would not be comparable")
        for recipe, result in results.items():
            if recipe in ran:
                continue
            if recipe in taken:
                raise SystemExit(f"--merge {path}: {recipe} is taken from {taken[recipe]['merged_from']} already")
            taken[recipe] = {**result, "merged_from": str(path)}
    return taken


def recipes(args: argparse.Namespace) -> list[str]:
    """The recipes this run trains (`--recipes`, comma separated; empty with `--merge` only)."""
    return [recipe for recipe in args.recipes.split(",") if recipe]


def overrides(args: argparse.Namespace, recipe: str, out: Path) -> list[str]:
    """The shared settings, under the recipe's loop section, and the recipe's own."""
    loop = recipe
    shared = [
        f"policy.model_name={args.policy}", f"env.reward_model.model_name={args.reward_model}",
        f"data.train_data_path={args.train_data}", f"data.val_data_paths={{hh: {args.val_data}}}",
        f"checkpointing.checkpoint_dir={out}", "checkpointing.save_period=0", f"{loop}.max_num_steps={args.steps}",
        f"{loop}.num_prompts_per_step={args.prompts}", f"{loop}.num_generations_per_prompt={args.generations}",
        f"{loop}.val_period={args.val_period}", f"{loop}.max_val_samples={args.val_samples}", f"{loop}.log_period=1",
        f"policy.generation.max_new_tokens={args.max_new_tokens}", f"policy.optimizer.lr={args.lr}",
        f"loss_fn.reference_policy_kl_penalty={args.kl}", f"policy.num_threads={args.threads}",
        f"policy.train_global_batch_size={args.prompts * args.generations}", "policy.train_micro_batch_size=4",
        "policy.generation_batch_size=16", "policy.max_total_sequence_length=512", "logger.progress_bar=false",
        "logger.tensorboard=false",
    ]
    own = {"ppo": [f"ppo.ppo_epochs={args.ppo_epochs}", f"value.optimizer.lr={args.critic_lr}"], "grpo": []}[recipe]
    extra = [e.split(":", 1)[1] for e in args.extra if e.startswith(f"{recipe}:")]
    return shared + own + extra


def run_recipe(args: argparse.Namespace, recipe: str) -> dict:
    out = args.work_dir / recipe
    config = REPO / "configs" / f"{recipe}_rm.yaml"
    command = [sys.executable, "-m", "rmkit", recipe, "--config", str(config), *overrides(args, recipe, out)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(args.threads)}
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    (args.work_dir / f"{recipe}.log").write_text(done.stderr, encoding="utf-8")
    if done.returncode != 0:
        raise SystemExit(f"rmkit {recipe} failed (exit {done.returncode}); see {args.work_dir / f'{recipe}.log'}:\n"
                         + done.stderr[-2000:])
    return {"command": " ".join(command[1:]), "wall_s": wall, **curves(out / "logs" / "metrics.jsonl", args)}


def curves(metrics_path: Path, args: argparse.Namespace) -> dict:
    """Validations against the generated tokens and training seconds before them; the rise; the critic."""
    records = [json.loads(line) for line in metrics_path.read_text(encoding="utf-8").splitlines()]
    completions = args.prompts * args.generations
    tokens, seconds, kl, by_step = 0.0, 0.0, 0.0, {}
    for record in records:
        if "train/reward" in record:
            tokens += record["train/mean_gen_tokens_per_sample"] * completions
            seconds += record["timing/train/total_step_time"]
            kl = record.get("train/kl_penalty", 0.0)
        if "validation/reward_mean" in record:
            by_step[record["step"]] = {
                "step": record["step"], "generated_tokens": tokens, "train_seconds": seconds, "kl": kl,
                "reward_mean": record["validation/reward_mean"], "reward_std": record["validation/reward_std"],
                "mean_completion_tokens": record["validation/mean_gen_tokens_per_sample"]}
    validations = [by_step[s] for s in sorted(by_step)]
    first, last = validations[0], validations[-1]
    train = [r for r in records if "train/reward" in r]
    result = {"validations": validations,
              "rise_in_step0_std": (last["reward_mean"] - first["reward_mean"]) / max(first["reward_std"], 1e-9),
              "length_ratio_to_step0": last["mean_completion_tokens"] / max(first["mean_completion_tokens"], 1e-9),
              "warnings": [r["warning"] for r in records if "warning" in r]}
    if "train/critic/loss" in train[0]:
        result["critic"] = {key: [train[0][f"train/critic/{key}"], train[-1][f"train/critic/{key}"]]
                            for key in ("loss", "explained_var")}
    return result


def plot(results: dict, path: Path, samples: int) -> Path | None:
    """Held-out reward (error bars: its standard error over the `samples` prompts) against generated tokens and
    against training seconds, one line per recipe."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for recipe, result in results.items():
        points = result["validations"]
        for axis, x in zip(axes, ("generated_tokens", "train_seconds")):
            axis.errorbar([p[x] for p in points], [p["reward_mean"] for p in points],
                          yerr=[p["reward_std"] / samples ** 0.5 for p in points], marker="o", label=recipe,
                          capsize=3)
    axes[0].set_xlabel("completion tokens generated")
    axes[1].set_xlabel("training seconds (validation excluded)")
    for axis in axes:
        axis.set_ylabel("held-out reward (mean)")
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    earlier = earlier_results(args)
    results = {**earlier, **{recipe: run_recipe(args, recipe) for recipe in recipes(args)}}
    figure = plot(results, args.output.with_suffix(".png"), args.val_samples)
    payload = {"command": "python benchmarks/ppo_vs_grpo.py " + " ".join(sys.argv[1:] if argv is None else argv),
               "machine": common.machine_info(), "settings": {k: str(v) for k, v in vars(args).items()},
               "results": results, "figure": str(figure) if figure else None}
    common.write_json(args.output, payload)
    for recipe, result in results.items():
        first, last = result["validations"][0], result["validations"][-1]
        print(f"{recipe}: held-out reward {first['reward_mean']:.3f} -> {last['reward_mean']:.3f} "
              f"({result['rise_in_step0_std']:+.2f} step-0 std) after {last['generated_tokens']:.0f} generated tokens "
              f"and {last['train_seconds']:.0f} s; completions {first['mean_completion_tokens']:.1f} -> "
              f"{last['mean_completion_tokens']:.1f} tokens; KL {last['kl']:.4f}")
    print(f"-> {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
