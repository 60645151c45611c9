"""The RL recipes' guards (`rmkit.rl.guards`): the adaptive KL coefficient's arithmetic, and warnings that
name the step and the numbers once when a run starts to look like reward hacking."""

import pytest

from rmkit.rl.guards import HackingWatch, KLCoefficient


def test_adaptive_coefficient_moves_by_the_clipped_error():
    kl = KLCoefficient(0.1, target=0.02, horizon=100)
    kl.update(0.03, completions=10)  # error 0.5, clipped to 0.2: 1 + 0.2 * 10 / 100
    assert kl.value == pytest.approx(0.1 * 1.02)
    kl.update(0.019, completions=50)  # error -0.05
    assert kl.value == pytest.approx(0.1 * 1.02 * (1 - 0.05 * 0.5))
    fixed = KLCoefficient(0.1)
    fixed.update(5.0, completions=1000)
    assert fixed.value == 0.1


def test_length_collapse_warns_once_naming_step_and_numbers():
    watch = HackingWatch(length_ratio=0.5, kl_factor=3.0, kl_target=None)
    assert watch.after_validation(0, 40.0) is None  # the baseline
    assert watch.after_validation(10, 25.0) is None
    message = watch.after_validation(20, 3.5)
    assert "at step 20" in message and "3.5 tokens" in message and "40.0" in message
    assert watch.after_validation(30, 2.0) is None  # still collapsed: said already
    assert watch.after_validation(40, 30.0) is None
    assert "at step 50" in watch.after_validation(50, 1.0)  # collapsed again after recovering


def test_kl_runaway_against_the_target_or_one_nat():
    watch = HackingWatch(length_ratio=0.5, kl_factor=3.0, kl_target=0.05)
    assert watch.after_step(1, 0.14) is None
    message = watch.after_step(2, 0.2)
    assert "at step 2" in message and "0.200 nats" in message and "3 x the target 0.05" in message
    assert watch.after_step(3, 0.3) is None  # still above: said already
    untargeted = HackingWatch(length_ratio=0.5, kl_factor=3.0, kl_target=None)
    assert untargeted.after_step(8, 0.9) is None
    assert "no kl_target is set" in untargeted.after_step(9, 6.0)
    assert HackingWatch(0.5, 0.0, None).after_step(1, 100.0) is None  # factor 0: never


def test_state_round_trip():
    watch = HackingWatch(0.5, 3.0, None)
    watch.after_validation(0, 12.0)
    watch.after_step(1, 9.0)
    restored = HackingWatch(0.5, 3.0, None)
    restored.load(watch.state())
    assert restored == watch
