"""PPO with a critic twice, with TRL 1.12.0's `PPOTrainer` and with `rmkit ppo`, on the same policy, reward model,
critic initialisation and prompts, side by side in one run.

TRL 1.12.0 is the last release that ships a PPOTrainer (`trl/experimental/ppo/`; 1.13.0 removed it), so its side
runs in its own environment, `.venv-trl112` in the repository root (`benchmarks/setup_trl_env.sh ppo`, or
`--trl-python`); rmkit's side runs in this interpreter, through `rmkit ppo`'s CLI entry point. Each side trains in
a fresh subprocess (`harness.launch`) on `--threads` torch threads.

Matched on both sides (`trl_config` and `rmkit_config` hold every key): the policy (one HF directory, exported once
from `--policy`), the critic and the reward model (both from `--reward-model`: TRL's `value_model` is that
classifier, rmkit's critic defaults to it, and the run checks its "rmkit: critic:" line says so), the prompts
(the first `--prompts x --steps` prompts of hh_harmless_train.jsonl that leave room for the completion, rendered
with the policy's chat template by rmkit's `render_prompt`: TRL gets those token ids, rmkit the messages it renders
the same way), one completion per prompt (TRL's PPO samples one), `--max-new-tokens`, temperature (top-p 1, no
top-k), stopping at EOS, the old log-probs taken from the sampler (TRL from the generation's scores, rmkit with
`ppo.prev_logprobs_from_generation`), `--ppo-epochs` passes over each rollout in `--minibatches` optimizer steps of
one micro-batch each, cut from the rollout in a new random order every epoch (TRL's way; rmkit's
`ppo.shuffle_minibatches: true`, set since 2026-11-27; earlier results, whose `configs.rmkit` lacks the key,
took NeMo RL's fixed order), AdamW over policy and critic (one lr, betas (0.9, 0.999), eps 1e-8, no weight decay, no
gradient clipping: TRL's PPOTrainer clips nothing), constant schedule, the PPO ratio clipped at 0.2, the critic's
value loss `vf_coef * 0.5 * mean(max((V - R)^2, (clip(V, V_old +- cliprange_value) - R)^2))` over the tokens,
the token-level policy loss, GAE (`--gae-lambda`, `--gamma`) with the advantages whitened over the rollout's
tokens and the rewards not whitened, fp32 on CPU; with `--missing-eos-penalty X` (off by default), X taken off the
reward of a completion that reaches the token limit without an EOS on both sides (TRL's "EOS trick", which its
PPO documentation recommends and runs at 1.0; rmkit's `ppo.reward_shaping.missing_eos_penalty`).

The KL: both put `kl_coef x k1` per token into the reward, `k1 = log pi(y_t) - log pi_ref(y_t)` (TRL `kl_coef`,
`kl_estimator=k1`; rmkit `loss_fn.reference_policy_kl_penalty`, `reference_policy_kl_type=k1`,
`use_kl_in_reward=true`, a fixed coefficient), and no KL term in the loss.

The reward: both sides score prompt + completion as a conversation with the same code, rmkit's
`RewardModelEnvironment` (the reward model's chat template, read at its last token as `rmkit train` trained it):
rmkit through `env.reward_model.model_name`, TRL through its `get_reward` calls on the reward model, answered by
that environment (`rmkit_scorer`). TRL's own path would read the raw ids ending at EOS, one token short of the
newline after it where a SmolLM2 reward model was trained to read. The critic's values are TRL's own `get_reward`.

Known differences, each side as it ships:
- TRL adds the score one position after the completion's last token, rmkit at the last token (`--rmkit-set
  ppo.score_after_end=true` puts it where TRL does);
- padding: SmolLM2 pads with EOS, which its chat template also uses to end each turn, and TRL masks every pad id
  out of attention and ends a completion at its first pad: TRL's side pads with the unknown token instead;
- rmkit clamps the KL estimate (input 20, output 10, rarely reached); TRL whitens with `rsqrt(var + 1e-8)`;
- each side shuffles the prompts, draws its samples and orders its mini-batches from its own RNG (different
  rollouts).

Timed per PPO step (one rollout and its epochs) by the harness clock (`benchmarks/harness.py`), hooked the same way
on both sides (every word-embedding table, the optimizer-step hook, wrapped module attributes: TRL's
`batch_generation`, `get_reward`, `forward`; rmkit's `generate_rollout`, `score_rollout`, `batch_values`,
`batch_logprobs`): generation; reward_calculation (the reward model); values (the critic at the rollout); logprobs
(the reference's pass; in results whose rmkit config lacks `prev_logprobs_from_generation`, also rmkit's
old-policy pass); training (the PPO epochs' forwards, backwards and steps);
total (from the end of the previous step, the first: from its generation's start, to the end of its last
optimizer step). Steps/s = PPO steps / the sum of the totals: model loading, prompt tokenization and the final
save fall outside. Then the held-out reward: one greedy completion per held-out prompt (the first `--eval-prompts`
of hh_harmless_val.jsonl), from the initial policy and each final one, by `rmkit.generation`, scored by rmkit's
reward environment, in this process (`grpo_vs_trl.held_out_reward`).

    bash benchmarks/setup_trl_env.sh ppo
    python benchmarks/ppo_vs_trl.py --reward-model results/rm_smollm2/final
    python benchmarks/ppo_vs_trl.py --smoke    # tiny random models, 2 steps: both sides work end to end
    python benchmarks/ppo_vs_trl.py rescore benchmarks/results/ppo_vs_trl.json --eval-prompts 128   # more prompts
    python benchmarks/ppo_vs_trl.py rescore SEED43.json SEED44.json --eval-prompts 292   # seeds, each policy once
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import common, harness  # noqa: E402

SIDES = ("trl", "rmkit")
PARTS = ("generation", "reward_calculation", "values", "logprobs", "training", "total")
TRL_PYTHON = common.REPO_ROOT / ".venv-trl112" / "bin" / "python"
SMOKE = {"prompts": 4, "steps": 2, "minibatches": 2, "ppo_epochs": 2, "max_new_tokens": 6, "max_length": 128,
         "eval_prompts": 2, "lr": 1e-3}


def settings_parser(description: str) -> argparse.ArgumentParser:
    """The options of one matched run (the models, the prompts, every setting both sides share, the TRL
    environment, the folders): this script's and `ppo_replay.py`'s."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--policy", default="smollm2", help="a causal LM directory (GGUF too) or smollm2")
    parser.add_argument("--reward-model", type=Path,
                        help="a decoder reward model with the policy's tokenizer (`rmkit train` on SmolLM2); it "
                             "scores the rollouts and starts the critic on both sides")
    parser.add_argument("--smoke", action="store_true",
                        help=f"tiny random models (SmolLM2's tokenizer) instead of --policy/--reward-model, and {SMOKE}")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step (one completion each)")
    parser.add_argument("--steps", type=int, default=10, help="PPO steps (rollouts)")
    parser.add_argument("--minibatches", type=int, default=2, help="optimizer steps per pass over a rollout")
    parser.add_argument("--ppo-epochs", type=int, default=2, help="passes over each rollout")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--max-length", type=int, default=512, help="prompt + completion tokens")
    parser.add_argument("--lr", type=float, default=3e-6, help="policy and critic")
    parser.add_argument("--kl-coef", type=float, default=0.05, help="x k1 per token, in the reward")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--gae-lambda", type=float, default=0.95)
    parser.add_argument("--gamma", type=float, default=1.0)
    parser.add_argument("--cliprange", type=float, default=0.2, help="PPO ratio clip")
    parser.add_argument("--cliprange-value", type=float, default=0.2, help="value clip around the rollout's values")
    parser.add_argument("--vf-coef", type=float, default=0.1, help="weight of the value loss")
    parser.add_argument("--missing-eos-penalty", type=float, metavar="X",
                        help="both sides take X off the reward of a completion with no EOS within --max-new-tokens "
                             "(TRL `missing_eos_penalty`, rmkit `ppo.reward_shaping.missing_eos_penalty`); "
                             "default: neither")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--trl-python", type=Path, default=TRL_PYTHON, help="the TRL 1.12.0 environment's python")
    parser.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA_DIR)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/rmkit-bench-ppo"))
    return parser


