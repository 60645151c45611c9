"""GRPO twice, with TRL's `GRPOTrainer` and with `rmkit grpo`, on the same policy, reward model and prompts.

Matched on both sides: the policy (one HF directory, exported once from `--policy`, its generation EOS set to
the tokenizer's so both stop on the same token), the prompts (the first `--prompts x --steps` prompts of
hh_harmless_train.jsonl whose rendered length leaves room for the completion, as messages, so both render
them with the policy's chat template; one epoch), G completions per prompt, `--max-new-tokens`, temperature
(top-p 1, no top-k), one optimizer step per rollout of prompts x G completions in one micro-batch (so the
PPO ratio is 1 and old log-probs are not needed), AdamW (lr, betas (0.9, 0.999), eps 1e-8, weight decay
0.01), constant schedule, grad clip 1.0, beta x the k3 KL estimator to a frozen reference copy, group
advantages (r - group mean) / group std with the unbiased std and no leave-one-out baseline, token-level
loss normalization over the batch's tokens (TRL's `dapo`, NeMo RL's `token_level_loss`), dropout off, no
gradient checkpointing, fp32 on CPU, `--threads` torch threads.

The reward: both sides score prompt + completion as a conversation with the same code, rmkit's
`RewardModelEnvironment` (the inference core, reading it through the reward model's own chat template, or
its plain rendering when it has none): rmkit through `env.reward_model.model_name`, TRL through a reward
*callable* that calls the same environment (TRL's built-in sequence-classifier path needs a chat template on
the reward tokenizer and pads its own way).

Known differences: each side shuffles the prompts and draws its samples from its own RNG (different
rollouts); TRL divides by (std + 1e-4), rmkit by (std + 1e-6) (`rmkit.losses.advantages`); rmkit clamps the
KL input and output (NeMo RL's 20 / 10, rarely reached). With one optimizer step per rollout neither side runs
a pre-update log-prob pass (the ratio is 1).

Timed per optimizer step (one per rollout) by the harness clock (`benchmarks/harness.py`), in each side's fresh
subprocess, hooked the same way on both sides (wrapped methods of TRL's trainer, wrapped module attributes of
`rmkit.recipes.grpo`, a forward pre-hook on the policy's input embeddings, the optimizer-step hook):

- generation: the calls that sample the rollout (TRL `_generate`, rmkit `generate_rollout`: rendering and
  tokenizing the prompts, `generate`, decoding);
- reward_calculation: the calls that score it (TRL `_calculate_rewards`, rmkit `score_rollout`: the same
  environment on both sides);
- logprobs: the no-grad log-prob passes (TRL `_get_per_token_logps_and_entropies` called without grad, rmkit
  `batch_logprobs`: the reference's, and the old policy's where one is needed);
- training: from the first training forward (train mode, grad enabled) to the end of the optimizer step
  (forward, backward, clipping, the step);
- total: from the end of the previous optimizer step (the first step: from the start of its generation) to the
  end of this one: the phases and the rest (building the batch, advantages, metrics, logging).

Generated tokens/s = completion tokens (rmkit's logged `train/mean_gen_tokens_per_sample`, TRL's
`completions/mean_length`) / generation seconds; peak RSS (and GPU memory) of the subprocess at its last
optimizer step. Then the held-out reward: one greedy completion per held-out prompt (hh_harmless_val.jsonl)
from the initial and each final policy, by `rmkit.generation`, scored by the same environment, in this process.

`--device cuda` puts both policies (training, generation, the held-out completions) on the GPU and records each
run's peak GPU memory; the reward model stays where `rmkit grpo` puts it, on the CPU, for both sides.
`--precision bf16` is bf16 autocast over float32 weights on both sides (TRL `bf16=True`, rmkit
`policy.precision=bfloat16`). `--warmup-steps K` leaves the first K steps out of the means (first-call costs).

    python benchmarks/grpo_vs_trl.py --reward-model results/rm/final
    python benchmarks/grpo_vs_trl.py --prompts 4 --generations 4 --max-new-tokens 32 --steps 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import common, harness  # noqa: E402

SIDES = ("trl", "rmkit")
PARTS = ("generation", "reward_calculation", "logprobs", "training", "total")
PRECISIONS = {"fp32": "float32", "bf16": "bfloat16"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="smollm2", help="a causal LM directory (GGUF too) or smollm2")
    parser.add_argument("--reward-model", type=Path,
                        help="an rmkit reward model directory (default: MiniLM exported with a fresh seeded head)")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--generations", type=int, default=4, help="G completions per prompt")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=512, help="prompt + completion tokens")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--beta", type=float, default=0.01, help="KL coefficient (k3 estimator)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where both policies run")
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32", help="bf16: autocast, both sides")
    parser.add_argument("--warmup-steps", type=int, default=0, help="first steps left out of the means")
    parser.add_argument("--eval-prompts", type=int, default=16, help="held-out prompts (0: skip)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--sides", default="trl,rmkit", help="comma list of trl, rmkit (run in this order)")
    parser.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA_DIR)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/rmkit-bench-grpo"))
    parser.add_argument("--output", type=Path, default=common.REPO_ROOT / "benchmarks" / "results" / "grpo_vs_trl.json")
    args = parser.parse_args(argv)
    args.sides = [s for s in args.sides.split(",") if s]
    if not set(args.sides) <= set(SIDES):
        parser.error("--sides takes trl,rmkit")
    if not 0 <= args.warmup_steps < args.steps:
        parser.error("--warmup-steps must leave at least one of the --steps timed")
    return args


# ---------------------------------------------------------------- inside a training process


def reward_callable(model_dir: str):
    """A TRL reward function scoring with rmkit's environment, as `rmkit grpo` does (`score_rollout`)."""
    from rmkit.env import RewardModelEnvironment

    env = RewardModelEnvironment({"model_name": model_dir, "dtype": "float32", "max_batch_size": 32})

    def rmkit_reward(prompts, completions, **_) -> list[float]:
        logs = [p + [{"role": "assistant", "content": c[0]["content"]}] for p, c in zip(prompts, completions)]
        return env.step(logs, None).rewards.float().tolist()

    return rmkit_reward


