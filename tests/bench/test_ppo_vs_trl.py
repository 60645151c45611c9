"""benchmarks/ppo_vs_trl.py: the command line, the settings both configs are built from (every matched key
checked against its counterpart, rmkit's config loaded by rmkit's own loader), and, where the TRL 1.12.0
environment exists (benchmarks/setup_trl_env.sh ppo), the smoke run end to end."""

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoTokenizer

from benchmarks import grpo_vs_trl, ppo_vs_trl
from rmkit.config import load_config
from rmkit.recipes.configs import PPOConfig, PPOLoopConfig, RewardShapingConfig
from rmkit.rl.rollout import shaped_rewards
from tests.bench.test_grpo_vs_trl import numbers


def args(*argv: str):
    return ppo_vs_trl.parse_args([*argv, "--trl-python", sys.executable])


def test_command_line_checks_and_smoke_defaults(capsys):
    for bad in (["--sides", "rmkit"], ["--reward-model", "rm", "--prompts", "6", "--minibatches", "4"],
                ["--reward-model", "rm", "--sides", "trl,other"]):
        with pytest.raises(SystemExit):
            args(*bad)
    assert "--reward-model is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ppo_vs_trl.parse_args(["--smoke", "--trl-python", "/nonexistent/python"])
    assert "setup_trl_env.sh ppo" in capsys.readouterr().err
    smoke = args("--smoke", "--steps", "3")
    assert (smoke.prompts, smoke.max_new_tokens, smoke.steps) == (ppo_vs_trl.SMOKE["prompts"],
                                                                 ppo_vs_trl.SMOKE["max_new_tokens"], 3)
    assert smoke.output == smoke.work_dir / "ppo_vs_trl_smoke.json"  # a smoke run never overwrites the results
    real = args("--reward-model", "rm")
    assert real.output.parts[-3:] == ("benchmarks", "results", "ppo_vs_trl.json")


def test_an_earlier_trl_run_is_taken_only_with_the_same_settings(tmp_path, capsys):
    with pytest.raises(SystemExit):
        args("--reward-model", "rm", "--trl-from", "earlier.json")  # both sides asked for
    assert "use it with --sides rmkit" in capsys.readouterr().err
    model = tmp_path / "trl_model"
    model.mkdir()
    a = args("--reward-model", "rm", "--sides", "rmkit", "--trl-from", str(tmp_path / "earlier.json"))
    run = {"side": "trl", "model_dir": str(model), "steps_per_s": 0.005}
    earlier = {"settings": {**ppo_vs_trl.settings(a), "policy": a.policy, "held_out_prompts": a.eval_prompts},
               "runs": [run], "held_out_reward": {"trl": {"mean": -1.4}}}
    (tmp_path / "earlier.json").write_text(json.dumps(earlier))
    assert ppo_vs_trl.earlier_trl_run(a) == {"run": run, "held_out_reward": {"mean": -1.4}}
    earlier["settings"]["lr"] = 1e-5
    (tmp_path / "earlier.json").write_text(json.dumps(earlier))
    with pytest.raises(SystemExit, match="settings differ in lr"):
        ppo_vs_trl.earlier_trl_run(a)