def check_settings(parser: argparse.ArgumentParser, args: argparse.Namespace, trl_hint: str | None) -> None:
    """The checks of `settings_parser`'s options (`parser.error` on the first that fails); `trl_hint`: the run
    needs the TRL environment, and what else the user can do when it is missing (None: it does not)."""
    if not args.smoke and args.reward_model is None:
        parser.error("--reward-model is required (or --smoke)")
    if args.prompts % args.minibatches:
        parser.error(f"--minibatches ({args.minibatches}) must divide --prompts ({args.prompts})")
    if trl_hint is not None and not args.trl_python.exists():
        parser.error(f"{args.trl_python} is missing: run benchmarks/setup_trl_env.sh ppo, or {trl_hint}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = settings_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--eval-prompts", type=int, default=16, help="held-out prompts (0: skip)")
    parser.add_argument("--sides", default="trl,rmkit", help="comma list of trl, rmkit (run in this order)")
    parser.add_argument("--trl-from", type=Path, metavar="RESULTS.json",
                        help="take the TRL run (its numbers and saved policy) from an earlier results file with the "
                             "same settings instead of running it again; with --sides rmkit")
    parser.add_argument("--rmkit-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a dotted `rmkit ppo` override on top of the matched config (repeatable): a variant "
                             "of rmkit's side, recorded under `rmkit_overrides`; the TRL side is unchanged")
    parser.add_argument("--output", type=Path, help="results JSON (default: benchmarks/results/ppo_vs_trl.json, "
                                                     "with --smoke WORK_DIR/ppo_vs_trl_smoke.json)")
    if "--smoke" in argv:
        parser.set_defaults(**SMOKE)
    args = parser.parse_args(argv)
    args.sides = [s for s in args.sides.split(",") if s]
    if args.trl_from and args.sides != ["rmkit"]:
        parser.error("--trl-from takes the TRL run from the earlier file: use it with --sides rmkit")
    if not set(args.sides) <= set(SIDES):
        parser.error("--sides takes trl,rmkit")
    check_settings(parser, args, "pass --sides rmkit" if "trl" in args.sides else None)
    args.output = args.output or (args.work_dir / "ppo_vs_trl_smoke.json" if args.smoke else
                                  common.REPO_ROOT / "benchmarks" / "results" / "ppo_vs_trl.json")
    return args