def train_trl(spec: dict, clock: harness.PhaseClock) -> list[float]:
    """TRL's GRPOTrainer with the matched settings, its phases on `clock`; returns each step's completion tokens."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    rollout = spec["prompts"] * spec["generations"]
    prompts = [json.loads(line)["messages"] for line in Path(spec["prompts_file"]).read_text().splitlines()]
    config = GRPOConfig(
        output_dir=spec["out_dir"], per_device_train_batch_size=rollout, gradient_accumulation_steps=1,
        num_generations=spec["generations"], max_completion_length=spec["max_new_tokens"],
        temperature=spec["temperature"], top_p=1.0, top_k=0, beta=spec["beta"], epsilon=0.2, loss_type="dapo",
        scale_rewards="group", num_iterations=1, learning_rate=spec["lr"], lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
        max_steps=spec["steps"], num_train_epochs=1, disable_dropout=True, gradient_checkpointing=False,
        bf16=spec["precision"] == "bf16", use_cpu=spec["device"] == "cpu", seed=spec["seed"], logging_steps=1, report_to="none", save_strategy="no",
        disable_tqdm=True, log_completions=False)
    model = AutoModelForCausalLM.from_pretrained(spec["policy_dir"], dtype=torch.float32)  # master weights
    tokenizer = AutoTokenizer.from_pretrained(spec["policy_dir"])
    trainer = GRPOTrainer(model=model, reward_funcs=reward_callable(spec["reward_model"]), args=config,
                          train_dataset=Dataset.from_dict({"prompt": prompts}), processing_class=tokenizer)
    clock.watch(model)
    trainer._generate = clock.timed(trainer._generate, "generation")
    trainer._calculate_rewards = clock.timed(trainer._calculate_rewards, "reward_calculation")
    logprobs = trainer._get_per_token_logps_and_entropies
    timed_logprobs = clock.timed(logprobs, "logprobs")

    def old_or_reference_logprobs(*args, **kwargs):
        """Without grad: the old-policy or reference pass (a phase); with grad: the training forward."""
        return (logprobs if torch.is_grad_enabled() else timed_logprobs)(*args, **kwargs)

    trainer._get_per_token_logps_and_entropies = old_or_reference_logprobs
    trainer.train()
    trainer.save_model(spec["model_out"])
    tokenizer.save_pretrained(spec["model_out"])
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    return [length * rollout for length in lengths]


def rmkit_config(spec: dict) -> dict:
    """The `rmkit grpo` config matching TRL's run (no validation, no checkpoints, the final policy only)."""
    rollout = spec["prompts"] * spec["generations"]
    return {
        "grpo": {"num_prompts_per_step": spec["prompts"], "num_generations_per_prompt": spec["generations"],
                 "max_num_steps": spec["steps"], "max_num_epochs": 1, "normalize_rewards": True,
                 "use_leave_one_out_baseline": False, "val_period": 0, "val_at_start": False, "val_at_end": False,
                 "seed": spec["seed"], "log_period": 1},
        "loss_fn": {"reference_policy_kl_penalty": spec["beta"], "reference_policy_kl_type": "k3",
                    "ratio_clip_min": 0.2, "ratio_clip_max": 0.2, "token_level_loss": True},
        "policy": {"model_name": spec["policy_dir"], "train_global_batch_size": rollout,
                   "train_micro_batch_size": rollout, "generation_batch_size": rollout,
                   "max_total_sequence_length": spec["max_length"], "precision": PRECISIONS[spec["precision"]],
                   "generation": {"max_new_tokens": spec["max_new_tokens"], "temperature": spec["temperature"],
                                  "top_p": 1.0, "top_k": None},
                   "optimizer": {"lr": spec["lr"], "weight_decay": 0.01, "betas": [0.9, 0.999], "eps": 1e-8},
                   "scheduler": {"name": "constant", "warmup_steps": 0}, "max_grad_norm": 1.0,
                   "num_threads": spec["threads"]},
        "env": {"reward_model": {"model_name": spec["reward_model"], "precision": "float32", "batch_size": 32}},
        "data": {"train_data_path": spec["prompts_file"], "val_data_paths": {}},
        "checkpointing": {"enabled": False, "checkpoint_dir": spec["out_dir"]},
        "logger": {"tensorboard": False, "plots": False, "progress_bar": False},
    }


