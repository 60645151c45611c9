"""The benchmark harness: its clock, its table writer, the summary maths and a scoring-throughput smoke run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import common, harness
from benchmarks.train_vs_trl import summarize

REPO_ROOT = Path(__file__).resolve().parents[2]


def tiny_bert_reward_model(directory: Path) -> Path:
    """A 2-layer, hidden-32 BERT reward model with the MiniLM tokenizer (random weights, no download)."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(common.minilm_path())
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=1,
    )
    BertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def write_pairs(path: Path, n: int) -> Path:
    rows = [
        {
            "prompt": f"Human: question {i}?\n\nAssistant:",
            "chosen": f" a helpful answer {i}",
            "rejected": " no" + " never" * (i % 5),
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_clock_counts_only_training_forwards_and_torch_optimizer_steps():
    model = torch.nn.Sequential(torch.nn.Embedding(2048, 8), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters())
    clock = harness.PhaseClock()
    clock.watch()  # every word-embedding table of the process
    for _ in range(3):
        model(torch.zeros(4, 5, dtype=torch.long)).sum().backward()
        optimizer.step()
    with torch.no_grad():  # an evaluation forward: not training work
        model.eval()
        model(torch.zeros(7, 5, dtype=torch.long))
    seconds = clock.close()
    model.train()
    model(torch.zeros(4, 5, dtype=torch.long)).sum().backward()
    optimizer.step()  # after close: the hooks are gone
    assert len(clock.step_ends) == 3 and clock.forwards == {"training": 3}
    assert clock.training_tokens == 3 * 4 * 5
    assert seconds["training"] == clock.span() > 0
    assert clock.memory["peak_rss_mib"] > 0 and "peak_gpu_mib" not in clock.memory  # no CUDA used


def test_clock_phases_on_a_hand_made_timeline(monkeypatch):
    """Each reading of the clock returns the next integer, so every phase's seconds can be counted by hand:
    hash 0-1, reference 2-3 (opened by the first forward), training 3 to the last step's end 5 (the reading at 6
    that opens generation is not training), generation 6-7."""
    readings = iter(range(100))
    monkeypatch.setattr(common, "synchronized_time", lambda: float(next(readings)))
    model = torch.nn.Sequential(torch.nn.Embedding(2048, 8), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    clock = harness.PhaseClock()
    clock.watch(before_training="reference")
    clock.timed(lambda: None, "weights_hash")()  # 0, 1
    with torch.no_grad():
        model(torch.zeros(1, 2, dtype=torch.long))  # 2: opens the reference
    for _ in range(2):
        model(torch.zeros(1, 2, dtype=torch.long)).sum().backward()  # 3: opens training (the second: no reading)
        optimizer.step()  # 4, 5
    clock.timed(lambda: None, "generation")()  # 6, 7
    assert clock.close() == {"weights_hash": 1, "reference": 1, "training": 2, "generation": 1}  # close reads 8
    assert clock.forwards == {"reference": 1, "training": 2}
    assert clock.span() == 2 and clock.span(after_step=1) == 1 and clock.span(until_step=1) == 1
    assert clock.per_step() == [{"weights_hash": 1, "reference": 1, "training": 1, "total": 4},
                                {"weights_hash": 0, "reference": 0, "training": 1, "total": 1}]
    with pytest.raises(SystemExit):
        clock.span(after_step=2)  # no step after the last one


def test_markdown_pads_short_rows_with_empty_cells():
    assert harness.markdown(["a", "b", "c"], [["x"], [1, "", 3]]) == \
        "| a | b | c |\n|---|---|---|\n| x | | |\n| 1 | | 3 |"


def test_summarize_takes_medians_ratios_and_mfu():
    runs = [
        {
            "side": side,
            "precision": "fp32",
            "pairs_per_s": pps,
            "real_tokens_per_s": tps,
            "embedded_per_real": 1.1,
            "peak_rss_mib": 100.0,
            "train_s": 10.0,
            "wall_s": 12.0,
            "accuracy/val.jsonl": 0.6,
        }
        for side, pps, tps in [
            ("trl", 1.0, 100.0),
            ("trl", 3.0, 300.0),
            ("trl", 2.0, 200.0),
            ("rmkit", 4.0, 400.0),
            ("rmkit", 6.0, 600.0),
        ]
    ]
    summary = summarize(runs, {"non_embedding_params": 1000}, {"fp32": 6e6})["fp32"]
    assert summary["trl"]["pairs_per_s"] == 2.0 and summary["trl"]["runs"] == 3
    assert summary["rmkit"]["pairs_per_s"] == 5.0  # median of an even count: the mean of the middle two
    assert summary["ratio_rmkit_over_trl"]["pairs_per_s"] == 2.5
    # MFU = 6 x 1000 params x 500 tokens/s / 6e6 FLOP/s
    assert summary["rmkit"]["mfu"] == pytest.approx(0.5)
    assert summary["rmkit"]["accuracy/val.jsonl"] == 0.6


def test_score_throughput_smoke(tmp_path):
    model_dir = tiny_bert_reward_model(tmp_path / "model")
    data = write_pairs(tmp_path / "val.jsonl", 6)
    out = tmp_path / "score.json"
    command = [
        sys.executable,
        str(REPO_ROOT / "benchmarks" / "score_throughput.py"),
        "--model",
        str(model_dir),
        "--data",
        str(data),
        "--batch-sizes",
        "1,4",
        "--batch-tokens",
        "8,64",
        "--repeats",
        "1",
        "--output",
        str(out),
    ]
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    result = json.loads(out.read_text())
    assert result["pairs"] == 6
    assert set(result["results"]) >= {
        "rmkit",
        "rmkit_bt8",
        "rmkit_bt64",
        "pipeline_bs1",
        "pipeline_bs4",
        "ratio_rmkit_over_best_pipeline",
    }
    assert result["rmkit_batch_tokens"] == 1024  # the CPU's default budget
    assert result["max_abs_reward_difference_across_batch_tokens"] < 1e-5  # the batches change, not the rewards
    # Same model, same tokens: the pipeline and rmkit agree on every untruncated reward (fp32 rounding).
    assert result["max_abs_reward_difference_vs_pipeline"] < 1e-4
    # MFU = model FLOPs / time / peak, so pairs/s over MFU is the same ceiling for every setting.
    for name in ("rmkit", "rmkit_bt8", "pipeline_bs1", "pipeline_bs4"):
        measured = result["results"][name]
        assert measured["mfu"] > 0
        assert measured["pairs_per_s"] / measured["mfu"] == pytest.approx(result["ceiling_pairs_per_s"], rel=1e-9)


@pytest.mark.slow
def test_train_vs_trl_smoke_both_sides(tmp_path):
    """Both trainers on 16 pairs with a tiny BERT: the harness runs end to end and fills every field."""
    backbone = tiny_bert_reward_model(tmp_path / "backbone")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    write_pairs(data_dir / "hh_harmless_train.jsonl", 16)
    write_pairs(data_dir / "hh_harmless_val.jsonl", 8)
    out = tmp_path / "bench.json"
    command = [
        sys.executable, str(REPO_ROOT / "benchmarks" / "train_vs_trl.py"), "--backbone", str(backbone),
        "--data-dir", str(data_dir), "--eval-files", "hh_harmless_val.jsonl", "--batch-size", "8",
        "--precision", "fp32", "--work-dir", str(tmp_path / "work"), "--output", str(out),
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    result = json.loads(out.read_text())
    row = result["summary"]["fp32"]
    for side in ("trl", "rmkit"):
        assert row[side]["pairs_per_s"] > 0
        assert row[side]["embedded_per_real"] >= 1  # an encoder: padding, nothing shared
        assert 0 <= row[side]["accuracy/hh_harmless_val.jsonl"] <= 1
    assert {r["optimizer_steps"] for r in result["runs"]} == {2}  # 16 pairs / 8 per step, one epoch
    assert row["ratio_rmkit_over_trl"]["pairs_per_s"] > 0


def test_a_head_seed_gives_every_seed_one_starting_model(tmp_path):
    """`--head-seed`: the runs of seeds 1 and 2 start from the same score head (WARM's shared initialization);
    without it each seed draws its own."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer, BertModel

    from benchmarks import train_vs_trl

    backbone = tiny_bert_reward_model(tmp_path / "classifier")  # a backbone without a score head, as MiniLM is:
    BertModel(AutoConfig.from_pretrained(backbone)).save_pretrained(tmp_path / "backbone")  # its head is drawn fresh
    AutoTokenizer.from_pretrained(backbone).save_pretrained(tmp_path / "backbone")
    backbone = tmp_path / "backbone"
    write_pairs(tmp_path / "train.jsonl", 4)

    def head(seed: int, *extra: str) -> torch.Tensor:
        args = train_vs_trl.parse_args(["--backbone", str(backbone), "--train-file", str(tmp_path / "train.jsonl"),
                                        "--eval-pairs", "0", "--seed", str(seed), *extra,
                                        "--work-dir", str(tmp_path / f"seed-{seed}{''.join(extra)}")])
        model_dir = train_vs_trl.prepare(args)["model_dir"]
        return load_file(Path(model_dir) / "model.safetensors")["classifier.weight"]

    assert torch.equal(head(1, "--head-seed", "7"), head(2, "--head-seed", "7"))
    assert not torch.equal(head(1), head(2))


def test_recipe_sweep_trains_each_setting_and_scores_it_on_both_held_out_files(tmp_path):
    from benchmarks import recipe_sweep

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    for name, n in (("hh_harmless_train.jsonl", 12), ("hh_harmless_val.jsonl", 6), ("pandalm_val.jsonl", 4)):
        write_pairs(data_dir / name, n)
    model = tiny_bert_reward_model(tmp_path / "tiny")
    output = tmp_path / "sweep.json"
    status = recipe_sweep.main([
        "--settings", "recipe,epochs1_lr1e-4", "--pairs", "8", "--data-dir", str(data_dir),
        "--work-dir", str(tmp_path / "work"), "--output", str(output), "--threads", "1",
        "--override", f"policy.model_name={model}", "--override", "policy.train_global_batch_size=4",
        "--override", "policy.train_micro_batch_size=4",
    ])  # fmt: skip
    assert status == 0
    payload = json.loads(output.read_text())
    assert list(payload["runs"]) == ["recipe", "epochs1_lr1e-4"]
    assert payload["runs"]["epochs1_lr1e-4"]["overrides"] == ["rm.max_num_epochs=1", "policy.optimizer.lr=1e-4"]
    for run in payload["runs"].values():
        assert set(run["accuracy"]) == {"hh_harmless_val.jsonl", "pandalm_val.jsonl"}
        assert all(0.0 <= acc <= 1.0 for acc in run["accuracy"].values())
        assert (Path(run["model_dir"]) / "model.safetensors").is_file()
    # 8 pairs in global batches of 4: configs/rm.yaml's two epochs, and one
    assert "4 steps" in payload["runs"]["recipe"]["train_rate"]
    assert "2 steps" in payload["runs"]["epochs1_lr1e-4"]["train_rate"]
    assert "| epochs1_lr1e-4 |" in recipe_sweep.markdown_table(payload)


def test_quality_paired_comparison_against_hand_computed_values():
    from benchmarks.quality_vs_trl import paired, parse_variant

    # Two seeds, four pairs. Per pair, the fraction of seeds right: mine [1, .5, 0, 1], theirs [.5, .5, .5, 0];
    # differences [.5, 0, -.5, 1]: mean .25, sample std sqrt(((.25)^2 + (.25)^2 + (.75)^2 + (.75)^2) / 3).
    result = paired([[1, 1, 0, 1], [1, 0, 0, 1]], [[1, 0, 1, 0], [0, 1, 0, 0]])
    assert result["mean_difference"] == pytest.approx(0.25)
    assert result["standard_error"] == pytest.approx((1.25 / 3) ** 0.5 / 2)
    assert result["not_below_by_more_than_se"]
    assert parse_variant("random:data.batching=random+rm.seed=3") == ("random", "rmkit", ["data.batching=random", "rm.seed=3"])


def test_every_workload_trains_and_scores_every_pair(tmp_path):
    """A study's run reads all of its training file and scored files, whatever train_vs_trl's workload default
    (SmolLM2's: the first 32 training pairs, 100 scored; a SmolLM2 study once trained on 32 of 2,000 pairs)."""
    from benchmarks.quality_vs_trl import parse_args, train_vs_trl_args

    for workload in ("minilm", "smollm2"):
        study = parse_args(["--workload", workload, "--work-dir", str(tmp_path)])
        run = train_vs_trl_args(study, tmp_path / "train.jsonl", tmp_path, ["dev.jsonl"], 1, ("rmkit", "rmkit", []))
        assert run.workload == workload and run.pairs >= 11066 and run.eval_pairs >= 11066


def test_the_device_reaches_every_run(tmp_path):
    """`--device cuda` on a study or a curve reaches train_vs_trl.py's run (a CPU curve does not reuse a GPU curve's
    points: test_learning_curve_nested_points_and_the_png)."""
    from benchmarks import learning_curve
    from benchmarks.quality_vs_trl import parse_args, train_vs_trl_args

    for device in ("cpu", "cuda"):
        study = parse_args(["--device", device, "--work-dir", str(tmp_path)])
        run = train_vs_trl_args(study, tmp_path / "train.jsonl", tmp_path, ["dev.jsonl"], 1, ("rmkit", "rmkit", []))
        assert run.device == device
        curve = learning_curve.parse_args(["--device", device, "--work-dir", str(tmp_path)])
        assert learning_curve.study_args(curve, 500).device == device


def test_two_studies_compare_pair_by_pair_on_their_common_seeds():
    """`compare`: OTHER minus BASE per variant and file, over the seeds both hold, clustered by prompt; studies of
    different draws are refused."""
    from benchmarks.quality_vs_trl import compare, paired

    facts = {"dev.jsonl": {"clusters": [0, 0, 1, 1], "chosen_longer": [1, 0, 1, 0]}}

    def study(correct_by_seed: dict, max_length: int) -> dict:
        runs = [{"variant": "rmkit", "seed": s, "correct/dev.jsonl": c} for s, c in correct_by_seed.items()]
        return {"split": {"seed": 7}, "files": ["dev.jsonl"], "pair_facts": facts, "setting": {"max_length": max_length},
                "summary": {"rmkit": {}}, "runs": runs}

    base = study({1: [1, 0, 0, 1], 2: [1, 1, 0, 0], 3: [0, 0, 0, 0]}, 256)
    other = study({1: [1, 1, 0, 1], 2: [1, 1, 1, 0]}, 512)  # seed 3 missing: compared on seeds 1 and 2
    result = compare(base, other)
    expected = paired([[1, 1, 0, 1], [1, 1, 1, 0]], [[1, 0, 0, 1], [1, 1, 0, 0]], [0, 0, 1, 1])
    assert result["variants"]["rmkit"]["seeds"] == [1, 2] and result["variants"]["rmkit"]["dev.jsonl"] == expected
    assert expected["mean_difference"] == pytest.approx(0.25)
    with pytest.raises(SystemExit, match="differ in 'split'"):
        compare(base, {**other, "split": {"seed": 8}})
    # Across draws (a study on more pairs): each side is the mean over all its own seeds.
    bigger = study({42: [1, 1, 1, 1]}, 512)
    result = compare(base, {**bigger, "split": {"seed": 8}}, across_draws=True)
    row = result["variants"]["rmkit"]
    assert row["seeds"] == {"base": [1, 2, 3], "other": [42]}
    assert row["dev.jsonl"] == paired([[1, 1, 1, 1]], [[1, 0, 0, 1], [1, 1, 0, 0], [0, 0, 0, 0]], [0, 0, 1, 1])
    assert row["dev.jsonl"]["mean_difference"] == pytest.approx(1 - 4 / 12)
    with pytest.raises(SystemExit, match="differ in 'pair_facts'"):
        compare(base, {**bigger, "pair_facts": {}}, across_draws=True)


def test_an_arm_of_overrides_is_compared_with_rmkits_default_pair_by_pair():
    """`summarize`: an override variant gets `vs_rmkit` (the defaults' rule reads it) beside `vs_trl`, over the seeds
    both hold, clustered by prompt; a study of rmkit's arms alone (no TRL) has no `vs_trl`."""
    from benchmarks.quality_vs_trl import markdown_table, paired, summarize

    facts = {"dev.jsonl": {"clusters": [0, 0, 1, 1], "chosen_longer": [1, 0, 1, 0]}}

    def run(variant: str, seed: int, correct: list[int]) -> dict:
        return {"variant": variant, "seed": seed, "pairs_per_s": 2.0 if variant == "lr" else 4.0,
                "accuracy/dev.jsonl": sum(correct) / 4, "correct/dev.jsonl": correct}

    runs = [run("rmkit", 1, [1, 0, 0, 1]), run("rmkit", 2, [1, 1, 0, 0]),
            run("lr", 1, [1, 1, 0, 1]), run("lr", 2, [1, 1, 1, 0]), run("lr", 3, [0, 0, 0, 0])]
    summary = summarize(runs, ["dev.jsonl"], facts)
    arm = summary["lr"]["vs_rmkit"]
    assert arm["dev.jsonl"] == paired([[1, 1, 0, 1], [1, 1, 1, 0]], [[1, 0, 0, 1], [1, 1, 0, 0]], [0, 0, 1, 1])
    # per pair, seeds right: arm [1, 1, .5, .5], default [1, .5, 0, .5]: differences [0, .5, .5, 0]
    assert arm["dev.jsonl"]["mean_difference"] == pytest.approx(0.25)
    assert arm["seeds"] == [1, 2] and arm["speed_ratio"] == pytest.approx(0.5)
    assert "vs_trl" not in summary["lr"] and "vs_rmkit" not in summary["rmkit"]
    table = markdown_table({"files": ["dev.jsonl"], "summary": summary})
    assert "| lr | 1,2 | +25.0% (" in table


def test_reused_runs_are_matched_by_variant_overrides_seed_and_files(tmp_path):
    from benchmarks.quality_vs_trl import reusable_runs

    partial = tmp_path / "study.partial.jsonl"
    runs = [{"variant": "trl", "overrides": [], "seed": 1, "correct/dev.jsonl": [1, 0]},
            {"variant": "w4", "overrides": ["data.length_group_window=4"], "seed": 1, "correct/dev.jsonl": [0, 0]},
            {"variant": "rmkit", "overrides": [], "seed": 2, "correct/other.jsonl": [1]}]  # not scored on dev
    partial.write_text("".join(json.dumps(r) + "\n" for r in runs))
    found = reusable_runs([partial], ["dev.jsonl"])
    assert set(found) == {("trl", (), 1), ("w4", ("data.length_group_window=4",), 1)}
    assert found[("trl", (), 1)]["reused_from"] == str(partial)
    assert reusable_runs([], ["dev.jsonl"]) == {}
    # Several files: their runs together, a later file's run replacing an earlier one's.
    later = tmp_path / "later.json"
    later.write_text(json.dumps({"setting": {"epochs": 1}, "runs": [
        {"variant": "trl", "overrides": [], "seed": 1, "correct/dev.jsonl": [1, 1]},
        {"variant": "trl", "overrides": [], "seed": 2, "correct/dev.jsonl": [0, 1]}]}))
    found = reusable_runs([partial, later], ["dev.jsonl"], {"epochs": 1})
    assert set(found) == {("trl", (), 1), ("trl", (), 2), ("w4", ("data.length_group_window=4",), 1)}
    assert found[("trl", (), 1)]["correct/dev.jsonl"] == [1, 1] and found[("trl", (), 1)]["reused_from"] == str(later)
    with pytest.raises(SystemExit, match="--reuse"):
        reusable_runs([partial, later], ["dev.jsonl"], {"epochs": 2})


@pytest.mark.slow
def test_quality_vs_trl_smoke_two_seeds(tmp_path):
    """Both trainers and an override variant, two seeds, on a tiny BERT: the dev split is carved from the
    training file and disjoint from what is trained on, and every summary field is filled."""
    from benchmarks import quality_vs_trl

    backbone = tiny_bert_reward_model(tmp_path / "backbone")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    write_pairs(data_dir / "hh_harmless_train.jsonl", 24)
    out = tmp_path / "quality.json"
    quality_vs_trl.main(["--study", "hh", "--backbone", str(backbone), "--data-dir", str(data_dir), "--dev-pairs", "8",
                         "--seeds", "1,2", "--epochs", "1", "--batch-size", "8", "--threads", "1",
                         "--variants", "trl,rmkit,random:data.batching=random",
                         "--work-dir", str(tmp_path / "work"), "--output", str(out)])
    train = (tmp_path / "work" / "train_rest.jsonl").read_text().splitlines()
    dev = (tmp_path / "work" / "eval" / "dev.jsonl").read_text().splitlines()
    assert len(train) == 16 and len(dev) == 8 and not set(train) & set(dev)
    result = json.loads(out.read_text())
    assert set(result["summary"]) == {"trl", "rmkit", "random"}
    for label in ("rmkit", "random"):
        row = result["summary"][label]
        assert len(row["dev.jsonl"]["accuracy"]) == 2 and "mean_difference" in row["vs_trl"]["dev.jsonl"]
    assert {len(r["correct/dev.jsonl"]) for r in result["runs"]} == {8}
    assert {r["optimizer_steps"] for r in result["runs"]} == {2}
    # A second study reusing the first: only the new variant trains; the others come back unchanged.
    again = tmp_path / "again.json"
    quality_vs_trl.main(["--study", "hh", "--backbone", str(backbone), "--data-dir", str(data_dir), "--dev-pairs", "8",
                         "--seeds", "1,2", "--epochs", "1", "--batch-size", "8", "--threads", "1",
                         "--variants", "trl,rmkit,window:data.length_group_window=2", "--reuse", str(out),
                         "--work-dir", str(tmp_path / "work"), "--output", str(again)])
    runs = json.loads(again.read_text())["runs"]
    assert [r["variant"] for r in runs if "reused_from" in r] == ["trl", "rmkit", "trl", "rmkit"]
    assert [r["variant"] for r in runs if "reused_from" not in r] == ["window", "window"]
    first = {(r["variant"], r["seed"]): r for r in result["runs"]}
    for run in runs[:2]:
        assert run["correct/dev.jsonl"] == first[(run["variant"], run["seed"])]["correct/dev.jsonl"]


def test_clustered_standard_error_against_hand_computed_values():
    from benchmarks.quality_vs_trl import length_controlled, paired

    # One seed each side, five pairs on two prompts (0, 0, 0, 1, 1). Differences [1, 0, 1, -1, 0]: mean .2.
    # Centred sums per prompt: (.8 - .2 + .8) = 1.4 and (-1.2 - .2) = -1.4; G = 2 prompts:
    # SE = sqrt(2/1 * (1.4^2 + 1.4^2)) / 5 = sqrt(7.84) / 5 = .56.
    result = paired([[1, 1, 1, 0, 1]], [[0, 1, 0, 1, 1]], clusters=[0, 0, 0, 1, 1])
    assert result["mean_difference"] == pytest.approx(0.2)
    assert result["standard_error"] == pytest.approx(0.56)
    assert result["clusters"] == 2
    # One pair per prompt: the clustered SE is the plain one (stdev / sqrt(n)).
    plain = paired([[1, 1, 0, 1], [1, 0, 0, 1]], [[1, 0, 1, 0], [0, 1, 0, 0]])
    singletons = paired([[1, 1, 0, 1], [1, 0, 0, 1]], [[1, 0, 1, 0], [0, 1, 0, 0]], clusters=[3, 1, 2, 0])
    assert singletons["standard_error"] == pytest.approx(plain["standard_error"])
    # Seeds right per pair [1, .5, 0, 1]; the chosen reply is longer in pairs 0 and 2.
    split = length_controlled([[1, 1, 0, 1], [1, 0, 0, 1]], [1, 0, 1, 0])
    assert split == {"chosen_longer": 0.5, "n_longer": 2, "chosen_not_longer": 0.75, "n_not_longer": 2}


@pytest.mark.slow
def test_quality_vs_trl_pref_study_clusters_by_prompt_and_reports_the_length_baseline(tmp_path):
    """The pref study on a tiny BERT: a drawn training subset, the dev file and the two out-of-domain files
    linked (not copied), per-file prompt clusters and the length-only baseline, the models kept."""
    from benchmarks import quality_vs_trl

    backbone = tiny_bert_reward_model(tmp_path / "backbone")
    data_dir = tmp_path / "data"
    (data_dir / "pref").mkdir(parents=True)
    write_pairs(data_dir / "pref" / "alpacaeval_train.jsonl", 24)
    # dev: three prompts, 2 + 2 + 1 pairs; the chosen reply is the longer one in 3 of 5
    dev = [{"prompt": f"q{i // 2}", "chosen": "yes" * (1 + i % 3), "rejected": "no" * 2} for i in range(5)]
    (data_dir / "pref" / "alpacaeval_dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dev))
    write_pairs(data_dir / "hh_harmless_val.jsonl", 4)
    write_pairs(data_dir / "pandalm_val.jsonl", 4)
    out, kept = tmp_path / "quality.json", tmp_path / "kept"
    quality_vs_trl.main(["--backbone", str(backbone), "--data-dir", str(data_dir), "--train-pairs", "16",
                         "--seeds", "1,2", "--epochs", "1", "--batch-size", "8", "--threads", "1",
                         "--variants", "trl,rmkit", "--keep-models", str(kept),
                         "--work-dir", str(tmp_path / "work"), "--output", str(out)])
    train = (tmp_path / "work" / "train.jsonl").read_text().splitlines()
    assert len(train) == 16 and set(train) <= set((data_dir / "pref" / "alpacaeval_train.jsonl").read_text().splitlines())
    assert (tmp_path / "work" / "eval" / "alpacaeval_dev.jsonl").is_symlink()
    result = json.loads(out.read_text())
    assert result["files"] == ["alpacaeval_dev.jsonl", "hh_harmless_val.jsonl", "pandalm_val.jsonl"]
    assert result["pair_facts"]["alpacaeval_dev.jsonl"] == {"clusters": [0, 0, 1, 1, 2], "chosen_longer": [0, 1, 1, 0, 1]}
    assert result["length_only"]["alpacaeval_dev.jsonl"] == pytest.approx(0.6)
    row = result["summary"]["rmkit"]
    assert row["vs_trl"]["alpacaeval_dev.jsonl"]["clusters"] == 3
    assert row["alpacaeval_dev.jsonl"]["length_controlled"]["n_longer"] == 3
    assert result["setting"]["train_pairs"] == 16 and {r["optimizer_steps"] for r in result["runs"]} == {2}
    assert {p.name for p in kept.iterdir()} == {"trl-seed1", "rmkit-seed1", "trl-seed2", "rmkit-seed2"}
    assert (kept / "rmkit-seed1" / "config.json").is_file()
    assert "vs length-only 60.0%" in quality_vs_trl.markdown_table(result)
    # The seeds' weight average against each seed and their ensemble, on the same files (merge_quality.py).
    from benchmarks import merge_quality

    merged_out = tmp_path / "merge.json"
    # A --group names its members (WARM's members differ in hyperparameters): here the same two folders.
    merge_quality.main(["--models", str(kept), "--variants", "rmkit", "--group", "both=rmkit-seed2+rmkit-seed1",
                        "--data-dir", str(data_dir), "--threads", "1",
                        "--work-dir", str(tmp_path / "merges"), "--output", str(merged_out)])
    payload = json.loads(merged_out.read_text())
    merged = payload["variants"]["rmkit"]
    assert merged["members"] == ["seed 1", "seed 2"] and len(merged["merge_record"]["models"]) == 2
    dev = merged["files"]["alpacaeval_dev.jsonl"]
    assert set(dev["accuracy"]) == {"seed 1", "seed 2", "merge", "ensemble"}
    assert dev["accuracy"]["seed 1"] == pytest.approx(
        json.loads(out.read_text())["summary"]["rmkit"]["alpacaeval_dev.jsonl"]["accuracy"][0])  # same scoring
    assert dev["merge_vs_members_mean"]["clusters"] == 3 and dev["length_only"] == pytest.approx(0.6)
    group = payload["variants"]["both"]
    assert group["members"] == ["rmkit-seed2", "rmkit-seed1"]
    group_dev = group["files"]["alpacaeval_dev.jsonl"]
    assert group_dev["accuracy"]["rmkit-seed1"] == dev["accuracy"]["seed 1"]
    assert group_dev["accuracy"]["merge"] == dev["accuracy"]["merge"]  # the same two models, averaged equally
    assert "| both | alpacaeval_dev |" in merge_quality.markdown_table(payload)
    with pytest.raises(SystemExit, match="has no folder rmkit-seed9"):
        merge_quality.main(["--models", str(kept), "--variants", "", "--group", "x=rmkit-seed1+rmkit-seed9",
                            "--data-dir", str(data_dir), "--output", str(tmp_path / "m2.json")])
    with pytest.raises(SystemExit, match="two or more folders"):
        merge_quality.main(["--models", str(kept), "--group", "x=rmkit-seed1", "--output", str(tmp_path / "m3.json")])
    with pytest.raises(SystemExit, match="already a variant's"):  # it would replace the variant's results
        merge_quality.parse_args(["--models", str(kept), "--group", "rmkit=rmkit-seed1+rmkit-seed2"])
    # A study with other training pairs cannot reuse this one's runs.
    with pytest.raises(SystemExit, match="--reuse"):
        quality_vs_trl.main(["--backbone", str(backbone), "--data-dir", str(data_dir), "--train-pairs", "8",
                             "--seeds", "1", "--epochs", "1", "--batch-size", "8", "--threads", "1",
                             "--variants", "trl,rmkit", "--reuse", str(out),
                             "--work-dir", str(tmp_path / "work2"), "--output", str(tmp_path / "q2.json")])


@pytest.mark.slow
def test_learning_curve_nested_points_and_the_png(tmp_path):
    """Two points on a tiny BERT: nested training draws, per point the dev figures against the length-only
    baseline, a PNG; a second curve takes both points from the first instead of training them again."""
    from benchmarks import learning_curve

    backbone = tiny_bert_reward_model(tmp_path / "backbone")
    data_dir = tmp_path / "data"
    (data_dir / "pref").mkdir(parents=True)
    write_pairs(data_dir / "pref" / "alpacaeval_train.jsonl", 24)
    for name in ("pref/alpacaeval_dev.jsonl", "hh_harmless_val.jsonl", "pandalm_val.jsonl"):
        write_pairs(data_dir / name, 4)
    common_args = ["--backbone", str(backbone), "--data-dir", str(data_dir), "--epochs", "1", "--batch-size", "8",
                   "--threads", "1", "--work-dir", str(tmp_path / "work")]
    out = tmp_path / "curve.json"
    learning_curve.main([*common_args, "--sizes", "8,16", "--output", str(out)])
    small = (tmp_path / "work" / "n8" / "train.jsonl").read_text().splitlines()
    large = (tmp_path / "work" / "n16" / "train.jsonl").read_text().splitlines()
    assert len(small) == 8 and len(large) == 16 and set(small) <= set(large)
    curve = json.loads(out.read_text())
    assert [p["train_pairs"] for p in curve["points"]] == [8, 16]
    dev = curve["points"][1]["alpacaeval_dev.jsonl"]
    assert "vs_length_only" in dev and dev["length_controlled"]["n_longer"] + dev["length_controlled"]["n_not_longer"] == 4
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = tmp_path / "again.json"
    learning_curve.main([*common_args, "--sizes", "16,8", "--reuse", str(out), "--output", str(again)])
    runs = [json.loads(line) for line in again.with_suffix(".partial.jsonl").read_text().splitlines()]
    assert [r["reused_from"] for r in runs] == [str(out), str(out)]
    assert json.loads(again.read_text())["points"][0]["alpacaeval_dev.jsonl"] == dev
    on_gpu = tmp_path / "on_gpu.partial.jsonl"  # the same runs, as a GPU curve records them
    on_gpu.write_text("".join(json.dumps({**r, "setting": {**r["setting"], "device": "cuda"}}) + "\n" for r in runs))
    third = tmp_path / "third.json"
    learning_curve.main([*common_args, "--sizes", "8", "--reuse", str(on_gpu), "--output", str(third)])
    assert "reused_from" not in json.loads(third.with_suffix(".partial.jsonl").read_text())
