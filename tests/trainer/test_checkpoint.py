"""Checkpoints: exact round trip, atomic writes under a real SIGKILL, corruption fallback, top-k retention."""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from transformers import AutoModelForSequenceClassification, LlamaConfig, LlamaForSequenceClassification

from rmkit.trainer.checkpointing import files as ckpt

REPO_ROOT = Path(__file__).resolve().parents[2]


def tiny_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=0,
    )  # fmt: skip
    return LlamaForSequenceClassification(config)


def make_optim(model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3))
    return optimizer, scheduler


def train_step(model, optimizer, scheduler):
    ids = torch.randint(1, 128, (4, 6))  # consumes the torch RNG, so RNG restore matters
    loss = model(input_ids=ids).logits.square().mean()
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def test_sharded_layout_round_trip_in_one_process(tmp_path):
    # The sharded layout (DCP files) without a process group: what a 2 -> 1 resume reads, bitwise here.
    from rmkit.trainer.checkpointing.sharded import load_sharded_checkpoint, save_sharded_checkpoint

    model = tiny_model()
    optimizer, scheduler = make_optim(model)
    train_step(model, optimizer, scheduler)
    path = save_sharded_checkpoint(tmp_path, 1, model=model, optimizer=optimizer, scheduler=scheduler,
                                   trainer_state={"epoch": 0}, metrics={"loss": 1.0})
    manifest = ckpt.read_manifest(path)
    assert manifest["layout"] == "sharded" and ".metadata" in manifest["files"] and not (path / "model.safetensors").exists()
    full = ckpt.save_checkpoint(tmp_path, 2, model=model, optimizer=optimizer, scheduler=scheduler)
    train_step(model, optimizer, scheduler)
    for source in (path, full):  # a full checkpoint loads through the same function (parameters by name)
        resumed = tiny_model(seed=1)
        opt2, sched2 = make_optim(resumed)
        state = load_sharded_checkpoint(source, model=resumed, optimizer=opt2, scheduler=sched2)
        ckpt.restore_rng_state(state["rng"][0])
        train_step(resumed, opt2, sched2)
        assert_same_weights(model, resumed)
    with pytest.raises(ValueError, match="is sharded .* load it with rmkit.trainer.checkpointing.sharded"):
        ckpt.load_checkpoint(path, model=tiny_model())
    shard = next(path.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-10])
    assert "truncated" in ckpt.verify_checkpoint(path)


def test_round_trip_then_training_continues_bitwise(tmp_path):
    model = tiny_model()
    optimizer, scheduler = make_optim(model)
    for _ in range(2):
        train_step(model, optimizer, scheduler)
    path = ckpt.save_checkpoint(
        tmp_path, 2, model=model, optimizer=optimizer, scheduler=scheduler,
        trainer_state={"epoch": 1, "sampler": {"position": 5, "order": [3, 1, 2]}},
        config={"rm": {"seed": 3}, "betas": (0.9, 0.99)}, metrics={"val:validation-default_loss": 0.5, "train/loss": torch.tensor(0.7)},
    )  # fmt: skip
    assert path == tmp_path / "step_2"
    assert ckpt.verify_checkpoint(path) is None
    for _ in range(2):  # the uninterrupted run goes on
        train_step(model, optimizer, scheduler)

    resumed = tiny_model(seed=1)  # different initial weights: everything must come from the checkpoint
    opt2, sched2 = make_optim(resumed)
    torch.manual_seed(123)  # scramble the RNG; the checkpoint's state must win
    state = ckpt.load_checkpoint(path, model=resumed, optimizer=opt2, scheduler=sched2)
    assert state["step"] == 2 and state["epoch"] == 1 and state["sampler"]["order"] == [3, 1, 2]
    ckpt.restore_rng_state(state["rng"][0])
    for _ in range(2):
        train_step(resumed, opt2, sched2)
    assert_same_weights(model, resumed)
    assert sched2.state_dict()["last_epoch"] == scheduler.state_dict()["last_epoch"] == 4
    metrics = json.loads((path / "metrics.json").read_text())
    assert metrics == {"train/loss": pytest.approx(0.7), "val:validation-default_loss": 0.5}
    assert yaml.safe_load((path / "config.yaml").read_text()) == {"rm": {"seed": 3}, "betas": [0.9, 0.99]}