def train_rmkit(spec: dict, clock: harness.PhaseClock) -> list[float]:
    """`rmkit grpo` through its CLI entry point, its phases on `clock` (the recipe's module attributes wrapped);
    returns each step's completion tokens, from its metrics.jsonl."""
    import yaml

    from rmkit.cli import main as rmkit_main
    from rmkit.recipes import grpo

    clock.watch_loaded(grpo)
    clock.watch_rl_phases(grpo)
    out = Path(spec["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.yaml").write_text(yaml.safe_dump(rmkit_config(spec), sort_keys=False))
    status = rmkit_main(["grpo", "--config", str(out / "bench.yaml")])
    if status != 0:
        raise SystemExit(f"rmkit grpo exited with status {status}")
    Path(spec["model_out"]).parent.mkdir(parents=True, exist_ok=True)
    (out / "final").rename(spec["model_out"])
    records = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    rollout = spec["prompts"] * spec["generations"]
    return [r["train/mean_gen_tokens_per_sample"] * rollout for r in records if "train/reward" in r]


def worker(spec: dict) -> dict:
    """One training run in this (fresh) process; returns each optimizer step's seconds per phase and tokens."""
    clock = harness.PhaseClock()
    tokens = {"trl": train_trl, "rmkit": train_rmkit}[spec["side"]](spec, clock)
    clock.close()
    steps = [{**dict.fromkeys(PARTS, 0.0), **step} for step in clock.per_step()]
    if len(tokens) != len(steps):
        raise SystemExit(f"{len(steps)} optimizer steps timed, {len(tokens)} logged")
    return {"steps": [{**step, "generated_tokens": n} for step, n in zip(steps, tokens)], **clock.memory}


# ---------------------------------------------------------------- orchestration


def select_prompts(path: Path, tokenizer, count: int, budget: int) -> list[list[dict]]:
    """The first `count` prompts of `path` (as messages) whose rendered length is at most `budget` tokens."""
    from rmkit.data.prompts import load_prompts
    from rmkit.data.tokenize import as_messages, render_prompt

    chosen = []
    for prompt in load_prompts(path).records:
        if len(render_prompt(tokenizer, prompt.prompt)) <= budget:
            chosen.append(as_messages(prompt.prompt, "user"))
        if len(chosen) == count:
            return chosen
    raise SystemExit(f"{path}: only {len(chosen)} prompts fit in {budget} tokens, {count} needed")


def prompt_sets(args: argparse.Namespace, tokenizer, work: Path) -> tuple[list[list[dict]], Path, list[list[dict]]]:
    """`(train, prompts_file, held_out)`: `--prompts` x `--steps` training prompts from hh_harmless_train (also
    written to `work/prompts.jsonl` as `{"messages": ...}` records) and `--eval-prompts` held-out ones from
    hh_harmless_val, each fitting `--max-length` minus `--max-new-tokens` tokens (the PPO benchmark's too)."""
    budget = args.max_length - args.max_new_tokens
    train = select_prompts(common.data_file(args.data_dir, "hh_harmless_train.jsonl"), tokenizer,
                           args.prompts * args.steps, budget)
    prompts_file = work / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps({"messages": m}) + "\n" for m in train))
    held_out = (select_prompts(common.data_file(args.data_dir, "hh_harmless_val.jsonl"), tokenizer,
                               args.eval_prompts, budget) if args.eval_prompts else [])
    return train, prompts_file, held_out