# ---------------------------------------------------------------- the two configs


def trl_config(spec: dict) -> dict:
    """TRL's `PPOConfig` keywords for `spec`: the rollout is one micro-batch of `prompts` (no gradient
    accumulation, so each of the `num_mini_batches` minibatches is one forward and one optimizer step)."""
    return {"per_device_train_batch_size": spec["prompts"], "gradient_accumulation_steps": 1,
            "num_mini_batches": spec["minibatches"], "num_ppo_epochs": spec["ppo_epochs"],
            "total_episodes": spec["prompts"] * spec["steps"], "num_train_epochs": 1,
            "local_rollout_forward_batch_size": spec["prompts"], "response_length": spec["max_new_tokens"],
            "stop_token": "eos", "temperature": spec["temperature"],
            "missing_eos_penalty": spec["missing_eos_penalty"],
            "learning_rate": spec["lr"], "lr_scheduler_type": "constant", "warmup_steps": 0, "weight_decay": 0.0,
            "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8,
            "kl_coef": spec["kl_coef"], "kl_estimator": "k1", "cliprange": spec["cliprange"],
            "vf_coef": spec["vf_coef"], "cliprange_value": spec["cliprange_value"], "gamma": spec["gamma"],
            "lam": spec["gae_lambda"], "whiten_rewards": False, "num_sample_generations": 0, "bf16": False,
            "gradient_checkpointing": False, "use_cpu": True, "seed": spec["seed"], "logging_steps": 1,
            "report_to": "none", "save_strategy": "no", "disable_tqdm": True}


def rmkit_config(spec: dict) -> dict:
    """The `rmkit ppo` config matching `trl_config` (no validation, no checkpoints, the final policy only)."""
    minibatch = spec["prompts"] // spec["minibatches"]
    optimizer = {"lr": spec["lr"], "weight_decay": 0.0, "betas": [0.9, 0.999], "eps": 1e-8}
    return {
        "ppo": {"num_prompts_per_step": spec["prompts"], "num_generations_per_prompt": 1,
                "ppo_epochs": spec["ppo_epochs"], "max_num_steps": spec["steps"], "max_num_epochs": 1,
                "adv_estimator": {"name": "gae", "gae_lambda": spec["gae_lambda"], "gae_gamma": spec["gamma"],
                                  "normalize_advantages": True},
                "kl_target": None, "val_period": 0, "val_at_start": False, "val_at_end": False,
                "prev_logprobs_from_generation": True, "shuffle_minibatches": True, "seed": spec["seed"],
                "log_period": 1, "reward_shaping": missing_eos_shaping(spec)},
        "loss_fn": {"reference_policy_kl_penalty": spec["kl_coef"], "reference_policy_kl_type": "k1",
                    "use_kl_in_reward": True, "ratio_clip_min": spec["cliprange"],
                    "ratio_clip_max": spec["cliprange"], "token_level_loss": True},
        "value_loss_fn": {"scale": spec["vf_coef"], "cliprange": spec["cliprange_value"]},
        "value": {"model_name": None, "optimizer": optimizer, "scheduler": {"name": "constant", "warmup_steps": 0},
                  "max_grad_norm": None},
        "policy": {"model_name": spec["policy_dir"], "train_global_batch_size": minibatch,
                   "train_micro_batch_size": minibatch, "generation_batch_size": spec["prompts"],
                   "max_total_sequence_length": spec["max_length"], "precision": "float32",
                   "generation": {"max_new_tokens": spec["max_new_tokens"], "temperature": spec["temperature"],
                                  "top_p": 1.0, "top_k": None},
                   "optimizer": optimizer, "scheduler": {"name": "constant", "warmup_steps": 0},
                   "max_grad_norm": None, "num_threads": spec["threads"]},
        "env": {"reward_model": {"model_name": spec["reward_model"], "precision": "float32",
                                 "batch_size": spec["prompts"]}},
        "data": {"train_data_path": spec["prompts_file"], "val_data_paths": {}},
        "checkpointing": {"enabled": False, "checkpoint_dir": spec["out_dir"]},
        "logger": {"tensorboard": False, "plots": False, "progress_bar": False},
    }