def test_both_configs_carry_the_same_settings(tmp_path):
    a = args("--reward-model", "rm", "--prompts", "12", "--minibatches", "3", "--ppo-epochs", "4", "--steps", "5",
             "--lr", "2e-6", "--kl-coef", "0.07", "--temperature", "0.8", "--gae-lambda", "0.9", "--gamma", "0.99",
             "--cliprange", "0.3", "--cliprange-value", "0.4", "--vf-coef", "0.2", "--max-new-tokens", "40")
    spec = {**ppo_vs_trl.settings(a), "policy_dir": "policy", "reward_model": "rm", "prompts_file": "p.jsonl",
            "out_dir": str(tmp_path / "run")}
    trl, rm = ppo_vs_trl.trl_config(spec), ppo_vs_trl.rmkit_config(spec)
    ppo, policy, value, loss = rm["ppo"], rm["policy"], rm["value"], rm["loss_fn"]
    # the batch: 12 prompts x 1 completion, 3 minibatches of one micro-batch each, 4 epochs, 5 rollouts
    assert trl["per_device_train_batch_size"] * trl["gradient_accumulation_steps"] == 12
    assert ppo["num_prompts_per_step"] * ppo["num_generations_per_prompt"] == 12
    assert 12 // trl["num_mini_batches"] == policy["train_global_batch_size"] == policy["train_micro_batch_size"] == 4
    assert trl["num_ppo_epochs"] == ppo["ppo_epochs"] == 4
    assert ppo["shuffle_minibatches"]  # TRL cuts each epoch's mini-batches from a new permutation
    assert trl["total_episodes"] == ppo["max_num_steps"] * 12 == 60
    # sampling, optimizer, KL, GAE, clipping
    assert trl["response_length"] == policy["generation"]["max_new_tokens"] == 40
    assert trl["temperature"] == policy["generation"]["temperature"] == 0.8
    assert trl["learning_rate"] == policy["optimizer"]["lr"] == value["optimizer"]["lr"] == 2e-6
    assert trl["weight_decay"] == policy["optimizer"]["weight_decay"] == value["optimizer"]["weight_decay"] == 0
    assert policy["max_grad_norm"] is None and value["max_grad_norm"] is None  # TRL's PPOTrainer clips nothing
    assert (trl["kl_coef"], trl["kl_estimator"]) == (loss["reference_policy_kl_penalty"],
                                                     loss["reference_policy_kl_type"]) == (0.07, "k1")
    assert loss["use_kl_in_reward"] and ppo["kl_target"] is None  # TRL: the KL in the reward, a fixed coefficient
    assert (trl["lam"], trl["gamma"]) == (ppo["adv_estimator"]["gae_lambda"], ppo["adv_estimator"]["gae_gamma"])
    assert trl["cliprange"] == loss["ratio_clip_min"] == loss["ratio_clip_max"] == 0.3
    assert (trl["vf_coef"], trl["cliprange_value"]) == (rm["value_loss_fn"]["scale"], rm["value_loss_fn"]["cliprange"])
    assert not trl["whiten_rewards"] and ppo["adv_estimator"]["normalize_advantages"]  # TRL whitens advantages
    assert value["model_name"] is None  # the critic from the reward model, as TRL's value_model
    assert not trl["bf16"] and policy["precision"] == "float32"
    assert trl["missing_eos_penalty"] is None and not ppo["reward_shaping"]["enabled"]  # no shaping unless asked
    penalised = {**spec, **ppo_vs_trl.settings(args("--reward-model", "rm", "--missing-eos-penalty", "0.07"))}
    shaping = ppo_vs_trl.rmkit_config(penalised)["ppo"]["reward_shaping"]
    assert ppo_vs_trl.trl_config(penalised)["missing_eos_penalty"] == shaping["missing_eos_penalty"] == 0.07
    # rmkit's side, as its loader reads it: 0.07 off a completion without an EOS, nothing off one that ended
    loop = PPOLoopConfig(reward_shaping=RewardShapingConfig(**shaping))
    rollout = SimpleNamespace(completion_ids=[[0] * 48, [0] * 48], truncated=torch.tensor([True, False]))
    assert shaped_rewards(loop, torch.zeros(2), rollout).tolist() == pytest.approx([-0.07, 0.0])
    # rmkit's own loader takes the config as it is written for the run
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(rm))
    cfg = load_config(path, tree_type=PPOConfig)
    assert cfg.ppo.ppo_epochs == 4 and cfg.policy.train_global_batch_size == 4 and cfg.loss_fn.use_kl_in_reward


def test_rescore_summarises_seeds_from_the_scores_their_runs_made(shared_data, tiny_policy, tmp_path, monkeypatch,
                                                                  capsys):
    """Results files whose runs scored the same held-out prompts are summarised over the seeds without generating
    anything; on other prompts every policy directory is scored once."""
    def held(rewards):
        return {"mean": sum(rewards) / len(rewards), "std": 0.0, "rewards": rewards, "mean_tokens": 5.0}

    def results(seed: int, trl: list[float], rmkit: list[float]) -> Path:
        path = tmp_path / f"seed{seed}.json"
        path.write_text(json.dumps({
            "settings": {"policy": "smollm2", "reward_model": "/rm", "max_length": 128, "max_new_tokens": 6,
                         "held_out_prompts": len(trl)},
            "configs": {"rmkit": {"policy": {"model_name": tiny_policy}}},
            "runs": [{"side": "trl", "model_dir": f"/s{seed}/trl"}, {"side": "rmkit", "model_dir": f"/s{seed}/rmkit"}],
            "held_out_reward": {"initial": held([0.0] * len(trl)), "trl": held(trl), "rmkit": held(rmkit)}}))
        return path

    files = [results(1, [1.0, 2.0, 3.0], [0.0, 2.0, 1.0]), results(2, [0.0, 0.0, 0.0], [1.0, 1.0, 4.0])]
    scored = []
    monkeypatch.setattr(grpo_vs_trl, "held_out_reward",
                        lambda directory, *_: scored.append(directory) or held([0.5, -0.5]))
    command = ["rescore", *map(str, files), "--data-dir", str(shared_data)]
    assert ppo_vs_trl.main([*command, "--eval-prompts", "3"]) == 0
    assert scored == []
    first = json.loads(files[0].read_text())["held_out_reward_rescored"]
    assert first["prompts"] == 3 and first["rewards"]["trl"]["rewards"] == [1.0, 2.0, 3.0]
    assert first["paired_differences"]["trl - rmkit"] == {"mean": 1.0, "se": pytest.approx(1 / 3 ** 0.5)}
    # per file +1 and -2: over the two, -0.5 with standard error stdev(+1, -2) / sqrt(2) = 1.5
    assert "trl - rmkit: -0.5000 (SE 1.5000, 2 files)" in capsys.readouterr().out
    assert ppo_vs_trl.main([*command, "--eval-prompts", "2"]) == 0
    assert sorted(scored) == sorted([tiny_policy, "/s1/trl", "/s1/rmkit", "/s2/trl", "/s2/rmkit"])
    with pytest.raises(SystemExit, match="seed1.json: it holds no scores on 4 prompts"):
        ppo_vs_trl.main(["rescore", str(files[1]), "--scores-from", str(files[0]), "--eval-prompts", "4",
                         "--data-dir", str(shared_data)])


