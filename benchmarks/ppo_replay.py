"""TRL 1.12.0's PPO run replayed through rmkit's update, step by step: is each PPO step the same computation?

`ppo_vs_trl.py` runs both trainers on their own rollouts, so a difference in their final policies mixes chance
(which prompts, which samples) with any difference in what a step computes. This script takes the rollouts out.
TRL trains `--steps` PPO steps (in its own environment, through `ppo_vs_trl.train_trl` on the same matched
settings), and a `TrainerCallback` writes what each step computed, read from `PPOTrainer.train`'s frame when the
step ends: the rows (prompt and completion ids, the sampler's log-probs, the scores), the critic's values, the
reference's log-probs, GAE's advantages and returns, each epoch's mini-batch order (its `np.random.permutation`
draws), and the policy's and the critic's weights (also before the first step).

rmkit then starts from the same policy and critic, loaded as `rmkit ppo` loads them, with TRL's algorithm where
the two differ (`ppo.score_after_end=true`, `value.calibrate_offset=false`), and for each step in turn, carrying
its own weights and optimizer state from the step before: lays TRL's rows out as its own batch
(`trl_rows_as_rollout`), scores them with its own reward environment (`score_rollout`), computes its critic's
values and its reference's log-probs on them, its advantages and returns from its scores and TRL's sampler
log-probs (`compute_advantages`), and runs `update_actor_critic` with TRL's mini-batch orders. Per step it
reports the largest differences from TRL's scores, values, reference log-probs, advantages and returns, and for
each model the distance of its weights from TRL's after the step, relative to the size of TRL's update in that
step (`distance / update`). The same computation gives float rounding (~1e-3 of an update and below); a
difference in the algorithm gives a difference of the order of the update.

    bash benchmarks/setup_trl_env.sh ppo
    python benchmarks/ppo_replay.py --reward-model results/rm_smollm2/final --seed 45 --steps 3 --lr 3e-5
    python benchmarks/ppo_replay.py --smoke    # tiny random models, 2 steps
    python benchmarks/ppo_replay.py ... --from-record   # rmkit's half again on the recording in WORK_DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import common, harness, ppo_vs_trl  # noqa: E402

# What `PPOTrainer.train` holds when a step ends (TRL 1.12.0's local names), each step's record.
TRL_LOCALS = ("queries", "context_length", "responses", "postprocessed_responses", "logprobs", "ref_logprobs",
              "values", "scores", "sequence_lengths", "advantages", "returns")
# rmkit's side: TRL's score position and TRL's critic start.
TRL_ALGORITHM = ["ppo.score_after_end=true", "value.calibrate_offset=false"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = ppo_vs_trl.settings_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, help="results JSON (default: WORK_DIR/ppo_replay.json)")
    parser.add_argument("--from-record", action="store_true",
                        help="replay the steps an earlier run with the same settings recorded in WORK_DIR/trl/record "
                             "instead of running TRL again")
    if "--smoke" in argv:
        parser.set_defaults(**ppo_vs_trl.SMOKE)
    args = parser.parse_args(argv)
    ppo_vs_trl.check_settings(parser, args, None if args.from_record else "pass --trl-python")
    if args.from_record and not (args.work_dir / "trl" / "record" / f"step{args.steps}.pt").exists():
        parser.error(f"--from-record: {args.work_dir / 'trl' / 'record'} holds no recording of {args.steps} steps")
    args.eval_prompts = 0  # `ppo_vs_trl.prepare`: no held-out prompts
    args.output = args.output or args.work_dir / "ppo_replay.json"
    return args


# ---------------------------------------------------------------- TRL's side (in its own environment)


def record_steps(trainer, folder: Path) -> None:
    """Make `trainer` (TRL's PPOTrainer) write `step{k}.pt` when PPO step k ends: `TRL_LOCALS`, `orders` (each
    epoch's mini-batch permutation) and both models' weights (`policy`, `critic`); `step0.pt` the weights
    before training."""
    import numpy as np
    from transformers import TrainerCallback

    folder.mkdir(parents=True, exist_ok=True)
    orders: list[list[int]] = []
    draw = np.random.permutation

    def recorded_permutation(n):  # TRL draws each epoch's mini-batch order with it
        order = draw(n)
        orders.append(order.tolist())
        return order

    np.random.permutation = recorded_permutation

    def weights() -> dict:
        return {"policy": {k: v.detach().clone() for k, v in trainer.model.policy.state_dict().items()},
                "critic": {k: v.detach().clone() for k, v in trainer.model.value_model.state_dict().items()}}

    class Record(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            torch.save(weights(), folder / "step0.pt")

        def on_step_end(self, args, state, control, **kwargs):
            frame = sys._getframe()
            while frame is not None and not (frame.f_code.co_name == "train" and "advantages" in frame.f_locals):
                frame = frame.f_back
            if frame is None:
                raise RuntimeError("PPOTrainer.train's frame not found: this is not TRL 1.12.0's PPOTrainer")
            step = {key: frame.f_locals[key] for key in TRL_LOCALS}
            torch.save({**step, "orders": orders[:], **weights()}, folder / f"step{state.global_step}.pt")
            orders.clear()

    trainer.add_callback(Record())


def worker(spec: dict) -> dict:
    """TRL's run with the recorder, in the fresh process `harness.launch` started."""
    clock = harness.PhaseClock()
    steps = ppo_vs_trl.train_trl(spec, clock, extend=lambda trainer: record_steps(trainer, Path(spec["record_dir"])))
    clock.close()
    return {"steps": len(steps), "versions": common.machine_info()["versions"]}


# ---------------------------------------------------------------- rmkit's side (this process)


def trl_rows_as_rollout(step: dict, prompts: dict, trl_pad_id: int, tokenizer):
    """TRL's rows as rmkit's `Rollout`: each row's prompt (its query without TRL's left padding, looked up in
    `prompts`, ids -> `PromptItem`) and its completion through its EOS (`tokenizer`'s; every token when it has
    none: `truncated`), with the sampler's log-probs of those tokens and the text rmkit's sampler would give
    (decoded without special tokens)."""
    from rmkit.rl.rollout import Rollout

    rows, completions, text, logprobs, truncated = [], [], [], [], []
    for query, response, logprob, last in zip(step["queries"].tolist(), step["postprocessed_responses"].tolist(),
                                              step["logprobs"], step["sequence_lengths"].tolist()):
        rows.append(prompts[tuple(t for t in query if t != trl_pad_id)])
        completions.append(response[:last + 1])
        text.append(tokenizer.decode(completions[-1], skip_special_tokens=True))
        logprobs.append(logprob[:last + 1].float())
        truncated.append(response[last] != tokenizer.eos_token_id)  # it ran to the limit: TRL's width
    return Rollout(rows, torch.arange(len(rows)), completions, text, logprobs, torch.tensor(truncated, dtype=torch.bool))


def at_trl_positions(values: torch.Tensor, batch: dict, width: int) -> torch.Tensor:
    """`[N, width]`: rmkit's per-token `values` `[N, S]` (aligned with input_ids: column p + t of a row whose
    prompt has p tokens is completion token t's) at TRL's response columns t (0 past a row's end)."""
    index = batch["prompt_length"][:, None] + torch.arange(width)
    padded = torch.cat([values, values.new_zeros(len(values), width)], 1)
    return padded.gather(1, index)


def largest_difference(ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor) -> float:
    return float(((ours - theirs).abs() * mask).max())


def weights_distance(model: torch.nn.Module, after: dict, before: dict) -> dict:
    """How far `model`'s weights are from TRL's `after` a step, over the size of TRL's update (`after - before`):
    global norms over every tensor TRL has (each must be in `model` by the same name and shape)."""
    ours = model.state_dict()
    missing = [k for k in after if k not in ours or ours[k].shape != after[k].shape]
    if missing:
        raise SystemExit(f"rmkit's {type(model).__name__} lacks TRL's {missing[:3]} (or their shapes differ)")
    distance = sum(float((ours[k].float() - after[k].float()).pow(2).sum()) for k in after) ** 0.5
    update = sum(float((after[k].float() - before[k].float()).pow(2).sum()) for k in after) ** 0.5
    return {"distance": distance, "update": update, "distance_over_update": distance / update if update else None}


def replay(args: argparse.Namespace, data: dict, record_dir: Path) -> list[dict]:
    """rmkit's update on TRL's recorded steps in turn (the module docstring); each step's comparison."""
    import yaml

    from rmkit.config import load_config
    from rmkit.env import environment_for
    from rmkit.losses.policy_gradient import ClippedPGLossFn
    from rmkit.losses.value import MseValueLossFn
    from rmkit.models.critic import ActorCritic, TokenValues
    from rmkit.models.policy import load_training_policy
    from rmkit.recipes import ppo
    from rmkit.recipes.configs import PPOConfig
    from rmkit.rl.logprobs import batch_logprobs, reference_policy
    from rmkit.rl.rollout import score_rollout, training_batch
    from rmkit.trainer.datasets import PromptItem
    from rmkit.trainer.optim import joint_optimizer
    from rmkit.trainer.state import TrainState

    torch.set_num_threads(args.threads)
    spec = ppo_vs_trl.side_spec(args, data, "rmkit", args.work_dir / "rmkit")
    config = args.work_dir / "replay.yaml"
    config.write_text(yaml.safe_dump(ppo_vs_trl.rmkit_config(spec), sort_keys=False))
    cfg = load_config(config, TRL_ALGORITHM, tree_type=PPOConfig)
    device = torch.device("cpu")
    policy, tokenizer = load_training_policy(cfg.policy, device)
    reference = reference_policy(policy, cfg.policy, None, needed=True)
    critic_cfg, critic, _ = ppo.build_critic(cfg, tokenizer, device)
    models = ppo.Models(policy, policy, critic, TokenValues(critic), reference)
    optimizer = joint_optimizer({"policy": (policy, cfg.policy.optimizer), "critic": (critic, critic_cfg.optimizer)})
    state = TrainState(ActorCritic(policy, critic), optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0), None)
    loss_fn, value_loss_fn = ClippedPGLossFn(cfg.loss_fn), MseValueLossFn(cfg.value_loss_fn)
    messages = [json.loads(line)["messages"] for line in Path(data["prompts_file"]).read_text().splitlines()]
    ids = json.loads(Path(data["prompt_ids_file"]).read_text())
    prompts = {tuple(i): PromptItem(f"{data['prompts_file']}:{n + 1}", m, i) for n, (m, i) in enumerate(zip(messages, ids))}
    trl_pad_id = ppo_vs_trl.trl_tokenizer(data["policy_dir"]).pad_token_id
    env = environment_for(cfg.env.reward_model)

    before = torch.load(record_dir / "step0.pt")
    report = [{"step": 0, **{name: weights_distance(model, before[name], before[name])
                             for name, model in (("policy", policy), ("critic", critic))}}]
    for k in range(1, args.steps + 1):
        step = torch.load(record_dir / f"step{k}.pt")
        if len(step["orders"]) != args.ppo_epochs:
            raise SystemExit(f"step {k}: {len(step['orders'])} mini-batch orders recorded, {args.ppo_epochs} expected")
        rollout = trl_rows_as_rollout(step, prompts, trl_pad_id, tokenizer)
        rewards = score_rollout(env, rollout, k - 1)  # rmkit's reward for TRL's completions
        batch = ppo.with_value_mask(training_batch(rollout, tokenizer.pad_token_id), rollout, cfg,
                                    tokenizer.pad_token_id)
        batch["values"] = ppo.batch_values(models, batch, critic_cfg)
        batch["prev_logprobs"] = batch["generation_logprobs"]
        with reference() as frozen:
            batch["reference_policy_logprobs"] = batch_logprobs(frozen, batch, cfg.policy.train_micro_batch_size,
                                                                args.temperature, cfg.policy.precision)
        batch["advantages"], batch["returns"] = ppo.compute_advantages(cfg, rewards, batch, args.kl_coef)
        width = step["responses"].shape[1]
        lengths = step["sequence_lengths"][:, None] + 1
        tokens = (torch.arange(width) < lengths).float()  # TRL's ~padding_mask
        states = (torch.arange(width) <= lengths).float()  # TRL's ~padding_mask_p1
        compared = {"values": ("values", states), "reference_logprobs": ("reference_policy_logprobs", tokens),
                    "advantages": ("advantages", tokens), "returns": ("returns", states)}
        trl_names = {"values": "values", "reference_logprobs": "ref_logprobs", "advantages": "advantages",
                     "returns": "returns"}
        differences = {"scores": float((rewards - step["scores"]).abs().max()),
                       **{name: largest_difference(at_trl_positions(batch[key], batch, width), step[trl_names[name]],
                                                   mask) for name, (key, mask) in compared.items()}}

        def trl_order(batch, loop, step_index, epoch, orders=step["orders"]):  # TRL's mini-batch order
            order = torch.tensor(orders[epoch])
            return {key: value[order] for key, value in batch.items()}

        ppo.epoch_rows, own_order = trl_order, ppo.epoch_rows
        try:
            state.step = k - 1
            metrics = ppo.update_actor_critic(cfg, critic_cfg, state, models, batch, loss_fn, value_loss_fn,
                                              args.temperature, True)
        finally:
            ppo.epoch_rows = own_order
        report.append({"step": k, "largest_difference": differences,
                       **{name: weights_distance(model, step[name], before[name])
                          for name, model in (("policy", policy), ("critic", critic))},
                       "rmkit_metrics": metrics})
        print(f"step {k}: " + ", ".join(f"{name} {value:.2e}" for name, value in differences.items())
              + "; " + ", ".join(f"{name} {report[-1][name]['distance_over_update']:.2e} of its update"
                                 for name in ("policy", "critic")), flush=True)
        before = {name: step[name] for name in ("policy", "critic")}
    env.shutdown()
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if harness.subcommand(argv, "ppo_replay.py", worker):
        return 0
    args = parse_args(argv)
    data = ppo_vs_trl.prepare(args)
    record_dir = args.work_dir / "trl" / "record"
    spec = {**ppo_vs_trl.side_spec(args, data, "trl", args.work_dir / "trl"), "record_dir": str(record_dir)}
    if args.from_record:
        trl = json.loads((args.work_dir / "trl" / "result.json").read_text())
    else:
        trl = harness.launch(__file__, spec, args.work_dir / "trl", "cpu", "TRL run", python=args.trl_python)
    steps = replay(args, data, record_dir)
    common.write_json(args.output, {
        "command": "python benchmarks/ppo_replay.py " + " ".join(argv),
        "machine": common.machine_info(), "versions": {"trl": trl["versions"]},
        "settings": {**ppo_vs_trl.settings(args), "policy": "tiny random Llama (--smoke)" if args.smoke else args.policy,
                     "reward_model": data["reward_model"]},
        "rmkit_overrides": TRL_ALGORITHM,
        "measures": "per step: the largest absolute differences from TRL's own scores, values, reference log-probs, "
                    "advantages and returns on TRL's rows (over the positions TRL uses), and per model the distance "
                    "of rmkit's weights from TRL's after the step over the norm of TRL's update in that step",
        "steps": steps})
    print(f"written: {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