def missing_eos_shaping(spec: dict) -> dict:
    """`ppo.reward_shaping` for `--missing-eos-penalty`: TRL's penalty on a completion without an EOS."""
    if spec["missing_eos_penalty"] is None:
        return {"enabled": False}
    return {"enabled": True, "missing_eos_penalty": spec["missing_eos_penalty"]}


# ---------------------------------------------------------------- inside a training process


def trl_tokenizer(policy_dir: str):
    """The policy's tokenizer as TRL's PPOTrainer needs it: left padding, and a pad token other than EOS. TRL ends
    a completion at its first pad token and masks every pad id out of attention, so SmolLM2's pad (EOS, which
    its chat template also writes at the end of each turn) would cut tokens out of the prompts."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy_dir, padding_side="left")
    if tokenizer.pad_token_id == tokenizer.eos_token_id:
        if tokenizer.unk_token_id in (None, tokenizer.eos_token_id):
            raise SystemExit(f"{policy_dir}: pads with EOS and has no other token to pad with for TRL")
        tokenizer.pad_token = tokenizer.unk_token
    return tokenizer


def rmkit_scorer(spec: dict, tokenizer, prompts: list[list[int]]):
    """A stand-in for TRL's `get_reward(reward_model, query_responses [B, S], pad_token_id, context_length)`:
    `(None, scores [B], None)` from rmkit's environment on each row's prompt (as messages) + decoded completion."""
    from benchmarks.grpo_vs_trl import reward_callable

    messages = [json.loads(line)["messages"] for line in Path(spec["prompts_file"]).read_text().splitlines()]
    conversation = {tuple(ids): m for ids, m in zip(prompts, messages)}
    rmkit_reward = reward_callable(spec["reward_model"])

    def get_reward(model, query_responses, pad_token_id, context_length):
        rows = [(row[:context_length], row[context_length:]) for row in query_responses.tolist()]
        chats = [conversation[tuple(t for t in query if t != pad_token_id)] for query, _ in rows]
        texts = [[{"content": tokenizer.decode([t for t in completion if t != pad_token_id], skip_special_tokens=True)}]
                 for _, completion in rows]
        return None, torch.tensor(rmkit_reward(chats, texts)), None

    return get_reward


def train_trl(spec: dict, clock: harness.PhaseClock, extend: Callable | None = None) -> list[dict]:
    """TRL's PPOTrainer on `trl_config(spec)`, its phases on `clock`; returns each step's generated tokens and
    mean rollout score. `extend(trainer)` is called before training starts (`ppo_replay.py` adds its recorder)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
    from trl.experimental.ppo import PPOConfig, PPOTrainer, ppo_trainer

    tokenizer = trl_tokenizer(spec["policy_dir"])
    prompts = json.loads(Path(spec["prompt_ids_file"]).read_text())
    model = AutoModelForCausalLM.from_pretrained(spec["policy_dir"], dtype=torch.float32)
    critic = AutoModelForSequenceClassification.from_pretrained(spec["reward_model"], num_labels=1, dtype=torch.float32)
    # The reward model's calls are answered by rmkit's environment (it holds the reward model), so the trainer gets
    # an empty module in its place, recognized below by identity.
    placeholder = torch.nn.Module()
    trainer = PPOTrainer(args=PPOConfig(output_dir=spec["out_dir"], **trl_config(spec)), processing_class=tokenizer,
                         model=model, ref_model=None, reward_model=placeholder, value_model=critic,
                         train_dataset=Dataset.from_dict({"input_ids": prompts}))
    if extend is not None:
        extend(trainer)
    generated = []
    generate = clock.timed(ppo_trainer.batch_generation, "generation")

    def counted_generation(model, queries, *args, **kwargs):
        sequences, logits = generate(model, queries, *args, **kwargs)
        is_eos = sequences[:, queries.shape[1]:] == tokenizer.eos_token_id
        ends = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, is_eos.shape[1])  # tokens through EOS
        generated.append(int(ends.sum()))
        return sequences, logits

    scores = clock.timed(rmkit_scorer(spec, tokenizer, prompts), "reward_calculation")
    values = clock.timed(ppo_trainer.get_reward, "values")
    forward = ppo_trainer.forward
    reference = clock.timed(forward, "logprobs")
    ppo_trainer.batch_generation = counted_generation
    ppo_trainer.get_reward = lambda model, *a, **k: (scores if model is placeholder else values)(model, *a, **k)
    ppo_trainer.forward = lambda *a, **k: (forward if torch.is_grad_enabled() else reference)(*a, **k)
    trainer.train()
    trainer.save_model(spec["model_out"])
    AutoTokenizer.from_pretrained(spec["policy_dir"]).save_pretrained(spec["model_out"])  # the unchanged pad token
    rewards = [h["objective/scores"] for h in trainer.state.log_history if "objective/scores" in h]
    return [{"generated_tokens": n, "train_reward": r} for n, r in zip(generated, rewards)]