def prepare(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    policy_dir = common.export_policy_dir(args.policy, work / "policy")
    reward_model = args.reward_model or common.export_reward_model(common.minilm_path(), work / "reward_model", args.seed)
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    _, prompts_file, held_out = prompt_sets(args, tokenizer, work)
    return {"policy_dir": str(policy_dir), "reward_model": str(Path(reward_model).resolve()),
            "prompts_file": str(prompts_file), "held_out": held_out}


def run_side(args, data: dict, side: str) -> dict:
    out_dir = args.work_dir / side
    if out_dir.exists():
        import shutil

        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    spec = {"side": side, "prompts": args.prompts, "generations": args.generations, "steps": args.steps,
            "max_new_tokens": args.max_new_tokens, "max_length": args.max_length, "lr": args.lr,
            "beta": args.beta, "temperature": args.temperature, "threads": args.threads, "seed": args.seed,
            "device": args.device, "precision": args.precision,
            "policy_dir": data["policy_dir"], "reward_model": data["reward_model"],
            "prompts_file": data["prompts_file"], "out_dir": str(out_dir / "run"),
            "model_out": str(out_dir / "model")}
    result = harness.launch(__file__, spec, out_dir, args.device, f"{side} run")
    if len(result["steps"]) != args.steps:
        raise SystemExit(f"{side}: {len(result['steps'])} steps timed, {args.steps} expected")
    result.update(side=side, model_dir=spec["model_out"],
                  **summarize_steps(result["steps"][args.warmup_steps:]))
    print(f"{side:>5}: {result['seconds_per_step']['total']:.2f} s/step ("
          + ", ".join(f"{p} {result['seconds_per_step'][p]:.2f}" for p in PARTS[:-1])
          + f"), {result['generated_tokens_per_s']:.1f} generated tokens/s, rss {result['peak_rss_mib']:.0f} MiB, "
          f"wall {result['wall_s']:.1f} s", flush=True)
    return result


def summarize_steps(steps: list[dict]) -> dict:
    """Mean seconds per step and per part over `steps`, and generated tokens / generation seconds."""
    mean = {p: sum(s[p] for s in steps) / len(steps) for p in PARTS}
    tokens = sum(s["generated_tokens"] for s in steps)
    return {"seconds_per_step": mean, "generated_tokens_per_s": tokens / sum(s["generation"] for s in steps),
            "generated_tokens": tokens}


@torch.no_grad()
def held_out_reward(policy_dir: str, reward_model: str, prompts: list[list[dict]], max_new_tokens: int,
                    device: str = "cpu") -> dict:
    """Mean reward of one greedy completion per prompt, generated by `rmkit.generation` and scored by the
    reward environment (the same code for every policy)."""
    from rmkit.config import SamplingParams
    from rmkit.data.tokenize import render_prompt
    from rmkit.env import RewardModelEnvironment
    from rmkit.generation import generate_completions
    from rmkit.models.policy import load_policy_model

    model, tokenizer = load_policy_model(policy_dir)
    model.to(device).eval()
    out = generate_completions(model, tokenizer, [render_prompt(tokenizer, p) for p in prompts],
                               SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0))
    env = RewardModelEnvironment({"model_name": reward_model, "dtype": "float32", "max_batch_size": 32})
    rewards = env.step([p + [{"role": "assistant", "content": t}] for p, t in zip(prompts, out.text)], None).rewards
    return {"mean": rewards.mean().item(), "std": rewards.std().item() if len(rewards) > 1 else 0.0,
            "rewards": rewards.tolist(), "mean_tokens": sum(map(len, out.ids)) / len(out.ids)}


