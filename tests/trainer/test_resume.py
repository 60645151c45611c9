"""The loop-facing checkpoint helpers: metric names, choosing what to resume, save + prune, log rewind."""

import json
import math
from dataclasses import dataclass, field

import pytest
import torch

from rmkit.errors import ConfigError
from rmkit.trainer.checkpointing import loop_state as resume
from rmkit.trainer.checkpointing.files import list_checkpoints
from rmkit.trainer.logging.run_logger import rewind_jsonl


@dataclass
class Checkpointing:
    checkpoint_dir: str
    metric_name: str | None = "val:validation-default_loss"
    higher_is_better: bool = False
    keep_top_k: int | None = 2


@dataclass
class Cfg:
    checkpointing: Checkpointing
    seed: int = 7


class Sampler:
    def __init__(self):
        self.position = 0

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


@dataclass
class State:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    sampler: Sampler = field(default_factory=Sampler)
    step: int = 0
    epoch: int = 0


def make_state(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    return State(model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5**s))


def step(state):
    loss = state.model(torch.randn(3, 4)).square().sum()
    loss.backward()
    state.optimizer.step()
    state.scheduler.step()
    state.optimizer.zero_grad()
    state.step += 1
    state.sampler.position += 1


def test_checkpoint_metric_names():
    metrics = {"validation-default/loss": 0.4, "validation-hh/acc": 0.7, "train/loss": 0.5}
    assert resume.checkpoint_metrics(metrics) == {
        "val:validation-default_loss": 0.4,
        "val:validation-hh_acc": 0.7,
        "train/loss": 0.5,
    }


def test_save_prune_and_resume_exactly(tmp_path):
    cfg = Cfg(Checkpointing(str(tmp_path)))
    state = make_state()
    losses = [0.9, 0.3, 0.5, 0.7]
    for loss in losses:
        step(state)
        resume.save_training_checkpoint(cfg, state, {"validation-default/loss": loss}, extra={"note": "x"})
    # top-2 by lowest loss (steps 2 and 3) plus the latest (step 4)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3, 4]
    path = resume.resolve_resume(tmp_path, "auto")
    assert path == tmp_path / "step_4"
    expected = [step(state) or state.model.weight.clone() for _ in range(2)]

    fresh = make_state(seed=1)
    saved = resume.restore_training_state(path, fresh, torch.device("cpu"))
    resume.restore_rng(saved)
    assert (fresh.step, fresh.epoch, fresh.sampler.position, saved["note"]) == (4, 0, 4, "x")
    got = [step(fresh) or fresh.model.weight.clone() for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(expected, got))  # RNG, optimizer, scheduler all restored


def test_unknown_metric_name_warns_once(tmp_path, capsys):
    cfg = Cfg(Checkpointing(str(tmp_path), metric_name="val:validation-typo_loss"))
    state = make_state()
    for _ in range(2):
        step(state)
        resume.save_training_checkpoint(cfg, state, {"validation-default/loss": 0.5})
    err = capsys.readouterr().err
    assert err.count("'val:validation-typo_loss' is not among") == 1 and "val:validation-default_loss" in err


def test_resolve_resume_choices(tmp_path, capsys):
    assert resume.resolve_resume(tmp_path, None) is None
    assert resume.resolve_resume(tmp_path, "auto") is None
    assert "no checkpoint to resume" in capsys.readouterr().err
    cfg = Cfg(Checkpointing(str(tmp_path), keep_top_k=None))
    state = make_state()
    for _ in range(2):
        step(state)
        resume.save_training_checkpoint(cfg, state, {})
    assert resume.resolve_resume(tmp_path, "never") is None  # fresh: rmkit.trainer.lifecycle moves them aside
    assert resume.resolve_resume(tmp_path, str(tmp_path / "step_1")) == tmp_path / "step_1"
    (tmp_path / "step_2" / "optimizer.pt").write_bytes(b"")
    assert resume.resolve_resume(tmp_path, "auto") == tmp_path / "step_1"
    assert "step 2" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="checkpointing.resume"):
        resume.resolve_resume(tmp_path, str(tmp_path / "step_2"))


def test_rewind_jsonl(tmp_path):
    log = tmp_path / "metrics.jsonl"
    records = [{"step": 1, "train/loss": 0.5}, {"step": 2, "train/loss": None}, {"step": 2, "validation-default/loss": 1.0},
               {"step": 3, "train/loss": 0.2}]  # fmt: skip
    log.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 4, "train/lo')  # cut by a kill
    history = rewind_jsonl(log, 2)
    assert [json.loads(line) for line in log.read_text().splitlines()] == records[:3]
    assert history[0] == records[0] and math.isnan(history[1]["train/loss"])
    assert rewind_jsonl(tmp_path / "absent.jsonl", 2) == []
    rewind_jsonl(log, 2, revalidates=True)  # the validation record at step 2 goes too
    assert [json.loads(line) for line in log.read_text().splitlines()] == records[:2]


def test_restore_rng_from_a_different_number_of_processes(capsys):
    from rmkit.trainer.checkpointing.files import capture_rng_state

    torch.manual_seed(1)
    rank0 = capture_rng_state()
    expected = torch.rand(2)
    torch.manual_seed(2)
    resume.restore_rng({"rng": [rank0, capture_rng_state()]})  # saved by 2 processes, resumed by 1
    assert torch.equal(torch.rand(2), expected)
    assert "saved by 2 process(es), this run has 1" in capsys.readouterr().err


def test_resume_with_changed_data_is_a_config_error(tmp_path):
    from rmkit.data.sampler import LengthGroupedBatchSampler

    cfg = Cfg(Checkpointing(str(tmp_path)))
    state = make_state()
    state.sampler = LengthGroupedBatchSampler([3] * 10, batch_size=2, seed=1)
    resume.save_training_checkpoint(cfg, state, {})
    fresh = make_state()
    fresh.sampler = LengthGroupedBatchSampler([3] * 12, batch_size=2, seed=1)  # two more records
    with pytest.raises(ConfigError, match="checkpointing.resume.*records"):
        resume.restore_training_state(tmp_path / "step_0", fresh, torch.device("cpu"))