def train_rmkit(spec: dict, clock: harness.PhaseClock) -> list[dict]:
    """`rmkit ppo` through its CLI entry point on `rmkit_config(spec)`, its phases on `clock`; returns each step's
    generated tokens and mean rollout reward, from its metrics.jsonl."""
    import yaml

    from rmkit.cli import main as rmkit_main
    from rmkit.recipes import ppo

    clock.watch_rl_phases(ppo)
    ppo.batch_values = clock.timed(ppo.batch_values, "values")
    out = Path(spec["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.yaml").write_text(yaml.safe_dump(rmkit_config(spec), sort_keys=False))
    status = rmkit_main(["ppo", "--config", str(out / "bench.yaml"), *spec.get("rmkit_set", [])])
    if status != 0:
        raise SystemExit(f"rmkit ppo exited with status {status}")
    (out / "final").rename(spec["model_out"])
    records = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [{"generated_tokens": r["train/mean_gen_tokens_per_sample"] * spec["prompts"],
             "train_reward": r["train/reward"]} for r in records if "train/reward" in r]


def worker(spec: dict) -> dict:
    """One training run in this (fresh) process: each PPO step's seconds per phase (its optimizer steps summed),
    generated tokens and rollout reward, the peak memory and this environment's package versions."""
    clock = harness.PhaseClock()
    clock.watch()
    logged = {"trl": train_trl, "rmkit": train_rmkit}[spec["side"]](spec, clock)
    clock.close()
    updates = spec["ppo_epochs"] * spec["minibatches"]
    per_update = [{**dict.fromkeys(PARTS, 0.0), **u} for u in clock.per_step()]
    if len(per_update) != updates * spec["steps"] or len(logged) != spec["steps"]:
        raise SystemExit(f"{len(per_update)} optimizer steps timed ({updates} x {spec['steps']} expected), "
                         f"{len(logged)} PPO steps logged")
    steps = [{p: sum(u[p] for u in per_update[i * updates:(i + 1) * updates]) for p in PARTS}
             for i in range(spec["steps"])]
    return {"steps": [{**s, **extra} for s, extra in zip(steps, logged)], "versions": common.machine_info()["versions"],
            **clock.memory}


# ---------------------------------------------------------------- orchestration


def tiny_models(directory: Path, seed: int) -> tuple[str, str]:
    """`--smoke`'s models: a random Llama causal LM (hidden 32, 2 layers) and a random Llama classifier (hidden 16,
    1 layer), both with SmolLM2's tokenizer and chat template, so the critic can start from the reward model."""
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    from rmkit.models.reward import load_tokenizer
    from rmkit.models.setup import resolve_model_name

    tokenizer = load_tokenizer(resolve_model_name("smollm2"))
    shape = {"vocab_size": len(tokenizer), "num_attention_heads": 2, "num_key_value_heads": 1,
             "max_position_embeddings": 512, "bos_token_id": tokenizer.bos_token_id,
             "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    torch.manual_seed(seed)
    models = {"policy": LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                     tie_word_embeddings=True, **shape)),
              "reward_model": LlamaForSequenceClassification(LlamaConfig(hidden_size=16, intermediate_size=32,
                                                                         num_hidden_layers=1, num_labels=1, **shape))}
    for name, model in models.items():
        model.save_pretrained(directory / name)
        tokenizer.save_pretrained(directory / name)
    return str(directory / "policy"), str(directory / "reward_model")