def markdown_table(payload: dict) -> str:
    head = ["side", "s/step", "generation", "scoring", "log-probs", "training", "gen tokens/s", "peak RSS (MiB)",
            "wall (s)", "held-out reward"]
    held, rows = payload["held_out_reward"], []
    if "initial" in held:
        rows.append(["initial policy", *[""] * 8, f"{held['initial']['mean']:.4f}"])
    for r in payload["runs"]:
        s = r["seconds_per_step"]
        rows.append([r["side"], *(f"{s[p]:.2f}" for p in ("total", *PARTS[:-1])), f"{r['generated_tokens_per_s']:.1f}",
                     f"{r['peak_rss_mib']:.0f}", f"{r['wall_s']:.1f}",
                     f"{held[r['side']]['mean']:.4f}" if r["side"] in held else "-"])
    if "ratio_trl_over_rmkit" in payload:
        q = payload["ratio_trl_over_rmkit"]
        rows.append(["**TRL / rmkit s/step**", f"**{q['total']:.2f}x**", *(f"{q[p]:.2f}x" for p in PARTS[:-1])])
    return harness.markdown(head, rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if harness.subcommand(argv, "grpo_vs_trl.py", worker, markdown_table):
        return 0
    args = parse_args(argv)
    info = common.machine_info()
    data = prepare(args)
    runs = [run_side(args, data, side) for side in args.sides]
    held = {}
    if data["held_out"]:
        for name, directory in [("initial", data["policy_dir"]), *[(r["side"], r["model_dir"]) for r in runs]]:
            held[name] = held_out_reward(directory, data["reward_model"], data["held_out"], args.max_new_tokens,
                                         args.device)
            print(f"held-out reward {name}: {held[name]['mean']:.4f}", flush=True)
    payload = {
        "command": "python benchmarks/grpo_vs_trl.py " + " ".join(argv),
        "machine": {**info, "load_average_end": os.getloadavg()},
        "workload": {"policy": args.policy, "reward_model": data["reward_model"], "prompts_per_step": args.prompts,
                     "generations_per_prompt": args.generations, "steps": args.steps,
                     "max_new_tokens": args.max_new_tokens, "lr": args.lr, "beta": args.beta,
                     "temperature": args.temperature, "threads": args.threads, "precision": args.precision,
                     "device": args.device, "held_out_prompts": len(data["held_out"]),
                     **({"warmup_steps": args.warmup_steps} if args.warmup_steps else {})},
        "runs": runs,
        "held_out_reward": held,
    }
    by_side = {r["side"]: r for r in runs}
    if len(by_side) == 2:
        payload["ratio_trl_over_rmkit"] = {p: by_side["trl"]["seconds_per_step"][p] / by_side["rmkit"]["seconds_per_step"][p]
                                           for p in PARTS}
    common.write_json(args.output, payload)
    print(markdown_table(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
