"""Decoder reward models train on pairs with the prompt computed once (`SharedPromptRewards`): the rewards, the
loss and every parameter's gradient equal the padded-rows computation (`ChunkedRewards`) within float32
rounding, on tiny random Llama and Qwen2 classifiers, with sdpa and eager attention, with the pairs packed to rows
and one to a row with rows padded to few widths (as under CUDA graphs)."""

import copy
import math
import random

import pytest
import torch

from rmkit.data.tokenize import TokenizedPair
from rmkit.models import load_reward_model
from rmkit.models.reward import compute_rewards
from rmkit.models.reward_forward import ChunkedRewards, SharedPromptRewards, pair_groups
from rmkit.models.setup import RewardForward
from rmkit.recipes.rm import bradley_terry_step
from tests.support.tiny import random_decoder

PAD = 0
CPU = torch.device("cpu")


def _classifier(kind: str, attention: str):
    return random_decoder(kind, classifier=True, pad_token_id=PAD, attn_implementation=attention).train()


def _pairs(seed: int = 0) -> list[TokenizedPair]:
    """Pairs with a shared prompt of 0-15 tokens, a pair whose rejected side is the start of its chosen one,
    and a pair of identical sides: every way the common prefix can end."""
    rng = random.Random(seed)
    tokens = lambda n: [rng.randrange(1, 64) for _ in range(n)]  # noqa: E731
    pairs = []
    for i in range(6):
        prompt = tokens(rng.choice([0, 3, 15]))
        pairs.append(TokenizedPair(prompt + tokens(rng.randint(1, 9)), prompt + tokens(rng.randint(1, 9)),
                                   margin=0.5 if i % 3 == 0 else None, source=f"x:{i}"))
    chosen = tokens(10)
    pairs.append(TokenizedPair(chosen, chosen[:6], source="x:prefix"))
    pairs.append(TokenizedPair(chosen, list(chosen), source="x:same"))
    return pairs


def test_pair_groups_share_the_common_prefix_and_keep_a_token_on_each_side():
    groups = pair_groups([TokenizedPair([5, 6, 7, 8], [5, 6, 9]), TokenizedPair([1, 2, 3], [1, 2]),
                          TokenizedPair([4, 4], [4, 4]), TokenizedPair([3], [2, 3])])
    assert groups == [([5, 6], [[7, 8], [9]]), ([1], [[2, 3], [2]]), ([4], [[4], [4]]), ([], [[3], [2, 3]])]


@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["packed", "row_per_pair"])
@pytest.mark.parametrize("overhead", [math.inf, 32, 0])  # one chunk; planned chunks; every group alone
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_shared_prompt_rewards_equal_each_row_scored_alone(kind, attention, overhead, cuda_graphs):
    model = _classifier(kind, attention).eval()
    pairs = _pairs()
    with torch.no_grad():
        got = SharedPromptRewards(RewardForward(model), PAD, cuda_graphs)(pair_groups(pairs), overhead)
        rows = [ids for pair in pairs for ids in (pair.chosen_ids, pair.rejected_ids)]
        alone = torch.cat([compute_rewards(model, torch.tensor([row]), torch.ones(1, len(row), dtype=torch.long))
                           for row in rows])
    assert got.shape == (len(rows), 1)
    # float32: the same sums in another order (attention over a longer masked row)
    torch.testing.assert_close(got, alone, rtol=1e-5, atol=1e-5)


def _step(model, forward_type, micro):
    reward_forward = RewardForward(model)
    forward = SharedPromptRewards(reward_forward, PAD) if forward_type is SharedPromptRewards else ChunkedRewards(reward_forward)
    metrics = bradley_terry_step(forward, _pairs(), micro, PAD, "float32", CPU)
    return float(metrics["loss"]), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_bradley_terry_step_with_the_prompt_once_equals_padded_rows(kind):
    model = _classifier(kind, "sdpa")
    loss, grads = _step(copy.deepcopy(model), ChunkedRewards, 8)
    for micro in (8, 3):
        shared_loss, shared_grads = _step(copy.deepcopy(model), SharedPromptRewards, micro)
        assert abs(shared_loss - loss) < 1e-6
        assert shared_grads.keys() == grads.keys() and len(grads) > 0
        for name in grads:
            torch.testing.assert_close(shared_grads[name], grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_an_encoder_refuses_rows_of_several_sequences(tiny_encoder):
    model, _ = load_reward_model(tiny_encoder, num_labels=1)
    with pytest.raises(ValueError, match="need a decoder"):
        compute_rewards(model, torch.tensor([[101, 7, 102]]), torch.ones(1, 3, dtype=torch.long),
                        read_at=(torch.tensor([0]), torch.tensor([2])))