def prepare(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from benchmarks.grpo_vs_trl import prompt_sets
    from rmkit.data.tokenize import render_prompt

    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    policy, reward_model = tiny_models(work / "tiny", args.seed) if args.smoke else (args.policy, args.reward_model)
    policy_dir = common.export_policy_dir(policy, work / "policy")
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    train, prompts_file, held_out = prompt_sets(args, tokenizer, work)
    prompt_ids_file = work / "prompt_ids.json"
    prompt_ids_file.write_text(json.dumps([render_prompt(tokenizer, m) for m in train]))
    return {"policy_dir": str(policy_dir), "reward_model": str(Path(reward_model).resolve()),
            "prompts_file": str(prompts_file), "prompt_ids_file": str(prompt_ids_file), "held_out": held_out}


def settings(args: argparse.Namespace) -> dict:
    """The matched settings (the keys both configs are built from)."""
    return {key: getattr(args, key) for key in ("prompts", "steps", "minibatches", "ppo_epochs", "max_new_tokens",
                                                "max_length", "lr", "kl_coef", "temperature", "gae_lambda", "gamma",
                                                "cliprange", "cliprange_value", "vf_coef", "missing_eos_penalty",
                                                "threads", "seed")}


def side_spec(args, data: dict, side: str, out_dir: Path) -> dict:
    """What one side's training process gets: the matched settings, `prepare`'s files, its run folder
    (`out_dir/run`) and where its final policy goes (`out_dir/model`)."""
    return {"side": side, **settings(args), "policy_dir": data["policy_dir"], "reward_model": data["reward_model"],
            "prompts_file": data["prompts_file"], "prompt_ids_file": data["prompt_ids_file"],
            "out_dir": str(out_dir / "run"), "model_out": str(out_dir / "model")}


def run_side(args, data: dict, side: str) -> dict:
    out_dir = args.work_dir / side
    if out_dir.exists():
        import shutil

        shutil.rmtree(out_dir)
    spec = {**side_spec(args, data, side, out_dir), "rmkit_set": args.rmkit_set}
    python = args.trl_python if side == "trl" else sys.executable
    result = harness.launch(__file__, spec, out_dir, "cpu", f"{side} run", python=python)
    if side == "rmkit":  # the critic must have started from the reward model, as TRL's value_model does
        said = [line for line in (out_dir / "log.txt").read_text().splitlines() if line.startswith("rmkit: critic:")]
        if not said or not said[0].endswith(": the reward model"):
            raise SystemExit(f"rmkit's critic did not start from the reward model: {said}")
        result["critic"] = said[0]
    else:
        result["critic"] = f"value_model = AutoModelForSequenceClassification({data['reward_model']})"
    seconds = sum(s["total"] for s in result["steps"])
    result.update(side=side, model_dir=spec["model_out"], steps_per_s=len(result["steps"]) / seconds,
                  seconds_per_step={p: sum(s[p] for s in result["steps"]) / len(result["steps"]) for p in PARTS},
                  generated_tokens_per_s=sum(s["generated_tokens"] for s in result["steps"]) / sum(
                      s["generation"] for s in result["steps"]))
    print(f"{side:>5}: {result['steps_per_s']:.4f} steps/s, {result['seconds_per_step']['total']:.2f} s/step ("
          + ", ".join(f"{p} {result['seconds_per_step'][p]:.2f}" for p in PARTS[:-1])
          + f"), rss {result['peak_rss_mib']:.0f} MiB, wall {result['wall_s']:.1f} s", flush=True)
    return result


def markdown_table(payload: dict) -> str:
    head = ["side", "steps/s", "s/step", *PARTS[:-1], "gen tokens/s", "peak RSS (MiB)", "held-out reward"]
    held, rows = payload["held_out_reward"], []
    if "initial" in held:
        rows.append(["initial policy", *[""] * 9, f"{held['initial']['mean']:.4f} ± {held['initial']['std']:.4f}"])
    for r in payload["runs"]:
        s = r["seconds_per_step"]
        rows.append([r["side"], f"{r['steps_per_s']:.4f}", *(f"{s[p]:.2f}" for p in ("total", *PARTS[:-1])),
                     f"{r['generated_tokens_per_s']:.1f}", f"{r['peak_rss_mib']:.0f}",
                     f"{held[r['side']]['mean']:.4f} ± {held[r['side']]['std']:.4f}" if r["side"] in held else "-"])
    if "speedup_rmkit_over_trl" in payload:
        rows.append(["**rmkit / TRL steps/s**", f"**{payload['speedup_rmkit_over_trl']:.2f}x**"])
    return harness.markdown(head, rows)


def rescore(argv: list[str]) -> None:
    """`rescore RESULTS.json [RESULTS.json ...] --eval-prompts N`: the held-out reward of the initial policy and of
    each side's saved final policy on the first N held-out prompts (more than the run scored: a mean over 16 greedy
    completions moves by a tenth of a reward when a few of them change), with each side's paired difference to the
    initial policy and TRL's to rmkit's (mean and standard error over the prompts); written into each RESULTS.json as
    `held_out_reward_rescored`. Several files (runs of one setting, e.g. seeds) must share the initial policy, the
    reward model and the lengths: a policy directory named by more than one (the initial policy, a TRL run reused
    by `--trl-from`) is scored once, and the paired differences are also summarised over the files (mean and
    standard error over them). A policy a file already scored on the same N prompts (its run's own held-out reward,
    or an earlier rescore) is not scored again: the prompts are the first N that fit, and greedy decoding gives the
    same completions, so summarising seeds scored as they ran costs nothing. `--scores-from EARLIER.json`
    (repeatable): one more file whose scores on the same N prompts are read, and nothing written to it (a TRL run
    that `--trl-from` reuses)."""
    import statistics

    from transformers import AutoTokenizer

    from benchmarks.grpo_vs_trl import held_out_reward, select_prompts

    parser = argparse.ArgumentParser(prog="ppo_vs_trl.py rescore")
    parser.add_argument("results", type=Path, nargs="+")
    parser.add_argument("--eval-prompts", type=int, default=128)
    parser.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA_DIR)
    parser.add_argument("--scores-from", type=Path, action="append", default=[], metavar="EARLIER.json",
                        help="an earlier results file rescored on the same prompts: its policies' scores are reused")
    args = parser.parse_args(argv)
    payloads = {path: json.loads(path.read_text()) for path in args.results}
    earlier = {path: json.loads(path.read_text()) for path in args.scores_from}

    def shared(payload: dict) -> tuple:  # the policy each run exported (to its own work dir) and what scores it
        s = payload["settings"]
        return s["policy"], s["reward_model"], s["max_length"], s["max_new_tokens"]

    first = shared(payloads[args.results[0]])
    for path, payload in {**payloads, **earlier}.items():
        if shared(payload) != first:
            raise SystemExit(f"{path}: its initial policy, reward model or lengths {shared(payload)} differ from "
                             f"{args.results[0]}'s {first}; rescore them separately")
    _, reward_model, max_length, max_new_tokens = first
    policy_dir = payloads[args.results[0]]["configs"]["rmkit"]["policy"]["model_name"]  # the first run's export
    prompts = select_prompts(common.data_file(args.data_dir, "hh_harmless_val.jsonl"),
                             AutoTokenizer.from_pretrained(policy_dir), args.eval_prompts, max_length - max_new_tokens)

    def scored_on_these_prompts(payload: dict) -> dict[str, dict]:  # by policy directory
        directories = {"initial": payload["configs"]["rmkit"]["policy"]["model_name"],
                       **{r["side"]: r["model_dir"] for r in payload["runs"]}}
        rescored = payload.get("held_out_reward_rescored", {})
        if rescored.get("prompts") == len(prompts):
            held = rescored["rewards"]
        elif payload["settings"].get("held_out_prompts") == len(prompts):
            held = payload["held_out_reward"]
        else:
            return {}
        return {directories[name]: value for name, value in held.items()}

    scored: dict[str, dict] = {}
    for path, payload in earlier.items():
        found = scored_on_these_prompts(payload)
        if not found:
            raise SystemExit(f"--scores-from {path}: it holds no scores on {len(prompts)} prompts (its run scored "
                             f"{payload['settings'].get('held_out_prompts', 'none')}, its rescore "
                             f"{payload.get('held_out_reward_rescored', {}).get('prompts', 'none')}); rescore it with "
                             f"--eval-prompts {args.eval_prompts} first")
        scored.update(found)
    for payload in payloads.values():
        scored.update(scored_on_these_prompts(payload))

    def score(directory: str) -> dict:
        if directory not in scored:
            scored[directory] = held_out_reward(directory, reward_model, prompts, max_new_tokens)
        return scored[directory]

    def paired(a: dict, b: dict) -> dict:
        diff = [x - y for x, y in zip(a["rewards"], b["rewards"])]
        return {"mean": statistics.mean(diff), "se": statistics.stdev(diff) / len(diff) ** 0.5}

    summary: dict[str, list[float]] = {}
    for path, payload in payloads.items():
        held = {name: score(directory)
                for name, directory in [("initial", policy_dir), *[(r["side"], r["model_dir"]) for r in payload["runs"]]]}
        sides = [r["side"] for r in payload["runs"]]
        differences = {f"{side} - initial": paired(held[side], held["initial"]) for side in sides}
        if len(sides) == 2:
            differences["trl - rmkit"] = paired(held["trl"], held["rmkit"])
        payload["held_out_reward_rescored"] = {"prompts": len(prompts), "rewards": held,
                                               "paired_differences": differences}
        common.write_json(path, payload)
        print(f"{path}:")
        for name, value in held.items():
            print(f"  held-out reward {name} ({len(prompts)} prompts): {value['mean']:.4f} (std {value['std']:.4f}, "
                  f"{value['mean_tokens']:.1f} tokens)")
        for name, d in differences.items():
            print(f"  {name}: {d['mean']:+.4f} (SE {d['se']:.4f})")
            summary.setdefault(name, []).append(d["mean"])
    if len(payloads) > 1:
        print(f"over the {len(payloads)} files (mean, standard error over them):")
        for name, means in summary.items():
            se = statistics.stdev(means) / len(means) ** 0.5 if len(means) > 1 else float("nan")
            print(f"  {name}: {statistics.mean(means):+.4f} (SE {se:.4f}, {len(means)} files)")


