"""`rmkit train`, `rmkit eval` and `rmkit score` end to end on tiny models.

The first test runs the real `python -m rmkit train` in a subprocess; the others call the same CLI entry
point (`rmkit.cli.main`) in-process, which saves the ~10 s interpreter + torch start-up per call.
"""

import json
import subprocess

import pytest
import yaml

from rmkit.cli import main as rmkit_main
from tests.support.reward_models import run_cli, write_pairs


def in_process(capsys, *args) -> subprocess.CompletedProcess:
    """`rmkit ARGS` through the CLI entry point in this process, with its exit status and output."""
    capsys.readouterr()
    code = rmkit_main(list(args))
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


def _train(tmp_path, model, train, val, *extra, capsys=None):
    out = tmp_path / "run"
    runner = run_cli if capsys is None else (lambda *a: in_process(capsys, *a))
    result = runner("train", f"policy.model_name={model}", f"data.train_data_path={train}",
                     f"data.val_data_paths.val={val}", f"checkpointing.checkpoint_dir={out}",
                     "policy.train_global_batch_size=8", "policy.train_micro_batch_size=4",
                     "policy.max_total_sequence_length=64", "rm.val_period=2", "rm.log_period=1",
                     "logger.progress_bar=false", "checkpointing.enabled=false", *extra)
    return result, out


def test_train_eval_score_on_a_tiny_decoder(tiny_decoder, pair_files, tmp_path, capsys):
    train, val = pair_files
    result, out = _train(tmp_path, tiny_decoder, train, val, "rm.max_num_steps=3", "policy.optimizer.lr=1e-3")
    assert result.returncode == 0, result.stderr
    assert f"rmkit: train: {train}: 24 pairs (binary format); 0 truncated to 64 tokens" in result.stderr
    final = out / "final"
    for name in ("model.safetensors", "config.json", "tokenizer.json", "reward_stats.json", "rmkit_config.yaml"):
        assert (final / name).is_file(), name
    assert (out / "config.yaml").is_file() and "rmkit eval" in result.stdout and str(final) in result.stdout
    records = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train/loss" in r] == [1, 2, 3]
    val_steps = [r["step"] for r in records if "validation-val/acc" in r]
    assert val_steps == [0, 2, 3]  # at start, every val_period, at the end
    assert {"validation-val/loss", "validation-val/rewards_all_std", "validation-val/num_pairs"} <= set(records[0])
    assert (out / "logs" / "training_curves.png").is_file() and (out / "logs" / "reward_histograms.png").is_file()
    stats = json.loads((final / "reward_stats.json").read_text())
    assert stats["count"] == 16 and stats["std"] > 0

    evaluated = in_process(capsys, "eval", "--model", str(final), "--data", str(val), "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    metrics = json.loads(evaluated.stdout)
    assert metrics["num_pairs"] == 8
    assert metrics["acc"] == pytest.approx(records[-1]["validation-val/acc"])
    assert metrics["loss"] == pytest.approx(records[-1]["validation-val/loss"], abs=1e-5)

    scored = tmp_path / "scored.jsonl"
    assert in_process(capsys, "score", "--model", str(final), "--input", str(val), "--output", str(scored)).returncode == 0
    rows = [json.loads(line) for line in scored.read_text().splitlines()]
    assert len(rows) == 8 and all(isinstance(r["reward_chosen"], float) for r in rows)
    assert rows[0]["prompt"] == json.loads(val.read_text().splitlines()[0])["prompt"]
    acc = sum(r["reward_chosen"] > r["reward_rejected"] for r in rows) / 8
    assert acc == pytest.approx(metrics["acc"])


def test_minilm_trains_a_few_steps(pair_files, tmp_path, capsys):
    train, val = pair_files
    result, out = _train(tmp_path, "minilm", train, val, "rm.max_num_steps=2",
                         "rm.val_at_start=false", "logger.plots=false", "logger.tensorboard=false", capsys=capsys)
    assert result.returncode == 0, result.stderr
    assert (out / "final" / "model.safetensors").is_file()
    saved = yaml.safe_load((out / "final" / "rmkit_config.yaml").read_text())
    assert saved["policy"]["model_name"] == "minilm"


def test_regression_model_trains_in_bf16(tiny_decoder, tmp_path, capsys):
    path = tmp_path / "reg.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i}", "response": f"answer {i}", "label": [i / 10, -100 if i % 2 else 1.0]}) + "\n"
                            for i in range(12)))
    result, out = _train(tmp_path, tiny_decoder, path, path, "rm.max_num_steps=2", "policy.precision=bfloat16",
                         "policy.reward_model_cfg.reward_model_type=regression", "policy.reward_model_cfg.num_labels=2",
                         capsys=capsys)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert "validation-val/mse_1" in records[-1]
    assert yaml.safe_load((out / "final" / "rmkit_config.yaml").read_text())["policy"]["precision"] == "bfloat16"


