"""The loop's own bookkeeping (`rmkit.trainer.loop`, `rmkit.trainer.logging.progress`); the loop itself runs in every
recipe's CLI tests."""

import torch

from rmkit.trainer.logging.progress import StepWindow
from rmkit.trainer.loop import Cadence


def test_a_window_averages_each_metric_over_the_steps_that_reported_it():
    window = StepWindow()
    window.add(0.5, 4, 100, {"train/loss": torch.tensor(2.0), "train/lr": 1e-3})
    window.add(1.5, 4, 300, {"train/loss": torch.tensor(1.0), "train/critic/loss": 3.0})
    assert window.means() == {"train/loss": 1.5, "train/lr": 1e-3, "train/critic/loss": 3.0}
    assert window.rates() == (4.0, 200.0)  # 8 items and 400 tokens in 2 seconds


def test_a_window_comes_back_from_its_checkpointed_state():
    window = StepWindow()
    window.add(1.0, 2, 10, {"train/loss": torch.tensor(0.5)})
    again = StepWindow.restored(window.state())
    again.add(1.0, 2, 10, {"train/loss": 1.5})
    assert again.means() == {"train/loss": 1.0} and again.rates() == (2.0, 10.0)
    assert StepWindow.restored(None).means() == {}


def test_the_cadence_leaves_the_last_steps_validation_and_checkpoint_to_the_end():
    when = Cadence(steps=10, log_period=4, val_period=5, save_period=5)
    assert [s for s in range(1, 11) if when.log(s)] == [4, 8, 10]
    assert [s for s in range(1, 11) if when.validate(s)] == [5]
    assert [s for s in range(1, 11) if when.save(s)] == [5]