def test_step_directory_is_a_model_directory(tmp_path):
    from rmkit.models import load_reward_model
    from tests.support.tiny import make_tiny_decoder

    source = make_tiny_decoder(tmp_path / "source")
    model, tokenizer = load_reward_model(source)
    path = ckpt.save_checkpoint(tmp_path / "ckpt", 1, model=model, tokenizer=tokenizer)
    assert (
        ckpt.verify_checkpoint(path) is None
        and "tokenizer.json" in json.loads((path / "manifest.json").read_text())["files"]
    )
    assert_same_weights(model, AutoModelForSequenceClassification.from_pretrained(path))
    reloaded, reloaded_tokenizer = load_reward_model(path)  # what rmkit eval / score / serve do
    assert_same_weights(model, reloaded)
    assert reloaded_tokenizer("tell me about maps").input_ids == tokenizer("tell me about maps").input_ids


def test_lora_model_round_trip_without_config_json(tmp_path):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(tiny_model(), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    path = ckpt.save_checkpoint(tmp_path, 1, model=model)
    assert not (
        path / "config.json"
    ).exists()  # base-model config + adapter keys would mislead from_pretrained
    other = peft.get_peft_model(tiny_model(seed=1), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    ckpt.load_checkpoint(path, model=other)
    assert_same_weights(model, other)


def test_rng_state_round_trip():
    state = ckpt.capture_rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(3))
    ckpt.restore_rng_state(state)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert expected[:2] == again[:2] and torch.equal(expected[2], again[2])


def test_exception_mid_write_leaves_previous_checkpoint(tmp_path, monkeypatch):
    model = tiny_model()
    ckpt.save_checkpoint(tmp_path, 1, model=model, metrics={"loss": 1.0})

    def broken_save(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save_checkpoint(tmp_path, 2, model=model)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"]
    assert ckpt.latest_valid_checkpoint(tmp_path) == tmp_path / "step_1"


def test_sigkill_mid_write_leaves_previous_checkpoint(tmp_path):
    # A real process killed while writing step_2 (after its weights, before the manifest and rename).
    script = textwrap.dedent(f"""
        import os, signal, torch
        from rmkit.trainer.checkpointing import files as ckpt
        model = torch.nn.Linear(64, 64)  # plain torch: no transformers import, a quick subprocess
        ckpt.save_checkpoint({str(tmp_path)!r}, 1, model=model)
        def die(*a, **k):
            os.kill(os.getpid(), signal.SIGKILL)
        ckpt.torch.save = die
        ckpt.save_checkpoint({str(tmp_path)!r}, 2, model=model)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=REPO_ROOT, capture_output=True, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[0].startswith(ckpt.TMP_PREFIX) and names[1:] == ["step_1"]  # the half-written one is hidden
    assert ckpt.latest_valid_checkpoint(tmp_path) == tmp_path / "step_1"
    ckpt.save_checkpoint(tmp_path, 2, model=torch.nn.Linear(64, 64))  # the next save sweeps the leftover away
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1", "step_2"]


def _two_checkpoints(tmp_path):
    model = tiny_model()
    ckpt.save_checkpoint(tmp_path, 1, model=model)
    ckpt.save_checkpoint(tmp_path, 2, model=model)
    return tmp_path / "step_2"


def truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage,reason",
    [
        (lambda p: truncate(p / "model.safetensors"), "truncated"),
        (lambda p: flip_byte(p / "trainer_state.pt"), "sha256"),  # same size, different bytes
        (lambda p: (p / "manifest.json").unlink(), "no manifest"),
        (lambda p: (p / "trainer_state.pt").unlink(), "missing"),
        (lambda p: (p / "manifest.json").write_text("{not json"), "unreadable"),
    ],
)
def test_damaged_latest_checkpoint_falls_back_with_warning(tmp_path, damage, reason):
    damage(_two_checkpoints(tmp_path))
    warnings = []
    assert ckpt.latest_valid_checkpoint(tmp_path, warn=warnings.append) == tmp_path / "step_1"
    assert len(warnings) == 1 and "step 2" in warnings[0] and reason in warnings[0]
    with pytest.raises(ValueError, match="unusable"):
        ckpt.load_checkpoint(tmp_path / "step_2", model=tiny_model())


def test_default_warning_goes_to_stderr(tmp_path, capsys):
    truncate(_two_checkpoints(tmp_path) / "model.safetensors")
    assert ckpt.latest_valid_checkpoint(tmp_path) == tmp_path / "step_1"
    assert "rmkit: warning: checkpoint" in capsys.readouterr().err


def test_no_valid_checkpoint(tmp_path):
    assert ckpt.latest_valid_checkpoint(tmp_path / "absent") is None
    (tmp_path / "step_3").mkdir()
    (tmp_path / "final").mkdir()
    assert ckpt.latest_valid_checkpoint(tmp_path, warn=lambda m: None) is None


def test_saving_the_same_step_again_replaces_it(tmp_path):
    ckpt.save_checkpoint(tmp_path, 4, model=tiny_model(0), metrics={"loss": 1.0})
    ckpt.save_checkpoint(tmp_path, 4, model=tiny_model(1), metrics={"loss": 2.0})
    assert [p.name for p in tmp_path.iterdir()] == ["step_4"]
    assert ckpt.read_metrics(tmp_path / "step_4") == {"loss": 2.0}
    assert ckpt.verify_checkpoint(tmp_path / "step_4") is None


def _fake_checkpoints(tmp_path, values):
    """step_1..step_n with only metrics.json: retention reads nothing else."""
    for step, value in enumerate(values, start=1):
        (tmp_path / f"step_{step}").mkdir()
        metrics = {} if value is None else {"val:validation-default_loss": value}
        (tmp_path / f"step_{step}" / "metrics.json").write_text(json.dumps(metrics))


def _steps(tmp_path):
    return [step for step, _ in ckpt.list_checkpoints(tmp_path)]


@pytest.mark.parametrize(
    "values,k,higher,kept",
    [
        ([0.5, 0.3, 0.4, 0.2, 0.6], 2, False, [2, 4, 5]),  # best two by lowest loss, plus the latest
        ([0.5, 0.3, 0.4, 0.2, 0.6], 2, True, [1, 5]),  # the latest is also the best: only k kept
        ([0.5, None, 0.4, float("nan"), 0.1], 3, False, [1, 3, 5]),  # missing / NaN metrics rank last
        ([0.5, None, None, 0.9], 3, False, [1, 3, 4]),  # then newest first
        ([0.5, 0.3], 2, False, [1, 2]),
    ],
)
def test_keep_top_k_by_metric(tmp_path, values, k, higher, kept):
    _fake_checkpoints(tmp_path, values)
    ckpt.prune_checkpoints(tmp_path, k, "val:validation-default_loss", higher_is_better=higher)
    assert _steps(tmp_path) == kept


def test_keep_top_k_without_metric_keeps_the_most_recent(tmp_path):
    _fake_checkpoints(tmp_path, [0.1, 0.2, 0.3, 0.4])
    (tmp_path / "final").mkdir()  # the exported model is never a candidate
    deleted = ckpt.prune_checkpoints(tmp_path, 2)
    assert _steps(tmp_path) == [3, 4] and [p.name for p in deleted] == ["step_1", "step_2"]
    assert (tmp_path / "final").is_dir()
    assert ckpt.prune_checkpoints(tmp_path, None) == []