def test_nan_loss_stops_naming_the_step(tiny_decoder, pair_files, tmp_path, capsys):
    train, val = pair_files
    result, out = _train(tmp_path, tiny_decoder, train, val, "rm.max_num_steps=5", "policy.optimizer.lr=1e30",
                         "policy.max_grad_norm=null", "policy.scheduler.name=constant", "rm.val_at_start=false",
                         capsys=capsys)
    assert result.returncode == 1
    assert "training failed: the training loss became nan at step" in result.stderr
    assert "Traceback" not in result.stderr and not (out / "final").exists()


@pytest.mark.parametrize("args, message", [
    (["policy.optimizer.lrr=1"], "config key 'policy.optimizer.lrr': unknown key"),
    (["data.train_data_path=/nonexistent.jsonl", "policy.model_name=minilm"], "/nonexistent.jsonl"),
])
def test_user_errors_exit_2_without_traceback(args, message, capsys):
    result = in_process(capsys, "train", *args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_bad_record_is_named_by_file_and_line(tiny_decoder, tmp_path, capsys):
    train = write_pairs(tmp_path / "train.jsonl", 4)
    with open(train, "a") as f:
        f.write('{"prompt": "p", "chosen": 3, "rejected": "r"}\n')
    result, _ = _train(tmp_path, tiny_decoder, train, train, "rm.max_num_steps=1", capsys=capsys)
    assert result.returncode == 2 and f"{train}:5" in result.stderr and "chosen" in result.stderr


def test_ties_in_a_ranked_file_stop_training_unless_data_keep_ties(tiny_decoder, tmp_path, capsys):
    ranked = tmp_path / "ranked.jsonl"
    # Each record ranks one reply above two equally bad ones: 2 pairs and 1 tie.
    ranked.write_text("".join(json.dumps({"context": f"What is {i} plus {i}?", "completions": [
        {"rank": 1, "completion": f"It is {2 * i}."}, {"rank": 2, "completion": "No idea."},
        {"rank": 2, "completion": f"It is {2 * i + 1}."}]}) + "\n" for i in range(4)))
    result, _ = _train(tmp_path, tiny_decoder, ranked, ranked, "rm.max_num_steps=1", capsys=capsys)
    assert result.returncode == 2 and f"{ranked}:1" in result.stderr and "data.keep_ties=true" in result.stderr
    result, out = _train(tmp_path, tiny_decoder, ranked, ranked, "rm.max_num_steps=1", "data.keep_ties=true",
                         capsys=capsys)
    assert result.returncode == 0, result.stderr
    assert f"rmkit: train: {ranked}: 8 pairs (ranked format); 0 truncated to 64 tokens, 4 skipped" in result.stderr
    rejects = [json.loads(line) for line in (out / "rejects-train.jsonl").read_text().splitlines()]
    assert len(rejects) == 4 and all(r["reason"].startswith("tie: ") for r in rejects)