def earlier_trl_run(args: argparse.Namespace) -> dict:
    """The TRL run and its held-out reward from `--trl-from`, whose settings must equal this run's."""
    earlier = json.loads(args.trl_from.read_text())
    wanted = {**settings(args), "policy": "tiny random Llama (--smoke)" if args.smoke else args.policy,
              "held_out_prompts": args.eval_prompts}
    differ = sorted(k for k, v in wanted.items() if earlier["settings"].get(k) != v)
    if differ:
        raise SystemExit(f"--trl-from {args.trl_from}: its settings differ in {', '.join(differ)}; run both sides")
    run = next((r for r in earlier["runs"] if r["side"] == "trl"), None)
    if run is None or not Path(run["model_dir"]).is_dir():
        raise SystemExit(f"--trl-from {args.trl_from}: no TRL run with its saved policy in it; run both sides")
    return {"run": run, "held_out_reward": earlier["held_out_reward"].get("trl")}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if harness.subcommand(argv, "ppo_vs_trl.py", worker, markdown_table):
        return 0
    if argv[:1] == ["rescore"]:
        rescore(argv[1:])
        return 0
    args = parse_args(argv)
    info = common.machine_info()
    data = prepare(args)
    runs = [run_side(args, data, side) for side in args.sides]
    earlier = earlier_trl_run(args) if args.trl_from else None
    runs = ([earlier["run"]] if earlier else []) + runs
    held = {}
    if data["held_out"]:
        from benchmarks.grpo_vs_trl import held_out_reward

        for name, directory in [("initial", data["policy_dir"]), *[(r["side"], r["model_dir"]) for r in runs]]:
            if earlier and name == "trl":  # scored by the earlier run, on the same held-out prompts
                held[name] = earlier["held_out_reward"]
                continue
            held[name] = held_out_reward(directory, data["reward_model"], data["held_out"], args.max_new_tokens)
            print(f"held-out reward {name}: {held[name]['mean']:.4f} ± {held[name]['std']:.4f}", flush=True)
    spec = {**settings(args), "policy_dir": data["policy_dir"], "reward_model": data["reward_model"],
            "prompts_file": data["prompts_file"], "out_dir": "<side>/run"}
    payload = {
        "command": "python benchmarks/ppo_vs_trl.py " + " ".join(argv),
        "machine": {**info, "load_average_end": os.getloadavg()},
        "versions": {r["side"]: r["versions"] for r in runs},
        "settings": {**settings(args), "policy": "tiny random Llama (--smoke)" if args.smoke else args.policy,
                     "reward_model": data["reward_model"], "held_out_prompts": len(data["held_out"])},
        "configs": {"trl": trl_config(spec), "rmkit": rmkit_config(spec)},
        **({"rmkit_overrides": args.rmkit_set} if args.rmkit_set else {}),
        "kl": {"trl": "kl_coef x k1 (log pi - log pi_ref) per token subtracted from the reward, the score added one "
                      "position after the completion's last token; no KL in the loss",
               "rmkit": "reference_policy_kl_penalty x k1 per token subtracted from the reward (use_kl_in_reward, "
                        "clamped at 10), the score added at the last token; no KL in the loss"},
        "reward": "both sides: rmkit's RewardModelEnvironment on prompt + decoded completion (TRL's get_reward calls "
                  "on the reward model answered by it)",
        "steps_per_s_measures": "PPO steps / seconds from the first rollout's generation to the end of the last "
                                "optimizer step: generation, scoring, the critic's values, log-prob passes, "
                                "advantages, the PPO epochs and logging; not model loading, tokenization or saving",
        "runs": runs,
        "held_out_reward": held,
        **({"trl_from": f"{args.trl_from}: the TRL run and its held-out reward, taken from this earlier run with "
                        "the same settings"} if earlier else {}),
    }
    by_side = {r["side"]: r for r in runs}
    if len(by_side) == 2:
        payload["speedup_rmkit_over_trl"] = by_side["rmkit"]["steps_per_s"] / by_side["trl"]["steps_per_s"]
    common.write_json(args.output, payload)
    print(markdown_table(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
