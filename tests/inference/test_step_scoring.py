"""A process reward model's steps through the inference core (`RewardScorer.score_steps`): each step's probability
against a slow reference that runs the model on the solution up to that step's separator alone, batching that
changes nothing, the aggregations by hand, the cut past the max length, and the contract's checks."""

import json
import math
from pathlib import Path

import pytest
import torch

from rmkit.errors import ConfigError
from rmkit.inference import CONTRACT_FILE, aggregate_steps, load_scorer

SOLUTIONS = [
    ("What is 2 + 3 * 4?", ["3 * 4 = 12.", "2 + 12 = 14.", "The answer is 14."]),
    ("Half of 18?", ["18 / 2 = 9."]),
    ("Is 7 prime?", ["7 has no divisor but 1 and 7, so it is prime.", "Yes.", "Done.", "Really done."]),
]


def reference(scorer, prompt, steps):
    """Per step: the model's own classifier output (last-token pooling, one unpadded row) on the ids up to the
    last token of the separator after the step, through a sigmoid."""
    tokenizer = scorer.tokenizer
    ids = tokenizer(prompt)["input_ids"]
    separator = tokenizer.encode("\n\n", add_special_tokens=False)
    out = []
    for step in steps:
        ids = ids + tokenizer.encode(step, add_special_tokens=False) + separator
        with torch.no_grad():
            logit = scorer.model(input_ids=torch.tensor([ids])).logits[0, 0].item()
        out.append(1 / (1 + math.exp(-logit)))
    return out


def test_step_rewards_equal_a_prefix_by_prefix_reference(tiny_prm):
    scorer = load_scorer(tiny_prm)
    assert scorer.is_process
    for (prompt, steps), scored in zip(SOLUTIONS, scorer.score_steps(SOLUTIONS)):
        expected = reference(scorer, prompt, steps)
        assert scored.step_rewards == pytest.approx(expected, abs=1e-6)
        assert scored.reward == pytest.approx(min(expected), abs=1e-6)


def test_batching_does_not_change_a_step_reward(tiny_prm):
    together = load_scorer(tiny_prm).score_steps(SOLUTIONS)
    alone = load_scorer(tiny_prm, max_batch_size=1).score_steps(SOLUTIONS)
    for a, b in zip(together, alone):
        assert a.step_rewards == pytest.approx(b.step_rewards, abs=1e-6)


def test_aggregations_by_hand():
    probabilities = [0.9, 0.5, 0.8]
    assert aggregate_steps(probabilities, "min") == 0.5
    assert aggregate_steps(probabilities, "prod") == pytest.approx(0.36)
    assert aggregate_steps(probabilities, "last") == 0.8
    with pytest.raises(ConfigError, match="step_aggregation"):
        aggregate_steps(probabilities, "mean")


def test_a_cut_solution_keeps_its_first_steps_and_has_no_reward(tiny_prm):
    scorer = load_scorer(tiny_prm)
    whole = scorer.score_steps(SOLUTIONS[:1])[0]
    ids, positions, _ = scorer.encode_solution(*SOLUTIONS[0])
    cut = load_scorer(tiny_prm, max_length=positions[1]).score_steps(SOLUTIONS[:1])[0]  # the 2nd label falls past it
    assert cut.step_rewards[0] == pytest.approx(whole.step_rewards[0], abs=1e-6)
    assert cut.step_rewards[1:] == [None, None] and cut.reward is None and cut.cut


def test_the_contract_is_checked(tiny_prm, tiny_decoder, tmp_path):
    scorer = load_scorer(tiny_prm)
    with pytest.raises(ConfigError, match="is a process reward model"):
        scorer.check_outcome(tiny_prm)
    with pytest.raises(ConfigError, match="is not a process reward model"):
        load_scorer(tiny_decoder).check_process(tiny_decoder)
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in Path(tiny_prm).iterdir():
        (bad / name.name).write_bytes(name.read_bytes())
    contract = json.loads((bad / CONTRACT_FILE).read_text())
    (bad / CONTRACT_FILE).write_text(json.dumps({**contract, "step_aggregation": "mean"}))
    with pytest.raises(ConfigError, match="step_aggregation' must be one of min, prod, last"):
        load_scorer(bad)