@pytest.mark.slow  # ~80 s: two training subprocesses, each importing transformers (and TRL 1.12.0)
@pytest.mark.skipif(not ppo_vs_trl.TRL_PYTHON.exists(),
                    reason="no .venv-trl112: run benchmarks/setup_trl_env.sh ppo for the end-to-end run")
def test_smoke_run_end_to_end(shared_data, tmp_path, capsys, monkeypatch):
    out = tmp_path / "ppo_vs_trl.json"
    assert ppo_vs_trl.main(["--smoke", "--threads", "1", "--data-dir", str(shared_data),
                            "--work-dir", str(tmp_path / "work"), "--output", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert [r["side"] for r in payload["runs"]] == ["trl", "rmkit"]
    assert payload["versions"]["trl"]["trl"] == "1.12.0"
    assert payload["versions"]["trl"]["torch"] == payload["versions"]["rmkit"]["torch"]
    for run in payload["runs"]:
        assert len(run["steps"]) == ppo_vs_trl.SMOKE["steps"] and run["steps_per_s"] > 0
        assert all(step[p] >= 0 for step in run["steps"] for p in ppo_vs_trl.PARTS), run["steps"]
        assert all(step["generation"] > 0 and step["reward_calculation"] > 0 and step["values"] > 0
                   and step["logprobs"] > 0 and step["training"] > 0 and step["generated_tokens"] > 0
                   for step in run["steps"]), run["steps"]
    assert payload["runs"][1]["critic"].endswith(": the reward model")
    assert "values shifted by" in (tmp_path / "work" / "rmkit" / "log.txt").read_text()  # value.calibrate_offset
    assert set(payload["held_out_reward"]) == {"initial", "trl", "rmkit"}
    assert all(len(h["rewards"]) == ppo_vs_trl.SMOKE["eval_prompts"] for h in payload["held_out_reward"].values())
    assert payload["speedup_rmkit_over_trl"] > 0
    leaves = numbers({"runs": payload["runs"], "held_out_reward": payload["held_out_reward"]})
    bad = [p for p, v in leaves if v is None or (isinstance(v, float) and not math.isfinite(v))]
    assert not bad, bad
    assert "| **rmkit / TRL steps/s** |" in ppo_vs_trl.markdown_table(payload)
    initial = load_file(tmp_path / "work" / "policy" / "model.safetensors")
    for run in payload["runs"]:  # both sides trained the same policy and saved it
        final = load_file(next(Path(run["model_dir"]).glob("*.safetensors")))
        assert final.keys() == initial.keys() and any(not torch.equal(final[k], initial[k]) for k in initial)
    # rescore: the saved policies on more held-out prompts, paired against the initial one and each other
    ran = out.read_text()
    scored = []
    real_held_out_reward = grpo_vs_trl.held_out_reward
    monkeypatch.setattr(grpo_vs_trl, "held_out_reward", lambda d, *a: scored.append(d) or real_held_out_reward(d, *a))
    assert ppo_vs_trl.main(["rescore", str(out), "--eval-prompts", "3", "--data-dir", str(shared_data)]) == 0
    rescored = json.loads(out.read_text())["held_out_reward_rescored"]
    assert rescored["prompts"] == 3 and set(rescored["rewards"]) == {"initial", "trl", "rmkit"}
    assert all(len(h["rewards"]) == 3 for h in rescored["rewards"].values())
    assert set(rescored["paired_differences"]) == {"trl - initial", "rmkit - initial", "trl - rmkit"}
    trl_minus_rmkit = [a - b for a, b in zip(rescored["rewards"]["trl"]["rewards"], rescored["rewards"]["rmkit"]["rewards"])]
    assert rescored["paired_differences"]["trl - rmkit"]["mean"] == pytest.approx(sum(trl_minus_rmkit) / 3)
    # the run's own prompts (the first 2 that fit): its scores are taken, the same as generating them again
    scored.clear()
    assert ppo_vs_trl.main(["rescore", str(out), "--eval-prompts", "2", "--data-dir", str(shared_data)]) == 0
    assert scored == []
    assert json.loads(out.read_text())["held_out_reward_rescored"]["rewards"] == payload["held_out_reward"]
    budget = ppo_vs_trl.SMOKE["max_length"] - ppo_vs_trl.SMOKE["max_new_tokens"]
    prompts = grpo_vs_trl.select_prompts(shared_data / "hh_harmless_val.jsonl",
                                         AutoTokenizer.from_pretrained(tmp_path / "work" / "policy"), 2, budget)
    fresh = real_held_out_reward(payload["runs"][1]["model_dir"], payload["settings"]["reward_model"], prompts,
                                 ppo_vs_trl.SMOKE["max_new_tokens"])
    assert fresh["rewards"] == pytest.approx(payload["held_out_reward"]["rmkit"]["rewards"], abs=1e-5)
    # several files at once (seeds of one setting): each into its own file, summarised over them
    twin = tmp_path / "twin.json"
    out.write_text(ran)
    twin.write_text(ran)
    scored.clear()
    assert ppo_vs_trl.main(["rescore", str(out), str(twin), "--eval-prompts", "3", "--data-dir", str(shared_data)]) == 0
    assert len(scored) == len(set(scored)) == 3  # the initial policy and the two sides, once each for both files
    both = [json.loads(f.read_text())["held_out_reward_rescored"] for f in (out, twin)]
    assert both[0] == both[1] and both[0]["prompts"] == 3
    assert "over the 2 files" in capsys.readouterr().out
    # --scores-from: the policies an earlier file scored on the same prompts are not scored again
    twin.write_text(ran)
    scored.clear()
    assert ppo_vs_trl.main(["rescore", str(twin), "--eval-prompts", "3", "--scores-from", str(out),
                            "--data-dir", str(shared_data)]) == 0
    assert scored == [] and json.loads(twin.read_text())["held_out_reward_rescored"] == both[0]
    with pytest.raises(SystemExit, match="holds no scores on 4 prompts"):
        ppo_vs_trl.main(["rescore", str(twin), "--eval-prompts", "4", "--scores-from", str(out),
                         "--data-dir", str(shared_data)])
    other = tmp_path / "other.json"
    payload = json.loads(out.read_text())
    payload["settings"]["reward_model"] += "-another"
    other.write_text(json.dumps(payload))
    with pytest.raises(SystemExit, match="other.json: its initial policy, reward model or lengths"):
        ppo_vs_trl.main(["rescore", str(out), str(other), "--eval-prompts", "2", "--data-dir", str(shared_data)])


@pytest.mark.slow  # ~40 s: one training subprocess
def test_rmkit_set_runs_a_variant_of_rmkits_side_and_records_it(shared_data, tmp_path):
    out = tmp_path / "variant.json"
    overrides = ["value.calibrate_offset=false", "ppo.reward_scaling.enabled=true"]
    assert ppo_vs_trl.main(["--smoke", "--sides", "rmkit", "--threads", "1", "--data-dir", str(shared_data),
                            "--work-dir", str(tmp_path / "work"), "--output", str(out),
                            *[arg for o in overrides for arg in ("--rmkit-set", o)]]) == 0
    payload = json.loads(out.read_text())
    assert payload["rmkit_overrides"] == overrides and [r["side"] for r in payload["runs"]] == ["rmkit"]
    assert "values shifted by" not in (tmp_path / "work" / "rmkit" / "log.txt").read_text()
    metrics = [json.loads(line) for line in (tmp_path / "work" / "rmkit" / "run" / "logs" / "metrics.jsonl")
               .read_text().splitlines() if "train/reward" in line]
    assert metrics and all(0 <= m["train/reward"] <= 1 for m in metrics)  # scaled into [0, 1]
    assert all(m["train/critic/value_offset"] == 0.0 for m in metrics)
